//! Where a plan's targets are computed, and the backend lanes the device routes share.
//!
//! Owns: [`Compute`] (row bands on the CPU, whole tensors on CUDA lanes, or whole tensors on
//! the CPU reference backend), [`Compute::select`] (`--device` → what runs, and why),
//! [`DeviceRecord`] (what the manifest records) and [`Lanes`] (backend lanes shared by the
//! worker threads of one run: merges and `extract`'s SVDs). Does not own: the ops (`backend`,
//! `gpu`) or what runs on a lane (the merge's whole-tensor program, `merge::device`;
//! `extract::route`'s SVDs).

use std::sync::{Condvar, Mutex};

use faer::Par;

use crate::backend::{Backend, BackendError, CpuBackend};
use crate::gpu::{CudaDevice, DeviceChoice, Selected, select};
use crate::linalg::SvdEngine;

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

    /// The engine of the -xs bases a merge on this route computes: faer on the CPU routes
    /// (the reference route's `CpuBackend::xs_bases` is `linalg::xs_bases`), cuSOLVER on the
    /// CUDA lanes (`CudaBackend::xs_bases`).
    pub fn svd_engine(&self) -> SvdEngine {
        match self {
            Compute::Cpu | Compute::Reference => SvdEngine::Faer,
            Compute::Cuda(d) => d.info().svd_engine(),
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
            // A producer of an ordered output waiting here is blocked for the writes of
            // others: the lanes it waits for may be held by those very writes.
            pool = crate::release::ordered::waiting_elsewhere(|| self.returned.wait(pool))
                .unwrap_or_else(|e| e.into_inner());
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

/// Where the targets were computed (`--device`), as the manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceRecord {
    /// `cpu` (row bands), `cuda` (whole tensors on the GPU) or `cpu-reference`.
    pub used: String,
    /// The CUDA device (name, ordinal, compute capability, memory, driver), for `cuda`.
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MatShape;

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

    /// A producer of an ordered output that waits for a lane is blocked for the writes of
    /// others (`release::ordered::waiting_elsewhere`): here the one lane is held by a write far
    /// ahead of the front, which may wait only on producers that keep writing, and the
    /// producer of the front waits for that lane. Before the fix this hung (a CUDA -xs merge
    /// of SA3-small on an H200: bases computed on a lane while lanes were held by writes).
    #[test]
    fn a_producer_waiting_for_a_lane_does_not_hold_up_a_write_that_holds_one() {
        use crate::release::ordered::{Geometry, NewFile, OrderedFiles};
        use std::sync::mpsc::channel;
        const C: usize = 4096;
        let bytes: Vec<u8> = (0..3 * C).map(|i| (i * 7 + i / C) as u8).collect();
        let (done, result) = channel();
        let want = bytes.clone();
        std::thread::spawn(move || {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let files = vec![NewFile {
                path: path.clone(),
                len: want.len() as u64,
                tensors: None,
                gaps: Vec::new(),
            }];
            let geometry = Geometry {
                chunk: C,
                window: 1,
                small: 0,
            };
            let (out, _) =
                OrderedFiles::create_with(files, false, |f, l| f.set_len(l), geometry).unwrap();
            let lanes = Lanes::new(1, || Ok(CpuBackend::new(Par::Seq)));
            let mut producers = out.producers(2).into_iter();
            let (front, ahead) = (producers.next().unwrap(), producers.next().unwrap());
            drop(producers);
            let (held_tx, held) = channel();
            let (started_tx, started) = channel();
            std::thread::scope(|s| {
                let (out, lanes, want) = (&out, &lanes, &want);
                s.spawn(move || {
                    ahead.start_item(0, 2 * C as u64);
                    started.recv().unwrap();
                    lanes
                        .with(|_| {
                            held_tx.send(()).unwrap();
                            out.write(0, 2 * C as u64, &want[2 * C..]).unwrap();
                            Ok::<(), BackendError>(())
                        })
                        .unwrap()
                        .unwrap();
                    drop(ahead);
                });
                s.spawn(move || {
                    front.start_item(0, 0);
                    started_tx.send(()).unwrap();
                    held.recv().unwrap();
                    lanes
                        .with(|_| {
                            out.write(0, 0, &want[..2 * C]).unwrap();
                            Ok::<(), BackendError>(())
                        })
                        .unwrap()
                        .unwrap();
                    drop(front);
                });
            });
            out.finish(false, None).unwrap();
            let _ = done.send(std::fs::read(&path).unwrap());
        });
        match result.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(written) => assert!(written == bytes, "the file holds other bytes"),
            Err(e) => panic!("the merge's writes hung or failed: {e}"),
        }
    }
}
