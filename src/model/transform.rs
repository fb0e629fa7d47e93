//! Tensor layout transforms and their fused, streaming conversion kernels.
//!
//! Owns: `Transform` (identity, 2-D transpose, Conv3d OIDHW→DHWIO and its inverse, the
//! Conv1d OIK↔KIO reversal, and the (C) ↔ (1, C, 1, 1) reshape of a bias, which moves no
//! element), how a transform maps shapes, how two transforms compose, and `convert_rows`, the kernel that
//! writes any band of destination rows straight into a caller-provided byte slice, fused
//! with the dtype conversion (source widened to `f32`, output rounded once with
//! round-to-nearest-even by `codec::dtype`). Does not own: which tensor gets which transform
//! (`model::wan_names`) or where its bytes go (`layout::conversion`).
//!
//! When the source and destination dtypes are equal the kernel moves raw element bytes, so
//! f32→f32 and bf16→bf16 through any transform is a pure permutation of the bytes (NaN
//! payloads included). Permuting transforms run over 64×64 tiles, so a 13824×5120
//! transpose reads and writes whole cache lines.

use std::ops::Range;

use crate::codec::dtype::{self, UnsupportedDType};
use crate::io::DType;

/// A permutation of a tensor's axes, named after the layouts it converts between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Transform {
    /// Same shape, same element order.
    Identity,
    /// 2-D transpose: PyTorch Linear (out, in) ↔ Flax kernel (in, out).
    Transpose,
    /// Conv3d weight PyTorch (O, I, D, H, W) → Flax (D, H, W, I, O): axes (2, 3, 4, 1, 0).
    OidhwToDhwio,
    /// Conv3d weight Flax (D, H, W, I, O) → PyTorch (O, I, D, H, W): axes (4, 3, 0, 1, 2).
    DhwioToOidhw,
    /// Conv1d weight PyTorch (O, I, K) ↔ Flax (K, I, O): axes (2, 1, 0), its own inverse.
    Reverse3,
    /// A per-channel vector (C) viewed as (1, C, 1, 1) (the original Wan-Animate
    /// FusedLeakyReLU bias): a reshape, the bytes unchanged.
    ChannelTo1C11,
    /// (1, C, 1, 1) viewed as (C): the inverse of [`Transform::ChannelTo1C11`].
    Channel1C11ToC,
}

/// A transform was applied to a tensor of the wrong rank, or two transforms compose to a
/// permutation no kernel implements.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// The tensor's rank does not fit the transform.
    #[error("{transform:?} needs a {needs}-D tensor, got shape {shape:?}")]
    Rank {
        /// The transform.
        transform: Transform,
        /// The rank it needs.
        needs: usize,
        /// The shape it got.
        shape: Vec<usize>,
    },
    /// The composition is not one of the four transforms.
    #[error("{first:?} followed by {second:?} on a {ndim}-D tensor is not a supported transform")]
    Composition {
        /// Applied first.
        first: Transform,
        /// Applied second.
        second: Transform,
        /// Rank of the tensor.
        ndim: usize,
    },
}

impl Transform {
    /// The transform that undoes this one.
    pub fn inverse(self) -> Transform {
        match self {
            Transform::Identity => Transform::Identity,
            Transform::Transpose => Transform::Transpose,
            Transform::OidhwToDhwio => Transform::DhwioToOidhw,
            Transform::DhwioToOidhw => Transform::OidhwToDhwio,
            Transform::Reverse3 => Transform::Reverse3,
            Transform::ChannelTo1C11 => Transform::Channel1C11ToC,
            Transform::Channel1C11ToC => Transform::ChannelTo1C11,
        }
    }

    /// True when the transform is a reshape or the identity: element order unchanged.
    pub fn keeps_order(self) -> bool {
        matches!(
            self,
            Transform::Identity | Transform::ChannelTo1C11 | Transform::Channel1C11ToC
        )
    }

    /// The rank this transform needs, or `None` for the identity (any rank).
    pub fn rank(self) -> Option<usize> {
        match self {
            Transform::Identity => None,
            Transform::Transpose => Some(2),
            Transform::OidhwToDhwio | Transform::DhwioToOidhw => Some(5),
            Transform::Reverse3 => Some(3),
            Transform::ChannelTo1C11 => Some(1),
            Transform::Channel1C11ToC => Some(4),
        }
    }

