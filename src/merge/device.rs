//! The whole-tensor program the device routes run.
//!
//! Owns: [`merge_whole`], the op sequence of `backend`'s module doc applied to one target's
//! [`Update`]s, and which merge errors leave a lane unusable (`LaneFault for MergeError`).
//! Does not own: where a merge computes (`pipeline::Compute`) and the lanes
//! (`pipeline::Lanes`), the ops themselves (`backend`, `gpu`), which tensors a target reads
//! (`merge::target`), the band path, or which coefficients, factors and ε an update gets (its
//! [`Step`], read by both routes: `merge::math`).
//!
//! # The two routes
//! * Bands (`Compute::Cpu`): `merge::target` widens a band of base rows into an accumulator
//!   that starts at `W0`, adds each contribution, checks and rounds the band.
//! * Whole tensors (`Compute::Cuda`, `Compute::Reference`): `W0` is widened on the
//!   backend, the contributions are summed into `D` (starting at +0), and
//!   `RNE(W0 + D)` is formed once by `add_narrow`, which also reports the first non-finite
//!   element. The reference route runs this very program on `CpuBackend`, so the program is
//!   tested against the PEFT/diffusers/SA3 oracles on every machine, GPU or not.
//!
//! The two routes sum in different orders (`(W0 + c₁) + c₂` against `W0 + (c₁ + c₂)`) and
//! their GEMMs round differently, so they agree to f32 rounding before the final rounding
//! and, after it, to one bf16 ulp except where the result is near 0 (cancellation; BENCHMARKS.md
//! "GPU" has 9 such elements, 2-8 ulps apart, in an SA3 -xs merge); each is deterministic on
//! its own.
//!
//! # -xs bases
//! Each route computes LoRA-XS bases with its own engine (`merge::xs`): the band route with
//! faer on the worker thread (`linalg::xs_bases`), the reference route with the same faer
//! call on a lane (`CpuBackend::xs_bases`, the same bits), the CUDA route with cuSOLVER
//! `gesvd` in f64 on a lane (`CudaBackend::xs_bases`). cuSOLVER's bases differ from faer's by
//! about one f32 ulp in a few elements (6 of 655,360 at 5120², BENCHMARKS.md "GPU"), so the
//! SVD cache keys an entry by the engine's id as well as the base's content and the rank
//! (`linalg::SvdEngine`: faer's version and partition degree; cuSOLVER's version, GPU
//! architecture and SM count): a cache filled on CUDA is never read by a CPU merge, and each
//! route's bytes are its own whichever route ran first. The report and the manifest name the
//! engine (`report.svd.engine`). `--device cpu` stays the reference: its bytes depend on no
//! GPU and on nothing a cache was filled with.

#![allow(non_snake_case)]

use super::error::MergeError;
use super::math::{Factors, Step, Update};
use crate::backend::{Backend, BackendError, MatShape, NonFinite};
use crate::io::DType;
use crate::pipeline::base_rows::BaseWeight;
use crate::pipeline::compute::LaneFault;

impl LaneFault for MergeError {
    fn is_device_fault(&self) -> bool {
        matches!(self, MergeError::Device { source, .. } if source.is_device_fault())
    }
}

