//! Pure numbers <-> bytes, no files, no model.
//!
//! Each submodule is one storage encoding with its decoder (storage bytes -> f32, exactly as the
//! reference runtime's dequantize computes it with float32 as the target dtype), its encoder
//! where it exists, and its size facts (`storage_bytes`, `scale_bytes`, stored shapes). Every
//! function takes slices and dimensions, checks every length with checked arithmetic and
//! returns a [`CodecError`] instead of panicking, whatever the input. Which tensor of a file
//! holds which part (markers, scale names, the logical shape) is the caller's business
//! (`quant/`), not this module's.
//!
//! - [`blocked`]: the cuBLAS block-scale swizzle (`to_blocked` / `from_blocked`).
//! - [`nvfp4`]: the E2M1 element code and comfy-kitchen's NVFP4 layout.
//! - [`mxfp8`]: the E4M3 and E8M0 element codes, comfy-kitchen's MXFP8 layout, and
//!   LightX2V's per-channel fp8.
//! - [`int8`]: comfy-kitchen's INT8 (tensorwise, per-row, ConvRot) and LightX2V's per-channel
//!   int8.
//! - [`hadamard`]: the exact regular Hadamard transform ConvRot rotates with.
//!
//! The reference for every fact is comfy-kitchen 0.2.40 (the PyPI wheel's Python, eager
//! backend) and, for LightX2V, ModelTC/LightX2V @f8aee98; each module cites file and function.

pub mod blocked;
pub mod hadamard;
pub mod int8;
pub mod mxfp8;
pub mod nvfp4;

/// Why a codec call refused its input. The caller adds the file and tensor name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodecError {
    /// A buffer of the wrong length.
    #[error("{what}: expected {expected} elements, found {found}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// Length the dimensions call for.
        expected: usize,
        /// Length given.
        found: usize,
    },
    /// A dimension the format needs to be a multiple of something.
    #[error("{what}: {dim} is not a multiple of {multiple}")]
    NotDivisible {
        /// Which dimension.
        what: &'static str,
        /// Its value.
        dim: usize,
        /// What it must divide by.
        multiple: usize,
    },
    /// Dimensions whose sizes overflow `usize`.
    #[error("{what}: size overflows")]
    Overflow {
        /// Which size.
        what: &'static str,
    },
    /// A logical shape larger than the stored (padded) one.
    #[error("logical shape {logical:?} does not fit in the stored shape {stored:?}")]
    Shape {
        /// Logical `[rows, cols]`.
        logical: [usize; 2],
        /// Stored `[rows, cols]` (in elements).
        stored: [usize; 2],
    },
    /// A Hadamard group size that is not a power of 4 (at least 4).
    #[error("Hadamard group size {0}: expected a power of 4 (4, 16, 64, 256, ...)")]
    GroupSize(usize),
    /// An encoder input that is NaN or infinite.
    #[error("value {value} at element {index} is not finite")]
    NonFinite {
        /// Element index (row-major).
        index: usize,
        /// The value.
        value: f32,
    },
    /// An input the reference quantizer turns into NaN or garbage codes; refused here.
    #[error("{0}")]
    Unrepresentable(String),
}

/// `a * b`, or [`CodecError::Overflow`] naming `what`.
pub(crate) fn mul(a: usize, b: usize, what: &'static str) -> Result<usize, CodecError> {
    a.checked_mul(b).ok_or(CodecError::Overflow { what })
}

/// `x` rounded up to a multiple of `m` (`m > 0`), or [`CodecError::Overflow`].
pub(crate) fn round_up(x: usize, m: usize, what: &'static str) -> Result<usize, CodecError> {
    x.checked_next_multiple_of(m)
        .ok_or(CodecError::Overflow { what })
}

/// Fails with [`CodecError::Length`] unless `found == expected`.
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), CodecError> {
    if expected == found {
        Ok(())
    } else {
        Err(CodecError::Length {
            what,
            expected,
            found,
        })
    }
}

/// Fails with [`CodecError::NotDivisible`] unless `m` divides `dim`.
pub(crate) fn check_multiple(what: &'static str, dim: usize, m: usize) -> Result<(), CodecError> {
    if dim.is_multiple_of(m) {
        Ok(())
    } else {
        Err(CodecError::NotDivisible {
            what,
            dim,
            multiple: m,
        })
    }
}

/// Fails with [`CodecError::NonFinite`] at the first NaN or infinity.
pub(crate) fn check_finite(w: &[f32]) -> Result<(), CodecError> {
    match w.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(CodecError::NonFinite {
            index,
            value: w[index],
        }),
    }
}
