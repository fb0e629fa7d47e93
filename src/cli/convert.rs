//! `wanbake convert IN --dtype bf16|f16|f32 --out DIR [--shard-size BYTES]`: converts every
//! float tensor of any checkpoint, mirroring its naming, as a verified release.
//! `wanbake convert IN --to fp8-scaled|gguf:q8_0|q4_0|q5_0|bf16|f16 --out DIR`: a WAN
//! transformer as one quantized file with original-Wan names: the merge of no adapters
//! (`wanbake::merge::quantize_release`).

use std::path::PathBuf;

use super::{Printer, Status, UsageError, output};
use wanbake::convert::{ConvertSpec, DtypeChoice, convert_release, keep_none};
use wanbake::io::staging::Replace;
use wanbake::merge::{MergeFailure, MergeOptions, OptionsText, quantize_release};

/// Arguments of `convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Input checkpoint (file, index, folder, pipeline).
    pub input: PathBuf,
    /// Output dtype for float tensors: f32, f16 or bf16. With --to fp8-scaled: the dtype of
    /// the tensors that stay high precision (default f16, as ComfyUI's own release).
    #[arg(long, value_parser = output::float_dtype)]
    pub dtype: Option<wanbake::io::DType>,
    /// A quantized output for ComfyUI: fp8-scaled (one scaled-fp8 .safetensors) or
    /// gguf:q8_0|q4_0|q5_0|bf16|f16 (one ComfyUI-GGUF .gguf), original-Wan names.
    #[arg(long)]
    pub to: Option<String>,
    /// GGUF block types: quantize the F16 rounding of each weight, as city96's two-step
    /// pipeline does, for byte-compatible files (default: the exact f32 weights).
    #[arg(long)]
    pub city96_rounding: bool,
    /// Output directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Shard the weights into files of at most this size ("5GB", "500MB", bytes).
    #[arg(long, value_name = "SIZE", value_parser = output::size)]
    pub shard_size: Option<u64>,
    /// Replace an existing output directory.
    #[arg(long)]
    pub overwrite: bool,
    /// Print a JSON summary.
    #[arg(long)]
    pub json: bool,
}

/// Runs `convert`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    if let Some(to) = &args.to {
        return execute_quantized(to, &args, p);
    }
    if args.city96_rounding {
        return Err(UsageError("--city96-rounding needs --to gguf:<type>".into()).into());
    }
    let Some(dtype) = args.dtype else {
        return Err(UsageError("convert needs --dtype f32|f16|bf16 or --to FORMAT".into()).into());
    };
    let spec = ConvertSpec {
        input: args.input,
        out: args.out,
        dtypes: DtypeChoice {
            target: Some(dtype),
            keep_f32: keep_none,
        },
        shard_bytes: args.shard_size,
        replace: if args.overwrite {
            Replace::Overwrite
        } else {
            Replace::Never
        },
    };
    let r = convert_release(&spec)?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({} files, {} bytes)",
        r.dir.display(),
        r.manifest.files.len(),
        bytes
    ));
    p.json(&serde_json::json!({"dir": r.dir, "report": r.manifest.report, "bytes": bytes}));
    Ok(Status::Ok)
}

fn execute_quantized(to: &str, args: &Args, p: &mut Printer) -> anyhow::Result<Status> {
    let dtype = args.dtype.map(|d| d.as_str().to_ascii_lowercase());
    let options = MergeOptions::from_text(&OptionsText {
        dtype: dtype.as_deref(),
        shard_bytes: args.shard_size,
        to: Some(to),
        city96_rounding: args.city96_rounding,
        ..OptionsText::default()
    })
    .map_err(|b| UsageError(format!("--{}: {}", b.field.replace('_', "-"), b.message)))?;
    let Some(q) = options.quantize else {
        return Err(UsageError(format!("--to {to}: not a quantized output")).into());
    };
    super::merge::refuse_gguf_out(&args.out)?;
    let replace = if args.overwrite {
        Replace::Overwrite
    } else {
        Replace::Never
    };
    let format = q.format;
    let r = quantize_release(&args.input, q, &args.out, replace).map_err(|e| match e {
        MergeFailure::Merge(m) => super::merge::usage_or(*m),
        other => other.into(),
    })?;
    let bytes: u64 = r.manifest.files.iter().map(|f| f.bytes).sum();
    p.line(format!(
        "wrote {} ({format}: {} files, {} bytes)",
        r.dir.display(),
        r.manifest.files.len(),
        bytes
    ));
    super::merge::print_quantization(p, &r.manifest.report, "  ");
    p.json(&serde_json::json!({"dir": r.dir, "report": r.manifest.report, "bytes": bytes}));
    Ok(Status::Ok)
}
