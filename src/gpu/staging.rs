//! Host ↔ device copies through two pinned buffers, so host work and transfers overlap.
//!
//! Owns: [`PinnedStaging`]. Does not own: what is copied (`super::cuda`).
//!
//! An upload walks the host bytes in chunks of [`CHUNK_BYTES`]. Chunk c is copied by the CPU
//! into pinned buffer c mod 2 (for a tensor borrowed from an mmap, this memcpy is where the
//! file is actually read), then an asynchronous host-to-device copy of that buffer is queued
//! on the stream and an event recorded after it. Before the CPU refills a buffer it waits for
//! that buffer's event, so chunk c+1 is read from disk while chunk c crosses PCIe. A download
//! queues the device-to-host copy of chunk c+1 before the CPU copies chunk c out of its
//! pinned buffer, the same overlap in the other direction.
//!
//! Pinned memory is allocated without `CU_MEMHOSTALLOC_WRITECOMBINED` (cudarc's default),
//! because downloads read it from the CPU and write-combined memory is uncached for reads.
//!
//! The events are created with `CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC` ([`Event`]):
//! they only order work, and an event that records timing costs more to record and to wait
//! on; a blocking wait sleeps instead of spinning a core the merge's workers need. (cudarc's
//! `CudaEvent` takes one flag of its enum, not a combination, so this module wraps the raw
//! event.) The device reports an asynchronous fault of a kernel at the next call that
//! touches the stream, which here is usually a staging copy or wait: the error then names the
//! last work launched on the lane ([`PinnedStaging::note_launch`]), not only the copy.

use std::sync::Arc;

use cudarc::driver::sys::{self as driver_sys, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, PinnedHostSlice,
    result as driver,
};

use crate::backend::BackendError;

/// Bytes per pinned buffer (two per direction per lane).
pub(crate) const CHUNK_BYTES: usize = 8 << 20;

/// The flags of every staging event.
pub(crate) const EVENT_FLAGS: u32 =
    CUevent_flags::CU_EVENT_DISABLE_TIMING as u32 | CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;

/// A CUDA event created with [`EVENT_FLAGS`].
pub(crate) struct Event {
    event: driver_sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent handle may be used from any thread once its context is current there;
// every use below binds the context first (`Event::new`, `record`'s stream is of this
// context, `synchronize` needs no current context, `drop` binds).
unsafe impl Send for Event {}

impl Event {
    /// A new event in `ctx`.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Event, DriverError> {
        ctx.bind_to_thread()?;
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one CUevent through a valid pointer; the flags are a valid
        // combination of CU_EVENT_* bits and the context is current.
        unsafe { driver_sys::cuEventCreate(&mut event, EVENT_FLAGS) }.result()?;
        Ok(Event {
            event,
            ctx: ctx.clone(),
        })
    }

    /// Records the event after the work queued so far on `stream`.
    pub fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: `self.event` is live; `stream` belongs to the same context.
        unsafe { driver_sys::cuEventRecord(self.event, stream.cu_stream()) }.result()
    }

    /// Waits until the recorded work is done (returns at once if nothing was recorded).
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: `self.event` is live.
        unsafe { driver_sys::cuEventSynchronize(self.event) }.result()
    }

    /// `cuEventElapsedTime` between this event and `end`: an error for these events, which
    /// record no timing (the tests check the flag through it).
    #[cfg(test)]
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, DriverError> {
        let mut ms = 0.0f32;
        // SAFETY: both events are live; the call writes one f32 through a valid pointer.
        unsafe { driver_sys::cuEventElapsedTime_v2(&mut ms, self.event, end.event) }
            .result()
            .map(|()| ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // After a device fault the lanes are leaked (`pipeline::Lanes`), so this runs on
        // a healthy context; an error here has nothing left to report to.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `self.event` is live and destroyed once.
            let _ = unsafe { driver_sys::cuEventDestroy_v2(self.event) };
        }
    }
}

/// Two pinned buffers and the events that say when the device is done with each.
pub(crate) struct PinnedStaging {
    bufs: [PinnedHostSlice<u8>; 2],
    done: [Event; 2],
    /// The last kernel, GEMM or solver call queued on the lane (see the module doc).
    last_launch: Option<String>,
}

