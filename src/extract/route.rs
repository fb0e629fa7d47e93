//! Where extraction's truncated SVDs run: on the calling worker with faer, or on CUDA lanes.
//!
//! Owns: [`SvdRoute`] (made once per extraction from `--device`'s [`Compute`]), how many
//! lanes a CUDA route opens (one per worker, at most what the device's memory holds for the
//! largest ΔW), and the one call every module's spectrum goes through
//! ([`SvdRoute::spectrum`]). Does not own: the algorithm (`linalg::truncated`, written once
//! for every engine), the engines (`linalg::FaerEngine`, `gpu::CudaEngine`), the lane pool
//! (`pipeline::Lanes`), or how many triplets a module needs (`factor::spectrum`).
//!
//! On CUDA a worker holds one lane for a module's whole spectrum: ΔW is uploaded once, the
//! range finder's products run on cuBLAS `dgemm` and a full SVD on cuSOLVER `gesvd`, while
//! the QRs and the projection's small SVD run on the worker's CPU core (`linalg::truncated`,
//! "Where the big steps run"). The factors agree with the CPU route's to f32 rounding, not bit
//! for bit (`gpu::truncate`, "Agreement with the CPU engine"); the report and the manifest
//! record which route ran.

use faer::MatRef;

use super::ExtractError;
use super::factor::{Spectrum, frobenius_sq, spectrum};
use super::rank::RankRule;
use crate::backend::BackendError;
use crate::gpu::{CudaBackend, CudaEngine};
use crate::linalg::{FaerEngine, TruncMethod};
use crate::pipeline::Lanes;
use crate::pipeline::{Compute, DeviceRecord};

/// Device memory a lane may need per element of the largest ΔW: the f64 matrix the products
/// read, and `gesvd`'s input, left vectors and right vectors when a full SVD runs (at most
/// four matrices of that size).
const LANE_BYTES_PER_ELEMENT: usize = 4 * std::mem::size_of::<f64>();

/// Device memory a lane needs besides: the cuBLAS workspace, the solver's work arrays and
/// the range finder's blocks (a generous bound).
const LANE_FIXED_BYTES: usize = 256 << 20;

/// Where the SVDs of one extraction run.
pub enum SvdRoute {
    /// faer on the worker thread (`--device cpu`, or `auto` without a GPU).
    Host,
    /// Lanes of a CUDA device, and its record for the report.
    Cuda {
        /// The lanes, shared by the workers.
        lanes: Lanes<CudaBackend>,
        /// `cuda` and the device.
        record: DeviceRecord,
    },
}

impl SvdRoute {
    /// The route for `compute`; `largest` is the element count of the largest ΔW, which
    /// bounds the lanes a CUDA route opens (at most four f64 matrices of that size a lane).
    pub fn new(compute: &Compute, largest: usize) -> SvdRoute {
        let Compute::Cuda(device) = compute else {
            return SvdRoute::Host;
        };
        let per_lane = largest
            .saturating_mul(LANE_BYTES_PER_ELEMENT)
            .saturating_add(LANE_FIXED_BYTES);
        let fit = (device.info().total_memory / 4 * 3) / per_lane;
        let lanes = fit.clamp(1, rayon::current_num_threads().max(1));
        let record = compute.record();
        let device = device.clone();
        SvdRoute::Cuda {
            lanes: Lanes::new(lanes, move || device.backend()),
            record,
        }
    }

    /// What the report records: `cpu`, or `cuda` and the device.
    pub fn record(&self) -> DeviceRecord {
        match self {
            SvdRoute::Host => Compute::Cpu.record(),
            SvdRoute::Cuda { record, .. } => record.clone(),
        }
    }

    /// The spectrum of module `module`'s ΔW `d` ((out, in) row-major f64) for `rule`,
    /// `max_rank` and `method` (`factor::spectrum`), on this route.
    #[allow(clippy::too_many_arguments)]
    pub fn spectrum(
        &self,
        module: &str,
        d: &[f64],
        (out, inp): (usize, usize),
        rule: Option<&RankRule>,
        max_rank: usize,
        method: TruncMethod,
    ) -> Result<Spectrum, ExtractError> {
        let total = frobenius_sq(d);
        match self {
            SvdRoute::Host => {
                let mut host = FaerEngine(MatRef::from_row_major_slice(d, out, inp));
                spectrum(&mut host, total, rule, max_rank, method).map_err(|source| {
                    ExtractError::Svd {
                        module: module.to_string(),
                        source,
                    }
                })
            }
            SvdRoute::Cuda { lanes, .. } => lanes
                .with(|lane| {
                    let mut held = CudaEngine::new(lane, d, out, inp);
                    spectrum(&mut held, total, rule, max_rank, method)
                })
                .and_then(|r| r)
                .map_err(|e| device_error(module, e)),
        }
    }
}

/// A CUDA route's failure: the SVD's own errors read as on the CPU route, the others name
/// the device.
fn device_error(module: &str, e: BackendError) -> ExtractError {
    match e {
        BackendError::Linalg(source) => ExtractError::Svd {
            module: module.to_string(),
            source,
        },
        source => ExtractError::Device {
            module: module.to_string(),
            source,
        },
    }
}
