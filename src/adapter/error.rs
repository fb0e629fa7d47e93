//! Why an adapter could not be read, bound to a base, or translated.
//!
//! Owns: `AdapterError` (every variant names the adapter path and the keys, modules or
//! entries concerned, with expected versus found where there is a shape; the way out, a
//! flag or a recipe key, is the front end's hint), `KeyProblem` (one
//! adapter key that no entry consumed, and why) and the list formatting shared by the
//! variants. Does not own: I/O errors of the files themselves (`io::ReadError`, wrapped).

use std::fmt::Write as _;
use std::path::PathBuf;

use super::Convention;
use crate::human::plural;
use crate::io::ReadError;

/// How many items an error message lists before it counts the rest (a front end's JSON
/// document carries them all: [`AdapterError::listed`]).
pub const LISTED: usize = 8;

/// One adapter key that no entry consumed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct KeyProblem {
    /// The key as stored.
    pub key: String,
    /// Why it was not consumed.
    pub reason: String,
}

/// An entry that could not be bound, or not rendered, with the reason.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct EntryProblem {
    /// The module as the adapter spells it.
    pub module: String,
    /// The entry's kind (`lora`, `diff`, ...).
    pub kind: String,
    /// The adapter keys of the entry.
    pub keys: Vec<String>,
    /// Why.
    pub reason: String,
}

/// Entries explained in model terms, with the list the explanation comes before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Explained {
    /// "this adapter targets the image cross-attention of a Wan 2.1 I2V/FLF2V model, …".
    pub line: String,
    /// Each entry with the reason.
    pub entries: Vec<EntryProblem>,
}

/// Why an adapter could not be used. Nothing has been written when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// The files could not be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A base with several transformers, and an adapter that does not say which one it is
    /// for.
    #[error(
        "adapter `{adapter}`: the base has {} transformers ({}); say which one it is for",
        components.len(),
        components.join(", ")
    )]
    ComponentNeeded {
        /// The adapter as the user gave it.
        adapter: String,
        /// The base's transformers.
        components: Vec<String>,
    },
    /// An adapter for a transformer the base does not have.
    #[error(
        "adapter `{adapter}`: the base has no transformer `{named}`; it has {}",
        match components.as_slice() {
            [_] => "a single model".to_string(),
            many => format!("transformers {}", many.join(", ")),
        }
    )]
    NoSuchComponent {
        /// The adapter as the user gave it.
        adapter: String,
        /// The transformer it names.
        named: String,
        /// The base's transformers.
        components: Vec<String>,
    },
    /// The adapter is a kind wanbake refuses (wrong PEFT type, un-converted PiSSA, ...).
    #[error("{}: {reason}", path.display())]
    Refused {
        /// The adapter.
        path: PathBuf,
        /// Why, and what to do.
        reason: String,
    },
    /// adapter_config.json, `lora_adapter_metadata`, `lora_config` or NNX metadata is
    /// malformed.
    #[error("{}: {what}: {reason}", path.display())]
    Config {
        /// The adapter.
        path: PathBuf,
        /// Which config.
        what: String,
        /// The problem.
        reason: String,
    },
    /// The keys mix conventions and none was chosen.
    #[error(
        "{}: the keys mix adapter conventions ({summary})",
        path.display()
    )]
    Mixed {
        /// The adapter.
        path: PathBuf,
        /// Counts per convention with an example key each.
        summary: String,
    },
    /// Keys that no entry consumed (unknown, unsupported or malformed).
    #[error(
        "{}: {} {} not part of any adapter entry wanbake can apply (every key must be consumed):{}",
        path.display(), plural(problems.len(), "key", "keys"), are(problems.len()), list_keys(problems)
    )]
    Keys {
        /// The adapter.
        path: PathBuf,
        /// Each key with its reason.
        problems: Vec<KeyProblem>,
    },
    /// A file without a scale where the user must give one.
    #[error("{}: {reason}", path.display())]
    NoScale {
        /// The adapter.
        path: PathBuf,
        /// What is missing and how to pass it.
        reason: String,
    },
    /// A Qwix/NNX file without the metadata its scale comes from, and no scale given (the
    /// front end says how to give one).
    #[error(
        "{}: Qwix/NNX LoRA without {looked_in}: its scale σ = α/r is not in the {}, \
         and wanbake does not guess",
        path.display(),
        if *orbax { "checkpoint" } else { "file" }
    )]
    ScaleNeeded {
        /// The adapter.
        path: PathBuf,
        /// Where the metadata was looked for.
        looked_in: String,
        /// Whether the adapter is an Orbax checkpoint.
        orbax: bool,
    },
    /// Entries whose module names no base tensor.
    #[error(
        "{}: {}{} {} to no tensor of the base {}:{}",
        adapter.display(), hint_first(hint), plural(entries.len(), "entry", "entries"),
        if entries.len() == 1 { "binds" } else { "bind" }, base.display(), list_entries(entries)
    )]
    Unmatched {
        /// The adapter.
        adapter: PathBuf,
        /// The base.
        base: PathBuf,
        /// Each entry with the reason.
        entries: Vec<EntryProblem>,
        /// Which parts of another WAN variant the entries belong to, when that explains it.
        hint: Option<String>,
    },
    /// Entries whose tensors do not fit the base tensor they name.
    #[error(
        "{}: {}{}{} {} not fit the base {}:{}",
        adapter.display(), hint_first(explained), hint_first(hint),
        plural(entries.len(), "entry", "entries"), if entries.len() == 1 { "does" } else { "do" },
        base.display(), list_entries(entries)
    )]
    Shapes {
        /// The adapter.
        adapter: PathBuf,
        /// The base.
        base: PathBuf,
        /// Each entry, with expected and found shapes in the reason.
        entries: Vec<EntryProblem>,
        /// Which other WAN variant the entries were made for, in model terms, when their
        /// names or shapes say it (said first).
        explained: Option<String>,
        /// The base variant the entries not explained in model terms appear to target (said
        /// first too: the verdict comes before the list).
        hint: Option<String>,
    },
    /// Not one entry binds to the base.
    #[error("{}", no_binding(adapter, base, *base_tensors, guess, explained.as_deref()))]
    NoBinding {
        /// The adapter.
        adapter: PathBuf,
        /// The base.
        base: PathBuf,
        /// Number of base tensors.
        base_tensors: usize,
        /// What the adapter appears to target.
        guess: String,
        /// Which other WAN variant the adapter was made for, in model terms, when its names
        /// or shapes say it; then the message says this first and lists the entries.
        explained: Option<Box<Explained>>,
    },
    /// Module names that no convention's name table resolves (translation without a base).
    #[error(
        "{}: {} cannot be resolved without a base:{}",
        path.display(), plural(entries.len(), "module name", "module names"), list_entries(entries)
    )]
    Names {
        /// The adapter.
        path: PathBuf,
        /// Each entry with the reason.
        entries: Vec<EntryProblem>,
    },
    /// Entries the target convention cannot express exactly.
    #[error(
        "{}: {} cannot be expressed in the {} convention, so nothing was written:{}",
        path.display(), plural(entries.len(), "entry", "entries"), to.as_str(), list_entries(entries)
    )]
    Inexpressible {
        /// The adapter.
        path: PathBuf,
        /// The target convention.
        to: Convention,
        /// Each entry with the reason.
        entries: Vec<EntryProblem>,
    },
}

