//! What one job of a plan does, and the target it may read: the plan's data, shared by the
//! planner, the output side and the executor.
//!
//! Owns: [`Job`] (one output tensor, or one layer slice of a stacked one: where it is
//! written, what it reads, its dtype, transform or encoding), [`Target`] (a base tensor that
//! changes: where and how it is stored, its 2-D view, its contributions), [`Contribution`]
//! and [`RowOrder`]. Does not own: making them (`pipeline::plan`, `pipeline::output`) or
//! running them (`pipeline::exec`).

use crate::adapter::Kind;
use crate::io::DType;
use crate::model::animate::Constant;
use crate::model::transform::Transform;
use crate::quant::encode::Encoding;
use crate::release::writer::Slot;

/// How a row of a target's 2-D (out, in') view is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    /// Row-major PyTorch layout: (out, in) or (out, in, k…) flattened.
    Torch,
    /// MLX Conv1d (out, k, in): each row is (k, in) and must be permuted to (in, k).
    MlxConv {
        /// Kernel size.
        k: usize,
        /// Input channels.
        cin: usize,
    },
}

/// One adapter entry's contribution to a target.
#[derive(Clone, Debug, PartialEq)]
pub struct Contribution {
    /// Index into the adapters.
    pub adapter: usize,
    /// Index into that adapter's entries.
    pub entry: usize,
    /// The entry's kind.
    pub kind: Kind,
    /// The adapter's strength `a` (never 0: such adapters contribute nothing).
    pub strength: f64,
    /// The entry's σ (`Entry::scale`).
    pub scale: f64,
    /// Rank (1 for full-tensor kinds).
    pub rank: usize,
}

/// A base tensor (or one layer of a stacked one) that changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// Base component index.
    pub component: usize,
    /// Base tensor name.
    pub name: String,
    /// Layer of a stacked base tensor (NNX scanned).
    pub layer: Option<usize>,
    /// Stored layout → PyTorch layout (`Identity` except for NNX bases).
    pub to_canonical: Transform,
    /// Its shape in PyTorch layout (the MLX Conv1d as (out, in, k)).
    pub shape: Vec<usize>,
    /// Rows of the 2-D view.
    pub out: usize,
    /// Columns of the 2-D view.
    pub inp: usize,
    /// How rows are stored.
    pub rows: RowOrder,
    /// Contributions in canonical order (adapters with `a = 0` left out).
    pub contributions: Vec<Contribution>,
}

/// One output tensor (or one layer slice of a stacked one) and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Base component index.
    pub component: usize,
    /// Output tensor name.
    pub output: String,
    /// Where it is written.
    pub slot: Slot,
    /// Byte offset inside the output tensor.
    pub dst_offset: usize,
    /// Output dtype.
    pub dtype: DType,
    /// Stored layout → output layout.
    pub transform: Transform,
    /// Base tensor read.
    pub stored: String,
    /// Layer of a stacked base tensor.
    pub layer: Option<usize>,
    /// Shape of the stored data read (the layer's slice when stacked).
    pub stored_shape: Vec<usize>,
    /// Index into `Plan::targets` when it reads a target; `None`: copied or converted.
    pub target: Option<usize>,
    /// A quantized output's encoding of the tensor (`dtype` is then F32, the values the
    /// encoder reads); `None`: `dtype` is the output.
    pub encoding: Option<Encoding>,
    /// A constant written from its known values instead of reading `stored` (empty then).
    pub constant: Option<Constant>,
}
