//! Where a merge computes, and the whole-tensor program the device route runs.
//!
//! Owns: [`Compute`] (row bands on the CPU, whole tensors on CUDA lanes, or whole tensors on
//! the CPU reference backend), [`Compute::select`] (`--device` → what runs, and why),
//! [`Lanes`] (backend lanes shared by the merge's worker threads) and [`merge_whole`], the op
//! sequence of `backend`'s module doc applied to one target's [`Update`]s. Does not own:
//! the ops themselves (`backend`, `gpu`), which tensors a target reads (`merge::exec`), the
//! band path, or which coefficients, factors and ε an update gets (its [`Step`], read by
//! both routes: `merge::math`).
//!
//! # The two routes
//! * Bands ([`Compute::Cpu`]): `merge::exec` widens a band of base rows into an accumulator
//!   that starts at `W0`, adds each contribution, checks and rounds the band.
//! * Whole tensors ([`Compute::Cuda`], [`Compute::Reference`]): `W0` is widened on the
//!   backend, the contributions are summed into `D` (starting at +0), and
//!   `RNE(W0 + D)` is formed once by `add_narrow`, which also reports the first non-finite
//!   element. The reference route runs this very program on [`CpuBackend`], so the program is
//!   tested against the PEFT/diffusers/SA3 oracles on every machine, GPU or not.
//!
//! The two routes sum in different orders (`(W0 + c₁) + c₂` against `W0 + (c₁ + c₂)`) and
//! their GEMMs round differently, so they agree to f32 rounding before the final rounding
//! and, after it, to one bf16 ulp except where the result is near 0 (cancellation; BENCHMARKS.md
//! "GPU" has 9 such elements, 2-8 ulps apart, in an SA3 -xs merge); each is deterministic on
//! its own.
//!
//! # -xs bases
//! Every route computes LoRA-XS bases with the CPU SVD (`linalg::xs_bases`, faer in f64, on
//! the merge's worker thread, outside any lane), never with the backend's `xs_bases`
//! (cuSOLVER `gesvd` on CUDA). The SVD cache keys an entry by the base's content, the rank
//! and `linalg::SVD_BASIS_VERSION`, which pins faer; cuSOLVER's bases differ from faer's by
//! about one f32 ulp in a few elements (6 of 655,360 at 5120², BENCHMARKS.md "GPU"), so a
//! cache filled on CUDA would make a later CPU merge's output depend on which route ran first.
//! One engine keeps the cache portable between routes and machines without a cuSOLVER version
//! in the key. It costs time on a first merge: on an H100 host, faer on 16 threads took 14.5 s
//! for a 5120² basis against 4.3 s for `gesvd`, and an SA3-small -xs merge on CUDA 10-12 s
//! against 8.3 s (the merge runs one SVD per worker in parallel); a cached basis is never
//! computed again.

#![allow(non_snake_case)]

use std::sync::{Condvar, Mutex};

use faer::Par;

use super::error::MergeError;
use super::math::{Factors, Step, Update};
use super::report::DeviceRecord;
use crate::backend::{Backend, BackendError, CpuBackend, MatShape, NonFinite};
use crate::gpu::{CudaDevice, DeviceChoice, Selected, select};
use crate::io::DType;

/// Where a merge's targets are computed.
#[derive(Clone, Debug, Default)]
pub enum Compute {
    /// Row bands on the CPU (`merge::math`): the default, and what `--device cpu` picks.
    #[default]
    Cpu,
    /// Whole tensors on lanes of this CUDA device.
    Cuda(CudaDevice),
    /// Whole tensors on the CPU reference backend: the CUDA route's program, on the CPU.
    Reference,
}

/// What `--device` resolved to: where the merge runs, and a line saying why.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    /// `cpu` or `cuda` (or `cpu-reference`).
    pub used: &'static str,
    /// The device, for CUDA (name, ordinal, compute capability, memory, driver).
    pub name: Option<String>,
    /// One line for the user: what ran and why (for `auto`, why CUDA was not used).
    pub reason: String,
}

