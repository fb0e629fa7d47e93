//! `wanbake bake RECIPE [--dry-run] [--json] [--device auto|cpu|cuda]`: plan, merge +
//! restack, check, commit and verify a release described by a recipe (or every release of
//! a matrix, with its quality table).
//!
//! This file prints the plan and the summary, and draws progress (indicatif bars on a
//! terminal, plain lines otherwise, nothing with --quiet or --json). The work is in
//! `bake`.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use super::device::{DeviceArg, device_json};
use super::{Printer, Status};
use wanbake::bake::{self, BakeOutcome, Planned, Space};
use wanbake::human::{plural, size};
use wanbake::pipeline::Ready;
use wanbake::recipe::Recipe;

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
    p.line(format!("planning {}", args.recipe.display()));
    let (compute, device) = args.device.select()?;
    let inputs = bake::open_bake(recipe)?;
    for a in &inputs.recipe.adapters {
        if let Some(expert) = &a.expert
            && let Some(w) = wanbake::adapter::variant::expert_warning(&a.path, expert)
        {
            p.warn(w);
        }
    }
    let describe = |plan: &Planned<'_>, p: &mut Printer| {
        let mut plan_json = describe_plan(plan, p);
        p.line(format!("  device   {}", device.reason));
        plan_json["device"] = device_json(&device);
        plan_json
    };
    if args.dry_run {
        let plan = inputs.dry_run()?;
        let plan_json = describe(&plan, p);
        for s in plan.space.iter().filter(|s| !s.fits) {
            p.warn(format!(
                "the output would not fit: {} needs {}, {} free (a bake would stop here)",
                s.dir.display(),
                size(plan.space.iter().map(|s| s.needed).sum()),
                size(s.available.unwrap_or(0))
            ));
        }
        p.line("dry run: nothing written");
        p.json(&json!({ "plan": plan_json, "dry_run": true }));
        return Ok(Status::Ok);
    }
    let plan = inputs.plan()?;
    let plan_json = describe(&plan, p);
    let started = Instant::now();
    let outcomes = bake::execute(plan, &compute)?;
    let seconds = started.elapsed().as_secs_f64();
    let result = match outcomes.as_slice() {
        [one] => describe_outcome(one, seconds, p),
        many => describe_matrix(many, seconds, &inputs.recipe, p),
    };
    p.json(&json!({ "plan": plan_json, "dry_run": false, "result": result }));
    let failed: Vec<&BakeOutcome> = outcomes.iter().filter(|o| !o.passed).collect();
    for o in &failed {
        p.warn(format!(
            "a check failed: {} is written, its manifest says status `check_failed`",
            o.release.dir.display()
        ));
    }
    match failed.is_empty() {
        true => Ok(Status::Ok),
        false => Ok(Status::Failed),
    }
}

