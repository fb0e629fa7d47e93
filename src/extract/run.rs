//! `extract`: base + tuned → one adapter, every step checked before anything is written.
//!
//! Owns: [`ExtractRequest`], [`extract`]. Order: open and pair both models (mismatch →
//! refusal) → full differences of every non-Linear tensor (cheap; a `--to peft` refusal
//! comes here, before any SVD) → spectra of every differing Linear weight (in parallel across
//! modules, each `Par::Seq`, so the bits do not depend on the thread count; on the CPU or on
//! CUDA lanes, `route`) → ranks (per module, or the global budget) → factors → render → one
//! release. Does not own: the tuned
//! model built from adapters beyond calling the merge ([`extract_from_adapters`]).

use std::path::PathBuf;

use rayon::prelude::*;

use super::budget::allocate_expanding;
use super::factor::Spectrum;
use super::merged::MergedStack;
use super::pair::{DeltaSource, TensorPair, TwoModels, pair_models};
use super::render::{Extracted, OwnedOutput, render_comfy, render_peft, short_name, write_output};
use super::report::{ExtractReport, ModuleReport};
use super::route::SvdRoute;
use super::{ExtractError, RankRule};
use crate::adapter::Convention;
use crate::adapter::names::Role;
use crate::io::{DType, TensorSet};
use crate::linalg::TruncMethod;
use crate::model::base_model::BaseModel;
use crate::pipeline::{Compute, NonFinite, Origin, Ready, TargetValues};
use crate::progress;
use crate::release::manifest::InputRecord;
use crate::release::staging::Replace;
use crate::translation::Provenance;

/// The conventions extract writes, the default first (`translate` converts the result to any
/// other).
pub const CONVENTIONS: [Convention; 2] = [Convention::Comfy, Convention::Peft];

/// A request to extract an adapter.
#[derive(Clone, Debug)]
pub struct ExtractRequest {
    /// The base checkpoint.
    pub base: PathBuf,
    /// The tuned checkpoint (or what builds it).
    pub tuned: PathBuf,
    /// Per-module rank rule (`--rank`, `--energy`); with a budget, `rank` caps every module.
    pub rule: Option<RankRule>,
    /// `--budget` in bytes of tensor data.
    pub budget: Option<u64>,
    /// One of [`CONVENTIONS`].
    pub to: Convention,
    /// Leave full differences out instead of refusing (`--to peft`).
    pub linear_only: bool,
    /// SVD method.
    pub method: TruncMethod,
    /// Where the SVDs run (`--device`: the CPU, or lanes of a CUDA device; `route`). The
    /// merge of an `--adapter` stack runs on the CPU either way.
    pub device: Compute,
    /// Element type of the factors and differences written (F32, BF16 or F16; `.alpha`
    /// stays F32). The SVD, ranks and report are those of the f32 factors.
    pub dtype: DType,
    /// Output directory.
    pub out: PathBuf,
    /// Replace an existing output.
    pub replace: Replace,
    /// Extra manifest options (the adapters a tuned model was built from).
    pub provenance: serde_json::Value,
    /// What to do with values the output dtype cannot hold (an f16 overflow of a factor).
    pub nonfinite: NonFinite,
}

impl ExtractRequest {
    /// Checks the request's own options (dtype, convention, rank rule), before anything is
    /// read.
    pub fn check(&self) -> Result<(), ExtractError> {
        let req = self;
        check_dtype(req.dtype)?;
        if !CONVENTIONS.contains(&req.to) {
            return Err(ExtractError::Usage(format!(
                "--to {}: extract writes {}; `wanbake translate` converts the result to any other convention",
                req.to,
                crate::names::either(CONVENTIONS.map(Convention::as_str))
            )));
        }
        match (&req.rule, req.budget) {
            (None, None) => Err(ExtractError::Usage(
                "give --rank R, --energy F or --budget SIZE".into(),
            )),
            (Some(r), Some(_)) if r.energy.is_some() => Err(ExtractError::Usage(
                "--energy and --budget choose ranks in two different ways; give one (--rank R may cap a budget)".into(),
            )),
            (Some(r), _) if r.rank.is_some() || r.energy.is_some() => {
                r.check().map_err(ExtractError::Usage)
            }
            _ => Ok(()),
        }
    }
}

/// What was written.
#[derive(Debug)]
pub struct ExtractOutcome {
    /// The output directory.
    pub dir: PathBuf,
    /// The report (also in the manifest).
    pub report: ExtractReport,
}

