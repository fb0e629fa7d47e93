//! The flags every producing command shares, each defined once and `#[command(flatten)]`ed
//! where the command supports it, so a flag has one spelling, one help text and one unit
//! syntax everywhere:
//! - [`OutputDir`] (`--out`, `--overwrite`): merge, restack, convert, synth, translate,
//!   extract, resize;
//! - [`ShardArg`] (`--shard-size`, "5GB", "500MB", "10GiB" or bytes: `recipe::parse_size`,
//!   as recipes): merge, restack, convert, synth;
//! - [`DtypeArgs`] (`--dtype keep|bf16|f16|f32` and `--keep-f32 POLICY`): merge, restack;
//! - [`FloatDtypeArg`] (`--dtype f32|f16|bf16`, no keep, no policy): convert, synth,
//!   extract, resize;
//! - [`NonFiniteArg`] (`--allow-nonfinite`): merge, restack, convert, extract, resize;
//! - [`print_carried`]: the summary line of the files a pipeline's output carried over.
//!
//! Enumerated values are the library types' own `clap::ValueEnum`s (one spelling table per
//! type, `wanbake::names`), so clap checks them, lists them in `--help` and hands the command
//! typed values; a flag that takes part of a table wraps it with [`value_subset!`]. Names are
//! case-sensitive on every flag. Part of the binary, not of the library.

use std::path::PathBuf;

use wanbake::human::plural;
use wanbake::layout::{KeepF32, OutputDType};
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::NonFinite;
use wanbake::release::Release;
use wanbake::release::staging::Replace;

/// `--shard-size`: decimal (KB, MB, GB) or binary (KiB, MiB, GiB) units, or bytes.
pub fn size(s: &str) -> Result<u64, String> {
    wanbake::recipe::parse_size(s)
}

/// A `clap::ValueEnum` over part of a library type's table: the values `$list` yields, in
/// its order, each spelt (and listed in `--help`) as the library type spells it.
macro_rules! value_subset {
    ($(#[$doc:meta])* $name:ident($inner:ty) = $list:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name(pub $inner);

        impl clap::ValueEnum for $name {
            fn value_variants<'a>() -> &'a [Self] {
                static VARIANTS: std::sync::LazyLock<Vec<$name>> =
                    std::sync::LazyLock::new(|| $list.into_iter().map($name).collect());
                &VARIANTS
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                clap::ValueEnum::to_possible_value(&self.0)
            }
        }
    };
}
pub(crate) use value_subset;

value_subset!(
    /// A float dtype (`convert`, `synth`, `extract`, `resize`): every output dtype but keep.
    FloatDType(OutputDType) = OutputDType::ALL.into_iter().filter(|d| d.float().is_some())
);

impl FloatDtypeArg {
    /// The dtype given, if any.
    pub fn given(self) -> Option<wanbake::io::DType> {
        self.dtype.and_then(|d| d.0.float())
    }
}

/// Where a producing command writes its release.
#[derive(clap::Args, Debug, Clone)]
pub struct OutputDir {
    /// Output directory: written atomically, as a release with wanbake.manifest.json.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
}

impl OutputDir {
    /// What to do with an existing `--out`.
    pub fn replace(&self) -> Replace {
        if self.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        }
    }
}

/// `--shard-size`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ShardArg {
    /// Shard each model's weights into files of at most this size ("5GB", "500MB", "10GiB"
    /// or bytes; a larger tensor gets a file of its own). Default: one file per model.
    // (merge says more: `cli::MERGE_SHARDS`.)
    #[arg(long, value_name = "SIZE", value_parser = size)]
    pub shard_size: Option<u64>,
}

/// `--dtype` and `--keep-f32` of the commands that can keep stored dtypes (merge, restack).
#[derive(clap::Args, Debug, Clone)]
pub struct DtypeArgs {
    /// Output dtype: keep (each tensor keeps its stored dtype), or bf16, f16, f32 (also
    /// spelt bfloat16, float16/fp16, float32) for every float tensor but those --keep-f32
    /// keeps.
    #[arg(long, value_enum, default_value_t = OutputDType::Keep)]
    pub dtype: OutputDType,
    /// Which tensors stay f32 under bf16/f16: diffusers (default for diffusers/wan outputs:
    /// _keep_in_fp32_modules), maxdiffusion (default for nnx outputs), none (default for
    /// bases that are not WAN transformers), or regex:PATTERN on output names.
    #[arg(long, value_name = "POLICY", value_parser = KeepF32::parse)]
    pub keep_f32: Option<KeepF32>,
}

/// `--dtype` of the commands that write one float dtype (convert, synth, extract, resize).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct FloatDtypeArg {
    /// Dtype of every float tensor (also spelt float32, float16/fp16, bfloat16).
    // (Each command says its default and what else it means there: `cli::Command`.)
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<FloatDType>,
}

/// `--allow-nonfinite` of every command that writes tensors (merge, restack, convert,
/// extract, resize).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct NonFiniteArg {
    /// Write values the output cannot hold (NaN, ±inf, a finite value beyond its dtype or
    /// format: above 65504 in f16, a GGUF block whose f16 scale overflows) as its rounding
    /// gives them, listed in the manifest's report (`nonfinite`), instead of refusing them
    /// (exit code 1, nothing written, the first one named).
    #[arg(long)]
    pub allow_nonfinite: bool,
}

impl NonFiniteArg {
    /// The policy given.
    pub fn policy(self) -> NonFinite {
        NonFinite::allowed(self.allow_nonfinite)
    }
}

/// The summary line of the files an output carried over unchanged from its input (a
/// pipeline's VAE, text encoder, tokenizer, scheduler, model card): how many, how large, and
/// whether they are hard links (sharing the input's bytes) or copies. Nothing when none.
/// A pipeline input's files the output has no place for are named, by top folder, as a
/// warning; so is a pipeline output whose transformers are not in the diffusers layout
/// (`layout`), which its model_index.json, carried unchanged, does not say.
pub fn print_carried(p: &mut super::Printer, release: &Release, layout: Option<Layout>) {
    warn_left_out(p, &release.left_out);
    let pipeline = (release.manifest.files.iter()).any(|f| f.path == "model_index.json");
    if let Some(l) = layout.filter(|&l| pipeline && l != Layout::Diffusers) {
        p.warn(format!(
            "{} is not a diffusers pipeline: its transformers are in the `{l}` layout, while its \
             model_index.json (the input's) names diffusers' classes; README's \
             \"Where each output loads\" says who reads `{l}`",
            release.dir.display()
        ));
    }
    let c = &release.carried;
    if c.files() == 0 {
        return;
    }
    let how = match (c.linked, c.copied) {
        (_, 0) => "hard links to the input's files (same file system; no space used)".to_string(),
        (0, _) => "copies (the input is on another file system, or refuses hard links)".to_string(),
        (l, k) => format!(
            "{} and {} (the others were refused)",
            plural(l, "hard link", "hard links"),
            plural(k, "copy", "copies")
        ),
    };
    p.line(format!(
        "  carried {} unchanged from the input ({}): {how}",
        plural(c.files(), "file", "files"),
        wanbake::human::size(c.bytes)
    ));
}

fn warn_left_out(p: &mut super::Printer, left_out: &[std::path::PathBuf]) {
    if left_out.is_empty() {
        return;
    }
    let mut tops: Vec<String> = (left_out.iter())
        .filter_map(|f| f.components().next())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    tops.dedup();
    p.warn(format!(
        "not carried to the output: {} of the input pipeline ({}); this format holds the \
         transformers only, load the other components from the input",
        plural(left_out.len(), "file", "files"),
        tops.join(", ")
    ));
}
