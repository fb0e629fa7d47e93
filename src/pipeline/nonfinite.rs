//! Values an output cannot hold: NaN, ±inf, and finite values beyond what the output dtype
//! or format can store (an f16 overflow, a GGUF block whose f16 scale overflows), found in
//! the pass that converts each tensor.
//!
//! Owns: [`NonFinite`] (refuse, the default, or allow: `--allow-nonfinite`, a recipe's
//! `output.allow_nonfinite`), [`Origin`] (the base, an adapter's own tensor, or the merge and
//! which adapter took the value there), [`UnheldValues`] (one tensor's finding: file, tensor,
//! the first index and value, the count, the origin, the way out; the error of a refusal and
//! the manifest's `nonfinite` entry of an allowed one; its hint, worded for the front end that
//! ran, is the binary's, `cli::hint`). Does not own: the scans
//! (`codec::dtype::{all_held, all_finite_bytes, Unheld}`), where they run (`pipeline::exec`,
//! `merge`, `extract`).

use std::fmt;
use std::path::PathBuf;

use crate::codec::dtype::{Unheld, largest_finite};
use crate::io::DType;

/// What a producing command does with values its output cannot hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonFinite {
    /// Refuse: exit 1, nothing written, the error names the first value (the default).
    #[default]
    Refuse,
    /// Write them as the output's rounding gives (NaN, ±inf, a saturated or infinite block
    /// scale) and list them in the manifest's report (`--allow-nonfinite`).
    Allow,
}

impl NonFinite {
    /// `--allow-nonfinite` (or a recipe's `allow_nonfinite`) given or not.
    pub fn allowed(allow: bool) -> NonFinite {
        if allow {
            NonFinite::Allow
        } else {
            NonFinite::Refuse
        }
    }

    /// Is writing them allowed?
    pub fn allows(self) -> bool {
        self == NonFinite::Allow
    }

    /// Records the choice in a manifest's `options` object: `"allow_nonfinite": true` when
    /// allowed, nothing otherwise (a default run's manifest is what it always was).
    pub fn record(self, options: &mut serde_json::Value) {
        if let (NonFinite::Allow, Some(o)) = (self, options.as_object_mut()) {
            o.insert("allow_nonfinite".into(), true.into());
        }
    }
}

/// Where a value the output cannot hold came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Origin {
    /// The input checkpoint holds it (or a value the output dtype cannot hold).
    Base,
    /// An adapter's own tensor holds it (`file` is then the adapter).
    Adapter,
    /// The merge made it: adding this adapter (at this strength) took the value there.
    Merge {
        /// The adapter.
        adapter: PathBuf,
        /// Its strength.
        strength: f64,
    },
    /// The merge of these adapters made it (a quantized block whose scale overflows).
    Merged {
        /// The adapters contributing to the tensor.
        adapters: Vec<(PathBuf, f64)>,
    },
}

/// One tensor's values that its output cannot hold.
#[derive(Clone, Debug, PartialEq)]
pub struct UnheldValues {
    /// The file it was read from (the base, or the adapter for [`Origin::Adapter`]).
    pub file: PathBuf,
    /// The tensor read (the stored base tensor, or the adapter's key).
    pub tensor: String,
    /// The output tensor, when its name differs from `tensor`.
    pub output: Option<String>,
    /// What the values are written as: an output dtype (`F16`), or a quantized encoding
    /// (`gguf q8_0`); `dtype` is set for the plain dtypes.
    pub into: String,
    /// The plain output dtype, when there is one (its largest value goes in the message).
    pub dtype: Option<DType>,
    /// The values found.
    pub found: Unheld,
    /// Row and column of the first in a merged target's (out, in') view (`None`: a tensor
    /// written untouched, `first` counted in its stored order).
    pub at: Option<(usize, usize)>,
    /// Where they came from.
    pub origin: Origin,
}

impl UnheldValues {
    /// The manifest's record of one allowed finding.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "file": self.file.display().to_string(),
            "tensor": self.tensor,
            "into": self.into,
            "first": self.found.first,
            "value": self.found.value.to_string(),
            "count": self.found.count,
            "origin": self.origin_text(),
        });
        if let Some(o) = &self.output {
            v["output"] = o.clone().into();
        }
        v
    }

    /// Where they came from, in words (the message and the manifest's record).
    pub fn origin_text(&self) -> String {
        match &self.origin {
            Origin::Base => "the base".into(),
            Origin::Adapter => "the adapter".into(),
            Origin::Merge { adapter, strength } => format!(
                "the merge: adapter {} at strength {strength}",
                adapter.display()
            ),
            Origin::Merged { adapters } => format!(
                "the merge of {}",
                (adapters.iter())
                    .map(|(p, s)| format!("{} at strength {s}", p.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Is the first value finite (an overflow of the output: a wider dtype holds it), not
    /// a NaN or an infinity?
    pub fn overflow(&self) -> bool {
        self.found.value.is_finite()
    }
}

impl fmt::Display for UnheldValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Unheld {
            first,
            value,
            count,
        } = self.found;
        write!(f, "{}: {}: ", self.file.display(), self.tensor)?;
        if let Some(o) = &self.output {
            write!(f, "(written as `{o}`) ")?;
        }
        match self.at {
            Some((row, col)) => write!(f, "merged element {first} (row {row}, column {col})")?,
            None => write!(f, "element {first}")?,
        }
        write!(f, " is {value}")?;
        if !value.is_finite() {
            write!(f, ", non-finite")?;
        } else {
            match self.dtype.and_then(largest_finite) {
                Some(max) => write!(
                    f,
                    ", which {} cannot hold (its largest finite value is {max})",
                    self.into
                )?,
                None => write!(f, ", which {} cannot hold", self.into)?,
            }
        }
        let values = crate::human::plural(count, "value", "values");
        match self.origin {
            Origin::Adapter if self.dtype.is_none() => {
                let are = if count == 1 { "is" } else { "are" };
                write!(f, "; {values} of this tensor {are} NaN or infinite; ")?
            }
            _ => write!(
                f,
                "; {values} of this tensor cannot be written as finite {}; ",
                self.into
            )?,
        }
        match &self.origin {
            Origin::Base => write!(f, "it comes from the input, not from an adapter")?,
            Origin::Adapter => write!(f, "it is in the adapter's own tensor")?,
            Origin::Merge { .. } | Origin::Merged { .. } => {
                write!(f, "it comes from {}, not from the base", self.origin_text())?
            }
        }
        write!(f, "; nothing was written")
    }
}

impl std::error::Error for UnheldValues {}