impl Compute {
    /// Resolves `--device`: `cpu` → bands; `cuda` → CUDA or the reason it is unavailable;
    /// `auto` → CUDA when the device and every library load, else bands (and why).
    pub fn select(choice: DeviceChoice) -> Result<(Compute, DeviceReport), BackendError> {
        let selection = select(choice)?;
        let compute = match selection.selected {
            Selected::Cpu => Compute::Cpu,
            Selected::Cuda(device) => Compute::Cuda(device),
        };
        let report = compute.report(selection.reason);
        Ok((compute, report))
    }

    /// `cpu`, `cuda` or `cpu-reference`.
    pub fn label(&self) -> &'static str {
        match self {
            Compute::Cpu => "cpu",
            Compute::Cuda(_) => "cuda",
            Compute::Reference => "cpu-reference",
        }
    }

    /// The report of this choice, with `reason` as the line for the user.
    pub fn report(&self, reason: String) -> DeviceReport {
        DeviceReport {
            used: self.label(),
            name: match self {
                Compute::Cuda(d) => Some(d.info().to_string()),
                _ => None,
            },
            reason,
        }
    }

    /// What the manifest records: where the targets ran, and on which device.
    pub fn record(&self) -> DeviceRecord {
        let r = self.report(String::new());
        DeviceRecord {
            used: r.used.to_string(),
            name: r.name,
        }
    }
}

/// Backend lanes shared by the worker threads of one merge: a worker takes an idle lane (or
/// makes one, up to `max`; past that it waits for one to come back), runs one target on it,
/// and gives it back. Each lane's stream, handles and pinned buffers are reused, and at most
/// `max` whole targets are resident at once, which bounds host and device memory (a 14B FFN
/// weight is 283 MB in f32) whatever the thread count; the other workers keep reading and
/// copying untouched tensors meanwhile.
///
/// # After a device fault
/// A lane whose work fails with a device error ([`LaneFault`]) is leaked, not dropped:
/// cudarc's cuBLAS and cuSOLVER handles `unwrap` their destroy calls, which fail after a
/// sticky device error, so running those destructors would turn the error into a panic. The
/// error itself goes back to the caller (the merge reports it as `MergeError::Device`), the
/// lane's place is freed, and the other lanes keep working. Once any lane has faulted, the
/// idle lanes are leaked too when the pool is dropped, for the same reason. An error about
/// the data (a non-finite value, an I/O error) leaves the lane healthy: it goes back to the
/// idle list.
pub struct Lanes<B> {
    pool: Mutex<Pool<B>>,
    returned: Condvar,
    max: usize,
    make: Box<dyn Fn() -> Result<B, BackendError> + Send + Sync>,
}

struct Pool<B> {
    idle: Vec<B>,
    /// Lanes in existence (idle or in use).
    made: usize,
    /// Lanes leaked after a device fault.
    leaked: usize,
}

/// Whether an error leaves the lane it happened on unusable.
pub trait LaneFault {
    /// True for a failed CUDA call (the lane's stream, or the whole context, may carry a
    /// sticky error); false for an error about the data, which leaves the lane healthy.
    fn is_device_fault(&self) -> bool;
}

impl LaneFault for BackendError {
    fn is_device_fault(&self) -> bool {
        !matches!(
            self,
            BackendError::Linalg(_) | BackendError::UnsupportedDType(_)
        )
    }
}

impl LaneFault for MergeError {
    fn is_device_fault(&self) -> bool {
        matches!(self, MergeError::Device { source, .. } if source.is_device_fault())
    }
}

