//! The per-module rank rule (`--rank R`, `--energy F`, or both: the smaller) and the energy
//! arithmetic every report shares.
//!
//! Owns: [`RankRule`], [`energy_rank`], [`retained`]. Energy of rank r = Σ_{i<r} σ_i² / ‖ΔW‖_F²
//! with ‖ΔW‖_F² summed from the entries (not from σ, which may be incomplete);
//! rel_error = ‖ΔW − ΔW_r‖_F / ‖ΔW‖_F. Does not own: the budget (`budget`).

/// How many singular triplets each module keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankRule {
    /// At most this rank.
    pub rank: Option<usize>,
    /// The smallest rank whose energy is ≥ this fraction (0 < F ≤ 1).
    pub energy: Option<f64>,
}

impl RankRule {
    /// Checks the values: a rank ≥ 1, an energy in (0, 1], at least one of them.
    pub fn check(&self) -> Result<(), String> {
        if self.rank.is_none() && self.energy.is_none() {
            return Err("give --rank R or --energy F (or --budget SIZE for extract)".into());
        }
        if self.rank == Some(0) {
            return Err("--rank must be at least 1".into());
        }
        if let Some(f) = self.energy
            && !(f > 0.0 && f <= 1.0)
        {
            return Err(format!("--energy must be in (0, 1], found {f}"));
        }
        Ok(())
    }

    /// The rank for a module with singular values `s` (descending, the leading ones at
    /// least), squared norm `total` and `cap = min(out, in)`: min(R, energy pick, cap), ≥ 1.
    pub fn pick(&self, s: &[f64], total: f64, cap: usize) -> usize {
        let by_energy = self.energy.map_or(cap, |f| energy_rank(s, total, f));
        self.rank.unwrap_or(cap).min(by_energy).min(cap).max(1)
    }
}

/// The smallest r with Σ_{i<r} σ_i² ≥ F·total, or `s.len()` when the values given fall short.
pub fn energy_rank(s: &[f64], total: f64, f: f64) -> usize {
    let goal = f * total;
    let mut cum = 0.0;
    for (i, x) in s.iter().enumerate() {
        cum += x * x;
        if cum >= goal {
            return i + 1;
        }
    }
    s.len()
}

/// (energy, rel_error) of keeping the first `r` of `s`; `complete` says `s` holds every
/// singular value (then the tail is summed directly, without cancellation).
pub fn retained(s: &[f64], total: f64, r: usize, complete: bool) -> (f64, f64) {
    if total <= 0.0 {
        return (1.0, 0.0);
    }
    let kept: f64 = s.iter().take(r).map(|x| x * x).sum();
    let tail = if complete {
        s.iter().skip(r).map(|x| x * x).sum()
    } else {
        (total - kept).max(0.0)
    };
    ((kept / total).min(1.0), (tail / total).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_picks_and_caps() {
        let s = [0.8, 0.4, 0.2, 0.1];
        let total: f64 = s.iter().map(|x| x * x).sum();
        assert_eq!(energy_rank(&s, total, 0.9), 2);
        assert_eq!(energy_rank(&s, total, 0.99), 4);
        let rule = RankRule {
            rank: Some(3),
            energy: Some(0.99),
        };
        assert_eq!(rule.pick(&s, total, 4), 3);
        let (e, r) = retained(&s, total, 2, true);
        assert!((e - 0.8 / 0.85).abs() < 1e-15 && (r - (0.05f64 / 0.85).sqrt()).abs() < 1e-15);
        assert!(
            RankRule {
                rank: None,
                energy: Some(1.5)
            }
            .check()
            .is_err()
        );
        assert!(
            RankRule {
                rank: Some(0),
                energy: None
            }
            .check()
            .is_err()
        );
    }
}
