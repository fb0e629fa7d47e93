//! One module's spectrum and its LoRA factors.
//!
//! Owns: [`Spectrum`] (the leading singular triplets of ΔW with ‖ΔW‖_F²), [`spectrum`] (how
//! many triplets to compute for a rule: R, or doubling until the energy goal is met, on any
//! `linalg::TruncEngine`), and the split into factors ([`Spectrum::factors`]:
//! `B = U_r·Σ_r`, `A = V_rᵀ`, f32, so that B·A with α = r is the truncation). Does not own:
//! the SVD routines (`linalg::truncated`), where they run (`route`).

#![allow(non_snake_case)]

use super::rank::{RankRule, retained};
use crate::linalg::{TopSingular, TruncEngine, TruncMethod, top_singular_on};

/// First sketch size when only an energy fraction is known.
const ENERGY_FIRST_RANK: usize = 32;

/// The leading singular triplets of one ΔW.
#[derive(Clone, Debug)]
pub struct Spectrum {
    /// The triplets (all of them when `top.complete`).
    pub top: TopSingular,
    /// ‖ΔW‖_F², summed from the entries.
    pub total: f64,
    /// Rows of ΔW.
    pub out: usize,
    /// Columns of ΔW.
    pub inp: usize,
}

/// LoRA factors in PyTorch layout, row-major f32.
#[derive(Clone, Debug, PartialEq)]
pub struct LowRankFactors {
    /// Rank r.
    pub rank: usize,
    /// Rows.
    pub out: usize,
    /// Columns.
    pub inp: usize,
    /// `B = U_r·Σ_r`, (out, r).
    pub B: Vec<f32>,
    /// `A = V_rᵀ`, (r, in).
    pub A: Vec<f32>,
}

impl Spectrum {
    /// min(out, in).
    pub fn cap(&self) -> usize {
        self.out.min(self.inp)
    }

    /// (energy, rel_error) of keeping rank `r`.
    pub fn retained(&self, r: usize) -> (f64, f64) {
        retained(&self.top.S, self.total, r, self.top.complete)
    }

    /// Drops the singular vectors beyond the first `r` (the values stay, for the report).
    pub fn keep_vectors(&mut self, r: usize) {
        let r = r.min(self.top.U.ncols());
        self.top.U = self.top.U.get(.., ..r).to_owned();
        self.top.V = self.top.V.get(.., ..r).to_owned();
    }

    /// The factors of rank `r` (at most the vectors kept), each element rounded once from f64
    /// to f32.
    #[track_caller]
    pub fn factors(&self, r: usize) -> LowRankFactors {
        assert!(
            r <= self.top.U.ncols(),
            "rank {r} > {} vectors kept",
            self.top.U.ncols()
        );
        let (U, S, V) = (&self.top.U, &self.top.S, &self.top.V);
        let mut B = Vec::with_capacity(self.out * r);
        for i in 0..self.out {
            B.extend((0..r).map(|j| (U[(i, j)] * S[j]) as f32));
        }
        let mut A = Vec::with_capacity(r * self.inp);
        for j in 0..r {
            A.extend((0..self.inp).map(|c| V[(c, j)] as f32));
        }
        LowRankFactors {
            rank: r,
            out: self.out,
            inp: self.inp,
            B,
            A,
        }
    }
}

/// ‖ΔW‖_F² of a ΔW's values, summed in order.
pub fn frobenius_sq(D: &[f64]) -> f64 {
    D.iter().map(|x| x * x).sum()
}

