//! Flax NNX / Qwix LoRA files: flattened NNX state paths joined with `.`, a Qwix LoRA
//! parameter pair `<path>.<param>_lora_a` (in, r) and `<path>.<param>_lora_b` (r, out) next
//! to the intercepted weight (spec conventions.md §8.2; golden/qwix/README.md).
//!
//! Owns: reading per-layer files (`blocks.0.attn1.query.kernel_lora_a`) and scanned ones
//! with the layer axis first (`blocks.attn1.query.kernel_lora_a` (L, in, r), the layout
//! Qwix produces inside an `nnx.vmap`-stacked block), as PyTorch-layout entries
//! A = aᵀ, B = bᵀ; σ = lora_alpha / lora_rank from the `__metadata__` (MaxText's field
//! names) or, without them, from the user's `--scale` and nowhere else; and writing
//! per-layer files.

use std::collections::BTreeMap;

use super::kinds::{Entry, Kind, ParamRole, ScaleSource, TensorSource};
use super::translate::{RenderCtx, Rendered, alpha_linear, kernel_of};
use super::{AdapterError, Convention, EntryProblem, KeyProblem, KeyRef, ParseInput, Parsed};

/// Metadata key of α.
pub const ALPHA_KEY: &str = "lora_alpha";
/// Metadata key of r.
pub const RANK_KEY: &str = "lora_rank";

#[derive(Default)]
struct Pair {
    a: Option<KeyRef>,
    b: Option<KeyRef>,
}

/// σ from the metadata, or an error saying how to pass it.
fn metadata_scale(input: &ParseInput<'_>) -> Result<Option<(f64, usize)>, AdapterError> {
    let err = |reason: String| AdapterError::Config {
        path: input.path.to_path_buf(),
        what: "NNX LoRA metadata".into(),
        reason,
    };
    match (input.metadata.get(ALPHA_KEY), input.metadata.get(RANK_KEY)) {
        (Some(a), Some(r)) => {
            let alpha: f64 = a
                .trim()
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite())
                .ok_or_else(|| err(format!("`{ALPHA_KEY}` = {a:?} is not a number")))?;
            let rank: usize =
                r.trim().parse().ok().filter(|&x| x > 0).ok_or_else(|| {
                    err(format!("`{RANK_KEY}` = {r:?} is not a positive integer"))
                })?;
            Ok(Some((alpha, rank)))
        }
        (None, None) => Ok(None),
        _ => Err(err(format!(
            "has only one of `{ALPHA_KEY}` and `{RANK_KEY}`"
        ))),
    }
}

/// The per-layer module path of a scanned path (layer index after the `blocks` component).
fn layer_path(path: &str, layer: usize) -> Option<String> {
    let parts: Vec<&str> = path.split('.').collect();
    let at = parts.iter().position(|p| *p == "blocks")?;
    if parts
        .get(at + 1)
        .is_some_and(|p| p.parse::<usize>().is_ok())
    {
        return None;
    }
    let mut v: Vec<String> = parts.iter().map(|s| s.to_string()).collect();
    v.insert(at + 1, layer.to_string());
    Some(v.join("."))
}

/// Reads a Qwix/NNX LoRA file.
pub fn parse(input: &ParseInput<'_>) -> Result<Parsed, AdapterError> {
    let meta = metadata_scale(input)?;
    if meta.is_none() && input.opts.scale.is_none() {
        let looked_in = match input.orbax {
            true => format!(
                "`{RANK_KEY}`/`{ALPHA_KEY}` in `custom_metadata[\"lora\"]` of _CHECKPOINT_METADATA \
                 (the step's for a CheckpointManager root or a step folder, the item's for an \
                 item folder)"
            ),
            false => format!("`{ALPHA_KEY}`/`{RANK_KEY}` metadata"),
        };
        return Err(AdapterError::ScaleNeeded {
            path: input.path.to_path_buf(),
            looked_in,
            orbax: input.orbax,
        });
    }
    let mut problems = Vec::new();
    let mut pairs: BTreeMap<String, Pair> = BTreeMap::new();
    for k in &input.keys {
        let (stem, is_a) = match (
            k.name.strip_suffix("_lora_a"),
            k.name.strip_suffix("_lora_b"),
        ) {
            (Some(s), _) => (s, true),
            (_, Some(s)) => (s, false),
            _ => {
                problems.push(KeyProblem {
                    key: k.name.clone(),
                    reason: "not a Qwix LoRA parameter (`<param>_lora_a` / `<param>_lora_b`)"
                        .into(),
                });
                continue;
            }
        };
        let Some(module) = stem.strip_suffix(".kernel") else {
            problems.push(KeyProblem {
                key: k.name.clone(),
                reason: "Qwix LoRA on a parameter other than a Dense `kernel` is not supported"
                    .into(),
            });
            continue;
        };
        let p = pairs.entry(module.to_string()).or_default();
        if is_a {
            p.a = Some(k.clone())
        } else {
            p.b = Some(k.clone())
        }
    }
    let mut entries = Vec::new();
    for (module, pair) in pairs {
        let keys: Vec<&KeyRef> = [&pair.a, &pair.b].into_iter().flatten().collect();
        match module_entries(&module, &pair, meta) {
            Ok(mut es) => entries.append(&mut es),
            Err(reason) => problems.extend(keys.iter().map(|k| KeyProblem {
                key: k.name.clone(),
                reason: reason.clone(),
            })),
        }
    }
    Ok(Parsed {
        entries,
        unparsed: problems,
        notes: Vec::new(),
    })
}

