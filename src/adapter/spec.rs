//! The `--adapter [COMPONENT=]PATH[:STRENGTH]` syntax.
//!
//! Owns: `AdapterSpec` and its parser, `ComponentChoice`. Does not own: opening the file
//! or checking the component exists (`adapter::bound`, against the base).
//!
//! Grammar, purely syntactic (it never looks at the file system, so a spelling means the
//! same thing everywhere):
//! - `COMPONENT=` (optional): the text before the first `=`, when it is a bare identifier
//!   (letters, digits, `_`). It names a transformer of a pipeline base (`transformer`,
//!   `transformer_2`, `high_noise_model`, `low_noise_model`) or `all` for every one. A path
//!   whose name contains `=` can be written `./a=b.safetensors`.
//! - `:STRENGTH` (optional, default 1): the text after the last `:`, when it contains no
//!   `/`. It must be a finite decimal number. A path containing `:` must therefore end with
//!   an explicit strength (`my:lora.safetensors:1`).

use std::path::PathBuf;

use super::Convention;

/// Which transformer(s) of the base an adapter is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComponentChoice {
    /// Not said: the base must have exactly one transformer.
    Only,
    /// Every transformer of the base (`all=`).
    All,
    /// The named one (`transformer=`, `transformer_2=`, ...).
    Named(String),
}

/// One `--adapter` argument.
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterSpec {
    /// The argument as given (for messages and the report).
    pub text: String,
    /// Target transformer(s).
    pub component: ComponentChoice,
    /// Adapter file or folder.
    pub path: PathBuf,
    /// Application weight `a` (finite).
    pub strength: f64,
    /// Read the adapter as this convention instead of detecting it (recipes; the command
    /// line always detects).
    pub from: Option<Convention>,
    /// σ for every low-rank entry, for files that carry none (recipes).
    pub scale: Option<f64>,
}

/// Why an `--adapter` argument could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpecError {
    /// The strength is not a finite number.
    #[error(
        "--adapter `{text}`: strength `{strength}` is not a finite number \
         (write PATH:STRENGTH, e.g. lora.safetensors:0.8; a path containing `:` must end with \
         an explicit strength, e.g. my:lora.safetensors:1)"
    )]
    Strength {
        /// The argument.
        text: String,
        /// The strength text.
        strength: String,
    },
    /// No path left after removing the component and the strength.
    #[error("--adapter `{text}`: no adapter path (expected [COMPONENT=]PATH[:STRENGTH])")]
    NoPath {
        /// The argument.
        text: String,
    },
}

impl AdapterSpec {
    /// Parses one argument; see the module doc for the grammar.
    pub fn parse(text: &str) -> Result<AdapterSpec, SpecError> {
        let (component, rest) = match text.split_once('=') {
            Some((name, rest)) if is_identifier(name) => {
                let choice = if name == "all" {
                    ComponentChoice::All
                } else {
                    ComponentChoice::Named(name.to_string())
                };
                (choice, rest)
            }
            _ => (ComponentChoice::Only, text),
        };
        let (path, strength) = match rest.rsplit_once(':') {
            Some((path, s)) if !s.contains('/') => {
                let strength = s
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| SpecError::Strength {
                        text: text.to_string(),
                        strength: s.to_string(),
                    })?;
                (path, strength)
            }
            _ => (rest, 1.0),
        };
        if path.is_empty() {
            return Err(SpecError::NoPath {
                text: text.to_string(),
            });
        }
        Ok(AdapterSpec {
            text: text.to_string(),
            component,
            path: PathBuf::from(path),
            strength,
            from: None,
            scale: None,
        })
    }
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> AdapterSpec {
        AdapterSpec::parse(s).unwrap()
    }

    #[test]
    fn path_strength_and_component() {
        let a = parse("lora.safetensors");
        assert_eq!(
            (a.component, a.path, a.strength),
            (ComponentChoice::Only, "lora.safetensors".into(), 1.0)
        );
        let a = parse("dir/peft_adapter:0.75");
        assert_eq!((a.path, a.strength), ("dir/peft_adapter".into(), 0.75));
        let a = parse("transformer_2=low.safetensors:-0.5");
        assert_eq!(
            (a.component, a.path, a.strength),
            (
                ComponentChoice::Named("transformer_2".into()),
                "low.safetensors".into(),
                -0.5
            )
        );
        assert_eq!(
            parse("all=x.safetensors:1e-1").component,
            ComponentChoice::All
        );
    }

    #[test]
    fn escapes_for_colons_and_equals_in_paths() {
        let a = parse("my:lora.safetensors:1");
        assert_eq!((a.path, a.strength), ("my:lora.safetensors".into(), 1.0));
        let a = parse("./a=b.safetensors");
        assert_eq!(
            (a.component, a.path),
            (ComponentChoice::Only, "./a=b.safetensors".into())
        );
        // A ':' inside a directory name is part of the path.
        let a = parse("runs/2024:05/lora.safetensors");
        assert_eq!(a.path, PathBuf::from("runs/2024:05/lora.safetensors"));
    }

    #[test]
    fn non_finite_or_garbage_strengths_are_refused() {
        for bad in [
            "a.safetensors:nan",
            "a.safetensors:inf",
            "a.safetensors:-infinity",
            "a.safetensors:x",
            "a.safetensors:",
        ] {
            assert!(
                matches!(AdapterSpec::parse(bad), Err(SpecError::Strength { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            AdapterSpec::parse("transformer=:0.5"),
            Err(SpecError::NoPath { .. })
        ));
    }
}