/// The spectrum of the (out, in) ΔW `engine` holds (`total` = its [`frobenius_sq`]) with
/// enough triplets for `rule`: R of them, or, for an energy goal, 32, 64, … until the goal is
/// met (at most min(R, out, in)). `max_rank` computes exactly that many instead (the budget
/// allocates afterwards). The engine decides where the products and full SVDs run
/// (`extract::route`).
pub fn spectrum<E: TruncEngine>(
    engine: &mut E,
    total: f64,
    rule: Option<&RankRule>,
    max_rank: usize,
    method: TruncMethod,
) -> Result<Spectrum, E::Error> {
    let (out, inp) = engine.dims();
    let cap = out.min(inp);
    let limit = rule
        .and_then(|r| r.rank)
        .unwrap_or(max_rank)
        .min(cap)
        .max(1);
    let goal = rule.and_then(|r| r.energy);
    let mut k = match goal {
        Some(_) if method != TruncMethod::Exact => limit.min(ENERGY_FIRST_RANK),
        Some(_) => cap,
        None => limit,
    };
    loop {
        let top = top_singular_on(engine, k, method)?;
        let enough = match goal {
            None => true,
            Some(f) => {
                let kept: f64 = top.S.iter().map(|x| x * x).sum();
                top.complete || k >= limit || kept >= f * total
            }
        };
        if enough {
            return Ok(Spectrum {
                top,
                total,
                out,
                inp,
            });
        }
        k = (2 * k).min(limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::rank::energy_rank;
    use crate::linalg::FaerEngine;
    use crate::rng::SplitMix64;
    use faer::MatRef;

    /// A (m, n) matrix with singular values `s` along seeded orthonormal-ish directions:
    /// Σ_i s_i·u_i·v_iᵀ with u_i, v_i distinct coordinate-mixing vectors (exact SVD known
    /// only to the routine under test, which is compared with the exact route).
    fn matrix(m: usize, n: usize, s: &[f64]) -> Vec<f64> {
        let mut rng = SplitMix64::new(0x5EED);
        let mut rnd = move || rng.unit_f64() - 0.5;
        let mut d = vec![0.0; m * n];
        for &sv in s {
            let u: Vec<f64> = (0..m).map(|_| rnd()).collect();
            let v: Vec<f64> = (0..n).map(|_| rnd()).collect();
            let (nu, nv) = (
                u.iter().map(|x| x * x).sum::<f64>().sqrt(),
                v.iter().map(|x| x * x).sum::<f64>().sqrt(),
            );
            for i in 0..m {
                for j in 0..n {
                    d[i * n + j] += sv * u[i] * v[j] / (nu * nv);
                }
            }
        }
        d
    }

    #[test]
    fn energy_doubling_on_the_randomized_route_matches_the_exact_spectrum() {
        // 200 × 150 with a slow power-law decay: the 0.999 goal needs more than the first
        // sketch of 32, so the randomized route doubles; ranks and energies must agree with
        // the exact SVD.
        let s: Vec<f64> = (1..=70).map(|i| (i as f64).powf(-1.2)).collect();
        let d = matrix(200, 150, &s);
        for f in [0.9, 0.99, 0.999] {
            let rule = RankRule {
                rank: None,
                energy: Some(f),
            };
            let run = |method| {
                let mut host = FaerEngine(MatRef::from_row_major_slice(&d, 200, 150));
                spectrum(&mut host, frobenius_sq(&d), Some(&rule), 150, method).unwrap()
            };
            let (e, r) = (run(TruncMethod::Exact), run(TruncMethod::RANDOMIZED));
            let (ke, kr) = (
                rule.pick(&e.top.S, e.total, e.top.S.len()),
                rule.pick(&r.top.S, r.total, r.top.S.len()),
            );
            assert_eq!(ke, kr, "F = {f}");
            assert_eq!(ke, energy_rank(&e.top.S, e.total, f));
            let ((ee, re), (er, rr)) = (e.retained(ke), r.retained(kr));
            assert!((ee - er).abs() < 1e-9 && (re - rr).abs() < 1e-6, "F = {f}");
            let (fe, fr) = (e.factors(ke), r.factors(kr));
            let diff =
                fe.B.iter()
                    .zip(&fr.B)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
            assert!(diff < 1e-5, "F = {f}: B differs by {diff}");
        }
    }
}
