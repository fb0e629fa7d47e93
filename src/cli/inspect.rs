//! `wanbake inspect PATH... [--json] [--hash] [--base BASE]`: every path is reported,
//! problems included; the exit code is 1 if any path could not be read. Adapters get their
//! convention, kinds, ranks, scales and targets; with `--base`, what each entry binds to
//! (unused keys, unbound entries and binding errors also make the exit code 1). With
//! `--keys[=GLOB]`, only the tensors: name, dtype and shape, one per line.

use std::path::{Path, PathBuf};

use super::{Printer, Status};
use wanbake::adapter::report::describe_path;
use wanbake::error_text::chain;
use wanbake::inspect::{InspectReport, KeyRow, inspect, keys, render_keys, render_text};
use wanbake::io::{Checkpoint, ReadError};
use wanbake::model::base_model::BaseModel;

/// Arguments of `inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint files or folders, adapter files or folders.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print one JSON document (an array with one report per path) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also compute the sha256 of every weight file.
    #[arg(long)]
    pub hash: bool,
    /// Bind adapters against this base checkpoint: targets, shape checks, variant verdict.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// List the tensors instead, one per line: name, dtype and shape (with --json, one
    /// object per tensor). `--keys=GLOB` keeps the names GLOB matches (`*` any run of
    /// characters, `?` one; quote it from the shell); a pipeline's names are listed as
    /// component/name. Exit code 1 when a path has no matching tensor.
    #[arg(
        long,
        value_name = "GLOB",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "*",
        conflicts_with_all = ["hash", "base"]
    )]
    pub keys: Option<String>,
}

/// Fills the adapter details of an adapter's report; returns the problems found.
fn add_adapter_details(
    path: &std::path::Path,
    r: &mut InspectReport,
    base: Option<(&std::path::Path, &BaseModel)>,
) -> Vec<String> {
    let Some(comp) = r.components.iter_mut().find(|c| c.role == "adapter") else {
        return Vec::new();
    };
    match describe_path(path, base) {
        Ok(a) => {
            let problems = a.problems(path);
            comp.adapter = serde_json::to_value(&a).ok();
            problems
        }
        Err(e) => vec![chain(&e)],
    }
}

/// The tensors of one path matching `glob`, a GGUF file's or any checkpoint's.
fn path_keys(path: &Path, glob: &str) -> Result<Vec<KeyRow>, ReadError> {
    match wanbake::io::gguf::single_gguf_in(path) {
        Some(gguf) => wanbake::inspect::gguf_keys(&gguf, glob),
        None => Checkpoint::open_stored(path).map(|c| keys(&c, glob)),
    }
}

/// Runs `inspect --keys[=GLOB]`.
fn execute_keys(paths: &[PathBuf], glob: &str, p: &mut Printer) -> Status {
    let mut status = Status::Ok;
    let mut docs = Vec::new();
    for path in paths {
        let problem = match path_keys(path, glob) {
            Ok(rows) if rows.is_empty() => {
                format!("{}: no tensor name matches `{glob}`", path.display())
            }
            Ok(rows) => {
                if paths.len() > 1 {
                    p.line(format!("{}:", path.display()));
                }
                p.line(render_keys(&rows).trim_end());
                docs.push(serde_json::json!({"path": path.display().to_string(), "tensors": rows}));
                continue;
            }
            Err(e)
                if !path.exists() && glob == "*" && path.to_string_lossy().contains(['*', '?']) =>
            {
                format!("{} (a glob is written --keys=GLOB)", chain(&e))
            }
            Err(e) => chain(&e),
        };
        p.error_line(format!("error: {problem}"));
        docs.push(serde_json::json!({"path": path.display().to_string(), "error": problem}));
        status = Status::Failed;
    }
    p.json(&serde_json::Value::Array(docs));
    status
}

/// Runs `inspect`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    if let Some(glob) = &args.keys {
        return Ok(execute_keys(&args.paths, glob, p));
    }
    let mut status = Status::Ok;
    let mut docs = Vec::new();
    let base = match &args.base {
        Some(b) => Some((b.as_path(), wanbake::quant::base::open(b)?)),
        None => None,
    };
    for path in &args.paths {
        if let Some(gguf) = wanbake::io::gguf::single_gguf_in(path) {
            match wanbake::quant::inspect::inspect_gguf(&gguf, args.hash) {
                Ok(r) => {
                    p.line(wanbake::quant::inspect::render_gguf(&r));
                    docs.push(r);
                }
                Err(e) => {
                    p.error_line(format!("error: {}", chain(&e)));
                    docs.push(
                        serde_json::json!({"path": path.display().to_string(), "error": chain(&e)}),
                    );
                    status = Status::Failed;
                }
            }
            continue;
        }
        let report = Checkpoint::open_stored(path).and_then(|c| inspect(&c, args.hash));
        match report {
            Ok(mut r) => {
                let base = base.as_ref().map(|(p, c)| (*p, c));
                for problem in add_adapter_details(path, &mut r, base) {
                    p.error_line(format!("error: {problem}"));
                    status = Status::Failed;
                }
                // scaled-fp8 files ComfyUI would load wrongly (`quant::inspect`)
                for c in &r.components {
                    for q in c
                        .quantization
                        .iter()
                        .flat_map(|q| q["problems"].as_array())
                        .flatten()
                    {
                        p.error_line(format!(
                            "error: {}: {}",
                            path.display(),
                            q.as_str().unwrap_or("")
                        ));
                        status = Status::Failed;
                    }
                }
                p.line(render_text(&r));
                docs.push(serde_json::to_value(&r)?);
            }
            Err(e) => {
                p.error_line(format!("error: {}", chain(&e)));
                docs.push(
                    serde_json::json!({"path": path.display().to_string(), "error": chain(&e)}),
                );
                status = Status::Failed;
            }
        }
    }
    p.json(&serde_json::Value::Array(docs));
    Ok(status)
}
