//! The `wanbake` binary: parse, dispatch, choose the exit code. All work is in the library;
//! the command-line layer (`cli`) is part of the binary, not of the library's API.
//! Nothing here prints with `println!`/`eprintln!` (they panic on a closed pipe); every
//! line goes through `cli::stdio`.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::Parser;
mod cli;

use cli::{Cli, Status};

fn main() -> ExitCode {
    wanbake::release::staging::install_signal_guards();
    wanbake::io::mmap::install_sigbus_guard();
    // Every faer call in wanbake passes its parallelism explicitly; an accidental high-level
    // call that reads faer's global default (whose results depend on the core count) panics.
    faer::disable_global_parallelism();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // `Error::print` returns write errors (a closed pipe included) rather than
            // panicking; they change nothing: the status stays help's or the usage error's.
            let _ = e.print();
            let args: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            if let Some(hint) = cli::hint::parse_hint(&e, &args) {
                cli::stdio::line(cli::stdio::Stream::Stderr, format_args!("hint: {hint}"));
            }
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(Status::Usage.code()),
            };
        }
    };
    let front = cli::hint::FrontEnd::of(&cli.command);
    match cli::execute(cli) {
        Ok(status) => ExitCode::from(status.code()),
        Err(e) => {
            cli::stdio::line(
                cli::stdio::Stream::Stderr,
                format_args!("error: {}", wanbake::error_text::Chain(e.as_ref())),
            );
            if let Some(hint) = cli::hint::hint(&e, front) {
                cli::stdio::line(cli::stdio::Stream::Stderr, format_args!("hint: {hint}"));
            }
            let status = if cli::hint::is_usage(&e, front) {
                Status::Usage
            } else {
                Status::Failed
            };
            ExitCode::from(status.code())
        }
    }
}
