//! `wanbake merge --base BASE --adapter [COMPONENT=]PATH[:STRENGTH]... --out DIR [--dtype ..]
//! [--keep-f32 ..] [--layout ..] [--dora-strength merge|peft] [--allow-unmatched]
//! [--svd-cache DIR] [--overwrite] [--json]`: merge adapters into a base in one streaming
//! pass and write a verified release.
//!
//! This file only turns arguments into library values (`merge::AdapterSpec`,
//! `merge::MergeOptions`), opens and binds the adapters (`adapter`), calls
//! `merge::merge_release` and prints the summary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Printer, Status, UsageError};
use crate::adapter::{AdapterOptions, AdapterSet, BaseIndex};
use crate::io::Checkpoint;
use crate::io::staging::Replace;
use crate::layout::{KeepF32, Layout, OutputDType};
use crate::linalg::SvdCache;
use crate::merge::{
    AdapterSpec, BoundAdapter, ComponentChoice, DoraStrength, MergeOptions, MergeReport,
    merge_release,
};

const AFTER_HELP: &str = "\
ADAPTERS
  --adapter [COMPONENT=]PATH[:STRENGTH], repeatable. PATH is a .safetensors file, a PEFT
  folder (adapter_config.json + adapter_model.safetensors) or a folder with one weights
  file, in any convention (PEFT, diffusers, ComfyUI/original Wan, kohya/musubi, SA3 native,
  Qwix/NNX). STRENGTH (default 1) is a finite number. A path containing ':' must end with
  an explicit strength (my:lora.safetensors:1); a path containing '=' is written ./a=b.

  A base with several transformers (Wan 2.2 A14B: transformer/ = high-noise expert,
  transformer_2/ = low-noise expert) needs COMPONENT on every adapter: a component folder
  name, or all for every transformer:
    wanbake merge --base Wan2.2-T2V-A14B-Diffusers \\
      --adapter transformer=high_noise.safetensors:1.0 \\
      --adapter transformer_2=low_noise.safetensors:1.0 --out baked --dtype bf16

STRENGTH
  W' = round_once(W0 + sum_i a_i*(f_i(W0) - W0)), in f32, with W0 the original weight for
  every adapter and f_i its effective weight at full strength; one round-to-nearest-even to
  the output dtype. a = 0 skips the adapter (output bit-identical to the input). a also
  scales full-tensor diffs (diff, diff_b, diff_m), as ComfyUI and diffusers fuse_lora do
  (MaxDiffusion adds diffs unscaled).
  --dora-strength merge (default): the same linear rule for DoRA/BoRA (SA3 application
  weight, ComfyUI). --dora-strength peft: the strength sits inside the norm,
  W' = m*(W + a*s*B*A)/||W + a*s*B*A|| (PEFT, diffusers fuse_lora(lora_scale=a), SA3
  lora_strength). The two agree at a = 1 and for every non-DoRA kind.

DTYPES
  --dtype keep (default) keeps every tensor's stored dtype; bf16/f16 narrow except what the
  keep-f32 policy keeps: diffusers (default for diffusers/wan layouts:
  _keep_in_fp32_modules), maxdiffusion (default for nnx layouts), none (default for bases
  that are not WAN transformers), or regex:PATTERN on output names.";

/// Arguments of `merge`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = AFTER_HELP)]
pub struct Args {
    /// Base checkpoint: a .safetensors file, a *.safetensors.index.json, a diffusers model
    /// folder, or a pipeline folder with transformer/ and transformer_2/.
    #[arg(long)]
    pub base: PathBuf,
    /// Adapter to merge, [COMPONENT=]PATH[:STRENGTH] (repeatable; see below).
    #[arg(
        long = "adapter",
        required = true,
        value_name = "[COMPONENT=]PATH[:STRENGTH]"
    )]
    pub adapters: Vec<String>,
    /// Output directory (written atomically; mirrors the base's naming).
    #[arg(long)]
    pub out: PathBuf,
    /// Output dtype: keep, bf16, f16 or f32.
    #[arg(long, default_value = "keep")]
    pub dtype: String,
    /// Which tensors stay f32 when narrowing: diffusers, maxdiffusion, none or regex:PATTERN.
    #[arg(long, value_name = "POLICY")]
    pub keep_f32: Option<String>,
    /// Write the result in this WAN layout: diffusers, wan, nnx or nnx-scanned.
    #[arg(long)]
    pub layout: Option<String>,
    /// Where the strength enters DoRA/BoRA: merge (application weight) or peft (inside the
    /// norm).
    #[arg(long, default_value = "merge")]
    pub dora_strength: String,
    /// Merge around adapter keys that match nothing (they are listed in the report).
    #[arg(long)]
    pub allow_unmatched: bool,
    /// Directory of cached LoRA-XS SVD bases (must exist); a second bake reads them.
    #[arg(long, value_name = "DIR")]
    pub svd_cache: Option<PathBuf>,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print the merge report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// The options, validated.
fn merge_options(args: &Args) -> Result<MergeOptions, UsageError> {
    let dtype: OutputDType = args.dtype.parse().map_err(UsageError)?;
    let keep_f32 = args
        .keep_f32
        .as_deref()
        .map(KeepF32::parse)
        .transpose()
        .map_err(|e| UsageError(format!("--keep-f32: {e}")))?;
    let layout = args
        .layout
        .as_deref()
        .map(str::parse::<Layout>)
        .transpose()
        .map_err(|e| UsageError(format!("--layout: {e}")))?;
    let dora_strength = match args.dora_strength.as_str() {
        "merge" => DoraStrength::Merge,
        "peft" => DoraStrength::Peft,
        other => {
            return Err(UsageError(format!(
                "--dora-strength `{other}`: expected merge or peft"
            )));
        }
    };
    Ok(MergeOptions {
        dtype,
        keep_f32,
        layout,
        dora_strength,
        allow_unmatched: args.allow_unmatched,
    })
}

