//! Reading a base tensor as bands of f32 rows in the (out, in') PyTorch order, whatever
//! its dtype and stored layout.
//!
//! Owns: [`BaseRows`] (dtype widening band by band, one layer of a stacked tensor, the MLX
//! Conv1d row permutation and its inverse, NNX kernels brought into PyTorch layout whole),
//! [`BaseWeight`] (the whole tensor as a device route reads it) and [`layer_bytes`], the
//! bytes of one layer of a stacked tensor. Does not own: what is done with the rows
//! (`merge`), the transforms themselves (`model::transform`).

use super::error::PipelineError;
use super::job::{Job, RowOrder, Target};
use crate::codec::dtype::widen_to_f32;
use crate::io::{DType, ReadError, SafetensorsFile, TensorRef, TensorView};
use crate::model::transform::{SrcTensor, Transform};

/// The bytes of one layer of a stacked tensor (or the whole tensor).
pub fn layer_bytes<'a>(
    view: &TensorView<'a>,
    layer: Option<usize>,
    slice_shape: &[usize],
) -> Result<&'a [u8], PipelineError> {
    let len = view.dtype.byte_len(slice_shape.iter().product());
    let range = len.and_then(|len| {
        let start = layer.unwrap_or(0).checked_mul(len)?;
        Some(start..start.checked_add(len)?)
    });
    range
        .and_then(|r| view.bytes.get(r))
        .ok_or_else(|| PipelineError::Convert {
            tensor: view.name.to_string(),
            reason: format!(
                "holds {} bytes of {}; layer {layer:?} of shape {slice_shape:?} is not inside them",
                view.bytes.len(),
                view.dtype
            ),
        })
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

/// Bands of rows of a base tensor as f32 in the (out, in') PyTorch order.
pub struct BaseRows<'a>(Rows<'a>);

/// Where a [`BaseRows`] reads from.
enum Rows<'a> {
    /// Stored in PyTorch layout (possibly one layer of a stack, possibly MLX Conv1d rows):
    /// widened band by band.
    Stored {
        view: TensorView<'a>,
        bytes: &'a [u8],
        file: &'a SafetensorsFile,
        inp: usize,
        order: RowOrder,
        size: usize,
    },
    /// Stored transposed (NNX kernels): brought into PyTorch layout whole, as f32.
    Canonical { data: Vec<f32>, inp: usize },
}

impl<'a> BaseRows<'a> {
    /// The rows of target `t`, read through `job` from `src` (its stored tensor).
    pub fn new(t: &Target, src: &TensorRef<'a>, job: &Job) -> Result<BaseRows<'a>, PipelineError> {
        let view = src.view;
        let size = view.dtype.size().ok_or_else(|| PipelineError::Convert {
            tensor: t.name.clone(),
            reason: format!("dtype {} cannot be merged", view.dtype),
        })?;
        let bytes = layer_bytes(&view, t.layer, &job.stored_shape)?;
        if t.to_canonical == Transform::Identity {
            return Ok(BaseRows(Rows::Stored {
                view,
                bytes,
                file: src.file,
                inp: t.inp,
                order: t.rows,
                size,
            }));
        }
        let mut raw = vec![0u8; t.out * t.inp * 4];
        let stored = SrcTensor {
            dtype: view.dtype,
            shape: &job.stored_shape,
            bytes,
        };
        crate::model::transform::convert(t.to_canonical, stored, DType::F32, &mut raw).map_err(
            |e| PipelineError::Convert {
                tensor: t.name.clone(),
                reason: e.to_string(),
            },
        )?;
        Ok(BaseRows(Rows::Canonical {
            data: raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            inp: t.inp,
        }))
    }

    /// The whole (`out` rows) base weight for `merge_whole`, and the dtype of output bytes
    /// the backend can write as they are. `output` is the job's dtype when the output keeps
    /// the stored layout: a BF16/F16/F32 output of BF16/F16/F32 rows stored in PyTorch order
    /// (a whole tensor or one layer of a stack) is widened and rounded on the backend
    /// (`Some(output)`). Anything else (MLX Conv1d rows, NNX kernels, other dtypes, a
    /// permuting output layout) is read into `host` as f32 and merged to F32 for the caller
    /// to lay out and round (`None`).
    pub fn whole<'s>(
        &'s self,
        out: usize,
        output: Option<DType>,
        host: &'s mut Vec<f32>,
    ) -> Result<(BaseWeight<'s>, Option<DType>), PipelineError> {
        let on_backend = |d: DType| matches!(d, DType::BF16 | DType::F16 | DType::F32);
        if let (
            Some(output),
            Rows::Stored {
                view,
                bytes,
                order: RowOrder::Torch,
                ..
            },
        ) = (output, &self.0)
            && on_backend(output)
            && on_backend(view.dtype)
        {
            let base = BaseWeight::Stored {
                dtype: view.dtype,
                bytes,
            };
            return Ok((base, Some(output)));
        }
        let inp = match &self.0 {
            Rows::Stored { inp, .. } | Rows::Canonical { inp, .. } => *inp,
        };
        host.resize(out * inp, 0.0);
        self.read(0, out, host)?;
        Ok((BaseWeight::F32(host), None))
    }

