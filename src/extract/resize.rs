//! `resize`: each LoRA module's scaled product σ·B·A replaced by its best rank-≤R (or
//! `--energy F`) approximation, σ folded into the new factors (α = new rank), diffs and
//! modules already at or below the rank unchanged, written in the adapter's own convention.
//!
//! Owns: [`ResizeRequest`], [`resize`]. The product is never formed: its SVD comes from the
//! factors (`linalg::factored_top_singular`, exact in f64), so resizing a 14B LoRA costs
//! O((out + in)·r²) per module. The output goes through the convention's own renderer
//! (`adapter::translate::render`) with the resized entries' factors replaced by the new f32
//! ones; every other tensor is copied byte for byte. Does not own: the renderers, the
//! module names (`adapter::translate::module_ids`).

#![allow(non_snake_case)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use faer::Mat;
use rayon::prelude::*;

use super::factor::{LowRankFactors, Spectrum};
use super::render::{OwnedOutput, OwnedTensor, short_name, write_output};
use super::report::{ExtractReport, ModuleReport, kind_label};
use super::{ExtractError, ExtractOutcome, RankRule};
use crate::adapter::translate::{OutData, module_ids, render_set, tensor_bytes};
use crate::adapter::{AdapterOptions, AdapterSet, Entry, Kind, ParamRole};
use crate::io::DType;
use crate::linalg::factored_top_singular;
use crate::pipeline::{NonFinite, Origin};
use crate::release::staging::Replace;
use crate::translation::Provenance;

/// A request to resize one adapter.
#[derive(Clone, Debug)]
pub struct ResizeRequest {
    /// The adapter.
    pub adapter: PathBuf,
    /// How to read it.
    pub opts: AdapterOptions,
    /// Resolve names (and check shapes) against this base.
    pub base: Option<PathBuf>,
    /// The rank rule.
    pub rule: RankRule,
    /// Element type of every F32/F16/BF16 tensor written but scalars (`None`: the new
    /// factors in F32, the rest as stored).
    pub dtype: Option<DType>,
    /// Output directory.
    pub out: PathBuf,
    /// Replace an existing output.
    pub replace: Replace,
    /// What to do with values the output cannot hold (NaN, ±inf, an f16 overflow).
    pub nonfinite: NonFinite,
}

/// One resized module: its entry index, the rank before, and the new factors with their
/// energy and rel_error (`None` when the module is kept as it is).
struct Resized {
    entry: usize,
    rank_in: usize,
    new: Option<(LowRankFactors, f64, f64)>,
}

/// Resizes an adapter; on any error nothing is written.
pub fn resize(req: &ResizeRequest) -> Result<ExtractOutcome, ExtractError> {
    req.rule.check().map_err(ExtractError::Usage)?;
    if let Some(d) = req.dtype {
        super::run::check_dtype(d)?;
    }
    let mut set = AdapterSet::open(&req.adapter, &req.opts)?;
    let ids = module_ids(&mut set, req.base.as_deref())?;
    check_kinds(&set)?;
    let loras = set.entries.iter().filter(|e| e.kind == Kind::Lora).count();
    let phase = crate::progress::begin("computing SVDs", 0, loras as u64);
    let resized: Vec<Resized> = (0..set.entries.len())
        .into_par_iter()
        .filter(|&i| set.entries[i].kind == Kind::Lora)
        .map(|i| {
            let r = resize_entry(&set, i, &req.rule);
            phase.add_item();
            r
        })
        .collect::<Result<_, _>>()?;
    drop(phase);
    let mut new_factors: BTreeMap<usize, LowRankFactors> = BTreeMap::new();
    for r in &resized {
        if let Some((f, _, _)) = &r.new {
            fold_into_entry(&mut set.entries[r.entry], f);
            new_factors.insert(r.entry, f.clone());
        }
    }
    let rendered = render_set(&set, &ids, set.convention)?;
    let mut out = OwnedOutput {
        stem: rendered.stem.clone(),
        metadata: rendered.metadata.clone(),
        sidecars: rendered.sidecars.clone(),
        tensors: Vec::new(),
    };
    for t in &rendered.tensors {
        out.tensors.push(owned_tensor(&set, t, &new_factors)?);
    }
    let found = out.check_values(req.dtype, &req.adapter, &Origin::Adapter, req.nonfinite)?;
    if let Some(d) = req.dtype {
        out.convert_floats(d)?;
    }
    let mut report = resize_report(&set, &ids, &resized, &out);
    report.nonfinite = found;
    let dir = write(&out, &set, req, &report)?;
    Ok(ExtractOutcome { dir, report })
}

