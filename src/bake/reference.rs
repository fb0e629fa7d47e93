//! The reference model of `unmerged` checks: the base with the recipe's adapters merged in
//! f32 and never rounded, computed one tensor at a time when the runner asks for it.
//!
//! Owns: [`ReferenceWeights`], a `WeightSource` whose merged parameters are the merge
//! engine's own f32 values of each target (`merge::Merger` as `pipeline::TargetValues`: what
//! an f32 merge in the base's layout writes, bit for bit, read back as the runner reads any
//! checkpoint), and whose untouched parameters are the base's, widened; and
//! [`reference_models`], the base's transformers wrapped so. Memory: the tensor being
//! computed and the pages it was computed from, which are dropped again; nothing is written
//! (a written reference was a second, f32, model: 57 GB beside a 14B bake). Does not own:
//! the plan (`pipeline`) or its arithmetic (`merge`), reading and widening a checkpoint
//! (`runner::weights`), running a check (`bake::check`).

use std::borrow::Cow;

use crate::io::DType;
use crate::merge::{MergeOptions, Merger};
use crate::model::wan::WanConfig;
use crate::pipeline::{Plan, TargetIndex, TargetValues};
use crate::runner::{CheckpointWeights, ModelSet, RunError, WeightSource};

/// One transformer of the base with the adapters merged into it, tensor by tensor.
pub struct ReferenceWeights<'a> {
    /// The base component, read as the runner reads a checkpoint.
    base: CheckpointWeights,
    /// `base`'s name with what was merged into it (contexts are matched by name).
    name: String,
    /// The plan of an f32 output in the base's layout.
    plan: &'a Plan<'a>,
    /// Its merge, writing nothing.
    merger: Merger<'a>,
    /// The component's index in the plan's base.
    component: usize,
    /// (stored tensor, layer) → (job, target) of every merged target of the component.
    merged: TargetIndex,
}

impl std::fmt::Debug for ReferenceWeights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReferenceWeights")
            .field("name", &self.name)
            .field("merged", &self.merged.len())
            .finish()
    }
}

impl<'a> ReferenceWeights<'a> {
    /// Component `component` of the plan's base (read as `weights`), with its adapters
    /// merged as `plan` says (a plan of `OutputOptions::f32_reference`, whose targets are
    /// computed in f32 in the base's own layout) and `options`.
    pub fn new(
        weights: CheckpointWeights,
        plan: &'a Plan<'a>,
        options: &MergeOptions,
        component: usize,
    ) -> ReferenceWeights<'a> {
        ReferenceWeights {
            name: format!("{} + adapters (unmerged reference)", weights.name()),
            base: weights,
            plan,
            merger: Merger::values_only(plan, options),
            component,
            merged: plan.targets_by_stored(Some(component)),
        }
    }

    fn error(&self, tensor: &str, reason: String) -> RunError {
        RunError::Weight {
            source_name: self.name.clone(),
            tensor: tensor.to_string(),
            reason,
        }
    }
}

impl WeightSource for ReferenceWeights<'_> {
    fn config(&self) -> &WanConfig {
        self.base.config()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn tensor(&self, name: &str) -> Result<Cow<'_, [f32]>, RunError> {
        let src = self.base.source(name)?;
        let Some(&(j, t)) = self.merged.get(&(src.stored.clone(), src.layer)) else {
            // No adapter touches it: the base's own values.
            return self.base.tensor(name);
        };
        let plan = self.plan;
        let job = &plan.jobs[j];
        if job.stored_shape != src.stored_shape {
            return Err(self.error(
                name,
                format!(
                    "the merge computes `{}` with shape {:?}, the runner reads it as {:?}",
                    job.stored, job.stored_shape, src.stored_shape
                ),
            ));
        }
        let values = self.merger.target_values(job, &plan.targets[t]);
        // The merge read the base tensor's pages (and released the adapters'): drop them.
        if let Some(r) = plan.base.components[self.component]
            .tensors
            .get(&job.stored)
        {
            r.file.release(r.position);
        }
        let values = values.map_err(|e| RunError::Computed {
            source_name: self.name.clone(),
            tensor: name.to_string(),
            source: Box::new(e),
        })?;
        self.base
            .canonical(src, DType::F32, bytemuck::cast_slice(&values))
            .map(Cow::Owned)
    }
}

/// The transformers of the plan's base (opened again from its path, as `wanbake run` opens
/// a model) with its adapters merged as `plan` and `options` say (see
/// [`ReferenceWeights::new`]).
pub fn reference_models<'a>(
    plan: &'a Plan<'a>,
    options: &MergeOptions,
) -> Result<ModelSet<'a>, RunError> {
    let base = plan.base;
    let path = base.path.as_path();
    let mut wrap = |component: &str,
                    weights: CheckpointWeights|
     -> Result<Box<dyn WeightSource + 'a>, RunError> {
        let index = base
            .components
            .iter()
            .position(|c| c.name == component)
            .ok_or_else(|| RunError::ModelLayout {
                path: path.to_path_buf(),
                reason: format!(
                    "the base was planned without a component `{component}`; it changed on disk"
                ),
            })?;
        Ok(Box::new(ReferenceWeights::new(
            weights, plan, options, index,
        )))
    };
    ModelSet::from_checkpoint(
        path,
        crate::quant::base::open_checkpoint(path)?,
        None,
        &mut wrap,
    )
}