    /// numpy-style axes: output axis `k` is input axis `axes[k]`; `None` for a reshape,
    /// which is no permutation.
    pub fn axes(self, ndim: usize) -> Result<Option<Vec<usize>>, TransformError> {
        self.check_rank(ndim, &[])?;
        Ok(Some(match self {
            Transform::Identity => (0..ndim).collect(),
            Transform::Transpose => vec![1, 0],
            Transform::OidhwToDhwio => vec![2, 3, 4, 1, 0],
            Transform::DhwioToOidhw => vec![4, 3, 0, 1, 2],
            Transform::Reverse3 => vec![2, 1, 0],
            Transform::ChannelTo1C11 | Transform::Channel1C11ToC => return Ok(None),
        }))
    }

    fn check_rank(self, ndim: usize, shape: &[usize]) -> Result<(), TransformError> {
        match self.rank() {
            Some(needs) if needs != ndim => Err(TransformError::Rank {
                transform: self,
                needs,
                shape: shape.to_vec(),
            }),
            _ => Ok(()),
        }
    }

    /// The shape of the transformed tensor.
    pub fn apply_shape(self, shape: &[usize]) -> Result<Vec<usize>, TransformError> {
        self.check_rank(shape.len(), shape)?;
        match (self, self.axes(shape.len())?) {
            (_, Some(axes)) => Ok(axes.iter().map(|&a| shape[a]).collect()),
            (Transform::ChannelTo1C11, None) => Ok(vec![1, shape[0], 1, 1]),
            _ if shape[0] == 1 && shape[2] == 1 && shape[3] == 1 => Ok(vec![shape[1]]),
            _ => Err(TransformError::Rank {
                transform: self,
                needs: 4,
                shape: shape.to_vec(),
            }),
        }
    }

    /// `self` followed by `next`, as one transform, for a tensor of rank `ndim`.
    pub fn then(self, next: Transform, ndim: usize) -> Result<Transform, TransformError> {
        let composition = TransformError::Composition {
            first: self,
            second: next,
            ndim,
        };
        let first = self.axes(ndim).map_err(|_| composition.clone())?;
        // A reshape composes only with the identity or its inverse.
        let reshape = |t: Transform| match (self, next) {
            (Transform::Identity, _) | (_, Transform::Identity) => Ok(t),
            _ if next == self.inverse() => Ok(Transform::Identity),
            _ => Err(composition.clone()),
        };
        let Some(first) = first else {
            return reshape(self);
        };
        let out_ndim = self.apply_shape(&vec![1; ndim]).map_or(ndim, |s| s.len());
        let second = next.axes(out_ndim).map_err(|_| composition.clone())?;
        let Some(second) = second else {
            return reshape(next);
        };
        let axes: Vec<usize> = second.iter().map(|&k| first[k]).collect();
        [
            Transform::Identity,
            Transform::Transpose,
            Transform::OidhwToDhwio,
            Transform::DhwioToOidhw,
            Transform::Reverse3,
        ]
        .into_iter()
        .find(|t| t.axes(ndim).is_ok_and(|a| a == Some(axes.clone())))
        .ok_or(composition)
    }

    /// The destination seen as a row-major matrix: (rows, elements per row). Bands passed
    /// to [`convert_rows`] are ranges of these rows.
    pub fn dst_rows(self, src_shape: &[usize]) -> Result<(usize, usize), TransformError> {
        self.check_rank(src_shape.len(), src_shape)?;
        let numel: usize = src_shape.iter().product();
        Ok(match self {
            Transform::Identity => match src_shape.first() {
                Some(&rows) if rows > 0 => (rows, numel / rows),
                Some(_) => (0, 0),
                None => (1, 1),
            },
            Transform::Transpose => (src_shape[1], src_shape[0]),
            Transform::OidhwToDhwio => (numel / src_shape[0], src_shape[0]),
            Transform::DhwioToOidhw => (src_shape[4], numel / src_shape[4]),
            Transform::Reverse3 => (numel / src_shape[0], src_shape[0]),
            Transform::ChannelTo1C11 | Transform::Channel1C11ToC => (numel, 1),
        })
    }
}

