//! Pairs a base with its tuned model parameter by parameter, and reads ΔW.
//!
//! Owns: [`pair_models`] (both checkpoints indexed by `adapter::BaseIndex`, matched on the
//! canonical parameter name, so a diffusers base and an original-Wan or NNX tuned model pair
//! up; a missing, extra or reshaped parameter is a mismatch), [`TensorPair`], the
//! [`DeltaSource`] trait with [`TwoModels`] (ΔW of one pair in f64, PyTorch layout, from two
//! checkpoints), and [`difference`]. Does not own: the tuned side built from adapters
//! (`merged`), what to do with ΔW (`factor`, `run`).

use std::collections::BTreeMap;
use std::path::Path;

use super::ExtractError;
use crate::adapter::BaseIndex;
use crate::adapter::bind::BaseTarget;
use crate::adapter::names::{ModuleId, Role};
use crate::io::{DType, TensorSet};
use crate::model::base_model::BaseModel;
use crate::model::transform::{SrcTensor, convert};

/// Mismatches named in a refusal.
const FIRST_MISMATCHES: usize = 8;

/// One parameter present in both models.
#[derive(Clone, Debug)]
pub struct TensorPair {
    /// Its module.
    pub id: ModuleId,
    /// Which tensor of the module.
    pub role: Role,
    /// Canonical name (diffusers for WAN).
    pub canonical: String,
    /// PyTorch-layout shape.
    pub shape: Vec<usize>,
    /// Where it is in the base.
    pub base: BaseTarget,
    /// Where it is in the tuned model.
    pub tuned: BaseTarget,
}

impl TensorPair {
    /// A 2-D `.weight`: a Linear layer, extracted as a LoRA.
    pub fn is_linear(&self) -> bool {
        self.role == Role::Weight && self.shape.len() == 2
    }
}

/// Every parameter of the index by canonical name, with its module and role.
fn by_canonical(ix: &BaseIndex) -> BTreeMap<String, (ModuleId, Role, BaseTarget)> {
    let mut m = BTreeMap::new();
    for module in &ix.modules {
        for (role, &ti) in &module.roles {
            if let Some(t) = ix.targets.get(ti) {
                m.insert(t.canonical.clone(), (module.id.clone(), *role, t.clone()));
            }
        }
    }
    m
}

/// Pairs every parameter of `base` with the same parameter of `tuned`; any parameter
/// present in one only, or with another shape, is a mismatch (the first few are named).
pub fn pair_models(
    base_path: &Path,
    base: &BaseModel,
    tuned_path: &Path,
    tuned: &BaseModel,
) -> Result<Vec<TensorPair>, ExtractError> {
    let index = |path: &Path, model: &BaseModel| {
        let (comp, facts) = model.single_part()?;
        Ok::<_, ExtractError>(by_canonical(&BaseIndex::new(path, &comp.tensors, facts)))
    };
    let b = index(base_path, base)?;
    let mut t = index(tuned_path, tuned)?;
    let mut problems = Vec::new();
    let mut pairs = Vec::new();
    for (name, (id, role, bt)) in b {
        match t.remove(&name) {
            None => problems.push(format!("`{name}` is in the base only")),
            Some((_, _, tt)) if tt.shape != bt.shape => problems.push(format!(
                "`{name}`: base shape {:?}, tuned shape {:?}",
                bt.shape, tt.shape
            )),
            Some((_, _, tt)) => pairs.push(TensorPair {
                id,
                role,
                canonical: name,
                shape: bt.shape.clone(),
                base: bt,
                tuned: tt,
            }),
        }
    }
    problems.extend(
        t.keys()
            .map(|k| format!("`{k}` is in the tuned model only")),
    );
    if !problems.is_empty() {
        return Err(ExtractError::Mismatch {
            base: base_path.to_path_buf(),
            tuned: tuned_path.to_path_buf(),
            total: problems.len(),
            first: problems.into_iter().take(FIRST_MISMATCHES).collect(),
        });
    }
    Ok(pairs)
}