impl AdapterError {
    /// Every key or entry the message lists (it shows the first [`LISTED`]), for a front
    /// end's JSON document: `{"keys": [..]}` or `{"entries": [..]}`, with `verdict`, what the
    /// message says first (which model the adapter was made for), when it says one.
    pub fn listed(&self) -> Option<serde_json::Value> {
        let (name, all) = match self {
            AdapterError::Keys { problems, .. } => ("keys", serde_json::json!(problems)),
            AdapterError::Unmatched { entries, .. }
            | AdapterError::Shapes { entries, .. }
            | AdapterError::Names { entries, .. }
            | AdapterError::Inexpressible { entries, .. } => {
                ("entries", serde_json::json!(entries))
            }
            AdapterError::NoBinding {
                explained: Some(x), ..
            } => ("entries", serde_json::json!(x.entries)),
            _ => return None,
        };
        let verdict = match self {
            AdapterError::Shapes {
                explained, hint, ..
            } => explained.as_deref().or(hint.as_deref()),
            _ => self.model_terms(),
        };
        let mut doc = serde_json::json!({ name: all });
        if let Some(v) = verdict {
            doc["verdict"] = v.into();
        }
        Some(doc)
    }

    /// The explanation in model terms of a binding error, when it has one ("this adapter
    /// targets the image cross-attention of a Wan 2.1 I2V/FLF2V model, …").
    pub fn model_terms(&self) -> Option<&str> {
        match self {
            AdapterError::Shapes { explained, .. } => explained.as_deref(),
            AdapterError::NoBinding { explained, .. } => {
                explained.as_ref().map(|x| x.line.as_str())
            }
            AdapterError::Unmatched { hint, .. } => hint.as_deref(),
            _ => None,
        }
    }
}

fn list_keys(problems: &[KeyProblem]) -> String {
    let mut s = String::new();
    for p in problems.iter().take(LISTED) {
        let _ = write!(s, "\n  {}: {}", p.key, p.reason);
    }
    if problems.len() > LISTED {
        let _ = write!(
            s,
            "\n  … and {} more (all of them with --json)",
            problems.len() - LISTED
        );
    }
    s
}

fn list_entries(entries: &[EntryProblem]) -> String {
    let mut s = String::new();
    for e in entries.iter().take(LISTED) {
        let _ = write!(
            s,
            "\n  {} ({}; keys {}): {}",
            e.module,
            e.kind,
            e.keys.join(", "),
            e.reason
        );
    }
    if entries.len() > LISTED {
        let _ = write!(
            s,
            "\n  … and {} more (all of them with --json)",
            entries.len() - LISTED
        );
    }
    s
}

/// `NoBinding`'s message: the model-terms explanation and the list when there is one,
/// else one line with the guess.
fn no_binding(
    adapter: &std::path::Path,
    base: &std::path::Path,
    base_tensors: usize,
    guess: &str,
    explained: Option<&Explained>,
) -> String {
    match explained {
        Some(x) => format!(
            "{}: {}.\nnone of its {} binds to any of the {base_tensors} tensors of the base {}:{}",
            adapter.display(),
            x.line,
            plural(x.entries.len(), "entry", "entries"),
            base.display(),
            list_entries(&x.entries)
        ),
        None => format!(
            "{}: binds to none of the {base_tensors} tensors of the base {}; {guess}",
            adapter.display(),
            base.display()
        ),
    }
}

/// A hint said before the list it explains.
fn hint_first(hint: &Option<String>) -> String {
    hint.as_deref()
        .map(|h| format!("{h}.\n"))
        .unwrap_or_default()
}

fn are(n: usize) -> &'static str {
    if n == 1 { "is" } else { "are" }
}
