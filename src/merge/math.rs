//! Effective-weight formulas of every adapter kind, on row bands of the 2-D (out, in') view
//! of the target (spec sa3_lora.md §1.2–§1.4, conventions.md §1, §2.4–§2.5).
//!
//! Owns: `Factors` (the low-rank update, `B·A` or `U·M·Vᵀ`), `Form` (how `V = W0 + σ·Δ`
//! becomes the adapted weight: additive, row-normalised (SA3 dora-rows, PEFT DoRA),
//! column-normalised (dora-cols) or both (BoRA)), `Update` (a low-rank update with its form,
//! or a full-tensor diff), `Step` (what adding one update asks of the kernels: which
//! coefficient the additive shortcut `(w·σ)·Δ` or a diff gets, which row and column factors
//! and which ε a normalised form gets), `column_scales` (the one pass over all rows that
//! column-coupled forms need) and `add_contribution` (adds `w·(f(W0) − W0)` for a band of
//! rows into a caller-owned f32 accumulator). Does not own: which tensors these are, loading
//! them, or where results go (`merge::target`); the SVD (`linalg`).
//!
//! One formula per operation: the whole-tensor route (`merge::device`) takes the same
//! [`Update::step`] as the bands here, and the element steps (row factors, the column sums
//! and factors, the DoRA/BoRA combination, diff accumulation) are `backend::arith`'s, the
//! ones the whole-tensor route's backends compute with (`backend::CpuBackend`, mirrored by
//! the CUDA kernels).
//!
//! Arithmetic (documented because output bits depend on it):
//! - `V = W0 + σ·Δ` is f32, the low-rank product through `linalg::lowrank` (faer, f32
//!   accumulation, `Par::Seq`), as the references compute it in f32.
//! - Row and column norms accumulate the squares of the f32 `V` (or `H`) in f64 in index
//!   order and keep the root in f64; `ε = 1e-12` is ADDED to the norm (SA3), PEFT DoRA uses
//!   no ε. Magnitudes are used as stored: no abs, no clamp (they may be negative).
//! - The per-element combination `w·(c·V − W0)` is evaluated in f64 and rounded once into
//!   the f32 accumulator; a linear update is rounded once as `(w·σ)·Δ` and then added.
//!   Every contribution is rounded on its own before it is added, so two contributions give
//!   the same accumulator in either order.

#![allow(non_snake_case)]

use faer::{MatMut, MatRef, Par};

use crate::backend::arith;
use crate::linalg::{add_scaled_product_into, add_xs_update_into, xs_update_scratch_len};

/// SA3's ε, added to every DoRA/BoRA norm (spec sa3_lora.md §1.2).
pub const SA3_EPS: f64 = 1e-12;

/// The low-rank update Δ of one contribution, on the (out, in') view.
#[derive(Clone, Copy, Debug)]
pub enum Factors<'a> {
    /// Δ = B·A with B (out, r) and A (r, in'), row-major.
    BA {
        /// (out, r).
        B: &'a [f32],
        /// (r, in').
        A: &'a [f32],
        /// r.
        rank: usize,
    },
    /// Δ = U·M·Vᵀ (the -xs kinds) with U (out, r), M (r, r), V (in', r), row-major; U and V
    /// are the base weight's canonical singular vectors.
    Xs {
        /// (out, r).
        U: &'a [f32],
        /// (r, r).
        M: &'a [f32],
        /// (in', r).
        V: &'a [f32],
        /// r.
        rank: usize,
    },
}