/// One parameter as f32 in PyTorch layout; its mapped pages are dropped afterwards.
pub fn load_canonical(
    path: &Path,
    set: &TensorSet,
    t: &BaseTarget,
) -> Result<Vec<f32>, ExtractError> {
    let bad = |reason: String| tensor_error(path, t, reason);
    let r = set
        .get(&t.tensor)
        .ok_or_else(|| bad("internal: the tensor vanished from its index".into()))?;
    let view = r.view;
    let size = view
        .dtype
        .size()
        .filter(|_| view.dtype.is_float())
        .ok_or_else(|| {
            bad(format!(
                "dtype {} cannot be compared as numbers",
                view.dtype
            ))
        })?;
    let stored: &[usize] = match t.layer {
        Some(_) => view.shape.get(1..).unwrap_or(&[]),
        None => view.shape,
    };
    let numel: usize = stored.iter().product();
    let start = t.layer.unwrap_or(0) * numel * size;
    let bytes = view
        .bytes
        .get(start..start + numel * size)
        .ok_or_else(|| bad(format!("layer {:?} lies outside the tensor", t.layer)))?;
    let src = SrcTensor {
        dtype: view.dtype,
        shape: stored,
        bytes,
    };
    let values = canonical_f32(path, t, src)?;
    // The mapped pages are read once: dropping them keeps the resident set at the working
    // tensors, not the two models (the page cache keeps them for a re-read).
    r.file.release(r.position);
    Ok(values)
}

fn tensor_error(path: &Path, t: &BaseTarget, reason: String) -> ExtractError {
    ExtractError::Tensor {
        path: path.to_path_buf(),
        tensor: t.tensor.clone(),
        reason,
    }
}

/// Stored values of target `t` (one layer's, when stacked) as f32 in PyTorch layout.
pub fn canonical_f32(
    path: &Path,
    t: &BaseTarget,
    src: SrcTensor<'_>,
) -> Result<Vec<f32>, ExtractError> {
    let numel: usize = src.shape.iter().product();
    let mut raw = vec![0u8; numel * 4];
    convert(t.to_canonical, src, DType::F32, &mut raw)
        .map_err(|e| tensor_error(path, t, e.to_string()))?;
    Ok(raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Where each pair's ΔW comes from: two checkpoints ([`TwoModels`]) or a base and the
/// adapters merged into it in memory (`extract::merged`).
pub trait DeltaSource: Sync {
    /// ΔW = f64(tuned) − f64(base) of `p` in PyTorch layout, or `None` when every element
    /// is equal; a non-finite element of either side is an error naming it.
    fn delta(&self, p: &TensorPair) -> Result<Option<Vec<f64>>, ExtractError>;
}

/// A base and a tuned checkpoint on disk.
#[derive(Clone, Copy)]
pub struct TwoModels<'a> {
    /// The base's path (in errors) and tensors.
    pub base: (&'a Path, &'a TensorSet),
    /// The tuned model's.
    pub tuned: (&'a Path, &'a TensorSet),
}

impl DeltaSource for TwoModels<'_> {
    fn delta(&self, p: &TensorPair) -> Result<Option<Vec<f64>>, ExtractError> {
        let b = load_canonical(self.base.0, self.base.1, &p.base)?;
        let t = load_canonical(self.tuned.0, self.tuned.1, &p.tuned)?;
        difference((self.base.0, &p.base, &b), (self.tuned.0, &p.tuned, &t))
    }
}

/// One side of a difference: where it was read (for errors), its target, its values.
pub type SideValues<'a> = (&'a Path, &'a BaseTarget, &'a [f32]);

/// ΔW = f64(tuned) − f64(base), or `None` when every element is equal; a non-finite element
/// of either side is an error naming it.
pub fn difference(
    base: SideValues<'_>,
    tuned: SideValues<'_>,
) -> Result<Option<Vec<f64>>, ExtractError> {
    let (b, t) = (base.2, tuned.2);
    for (side, (path, target, v)) in [("base", base), ("tuned", tuned)] {
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(tensor_error(
                path,
                target,
                format!("the {side} holds {} at element {i}", v[i]),
            ));
        }
    }
    if b.iter().zip(t).all(|(x, y)| x == y) {
        return Ok(None);
    }
    Ok(Some(
        b.iter()
            .zip(t)
            .map(|(x, y)| f64::from(*y) - f64::from(*x))
            .collect(),
    ))
}