impl PinnedStaging {
    /// Allocates two pinned buffers of [`CHUNK_BYTES`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<PinnedStaging, BackendError> {
        let pinned = || {
            // SAFETY: cuMemHostAlloc returns CHUNK_BYTES of uninitialised page-locked memory;
            // u8 has no invalid values, and only bytes written by this module are ever
            // copied to the device or read back.
            unsafe { ctx.alloc_pinned_with_flags::<u8>(CHUNK_BYTES, 0) }.map_err(|e| {
                BackendError::cuda(format!("allocating {CHUNK_BYTES} pinned bytes"), e)
            })
        };
        let event =
            || Event::new(ctx).map_err(|e| BackendError::cuda("creating a staging event", e));
        Ok(PinnedStaging {
            bufs: [pinned()?, pinned()?],
            done: [event()?, event()?],
            last_launch: None,
        })
    }

    /// Remembers `what` (e.g. `'widen_bf16' (kernels/convert.cu)`) as the last work launched
    /// on the lane, to be named by a later wait's error.
    pub fn note_launch(&mut self, what: impl Into<String>) {
        self.last_launch = Some(what.into());
    }

    /// The error of a wait or a synchronous copy on the lane's stream: `op` failed with `e`,
    /// naming the last launched work, where an asynchronous fault of it would surface.
    pub fn wait_error(&self, op: &str, e: impl std::fmt::Display) -> BackendError {
        after_launch(op, e, self.last_launch.as_deref())
    }

    /// The events, for the tests.
    #[cfg(test)]
    pub(crate) fn events(&self) -> &[Event; 2] {
        &self.done
    }

    /// Copies `host` into the start of `dst` (`host.len()` must not exceed its byte length),
    /// queued on `stream`. On return the host slice is no longer needed; the last chunks may
    /// still be in flight, ordered before any later work on `stream`.
    #[track_caller]
    pub fn upload<T>(
        &mut self,
        stream: &Arc<CudaStream>,
        host: &[u8],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), BackendError> {
        let capacity = dst.len() * std::mem::size_of::<T>();
        assert!(
            host.len() <= capacity,
            "upload: {} bytes into {capacity}",
            host.len()
        );
        let (base, _record) = dst.device_ptr_mut(stream);
        for (c, chunk) in host.chunks(CHUNK_BYTES).enumerate() {
            let slot = c % 2;
            self.done[slot]
                .synchronize()
                .map_err(|e| self.wait_error("waiting for a staging buffer", e))?;
            let pinned = self.bufs[slot].as_mut_slice().map_err(|e| {
                after_launch("mapping a staging buffer", e, self.last_launch.as_deref())
            })?;
            pinned[..chunk.len()].copy_from_slice(chunk);
            let offset = (c * CHUNK_BYTES) as u64;
            // SAFETY: copies chunk.len() bytes from pinned buffer `slot` (CHUNK_BYTES long) to
            // device bytes [offset, offset + chunk.len()) of `dst`, within its `capacity`
            // (asserted). The pinned buffer is not written again until `done[slot]`, recorded
            // right after this copy, has completed; `dst` outlives the copy because later
            // users of `dst` are ordered after it on `stream` and its drop is stream-ordered.
            unsafe {
                driver::memcpy_htod_async(base + offset, &pinned[..chunk.len()], stream.cu_stream())
            }
            .map_err(|e| self.wait_error("queuing a host-to-device copy", e))?;
            self.done[slot]
                .record(stream)
                .map_err(|e| self.wait_error("recording a staging event", e))?;
        }
        Ok(())
    }

    /// Waits until the device no longer reads or writes either pinned buffer.
    fn quiesce(&self) -> Result<(), BackendError> {
        for done in &self.done {
            done.synchronize()
                .map_err(|e| self.wait_error("waiting for a staging buffer", e))?;
        }
        Ok(())
    }

    /// Copies the first `host.len()` bytes of `src` into `host`, waiting for all work queued
    /// on `stream` before it.
    #[track_caller]
    pub fn download<T>(
        &mut self,
        stream: &Arc<CudaStream>,
        src: &CudaSlice<T>,
        host: &mut [u8],
    ) -> Result<(), BackendError> {
        let capacity = src.len() * std::mem::size_of::<T>();
        assert!(
            host.len() <= capacity,
            "download: {} bytes from {capacity}",
            host.len()
        );
        let (base, _record) = src.device_ptr(stream);
        let total = host.len();
        let chunks = total.div_ceil(CHUNK_BYTES);
        let len = |c: usize| CHUNK_BYTES.min(total - c * CHUNK_BYTES);
        let queue = |this: &mut PinnedStaging, c: usize| -> Result<(), BackendError> {
            let slot = c % 2;
            let pinned = this.bufs[slot].as_mut_slice().map_err(|e| {
                after_launch("mapping a staging buffer", e, this.last_launch.as_deref())
            })?;
            let offset = (c * CHUNK_BYTES) as u64;
            // SAFETY: copies len(c) bytes of `src` from device offset c·CHUNK_BYTES (within its
            // `capacity`, asserted) into pinned buffer `slot`. The CPU reads that buffer only
            // after `done[slot]`, recorded right after this copy, has completed, and queues the
            // next copy into it only after it has finished reading it.
            unsafe {
                driver::memcpy_dtoh_async(&mut pinned[..len(c)], base + offset, stream.cu_stream())
            }
            .map_err(|e| this.wait_error("queuing a device-to-host copy", e))?;
            this.done[slot]
                .record(stream)
                .map_err(|e| this.wait_error("recording a staging event", e))
        };
        if chunks > 0 {
            queue(self, 0)?;
        }
        for c in 0..chunks {
            if c + 1 < chunks {
                queue(self, c + 1)?;
            }
            let slot = c % 2;
            self.done[slot]
                .synchronize()
                .map_err(|e| self.wait_error("waiting for a device-to-host copy", e))?;
            let pinned = self.bufs[slot].as_slice().map_err(|e| {
                after_launch("mapping a staging buffer", e, self.last_launch.as_deref())
            })?;
            host[c * CHUNK_BYTES..c * CHUNK_BYTES + len(c)].copy_from_slice(&pinned[..len(c)]);
        }
        Ok(())
    }
}

