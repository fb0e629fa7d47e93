//! `wanbake inspect PATH... [--json] [--hash] [--base BASE]`: every path is reported,
//! problems included; the exit code is 1 if any path could not be read. Adapters get their
//! convention, kinds, ranks, scales and targets; with `--base`, what each entry binds to
//! (unused keys, unbound entries and binding errors also make the exit code 1).

use std::path::PathBuf;

use super::{Printer, Status};
use wanbake::adapter::report::describe_path;
use wanbake::error_text::chain;
use wanbake::inspect::{InspectReport, inspect, render_text};
use wanbake::io::Checkpoint;
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

/// Runs `inspect`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let mut status = Status::Ok;
    let mut docs = Vec::new();
    let base = match &args.base {
        Some(b) => Some((b.as_path(), BaseModel::open(b)?)),
        None => None,
    };
    for path in &args.paths {
        if let Some(gguf) = wanbake::io::gguf::single_gguf_in(path) {
            match wanbake::quant_inspect::inspect_gguf(&gguf, args.hash) {
                Ok(r) => {
                    p.line(wanbake::quant_inspect::render_gguf(&r));
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
        let report = Checkpoint::open(path).and_then(|c| inspect(&c, args.hash));
        match report {
            Ok(mut r) => {
                let base = base.as_ref().map(|(p, c)| (*p, c));
                for problem in add_adapter_details(path, &mut r, base) {
                    p.error_line(format!("error: {problem}"));
                    status = Status::Failed;
                }
                // scaled-fp8 files ComfyUI would load wrongly (`quant_inspect`)
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
