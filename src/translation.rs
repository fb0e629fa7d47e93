//! `wanbake translate`: an adapter rewritten in another convention, written as a release.
//!
//! Owns: `TranslateRequest`, `TranslateError`, `TranslateOutcome` and [`translate`] (open
//! the adapter, resolve its module names, render it with `adapter::translate::render_set`,
//! write it), and [`write_adapter_file`]: one adapter file (and its sidecars) as a release,
//! the writer `translate`, `extract` and `resize` share. Does not own: reading adapters,
//! names and rendering (`adapter`), the atomic writer (`release`, `release::staging`). On any
//! error nothing is written.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::adapter::translate::{OutTensor, module_ids, render_set, tensor_bytes};
use crate::adapter::{AdapterError, AdapterOptions, AdapterSet, Convention};
use crate::format::header_layout::PlannedTensor;
use crate::io::ReadError;
use crate::release::manifest::{InputFile, InputRecord, record_inputs};
use crate::release::staging::{Allocation, Replace};
use crate::release::writer::{ComponentOutput, OutputPlan};
use crate::release::{Hooks, Release, ReleaseError, ReleaseRequest, write_release};

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
    let rendered = render_set(&set, &ids, req.to)?;
    let files: Vec<(String, PathBuf, String)> = set
        .input_files()
        .into_iter()
        .map(|p| ("adapter".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let mut input_paths = set.input_files();
    input_paths.push(set.path.clone());
    input_paths.extend(req.base.iter().cloned());
    let prov = Provenance {
        command: "translate",
        options: serde_json::json!({
            "from": set.convention.as_str(),
            "to": req.to.as_str(),
            "base": req.base.as_ref().map(|b| b.display().to_string()),
            "scale": req.opts.scale,
        }),
        report: serde_json::json!({
            "entries": set.entries.len(),
            "tensors": rendered.tensors.len(),
            "notes": rendered.notes,
        }),
        inputs: Vec::new(),
        hashed: record_inputs(&files)?,
        input_paths,
    };
    let file = AdapterFile {
        stem: &rendered.stem,
        tensors: rendered.tensors.iter().map(planned).collect(),
        metadata: &rendered.metadata,
        sidecars: &rendered.sidecars,
    };
    let bytes = |i: usize| tensor_bytes(&set, &rendered.tensors[i]).map(Cow::Owned);
    let release = write_adapter_file(file, &req.out, req.replace, prov, bytes)?;
    Ok(TranslateOutcome {
        dir: release.dir,
        from: set.convention,
        to: req.to,
        entries: set.entries.len(),
        tensors: rendered.tensors.len(),
        notes: rendered.notes,
    })
}

fn planned(t: &OutTensor) -> PlannedTensor {
    PlannedTensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
    }
}

/// What the manifest records besides the files.
pub struct Provenance<'a> {
    /// Subcommand.
    pub command: &'a str,
    /// Options.
    pub options: serde_json::Value,
    /// The report.
    pub report: serde_json::Value,
    /// Inputs to hash while writing (role, path, display).
    pub inputs: Vec<InputFile>,
    /// Inputs already hashed.
    pub hashed: Vec<InputRecord>,
    /// Every input path (the output may not overlap them; they must not change).
    pub input_paths: Vec<PathBuf>,
}

/// One adapter weights file as planned: its stem, tensors, `__metadata__` and sidecars.
pub struct AdapterFile<'a> {
    /// File stem.
    pub stem: &'a str,
    /// Tensors, in file order.
    pub tensors: Vec<PlannedTensor>,
    /// `__metadata__`.
    pub metadata: &'a BTreeMap<String, String>,
    /// Files next to it (name, bytes).
    pub sidecars: &'a [(String, Vec<u8>)],
}

/// Writes `file` as a release at `dest` (nothing is left there on error); `bytes(i)` gives
/// tensor `i`'s little-endian bytes, called once per tensor on the worker threads.
pub fn write_adapter_file<'d>(
    file: AdapterFile<'_>,
    dest: &Path,
    replace: Replace,
    prov: Provenance<'_>,
    bytes: impl Fn(usize) -> Result<Cow<'d, [u8]>, ReadError> + Sync,
) -> Result<Release, ReleaseError> {
    let names: Vec<String> = file.tensors.iter().map(|t| t.name.clone()).collect();
    let component = ComponentOutput {
        rel_dir: PathBuf::new(),
        stem: file.stem.to_string(),
        tensors: file.tensors,
        metadata: file.metadata.clone(),
        sidecars: file.sidecars.to_vec(),
        max_shard_bytes: None,
    };
    let plan = OutputPlan::build(&[component], &[]).map_err(|e| {
        ReleaseError::Produce(format!("the adapter file cannot be laid out: {e}").into())
    })?;
    let report = prov.report;
    write_release(
        ReleaseRequest {
            dest,
            plan,
            input_paths: &prov.input_paths,
            inputs: prov.hashed,
            hash_while_writing: prov.inputs,
            command: prov.command,
            options: prov.options,
            replace,
            allocation: Allocation::Reserve,
        },
        |staging| {
            let slots = (names.iter().enumerate())
                .map(|(i, name)| {
                    let slot = staging.plan().slot(0, name);
                    slot.map(|s| (i, s)).ok_or_else(|| {
                        ReleaseError::Produce(format!("internal: no slot for `{name}`").into())
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            staging.for_each_in_file_order(
                &slots,
                |&(_, slot)| (slot, 0),
                || (),
                |_, &(i, slot)| -> Result<(), ReleaseError> {
                    staging.write(slot, 0, &bytes(i)?)?;
                    Ok(())
                },
            )?;
            Ok::<_, ReleaseError>(report)
        },
        Hooks::default(),
    )
}
