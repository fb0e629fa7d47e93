//! The command-line layer: clap definitions, the printer, and the mapping from library
//! results to exit codes. Part of the binary, not of the library's API; nothing here does
//! model work.
//!
//! Each subcommand has its own file with an `Args` struct and an `execute` function. Flags
//! several commands share are defined once and flattened in (`output`: `--out`/`--overwrite`,
//! `--shard-size`, `--dtype`/`--keep-f32`; `device`: `--device`). Enumerated values are the
//! library types' own `clap::ValueEnum`s (one spelling table per type, `wanbake::names`), so
//! clap rejects a bad value with the list of good ones (exit code 2) and each command gets
//! typed values that it hands to the library's one builder (`MergeOptions::new`, which
//! recipes use too; `RestackOptions`, built in one place) without parsing text again.
//!
//! Library errors pass through unchanged (`?`); `main` prints their chain, and `hint` adds
//! the way out in the spelling of the front end that ran (a flag, or a recipe key for
//! `bake`) and decides which are usage errors.

use clap::{Parser, Subcommand};

pub mod bake;
pub mod completions;
pub mod convert;
pub mod device;
pub mod extract;
pub mod hint;
pub mod inspect;
pub mod merge;
pub mod output;
pub mod printer;
pub mod progress;
pub mod restack;
pub mod run;
pub mod sign;
pub mod stdio;
pub mod synth;
pub mod translate;
pub mod verify;

pub use printer::Printer;

/// Process exit status, as DESIGN.md defines it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// 0: success.
    Ok,
    /// 1: runtime failure (bad input, I/O error, failed check).
    Failed,
    /// 2: usage error.
    Usage,
    /// 3: verification failure.
    VerifyFailed,
}

impl Status {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Failed => 1,
            Status::Usage => 2,
            Status::VerifyFailed => 3,
        }
    }
}

/// wanbake: bake WAN / Stable Audio 3 checkpoints with adapters into exact, verified releases.
#[derive(Parser, Debug)]
#[command(name = "wanbake", version, about, long_about = None)]
pub struct Cli {
    /// Print nothing but errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Worker threads (default: all cores). Outputs are identical for any value.
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// Hash every input again instead of reusing the sha256 cached for a file whose device,
    /// inode, size and modification and change times are unchanged (the cache lives in
    /// $WANBAKE_CACHE_DIR, default ~/.cache/wanbake).
    #[arg(long, global = true)]
    pub no_hash_cache: bool,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

// What a shared flag means for one command, where it means more than its shared text says
// (`output::FloatDtypeArg`, `output::ShardArg`, `device::DeviceArg`): each command's --help
// speaks of that command only.
const SYNTH_DTYPE: &str = "Dtype of every float tensor (default f32; also spelt float32, \
    float16/fp16, bfloat16)";
const CONVERT_DTYPE: &str = "Dtype of every float tensor (also spelt float32, float16/fp16, \
    bfloat16): required without --to; with --to fp8-scaled, the dtype of the tensors that stay \
    high precision (default f16); with a GGUF block mix, convert.py's step-1 type of the 2-D \
    tensors (default f16, bf16 from a bf16 input; f32 as city96's published Wan 2.1 files hold \
    them)";
const EXTRACT_DTYPE: &str = "Dtype of the factors (default f32; also spelt float32, \
    float16/fp16, bfloat16); `.alpha` stays as it is, and the report's errors are those of the \
    f32 factors";
const RESIZE_DTYPE: &str = "Dtype of the new factors (default f32; also spelt float32, \
    float16/fp16, bfloat16); the other tensors keep their stored dtype, `.alpha` stays as it \
    is, and the report's errors are those of the f32 factors";
const MERGE_SHARDS: &str = "Shard each model's weights into files of at most this size \
    (\"5GB\", \"500MB\", \"10GiB\" or bytes; a larger tensor gets a file of its own). Default: \
    shards like the base (one file for a one-file base, files no larger than the base's \
    largest for a sharded one)";
const RESTACK_DEVICE: &str = "Accepted so one flag serves a pipeline: restack runs on the CPU \
    whatever it says (its work is bit-identical on any device)";
const EXTRACT_DEVICE: &str = "Where the SVDs are computed: auto (CUDA when a device and its \
    libraries load, else the CPU), cpu, or cuda (fail when CUDA is unavailable); the merge of \
    an --adapter stack runs on the CPU. The manifest records which ran";

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Describe checkpoints and adapters: files, tensors, dtypes, model fingerprint.
    Inspect(inspect::Args),
    /// Recompute every hash of a release from the disk (never from the hash cache) and
    /// compare with its manifest (exit 3 on mismatch).
    Verify(verify::Args),
    /// Write a synthetic checkpoint with the real shapes of a released model.
    #[command(mut_arg("dtype", |a| a.help(SYNTH_DTYPE)))]
    Synth(synth::Args),
    /// Convert any checkpoint's float tensors to another dtype (its names kept), or to
    /// ComfyUI's fp8-scaled or a GGUF quantization (--to).
    #[command(mut_arg("dtype", |a| a.help(CONVERT_DTYPE)))]
    Convert(convert::Args),
    /// Write an adapter in another convention (PEFT, diffusers, ComfyUI, kohya, LyCORIS, SA3,
    /// NNX).
    Translate(translate::Args),
    /// Merge adapters into a base checkpoint (streaming, exact, one pass) and write a release.
    #[command(mut_arg("shard_size", |a| a.help(MERGE_SHARDS)))]
    Merge(merge::Args),
    /// Convert a WAN transformer between the diffusers, wan, nnx and nnx-scanned layouts.
    #[command(mut_arg("device", |a| a.help(RESTACK_DEVICE)))]
    Restack(restack::Args),
    /// Run the bundled WAN transformer on CPU: one forward, or N sampling steps with CFG.
    Run(run::Args),
    /// Bake a release from a recipe: plan, merge + restack, check, commit, verify.
    Bake(bake::Args),
    /// Sign a release folder (OpenSSF model signing bundle, ECDSA key; `verify --public-key`).
    Sign(sign::Args),
    /// Extract a LoRA from a fine-tune (tuned − base, or base + adapters), by rank, energy or budget.
    #[command(mut_arg("dtype", |a| a.help(EXTRACT_DTYPE)))]
    #[command(mut_arg("device", |a| a.help(EXTRACT_DEVICE)))]
    Extract(extract::ExtractArgs),
    /// Reduce a LoRA's ranks (best rank-R approximation of σ·B·A), in its own convention.
    #[command(mut_arg("dtype", |a| a.help(RESIZE_DTYPE)))]
    Resize(extract::ResizeArgs),
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::Args),
}