impl Factors<'_> {
    fn rank(&self) -> usize {
        match *self {
            Factors::BA { rank, .. } | Factors::Xs { rank, .. } => rank,
        }
    }

    /// `dst ← dst + coef·Δ[r0 .. r0 + rows, :]`, with `dst` the (rows, inp) band.
    fn add_rows(
        &self,
        dst: &mut [f32],
        r0: usize,
        rows: usize,
        inp: usize,
        coef: f32,
        scratch: &mut Vec<f32>,
    ) {
        let r = self.rank();
        let dst = MatMut::from_row_major_slice_mut(dst, rows, inp);
        match *self {
            Factors::BA { B, A, .. } => {
                let B = MatRef::from_row_major_slice(&B[r0 * r..(r0 + rows) * r], rows, r);
                let A = MatRef::from_row_major_slice(A, r, inp);
                add_scaled_product_into(dst, coef, B, A, Par::Seq);
            }
            Factors::Xs { U, M, V, .. } => {
                let U = MatRef::from_row_major_slice(&U[r0 * r..(r0 + rows) * r], rows, r);
                let M = MatRef::from_row_major_slice(M, r, r);
                let V = MatRef::from_row_major_slice(V, inp, r);
                scratch.resize(xs_update_scratch_len(rows, r), 0.0);
                add_xs_update_into(dst, coef, U, M, V, scratch, Par::Seq);
            }
        }
    }
}

/// How `V = W0 + σ·Δ` becomes the adapted weight `f(W0)`.
#[derive(Clone, Copy, Debug)]
pub enum Form<'a> {
    /// `f = V` (lora, lora-xs).
    Additive,
    /// `f = m_i/(‖V_i‖_row + eps)·V` (SA3 dora-rows(-xs): eps = 1e-12; PEFT DoRA: eps = 0).
    Rows {
        /// Magnitude (out).
        m: &'a [f32],
        /// Added to the norm.
        eps: f64,
    },
    /// `f = m_j/(‖V‖_col_j + ε)·V` (dora-cols(-xs)).
    Cols {
        /// Magnitude (in').
        m: &'a [f32],
    },
    /// `H = m_r_i/(‖V_i‖_row + ε)·V`, `f = m_c_j/(‖H‖_col_j + ε)·H` (bora(-xs)).
    Bora {
        /// Row magnitude (out).
        m_r: &'a [f32],
        /// Column magnitude (in').
        m_c: &'a [f32],
    },
}

/// One adapter's update of a target.
#[derive(Clone, Copy, Debug)]
pub enum Update<'a> {
    /// `V = W0 + σ·Δ`, then `form`.
    LowRank {
        /// Δ.
        factors: Factors<'a>,
        /// σ (already multiplied by the strength when the strength sits inside the norm).
        sigma: f64,
        /// How V becomes f(W0).
        form: Form<'a>,
    },
    /// `f(W0) = W0 + diff`, `diff` of the target's size (diff, diff_b, diff_m, σ·lora_B.bias).
    Full {
        /// The delta, row-major in the target's (out, in') view.
        diff: &'a [f32],
        /// Its factor (σ for a LoRA bias, 1 for diffs).
        scale: f64,
    },
}

/// A DoRA/BoRA magnitude and the ε added to the norm it is divided by.
#[derive(Clone, Copy, Debug)]
pub struct Magnitude<'a> {
    /// One value per row (a row factor) or per column (a column factor).
    pub m: &'a [f32],
    /// Added to the norm.
    pub eps: f64,
}

/// `V = W0 + σ·Δ` and the factors that normalise it: `f_ij = β_j·(α_i·V_ij)`, a factor that
/// is `None` being 1.
#[derive(Clone, Copy, Debug)]
pub struct Normalisation<'a> {
    /// Δ.
    pub factors: Factors<'a>,
    /// σ, as the GEMM `V ← W0 + σ·Δ` takes it (rounded once to f32).
    pub sigma: f32,
    /// `α_i = m_i/(‖V_i‖_row + ε)` (dora-rows, BoRA).
    pub row: Option<Magnitude<'a>>,
    /// `β_j = m_j/(‖(α⊙V)_j‖_col + ε)` (dora-cols, BoRA): a pass over every row of the target.
    pub col: Option<Magnitude<'a>>,
}

impl Normalisation<'_> {
    /// `α` of `row` (row number `i` of the target), or 1 without a row factor.
    pub fn row_factor(&self, row: &[f32], i: usize) -> f64 {
        self.row
            .map_or(1.0, |r| arith::row_scale(row, r.m[i], r.eps))
    }
}