/// Prints the plan for people and returns it as JSON.
fn describe_plan(plan: &Planned<'_>, p: &mut Printer) -> serde_json::Value {
    let r = &plan.inputs.recipe;
    let first = &plan.ready[0];
    let base_hash = if !plan.hashes.iter().any(|h| h.what == "base") {
        if plan.base_hashed {
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
    for (name, f) in &plan.inputs.fingerprints {
        let name = if name.is_empty() { "model" } else { name };
        p.line(format!("           {name}: {}", f.description));
    }
    for a in &first.adapter_reports {
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
    let mut outputs = Vec::with_capacity(plan.ready.len());
    for ((o, ready), space) in plan.inputs.outputs.iter().zip(&plan.ready).zip(&plan.space) {
        outputs.push(describe_output(&o.recipe, ready, space, p));
    }
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
    let mut plan_json = json!({
        "recipe": r.normalised(),
        "fingerprints": plan.inputs.fingerprints.iter().map(|(n, f)| json!({"component": n, "fingerprint": f})).collect::<Vec<_>>(),
        "adapters": first.adapter_reports,
        "inputs": first.inputs,
        "base_hashed": plan.base_hashed,
        "declared_hashes": plan.hashes,
    });
    match outputs.as_mut_slice() {
        [(one, space)] => {
            plan_json["output"] = one.take();
            plan_json["space"] = space.take();
        }
        many => {
            let (o, s): (Vec<_>, Vec<_>) =
                many.iter_mut().map(|(o, s)| (o.take(), s.take())).unzip();
            plan_json["outputs"] = o.into();
            plan_json["space"] = s.into();
        }
    }
    plan_json
}

/// Prints one output of the plan and returns it, and its space, as JSON.
fn describe_output(
    r: &Recipe,
    ready: &Ready<'_>,
    space: &Space,
    p: &mut Printer,
) -> (serde_json::Value, serde_json::Value) {
    let out = &ready.output;
    let o = &r.output;
    let encoding = match (&o.to, o.city96_rounding) {
        (Some(to), _) if to == "orbax" => format!(
            "MaxDiffusion's Orbax cache, {}, layout {}",
            o.dtype().unwrap_or("bf16"),
            o.layout.as_deref().unwrap_or("nnx-scanned")
        ),
        (Some(to), false) => format!("{to}, original-Wan names"),
        (Some(to), true) => format!("{to} (city96 rounding), original-Wan names"),
        (None, _) => format!(
            "{}, layout {}, keep-f32 {}",
            o.dtype().unwrap_or("bf16"),
            o.layout.as_deref().unwrap_or("same as the base"),
            ready.keep_f32
        ),
    };
    match &ready.orbax {
        // Its chunk files and their sizes are known only once compressed.
        Some(orbax) => p.line(format!(
            "  output   {}: {}, {}",
            r.relative(&o.dir),
            encoding,
            plural(orbax.array_count(), "array", "arrays")
        )),
        None => p.line(format!(
            "  output   {}: {}, {}, {}, {}",
            r.relative(&o.dir),
            encoding,
            plural(out.files.len() + out.aux.len() + 1, "file", "files"),
            plural(out.tensor_count(), "tensor", "tensors"),
            size(out.total_bytes())
        )),
    }
    // Which tensors a quantized output encodes, and how (a matrix's dry run shows what
    // each format does to the model).
    let quantized = ready.quant.as_ref().map(|q| {
        let mut by: std::collections::BTreeMap<String, usize> = Default::default();
        for t in &q.tensors {
            *by.entry(t.encoding.name().to_string()).or_default() += 1;
        }
        let counts: Vec<String> = by.iter().map(|(e, n)| format!("{n} {e}")).collect();
        p.line(format!("           tensors: {}", counts.join(", ")));
        json!(by)
    });
    let free = space.available.map_or("unknown".to_string(), size);
    p.line(format!(
        "  space    {} free at {}{}",
        free,
        space.dir.display(),
        if space.fits { "" } else { " (NOT ENOUGH)" }
    ));
    let mut out_json = json!({
        "dir": r.relative(&o.dir),
        "files": out.files.iter().map(|f| f.rel_path.display().to_string()).collect::<Vec<_>>(),
        "tensors": out.tensor_count(),
        "bytes": out.total_bytes(),
        "tensor_bytes": out.files.iter().map(|f| f.layout.data_len as u64).sum::<u64>(),
        "keep_f32": ready.keep_f32,
    });
    if let Some(q) = quantized {
        out_json["encodings"] = q;
    }
    (out_json, json!(space))
}

/// Prints a release matrix's summary and quality table and returns them as JSON.
fn describe_matrix(
    outcomes: &[BakeOutcome],
    seconds: f64,
    recipe: &Recipe,
    p: &mut Printer,
) -> serde_json::Value {
    p.line(format!(
        "wrote {} in {seconds:.1} s, one pass over the base",
        plural(outcomes.len(), "release", "releases")
    ));
    let mut results = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        results.push(describe_outcome(o, seconds, p));
    }
    let quality = bake::quality::table(outcomes, recipe);
    for line in bake::quality::render(&quality) {
        p.line(line);
    }
    json!({ "seconds": seconds, "outputs": results, "quality": quality })
}

/// Prints the summary and returns it as JSON.
fn describe_outcome(o: &BakeOutcome, seconds: f64, p: &mut Printer) -> serde_json::Value {
    let files = &o.release.manifest.files;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({}, {}) in {seconds:.1} s; merged {}",
        o.release.dir.display(),
        plural(files.len() + 1, "file", "files"),
        size(bytes),
        plural(o.report.targets_merged, "tensor", "tensors")
    ));
    super::output::print_carried(p, &o.release, None);
    // A safetensors or GGUF release has a few files; an Orbax one has one per chunk (hundreds):
    // the manifest lists them all, the summary the first few.
    const SHOWN: usize = 8;
    for f in files.iter().take(SHOWN) {
        p.line(format!("  {}  {}", f.sha256, f.path));
    }
    if files.len() > SHOWN {
        p.line(format!(
            "  ... and {} more files (every sha256 in {})",
            files.len() - SHOWN,
            wanbake::io::checkpoint::MANIFEST_NAME
        ));
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
        "carried": o.release.carried,
        "manifest_sha256": o.release.manifest.manifest_sha256,
        "report": o.report,
        "checks": o.checks,
        "verify": o.verify,
    })
}