thread_local! {
    /// Lanes the current thread holds (any pool): more than zero only while it runs a lane's
    /// work, or work it stole from rayon during it.
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The most lanes a merge opens by default: two keep the device busy while a third target
/// is read or written; more only cost memory.
pub const MAX_LANES: usize = 3;

impl<B: Backend> Lanes<B> {
    /// A pool of at most `max` (≥ 1) lanes made with `make`.
    pub fn new(
        max: usize,
        make: impl Fn() -> Result<B, BackendError> + Send + Sync + 'static,
    ) -> Lanes<B> {
        Lanes {
            pool: Mutex::new(Pool {
                idle: Vec::new(),
                made: 0,
                leaked: 0,
            }),
            returned: Condvar::new(),
            max: max.max(1),
            make: Box::new(make),
        }
    }

    /// Runs `f` on a lane attached to the calling thread; `Err` when no lane could be made
    /// or attached. A lane that could not be attached or whose work failed with a device
    /// error is leaked, never reused or dropped (see "After a device fault"); after any
    /// other error it is reused.
    pub fn with<T, E: LaneFault>(
        &self,
        f: impl FnOnce(&mut B) -> Result<T, E>,
    ) -> Result<Result<T, E>, BackendError> {
        let mut lane = self.take()?;
        let held = Held::new(self);
        let result = lane.attach().map(|()| f(&mut lane));
        let faulted = match &result {
            Err(_) => true,
            Ok(Err(e)) => e.is_device_fault(),
            Ok(Ok(_)) => false,
        };
        if faulted {
            held.leak(lane);
        } else {
            held.finish(lane);
        }
        result
    }

    /// Lanes leaked after device faults so far.
    pub fn leaked(&self) -> usize {
        self.lock().leaked
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool<B>> {
        // A worker that panicked while holding the lock left the pool consistent (every
        // update is a single push, pop or counter step), so a poisoned lock is still usable.
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An idle lane, a new one while fewer than `max` exist, else the next one returned.
    ///
    /// A thread that already holds a lane never waits: it gets a new lane past `max`. That
    /// happens when work inside a lane calls into rayon (the CPU reference backend's SVD runs
    /// in its own pool, and a rayon worker that waits on another pool steals jobs of its
    /// own meanwhile, one of which may be the next target): waiting there would hold one lane
    /// while waiting for another, and with every lane held that way the merge would hang.
    fn take(&self) -> Result<B, BackendError> {
        let nested = HELD.with(|h| h.get()) > 0;
        let mut pool = self.lock();
        loop {
            if let Some(lane) = pool.idle.pop() {
                return Ok(lane);
            }
            if pool.made < self.max || nested {
                pool.made += 1;
                drop(pool);
                return (self.make)().inspect_err(|_| {
                    self.lock().made -= 1;
                    self.returned.notify_one();
                });
            }
            pool = self.returned.wait(pool).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A lane in use by the current thread. Dropped without [`Held::finish`] (the work panicked
/// and the lane went with the unwinding), it still gives the lane's place back, so workers
/// waiting for a lane see the panic instead of waiting forever.
struct Held<'l, B: Backend> {
    lanes: &'l Lanes<B>,
    finished: bool,
}

impl<'l, B: Backend> Held<'l, B> {
    fn new(lanes: &'l Lanes<B>) -> Held<'l, B> {
        HELD.with(|h| h.set(h.get() + 1));
        Held {
            lanes,
            finished: false,
        }
    }

    /// Returns `lane` to the idle list.
    fn finish(mut self, lane: B) {
        self.lanes.lock().idle.push(lane);
        self.finished = true;
    }

    /// Leaks `lane` (its destructors are never run) and gives its place up.
    fn leak(mut self, lane: B) {
        std::mem::forget(lane);
        let mut pool = self.lanes.lock();
        pool.made -= 1;
        pool.leaked += 1;
        self.finished = true;
    }
}

impl<B> Drop for Lanes<B> {
    fn drop(&mut self) {
        let pool = self.pool.get_mut().unwrap_or_else(|e| e.into_inner());
        if pool.leaked > 0 {
            // A device fault may have left the context unusable: destroying these lanes' handles
            // would panic (see "After a device fault").
            for lane in pool.idle.drain(..) {
                std::mem::forget(lane);
            }
        }
    }
}

impl<B: Backend> Drop for Held<'_, B> {
    fn drop(&mut self) {
        HELD.with(|h| h.set(h.get() - 1));
        if !self.finished {
            self.lanes.lock().made -= 1;
        }
        self.lanes.returned.notify_one();
    }
}

/// The CPU reference backend's lanes (sequential inside a target; targets run in parallel).
pub fn reference_lanes() -> Lanes<CpuBackend> {
    Lanes::new(MAX_LANES, || Ok(CpuBackend::new(Par::Seq)))
}

/// The base weight of a target, as the whole-tensor program reads it.
#[derive(Clone, Copy, Debug)]
pub enum BaseWeight<'a> {
    /// Stored bytes of the (out, in') PyTorch-layout matrix, widened on the backend.
    Stored {
        /// Their dtype.
        dtype: DType,
        /// Little-endian storage.
        bytes: &'a [u8],
    },
    /// The matrix already widened (and permuted into PyTorch layout) on the host.
    F32(&'a [f32]),
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
    use crate::backend::HostMat;
    use crate::merge::math::{Form, SA3_EPS, Scratch, add_contribution as add_band, column_scales};

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
    fn lanes_are_reused_and_a_faulted_lane_is_replaced() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let made = Arc::new(AtomicUsize::new(0));
        let counter = made.clone();
        let lanes = Lanes::new(2, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(CpuBackend::new(Par::Seq))
        });
        for _ in 0..3 {
            lanes.with(|b| b.zeros(1, 1).map(|_| ())).unwrap().unwrap();
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
        let failed = lanes.with(|_| Err::<(), _>(BackendError::cuda("injected", "fault")));
        assert!(failed.unwrap().is_err());
        lanes.with(|_| Ok::<(), BackendError>(())).unwrap().unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(lanes.leaked(), 1);
    }

    /// Issue 18, item 3: an error about the data (not the device) keeps its lane.
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
        let non_finite = MergeError::NonFiniteResult {
            tensor: "w".into(),
            component: String::new(),
            row: 0,
            col: 0,
            value: f32::NAN,
        };
        assert!(lanes.with(|_| Err::<(), _>(non_finite)).unwrap().is_err());
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
        // One target on the whole-tensor program, as merge::exec runs it.
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
        assert!(matches!(err, MergeError::Device { .. }), "{err:?}");
        assert!(err.to_string().contains("an illegal address"), "{err}");
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

    #[test]
    fn lanes_never_exceed_their_maximum_under_contention() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (made, busy, peak) = (
            Arc::new(AtomicUsize::new(0)),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let counter = made.clone();
        let lanes = Lanes::new(2, move || {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(CpuBackend::new(Par::Seq))
        });
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    for _ in 0..20 {
                        lanes
                            .with(|_| {
                                let now = busy.fetch_add(1, Ordering::SeqCst) + 1;
                                peak.fetch_max(now, Ordering::SeqCst);
                                std::thread::sleep(std::time::Duration::from_micros(200));
                                busy.fetch_sub(1, Ordering::SeqCst);
                                Ok::<(), BackendError>(())
                            })
                            .unwrap()
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(made.load(Ordering::SeqCst), 2);
        assert_eq!(peak.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_panic_on_a_lane_gives_its_place_back() {
        let lanes = Lanes::new(1, || Ok(CpuBackend::new(Par::Seq)));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            lanes.with(|_| -> Result<(), BackendError> { panic!("injected") })
        }));
        assert!(panicked.is_err());
        assert_eq!(lanes.lock().made, 0);
        // The only place is free again: this would wait forever otherwise.
        lanes.with(|_| Ok::<(), BackendError>(())).unwrap().unwrap();
    }

    #[test]
    fn a_thread_that_holds_a_lane_is_never_made_to_wait_for_another() {
        // One lane allowed; work on it asks for a second (what rayon's work stealing does
        // when a lane's work waits on another pool): it gets a new lane instead of hanging.
        let lanes = Lanes::new(1, || Ok(CpuBackend::new(Par::Seq)));
        let inner = lanes.with(|_| lanes.with(|b| b.zeros(1, 1).map(|m| m.len())));
        assert_eq!(inner.unwrap().unwrap().unwrap(), 1);
        assert_eq!(lanes.lock().made, 2);
    }
}
