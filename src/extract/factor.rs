//! One module's spectrum and its LoRA factors.
//!
//! Owns: [`Spectrum`] (the leading singular triplets of ΔW with ‖ΔW‖_F²), [`spectrum`] (how
//! many triplets to compute for a rule: R, or doubling until the energy goal is met), and
//! the split into factors ([`Spectrum::factors`]: `B = U_r·Σ_r`, `A = V_rᵀ`, f32, so that
//! B·A with α = r is the truncation). Does not own: the SVD routines (`linalg::truncated`).

#![allow(non_snake_case)]

use faer::MatRef;

use super::rank::{RankRule, retained};
use crate::linalg::{LinalgError, TopSingular, TruncMethod, top_singular};

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
pub struct Factors {
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

    /// The factors of rank `r ≤ S.len()`, each element rounded once from f64 to f32.
    #[track_caller]
    pub fn factors(&self, r: usize) -> Factors {
        assert!(
            r <= self.top.S.len(),
            "rank {r} > {} computed",
            self.top.S.len()
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
        Factors {
            rank: r,
            out: self.out,
            inp: self.inp,
            B,
            A,
        }
    }
}

/// The spectrum of ΔW ((out, in) row-major f64) with enough triplets for `rule`: R of them,
/// or, for an energy goal, 32, 64, … until the goal is met (at most min(R, out, in)).
/// `max_rank` computes exactly that many instead (the budget allocates afterwards).
pub fn spectrum(
    D: &[f64],
    out: usize,
    inp: usize,
    rule: Option<&RankRule>,
    max_rank: usize,
    method: TruncMethod,
) -> Result<Spectrum, LinalgError> {
    let M = MatRef::from_row_major_slice(D, out, inp);
    let total: f64 = D.iter().map(|x| x * x).sum();
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
        let top = top_singular(M, k, method)?;
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