    /// The stored tensor itself when its bytes are exactly the PyTorch-layout matrix.
    pub fn direct_view(&self) -> Option<TensorView<'a>> {
        match &self.0 {
            Rows::Stored {
                view,
                bytes,
                order: RowOrder::Torch,
                ..
            } if bytes.len() == view.bytes.len() => Some(*view),
            _ => None,
        }
    }

    /// Fills `dst` ((n, inp) f32) with rows `r0 .. r0 + n`.
    pub fn read(&self, r0: usize, n: usize, dst: &mut [f32]) -> Result<(), PipelineError> {
        let (view, bytes, file, inp, order, size) = match &self.0 {
            Rows::Canonical { data, inp } => {
                dst.copy_from_slice(&data[r0 * inp..(r0 + n) * inp]);
                return Ok(());
            }
            Rows::Stored {
                view,
                bytes,
                file,
                inp,
                order,
                size,
            } => (view, bytes, *file, *inp, *order, *size),
        };
        let band = &bytes[r0 * inp * size..(r0 + n) * inp * size];
        let widen = |dst: &mut [f32]| {
            let widened = widen_to_f32(view.dtype, band, dst).map_err(|e| {
                PipelineError::Read(ReadError::Tensor {
                    path: file.path().to_path_buf(),
                    tensor: view.name.to_string(),
                    reason: e.to_string(),
                })
            });
            // The band is held as f32 now: its mapped pages leave the resident set, so a
            // tensor costs a band of memory, not its whole size (a second read of the band
            // faults them back in from the page cache).
            let start = band.as_ptr() as usize - file.bytes().as_ptr() as usize;
            file.release_bytes(start, start + band.len());
            widened
        };
        match order {
            RowOrder::Torch => widen(dst),
            RowOrder::MlxConv { k, cin } => {
                // Stored row (k, cin) → PyTorch row (cin, k).
                let mut tmp = vec![0.0f32; dst.len()];
                widen(&mut tmp)?;
                for (d, s) in dst.chunks_exact_mut(inp).zip(tmp.chunks_exact(inp)) {
                    for (j, sj) in s.chunks_exact(cin).enumerate() {
                        for (i, &x) in sj.iter().enumerate() {
                            d[i * k + j] = x;
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Merged rows in the base's row order (the MLX permutation undone).
    pub fn to_stored_order<'b>(&self, merged: &'b [f32]) -> std::borrow::Cow<'b, [f32]> {
        let Rows::Stored {
            inp,
            order: RowOrder::MlxConv { k, cin },
            ..
        } = self.0
        else {
            return std::borrow::Cow::Borrowed(merged);
        };
        let mut out = vec![0.0f32; merged.len()];
        for (o, m) in out.chunks_exact_mut(inp).zip(merged.chunks_exact(inp)) {
            for i in 0..cin {
                for j in 0..k {
                    o[j * cin + i] = m[i * k + j];
                }
            }
        }
        std::borrow::Cow::Owned(out)
    }
}
