//! The one way an error becomes text: the error's own message, then each of its causes,
//! joined by `: ` (`a: b: c`). `wanbake` prints this after `error: `, and library code that
//! must keep an error as a `String` (a report's list of problems, a message another error
//! carries) formats it here, so no cause is lost.
//!
//! Every wanbake error either says its source in its message or returns it as
//! `Error::source`, never both; this module relies on that and prints each link once, as
//! it is. Imports nothing of wanbake, so every layer can use it.

use std::error::Error;
use std::fmt;

/// Displays an error and every cause, joined by `: `.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

/// The error and every cause, joined by `: ` (see [`Chain`]).
pub fn chain(e: &(dyn Error + 'static)) -> String {
    Chain(e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer `{name}`")]
    struct Outer {
        name: String,
        #[source]
        source: Middle,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{}", path)]
    struct Middle {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once_in_order() {
        let e = Outer {
            name: "x".into(),
            source: Middle {
                path: "a.safetensors".into(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            },
        };
        let io = std::io::Error::from(std::io::ErrorKind::NotFound).to_string();
        assert_eq!(chain(&e), format!("outer `x`: a.safetensors: {io}"));
        assert_eq!(Chain(&e.source).to_string(), format!("a.safetensors: {io}"));
    }

    #[test]
    fn an_error_without_a_source_is_its_message() {
        let e = std::io::Error::other("plain");
        assert_eq!(chain(&e), "plain");
    }

    #[test]
    fn a_cause_whose_text_repeats_is_not_dropped() {
        // The old de-duplication skipped a cause already contained in the text; the chain
        // is printed as it is, so an error that repeats its source would show it twice.
        let e = Middle {
            path: "disk".into(),
            source: std::io::Error::other("disk"),
        };
        assert_eq!(chain(&e), "disk: disk");
    }
}
