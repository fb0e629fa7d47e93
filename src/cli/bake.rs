//! `wanbake bake RECIPE [--dry-run] [--json] [--device auto|cpu|cuda]`: plan, merge +
//! restack, check, commit and verify a release described by a recipe.
//!
//! This file prints the plan and the summary, and draws progress (indicatif bars on a
//! terminal, plain lines otherwise, nothing with --quiet or --json). The work is in
//! `bake`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::device::{DeviceArg, device_json};
use super::{Printer, Status};
use crate::bake::{self, BakeOutcome, BakePlan, BaseHashing, Phase};
use crate::merge::exec::job_bytes;
use crate::progress::{Progress, Snapshot};
use crate::recipe::Recipe;

/// Arguments of `bake`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The recipe (TOML; see README.md for every field). Relative paths in it resolve
    /// against its folder.
    pub recipe: PathBuf,
    /// Stop after the plan: inputs opened and bound, declared hashes checked, shapes and
    /// free space measured; nothing is written.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan and the result as one JSON document.
    #[arg(long)]
    pub json: bool,
    /// `--device`.
    #[command(flatten)]
    pub device: DeviceArg,
}

/// Runs `bake`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let recipe = Recipe::load(&args.recipe)?;
    let hashing = if args.dry_run {
        BaseHashing::WhenDeclared
    } else {
        BaseHashing::Always
    };
    p.line(format!("planning {}", args.recipe.display()));
    let (compute, device) = args.device.select()?;
    let plan = bake::plan_bake(recipe, hashing)?;
    let mut plan_json = describe_plan(&plan, p);
    p.line(format!("  device   {}", device.reason));
    plan_json["device"] = device_json(&device);
    if args.dry_run {
        if !plan.space.fits {
            p.warn(format!(
                "the output would not fit: {} needs {}, {} free (a bake would stop here)",
                plan.space.dir.display(),
                human_bytes(plan.space.needed),
                human_bytes(plan.space.available.unwrap_or(0))
            ));
        }
        p.line("dry run: nothing written");
        p.json(&json!({ "plan": plan_json, "dry_run": true }));
        return Ok(Status::Ok);
    }
    let total = plan.prepared.plan.jobs.iter().map(job_bytes).sum::<u64>();
    let progress = Progress::new(total, plan.prepared.plan.jobs.len() as u64);
    let started = Instant::now();
    let show = if !p.is_human() {
        Show::Nothing
    } else if std::io::stderr().is_terminal() {
        Show::Bars
    } else {
        Show::Lines
    };
    let outcome = with_progress(&progress, show, |phase| {
        bake::execute(plan, &compute, Some(&progress), phase)
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let result = describe_outcome(&outcome, seconds, p);
    p.json(&json!({ "plan": plan_json, "dry_run": false, "result": result }));
    if outcome.passed {
        Ok(Status::Ok)
    } else {
        p.warn(format!(
            "a check failed: {} is written, its manifest says status `check_failed`",
            outcome.release.dir.display()
        ));
        Ok(Status::Failed)
    }
}

/// Prints the plan for people and returns it as JSON.
fn describe_plan(plan: &BakePlan, p: &mut Printer) -> serde_json::Value {
    let r = &plan.recipe;
    let base_hash = if !plan.hashes.iter().any(|h| h.what == "base") {
        if plan.prepared.base_hashed {
            "hashed"
        } else {
            "not hashed (dry run, no sha256 declared)"
        }
    } else {
        "sha256 verified"
    };
    p.line(format!(
        "  base     {} ({base_hash})",
        r.relative(&r.base.path)
    ));
    for (name, f) in &plan.fingerprints {
        let name = if name.is_empty() { "model" } else { name };
        p.line(format!("           {name}: {}", f.description));
    }
    for a in &plan.prepared.plan.adapters {
        let comp = if a.component.is_empty() {
            String::new()
        } else {
            format!(" -> {}", a.component)
        };
        p.line(format!(
            "  adapter  {}{comp}: {}, {} entries on {} targets, strength {}",
            a.adapter, a.convention, a.entries, a.targets_merged, a.strength
        ));
    }
    for h in &plan.hashes {
        p.line(format!("  sha256   {} {}: ok", h.what, h.path));
    }
    let out = &plan.prepared.plan.output;
    let o = &r.output;
    p.line(format!(
        "  output   {}: {}, layout {}, keep-f32 {}, {} files, {} tensors, {}",
        r.relative(&o.dir),
        o.dtype,
        o.layout.as_deref().unwrap_or("same as the base"),
        plan.prepared.plan.keep_f32,
        out.files.len() + out.aux.len() + 1,
        out.tensor_count(),
        human_bytes(out.total_bytes())
    ));
    let free = plan
        .space
        .available
        .map_or("unknown".to_string(), human_bytes);
    p.line(format!(
        "  space    {} free at {}{}",
        free,
        plan.space.dir.display(),
        if plan.space.fits { "" } else { " (NOT ENOUGH)" }
    ));
    for c in &r.checks {
        let what = if c.steps == 0 {
            "one forward".to_string()
        } else {
            format!("{} sampling steps", c.steps)
        };
        let expected = if c.expected == "unmerged" {
            "the unrounded f32 merge".to_string()
        } else {
            r.relative(std::path::Path::new(&c.expected))
        };
        p.line(format!(
            "  check    {}: {what} vs {expected}, tolerance {}",
            c.name.as_deref().unwrap_or(""),
            c.tolerance
        ));
    }
    json!({
        "recipe": r.normalised(),
        "fingerprints": plan.fingerprints.iter().map(|(n, f)| json!({"component": n, "fingerprint": f})).collect::<Vec<_>>(),
        "adapters": plan.prepared.plan.adapters,
        "inputs": plan.prepared.inputs,
        "base_hashed": plan.prepared.base_hashed,
        "declared_hashes": plan.hashes,
        "output": {
            "dir": r.relative(&o.dir),
            "files": out.files.iter().map(|f| f.rel_path.display().to_string()).collect::<Vec<_>>(),
            "tensors": out.tensor_count(),
            "bytes": out.total_bytes(),
            "tensor_bytes": out.files.iter().map(|f| f.layout.data_len as u64).sum::<u64>(),
            "keep_f32": plan.prepared.plan.keep_f32,
        },
        "space": plan.space,
    })
}

/// Prints the summary and returns it as JSON.
fn describe_outcome(o: &BakeOutcome, seconds: f64, p: &mut Printer) -> serde_json::Value {
    let files = &o.release.manifest.files;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({} files, {}) in {seconds:.1} s; merged {} tensors",
        o.release.dir.display(),
        files.len() + 1,
        human_bytes(bytes),
        o.report.targets_merged
    ));
    for f in files {
        p.line(format!("  {}  {}", f.sha256, f.path));
    }
    p.line(format!(
        "  manifest_sha256 {}",
        o.release.manifest.manifest_sha256
    ));
    for c in &o.checks {
        p.line(format!(
            "  check {}: {} (max |diff| {:.3e}, tolerance {:.3e}, mean |diff| {:.3e})",
            c.name,
            if c.passed { "passed" } else { "FAILED" },
            c.max_abs_diff,
            c.tolerance,
            c.mean_abs_diff
        ));
    }
    p.line(format!(
        "  verify: OK ({} files, {} tensors)",
        o.verify.files_checked, o.verify.tensors_checked
    ));
    if let Some(s) = o.release.manifest.options.get("sign") {
        p.line(format!(
            "  signed: {} ({} key hint {})",
            s["signature"].as_str().unwrap_or_default(),
            s["curve"].as_str().unwrap_or_default(),
            s["key_hint"].as_str().unwrap_or_default()
        ));
    }
    json!({
        "dir": o.release.dir,
        "status": o.release.manifest.status,
        "seconds": seconds,
        "files": files,
        "manifest_sha256": o.release.manifest.manifest_sha256,
        "report": o.report,
        "checks": o.checks,
        "verify": o.verify,
    })
}

