//! The cuBLAS block-scale layout ("SWIZZLE_32_4_4") that comfy-kitchen stores NVFP4 and MXFP8
//! block scales in, forward and inverse.
//!
//! Owns: the index map between a logical `[rows, cols]` scale matrix and its swizzled storage,
//! the padded storage shape, and the two permutations. Does not own: what a scale byte means
//! (`nvfp4`, `mxfp8`).
//!
//! Reference: comfy-kitchen 0.2.40 `float_utils.py`, `to_blocked` and `from_blocked`:
//! pad to `(128·⌈rows/128⌉, 4·⌈cols/4⌉)` with zeros, then
//! `view(nrb,128,ncb,4).permute(0,2,1,3).reshape(-1,4,32,4).transpose(1,2).reshape(-1,32,16)`,
//! stored (with `flatten=False`, as both quantizers call it) as the padded 2-D shape.
//! Following the axes: logical element `(r, c)` with `r = 128·rb + 32·a + b`, `c = 4·cb + j`
//! lands at flat index `(rb·ncb + cb)·512 + b·16 + a·4 + j` (the cuBLAS "block scaling
//! factors layout" formula). `from_blocked` accepts any buffer holding exactly
//! `padded_rows·padded_cols` elements (its first step is a `reshape(-1, 32, 16)`) and drops the
//! padding (`unblocked[:num_rows, :num_cols]`).

use super::{CodecError, check_len, mul, round_up};

/// The stored shape of a logical `[rows, cols]` scale matrix: `(128·⌈rows/128⌉, 4·⌈cols/4⌉)`.
pub fn blocked_shape(rows: usize, cols: usize) -> Result<[usize; 2], CodecError> {
    Ok([
        round_up(rows, 128, "block-scale rows")?,
        round_up(cols, 4, "block-scale columns")?,
    ])
}

/// The number of stored scale elements (bytes, for the 1-byte scale types) of a logical
/// `[rows, cols]` scale matrix.
pub fn blocked_len(rows: usize, cols: usize) -> Result<usize, CodecError> {
    let [r, c] = blocked_shape(rows, cols)?;
    mul(r, c, "block-scale size")
}

/// The flat index in the swizzled storage of logical element `(r, c)`, for a matrix whose
/// padded column count is `padded_cols` (a multiple of 4).
#[inline]
pub fn blocked_index(r: usize, c: usize, padded_cols: usize) -> usize {
    let ncb = padded_cols / 4;
    ((r / 128) * ncb + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4
}

/// `to_blocked(m, flatten=False)` of a row-major `[rows, cols]` byte matrix: the swizzled bytes,
/// padding zero-filled, of length [`blocked_len`].
pub fn to_blocked(m: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>, CodecError> {
    check_len(
        "scale matrix",
        mul(rows, cols, "scale matrix size")?,
        m.len(),
    )?;
    let [_, pc] = blocked_shape(rows, cols)?;
    let mut out = vec![0u8; blocked_len(rows, cols)?];
    for r in 0..rows {
        for c in 0..cols {
            out[blocked_index(r, c, pc)] = m[r * cols + c];
        }
    }
    Ok(out)
}

/// `from_blocked(b, rows, cols)`: the row-major `[rows, cols]` logical matrix of swizzled bytes
/// `b`, which must hold exactly [`blocked_len`]`(rows, cols)` bytes.
pub fn from_blocked(b: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>, CodecError> {
    check_len("swizzled block scales", blocked_len(rows, cols)?, b.len())?;
    let [_, pc] = blocked_shape(rows, cols)?;
    let mut out = Vec::with_capacity(mul(rows, cols, "scale matrix size")?);
    for r in 0..rows {
        for c in 0..cols {
            out.push(b[blocked_index(r, c, pc)]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The torch formula followed literally on index tuples: each output position of
    /// `view(nrb,128,ncb,4).permute(0,2,1,3).reshape(-1,4,32,4).transpose(1,2).reshape(-1,32,16)`
    /// reads the padded input element at the permuted coordinates.
    fn literal(padded: &[u8], pr: usize, pc: usize) -> Vec<u8> {
        let (nrb, ncb) = (pr / 128, pc / 4);
        let mut out = Vec::with_capacity(pr * pc);
        // Output shape (nrb*ncb, 32, 16); position (blk, b, k) came from the transposed
        // (blk, a, b, j) with k = a*4 + j, i.e. permuted (rb, cb, i = a*32 + b, j), i.e. the
        // viewed input (rb, i, cb, j) = padded[rb*128 + i][cb*4 + j].
        for blk in 0..nrb * ncb {
            let (rb, cb) = (blk / ncb, blk % ncb);
            for b in 0..32 {
                for k in 0..16 {
                    let (a, j) = (k / 4, k % 4);
                    out.push(padded[(rb * 128 + a * 32 + b) * pc + cb * 4 + j]);
                }
            }
        }
        out
    }

    #[test]
    fn hand_worked_small_example() {
        // 2 x 3 logical -> padded 128 x 4, one 512-element block.
        let m = [1u8, 2, 3, 4, 5, 6];
        let b = to_blocked(&m, 2, 3).unwrap();
        assert_eq!(b.len(), 512);
        // Row 0: b=0, a=0 -> indices 0..4; row 1: b=1 -> 16..20. Column 3 is padding.
        assert_eq!(&b[0..4], &[1, 2, 3, 0]);
        assert_eq!(&b[16..20], &[4, 5, 6, 0]);
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 6);
        // Row 32 would be b=0, a=1 -> index 4; row 127 -> b=31, a=3 -> 31*16+12.
        assert_eq!(blocked_index(32, 0, 4), 4);
        assert_eq!(blocked_index(127, 3, 4), 31 * 16 + 15);
        // Second row block, second column block of a 256 x 8 matrix: block 1*2+1 = 3.
        assert_eq!(blocked_index(128, 4, 8), 3 * 512);
        assert_eq!(from_blocked(&b, 2, 3).unwrap(), m);
    }

    #[test]
    fn matches_the_literal_formula_and_round_trips() {
        for &(rows, cols) in &[(1, 1), (5, 3), (128, 4), (130, 9), (256, 8), (300, 17)] {
            let m: Vec<u8> = (0..rows * cols).map(|i| (i * 7 + 1) as u8).collect();
            let [pr, pc] = blocked_shape(rows, cols).unwrap();
            let mut padded = vec![0u8; pr * pc];
            for r in 0..rows {
                padded[r * pc..r * pc + cols].copy_from_slice(&m[r * cols..(r + 1) * cols]);
            }
            let b = to_blocked(&m, rows, cols).unwrap();
            assert_eq!(b, literal(&padded, pr, pc), "{rows}x{cols}");
            assert_eq!(from_blocked(&b, rows, cols).unwrap(), m, "{rows}x{cols}");
        }
    }

    #[test]
    fn wrong_lengths_and_overflow_are_errors() {
        assert!(matches!(
            to_blocked(&[0; 5], 2, 3),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            from_blocked(&[0; 511], 2, 3),
            Err(CodecError::Length { .. })
        ));
        assert!(matches!(
            blocked_len(usize::MAX, 1),
            Err(CodecError::Overflow { .. })
        ));
        assert!(matches!(
            blocked_len(1 << 40, 1 << 40),
            Err(CodecError::Overflow { .. })
        ));
        assert_eq!(from_blocked(&[], 0, 0).unwrap(), Vec::<u8>::new());
    }
}
