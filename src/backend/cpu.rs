//! The CPU implementation of [`Backend`]: the reference the CUDA backend is compared to, and
//! what the reference route (`pipeline::Compute::Reference`) merges on.
//!
//! Owns: [`CpuBackend`], [`HostMat`], [`HostScales`]. Does not own: the ops' contract
//! ([`Backend`]) or the element formulas (`super::arith`).

#![allow(non_snake_case)]

use faer::Par;

use super::arith;
use super::{
    Backend, BackendError, BackendKind, MatShape, NonFinite, ScalesLen, check, output_size,
};
use crate::codec::dtype::{narrow_from_f32, round_to_bf16, round_to_f16, widen_to_f32};
use crate::io::DType;
use crate::linalg::{self, XsBases};

/// A row-major f32 matrix in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostMat {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `rows · cols` values, row-major.
    pub data: Vec<f32>,
}

impl MatShape for HostMat {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// A vector of f64 factors in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostScales(pub Vec<f64>);

impl ScalesLen for HostScales {
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// The CPU backend: `codec::dtype` for conversions, `linalg` for GEMMs, norms and SVD, and
/// [`arith`] for the element-wise steps. It is the reference the CUDA backend is compared to.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    /// Parallelism of the GEMMs, norms and SVD (never changes the bits; see `linalg`).
    pub par: Par,
}

impl CpuBackend {
    /// A CPU backend with parallelism `par`.
    pub fn new(par: Par) -> CpuBackend {
        CpuBackend { par }
    }
}

impl Backend for CpuBackend {
    type Mat = HostMat;
    type Scales = HostScales;

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    #[track_caller]
    fn upload(&mut self, data: &[f32], rows: usize, cols: usize) -> Result<HostMat, BackendError> {
        check::data("upload", data.len(), rows, cols);
        Ok(HostMat {
            rows,
            cols,
            data: data.to_vec(),
        })
    }

