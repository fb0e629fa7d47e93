//! Writing: the output tensors of a layout, each with the pieces that fill it.
//!
//! Owns: `WritePlan::new`, which takes the canonical parameters (diffusers names, PyTorch
//! shapes) and a layout and returns every output tensor's name and shape with the ordered
//! list of pieces that fill it: canonical source, transform from the PyTorch layout, and
//! element offset inside the output tensor. A stacked (`nnx-scanned`) output has L pieces,
//! layer i at offset i·(slice size), so the header is known before any data is read and a
//! writer can put each layer's slice straight into its place. Does not own: dtypes
//! (`layout::dtype_policy`) or execution (`layout::conversion`).

use std::collections::BTreeMap;

use crate::model::animate::{self, Constant};
use crate::model::plan_error::PlanError;
use crate::model::transform::Transform;
use crate::model::wan::ParamSpec;
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, NameRow, Scope};

/// One canonical parameter's contribution to an output tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Canonical (diffusers) parameter name.
    pub canonical: String,
    /// PyTorch layout → output layout.
    pub from_canonical: Transform,
    /// Element offset of this piece inside the output tensor.
    pub offset: usize,
    /// Number of elements.
    pub numel: usize,
}

/// One tensor of the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputTensor {
    /// Name in the output layout.
    pub name: String,
    /// Shape in the output layout.
    pub shape: Vec<usize>,
    /// The pieces that fill it, in offset order, covering it exactly.
    pub pieces: Vec<Piece>,
    /// A constant no parameter carries (no pieces): the original Animate names' blur
    /// kernels, which diffusers and NNX layouts do not store.
    pub constant: Option<Constant>,
}

impl OutputTensor {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Every output tensor of a layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// The output layout.
    pub layout: Layout,
    /// Output tensors: top-level parameters first, then block parameters (in the input's
    /// order; stacked ones once each).
    pub tensors: Vec<OutputTensor>,
}

impl WritePlan {
    /// Plans writing the canonical `params` in `layout`.
    pub fn new(layout: Layout, params: &[ParamSpec]) -> Result<WritePlan, PlanError> {
        let mut unknown = Vec::new();
        let mut resolved = Vec::with_capacity(params.len());
        for p in params {
            match wan_names::parse_canonical(&p.name) {
                Some((e, block)) => resolved.push((p, e, block)),
                None => unknown.push(p.name.clone()),
            }
        }
        if !unknown.is_empty() {
            return Err(PlanError::UnknownCanonical { keys: unknown });
        }
        let misfits: Vec<&(&ParamSpec, &NameRow, Option<usize>)> = resolved
            .iter()
            .filter(|(_, e, _)| !e.fits(layout))
            .collect();
        if let Some(why) = misfits.first().and_then(|(_, e, _)| e.unfit(layout)) {
            return Err(PlanError::NotInLayout {
                layout,
                keys: misfits.iter().map(|(p, _, _)| p.name.clone()).collect(),
                why,
            });
        }
        // The original motion encoder's conv_out is named after the residual block count.
        let res = resolved
            .iter()
            .filter(|(_, e, _)| e.scope == Scope::MotionRes)
            .filter_map(|&(_, _, b)| b.map(|b| b + 1))
            .max()
            .unwrap_or(0);
        let resolved: Vec<_> = resolved
            .into_iter()
            .map(|(p, e, b)| {
                (
                    p,
                    e,
                    if e.scope == Scope::MotionOut {
                        Some(res)
                    } else {
                        b
                    },
                )
            })
            .collect();
        let tensors = if layout == Layout::NnxScanned {
            stacked_tensors(&resolved)?
        } else {
            let singles = resolved
                .iter()
                .map(|&(p, e, block)| single(layout, p, e, block))
                .collect::<Result<_, _>>()?;
            join_fused(singles)
        };
        let mut tensors = tensors;
        if layout == Layout::Wan {
            tensors.extend(
                animate::blur_kernel_names(res)
                    .into_iter()
                    .map(|name| OutputTensor {
                        name,
                        shape: Constant::BlurKernel.shape(),
                        pieces: Vec::new(),
                        constant: Some(Constant::BlurKernel),
                    }),
            );
        }
        Ok(WritePlan { layout, tensors })
    }

    /// Total number of parameter elements written (constants, which are no parameter,
    /// not counted).
    pub fn numel(&self) -> u64 {
        (self.tensors.iter())
            .filter(|t| t.constant.is_none())
            .map(|t| t.numel() as u64)
            .sum()
    }
}