/// The two opened models.
struct Models {
    base: BaseModel,
    tuned: BaseModel,
}

impl Models {
    fn sets(&self) -> Result<(&TensorSet, &TensorSet), ExtractError> {
        Ok((&self.base.single()?.tensors, &self.tuned.single()?.tensors))
    }
}

/// `--dtype` of extract and resize: F32, BF16 or F16.
pub(super) fn check_dtype(dtype: DType) -> Result<(), ExtractError> {
    if dtype.is_output_float() {
        return Ok(());
    }
    Err(ExtractError::Usage(format!(
        "--dtype {dtype}: extract and resize write f32, bf16 or f16"
    )))
}

/// Extracts the adapter `tuned − base` and writes it; on any error nothing is written.
pub fn extract(req: &ExtractRequest) -> Result<ExtractOutcome, ExtractError> {
    req.check()?;
    let models = Models {
        base: crate::quant::base::open(&req.base)?,
        tuned: crate::quant::base::open(&req.tuned)?,
    };
    let (bset, tset) = models.sets()?;
    let pairs = pair_models(&req.base, &models.base, &req.tuned, &models.tuned)?;
    let source = TwoModels {
        base: (req.base.as_path(), bset),
        tuned: (req.tuned.as_path(), tset),
    };
    let mut inputs = Inputs {
        tuned: req.tuned.display().to_string(),
        ..Inputs::default()
    };
    for (role, ck) in [("base", &models.base), ("tuned", &models.tuned)] {
        for p in ck.input_files() {
            inputs.paths.push(p.clone());
            inputs
                .to_hash
                .push((role.to_string(), p.clone(), p.display().to_string()));
        }
    }
    extract_pairs(req, &pairs, &source, inputs)
}

/// The inputs a manifest records: files to hash now, records hashed already, and every
/// file read (checked unchanged before commit); and the tuned side in words.
#[derive(Default)]
struct Inputs {
    tuned: String,
    to_hash: Vec<(String, PathBuf, String)>,
    hashed: Vec<InputRecord>,
    paths: Vec<PathBuf>,
}

/// Spectra, ranks, factors and diffs of `pairs` from `source`, rendered and written.
fn extract_pairs(
    req: &ExtractRequest,
    pairs: &[TensorPair],
    source: &dyn DeltaSource,
    inputs: Inputs,
) -> Result<ExtractOutcome, ExtractError> {
    let (kept_diffs, mut left_out) = split_diffs(full_differences(pairs, source)?, pairs, req)?;
    let largest = (pairs.iter().filter(|p| p.is_linear()))
        .map(|p| p.shape.iter().product::<usize>())
        .max()
        .unwrap_or(0);
    let route = SvdRoute::new(&req.device, largest);
    let spectra = Spectra {
        pairs,
        source,
        req,
        route: &route,
    };
    let linear = linear_deltas(&spectra)?;
    if kept_diffs.is_empty() && left_out.is_empty() && linear.is_empty() {
        return Err(ExtractError::NothingDiffers {
            base: req.base.clone(),
            tuned: PathBuf::from(&inputs.tuned),
            count: pairs.len(),
        });
    }
    let mut linear = linear;
    let ranks = choose_ranks(&mut linear, &kept_diffs, &spectra)?;
    let linear = match req.budget {
        Some(_) => budget_factors(&spectra, linear, &ranks)?,
        None => linear,
    };
    let (items, mut report) = assemble(pairs, &linear, &ranks, kept_diffs, req.to);
    for ((i, _), &r) in linear.iter().zip(&ranks) {
        if r == 0 {
            left_out.push(pairs[*i].canonical.clone());
        }
    }
    report.left_out = left_out;
    report.to = req.to.to_string();
    report.svd = req.method.as_str().into();
    report.device = Some(route.record());
    report.budget = req.budget;
    let mut out = match req.to {
        Convention::Peft => render_peft(&items)?,
        _ => render_comfy(&items),
    };
    // The values are the tuned model's differences from the base.
    let tuned = PathBuf::from(&inputs.tuned);
    report.nonfinite = out.check_values(Some(req.dtype), &tuned, &Origin::Base, req.nonfinite)?;
    out.convert_floats(req.dtype)?;
    report.tensor_bytes = out.tensors.iter().map(|t| t.bytes.len() as u64).sum();
    let release = write(&out, inputs, req, &report)?;
    Ok(ExtractOutcome {
        dir: release,
        report,
    })
}