fn module_entries(
    module: &str,
    p: &Pair,
    meta: Option<(f64, usize)>,
) -> Result<Vec<Entry>, String> {
    let (Some(a), Some(b)) = (&p.a, &p.b) else {
        return Err(format!(
            "module `{module}` has only one of kernel_lora_a / kernel_lora_b"
        ));
    };
    let (layers, inp, r, rb, out) = match (&a.shape[..], &b.shape[..]) {
        ([inp, r], [rb, out]) => (None, *inp, *r, *rb, *out),
        ([l, inp, r], [lb, rb, out]) if l == lb => (Some(*l), *inp, *r, *rb, *out),
        _ => {
            return Err(format!(
                "`{}` {:?} / `{}` {:?}: expected (in, r) / (r, out), or (L, in, r) / (L, r, out) with the layer axis first",
                a.name, a.shape, b.name, b.shape
            ));
        }
    };
    if r != rb || r == 0 {
        return Err(format!(
            "rank mismatch: `{}` {:?}, `{}` {:?}",
            a.name, a.shape, b.name, b.shape
        ));
    }
    if let Some((_, mr)) = meta
        && mr != r
    {
        return Err(format!(
            "metadata says lora_rank {mr} but `{}` has rank {r}",
            a.name
        ));
    }
    let make = |name: String, layer: Option<usize>| {
        let mut e = Entry::new(name, Kind::Lora);
        let src = |k: &KeyRef, shape: Vec<usize>| TensorSource {
            file: k.file,
            key: k.name.clone(),
            layer,
            transpose: true,
            shape,
        };
        e.params.insert(ParamRole::A, src(a, vec![r, inp]));
        e.params.insert(ParamRole::B, src(b, vec![out, r]));
        e.rank = Some(r);
        if let Some((alpha, mr)) = meta {
            e.alpha = Some(alpha);
            e.scale = alpha / mr as f64;
            e.scale_source = ScaleSource::NnxMetadata;
        }
        e.source_keys = vec![a.name.clone(), b.name.clone()];
        e
    };
    match layers {
        None => Ok(vec![make(module.to_string(), None)]),
        Some(l) => {
            (0..l)
                .map(|i| {
                    layer_path(module, i).map(|n| make(n, Some(i))).ok_or_else(|| {
                    format!("stacked (L, …) factors outside a `blocks` scan container: `{module}`")
                })
                })
                .collect()
        }
    }
}

/// Renders a per-layer Qwix/NNX file with `lora_alpha` / `lora_rank` metadata.
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let entries = &ctx.set.entries;
    let mut problems = Vec::new();
    let mut tensors = Vec::new();
    let first = entries.first();
    let (rank0, scale0) = (first.and_then(|e| e.rank), first.map_or(1.0, |e| e.scale));
    for (i, e) in entries.iter().enumerate() {
        if e.kind != Kind::Lora {
            problems.push(ctx.problem(i, "Qwix LoRA is plain LoRA on kernels only"));
            continue;
        }
        if kernel_of(e).is_some() {
            problems.push(ctx.problem(i, "a conv LoRA: Qwix conv factors use the (*kernel, in, r) layout, which wanbake does not write"));
            continue;
        }
        if e.rank != rank0 || e.scale != scale0 {
            problems.push(ctx.problem(i, format!(
                "NNX metadata holds one lora_rank and lora_alpha; this entry has rank {} σ {}, the first rank {} σ {scale0}",
                e.rank.unwrap_or(0), e.scale, rank0.unwrap_or(0)
            )));
            continue;
        }
        let name = ctx.ids[i].spell(Convention::Nnx);
        let shape = |role: ParamRole| {
            let s = e.param(role).map(|s| s.shape.clone()).unwrap_or_default();
            s.into_iter().rev().collect::<Vec<_>>()
        };
        for (role, suffix) in [
            (ParamRole::A, "kernel_lora_a"),
            (ParamRole::B, "kernel_lora_b"),
        ] {
            match ctx.param(i, role, format!("{name}.{suffix}"), shape(role), true) {
                Ok(t) => tensors.push(t),
                Err(p) => problems.push(p),
            }
        }
    }
    let alpha = first.and_then(alpha_linear);
    let (Some(alpha), Some(rank), true) = (alpha, rank0, problems.is_empty()) else {
        if problems.is_empty() {
            problems.push(ctx.problem(
                0,
                format!("no lora_alpha reproduces σ = {scale0} exactly as alpha/rank"),
            ));
        }
        return Err(problems);
    };
    Ok(Rendered {
        stem: ctx.stem.clone(),
        tensors,
        metadata: BTreeMap::from([
            (ALPHA_KEY.to_string(), format!("{alpha:?}")),
            (RANK_KEY.to_string(), rank.to_string()),
        ]),
        sidecars: Vec::new(),
        notes: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scanned_paths_get_the_layer_after_blocks() {
        assert_eq!(
            layer_path("blocks.attn1.query", 2).as_deref(),
            Some("blocks.2.attn1.query")
        );
        assert_eq!(layer_path("proj_out", 0), None);
        assert_eq!(layer_path("blocks.0.attn1.query", 1), None);
    }
}
