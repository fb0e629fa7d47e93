//! Sign canonicalisation of singular vectors, exactly as SA3 does it (spec `sa3_lora.md` §1.5,
//! `_canonicalize_svd_signs`).
//!
//! Owns: the convention and its two entry points, one on row-major host slices (for the GPU
//! backend's host copies) and one on faer views of any stride (used by [`super::svd`]).
//! Does not own: computing the SVD.
//!
//! The convention, for each column `j` of `U`:
//! 1. `idx_j` = the row of the largest `|U[i, j]|`, the FIRST such row on ties (torch and
//!    numpy `argmax` both return the first maximum);
//! 2. `sign_j` = the sign of `U[idx_j, j]`, with 0 (either sign of zero) counted as `+1`;
//! 3. column `j` of `U` and row `j` of `Vᵀ` are multiplied by `sign_j`.
//!
//! Afterwards the largest-magnitude entry of every column of `U` is positive (or zero).
//! Multiplying by `-1` is an exact negation, so the result is bit-identical to the
//! reference's `U * signs` in any precision.

#![allow(non_snake_case)]

use faer::MatMut;
use faer::prelude::{Reborrow, ReborrowMut};

/// The element types the canonicalisation is defined for (`f32`, `f64`).
pub trait SignFloat:
    Copy + PartialOrd + core::ops::Neg<Output = Self> + private::SignFloatSealed
{
    /// Absolute value.
    fn magnitude(self) -> Self;
    /// Zero.
    fn zero() -> Self;
}

/// Seals [`SignFloat`] to `f32` and `f64` (named apart from `release::staging::Sealed`, an
/// unrelated type).
mod private {
    pub trait SignFloatSealed {}
    impl SignFloatSealed for f32 {}
    impl SignFloatSealed for f64 {}
}

impl SignFloat for f32 {
    fn magnitude(self) -> f32 {
        self.abs()
    }
    fn zero() -> f32 {
        0.0
    }
}

impl SignFloat for f64 {
    fn magnitude(self) -> f64 {
        self.abs()
    }
    fn zero() -> f64 {
        0.0
    }
}

/// Canonicalises the signs of a thin SVD held in row-major host arrays: `U` is (out, k),
/// `Vt` (= Vᵀ, the LAPACK/torch `Vh`) is (k, inp). See the module doc for the convention.
///
/// # Panics
/// If the slice lengths are not `out·k` and `k·inp` (a programmer error).
#[track_caller]
pub fn canonicalize_signs<T: SignFloat>(
    U: &mut [T],
    out: usize,
    k: usize,
    Vt: &mut [T],
    inp: usize,
) {
    assert_eq!(U.len(), out * k, "U must be (out={out}, k={k}) row-major");
    assert_eq!(Vt.len(), k * inp, "Vt must be (k={k}, inp={inp}) row-major");
    let U = MatMut::from_row_major_slice_mut(U, out, k);
    let Vt = MatMut::from_row_major_slice_mut(Vt, k, inp);
    canonicalize_signs_mat(U, Vt);
}

/// Canonicalises the signs of a thin SVD given as faer views of any layout: `U` is (m, k),
/// `Vt` is (k, n). Pass `V.transpose_mut()` when the right vectors are stored as columns.
///
/// # Panics
/// If `U.ncols() != Vt.nrows()` (a programmer error).
#[track_caller]
pub fn canonicalize_signs_mat<T: SignFloat>(mut U: MatMut<'_, T>, mut Vt: MatMut<'_, T>) {
    assert_eq!(
        U.ncols(),
        Vt.nrows(),
        "U has {} columns but Vt has {} rows",
        U.ncols(),
        Vt.nrows()
    );
    for j in 0..U.ncols() {
        let Some(idx) = first_argmax_abs(U.rb().col(j).iter().copied()) else {
            continue;
        };
        // sign(x) with 0 -> +1: only a strictly negative pivot flips (-0.0 < 0 is false).
        if U[(idx, j)] < T::zero() {
            for x in U.rb_mut().col_mut(j).iter_mut() {
                *x = -*x;
            }
            for x in Vt.rb_mut().row_mut(j).iter_mut() {
                *x = -*x;
            }
        }
    }
}

/// Index of the first entry of largest magnitude, or `None` for an empty column.
fn first_argmax_abs<T: SignFloat>(values: impl Iterator<Item = T>) -> Option<usize> {
    let mut best: Option<(usize, T)> = None;
    for (i, x) in values.enumerate() {
        let a = x.magnitude();
        // Strictly greater: ties keep the earlier index.
        if best.is_none_or(|(_, b)| a > b) {
            best = Some((i, a));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_maximum_wins_on_ties() {
        // Column [0.5, -0.5]: |.| tie, first entry is positive -> no flip.
        let mut U = vec![0.5f64, -0.5];
        let mut Vt = vec![1.0f64, 2.0];
        canonicalize_signs(&mut U, 2, 1, &mut Vt, 2);
        assert_eq!(U, [0.5, -0.5]);
        assert_eq!(Vt, [1.0, 2.0]);
        // Column [-0.5, 0.5]: tie, first entry negative -> flip both.
        let mut U = vec![-0.5f64, 0.5];
        let mut Vt = vec![1.0f64, -2.0];
        canonicalize_signs(&mut U, 2, 1, &mut Vt, 2);
        assert_eq!(U, [0.5, -0.5]);
        assert_eq!(Vt, [-1.0, 2.0]);
    }

    #[test]
    fn zero_pivot_counts_as_positive() {
        let mut U = vec![-0.0f32, 0.0, -0.0];
        let mut Vt = vec![-3.0f32];
        canonicalize_signs(&mut U, 3, 1, &mut Vt, 1);
        assert_eq!(Vt, [-3.0]);
        assert!(U[0].is_sign_negative(), "untouched column keeps its bits");
    }

    #[test]
    fn each_column_pairs_with_its_vt_row() {
        // U (3,2) row-major: col0 = [0.1, -0.9, 0.2] -> flip; col1 = [0.7, 0.1, -0.3] -> keep.
        let mut U = vec![0.1f64, 0.7, -0.9, 0.1, 0.2, -0.3];
        let mut Vt = vec![1.0f64, 2.0, 3.0, 4.0];
        canonicalize_signs(&mut U, 3, 2, &mut Vt, 2);
        assert_eq!(U, [-0.1, 0.7, 0.9, 0.1, -0.2, -0.3]);
        assert_eq!(Vt, [-1.0, -2.0, 3.0, 4.0]);
    }
}
