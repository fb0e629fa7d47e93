//! A dense, row-major f32 tensor: the only activation type of the runner.
//!
//! Owns: `Tensor` (shape + contiguous data) and its shape helpers. Does not own: reading
//! tensors from files (`runner::inputs`) or any math (`runner::ops`).

/// A dense row-major f32 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, last axis fastest.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor from a shape and matching data.
    ///
    /// Panics when the lengths disagree (a programming error, never user input).
    #[track_caller]
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "Tensor::new: shape {shape:?} does not match {} values",
            data.len()
        );
        Tensor { shape, data }
    }

    /// A tensor of zeros.
    pub fn zeros(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape,
            data: vec![0.0; n],
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Largest absolute elementwise difference to `other` (same shape required); NaN if
    /// any difference is NaN.
    #[track_caller]
    pub fn max_abs_diff(&self, other: &Tensor) -> f32 {
        assert_eq!(self.shape, other.shape, "max_abs_diff: shapes differ");
        let mut worst = 0f32;
        for (a, b) in self.data.iter().zip(&other.data) {
            let d = (a - b).abs();
            if d.is_nan() {
                return f32::NAN;
            }
            worst = worst.max(d);
        }
        worst
    }
}