impl Drop for PinnedStaging {
    /// An upload returns with its last copies still in flight; the pinned memory must not be
    /// freed under them (after an error, a lane can be dropped with copies queued).
    fn drop(&mut self) {
        let _ = self.quiesce();
    }
}

/// `op` failed with `e`; `last` is the last work launched on the lane, if any.
pub(crate) fn after_launch(
    op: &str,
    e: impl std::fmt::Display,
    last: Option<&str>,
) -> BackendError {
    match last {
        Some(last) => BackendError::cuda(
            format!(
                "{op} (an asynchronous fault of the last work launched on this lane, {last}, \
                 is reported here)"
            ),
            e,
        ),
        None => BackendError::cuda(op, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18, item 6: a wait after a launch names the launched kernel.
    #[test]
    fn a_wait_error_names_the_last_launched_kernel() {
        let e = after_launch(
            "waiting for a device-to-host copy",
            "CUDA_ERROR_ILLEGAL_ADDRESS",
            Some("'widen_bf16' (kernels/convert.cu)"),
        );
        assert_eq!(
            e.to_string(),
            "CUDA: waiting for a device-to-host copy (an asynchronous fault of the last work \
             launched on this lane, 'widen_bf16' (kernels/convert.cu), is reported here): \
             CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        let e = after_launch("waiting for a staging buffer", "x", None);
        assert_eq!(e.to_string(), "CUDA: waiting for a staging buffer: x");
    }

    /// Issue 18, item 6: the staging events record no timing (`cuEventElapsedTime` refuses
    /// them). Needs a device; skipped with a message without one.
    #[test]
    fn staging_events_record_no_timing() {
        let device = match crate::gpu::CudaDevice::open(0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        let staging = PinnedStaging::new(&device.ctx).unwrap();
        let stream = device.ctx.default_stream();
        let [a, b] = staging.events();
        a.record(&stream).unwrap();
        b.record(&stream).unwrap();
        b.synchronize().unwrap();
        assert!(a.elapsed_ms(b).is_err(), "the events record timing");
    }
}
