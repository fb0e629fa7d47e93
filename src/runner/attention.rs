//! Scaled dot-product attention without mask or dropout, per head and per block of
//! queries (spec wan.md §2.4: `softmax(q·kᵀ/√Dh)·v`).
//!
//! Owns: multi-head SDPA over (B, S, H·Dh) row-major activations, heads split head-major
//! (head h is columns [h·Dh, (h+1)·Dh)). Only a (query block × keys) score tile is held
//! per task. Tasks are (batch, head, query block) on a fixed grid and each runs its two
//! matmuls with `Par::Seq`, so results do not depend on the thread count. Does not own:
//! projections, norms or RoPE (`runner::block`).

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use rayon::prelude::*;

/// Queries per attention task.
pub const QUERY_BLOCK: usize = 64;

/// Shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Batch size B.
    pub batch: usize,
    /// Query tokens per item.
    pub queries: usize,
    /// Key/value tokens per item.
    pub keys: usize,
    /// Heads H.
    pub heads: usize,
    /// Head dim Dh.
    pub head_dim: usize,
}

/// `out[b, s, h·Dh..] = softmax(q_h·k_hᵀ / √Dh)·v_h` for q (B, Sq, D), k and v (B, Sk, D).
#[track_caller]
pub fn attention(q: &[f32], k: &[f32], v: &[f32], shape: AttentionShape) -> Vec<f32> {
    let AttentionShape {
        batch,
        queries,
        keys,
        heads,
        head_dim,
    } = shape;
    let d = heads * head_dim;
    assert_eq!(q.len(), batch * queries * d, "attention: q shape");
    assert_eq!(k.len(), batch * keys * d, "attention: k shape");
    assert_eq!(v.len(), batch * keys * d, "attention: v shape");
    let mut out = vec![0f32; batch * queries * d];
    if keys == 0 || queries == 0 || d == 0 {
        return out;
    }
    let blocks = queries.div_ceil(QUERY_BLOCK);
    let tasks: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|b| (0..heads).flat_map(move |h| (0..blocks).map(move |qb| (b, h, qb))))
        .collect();
    let tiles: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(b, h, qb)| {
            let q0 = qb * QUERY_BLOCK;
            let rows = QUERY_BLOCK.min(queries - q0);
            head_block(q, k, v, shape, b, h, q0, rows)
        })
        .collect();
    for (&(b, h, qb), tile) in tasks.iter().zip(&tiles) {
        let q0 = qb * QUERY_BLOCK;
        for (r, src) in tile.chunks(head_dim).enumerate() {
            let at = (b * queries + q0 + r) * d + h * head_dim;
            out[at..at + head_dim].copy_from_slice(src);
        }
    }
    out
}

/// One (batch, head, query block) tile: (rows, Dh) row-major.
#[allow(clippy::too_many_arguments)]
fn head_block(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttentionShape,
    b: usize,
    h: usize,
    q0: usize,
    rows: usize,
) -> Vec<f32> {
    let AttentionShape {
        queries,
        keys,
        heads,
        head_dim,
        ..
    } = shape;
    let d = heads * head_dim;
    let span = |start: usize, n: usize| start..start + (n - 1) * d + head_dim;
    let q_start = (b * queries + q0) * d + h * head_dim;
    let kv_start = b * keys * d + h * head_dim;
    let q_h = MatRef::from_row_major_slice_with_stride(&q[span(q_start, rows)], rows, head_dim, d);
    let k_h = MatRef::from_row_major_slice_with_stride(&k[span(kv_start, keys)], keys, head_dim, d);
    let v_h = MatRef::from_row_major_slice_with_stride(&v[span(kv_start, keys)], keys, head_dim, d);

    // Scores, then a numerically safe softmax per row (normalised after P·V).
    let scale = (1.0 / (head_dim as f64).sqrt()) as f32;
    let mut p = vec![0f32; rows * keys];
    matmul(
        MatMut::from_row_major_slice_mut(&mut p, rows, keys),
        Accum::Replace,
        q_h,
        k_h.transpose(),
        1.0f32,
        Par::Seq,
    );
    let mut sums = vec![0f32; rows];
    for (row, sum) in p.chunks_mut(keys).zip(sums.iter_mut()) {
        let mut max = f32::NEG_INFINITY;
        for s in row.iter_mut() {
            *s *= scale;
            max = max.max(*s);
        }
        for s in row.iter_mut() {
            *s = (*s - max).exp();
        }
        *sum = super::ops::sum_f32(row);
    }
    let mut tile = vec![0f32; rows * head_dim];
    matmul(
        MatMut::from_row_major_slice_mut(&mut tile, rows, head_dim),
        Accum::Replace,
        MatRef::from_row_major_slice(&p, rows, keys),
        v_h,
        1.0f32,
        Par::Seq,
    );
    for (row, sum) in tile.chunks_mut(head_dim).zip(&sums) {
        for x in row.iter_mut() {
            *x /= sum;
        }
    }
    tile
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_scores_average_the_values() {
        // q = 0 makes every score equal, so each head returns the mean of its values.
        let shape = AttentionShape {
            batch: 1,
            queries: QUERY_BLOCK + 1,
            keys: 4,
            heads: 2,
            head_dim: 2,
        };
        let q = vec![0f32; shape.queries * 4];
        let k: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let v: Vec<f32> = (0..16).map(|i| (i * i) as f32).collect();
        let out = attention(&q, &k, &v, shape);
        for row in out.chunks(4) {
            for c in 0..4 {
                let mean = (0..4).map(|r| v[r * 4 + c]).sum::<f32>() / 4.0;
                assert_eq!(row[c], mean);
            }
        }
    }

    #[test]
    fn one_dominant_key_selects_its_value() {
        // Head dim 1: scores are q·k; q = 100 and keys [0, 1] give weights ≈ [e⁻¹⁰⁰, 1].
        let shape = AttentionShape {
            batch: 2,
            queries: 1,
            keys: 2,
            heads: 1,
            head_dim: 1,
        };
        let out = attention(
            &[100.0, 100.0],
            &[0.0, 1.0, 1.0, 0.0],
            &[5.0, 7.0, 11.0, 13.0],
            shape,
        );
        assert_eq!(out, vec![7.0, 11.0]);
    }
}
