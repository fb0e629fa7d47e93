//! One printer for every subcommand, so `--quiet` and `--json` are single switches:
//! human lines go to stdout unless quiet or json; JSON documents go to stdout only in json
//! mode; warnings go to stderr unless quiet; errors are printed by `main` regardless.

use std::io::Write;

/// Where a subcommand's output goes.
#[derive(Debug)]
pub struct Printer {
    json: bool,
    quiet: bool,
}

impl Printer {
    /// A printer for the given switches.
    pub fn new(json: bool, quiet: bool) -> Printer {
        Printer { json, quiet }
    }

    /// True when human progress output should be shown.
    pub fn is_human(&self) -> bool {
        !self.json && !self.quiet
    }

    /// A line for people (suppressed by --quiet and --json).
    pub fn line(&mut self, s: impl AsRef<str>) {
        if self.is_human() {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", s.as_ref());
        }
    }

    /// A warning on stderr (suppressed by --quiet).
    pub fn warn(&mut self, s: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("warning: {}", s.as_ref());
        }
    }

    /// The machine-readable result (printed only with --json), pretty and key-sorted.
    pub fn json(&mut self, v: &serde_json::Value) {
        if self.json {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(v)
                    .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
            );
        }
    }
}
