//! `wanbake translate`: an adapter rewritten in another convention, written as a release.
//!
//! Owns: `TranslateRequest`, `TranslateError`, `TranslateOutcome` and [`translate`] (open
//! the adapter, resolve its module names, render it with `adapter::translate::render`, write
//! the tensors through the one release writer with a manifest). Does not own: reading
//! adapters, names and rendering (`adapter`), the atomic writer (`release`, `io::staging`).
//! On any error nothing is written.

use std::path::PathBuf;

use rayon::prelude::*;
use serde::Serialize;

use crate::adapter::translate::{RenderCtx, Rendered, module_ids, render, tensor_bytes};
use crate::adapter::{AdapterError, AdapterOptions, AdapterSet, Convention};
use crate::io::ReadError;
use crate::io::header_layout::PlannedTensor;
use crate::io::staging::{Allocation, Replace};
use crate::io::writer::{ComponentOutput, OutputPlan};
use crate::manifest::record_inputs;
use crate::release::{Release, ReleaseError, ReleaseRequest, write_release};

/// A request to translate one adapter.
#[derive(Clone, Debug)]
pub struct TranslateRequest {
    /// The adapter.
    pub adapter: PathBuf,
    /// Target convention.
    pub to: Convention,
    /// How to read the adapter.
    pub opts: AdapterOptions,
    /// Resolve names (and check shapes) against this base.
    pub base: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
    /// Replace an existing output.
    pub replace: Replace,
}

/// Why a translation failed; nothing is written in any case.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// Reading, binding or rendering the adapter.
    #[error(transparent)]
    Adapter(#[from] AdapterError),
    /// Reading the base.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Writing the output.
    #[error(transparent)]
    Release(#[from] ReleaseError),
}

/// What was written.
#[derive(Debug, Serialize)]
pub struct TranslateOutcome {
    /// The output directory.
    pub dir: PathBuf,
    /// Source convention.
    pub from: Convention,
    /// Target convention.
    pub to: Convention,
    /// Entries written.
    pub entries: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Notes (spelling changes).
    pub notes: Vec<String>,
}

/// Translates an adapter; on any error nothing is written.
pub fn translate(req: &TranslateRequest) -> Result<TranslateOutcome, TranslateError> {
    let mut set = AdapterSet::open(&req.adapter, &req.opts)?;
    let ids = module_ids(&mut set, req.base.as_deref())?;
    let stem = set
        .files
        .first()
        .and_then(|f| f.path().file_stem())
        .and_then(|s| s.to_str())
        .unwrap_or("adapter")
        .to_string();
    let ctx = RenderCtx {
        set: &set,
        ids: &ids,
        stem,
    };
    let rendered = render(&ctx, req.to).map_err(|entries| AdapterError::Inexpressible {
        path: set.path.clone(),
        to: req.to,
        entries,
    })?;
    let release = write_translation(&set, &rendered, req)?;
    Ok(TranslateOutcome {
        dir: release.dir,
        from: set.convention,
        to: req.to,
        entries: set.entries.len(),
        tensors: rendered.tensors.len(),
        notes: rendered.notes,
    })
}

fn write_translation(
    set: &AdapterSet,
    r: &Rendered,
    req: &TranslateRequest,
) -> Result<Release, TranslateError> {
    let component = ComponentOutput {
        rel_dir: PathBuf::new(),
        stem: r.stem.clone(),
        tensors: r
            .tensors
            .iter()
            .map(|t| PlannedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
            })
            .collect(),
        metadata: r.metadata.clone(),
        sidecars: r.sidecars.clone(),
        max_shard_bytes: None,
    };
    let plan = OutputPlan::build(&[component], &[])
        .map_err(|e| ReleaseError::Produce(anyhow::anyhow!(e)))?;
    let files: Vec<(String, PathBuf, String)> = set
        .input_files()
        .into_iter()
        .map(|p| ("adapter".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let inputs = record_inputs(&files)?;
    let mut input_paths = set.input_files();
    input_paths.push(set.path.clone());
    input_paths.extend(req.base.iter().cloned());
    let options = serde_json::json!({
        "from": set.convention.as_str(),
        "to": req.to.as_str(),
        "base": req.base.as_ref().map(|b| b.display().to_string()),
        "scale": req.opts.scale,
    });
    let report = serde_json::json!({
        "entries": set.entries.len(),
        "tensors": r.tensors.len(),
        "notes": r.notes,
    });
    let release = write_release(
        ReleaseRequest {
            dest: &req.out,
            plan,
            input_paths: &input_paths,
            inputs,
            hash_while_writing: Vec::new(),
            command: "translate",
            options,
            replace: req.replace,
            allocation: Allocation::Reserve,
        },
        |staging| {
            r.tensors
                .par_iter()
                .try_for_each(|t| -> anyhow::Result<()> {
                    let slot = staging
                        .plan()
                        .slot(0, &t.name)
                        .ok_or_else(|| anyhow::anyhow!("internal: no slot for `{}`", t.name))?;
                    let bytes = tensor_bytes(set, t)?;
                    staging.write(slot, 0, &bytes)?;
                    Ok(())
                })?;
            Ok(report)
        },
    )?;
    Ok(release)
}
