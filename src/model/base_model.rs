//! The pipeline's first typed stage: a checkpoint read as a model.
//!
//! Owns: `BaseModel`, an `io::Checkpoint` with one `ComponentModel` per component: how its
//! keys score against the WAN layouts (`LayoutFinding`, found here once) and which released
//! model it is (`Fingerprint`). Every later stage reads these facts from here and detects
//! nothing again: binding (`adapter::BaseIndex`), the output plan and the quantized plan
//! (`pipeline::output`, `quant::encode`), restack's planning (`layout::restack`), bake's report.
//! Does not own: opening files (`io`), the name tables and detection rules (`wan_layout`,
//! `wan_names`, `fingerprint`).

use std::ops::Deref;

use serde_json::Value;

use super::fingerprint::{Fingerprint, fingerprint_found};
use super::plan_error::PlanError;
use super::wan_layout::{Layout, LayoutFinding, find_layout, resolve_found_layout};
use crate::io::{Checkpoint, Component, ReadError};

/// What one component of a checkpoint is, found once when the checkpoint is opened.
#[derive(Clone, Debug)]
pub struct ComponentModel {
    /// How the component's keys score against the four WAN layouts.
    pub layout: LayoutFinding,
    /// Which released model the component is.
    pub fingerprint: Fingerprint,
}

impl ComponentModel {
    /// Scores `comp`'s keys and recognises it.
    pub fn of(comp: &Component) -> ComponentModel {
        let names: Vec<String> = comp.tensors.names().map(str::to_string).collect();
        let layout = find_layout(&names);
        let fingerprint = fingerprint_found(&comp.tensors, &names, &layout);
        ComponentModel {
            layout,
            fingerprint,
        }
    }

    /// The layout the keys alone say (the one whose names explain every key), if any.
    pub fn key_layout(&self) -> Option<Layout> {
        self.layout.exact.as_ref().ok().copied()
    }

    /// The layout the component is stored in: `explicit` when given, then the layout field
    /// of its parsed config.json (`config`), then the keys.
    pub fn stored_layout(
        &self,
        explicit: Option<Layout>,
        config: Option<&Value>,
    ) -> Result<Layout, PlanError> {
        resolve_found_layout(explicit, config, || self.layout.exact.clone())
    }
}

/// A checkpoint with each component's model facts. Derefs to the checkpoint.
#[derive(Debug)]
pub struct BaseModel {
    checkpoint: Checkpoint,
    models: Vec<ComponentModel>,
}

impl BaseModel {
    /// Reads the model facts of every component of `checkpoint`.
    pub fn new(checkpoint: Checkpoint) -> BaseModel {
        let models = checkpoint
            .components
            .iter()
            .map(ComponentModel::of)
            .collect();
        BaseModel { checkpoint, models }
    }

    /// The facts of component `index` (`Checkpoint::components`).
    pub fn model(&self, index: usize) -> &ComponentModel {
        &self.models[index]
    }

    /// The single component and its facts, or an error if this is a multi-transformer
    /// pipeline.
    pub fn single_part(&self) -> Result<(&Component, &ComponentModel), ReadError> {
        let comp = self.checkpoint.single()?;
        Ok((comp, &self.models[0]))
    }

    /// Every component with its facts, in order.
    pub fn parts(&self) -> impl Iterator<Item = (&Component, &ComponentModel)> {
        self.checkpoint.components.iter().zip(&self.models)
    }
}

impl Deref for BaseModel {
    type Target = Checkpoint;
    fn deref(&self) -> &Checkpoint {
        &self.checkpoint
    }
}
