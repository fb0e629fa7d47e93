//! 3D rotary position embedding of diffusers' `WanRotaryPosEmbed` (spec wan.md §2.1).
//!
//! Owns: the per-axis frequency tables (angles and cos/sin computed in f64, then rounded to
//! f32, as diffusers does off Apple MPS), the per-token table for an (f, h, w) grid, and
//! the interleaved-pair rotation. Does not own: where RoPE is applied (`runner::block`:
//! self-attention q and k only).

/// RoPE base θ.
pub const THETA: f64 = 10000.0;

/// The frequency tables of one model.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Real dimensions per axis (t, h, w); they sum to the head dim.
    pub axis_dims: [usize; 3],
    /// Positions per axis in the table.
    pub max_seq_len: usize,
    /// Per axis: cos of `p·ω_k`, row p (max_seq_len rows) of `dim/2` values, f32.
    cos: [Vec<f32>; 3],
    /// Per axis: sin, same layout.
    sin: [Vec<f32>; 3],
}

/// The head-dim split (t, h, w): h = w = 2·⌊Dh/6⌋, t = Dh − h − w.
pub fn axis_split(head_dim: usize) -> [usize; 3] {
    let hw = 2 * (head_dim / 6);
    [head_dim - 2 * hw, hw, hw]
}

impl Rope {
    /// Tables for head dim `head_dim` (every axis dim must be even, which holds when the
    /// head dim is even) and `max_seq_len` positions per axis.
    pub fn new(head_dim: usize, max_seq_len: usize) -> Rope {
        let axis_dims = axis_split(head_dim);
        let mut cos: [Vec<f32>; 3] = Default::default();
        let mut sin: [Vec<f32>; 3] = Default::default();
        for (a, &dim) in axis_dims.iter().enumerate() {
            let half = dim / 2;
            // ω_k = 1 / θ^(2k/dim) / 1.0, all f64 (get_1d_rotary_pos_embed).
            let omega: Vec<f64> = (0..half)
                .map(|k| 1.0 / THETA.powf((2 * k) as f64 / dim as f64) / 1.0)
                .collect();
            for p in 0..max_seq_len {
                for &w in &omega {
                    let angle = p as f64 * w;
                    cos[a].push(angle.cos() as f32);
                    sin[a].push(angle.sin() as f32);
                }
            }
        }
        Rope {
            axis_dims,
            max_seq_len,
            cos,
            sin,
        }
    }

    /// The (cos, sin) tables of every token of an (f, h, w) grid, each (S, Dh/2) row-major
    /// with token n = (fi·h + hi)·w + wi and pairs ordered t, h, w. Every grid extent must be
    /// at most `max_seq_len` (checked by the caller).
    #[track_caller]
    pub fn token_tables(&self, grid: [usize; 3]) -> (Vec<f32>, Vec<f32>) {
        assert!(
            grid.iter().all(|&g| g <= self.max_seq_len),
            "grid {grid:?} exceeds the RoPE table"
        );
        let pairs: usize = self.axis_dims.iter().map(|d| d / 2).sum();
        let [f, h, w] = grid;
        let mut cos = Vec::with_capacity(f * h * w * pairs);
        let mut sin = Vec::with_capacity(f * h * w * pairs);
        for fi in 0..f {
            for hi in 0..h {
                for wi in 0..w {
                    for (a, pos) in [fi, hi, wi].into_iter().enumerate() {
                        let half = self.axis_dims[a] / 2;
                        cos.extend_from_slice(&self.cos[a][pos * half..(pos + 1) * half]);
                        sin.extend_from_slice(&self.sin[a][pos * half..(pos + 1) * half]);
                    }
                }
            }
        }
        (cos, sin)
    }
}

/// Rotates consecutive pairs of one head vector in place:
/// `x'[2j] = x[2j]·cos_j − x[2j+1]·sin_j`, `x'[2j+1] = x[2j]·sin_j + x[2j+1]·cos_j`.
#[track_caller]
pub fn rotate_pairs(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    assert_eq!(x.len(), 2 * cos.len(), "rotate_pairs: head dim vs table");
    for ((pair, &c), &s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (x1, x2) = (pair[0], pair[1]);
        pair[0] = x1 * c - x2 * s;
        pair[1] = x1 * s + x2 * c;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_matches_spec() {
        assert_eq!(axis_split(128), [44, 42, 42]);
        assert_eq!(axis_split(12), [4, 4, 4]);
        assert_eq!(axis_split(16), [8, 4, 4]);
    }

    #[test]
    fn token_table_orders_pairs_t_h_w_with_row_major_tokens() {
        // Dh = 16: t has 4 pairs with ω = 10000^(−2k/8), h and w 2 pairs each with
        // ω = 10000^(−2k/4) = [1, 0.01].
        let rope = Rope::new(16, 8);
        let (cos, sin) = rope.token_tables([2, 3, 4]);
        let pairs = 8;
        // Token (fi, hi, wi) = (1, 2, 3) is n = (1·3 + 2)·4 + 3 = 23.
        let row = 23 * pairs;
        let want_angles = [
            1.0,
            1.0 / 10000f64.powf(0.25),
            1.0 / 10000f64.powf(0.5),
            1.0 / 10000f64.powf(0.75),
            2.0,
            2.0 * (1.0 / 100.0),
            3.0,
            3.0 * (1.0 / 100.0),
        ];
        for (j, a) in want_angles.iter().enumerate() {
            assert_eq!(cos[row + j], a.cos() as f32, "cos pair {j}");
            assert_eq!(sin[row + j], a.sin() as f32, "sin pair {j}");
        }
    }

    #[test]
    fn rotation_is_interleaved_complex_multiplication() {
        // (1 + 2i)·e^{iπ/2} = −2 + i; (3 + 4i)·e^{0} = 3 + 4i.
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        rotate_pairs(&mut x, &[0.0, 1.0], &[1.0, 0.0]);
        assert_eq!(x, [-2.0, 1.0, 3.0, 4.0]);
    }
}