/// (pair index, f32 difference) of the non-Linear parameters that differ.
type Diffs = Vec<(usize, Vec<f32>)>;

/// The full differences to write, and those left out: `--to peft` refuses them (before any
/// SVD runs) unless `--linear-only`, which leaves them out.
fn split_diffs(
    diffs: Diffs,
    pairs: &[TensorPair],
    req: &ExtractRequest,
) -> Result<(Diffs, Vec<String>), ExtractError> {
    if req.to != Convention::Peft {
        return Ok((diffs, Vec::new()));
    }
    let names: Vec<String> = diffs
        .iter()
        .map(|(i, _)| pairs[*i].canonical.clone())
        .collect();
    if !req.linear_only && !names.is_empty() {
        return Err(ExtractError::Inexpressible {
            to: req.to.to_string(),
            tensors: names,
        });
    }
    Ok((Vec::new(), names))
}

/// (pair index, f32 difference) of every differing non-Linear parameter, in pair order.
fn full_differences(
    pairs: &[TensorPair],
    source: &dyn DeltaSource,
) -> Result<Vec<(usize, Vec<f32>)>, ExtractError> {
    let others = pairs.iter().filter(|p| !p.is_linear()).count();
    let phase = progress::begin("comparing tensors", 0, others as u64);
    let found: Vec<Option<(usize, Vec<f32>)>> = pairs
        .par_iter()
        .enumerate()
        .filter(|(_, p)| !p.is_linear())
        .map(|(i, p)| {
            let d = source.delta(p)?;
            phase.add_item();
            Ok(d.map(|d| (i, d.iter().map(|x| *x as f32).collect())))
        })
        .collect::<Result<_, ExtractError>>()?;
    Ok(found.into_iter().flatten().collect())
}

/// What every module's spectrum is computed from: the pairs, where their ΔW comes from, the
/// request, and where the SVDs run.
struct Spectra<'a> {
    pairs: &'a [TensorPair],
    source: &'a dyn DeltaSource,
    req: &'a ExtractRequest,
    route: &'a SvdRoute,
}

impl Spectra<'_> {
    /// The spectrum of pair `p`'s ΔW (`None` when nothing differs).
    fn of(
        &self,
        p: &TensorPair,
        rule: Option<&RankRule>,
        max_rank: usize,
    ) -> Result<Option<Spectrum>, ExtractError> {
        let Some(d) = self.source.delta(p)? else {
            return Ok(None);
        };
        let dims = (p.shape[0], p.shape[1]);
        (self.route)
            .spectrum(&p.canonical, &d, dims, rule, max_rank, self.req.method)
            .map(Some)
    }
}

/// (pair index, spectrum) of every differing Linear weight, in pair order. With `--budget`
/// only a module's top singular values are computed (at twice its even share of the budget;
/// `choose_ranks` asks for more where the allocation needs them) and no vectors are kept;
/// [`budget_factors`] recomputes the vectors of the ranks allocated.
fn linear_deltas(spectra: &Spectra<'_>) -> Result<Vec<(usize, Spectrum)>, ExtractError> {
    let (pairs, req) = (spectra.pairs, spectra.req);
    let linear = pairs.iter().filter(|p| p.is_linear()).count();
    let phase = progress::begin("computing SVDs", 0, linear as u64);
    let modules = linear.max(1) as u64;
    let found: Vec<Option<(usize, Spectrum)>> = pairs
        .par_iter()
        .enumerate()
        .filter(|(_, p)| p.is_linear())
        .map(|(i, p)| {
            let (out, inp) = (p.shape[0], p.shape[1]);
            let (rule, max_rank) = match req.budget {
                // A first guess of twice a module's even share of the budget; the allocation
                // asks for more of any module it would give every value known (`choose_ranks`).
                Some(bytes) => {
                    let share = 2 * bytes / (modules * per_rank(p, req)).max(1);
                    (None, (share.max(8) as usize).min(budget_cap(p, req)))
                }
                None => (req.rule, out.min(inp)),
            };
            let found = spectra.of(p, rule.as_ref(), max_rank)?;
            phase.add_item();
            let Some(mut s) = found else {
                return Ok(None);
            };
            match (rule, req.budget) {
                // The rank is known now: keep only the vectors the factors need.
                (Some(rule), None) => s.keep_vectors(rule.pick(&s.top.S, s.total, s.top.S.len())),
                (_, Some(_)) => s.keep_vectors(0),
                (None, None) => {}
            }
            Ok(Some((i, s)))
        })
        .collect::<Result<_, ExtractError>>()?;
    Ok(found.into_iter().flatten().collect())
}