/// Only plain LoRA modules, full differences and unscaled bias deltas can be resized / kept.
fn check_kinds(set: &AdapterSet) -> Result<(), ExtractError> {
    let other: Vec<String> = set
        .entries
        .iter()
        .filter(|e| {
            // A σ-scaled lora_B.bias would follow its module's σ, which resize folds to 1.
            let scaled_bias = e.kind == Kind::LoraBias && e.scale != 1.0;
            scaled_bias
                || !matches!(
                    e.kind,
                    Kind::Lora | Kind::Diff | Kind::DiffBias | Kind::LoraBias
                )
        })
        .map(|e| match e.kind {
            Kind::LoraBias => format!("{} (lora_B.bias scaled by σ = {})", e.module, e.scale),
            k => format!("{} ({})", e.module, k.as_str()),
        })
        .collect();
    if other.is_empty() {
        return Ok(());
    }
    Err(ExtractError::ResizeKinds {
        path: set.path.clone(),
        entries: other,
    })
}

/// The spectrum of σ·B·A from the factors, and the new rank.
fn resize_entry(set: &AdapterSet, i: usize, rule: &RankRule) -> Result<Resized, ExtractError> {
    let e = &set.entries[i];
    let (Some(a_src), Some(b_src)) = (e.param(ParamRole::A), e.param(ParamRole::B)) else {
        return Err(ExtractError::Usage(format!(
            "internal: LoRA `{}` without both factors",
            e.module
        )));
    };
    let (A, B) = (set.load(a_src)?, set.load(b_src)?);
    let (r, inp) = (a_src.shape[0], a_src.shape[1]);
    let out = b_src.shape[0];
    let Am = Mat::<f64>::from_fn(r, inp, |i, j| f64::from(A[i * inp + j]));
    let Bm = Mat::<f64>::from_fn(out, r, |i, j| e.scale * f64::from(B[i * r + j]));
    let top =
        factored_top_singular(Bm.as_ref(), Am.as_ref()).map_err(|source| ExtractError::Svd {
            module: e.module.clone(),
            source,
        })?;
    let total = top.S.iter().map(|x| x * x).sum();
    let s = Spectrum {
        top,
        total,
        out,
        inp,
    };
    let k = rule.pick(&s.top.S, s.total, s.top.S.len());
    if k >= r {
        return Ok(Resized {
            entry: i,
            rank_in: r,
            new: None,
        });
    }
    let (energy, rel_error) = s.retained(k);
    Ok(Resized {
        entry: i,
        rank_in: r,
        new: Some((s.factors(k), energy, rel_error)),
    })
}

/// The entry now has rank k, α = k (σ = 1, folded into the factors), and k-shaped factors.
fn fold_into_entry(e: &mut Entry, f: &LowRankFactors) {
    e.rank = Some(f.rank);
    e.alpha = Some(f.rank as f64);
    e.scale = 1.0;
    if let Some(a) = e.params.get_mut(&ParamRole::A) {
        a.shape = vec![f.rank, f.inp];
    }
    if let Some(b) = e.params.get_mut(&ParamRole::B) {
        b.shape = vec![f.out, f.rank];
    }
}