/// What adding `w·(f(W0) − W0)` for one update asks of the kernels: the one place that says
/// which coefficients, factors and ε each form gets, read by the band route
/// ([`column_scales`], [`add_contribution`]) and by the whole-tensor program
/// (`merge::device`, on every `Backend`).
#[derive(Clone, Copy, Debug)]
pub enum Step<'a> {
    /// `D ← D + f32(coef·X)` element by element (`arith::scaled_contribution`), with
    /// `coef = w·scale`: a full-tensor diff.
    Scaled {
        /// X, row-major in the target's (out, in') view.
        diff: &'a [f32],
        /// `w·scale`.
        coef: f64,
    },
    /// `D ← D + coef·Δ`, one f32 GEMM with `coef = f32(w·σ)`: the additive forms, whose
    /// `w·(V − W0)` is `w·σ·Δ`, so neither `V` nor `W0` is formed.
    Linear {
        /// Δ.
        factors: Factors<'a>,
        /// `w·σ`, rounded once to f32.
        coef: f32,
    },
    /// `V = W0 + σ·Δ`, then `D_ij ← D_ij + f32(w·(β_j·(α_i·V_ij) − W0_ij))`
    /// (`arith::normalised_contribution`).
    Normalised {
        /// The application weight.
        w: f64,
        /// V and its factors.
        n: Normalisation<'a>,
    },
}

impl<'a> Update<'a> {
    /// The step that adds `w·(f(W0) − W0)` for this update.
    pub fn step(&self, w: f64) -> Step<'a> {
        match *self {
            Update::Full { diff, scale } => Step::Scaled {
                diff,
                coef: w * scale,
            },
            Update::LowRank {
                factors,
                sigma,
                form: Form::Additive,
            } => Step::Linear {
                factors,
                coef: (w * sigma) as f32,
            },
            Update::LowRank { .. } => Step::Normalised {
                w,
                n: self.normalisation().expect("a normalised form"),
            },
        }
    }

    /// `V` and its factors, for the normalised forms (`None` for a diff or an additive form).
    pub fn normalisation(&self) -> Option<Normalisation<'a>> {
        let Update::LowRank {
            factors,
            sigma,
            form,
        } = *self
        else {
            return None;
        };
        let sa3 = |m| Some(Magnitude { m, eps: SA3_EPS });
        let (row, col) = match form {
            Form::Additive => return None,
            Form::Rows { m, eps } => (Some(Magnitude { m, eps }), None),
            Form::Cols { m } => (None, sa3(m)),
            Form::Bora { m_r, m_c } => (sa3(m_r), sa3(m_c)),
        };
        Some(Normalisation {
            factors,
            sigma: sigma as f32,
            row,
            col,
        })
    }

    /// True when `f` couples all rows through column norms, so [`column_scales`] must run
    /// over the whole target before any band is produced.
    pub fn needs_column_pass(&self) -> bool {
        self.normalisation().is_some_and(|n| n.col.is_some())
    }
}

/// Per-column factors of a column-coupled update, computed over every row of the target:
/// `β_j = m_j/(‖V‖_col_j + ε)` (dora-cols) or `β_j = m_c_j/(‖H‖_col_j + ε)` (BoRA). `read`
/// fills a band of W0 rows (f32, row-major). Returns `None` for updates without a column
/// pass. Bands are visited in row order, so the column sums run over i ascending
/// (`arith::ColumnSums`, as the CPU backend's `col_scales`).
pub fn column_scales<E>(
    update: &Update<'_>,
    out: usize,
    inp: usize,
    band_rows: usize,
    mut read: impl FnMut(usize, usize, &mut [f32]) -> Result<(), E>,
) -> Result<Option<Vec<f64>>, E> {
    let Some(n) = update.normalisation() else {
        return Ok(None);
    };
    let Some(col) = n.col else {
        return Ok(None);
    };
    let mut sums = arith::ColumnSums::new(inp);
    let mut V = Vec::new();
    let mut scratch = Vec::new();
    let mut r0 = 0;
    while r0 < out {
        let rows = band_rows.min(out - r0);
        V.resize(rows * inp, 0.0);
        read(r0, rows, &mut V)?;
        n.factors
            .add_rows(&mut V, r0, rows, inp, n.sigma, &mut scratch);
        // BoRA sums the squares of H = α_i·V_i, dora-cols those of V.
        sums.add_rows(&V, |i, Vi| n.row_factor(Vi, r0 + i));
        r0 += rows;
    }
    Ok(Some(sums.scales(col.m, col.eps)))
}

