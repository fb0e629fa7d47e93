//! `wanbake completions SHELL`: the shell completion script of the whole command line,
//! generated from the same clap definition the binary parses (clap_complete), printed on
//! standard output. Owns only the subcommand; the script's content is clap_complete's.

use clap::CommandFactory;
use clap_complete::Shell;

use super::stdio::{Stream, line};
use super::{Cli, Status};

/// Arguments of `completions`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The shell to complete for. Install, e.g.: `wanbake completions bash >
    /// ~/.local/share/bash-completion/completions/wanbake`, `wanbake completions zsh >
    /// ~/.zfunc/_wanbake` (with `fpath+=~/.zfunc` before `compinit`), `wanbake completions
    /// fish > ~/.config/fish/completions/wanbake.fish`
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the script. It is generated into memory first, so a closed pipe is an ignored
/// write (`stdio`), not clap_complete's panic on a failed write.
pub fn execute(args: Args) -> anyhow::Result<Status> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "wanbake", &mut script);
    let text = String::from_utf8_lossy(&script);
    line(Stream::Stdout, text.trim_end_matches('\n'));
    Ok(Status::Ok)
}
