//! The crate's one seeded pseudo-random generator.
//!
//! Owns: [`SplitMix64`] (Steele, Lea and Flood's generator with Vigna's constants: tiny, fast
//! and fully specified, so data drawn from it never changes with a dependency upgrade) and
//! its conversions of 64 random bits to numbers in stated ranges. Its users: `synth`'s random
//! fill (the bytes of a synthetic checkpoint), the randomized range finder's test matrix
//! (`linalg::truncated`), and the tests' inputs (unit tests and `tests/common`). Does not
//! own: seeds (each user fixes or derives its own).
//!
//! Every conversion is a fixed sequence of exact integer steps and IEEE operations, so a
//! seed gives the same numbers on every machine; changing one would change synthetic
//! checkpoints (tests/digests.rs) and randomized SVDs.

/// SplitMix64: the state is one `u64`, advanced by a fixed odd constant and mixed on output.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator whose first output is the mix of `seed + 0x9E37_79B9_7F4A_7C15`.
    pub const fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1) with 24 random bits (the top ones): `k/2²³ − 1`, every step exact
    /// but the final subtraction.
    pub fn signed_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in [0, 1) with 53 random bits (the top ones), exact: `k/2⁵³`.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [-1, 1) with 53 random bits (the top ones): `k/2⁵²` (exact) `− 1`.
    pub fn signed_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// Uniform in (0, 1), never 0 (a logarithm's argument): `(k + ½)/2⁵³` with 53 random bits,
    /// the sum rounded in f64.
    pub fn open_unit_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal, Box–Muller (cosine branch) on two [`Self::open_unit_f64`] draws.
    /// `ln` and `cos` are the platform's, so the last bit may differ between machines: for
    /// test inputs, not for bytes that must reproduce.
    pub fn normal(&mut self) -> f64 {
        let (a, b) = (self.open_unit_f64(), self.open_unit_f64());
        (-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()
    }

    /// Uniform-ish in `0..n` (`next_u64() % n`; modulo bias below 2⁻⁴⁰ for any `n < 2²⁴`);
    /// 0 when `n` is 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outputs_of_seed_zero_are_splitmix64s() {
        // Vigna's reference implementation (splitmix64.c), seed 0.
        let mut r = SplitMix64::new(0);
        let want = [
            0xE220_A839_7B1D_CDAF,
            0x6E78_9E6A_A1B9_65F4,
            0x06C4_5D18_8009_454F,
        ];
        for w in want {
            assert_eq!(r.next_u64(), w);
        }
    }

    #[test]
    fn signed_f32_is_synths_old_conversion_for_every_24_bit_draw() {
        // synth drew `(k/2²⁴)·2 − 1` before this module existed; its bytes must not change.
        for k in 0..1u32 << 24 {
            let old = (k as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            let new = k as f32 / (1u64 << 23) as f32 - 1.0;
            assert_eq!(old.to_bits(), new.to_bits(), "k = {k}");
        }
    }

    #[test]
    fn conversions_stay_in_their_ranges() {
        let mut r = SplitMix64::new(42);
        for _ in 0..10_000 {
            let x = r.signed_f32();
            assert!((-1.0..1.0).contains(&x));
            let x = r.signed_f64();
            assert!((-1.0..1.0).contains(&x));
            let x = r.unit_f64();
            assert!((0.0..1.0).contains(&x));
            let x = r.open_unit_f64();
            assert!(x > 0.0 && x < 1.0);
            assert!(r.normal().is_finite());
            assert!(r.below(7) < 7);
        }
        assert_eq!(r.below(0), 0);
    }
}