/// A source tensor for a kernel: element type, shape and raw little-endian bytes.
#[derive(Clone, Copy, Debug)]
pub struct SrcTensor<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [usize],
    /// Bytes (exactly numel × element size).
    pub bytes: &'a [u8],
}

/// Writes destination rows `rows` of `transform(src)` converted to `dst_dtype` into `dst`,
/// which holds exactly those rows (`rows.len() × row_len × dst_dtype.size()` bytes; see
/// [`Transform::dst_rows`]).
///
/// Same dtype: raw bytes are permuted, bit for bit. Different dtypes: the source is widened
/// to `f32` (F32, F16, BF16, F64, F8 accepted) and narrowed once with round-to-nearest-even
/// to F32, F16 or BF16.
#[track_caller]
pub fn convert_rows(
    transform: Transform,
    src: SrcTensor<'_>,
    dst_dtype: DType,
    rows: Range<usize>,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let geometry = Geometry::new(transform, src.shape)?;
    let src_size = src.dtype.size().ok_or(KernelError::SubByte(src.dtype))?;
    let dst_size = dst_dtype.size().ok_or(KernelError::SubByte(dst_dtype))?;
    assert_eq!(
        src.bytes.len(),
        geometry.numel() * src_size,
        "convert_rows: source byte length does not match its shape"
    );
    assert!(rows.end <= geometry.rows, "convert_rows: rows out of range");
    assert_eq!(
        dst.len(),
        rows.len() * geometry.row_len * dst_size,
        "convert_rows: destination byte length does not match the band"
    );
    if src.dtype == dst_dtype {
        match src_size {
            1 => permute_raw::<1>(&geometry, src.bytes, rows, dst),
            2 => permute_raw::<2>(&geometry, src.bytes, rows, dst),
            4 => permute_raw::<4>(&geometry, src.bytes, rows, dst),
            8 => permute_raw::<8>(&geometry, src.bytes, rows, dst),
            _ => return Err(KernelError::SubByte(src.dtype)),
        }
        return Ok(());
    }
    if !src.dtype.is_float() {
        return Err(KernelError::Dtype(UnsupportedDType {
            dtype: src.dtype,
            direction: "to",
        }));
    }
    if !dst_dtype.is_output_float() {
        return Err(KernelError::Dtype(UnsupportedDType {
            dtype: dst_dtype,
            direction: "from",
        }));
    }
    convert_widening(&geometry, src, (src_size, dst_size), dst_dtype, rows, dst);
    Ok(())
}

/// Converts a whole tensor; see [`convert_rows`].
pub fn convert(
    transform: Transform,
    src: SrcTensor<'_>,
    dst_dtype: DType,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    let (rows, _) = transform.dst_rows(src.shape)?;
    convert_rows(transform, src, dst_dtype, 0..rows, dst)
}

/// Why a kernel refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The shape does not fit the transform.
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// A dtype that cannot be converted.
    #[error(transparent)]
    Dtype(#[from] UnsupportedDType),
    /// A sub-byte dtype (F4, F6), which wanbake does not restack.
    #[error("{0} elements are smaller than a byte; wanbake does not restack them")]
    SubByte(DType),
}

/// Side of a tile, in elements.
const TILE: usize = 64;

/// How destination row `k` and column `j` find their source element:
/// `dst[k][j] = src[row_of(j) * src_cols + col_of(k)]`. Identity transforms are a single
/// contiguous run and skip the index maps.
struct Geometry {
    rows: usize,
    row_len: usize,
    src_cols: usize,
    permuted: bool,
    col_of: SplitSwap,
    row_of: SplitSwap,
}

/// Index map `x·b + y ↦ y·a + x` for `x < a`, `y < b` (identity when `a` or `b` is 1).
#[derive(Clone, Copy)]
struct SplitSwap {
    a: usize,
    b: usize,
}

