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

/// [`allocate`] over spectra known in part: `known[i]` holds module i's top singular values
/// (all it can give when `known[i].len() == caps[i]`). A module whose allocation takes every
/// value known while it has more to give is saturated: `more` is asked for the top values
/// of each saturated module at twice the length (at most its cap), and the allocation is
/// redone, until no module is saturated. The result is `allocate` over the full spectra:
/// the greedy only looks at a module's next value once it has taken every earlier one, so
/// values past an unsaturated module's rank are never read. Returns the ranks and the
/// values finally known.
pub fn allocate_expanding<E>(
    mut known: Vec<Vec<f64>>,
    per_rank: &[u64],
    caps: &[usize],
    budget: u64,
    mut more: impl FnMut(&[(usize, usize)]) -> Result<Vec<Vec<f64>>, E>,
) -> Result<(Vec<usize>, Vec<Vec<f64>>), E> {
    loop {
        let candidates: Vec<Candidate<'_>> = known
            .iter()
            .zip(per_rank)
            .map(|(s, &per_rank)| Candidate { s, per_rank })
            .collect();
        let ranks = allocate(&candidates, budget);
        let grow: Vec<(usize, usize)> = ranks
            .iter()
            .enumerate()
            .filter(|&(i, &r)| r > 0 && r == known[i].len() && known[i].len() < caps[i])
            .map(|(i, _)| (i, (2 * known[i].len()).min(caps[i])))
            .collect();
        if grow.is_empty() {
            return Ok((ranks, known));
        }
        for (&(i, _), s) in grow.iter().zip(more(&grow)?) {
            known[i] = s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn expanding_spectra_allocate_as_the_full_ones() {
        // Seeded spectra of several lengths and costs; every budget from nothing to all.
        let mut rng = SplitMix64::new(0x5EED);
        let mut next = move || rng.unit_f64();
        let mut full: Vec<Vec<f64>> = Vec::new();
        let mut per_rank = Vec::new();
        for m in 0..7 {
            let n = 3 + m * 5;
            let mut s: Vec<f64> = (0..n).map(|_| next() * (1.0 + m as f64)).collect();
            s.sort_by(|a, b| b.total_cmp(a));
            full.push(s);
            per_rank.push(10 + 7 * m as u64);
        }
        let caps: Vec<usize> = full.iter().map(Vec::len).collect();
        let all: u64 = full
            .iter()
            .zip(&per_rank)
            .map(|(s, p)| s.len() as u64 * p + ALPHA_BYTES)
            .sum();
        for budget in (0..=all + 50).step_by(37) {
            let cands: Vec<Candidate<'_>> = full
                .iter()
                .zip(&per_rank)
                .map(|(s, &per_rank)| Candidate { s, per_rank })
                .collect();
            let want = allocate(&cands, budget);
            let first: Vec<Vec<f64>> = full.iter().map(|s| s[..1].to_vec()).collect();
            let mut asked = 0;
            let (got, _) = allocate_expanding(first, &per_rank, &caps, budget, |grow| {
                asked += grow.len();
                Ok::<_, ()>(grow.iter().map(|&(i, k)| full[i][..k].to_vec()).collect())
            })
            .unwrap();
            assert_eq!(got, want, "budget {budget}");
            assert!(asked <= 7 * 6, "budget {budget}: {asked} refetches");
        }
    }

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
