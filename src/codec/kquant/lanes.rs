//! `W` f32 lanes, one per sub-block of a K-quant super-block, for the searches of
//! `super::make_*_quants` that run ggml's per-sub-block loop on all sub-blocks at once.
//!
//! Owns: the lane-wise arithmetic (each operator is one IEEE f32 operation per lane, never
//! fused: `a * b + c` rounds twice, as ggml's uncontracted C does), comparisons as lane masks,
//! selects, and the transposition into lanes. Written as whole-array operations so that the
//! compiler maps each one onto vector instructions (`W = 8`: one AVX2 register, `W = 16`: two)
//! inside `pulp`'s dispatch; nothing here is `unsafe`.

// Lane-indexed loops over fixed arrays are the shape LLVM turns into vector instructions.
#![allow(clippy::needless_range_loop)]

use std::ops::{Add, BitAnd, BitOr, Div, Mul, Neg, Not, Sub};

/// One f32 per lane.
#[derive(Clone, Copy, Debug)]
pub(super) struct V<const W: usize>(pub [f32; W]);

/// One condition per lane: all bits set where true, none where false (what a vector compare
/// gives, so that selects stay bitwise).
#[derive(Clone, Copy, Debug)]
pub(super) struct M<const W: usize>(pub [u32; W]);

macro_rules! lane_op {
    ($tr:ident, $f:ident, $op:tt) => {
        impl<const W: usize> $tr for V<W> {
            type Output = V<W>;
            #[inline(always)]
            fn $f(self, b: V<W>) -> V<W> {
                let mut o = self.0;
                for k in 0..W {
                    o[k] = self.0[k] $op b.0[k];
                }
                V(o)
            }
        }
    };
}
lane_op!(Add, add, +);
lane_op!(Sub, sub, -);
lane_op!(Mul, mul, *);
lane_op!(Div, div, /);

impl<const W: usize> Neg for V<W> {
    type Output = V<W>;
    #[inline(always)]
    fn neg(self) -> V<W> {
        self.map(|v| -v)
    }
}

impl<const W: usize> BitAnd for M<W> {
    type Output = M<W>;
    #[inline(always)]
    fn bitand(self, b: M<W>) -> M<W> {
        let mut o = self.0;
        for k in 0..W {
            o[k] &= b.0[k];
        }
        M(o)
    }
}

impl<const W: usize> BitOr for M<W> {
    type Output = M<W>;
    #[inline(always)]
    fn bitor(self, b: M<W>) -> M<W> {
        let mut o = self.0;
        for k in 0..W {
            o[k] |= b.0[k];
        }
        M(o)
    }
}

impl<const W: usize> Not for M<W> {
    type Output = M<W>;
    #[inline(always)]
    fn not(self) -> M<W> {
        let mut o = self.0;
        for m in &mut o {
            *m = !*m;
        }
        M(o)
    }
}

impl<const W: usize> M<W> {
    /// Per lane `if self { a } else { b }`.
    #[inline(always)]
    pub fn select(self, a: V<W>, b: V<W>) -> V<W> {
        let mut o = a.0;
        for k in 0..W {
            let m = self.0[k];
            o[k] = f32::from_bits((a.0[k].to_bits() & m) | (b.0[k].to_bits() & !m));
        }
        V(o)
    }

    #[inline(always)]
    pub fn any(self) -> bool {
        self.0.iter().fold(0, |a, &m| a | m) != 0
    }
}

impl<const W: usize> V<W> {
    #[inline(always)]
    pub fn splat(v: f32) -> V<W> {
        V([v; W])
    }

    #[inline(always)]
    fn map(self, f: impl Fn(f32) -> f32) -> V<W> {
        let mut o = self.0;
        for v in &mut o {
            *v = f(*v);
        }
        V(o)
    }

    #[inline(always)]
    pub fn abs(self) -> V<W> {
        self.map(f32::abs)
    }

    #[inline(always)]
    pub fn sqrt(self) -> V<W> {
        self.map(f32::sqrt)
    }

    #[inline(always)]
    fn cmp(self, b: V<W>, f: impl Fn(f32, f32) -> bool) -> M<W> {
        let mut o = [0u32; W];
        for k in 0..W {
            o[k] = if f(self.0[k], b.0[k]) { !0 } else { 0 };
        }
        M(o)
    }

    #[inline(always)]
    pub fn lt(self, b: V<W>) -> M<W> {
        self.cmp(b, |a, b| a < b)
    }

    #[inline(always)]
    pub fn gt(self, b: V<W>) -> M<W> {
        self.cmp(b, |a, b| a > b)
    }

    #[inline(always)]
    pub fn eq(self, b: V<W>) -> M<W> {
        self.cmp(b, |a, b| a == b)
    }

    #[inline(always)]
    pub fn ne(self, b: V<W>) -> M<W> {
        self.cmp(b, |a, b| a != b)
    }

    /// `MAX(lo, MIN(hi, nearest_int(self)))` as an f32, per lane: ggml's magic-number rounding
    /// (`super::nearest_int`, bit for bit, beyond ±4194303 too), then the clamp, which is
    /// exact in f32 (the integer is below 2^23 in magnitude).
    #[inline(always)]
    pub fn code(self, lo: f32, hi: f32) -> V<W> {
        self.map(|v| {
            let l = super::nearest_int(v) as f32;
            let l = if l < lo { lo } else { l };
            if l > hi { hi } else { l }
        })
    }
}

/// `W` sub-blocks of `N` consecutive elements of `x` as lanes: `t[i].0[j] = x[N·j + i]`.
#[inline(always)]
pub(super) fn to_lanes<const N: usize, const W: usize>(x: &[f32]) -> [V<W>; N] {
    let mut t = [V([0.0; W]); N];
    for (j, s) in x.chunks_exact(N).take(W).enumerate() {
        for i in 0..N {
            t[i].0[j] = s[i];
        }
    }
    t
}
