//! A planned layout conversion, and the copy-or-convert loop that runs each of its pieces.
//!
//! Owns: `Conversion` (a read plan, a write plan and the output dtypes fused into jobs, one
//! per piece: stored tensor, layer, one composed transform, destination byte offset) and
//! `convert_piece` (one piece, band by band, into positional writes, each band checked for
//! values its dtype cannot hold). Does not own: the
//! job loop that runs the pieces (`pipeline::exec`, the one executor of every producing
//! command), files, headers, atomic commit (`io`).
//!
//! Memory: a piece is converted in bands of at most `band_bytes` destination bytes into the
//! caller's buffer and handed on at its final offset, so a stacked output is filled layer by
//! layer in place (no (L, ...) buffer, no O(L²) copies). Output bytes do not depend on the
//! band size or the order pieces run in: every byte is written exactly once, by a pure
//! function of the input.

use std::collections::HashMap;

use super::dtype_policy::{KeepF32, OutputDType, decide_dtypes};
use super::write::WritePlan;
use crate::codec::dtype::{Unheld, all_finite_bytes, held_limit};
use crate::format::header_layout::PlannedTensor;
use crate::io::DType;
use crate::model::animate::Constant;
use crate::model::plan_error::PlanError;
use crate::model::read_plan::ReadPlan;
use crate::model::transform::{self, KernelError, SrcTensor, Transform};
use crate::model::wan_layout::Layout;

/// Destination bytes a copy or conversion handles at once, per worker, unless tuned
/// ([`ExecOptions::band_bytes`](crate::pipeline::ExecOptions::band_bytes)); the output
/// does not depend on it.
pub const PIECE_BAND_BYTES: usize = 8 << 20;

/// Writes `transform(src)` converted to `dtype` (raw byte moves when the dtypes are equal,
/// else widened and rounded once), band by band, through `write(byte offset in the piece,
/// bytes)`: the one copy-or-convert loop of every producing command (`restack`, `convert`,
/// the untouched tensors of `merge`). At most `band_bytes` (at least one destination row)
/// are held in `buf` at a time; an identity transform is treated as one flat run, so a
/// large 1-D tensor is banded too, and an identity copy in the same dtype (any dtype,
/// packed sub-byte ones included) is written straight from `src` without `buf`. The output
/// bytes do not depend on `band_bytes`.
///
/// Returns the values written as NaN or ±inf (non-finite in `src`, or finite ones beyond
/// `dtype`'s range: `codec::dtype::held_limit`), numbered in `src`'s own (stored) order, with
/// their values before rounding. Each band is checked as it is written (a byte-for-byte
/// copy too: a NaN stored in the input is still a NaN shipped), one vectorised scan of
/// the bytes just produced; only when one fails is `src` widened again to find them.
pub fn convert_piece<E>(
    transform: Transform,
    src: SrcTensor<'_>,
    dtype: DType,
    band_bytes: usize,
    buf: &mut Vec<u8>,
    mut write: impl FnMut(usize, &[u8]) -> Result<(), E>,
    kernel_err: impl Fn(KernelError) -> E,
) -> Result<Option<Unheld>, E> {
    let band_bytes = band_bytes.max(1);
    // The slow path, once a band failed its check: every value of `src`, in its order.
    let find = |src: SrcTensor<'_>| match src.dtype.is_float() {
        true => {
            let wide = crate::codec::dtype::to_f32_vec(src.dtype, src.bytes).unwrap_or_default();
            Unheld::scan(&wide, held_limit(dtype), 0)
        }
        false => None,
    };
    let mut held = true;
    if transform.keeps_order() && src.dtype == dtype {
        // Whole elements per band, so each band is checked on its own.
        let size = dtype.element_bytes();
        let step = (band_bytes / size).max(1) * size;
        for (i, chunk) in src.bytes.chunks(step).enumerate() {
            // Checked before it is written: the writer may drop the source's pages.
            held &= all_finite_bytes(dtype, chunk);
            write(i * step, chunk)?;
        }
        return Ok(if held { None } else { find(src) });
    }
    let stored = src;
    let numel: usize = src.shape.iter().product();
    let flat = [numel, 1];
    let (transform, src) = match transform.keeps_order() {
        true => (
            Transform::Identity,
            SrcTensor {
                shape: &flat,
                ..src
            },
        ),
        false => (transform, src),
    };
    let dst_size = dtype
        .size()
        .ok_or_else(|| kernel_err(KernelError::SubByte(dtype)))?;
    let (rows, row_len) = transform
        .dst_rows(src.shape)
        .map_err(|e| kernel_err(e.into()))?;
    let row_bytes = (row_len * dst_size).max(1);
    let band_rows = (band_bytes / row_bytes).max(1);
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + band_rows).min(rows);
        buf.resize((r1 - r0) * row_len * dst_size, 0);
        transform::convert_rows(transform, src, dtype, r0..r1, buf).map_err(&kernel_err)?;
        write(r0 * row_len * dst_size, buf)?;
        held &= all_finite_bytes(dtype, buf);
        r0 = r1;
    }
    Ok(if held { None } else { find(stored) })
}

