//! The tuned side of `extract --adapter`: a base and the adapters merged into it, computed in
//! memory one tensor at a time.
//!
//! Owns: [`MergedStack`], a [`DeltaSource`] whose tuned tensors are the f32 values of each
//! target of a plan (`pipeline::TargetValues`, computed by the merge engine,
//! `merge::Merger`, which a front end hands in: the values `wanbake merge --dtype f32`
//! writes, bit for bit), and the base's own tensors everywhere the plan merges nothing.
//! Memory: one merged tensor per worker, never the model; nothing is written. Does not own:
//! the plan (`pipeline`) or its arithmetic (`merge`), what is done with ΔW (`run`).

use std::path::Path;

use super::ExtractError;
use super::pair::{DeltaSource, TensorPair, canonical_f32, difference, load_canonical};
use crate::io::{DType, TensorSet};
use crate::model::transform::SrcTensor;
use crate::pipeline::{Plan, TargetIndex, TargetValues};

/// A base with adapters merged into it, read tensor by tensor.
pub struct MergedStack<'a, V> {
    path: &'a Path,
    set: &'a TensorSet,
    plan: &'a Plan<'a>,
    values: &'a V,
    /// (stored tensor, layer) → (job, target) of every merged target.
    merged: TargetIndex,
}

impl<'a, V: TargetValues> MergedStack<'a, V> {
    /// `plan` merges adapters into a base of one component, whose tensors are `set`, read
    /// from `path`, with an f32 output in the base's layout; `values` computes its targets.
    pub fn new(
        path: &'a Path,
        plan: &'a Plan<'a>,
        values: &'a V,
        set: &'a TensorSet,
    ) -> MergedStack<'a, V> {
        MergedStack {
            path,
            set,
            plan,
            values,
            merged: plan.targets_by_stored(None),
        }
    }
}

impl<V: TargetValues> DeltaSource for MergedStack<'_, V> {
    fn delta(&self, p: &TensorPair) -> Result<Option<Vec<f64>>, ExtractError> {
        let base = load_canonical(self.path, self.set, &p.base)?;
        let key = (p.base.tensor.clone(), p.base.layer);
        let Some(&(j, t)) = self.merged.get(&key) else {
            // Untouched by every adapter: the tuned tensor is the base's.
            return difference((self.path, &p.base, &base), (self.path, &p.base, &base));
        };
        let plan = self.plan;
        let stored = self
            .values
            .target_values(&plan.jobs[j], &plan.targets[t])
            .map_err(|e| ExtractError::Tuned {
                source: Box::new(e),
            });
        // The merge read the base tensor's pages again: drop them, as `load_canonical` does,
        // so the resident set stays at the working tensors.
        if let Some(r) = self.set.get(&p.base.tensor) {
            r.file.release(r.position);
        }
        let stored = stored?;
        let shape = &plan.jobs[j].stored_shape;
        let src = SrcTensor {
            dtype: DType::F32,
            shape,
            bytes: bytemuck::cast_slice(&stored),
        };
        let tuned = canonical_f32(self.path, &p.base, src)?;
        difference((self.path, &p.base, &base), (self.path, &p.base, &tuned))
    }
}