/// Scratch buffers one worker reuses across bands and contributions.
#[derive(Debug, Default)]
pub struct Scratch {
    V: Vec<f32>,
    xs: Vec<f32>,
    /// `inp` ones: β of a form without column factors.
    ones: Vec<f64>,
}

/// Adds `w·(f(W0) − W0)` for rows `r0 .. r0 + rows` into `D`, the (rows, inp) band of the
/// merged weight (`W0` plus the contributions added so far). `W0` is the same band of the
/// base weight (only read by the normalised forms; may be empty for the others);
/// `col_scale` is what [`column_scales`] returned for this update.
///
/// # Panics
/// If a buffer length does not match the band, or a column-coupled update comes without
/// its column scales (programmer errors: shapes are checked when the merge is planned).
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn add_contribution(
    update: &Update<'_>,
    w: f64,
    col_scale: Option<&[f64]>,
    W0: &[f32],
    r0: usize,
    rows: usize,
    inp: usize,
    D: &mut [f32],
    scratch: &mut Scratch,
) {
    assert_eq!(D.len(), rows * inp, "D band must be (rows, inp)");
    match update.step(w) {
        Step::Scaled { diff, coef } => {
            let band = &diff[r0 * inp..(r0 + rows) * inp];
            for (d, &x) in D.iter_mut().zip(band) {
                *d = arith::scaled_contribution(*d, coef, x);
            }
        }
        Step::Linear { factors, coef } => factors.add_rows(D, r0, rows, inp, coef, &mut scratch.xs),
        Step::Normalised { w, n } => {
            assert_eq!(W0.len(), rows * inp, "W0 band must be (rows, inp)");
            let Scratch { V, xs, ones } = scratch;
            V.clear();
            V.extend_from_slice(W0);
            n.factors.add_rows(V, r0, rows, inp, n.sigma, xs);
            ones.resize(inp, 1.0);
            let beta = match n.col {
                Some(_) => col_scale.expect("column-coupled update needs column scales"),
                None => &ones[..],
            };
            let rows_iter = V.chunks_exact(inp).zip(W0.chunks_exact(inp));
            for (i, ((Vi, W0i), Di)) in rows_iter.zip(D.chunks_exact_mut(inp)).enumerate() {
                let alpha = n.row_factor(Vi, r0 + i);
                for (((d, &v), &w0), &b) in Di.iter_mut().zip(Vi).zip(W0i).zip(beta) {
                    *d = arith::normalised_contribution(*d, w, v, w0, alpha, b);
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::excessive_precision)] // the spec's literals, copied digit for digit
mod tests {
    //! The float64 reference vectors of spec sa3_lora.md §7.3 (computed by the spec author
    //! from the §1 formulas; the numbers below are copied from the spec's tables, not from
    //! this code), on the S10 torch-parity inputs.

    use super::*;
    use crate::linalg::xs_bases;

    const W: [f32; 6] = [1.0, -2.0, 0.5, -0.5, 1.5, 2.0];
    const A: [f32; 3] = [0.25, -0.5, 1.0];
    const B: [f32; 2] = [0.5, -0.25];
    const M: [f32; 1] = [0.5];
    const M_ROWS: [f32; 2] = [3.0, 2.0];
    const M_COLS: [f32; 3] = [1.5, 2.5, 3.5];

    fn merged(update: &Update<'_>, w: f64) -> Vec<f32> {
        merged_many(&[(*update, w)])
    }

    /// W0 + Σ w_i·(f_i(W0) − W0) over the whole 2×3 matrix, one band per row so the column
    /// pass and the banding are exercised.
    fn merged_many(updates: &[(Update<'_>, f64)]) -> Vec<f32> {
        let (out, inp) = (2, 3);
        let mut D = W.to_vec();
        let mut scratch = Scratch::default();
        for (u, w) in updates {
            let cs = column_scales::<()>(u, out, inp, 1, |r0, rows, dst| {
                dst.copy_from_slice(&W[r0 * inp..(r0 + rows) * inp]);
                Ok(())
            })
            .unwrap();
            for r0 in 0..out {
                let band = r0 * inp..(r0 + 1) * inp;
                add_contribution(
                    u,
                    *w,
                    cs.as_deref(),
                    &W[band.clone()],
                    r0,
                    1,
                    inp,
                    &mut D[band],
                    &mut scratch,
                );
            }
        }
        D
    }

    fn assert_close(got: &[f32], want: [[f64; 3]; 2], tol: f64, what: &str) {
        let want: Vec<f64> = want.iter().flatten().copied().collect();
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= tol,
                "{what}[{i}]: got {g}, spec {w}"
            );
        }
    }

    fn lowrank<'a>(factors: Factors<'a>, form: Form<'a>) -> Update<'a> {
        Update::LowRank {
            factors,
            sigma: 1.0,
            form,
        }
    }

    const BA: Factors<'static> = Factors::BA {
        B: &B,
        A: &A,
        rank: 1,
    };

    #[test]
    fn non_xs_formulas_match_spec_7_3() {
        let cases: [(&str, Form<'_>, [[f64; 3]; 2]); 4] = [
            (
                "lora",
                Form::Additive,
                [[1.125, -2.25, 1.0], [-0.5625, 1.625, 1.75]],
            ),
            (
                "dora-rows",
                Form::Rows {
                    m: &M_ROWS,
                    eps: SA3_EPS,
                },
                [
                    [1.24674416, -2.49348832, 1.10821703],
                    [-0.45853362, 1.32465269, 1.42654905],
                ],
            ),
            (
                "dora-cols",
                Form::Cols { m: &M_COLS },
                [
                    [1.34164079, -2.02669807, 1.73648628],
                    [-0.67082039, 1.46372638, 3.03885100],
                ],
            ),
            (
                "bora",
                Form::Bora {
                    m_r: &M_ROWS,
                    m_c: &M_COLS,
                },
                [
                    [1.40780499, -2.20779406, 2.14719690],
                    [-0.51776936, 1.17287910, 2.76397277],
                ],
            ),
        ];
        for (name, form, want) in cases {
            assert_close(&merged(&lowrank(BA, form), 1.0), want, 1e-6, name);
        }
    }

    #[test]
    fn xs_formulas_match_spec_7_3() {
        let bases = xs_bases(&W, 2, 3, 1, Par::Seq).unwrap();
        // The spec's canonical U₁ and V₁.
        assert_close(
            &[
                bases.U[0], bases.U[1], 0.0, bases.V[0], bases.V[1], bases.V[2],
            ],
            [
                [-0.61541221, 0.78820544, 0.0],
                [-0.34724381, 0.83004751, 0.43639759],
            ],
            1e-6,
            "svd",
        );
        let xs = Factors::Xs {
            U: &bases.U,
            M: &M,
            V: &bases.V,
            rank: 1,
        };
        let cases: [(&str, Form<'_>, [[f64; 3]; 2]); 4] = [
            (
                "lora-xs",
                Form::Additive,
                [
                    [1.10684904, -2.25541069, 0.36571780],
                    [-0.63684973, 1.82712398, 2.17198548],
                ],
            ),
            (
                "dora-rows-xs",
                Form::Rows {
                    m: &M_ROWS,
                    eps: SA3_EPS,
                },
                [
                    [1.30789596, -2.66508117, 0.43214640],
                    [-0.43786858, 1.25624641, 1.49335731],
                ],
            ),
            (
                "dora-cols-xs",
                Form::Cols { m: &M_COLS },
                [
                    [1.30015051, -1.94255803, 0.58114753],
                    [-0.74806995, 1.57367986, 3.45141530],
                ],
            ),
            (
                "bora-xs",
                Form::Bora {
                    m_r: &M_ROWS,
                    m_c: &M_COLS,
                },
                [
                    [1.42240276, -2.26136287, 0.97290987],
                    [-0.47620415, 1.06594464, 3.36205984],
                ],
            ),
        ];
        for (name, form, want) in cases {
            assert_close(&merged(&lowrank(xs, form), 1.0), want, 1e-6, name);
        }
    }

    #[test]
    fn both_strength_knobs_match_spec_7_3() {
        let rows = Form::Rows {
            m: &M_ROWS,
            eps: SA3_EPS,
        };
        // Application weight 0.5 (the merge knob): W0 + 0.5·(f(W0) − W0).
        assert_close(
            &merged(&lowrank(BA, rows), 0.5),
            [
                [1.12337208, -2.24674416, 0.80410852],
                [-0.47926681, 1.41232634, 1.71327452],
            ],
            1e-6,
            "application weight 0.5",
        );
        // HEAD's lora_strength 0.5 (no blend) = strength inside the norm: σ' = 0.5·σ, w = 1.
        let inside = Update::LowRank {
            factors: BA,
            sigma: 0.5,
            form: rows,
        };
        assert_close(
            &merged(&inside, 1.0),
            [
                [1.27940554, -2.55881108, 0.90310979],
                [-0.42536571, 1.25107561, 1.50129073],
            ],
            1e-6,
            "lora_strength 0.5",
        );
    }

    #[test]
    fn two_adapter_sum_matches_spec_7_3() {
        let (A2, B2) = ([-0.75f32, 0.5, 0.25], [0.2f32, 0.4]);
        let lora = lowrank(BA, Form::Additive);
        let dora = lowrank(
            Factors::BA {
                B: &B2,
                A: &A2,
                rank: 1,
            },
            Form::Rows {
                m: &M_ROWS,
                eps: SA3_EPS,
            },
        );
        let ab = merged_many(&[(lora, 0.25), (dora, 0.75)]);
        assert_close(
            &ab,
            [
                [1.16958459, -2.54818909, 0.82480474],
                [-0.56648906, 1.31121114, 1.55539317],
            ],
            1e-6,
            "two adapters",
        );
    }

    #[test]
    fn identity_magnitudes_give_back_w0() {
        // Spec §7.3: row norms [2.29128785, 2.54950976], column norms [1.11803399, 2.5,
        // 2.06155281]; with B = 0 every normalised form is the identity (up to ε).
        let zero_b = [0.0f32; 2];
        let f = Factors::BA {
            B: &zero_b,
            A: &A,
            rank: 1,
        };
        let rn = [2.29128785f32, 2.54950976];
        let cn = [1.11803399f32, 2.5, 2.06155281];
        for form in [
            Form::Rows {
                m: &rn,
                eps: SA3_EPS,
            },
            Form::Cols { m: &cn },
            Form::Bora { m_r: &rn, m_c: &cn },
        ] {
            let got = merged(&lowrank(f, form), 1.0);
            let w64: Vec<[f64; 3]> = W
                .chunks(3)
                .map(|r| [r[0] as f64, r[1] as f64, r[2] as f64])
                .collect();
            assert_close(&got, [w64[0], w64[1]], 1e-6, "identity");
        }
    }

    #[test]
    fn negative_magnitudes_are_used_as_stored() {
        let neg = [-3.0f32, 2.0];
        let got = merged(
            &lowrank(
                BA,
                Form::Rows {
                    m: &neg,
                    eps: SA3_EPS,
                },
            ),
            1.0,
        );
        // Row 0 flips sign relative to the dora-rows vector of §7.3; row 1 is unchanged.
        assert_close(
            &got,
            [
                [-1.24674416, 2.49348832, -1.10821703],
                [-0.45853362, 1.32465269, 1.42654905],
            ],
            1e-6,
            "negative magnitude",
        );
    }

    #[test]
    fn full_diff_is_scaled_by_weight_and_scale() {
        let diff = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let got = merged(
            &Update::Full {
                diff: &diff,
                scale: 2.0,
            },
            0.5,
        );
        let want: Vec<f32> = W.iter().zip(&diff).map(|(w, d)| w + d).collect();
        assert_eq!(got, want);
    }
}
