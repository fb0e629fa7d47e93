//! Host ↔ device copies through two pinned buffers, so host work and transfers overlap.
//!
//! Owns: [`Staging`]. Does not own: what is copied (`super::cuda`).
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

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice,
    result as driver,
};

use super::error::GpuError;

/// Bytes per pinned buffer (two per direction per lane).
pub(crate) const CHUNK_BYTES: usize = 8 << 20;

/// Two pinned buffers and the events that say when the device is done with each.
pub(crate) struct Staging {
    bufs: [PinnedHostSlice<u8>; 2],
    done: [CudaEvent; 2],
}

impl Staging {
    /// Allocates two pinned buffers of [`CHUNK_BYTES`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Staging, GpuError> {
        let pinned = || {
            // SAFETY: cuMemHostAlloc returns CHUNK_BYTES of uninitialised page-locked memory;
            // u8 has no invalid values, and only bytes written by this module are ever
            // copied to the device or read back.
            unsafe { ctx.alloc_pinned_with_flags::<u8>(CHUNK_BYTES, 0) }
                .map_err(|e| GpuError::cuda(format!("allocating {CHUNK_BYTES} pinned bytes"), e))
        };
        let event = || {
            ctx.new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
                .map_err(|e| GpuError::cuda("creating a staging event", e))
        };
        Ok(Staging {
            bufs: [pinned()?, pinned()?],
            done: [event()?, event()?],
        })
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
    ) -> Result<(), GpuError> {
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
                .map_err(|e| GpuError::cuda("waiting for a staging buffer", e))?;
            let pinned = self.bufs[slot]
                .as_mut_slice()
                .map_err(|e| GpuError::cuda("mapping a staging buffer", e))?;
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
            .map_err(|e| GpuError::cuda("queuing a host-to-device copy", e))?;
            self.done[slot]
                .record(stream)
                .map_err(|e| GpuError::cuda("recording a staging event", e))?;
        }
        Ok(())
    }

    /// Waits until the device no longer reads or writes either pinned buffer.
    fn quiesce(&self) -> Result<(), GpuError> {
        for done in &self.done {
            done.synchronize()
                .map_err(|e| GpuError::cuda("waiting for a staging buffer", e))?;
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
    ) -> Result<(), GpuError> {
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
        let queue = |this: &mut Staging, c: usize| -> Result<(), GpuError> {
            let slot = c % 2;
            let pinned = this.bufs[slot]
                .as_mut_slice()
                .map_err(|e| GpuError::cuda("mapping a staging buffer", e))?;
            let offset = (c * CHUNK_BYTES) as u64;
            // SAFETY: copies len(c) bytes of `src` from device offset c·CHUNK_BYTES (within its
            // `capacity`, asserted) into pinned buffer `slot`. The CPU reads that buffer only
            // after `done[slot]`, recorded right after this copy, has completed, and queues the
            // next copy into it only after it has finished reading it.
            unsafe {
                driver::memcpy_dtoh_async(&mut pinned[..len(c)], base + offset, stream.cu_stream())
            }
            .map_err(|e| GpuError::cuda("queuing a device-to-host copy", e))?;
            this.done[slot]
                .record(stream)
                .map_err(|e| GpuError::cuda("recording a staging event", e))
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
                .map_err(|e| GpuError::cuda("waiting for a device-to-host copy", e))?;
            let pinned = self.bufs[slot]
                .as_slice()
                .map_err(|e| GpuError::cuda("mapping a staging buffer", e))?;
            host[c * CHUNK_BYTES..c * CHUNK_BYTES + len(c)].copy_from_slice(&pinned[..len(c)]);
        }
        Ok(())
    }
}

impl Drop for Staging {
    /// An upload returns with its last copies still in flight; the pinned memory must not be
    /// freed under them (after an error, a lane can be dropped with copies queued).
    fn drop(&mut self) {
        let _ = self.quiesce();
    }
}