/// The base components an adapter spec names.
fn components_of(spec: &AdapterSpec, base: &Checkpoint) -> Result<Vec<usize>, UsageError> {
    let names = || {
        base.components
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &spec.component {
        ComponentChoice::All => Ok((0..base.components.len()).collect()),
        ComponentChoice::Only if base.components.len() == 1 => Ok(vec![0]),
        ComponentChoice::Only => Err(UsageError(format!(
            "--adapter `{}`: the base has {} transformers ({}); say which one it is for, \
             e.g. --adapter {}={}, or all={} for every one",
            spec.text,
            base.components.len(),
            names(),
            base.components[0].name,
            spec.text,
            spec.text
        ))),
        ComponentChoice::Named(n) => base
            .components
            .iter()
            .position(|c| &c.name == n)
            .map(|i| vec![i])
            .ok_or_else(|| {
                let have = if base.components.len() == 1 {
                    "a single model (drop the prefix)".to_string()
                } else {
                    format!("transformers {}", names())
                };
                UsageError(format!(
                    "--adapter `{}`: the base has no transformer `{n}`; it has {have}",
                    spec.text
                ))
            }),
    }
}

/// Opens and binds every adapter to the component(s) its spec names.
fn bind_adapters(
    specs: &[AdapterSpec],
    base: &Checkpoint,
    allow_unmatched: bool,
) -> anyhow::Result<Vec<BoundAdapter>> {
    let mut indexes: BTreeMap<usize, BaseIndex> = BTreeMap::new();
    let mut out = Vec::new();
    for spec in specs {
        for ci in components_of(spec, base)? {
            let comp = &base.components[ci];
            let index = indexes
                .entry(ci)
                .or_insert_with(|| BaseIndex::new(&base.path.join(&comp.rel_dir), &comp.tensors));
            let opts = AdapterOptions {
                allow_unmatched,
                ..AdapterOptions::default()
            };
            let mut set = AdapterSet::open(&spec.path, &opts)?;
            let report = set.bind(index)?;
            let mut unmatched: Vec<String> = set.unparsed.iter().map(|k| k.key.clone()).collect();
            unmatched.extend(report.unmatched.iter().flat_map(|p| p.keys.iter().cloned()));
            out.push(BoundAdapter {
                set,
                component: ci,
                strength: spec.strength,
                shown: spec.text.clone(),
                unmatched,
            });
        }
    }
    Ok(out)
}

/// Runs `merge`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let options = merge_options(&args)?;
    let specs = args
        .adapters
        .iter()
        .map(|a| AdapterSpec::parse(a).map_err(|e| UsageError(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let cache = args
        .svd_cache
        .as_deref()
        .map(SvdCache::open)
        .transpose()
        .map_err(|e| UsageError(format!("--svd-cache: {e} (create the directory first)")))?;
    let base = Checkpoint::open(&args.base)?;
    let adapters = bind_adapters(&specs, &base, args.allow_unmatched)?;
    let replace = if args.overwrite {
        Replace::Overwrite
    } else {
        Replace::Never
    };
    let outcome = merge_release(
        &base,
        &adapters,
        &options,
        cache.as_ref(),
        &args.out,
        replace,
    )?;
    let files = &outcome.release.manifest.files;
    let bytes: u64 = files.iter().map(|f| f.bytes).sum();
    print_summary(p, &outcome.report, &outcome.release.dir, files.len(), bytes);
    p.json(&serde_json::json!({
        "dir": outcome.release.dir,
        "files": files.len(),
        "bytes": bytes,
        "report": outcome.report,
    }));
    Ok(Status::Ok)
}

fn print_summary(p: &mut Printer, r: &MergeReport, dir: &Path, files: usize, bytes: u64) {
    p.line(format!(
        "merged {} adapter(s) into {} tensor(s); wrote {} ({files} files, {bytes} bytes, {} tensors)",
        r.adapters.len(),
        r.targets_merged,
        dir.display(),
        r.tensors
    ));
    for a in &r.adapters {
        let component = if a.component.is_empty() {
            String::new()
        } else {
            format!(" -> {}", a.component)
        };
        let state = if a.skipped {
            "skipped (strength 0)".to_string()
        } else {
            format!("{} targets", a.targets_merged)
        };
        p.line(format!(
            "  {}{component}: {}, strength {}, {} entries, {state}",
            a.adapter, a.convention, a.strength, a.entries
        ));
        if !a.unmatched_allowed.is_empty() {
            p.warn(format!(
                "{}: {} unmatched key(s) left out (--allow-unmatched), listed in the manifest",
                a.adapter,
                a.unmatched_allowed.len()
            ));
        }
    }
    let s = &r.svd;
    if s.hits + s.misses + s.replaced + s.computed > 0 {
        p.line(format!(
            "  LoRA-XS SVD bases: {} computed, {} cache hits, {} cache misses, {} replaced",
            s.computed, s.hits, s.misses, s.replaced
        ));
    }
    p.line(format!(
        "  dtype {}, layout {}, keep-f32 {}, DoRA strength {}",
        r.dtype,
        r.layout,
        r.keep_f32,
        r.dora_strength.as_str()
    ));
}
