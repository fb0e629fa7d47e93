//! The command-line layer: clap definitions, the printer, and the mapping from library
//! results to exit codes. Each subcommand has its own file with an `Args` struct and an
//! `execute` function; nothing here does model work.

use clap::{Parser, Subcommand};

pub mod inspect;
pub mod printer;
pub mod run;

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
    #[arg(long, global = true)]
    pub quiet: bool,
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Describe checkpoints and adapters: files, tensors, dtypes, model fingerprint.
    Inspect(inspect::Args),
    /// Run the bundled WAN transformer on CPU: one forward, or N sampling steps with CFG.
    Run(run::Args),
}

/// Runs the parsed command line.
pub fn execute(cli: Cli) -> anyhow::Result<Status> {
    let quiet = cli.quiet;
    match cli.command {
        Command::Inspect(a) => {
            let mut p = Printer::new(a.json, quiet);
            inspect::execute(a, &mut p)
        }
        Command::Run(a) => {
            let mut p = Printer::new(a.json, quiet);
            run::execute(a, &mut p)
        }
    }
}

/// An error in how the command was invoked, found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
