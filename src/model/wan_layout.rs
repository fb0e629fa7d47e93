//! The four layouts a WAN transformer checkpoint can be stored in.
//!
//! Owns: `Layout` (`diffusers`, `wan`, `nnx`, `nnx-scanned`), its command-line and
//! config.json spelling, and `UnknownLayout`. Does not own: the names each layout gives a
//! parameter (`model::wan_names`) or converting a checkpoint between layouts (`layout`).

use std::fmt;
use std::str::FromStr;

/// A naming and storage convention for the WAN transformer's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// diffusers `WanTransformer3DModel` names, PyTorch layouts (the canonical form).
    Diffusers,
    /// Original Wan-AI / ComfyUI names (spec wan.md §1.4), PyTorch layouts. On input the
    /// `model.diffusion_model.` and `diffusion_model.` prefixes are accepted.
    Wan,
    /// MaxDiffusion NNX paths with `scan_layers: False`: `blocks.N.attn1.query.kernel` (in,
    /// out), Conv3d kernel DHWIO, norm `scale`s.
    Nnx,
    /// MaxDiffusion NNX paths with `scan_layers: True`: one tensor per block parameter with
    /// a leading axis of size L (`blocks.attn1.query.kernel` (L, in, out)).
    NnxScanned,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 4] = [
        Layout::Diffusers,
        Layout::Wan,
        Layout::Nnx,
        Layout::NnxScanned,
    ];

    /// The command-line and config.json spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Diffusers => "diffusers",
            Layout::Wan => "wan",
            Layout::Nnx => "nnx",
            Layout::NnxScanned => "nnx-scanned",
        }
    }

    /// True for the two MaxDiffusion layouts.
    pub fn is_nnx(self) -> bool {
        matches!(self, Layout::Nnx | Layout::NnxScanned)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layout name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown layout `{0}` (expected diffusers, wan, nnx or nnx-scanned)")]
pub struct UnknownLayout(pub String);

impl FromStr for Layout {
    type Err = UnknownLayout;

    fn from_str(s: &str) -> Result<Layout, UnknownLayout> {
        Layout::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| UnknownLayout(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for l in Layout::ALL {
            assert_eq!(l.as_str().parse::<Layout>().unwrap(), l);
        }
        assert!("nnx_scanned".parse::<Layout>().is_err());
    }
}