impl SplitSwap {
    const IDENTITY: SplitSwap = SplitSwap { a: 1, b: 1 };

    fn is_identity(self) -> bool {
        self.a == 1 || self.b == 1
    }

    #[inline(always)]
    fn map(self, index: usize) -> usize {
        if self.a == 1 || self.b == 1 {
            index
        } else {
            (index % self.b) * self.a + index / self.b
        }
    }
}

impl Geometry {
    fn new(transform: Transform, shape: &[usize]) -> Result<Geometry, TransformError> {
        let (rows, row_len) = transform.dst_rows(shape)?;
        let mut g = Geometry {
            rows,
            row_len,
            src_cols: rows,
            permuted: !transform.keeps_order(),
            col_of: SplitSwap::IDENTITY,
            row_of: SplitSwap::IDENTITY,
        };
        match transform {
            Transform::Identity
            | Transform::Transpose
            | Transform::ChannelTo1C11
            | Transform::Channel1C11ToC => {}
            Transform::Reverse3 => {
                // src (A, B·C); dst row (c, b) reads src column (b, c).
                g.col_of = SplitSwap {
                    a: shape[2],
                    b: shape[1],
                };
            }
            Transform::OidhwToDhwio => {
                // src (O, I·S) with S = D·H·W; dst row (s, i) reads src column (i, s).
                let (i, s) = (shape[1], shape[2] * shape[3] * shape[4]);
                g.col_of = SplitSwap { a: s, b: i };
            }
            Transform::DhwioToOidhw => {
                // src (S·I, O); dst column (i, s) reads src row (s, i).
                let (i, s) = (shape[3], shape[0] * shape[1] * shape[2]);
                g.row_of = SplitSwap { a: i, b: s };
            }
        }
        Ok(g)
    }

    fn numel(&self) -> usize {
        self.rows * self.row_len
    }
}

/// Same-dtype kernel over `N`-byte elements: a pure byte permutation.
fn permute_raw<const N: usize>(g: &Geometry, src: &[u8], rows: Range<usize>, dst: &mut [u8]) {
    if !g.permuted {
        let run = rows.start * g.row_len * N..rows.end * g.row_len * N;
        dst.copy_from_slice(&src[run]);
        return;
    }
    // Whole runs of `[u8; N]` elements, one copy each (an element-by-element copy of
    // slices compiles to a call per 2-byte element).
    let (elements, _) = src.as_chunks::<N>();
    if g.col_of.is_identity() && g.row_of.is_identity() {
        transpose_blocked(
            elements,
            g.src_cols,
            rows,
            g.row_len,
            dst.as_chunks_mut::<N>().0,
        );
        return;
    }
    let read = |start: usize, out: &mut [[u8; N]]| {
        out.copy_from_slice(&elements[start..start + out.len()]);
    };
    let write = |run: &[[u8; N]], out: &mut [u8]| {
        out.as_chunks_mut::<N>().0.copy_from_slice(run);
    };
    tiled(g, rows, dst, N, [0u8; N], read, write);
}

/// Side of a block of [`transpose_blocked`], in elements (measured on 8960×1536: 16 and 32
/// take half the time of the staged [`tiled`] kernel for 2- and 4-byte elements; 64 and up
/// are slower).
const BLOCK: usize = 32;

/// A plain 2-D transpose of whole elements, `dst[k][j] = src[j][k]` for the destination rows
/// `rows`: a block of source rows is read column by column while each destination row
/// segment is written in order, with no staging tile (same-dtype transposes, the bulk of a
/// scanned layout's bytes).
fn transpose_blocked<T: Copy>(
    src: &[T],
    src_cols: usize,
    rows: Range<usize>,
    row_len: usize,
    dst: &mut [T],
) {
    for j0 in (0..row_len).step_by(BLOCK) {
        let j1 = (j0 + BLOCK).min(row_len);
        for k0 in rows.clone().step_by(BLOCK) {
            let k1 = (k0 + BLOCK).min(rows.end);
            for k in k0..k1 {
                let at = (k - rows.start) * row_len;
                for (o, j) in dst[at + j0..at + j1].iter_mut().zip(j0..j1) {
                    *o = src[j * src_cols + k];
                }
            }
        }
    }
}