/// With `--budget`: the spectra again, for the modules given a rank, with the vectors of
/// exactly that rank (the singular values of the first pass chose the ranks; the report and
/// the factors come from this one, which is the SVD a `--rank r` extraction computes).
fn budget_factors(
    spectra: &Spectra<'_>,
    linear: Vec<(usize, Spectrum)>,
    ranks: &[usize],
) -> Result<Vec<(usize, Spectrum)>, ExtractError> {
    let given = ranks.iter().filter(|&&r| r > 0).count();
    let phase = progress::begin("computing factors", 0, given as u64);
    linear
        .into_par_iter()
        .zip(ranks.par_iter())
        .map(|((i, s), &r)| {
            if r == 0 {
                return Ok((i, s));
            }
            let rule = RankRule {
                rank: Some(r),
                energy: None,
            };
            let again = spectra.of(&spectra.pairs[i], Some(&rule), r)?;
            phase.add_item();
            Ok((i, again.unwrap_or(s)))
        })
        .collect()
}

/// The rank of every Linear module: the rule per module, or the budget across all.
/// Bytes of one rank of pair `p`'s factors: (out + in) elements of `--dtype`.
fn per_rank(p: &TensorPair, req: &ExtractRequest) -> u64 {
    (p.shape[0] + p.shape[1]) as u64 * element_bytes(req)
}

/// Bytes of one element of `--dtype` (an output float).
fn element_bytes(req: &ExtractRequest) -> u64 {
    req.dtype.element_bytes() as u64
}

/// The largest rank `--budget` could give pair `p`: the whole budget, its full rank, and
/// `--rank` when given.
fn budget_cap(p: &TensorPair, req: &ExtractRequest) -> usize {
    let afford = (req.budget.unwrap_or(0) / per_rank(p, req).max(1)).max(1) as usize;
    let cap = p.shape[0].min(p.shape[1]).min(afford);
    req.rule
        .and_then(|r| r.rank)
        .map_or(cap, |r| cap.min(r.max(1)))
}

fn choose_ranks(
    linear: &mut [(usize, Spectrum)],
    diffs: &[(usize, Vec<f32>)],
    spectra: &Spectra<'_>,
) -> Result<Vec<usize>, ExtractError> {
    let (req, pairs) = (spectra.req, spectra.pairs);
    let Some(budget) = req.budget else {
        let rule = req.rule.unwrap_or(RankRule {
            rank: None,
            energy: None,
        });
        return Ok(linear
            .iter()
            .map(|(_, s)| rule.pick(&s.top.S, s.total, s.top.S.len().min(s.cap())))
            .collect());
    };
    let fixed: u64 = (diffs.iter())
        .map(|(_, d)| d.len() as u64 * element_bytes(req))
        .sum();
    if fixed > budget {
        return Err(ExtractError::BudgetTooSmall { budget, fixed });
    }
    let known: Vec<Vec<f64>> = linear.iter().map(|(_, s)| s.top.S.clone()).collect();
    let costs: Vec<u64> = (linear.iter())
        .map(|(i, _)| per_rank(&pairs[*i], req))
        .collect();
    let caps: Vec<usize> = linear
        .iter()
        .map(|(i, _)| budget_cap(&pairs[*i], req))
        .collect();
    let (ranks, _) = allocate_expanding(known, &costs, &caps, budget - fixed, |grow| {
        let phase = progress::begin("more singular values", 0, grow.len() as u64);
        let again: Vec<Spectrum> = grow
            .par_iter()
            .map(|&(m, k)| {
                let p = &pairs[linear[m].0];
                let mut s = spectra.of(p, None, k)?.ok_or_else(|| {
                    ExtractError::Usage(format!("internal: `{}` stopped differing", p.canonical))
                })?;
                s.keep_vectors(0);
                phase.add_item();
                Ok(s)
            })
            .collect::<Result<_, ExtractError>>()?;
        Ok::<_, ExtractError>(
            grow.iter()
                .zip(again)
                .map(|(&(m, _), s)| {
                    let values = s.top.S.clone();
                    linear[m].1 = s;
                    values
                })
                .collect(),
        )
    })?;
    Ok(ranks)
}

