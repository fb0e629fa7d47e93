//! `--budget SIZE`: ranks allocated across modules by largest marginal energy.
//!
//! Owns: [`allocate`]. Each step gives one more rank to the module whose next singular value
//! σ has the largest σ² (the ΔW energy it adds, in the weights' own units), if its bytes still
//! fit; a module whose next rank does not fit stops there while cheaper ones go on. Ties go to
//! the module listed first, so the result is deterministic. A module's first rank also pays
//! for its 4-byte `.alpha`. Does not own: the bytes that do not depend on ranks (the caller
//! subtracts them) or the spectra (`factor`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Bytes of one f32 `.alpha`.
pub const ALPHA_BYTES: u64 = 4;

/// One module as the allocator sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    /// Its singular values, descending (ranks beyond `s.len()` are not available).
    pub s: &'a [f64],
    /// Bytes per rank: (out + in)·4 for f32 factors.
    pub per_rank: u64,
}

#[derive(PartialEq)]
struct Next {
    gain: f64,
    module: usize,
}

impl Eq for Next {}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Next {
    /// Larger gain first; on a tie, the smaller module index first.
    fn cmp(&self, other: &Self) -> Ordering {
        self.gain
            .total_cmp(&other.gain)
            .then_with(|| other.module.cmp(&self.module))
    }
}

/// Ranks per module within `budget` bytes (0 = the module is left out).
pub fn allocate(candidates: &[Candidate<'_>], budget: u64) -> Vec<usize> {
    let mut ranks = vec![0usize; candidates.len()];
    let mut left = budget;
    let mut heap: BinaryHeap<Next> = candidates
        .iter()
        .enumerate()
        .filter_map(|(module, c)| {
            c.s.first().map(|x| Next {
                gain: x * x,
                module,
            })
        })
        .collect();
    while let Some(Next { module, .. }) = heap.pop() {
        let c = &candidates[module];
        let r = ranks[module];
        let cost = c.per_rank + if r == 0 { ALPHA_BYTES } else { 0 };
        if cost > left {
            continue;
        }
        left -= cost;
        ranks[module] = r + 1;
        if let Some(x) = c.s.get(r + 1) {
            heap.push(Next {
                gain: x * x,
                module,
            });
        }
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_marginal_energy_first() {
        let a: &'static [f64] = &[1.0, 0.5, 0.1];
        let b: &'static [f64] = &[0.8, 0.7, 0.6];
        let c = |s: &'static [f64]| Candidate { s, per_rank: 10 };
        let cands = [c(a), c(b)];
        // 1.0², 0.8², 0.7², 0.6², 0.5², ... each 10 bytes (+4 for a first rank).
        assert_eq!(allocate(&cands, 0), vec![0, 0]);
        assert_eq!(allocate(&cands, 14), vec![1, 0]);
        assert_eq!(allocate(&cands, 28), vec![1, 1]);
        assert_eq!(allocate(&cands, 48), vec![1, 3]);
        assert_eq!(allocate(&cands, 58), vec![2, 3]);
        assert_eq!(allocate(&cands, 1000), vec![3, 3]);
        // A module too expensive for what is left stops; a cheaper one goes on.
        let big = Candidate {
            s: a,
            per_rank: 100,
        };
        let small = Candidate { s: b, per_rank: 10 };
        let mixed = [big, small];
        assert_eq!(allocate(&mixed, 110), vec![1, 0]);
        assert_eq!(allocate(&mixed, 130), vec![1, 2]);
    }
}