/// Dtype-converting kernel: widen source runs to `f32` (`codec::dtype`), narrow destination
/// runs once with round-to-nearest-even (`codec::dtype`).
/// `sizes`: the element sizes of the source and destination dtypes, which the caller checked
/// are whole bytes.
fn convert_widening(
    g: &Geometry,
    src: SrcTensor<'_>,
    (size, dst_size): (usize, usize),
    dst_dtype: DType,
    rows: Range<usize>,
    dst: &mut [u8],
) {
    let narrow = |run: &[f32], out: &mut [u8]| {
        // Infallible: dst_dtype was checked to be an output float by the caller.
        let _ = dtype::narrow_from_f32(dst_dtype, run, out);
    };
    if !g.permuted {
        convert_contiguous(g, src, rows, dst, (size, dst_size), narrow);
        return;
    }
    let widen = |start: usize, out: &mut [f32]| {
        let bytes = &src.bytes[start * size..(start + out.len()) * size];
        // Infallible: the caller checked src.dtype is a float.
        let _ = dtype::widen_to_f32(src.dtype, bytes, out);
    };
    tiled(g, rows, dst, dst_size, 0f32, widen, narrow);
}

/// Identity with a dtype change: widen and narrow in fixed chunks.
fn convert_contiguous(
    g: &Geometry,
    src: SrcTensor<'_>,
    rows: Range<usize>,
    dst: &mut [u8],
    (src_size, dst_size): (usize, usize),
    narrow: impl Fn(&[f32], &mut [u8]),
) {
    const CHUNK: usize = 4096;
    let first = rows.start * g.row_len;
    let count = rows.len() * g.row_len;
    let mut wide = [0f32; CHUNK];
    let mut done = 0;
    while done < count {
        let n = CHUNK.min(count - done);
        let s = (first + done) * src_size;
        // Infallible: the caller checked src.dtype is a float.
        let _ = dtype::widen_to_f32(src.dtype, &src.bytes[s..s + n * src_size], &mut wide[..n]);
        narrow(&wide[..n], &mut dst[done * dst_size..(done + n) * dst_size]);
        done += n;
    }
}