/// The output entries in pair order (LoRA modules of rank ≥ 1 and kept diffs) and the report.
fn assemble(
    pairs: &[TensorPair],
    linear: &[(usize, Spectrum)],
    ranks: &[usize],
    diffs: Vec<(usize, Vec<f32>)>,
    to: Convention,
) -> (Vec<Extracted>, ExtractReport) {
    let mut entries: Vec<(usize, Extracted, ModuleReport)> = Vec::new();
    for ((i, s), &r) in linear.iter().zip(ranks) {
        if r == 0 {
            continue;
        }
        let p = &pairs[*i];
        let (energy, rel_error) = s.retained(r);
        entries.push((
            *i,
            Extracted::Lora {
                id: p.id.clone(),
                factors: s.factors(r),
            },
            ModuleReport {
                name: short_name(&p.id, to),
                kind: "lora",
                rank: Some(r),
                rank_in: None,
                energy: Some(energy),
                rel_error: Some(rel_error),
                shape: p.shape.clone(),
            },
        ));
    }
    for (i, data) in diffs {
        let p = &pairs[i];
        let kind = if p.role == Role::Bias {
            "diff_b"
        } else {
            "diff"
        };
        entries.push((
            i,
            Extracted::Diff {
                id: p.id.clone(),
                role: p.role,
                shape: p.shape.clone(),
                data,
            },
            ModuleReport {
                name: short_name(&p.id, to),
                kind,
                rank: None,
                rank_in: None,
                energy: None,
                rel_error: None,
                shape: p.shape.clone(),
            },
        ));
    }
    entries.sort_by_key(|(i, _, _)| *i);
    let mut report = ExtractReport::default();
    let items = entries
        .into_iter()
        .map(|(_, e, m)| {
            report.modules.push(m);
            e
        })
        .collect();
    (items, report)
}

fn write(
    out: &OwnedOutput,
    inputs: Inputs,
    req: &ExtractRequest,
    report: &ExtractReport,
) -> Result<PathBuf, ExtractError> {
    let mut options = serde_json::json!({
        "base": req.base.display().to_string(),
        "tuned": (!req.tuned.as_os_str().is_empty()).then(|| req.tuned.display().to_string()),
        "to": req.to.as_str(),
        "rank": req.rule.and_then(|r| r.rank),
        "energy": req.rule.and_then(|r| r.energy),
        "budget": req.budget,
        "linear_only": req.linear_only,
        "svd": req.method.as_str(),
        "dtype": req.dtype.as_str(),
        "built_from": req.provenance,
    });
    req.nonfinite.record(&mut options);
    let release = write_output(
        out,
        &req.out,
        req.replace,
        Provenance {
            command: "extract",
            options,
            report: serde_json::to_value(report)
                .map_err(|e| ExtractError::Usage(format!("internal: report: {e}")))?,
            inputs: inputs.to_hash,
            hashed: inputs.hashed,
            input_paths: inputs.paths,
        },
    )?;
    Ok(release.dir)
}

/// The tuned side as a base plus adapters.
pub struct FromAdapters<'a, V> {
    /// The base, opened.
    pub base: &'a BaseModel,
    /// The plan of merging the adapters into it in f32, in its own layout
    /// (`OutputOptions::f32_reference`), its base hashed.
    pub plan: &'a Ready<'a>,
    /// What computes each merged target's values (`merge::Merger::values_only`).
    pub values: &'a V,
}

/// Extracts `merge(base, adapters) − base`: each merged tensor is computed in memory by
/// `m.values` (the merge engine's exact per-tensor computation, in f32, as `wanbake merge
/// --dtype f32` writes), one at a time, and nothing but the adapter is written. The manifest
/// names the base and the adapters as inputs.
pub fn extract_from_adapters<V: TargetValues>(
    req: &ExtractRequest,
    m: FromAdapters<'_, V>,
) -> Result<ExtractOutcome, ExtractError> {
    req.check()?;
    let set = &m.base.single()?.tensors;
    let pairs = pair_models(&req.base, m.base, &req.base, m.base)?;
    let source = MergedStack::new(&req.base, m.plan, m.values, set);
    let adapters = m.plan.adapters;
    let paths = m
        .base
        .input_files()
        .into_iter()
        .chain(adapters.iter().flat_map(|a| a.set.input_files()))
        .collect();
    let names: Vec<String> = adapters
        .iter()
        .map(|a| format!("{}:{}", a.set.path.display(), a.strength))
        .collect();
    let inputs = Inputs {
        tuned: format!("the base merged with {}", names.join(", ")),
        to_hash: Vec::new(),
        hashed: m.plan.inputs.clone(),
        paths,
    };
    extract_pairs(req, &pairs, &source, inputs)
}
