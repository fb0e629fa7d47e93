//! `wanbake inspect PATH... [--json] [--hash]`.

use std::path::PathBuf;

use super::{Printer, Status};

/// Arguments of `inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint files or folders, adapter files or folders.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print a JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also compute sha256 of every file.
    #[arg(long)]
    pub hash: bool,
}

/// Runs `inspect`.
pub fn execute(args: Args, p: &mut Printer) -> anyhow::Result<Status> {
    let mut status = Status::Ok;
    for path in &args.paths {
        match crate::io::SafetensorsFile::open(path) {
            Ok(f) => {
                p.line(format!(
                    "{}: {} tensors, {} bytes",
                    path.display(),
                    f.infos().len(),
                    f.len()
                ));
                for t in f.infos() {
                    p.line(format!("  {} {} {:?}", t.name, t.dtype, t.shape));
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                status = Status::Failed;
            }
        }
    }
    Ok(status)
}