/// How progress is shown.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Show {
    Nothing,
    Bars,
    Lines,
}

/// Runs `work` while a watcher thread shows `progress`; phases are announced as they come.
fn with_progress<T>(
    progress: &Progress,
    show: Show,
    work: impl FnOnce(&mut dyn FnMut(Phase)) -> T,
) -> T {
    let done = AtomicBool::new(false);
    let writing = AtomicBool::new(false);
    std::thread::scope(|s| {
        if show != Show::Nothing {
            s.spawn(|| watch(progress, show, &done, &writing));
        }
        let mut announce = |ph: Phase| {
            if ph != Phase::Writing {
                writing.store(false, Ordering::Release);
            }
            if show != Show::Nothing {
                match ph {
                    Phase::Writing => {
                        writing.store(true, Ordering::Release);
                        eprintln!("writing");
                    }
                    Phase::Checking => eprintln!("sealed; running checks"),
                    Phase::Verifying => eprintln!("committed; verifying"),
                }
            }
        };
        let out = work(&mut announce);
        done.store(true, Ordering::Release);
        out
    })
}

/// The watcher: an indicatif bar (bytes, throughput, ETA, tensors) on a terminal, or a
/// plain line every 10% / 10 s elsewhere.
fn watch(progress: &Progress, show: Show, done: &AtomicBool, writing: &AtomicBool) {
    let total = progress.snapshot().total_bytes;
    let bar = (show == Show::Bars).then(|| {
        let b = indicatif::ProgressBar::new(total);
        let style = indicatif::ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        b.set_style(style);
        b
    });
    let started = Instant::now();
    let mut last_line = (0u64, Instant::now());
    let mut finished = false;
    while !done.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        let s = progress.snapshot();
        if let Some(b) = &bar {
            b.set_position(s.bytes);
            b.set_message(format!("{}/{} tensors", s.items, s.total_items));
        } else if !finished && writing.load(Ordering::Acquire) {
            let tenth = s.bytes.saturating_mul(10) / s.total_bytes.max(1);
            if tenth > last_line.0 || last_line.1.elapsed() >= Duration::from_secs(10) {
                eprintln!("{}", progress_line(&s, started.elapsed().as_secs_f64()));
                last_line = (tenth, Instant::now());
            }
        }
        if s.items == s.total_items {
            if let Some(b) = &bar {
                b.finish_and_clear();
            }
            finished = true;
        }
    }
}

fn progress_line(s: &Snapshot, seconds: f64) -> String {
    let rate = s.bytes as f64 / seconds.max(1e-9);
    format!(
        "  {} of {} ({:.0}%), {}/{} tensors, {}/s",
        human_bytes(s.bytes),
        human_bytes(s.total_bytes),
        100.0 * s.bytes as f64 / s.total_bytes.max(1) as f64,
        s.items,
        s.total_items,
        human_bytes(rate as u64)
    )
}

/// Bytes in decimal units, as disks are sold.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