/// The tiled permutation shared by both kernels: for a TILE×TILE block of the destination,
/// read the matching source rows in runs (`read(start, out)` fills `out` from consecutive
/// source elements), transpose through the tile, then emit each destination row segment.
fn tiled<E: Copy>(
    g: &Geometry,
    rows: Range<usize>,
    dst: &mut [u8],
    dst_size: usize,
    zero: E,
    read: impl Fn(usize, &mut [E]),
    write: impl Fn(&[E], &mut [u8]),
) {
    let mut tile = [zero; TILE * TILE];
    let mut run = [zero; TILE];
    let row_bytes = g.row_len * dst_size;
    for k0 in rows.clone().step_by(TILE) {
        let k1 = (k0 + TILE).min(rows.end);
        for j0 in (0..g.row_len).step_by(TILE) {
            let j1 = (j0 + TILE).min(g.row_len);
            for j in j0..j1 {
                let base = g.row_of.map(j) * g.src_cols;
                let run = &mut run[..k1 - k0];
                if g.col_of.is_identity() {
                    read(base + k0, run);
                } else {
                    for (e, k) in run.iter_mut().zip(k0..k1) {
                        read(base + g.col_of.map(k), std::slice::from_mut(e));
                    }
                }
                for (kk, &e) in run.iter().enumerate() {
                    tile[kk * TILE + (j - j0)] = e;
                }
            }
            for k in k0..k1 {
                let at = (k - rows.start) * row_bytes + j0 * dst_size;
                let seg = &tile[(k - k0) * TILE..(k - k0) * TILE + (j1 - j0)];
                write(seg, &mut dst[at..at + (j1 - j0) * dst_size]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference permutation by explicit multi-index arithmetic (independent of the tiled
    /// kernel): out[idx] = in[idx permuted back through `axes`].
    fn reference_permute(shape: &[usize], axes: &[usize], data: &[u32]) -> Vec<u32> {
        let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
        let n: usize = shape.iter().product();
        let strides: Vec<usize> = (0..shape.len())
            .map(|d| shape[d + 1..].iter().product())
            .collect();
        let mut out = vec![0u32; n];
        for (flat, o) in out.iter_mut().enumerate() {
            let mut rem = flat;
            let mut src = 0;
            for (k, &extent) in out_shape.iter().enumerate().rev() {
                let idx = rem % extent;
                rem /= extent;
                src += idx * strides[axes[k]];
            }
            *o = data[src];
        }
        out
    }

    fn bytes_of(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn axes_match_the_spec_permutations() {
        assert_eq!(
            Transform::OidhwToDhwio.axes(5).unwrap().unwrap(),
            vec![2, 3, 4, 1, 0]
        );
        assert_eq!(
            Transform::OidhwToDhwio
                .apply_shape(&[5120, 36, 1, 2, 2])
                .unwrap(),
            vec![1, 2, 2, 36, 5120]
        );
        assert_eq!(
            Transform::DhwioToOidhw
                .apply_shape(&[1, 2, 2, 36, 5120])
                .unwrap(),
            vec![5120, 36, 1, 2, 2]
        );
        assert!(Transform::Transpose.apply_shape(&[3]).is_err());
    }

    #[test]
    fn composition_table() {
        use Transform::*;
        assert_eq!(Transpose.then(Transpose, 2).unwrap(), Identity);
        assert_eq!(Identity.then(Transpose, 2).unwrap(), Transpose);
        assert_eq!(OidhwToDhwio.then(DhwioToOidhw, 5).unwrap(), Identity);
        assert_eq!(DhwioToOidhw.then(Identity, 5).unwrap(), DhwioToOidhw);
        assert!(OidhwToDhwio.then(OidhwToDhwio, 5).is_err());
        assert!(Transpose.then(OidhwToDhwio, 2).is_err());
        // The bias reshape: no permutation, undone by its inverse, composed with nothing else.
        assert_eq!(ChannelTo1C11.apply_shape(&[5]).unwrap(), vec![1, 5, 1, 1]);
        assert_eq!(Channel1C11ToC.apply_shape(&[1, 5, 1, 1]).unwrap(), vec![5]);
        assert!(Channel1C11ToC.apply_shape(&[2, 5, 1, 1]).is_err());
        assert_eq!(Channel1C11ToC.then(ChannelTo1C11, 4).unwrap(), Identity);
        assert_eq!(Identity.then(ChannelTo1C11, 1).unwrap(), ChannelTo1C11);
        assert!(ChannelTo1C11.then(Transpose, 1).is_err());
        assert_eq!(Reverse3.then(Reverse3, 3).unwrap(), Identity);
    }

    #[test]
    fn every_transform_matches_the_reference_permutation_in_every_band() {
        let cases: [(Transform, Vec<usize>); 7] = [
            (Transform::Identity, vec![7, 3]),
            (Transform::Transpose, vec![131, 67]),
            (Transform::Transpose, vec![1, 200]),
            (Transform::OidhwToDhwio, vec![70, 3, 1, 2, 3]),
            (Transform::DhwioToOidhw, vec![2, 1, 3, 5, 70]),
            (Transform::Reverse3, vec![70, 3, 5]),
            (Transform::Reverse3, vec![3, 7, 66]),
        ];
        for (t, shape) in cases {
            let n: usize = shape.iter().product();
            let data: Vec<u32> = (0..n as u32).map(|x| x.wrapping_mul(2654435761)).collect();
            let expect = bytes_of(&reference_permute(
                &shape,
                &t.axes(shape.len()).unwrap().unwrap(),
                &data,
            ));
            let src = bytes_of(&data);
            let src = SrcTensor {
                dtype: DType::F32,
                shape: &shape,
                bytes: &src,
            };
            let (rows, row_len) = t.dst_rows(&shape).unwrap();
            // Whole tensor, and in uneven bands.
            let mut whole = vec![0u8; n * 4];
            convert(t, src, DType::F32, &mut whole).unwrap();
            assert_eq!(whole, expect, "{t:?} {shape:?}");
            let mut banded = vec![0u8; n * 4];
            let mut r = 0;
            while r < rows {
                let e = (r + 5).min(rows);
                let at = r * row_len * 4..e * row_len * 4;
                convert_rows(t, src, DType::F32, r..e, &mut banded[at]).unwrap();
                r = e;
            }
            assert_eq!(banded, expect, "{t:?} {shape:?} banded");
        }
    }

    #[test]
    fn f32_to_bf16_rounds_once_with_rne_after_the_permutation() {
        // 1 + 2^-8 is a tie between bf16 1.0 (even) and 1.0078125: rounds to 1.0.
        // 1 + 3·2^-8 is a tie between 1.0078125 (odd) and 1.015625: rounds up.
        let vals = [
            1.0f32 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            -2.0,
            0.5,
            3.0,
            7.0,
        ];
        let src: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
        let shape = [2usize, 3];
        let mut dst = vec![0u8; 12];
        convert(
            Transform::Transpose,
            SrcTensor {
                dtype: DType::F32,
                shape: &shape,
                bytes: &src,
            },
            DType::BF16,
            &mut dst,
        )
        .unwrap();
        let got: Vec<u16> = dst
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        // Transposed order: (0,0) (1,0) (0,1) (1,1) (0,2) (1,2).
        assert_eq!(got, vec![0x3F80, 0x3F00, 0x3F82, 0x4040, 0xC000, 0x40E0]);
    }

    #[test]
    fn bf16_nan_payloads_survive_a_same_dtype_transpose() {
        let pats: [u16; 4] = [0x7F81, 0xFFC1, 0x0001, 0x8000];
        let src: Vec<u8> = pats.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut dst = vec![0u8; 8];
        let shape = [2usize, 2];
        convert(
            Transform::Transpose,
            SrcTensor {
                dtype: DType::BF16,
                shape: &shape,
                bytes: &src,
            },
            DType::BF16,
            &mut dst,
        )
        .unwrap();
        let got: Vec<u16> = dst
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, vec![0x7F81, 0x0001, 0xFFC1, 0x8000]);
    }
}

#[cfg(test)]
mod bench {
    use super::*;

    /// CPU time of the calling thread in seconds (utime + stime from /proc, 10 ms ticks), so
    /// the figure means something on a shared machine.
    fn thread_cpu_s() -> f64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
        let after = stat.rsplit(')').next().unwrap_or("");
        // Fields after the command name: state, ppid, ..., utime (12th), stime (13th).
        let f: Vec<&str> = after.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|x| x.parse::<i64>().ok()).unwrap_or(0);
        (tick(11) + tick(12)) as f64 / 100.0
    }

    #[test]
    #[ignore = "timing only: cargo test --release --lib transform::bench -- --ignored --nocapture"]
    fn transpose_8960x1536() {
        let (r, c) = (8960usize, 1536usize);
        let src: Vec<u8> = (0..r * c).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let half: Vec<u8> = src.chunks_exact(4).flat_map(|b| [b[2], b[3]]).collect();
        let shape = [r, c];
        let reps = 5;
        use {DType::*, Transform::*};
        let cases = [
            (Transpose, F32, BF16),
            (Transpose, BF16, BF16),
            (Transpose, F32, F32),
            (Identity, F32, BF16),
            (Identity, F32, F32),
        ];
        for (t, from, dtype) in cases {
            let label = format!("{t:?} {}->{}", from.as_str(), dtype.as_str());
            let mut dst = vec![0u8; r * c * dtype.size().unwrap()];
            let (wall, cpu) = (std::time::Instant::now(), thread_cpu_s());
            for _ in 0..reps {
                let s = SrcTensor {
                    dtype: from,
                    shape: &shape,
                    bytes: if from == DType::F32 { &src } else { &half },
                };
                convert(t, s, dtype, &mut dst).unwrap();
            }
            let n = (reps * r * c) as f64;
            println!(
                "{label}: {:.2} ns/element CPU ({:.2} wall)",
                (thread_cpu_s() - cpu) * 1e9 / n,
                wall.elapsed().as_nanos() as f64 / n
            );
        }
    }
}