/// Runs the parsed command line.
pub fn execute(mut cli: Cli) -> anyhow::Result<Status> {
    let quiet = cli.quiet;
    resolve_inputs(&mut cli.command)?;
    wanbake::io::input_hash::configure_cache(if cli.no_hash_cache {
        wanbake::io::input_hash::HashCache::Off
    } else {
        wanbake::io::input_hash::HashCache::Default
    });
    if let Some(n) = cli.threads {
        if n == 0 {
            return Err(UsageError("--threads must be at least 1".into()).into());
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| anyhow::anyhow!("cannot start {n} worker threads: {e}"))?;
    }
    match cli.command {
        Command::Inspect(a) => shown(a.json, quiet, a, inspect::execute),
        Command::Verify(a) => shown(a.json, quiet, a, verify::execute),
        Command::Synth(a) => shown(a.json, quiet, a, synth::execute),
        Command::Convert(a) => shown(a.json, quiet, a, convert::execute),
        Command::Translate(a) => shown(a.json, quiet, a, translate::execute),
        Command::Merge(a) => shown(a.json, quiet, a, merge::execute),
        Command::Restack(a) => shown(a.json, quiet, a, restack::execute),
        Command::Run(a) => shown(a.json, quiet, a, run::execute),
        Command::Bake(a) => shown(a.json, quiet, a, bake::execute),
        Command::Sign(a) => shown(a.json, quiet, a, sign::execute),
        Command::Extract(a) => shown(a.json, quiet, a, extract::execute_extract),
        Command::Resize(a) => shown(a.json, quiet, a, extract::execute_resize),
        Command::Completions(a) => completions::execute(a),
    }
}

/// Resolves every model and adapter path of `command` in place (`io::hub`: Hugging Face
/// cache references and cache repo folders become their snapshot folder), before it runs,
/// so the command, its messages and its manifest see the folder that is read. `--adapter`
/// arguments are resolved as they are parsed (`merge::adapter_specs`); recipes resolve
/// their own paths (`Recipe::parse`).
fn resolve_inputs(command: &mut Command) -> Result<(), wanbake::io::hub::HubError> {
    fn one(p: &mut std::path::PathBuf) -> Result<(), wanbake::io::hub::HubError> {
        *p = wanbake::io::hub::resolve(p)?;
        Ok(())
    }
    let (required, optional) = match command {
        Command::Inspect(a) => (a.paths.iter_mut().collect(), a.base.as_mut()),
        Command::Convert(a) => (vec![&mut a.input], None),
        Command::Translate(a) => (vec![&mut a.adapter], a.base.as_mut()),
        Command::Merge(a) => (vec![&mut a.base], None),
        Command::Restack(a) => (vec![&mut a.input], None),
        Command::Run(a) => (vec![&mut a.model], None),
        Command::Extract(a) => (vec![&mut a.base], a.tuned.as_mut()),
        Command::Resize(a) => (vec![&mut a.adapter], a.base.as_mut()),
        Command::Verify(_)
        | Command::Synth(_)
        | Command::Bake(_)
        | Command::Sign(_)
        | Command::Completions(_) => (Vec::new(), None),
    };
    for p in required.into_iter().chain(optional) {
        one(p)?;
    }
    Ok(())
}

/// Runs one subcommand with its printer, showing the progress of every phase it runs
/// (`progress::watching`).
fn shown<A>(
    json: bool,
    quiet: bool,
    args: A,
    execute: fn(A, &mut Printer) -> anyhow::Result<Status>,
) -> anyhow::Result<Status> {
    let mut p = Printer::new(json, quiet);
    let human = p.is_human();
    let result = progress::watching(human, |screen| {
        p.show_progress_on(screen);
        execute(args, &mut p)
    });
    if let Err(e) = &result {
        // The document a script reads instead of the lines on stderr (`main` prints those).
        p.json(&hint::error_document(e));
    }
    result
}

/// An error in how the command was invoked, found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