/// One piece of work: a stored tensor (or one layer of it) into its place in an output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestackJob {
    /// Index of the output tensor in the write plan.
    pub output: usize,
    /// Canonical parameter moved.
    pub canonical: String,
    /// Stored tensor read.
    pub stored: String,
    /// Layer of the stored tensor, when stacked.
    pub layer: Option<usize>,
    /// Shape of the stored data (the layer's slice when stacked).
    pub stored_shape: Vec<usize>,
    /// Stored dtype.
    pub src_dtype: DType,
    /// Stored layout → output layout, composed.
    pub transform: Transform,
    /// Byte offset of the piece inside the output tensor.
    pub dst_offset: usize,
    /// A constant written instead of a stored tensor (`stored` is then empty).
    pub constant: Option<Constant>,
}

/// A fully planned conversion.
#[derive(Clone, Debug)]
pub struct Conversion {
    /// Where each canonical parameter comes from.
    pub read: ReadPlan,
    /// Where each one goes.
    pub write: WritePlan,
    /// Dtype of each output tensor (same order as `write.tensors`).
    pub dtypes: Vec<DType>,
    /// The jobs, grouped by stored tensor (in the order the read plan first needs each),
    /// layers in order: a stacked input is consumed one tensor at a time.
    pub jobs: Vec<RestackJob>,
}

impl Conversion {
    /// Plans converting everything `read` found into `to`, with dtypes from `target` and
    /// `policy`.
    pub fn new(
        read: ReadPlan,
        to: Layout,
        target: OutputDType,
        policy: &KeepF32,
    ) -> Result<Conversion, PlanError> {
        let write = WritePlan::new(to, &read.canonical_params())?;
        let dtypes = decide_dtypes(&write, &read, target, policy)?;
        let mut placed: HashMap<&str, (usize, &super::write::Piece)> = HashMap::new();
        for (i, t) in write.tensors.iter().enumerate() {
            for p in &t.pieces {
                placed.insert(p.canonical.as_str(), (i, p));
            }
        }
        let mut jobs = Vec::with_capacity(read.params.len());
        for src in &read.params {
            let Some(&(output, piece)) = placed.get(src.name.as_str()) else {
                continue; // unreachable: the write plan was built from these parameters
            };
            let transform = src
                .to_canonical
                .then(piece.from_canonical, src.stored_shape.len())
                .map_err(|e| PlanError::Rank {
                    key: src.stored.clone(),
                    reason: e.to_string(),
                })?;
            let size = dtypes[output].size().ok_or_else(|| PlanError::NonFloat {
                key: write.tensors[output].name.clone(),
                dtype: dtypes[output],
            })?;
            jobs.push(RestackJob {
                output,
                canonical: src.name.clone(),
                stored: src.stored.clone(),
                layer: src.layer,
                stored_shape: src.stored_shape.clone(),
                src_dtype: src.dtype,
                transform,
                dst_offset: piece.offset * size,
                constant: None,
            });
        }
        for (output, t) in write.tensors.iter().enumerate() {
            if let Some(c) = t.constant {
                jobs.push(RestackJob {
                    output,
                    canonical: t.name.clone(),
                    stored: String::new(),
                    layer: None,
                    stored_shape: t.shape.clone(),
                    src_dtype: DType::F32,
                    transform: Transform::Identity,
                    dst_offset: 0,
                    constant: Some(c),
                });
            }
        }
        let mut first_use: HashMap<String, usize> = HashMap::new();
        for (i, j) in jobs.iter().enumerate() {
            first_use.entry(j.stored.clone()).or_insert(i);
        }
        jobs.sort_by_key(|j| (first_use[&j.stored], j.layer));
        Ok(Conversion {
            read,
            write,
            dtypes,
            jobs,
        })
    }

    /// The output tensors as a writer lays them out (name, dtype, shape).
    pub fn planned_tensors(&self) -> Vec<PlannedTensor> {
        self.write
            .tensors
            .iter()
            .zip(&self.dtypes)
            .map(|(t, &dtype)| PlannedTensor {
                name: t.name.clone(),
                dtype,
                shape: t.shape.clone(),
            })
            .collect()
    }
}