    #[track_caller]
    fn widen(
        &mut self,
        dtype: DType,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<HostMat, BackendError> {
        let mut data = vec![0.0f32; rows * cols];
        widen_to_f32(dtype, bytes, &mut data)?;
        Ok(HostMat { rows, cols, data })
    }

    fn zeros(&mut self, rows: usize, cols: usize) -> Result<HostMat, BackendError> {
        Ok(HostMat {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        })
    }

    fn duplicate(&mut self, src: &HostMat) -> Result<HostMat, BackendError> {
        Ok(src.clone())
    }

    #[track_caller]
    fn add_scaled_product(
        &mut self,
        W: &mut HostMat,
        s: f32,
        B: &HostMat,
        A: &HostMat,
    ) -> Result<(), BackendError> {
        check::product(W, B, A);
        let (out, inp, r) = (W.rows, W.cols, B.cols);
        linalg::add_scaled_product(&mut W.data, out, inp, s, &B.data, &A.data, r, self.par);
        Ok(())
    }

    #[track_caller]
    fn add_xs_update(
        &mut self,
        W: &mut HostMat,
        s: f32,
        U: &HostMat,
        M: &HostMat,
        V: &HostMat,
    ) -> Result<(), BackendError> {
        check::xs(W, U, M, V);
        let (out, inp, r) = (W.rows, W.cols, U.cols);
        let par = self.par;
        linalg::add_xs_update(&mut W.data, out, inp, s, &U.data, &M.data, &V.data, r, par);
        Ok(())
    }

    fn row_norms(&mut self, X: &HostMat) -> Result<HostMat, BackendError> {
        Ok(HostMat {
            rows: X.rows,
            cols: 1,
            data: linalg::row_norms(&X.data, X.rows, X.cols, self.par),
        })
    }

    fn col_norms(&mut self, X: &HostMat) -> Result<HostMat, BackendError> {
        Ok(HostMat {
            rows: 1,
            cols: X.cols,
            data: linalg::col_norms(&X.data, X.rows, X.cols, self.par),
        })
    }

    #[track_caller]
    fn row_scales(
        &mut self,
        V: &HostMat,
        m: &HostMat,
        eps: f64,
    ) -> Result<HostScales, BackendError> {
        check::vector("row_scales: m", m, V.rows);
        if V.cols == 0 {
            return Ok(HostScales(
                m.data
                    .iter()
                    .map(|&m| arith::magnitude_scale(0.0, m, eps))
                    .collect(),
            ));
        }
        Ok(HostScales(
            V.data
                .chunks_exact(V.cols)
                .zip(&m.data)
                .map(|(row, &m)| arith::row_scale(row, m, eps))
                .collect(),
        ))
    }

    #[track_caller]
    fn col_scales(
        &mut self,
        V: &HostMat,
        alpha: Option<&HostScales>,
        m: &HostMat,
        eps: f64,
    ) -> Result<HostScales, BackendError> {
        check::vector("col_scales: m", m, V.cols);
        if let Some(a) = alpha {
            assert_eq!(
                a.0.len(),
                V.rows,
                "col_scales: alpha holds one value per row"
            );
        }
        let mut sums = arith::ColumnSums::new(V.cols);
        sums.add_rows(&V.data, |i, _| alpha.map_or(1.0, |a| a.0[i]));
        Ok(HostScales(sums.scales(&m.data, eps)))
    }

    #[track_caller]
    fn accumulate_normalised(
        &mut self,
        D: &mut HostMat,
        w: f64,
        V: &HostMat,
        W0: &HostMat,
        alpha: Option<&HostScales>,
        beta: Option<&HostScales>,
    ) -> Result<(), BackendError> {
        check::same("accumulate_normalised: D, V", D, V);
        check::same("accumulate_normalised: D, W0", D, W0);
        let (rows, cols) = (D.rows, D.cols);
        let (ones_r, ones_c) = (vec![1.0f64; rows], vec![1.0f64; cols]);
        let alpha = alpha.map_or(&ones_r[..], |a| &a.0[..]);
        let beta = beta.map_or(&ones_c[..], |b| &b.0[..]);
        assert!(
            alpha.len() == rows && beta.len() == cols,
            "accumulate_normalised: {} row and {} column factors for ({rows}, {cols})",
            alpha.len(),
            beta.len()
        );
        if cols == 0 {
            return Ok(());
        }
        let rows_iter = D.data.chunks_exact_mut(cols).zip(V.data.chunks_exact(cols));
        for ((Di, Vi), (W0i, &a)) in rows_iter.zip(W0.data.chunks_exact(cols).zip(alpha)) {
            for (((d, &v), &w0), &b) in Di.iter_mut().zip(Vi).zip(W0i).zip(beta) {
                *d = arith::normalised_contribution(*d, w, v, w0, a, b);
            }
        }
        Ok(())
    }

    #[track_caller]
    fn accumulate_scaled(
        &mut self,
        D: &mut HostMat,
        coef: f64,
        X: &HostMat,
    ) -> Result<(), BackendError> {
        check::same("accumulate_scaled: D, X", D, X);
        for (d, &x) in D.data.iter_mut().zip(&X.data) {
            *d = arith::scaled_contribution(*d, coef, x);
        }
        Ok(())
    }

    fn download_scales(&mut self, s: &HostScales) -> Result<Vec<f64>, BackendError> {
        Ok(s.0.clone())
    }

    #[track_caller]
    fn add_narrow(
        &mut self,
        base: &HostMat,
        delta: &HostMat,
        dtype: DType,
        out: &mut [u8],
    ) -> Result<Option<NonFinite>, BackendError> {
        check::same("add_narrow: base, delta", base, delta);
        let size = output_size(dtype)?;
        assert_eq!(
            out.len(),
            base.len() * size,
            "add_narrow: output byte length"
        );
        let mut first = None;
        let sums = base
            .data
            .iter()
            .zip(&delta.data)
            .map(|(&b, &d)| arith::sum_bits(b, d));
        for (index, (o, s)) in out.chunks_exact_mut(size).zip(sums).enumerate() {
            if first.is_none() && !f32::from_bits(s).is_finite() {
                first = Some(NonFinite {
                    index,
                    value: f32::from_bits(s),
                });
            }
            let value = f32::from_bits(s);
            match dtype {
                DType::BF16 => o.copy_from_slice(&round_to_bf16(value).to_le_bytes()),
                DType::F16 => o.copy_from_slice(&round_to_f16(value).to_le_bytes()),
                _ => o.copy_from_slice(&s.to_le_bytes()),
            }
        }
        Ok(first)
    }

    #[track_caller]
    fn narrow(&mut self, src: &HostMat, dtype: DType, out: &mut [u8]) -> Result<(), BackendError> {
        output_size(dtype)?;
        narrow_from_f32(dtype, &src.data, out)?;
        Ok(())
    }

    fn download(&mut self, src: &HostMat) -> Result<Vec<f32>, BackendError> {
        Ok(src.data.clone())
    }

    fn xs_bases(
        &mut self,
        W: &[f32],
        out: usize,
        inp: usize,
        r: usize,
    ) -> Result<XsBases, BackendError> {
        Ok(linalg::xs_bases(W, out, inp, r, self.par)?)
    }
}