fn transformed(key: &str, t: Transform, shape: &[usize]) -> Result<Vec<usize>, PlanError> {
    t.apply_shape(shape).map_err(|e| PlanError::Rank {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

fn single(
    layout: Layout,
    p: &ParamSpec,
    e: &'static NameRow,
    block: Option<usize>,
) -> Result<OutputTensor, PlanError> {
    let t = e.from_canonical(layout);
    let (name, _) = e.stored_name(layout, block.unwrap_or(0));
    let mut shape = transformed(&p.name, t, &p.shape)?;
    let numel = p.numel() as usize;
    // A piece of a fused tensor: its row block of the whole (`NameRow::pieces`).
    let pieces = e.pieces(layout);
    let index = pieces.iter().position(|x| std::ptr::eq(*x, e)).unwrap_or(0);
    if let Some(rows) = shape.first_mut() {
        *rows *= pieces.len();
    }
    Ok(OutputTensor {
        shape,
        name,
        pieces: vec![Piece {
            canonical: p.name.clone(),
            from_canonical: t,
            offset: index * numel,
            numel,
        }],
        constant: None,
    })
}

/// Merges the tensors of one name (the pieces of a fused tensor) into the first, pieces
/// in offset order.
fn join_fused(tensors: Vec<OutputTensor>) -> Vec<OutputTensor> {
    let mut out: Vec<OutputTensor> = Vec::with_capacity(tensors.len());
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for t in tensors {
        match at.get(&t.name) {
            Some(&i) => {
                out[i].pieces.extend(t.pieces);
                out[i].pieces.sort_by_key(|p| p.offset);
            }
            None => {
                at.insert(t.name.clone(), out.len());
                out.push(t);
            }
        }
    }
    out
}

/// `nnx-scanned`: top-level parameters one each; every block parameter stacked over
/// blocks 0..L, which must all be present with one shape.
fn stacked_tensors(
    resolved: &[(&ParamSpec, &'static NameRow, Option<usize>)],
) -> Result<Vec<OutputTensor>, PlanError> {
    let mut out = Vec::new();
    let mut groups: Vec<&'static str> = Vec::new();
    let mut by_local: BTreeMap<&'static str, Vec<(usize, &ParamSpec, &'static NameRow)>> =
        BTreeMap::new();
    for &(p, e, block) in resolved {
        match block.filter(|_| e.scope == Scope::Block) {
            None => out.push(single(Layout::NnxScanned, p, e, block)?),
            Some(b) => {
                let group = by_local.entry(e.nnx).or_default();
                if group.is_empty() {
                    groups.push(e.nnx);
                }
                group.push((b, p, e));
            }
        }
    }
    let num_layers = by_local.values().map(Vec::len).max().unwrap_or(0);
    for local in groups {
        let mut layers = by_local.remove(local).unwrap_or_default();
        layers.sort_by_key(|&(b, _, _)| b);
        out.push(stack(local, &layers, num_layers)?);
    }
    Ok(out)
}

fn stack(
    local: &str,
    layers: &[(usize, &ParamSpec, &'static NameRow)],
    num_layers: usize,
) -> Result<OutputTensor, PlanError> {
    let name = format!("blocks.{local}");
    let indices: Vec<usize> = layers.iter().map(|&(b, _, _)| b).collect();
    if indices != (0..num_layers).collect::<Vec<_>>() {
        return Err(PlanError::Unstackable {
            key: name,
            reason: format!("blocks {indices:?} present, expected every block 0..{num_layers}"),
        });
    }
    let (_, first, entry) = layers[0];
    if let Some(&(b, p, _)) = layers.iter().find(|(_, p, _)| p.shape != first.shape) {
        return Err(PlanError::Unstackable {
            key: name,
            reason: format!(
                "block {b} has shape {:?}, block 0 has {:?}",
                p.shape, first.shape
            ),
        });
    }
    let t = entry.from_canonical(Layout::NnxScanned);
    let slice = transformed(&first.name, t, &first.shape)?;
    let numel = first.numel() as usize;
    let mut shape = vec![num_layers];
    shape.extend(slice);
    let pieces = layers
        .iter()
        .map(|&(b, p, _)| Piece {
            canonical: p.name.clone(),
            from_canonical: t,
            offset: b * numel,
            numel,
        })
        .collect();
    Ok(OutputTensor {
        name,
        shape,
        pieces,
        constant: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fingerprint::{Shapes, fingerprint};
    use crate::model::wan::WanVariant;

    #[test]
    fn every_layout_of_a_released_config_is_recognised() {
        for layout in [Layout::Wan, Layout::Nnx, Layout::NnxScanned] {
            for v in [WanVariant::T2V1_3B, WanVariant::I2V14B, WanVariant::TI2V5B] {
                let plan = WritePlan::new(layout, &v.config().diffusers_params()).unwrap();
                let s = Shapes(
                    plan.tensors
                        .into_iter()
                        .map(|t| (t.name, t.shape))
                        .collect(),
                );
                let f = fingerprint(&s);
                assert_eq!(f.variant.as_deref(), Some(v.id()), "{layout:?}: {f:?}");
                assert_eq!(f.naming.as_deref(), Some(layout.as_str()));
            }
        }
    }
}
