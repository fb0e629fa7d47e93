//! `wanbake inspect PATH... [--json] [--hash]`: every path is reported, problems included;
//! the exit code is 1 if any path could not be read.

use std::path::PathBuf;

use super::{Printer, Status};
use crate::inspect::{inspect, render_text};
use crate::io::Checkpoint;

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
}

/// Runs `inspect`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let mut status = Status::Ok;
    let mut docs = Vec::new();
    for path in &args.paths {
        let report = Checkpoint::open(path).and_then(|c| inspect(&c, args.hash));
        match report {
            Ok(r) => {
                p.line(render_text(&r));
                docs.push(serde_json::to_value(&r)?);
            }
            Err(e) => {
                eprintln!("error: {e}");
                docs.push(
                    serde_json::json!({"path": path.display().to_string(), "error": e.to_string()}),
                );
                status = Status::Failed;
            }
        }
    }
    p.json(&serde_json::Value::Array(docs));
    Ok(status)
}