/// A rendered tensor with its bytes: new f32 factors for resized entries, else the stored
/// bytes.
fn owned_tensor(
    set: &AdapterSet,
    t: &crate::adapter::translate::OutTensor,
    new: &BTreeMap<usize, LowRankFactors>,
) -> Result<OwnedTensor, ExtractError> {
    if let OutData::Param {
        entry,
        role,
        transpose,
    } = &t.data
        && let Some(f) = new.get(entry)
        && matches!(role, ParamRole::A | ParamRole::B)
    {
        let (v, rows, cols) = match role {
            ParamRole::A => (&f.A, f.rank, f.inp),
            _ => (&f.B, f.out, f.rank),
        };
        let mut bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        if *transpose {
            bytes = crate::adapter::transpose_bytes(&bytes, rows, cols, 4);
        }
        return Ok(OwnedTensor {
            name: t.name.clone(),
            dtype: DType::F32,
            shape: t.shape.clone(),
            bytes,
        });
    }
    Ok(OwnedTensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        bytes: tensor_bytes(set, t)?,
    })
}

fn resize_report(
    set: &AdapterSet,
    ids: &[crate::adapter::names::ModuleId],
    resized: &[Resized],
    out: &OwnedOutput,
) -> ExtractReport {
    let by_entry: BTreeMap<usize, &Resized> = resized.iter().map(|r| (r.entry, r)).collect();
    let mut report = ExtractReport {
        to: set.convention.to_string(),
        svd: "exact".into(),
        tensor_bytes: out.tensors.iter().map(|t| t.bytes.len() as u64).sum(),
        ..ExtractReport::default()
    };
    for (i, e) in set.entries.iter().enumerate() {
        let full = [ParamRole::Diff, ParamRole::DiffBias, ParamRole::LoraBias]
            .into_iter()
            .find_map(|r| e.param(r).map(|s| s.shape.clone()));
        let shape = e
            .binding
            .as_ref()
            .map(|b| b.shape.clone())
            .or(full)
            .or_else(|| e.implied_view().map(|(o, n)| vec![o, n]))
            .unwrap_or_default();
        let mut m = ModuleReport {
            name: short_name(&ids[i], set.convention),
            kind: kind_label(e.kind),
            rank: None,
            rank_in: None,
            energy: None,
            rel_error: None,
            shape,
        };
        if let Some(r) = by_entry.get(&i) {
            m.rank_in = Some(r.rank_in);
            let (rank, energy, rel) = match &r.new {
                Some((f, en, re)) => (f.rank, *en, *re),
                None => (r.rank_in, 1.0, 0.0),
            };
            (m.rank, m.energy, m.rel_error) = (Some(rank), Some(energy), Some(rel));
        }
        report.modules.push(m);
    }
    report
}

fn write(
    out: &OwnedOutput,
    set: &AdapterSet,
    req: &ResizeRequest,
    report: &ExtractReport,
) -> Result<PathBuf, ExtractError> {
    let mut inputs: Vec<(String, PathBuf, String)> = set
        .input_files()
        .into_iter()
        .map(|p| ("adapter".to_string(), p.clone(), p.display().to_string()))
        .collect();
    let mut input_paths: Vec<PathBuf> = set.input_files();
    input_paths.push(set.path.clone());
    if let Some(b) = &req.base {
        let ck = crate::quant::base::open_checkpoint(b)?;
        for p in ck.input_files() {
            inputs.push(("base".into(), p.clone(), p.display().to_string()));
            input_paths.push(p);
        }
    }
    let mut options = serde_json::json!({
        "adapter": req.adapter.display().to_string(),
        "base": req.base.as_ref().map(|b| b.display().to_string()),
        "rank": req.rule.rank,
        "energy": req.rule.energy,
        "dtype": req.dtype.map(|d| d.as_str()),
        "convention": set.convention.as_str(),
    });
    req.nonfinite.record(&mut options);
    let release = write_output(
        out,
        &req.out,
        req.replace,
        Provenance {
            command: "resize",
            options,
            report: serde_json::to_value(report)
                .map_err(|e| ExtractError::Usage(format!("internal: report: {e}")))?,
            inputs,
            hashed: Vec::new(),
            input_paths,
        },
    )?;
    Ok(release.dir)
}