/// Merges one target whole on `b`: `RNE(W0 + Σ w·(f(W0) − W0))` written as `dtype` (BF16,
/// F16 or F32) into `dst` (row-major (out, in')), contributions in the given order. Returns
/// the first element whose f32 sum is not finite; `dst` must then not be written out.
pub fn merge_whole<B: Backend>(
    b: &mut B,
    base: BaseWeight<'_>,
    (out, inp): (usize, usize),
    updates: &[(Update<'_>, f64)],
    dtype: DType,
    dst: &mut [u8],
) -> Result<Option<NonFinite>, BackendError> {
    let W0 = match base {
        BaseWeight::Stored { dtype, bytes } => b.widen(dtype, bytes, out, inp)?,
        BaseWeight::F32(w) => b.upload(w, out, inp)?,
    };
    let mut D = b.zeros(out, inp)?;
    for (update, w) in updates {
        add_contribution(b, &mut D, &W0, update, *w)?;
    }
    b.add_narrow(&W0, &D, dtype, dst)
}

/// `D ← D + w·(f(W0) − W0)` for one update: the ops of its [`Step`], the step the band
/// route (`merge::math::add_contribution`) takes too.
fn add_contribution<B: Backend>(
    b: &mut B,
    D: &mut B::Mat,
    W0: &B::Mat,
    update: &Update<'_>,
    w: f64,
) -> Result<(), BackendError> {
    let (out, inp) = (W0.rows(), W0.cols());
    match update.step(w) {
        Step::Scaled { diff, coef } => {
            let X = b.upload(diff, out, inp)?;
            b.accumulate_scaled(D, coef, &X)
        }
        Step::Linear { factors, coef } => add_delta(b, D, coef, &factors),
        Step::Normalised { w, n } => {
            let mut V = b.duplicate(W0)?;
            add_delta(b, &mut V, n.sigma, &n.factors)?;
            let alpha = match n.row {
                Some(r) => {
                    let m = b.upload(r.m, out, 1)?;
                    Some(b.row_scales(&V, &m, r.eps)?)
                }
                None => None,
            };
            let beta = match n.col {
                Some(c) => {
                    let m = b.upload(c.m, 1, inp)?;
                    Some(b.col_scales(&V, alpha.as_ref(), &m, c.eps)?)
                }
                None => None,
            };
            b.accumulate_normalised(D, w, &V, W0, alpha.as_ref(), beta.as_ref())
        }
    }
}

/// `W ← W + s·Δ` with `Δ = B·A` or `U·M·Vᵀ`.
fn add_delta<B: Backend>(
    b: &mut B,
    W: &mut B::Mat,
    s: f32,
    factors: &Factors<'_>,
) -> Result<(), BackendError> {
    let (out, inp) = (W.rows(), W.cols());
    match *factors {
        Factors::BA { B: Bf, A, rank } => {
            let (Bm, Am) = (b.upload(Bf, out, rank)?, b.upload(A, rank, inp)?);
            b.add_scaled_product(W, s, &Bm, &Am)
        }
        Factors::Xs { U, M, V, rank } => {
            let (Um, Mm, Vm) = (
                b.upload(U, out, rank)?,
                b.upload(M, rank, rank)?,
                b.upload(V, inp, rank)?,
            );
            b.add_xs_update(W, s, &Um, &Mm, &Vm)
        }
    }
}

#[cfg(test)]
mod tests {
    //! The whole-tensor program on the reference backend against the band path and against
    //! hand-derived values (the end-to-end oracles are in tests/merge.rs).

    use super::*;
    use crate::backend::{CpuBackend, HostMat};
    use crate::merge::math::{Form, SA3_EPS, Scratch, add_contribution as add_band, column_scales};
    use crate::pipeline::Lanes;
    use faer::Par;

    const W: [f32; 6] = [1.0, -2.0, 0.5, -0.5, 1.5, 2.0];
    const A: [f32; 3] = [0.25, -0.5, 1.0];
    const B: [f32; 2] = [0.5, -0.25];

    fn whole(updates: &[(Update<'_>, f64)]) -> Vec<f32> {
        let mut b = CpuBackend::new(Par::Seq);
        let mut dst = vec![0u8; 24];
        let bad = merge_whole(
            &mut b,
            BaseWeight::F32(&W),
            (2, 3),
            updates,
            DType::F32,
            &mut dst,
        )
        .unwrap();
        assert_eq!(bad, None);
        bytemuck::cast_slice::<u8, f32>(&dst).to_vec()
    }

    fn bands(updates: &[(Update<'_>, f64)]) -> Vec<f32> {
        let mut D = W.to_vec();
        let mut scratch = Scratch::default();
        for (u, w) in updates {
            let cs = column_scales::<()>(u, 2, 3, 2, |r0, n, d| {
                d.copy_from_slice(&W[r0 * 3..(r0 + n) * 3]);
                Ok(())
            })
            .unwrap();
            add_band(u, *w, cs.as_deref(), &W, 0, 2, 3, &mut D, &mut scratch);
        }
        D
    }

    fn lowrank(form: Form<'_>) -> Update<'_> {
        Update::LowRank {
            factors: Factors::BA {
                B: &B,
                A: &A,
                rank: 1,
            },
            sigma: 1.0,
            form,
        }
    }

    #[test]
    fn a_lora_and_a_diff_give_the_hand_values() {
        // W + 0.5·B·A + 0.25·diff, every value exact in binary.
        let diff = [4.0f32, 0.0, -4.0, 8.0, 0.0, 0.0];
        let got = whole(&[
            (lowrank(Form::Additive), 0.5),
            (
                Update::Full {
                    diff: &diff,
                    scale: 1.0,
                },
                0.25,
            ),
        ]);
        assert_eq!(got, [2.0625, -2.125, -0.25, 1.46875, 1.5625, 1.875]);
    }

    #[test]
    fn every_form_agrees_with_the_band_path() {
        let (m_r, m_c) = ([3.0f32, 2.0], [1.5f32, 2.5, 3.5]);
        let forms = [
            Form::Additive,
            Form::Rows {
                m: &m_r,
                eps: SA3_EPS,
            },
            Form::Rows { m: &m_r, eps: 0.0 },
            Form::Cols { m: &m_c },
            Form::Bora {
                m_r: &m_r,
                m_c: &m_c,
            },
        ];
        for form in forms {
            let u = [(lowrank(form), 0.75)];
            let (a, b) = (whole(&u), bands(&u));
            for (x, y) in a.iter().zip(&b) {
                // One contribution: both routes round the same f64 value once into f32 and
                // add it to W0 once; the tiny GEMM is exact.
                assert_eq!(x.to_bits(), y.to_bits(), "{form:?}: {a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn a_non_finite_sum_is_reported_with_its_index() {
        let diff = [0.0f32, 0.0, 0.0, 0.0, f32::MAX, 0.0];
        let mut b = CpuBackend::new(Par::Seq);
        let mut dst = vec![0u8; 12];
        let u = [(
            Update::Full {
                diff: &diff,
                scale: 1.0,
            },
            1.0,
        )];
        let bad = merge_whole(
            &mut b,
            BaseWeight::F32(&[0.0, 0.0, 0.0, 0.0, f32::MAX, 0.0]),
            (2, 3),
            &u,
            DType::BF16,
            &mut dst,
        )
        .unwrap();
        assert_eq!(bad.map(|n| n.index), Some(4));
    }

    #[test]
    fn r_issue_18_a_data_error_keeps_its_lane() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let lanes = Lanes::new(2, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(CpuBackend::new(Par::Seq))
        });
        let data_error = MergeError::Pipeline(crate::pipeline::PipelineError::Convert {
            tensor: "w".into(),
            reason: "bad data".into(),
        });
        assert!(lanes.with(|_| Err::<(), _>(data_error)).unwrap().is_err());
        let bad_rank =
            BackendError::Linalg(crate::linalg::LinalgError::NoConvergence { out: 2, inp: 2 });
        assert!(lanes.with(|_| Err::<(), _>(bad_rank)).unwrap().is_err());
        lanes.with(|_| Ok::<(), BackendError>(())).unwrap().unwrap();
        assert_eq!((made.load(Ordering::SeqCst), lanes.leaked()), (1, 0));
    }

    /// A lane that behaves like a cudarc lane after a sticky device error: once the shared
    /// "context" is broken, its ops fail and its destructor panics (cudarc `unwrap`s
    /// `cublasDestroy`).
    struct FaultyLane {
        cpu: CpuBackend,
        broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Drop for FaultyLane {
        fn drop(&mut self) {
            if self.broken.load(std::sync::atomic::Ordering::SeqCst) && !std::thread::panicking() {
                panic!("cublasDestroy after a sticky error: CUBLAS_STATUS_INTERNAL_ERROR");
            }
        }
    }

    impl FaultyLane {
        fn check(&self) -> Result<(), BackendError> {
            if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(BackendError::cuda(
                    "launching 'widen_bf16'",
                    "an illegal address",
                ));
            }
            Ok(())
        }
    }

    /// Every op checks the shared state first, then runs on the CPU backend.
    impl Backend for FaultyLane {
        type Mat = HostMat;
        type Scales = crate::backend::HostScales;
        fn kind(&self) -> crate::backend::BackendKind {
            crate::backend::BackendKind::Cuda
        }
        fn upload(&mut self, d: &[f32], r: usize, c: usize) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.upload(d, r, c)
        }
        fn widen(
            &mut self,
            t: DType,
            b: &[u8],
            r: usize,
            c: usize,
        ) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.widen(t, b, r, c)
        }
        fn zeros(&mut self, r: usize, c: usize) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.zeros(r, c)
        }
        fn duplicate(&mut self, m: &HostMat) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.duplicate(m)
        }
        fn add_scaled_product(
            &mut self,
            w: &mut HostMat,
            s: f32,
            bm: &HostMat,
            am: &HostMat,
        ) -> Result<(), BackendError> {
            self.check()?;
            self.cpu.add_scaled_product(w, s, bm, am)
        }
        fn add_xs_update(
            &mut self,
            w: &mut HostMat,
            s: f32,
            U: &HostMat,
            M: &HostMat,
            V: &HostMat,
        ) -> Result<(), BackendError> {
            self.check()?;
            self.cpu.add_xs_update(w, s, U, M, V)
        }
        fn row_norms(&mut self, X: &HostMat) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.row_norms(X)
        }
        fn col_norms(&mut self, X: &HostMat) -> Result<HostMat, BackendError> {
            self.check()?;
            self.cpu.col_norms(X)
        }
        fn row_scales(
            &mut self,
            V: &HostMat,
            m: &HostMat,
            eps: f64,
        ) -> Result<Self::Scales, BackendError> {
            self.check()?;
            self.cpu.row_scales(V, m, eps)
        }
        fn col_scales(
            &mut self,
            V: &HostMat,
            a: Option<&Self::Scales>,
            m: &HostMat,
            eps: f64,
        ) -> Result<Self::Scales, BackendError> {
            self.check()?;
            self.cpu.col_scales(V, a, m, eps)
        }
        fn accumulate_normalised(
            &mut self,
            D: &mut HostMat,
            wt: f64,
            V: &HostMat,
            w0: &HostMat,
            a: Option<&Self::Scales>,
            b: Option<&Self::Scales>,
        ) -> Result<(), BackendError> {
            self.check()?;
            self.cpu.accumulate_normalised(D, wt, V, w0, a, b)
        }
        fn accumulate_scaled(
            &mut self,
            D: &mut HostMat,
            coef: f64,
            X: &HostMat,
        ) -> Result<(), BackendError> {
            self.check()?;
            self.cpu.accumulate_scaled(D, coef, X)
        }
        fn download_scales(&mut self, s: &Self::Scales) -> Result<Vec<f64>, BackendError> {
            self.check()?;
            self.cpu.download_scales(s)
        }
        fn add_narrow(
            &mut self,
            base: &HostMat,
            delta: &HostMat,
            dtype: DType,
            out: &mut [u8],
        ) -> Result<Option<NonFinite>, BackendError> {
            self.check()?;
            self.cpu.add_narrow(base, delta, dtype, out)
        }
        fn narrow(
            &mut self,
            src: &HostMat,
            dtype: DType,
            out: &mut [u8],
        ) -> Result<(), BackendError> {
            self.check()?;
            self.cpu.narrow(src, dtype, out)
        }
        fn download(&mut self, src: &HostMat) -> Result<Vec<f32>, BackendError> {
            self.check()?;
            self.cpu.download(src)
        }
        fn xs_bases(
            &mut self,
            x: &[f32],
            out: usize,
            inp: usize,
            r: usize,
        ) -> Result<crate::linalg::XsBases, BackendError> {
            self.check()?;
            self.cpu.xs_bases(x, out, inp, r)
        }
    }

    /// Issue 18, item 3: a device fault injected through the backend trait comes back as
    /// `MergeError::Device`, with no panic from the faulted lane's destructors, while the
    /// lane's place is given back and the pool keeps serving targets; the idle lanes are
    /// leaked too when the pool goes (their destructors would panic as well).
    #[test]
    fn r_issue_18_a_device_fault_is_an_error_not_a_panic_and_other_lanes_keep_working() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let broken = Arc::new(AtomicBool::new(false));
        let (made, done) = (Arc::new(AtomicUsize::new(0)), AtomicUsize::new(0));
        let (b2, m2) = (broken.clone(), made.clone());
        let lanes = Lanes::new(2, move || {
            m2.fetch_add(1, Ordering::SeqCst);
            Ok(FaultyLane {
                cpu: CpuBackend::new(Par::Seq),
                broken: b2.clone(),
            })
        });
        // One target on the whole-tensor program, as merge::target runs it.
        let target = |b: &mut FaultyLane| -> Result<(), MergeError> {
            let mut dst = vec![0u8; 24];
            merge_whole(b, BaseWeight::F32(&W), (2, 3), &[], DType::F32, &mut dst).map_err(
                |source| MergeError::Device {
                    tensor: "blocks.0.w".into(),
                    device: "cuda",
                    source,
                },
            )?;
            Ok(())
        };
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..10 {
                        lanes.with(target).unwrap().unwrap();
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        // The fault: the context breaks while a lane runs a target (a kernel faulted).
        let result = lanes.with(|b| {
            broken.store(true, Ordering::SeqCst);
            target(b)
        });
        let err = result
            .expect("the lane was taken")
            .expect_err("the target failed");
        let MergeError::Device { source, .. } = &err else {
            panic!("{err:?}");
        };
        assert!(
            source.to_string().contains("an illegal address"),
            "{source}"
        );
        assert_eq!(lanes.leaked(), 1);
        // The device recovers for this test (a lane-local fault): the pool still serves.
        broken.store(false, Ordering::SeqCst);
        lanes.with(target).unwrap().unwrap();
        assert_eq!(done.load(Ordering::SeqCst), 20);
        assert!(made.load(Ordering::SeqCst) <= 3);
        // Sticky again: dropping the pool must not run the idle lanes' destructors.
        broken.store(true, Ordering::SeqCst);
        drop(lanes);
    }
}
