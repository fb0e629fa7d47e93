//! Writing PEFT LOHA/LOKR folders: LyCORIS LoHa and LoKr modules on Linear targets as the
//! `LoHaConfig` / `LoKrConfig` adapters PEFT 0.21 loads (`PeftModel.from_pretrained`).
//!
//! Owns: PEFT's factorization rule ([`factorization`], as `peft/tuners/lokr/layer.py`),
//! choosing the folder-wide `decompose_factor` and `decompose_both` and each module's `r` so
//! that PEFT creates exactly the factors the module has (Linear: `(a, b) = factorization(out,
//! f)`, `(c, d) = factorization(in, f)`, `use_w1 = !(decompose_both && r < max(a, c)/2)`,
//! `use_w2 = r >= max(b, d)/2`), α = σ·r (PEFT scales every module, both-full LoKr included,
//! by α/r), and the config. Refuses, module by module with the reason, what a PEFT folder
//! cannot hold: conv targets (PEFT has no Conv3d LoHa/LoKr), a mix of LoHa, LoKr and other
//! kinds (a folder has one `peft_type`), factors no folder-wide `decompose_factor` explains,
//! ranks PEFT's rule would lay out differently. Does not own: reading them back
//! (`adapter::peft`), the config's rank/α patterns (`peft_config::ConfigPlan`), copying the
//! tensors (`translate`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::kinds::{Kind, ParamRole};
use super::lycoris::suffix_of;
use super::names::ModuleId;
use super::peft_config::ConfigPlan;
use super::translate::{RenderCtx, Rendered, alpha_for, kernel_of};
use super::{Entry, EntryProblem};

/// PEFT's (and LyCORIS's) `factorization(dimension, factor)`: `(m, n)` with `m·n =
/// dimension` and `m ≤ n`; `factor` divides exactly when it can, else `m` is the largest
/// divisor not above `factor` (any, for `-1`) on the way towards √dimension.
pub fn factorization(dimension: usize, factor: i64) -> (usize, usize) {
    if factor > 0 && dimension.is_multiple_of(factor as usize) {
        return (factor as usize, dimension / factor as usize);
    }
    let limit = if factor == -1 {
        dimension
    } else {
        factor.max(0) as usize
    };
    let (mut m, mut n) = (1, dimension);
    let length = m + n;
    while m < n {
        let mut new_m = m + 1;
        while !dimension.is_multiple_of(new_m) {
            new_m += 1;
        }
        let new_n = dimension / new_m;
        if new_m + new_n > length || new_m > limit {
            break;
        }
        (m, n) = (new_m, new_n);
    }
    if m > n {
        (m, n) = (n, m);
    }
    (m, n)
}

/// A Linear LoKr's factor shapes: W1 is `a × c`, W2 is `b × d` (out = a·b, in = c·d), each
/// stored full (`None`) or as a product of the given rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KronShape {
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    w1_rank: Option<usize>,
    w2_rank: Option<usize>,
}

fn shape2(e: &Entry, role: ParamRole) -> Option<[usize; 2]> {
    match e.param(role)?.shape.as_slice() {
        &[r, c] => Some([r, c]),
        _ => None,
    }
}

impl KronShape {
    /// The shapes, or `None` for anything but 2-D factors (conv, Tucker).
    fn of(e: &Entry) -> Option<KronShape> {
        if e.param(ParamRole::LokrT2).is_some() {
            return None;
        }
        let (a, c, w1_rank) = match shape2(e, ParamRole::LokrW1) {
            Some([a, c]) => (a, c, None),
            None => {
                let [a, r] = shape2(e, ParamRole::LokrW1A)?;
                let [_, c] = shape2(e, ParamRole::LokrW1B)?;
                (a, c, Some(r))
            }
        };
        let (b, d, w2_rank) = match shape2(e, ParamRole::LokrW2) {
            Some([b, d]) => (b, d, None),
            None => {
                let [b, r] = shape2(e, ParamRole::LokrW2A)?;
                let [_, d] = shape2(e, ParamRole::LokrW2B)?;
                (b, d, Some(r))
            }
        };
        Some(KronShape {
            a,
            b,
            c,
            d,
            w1_rank,
            w2_rank,
        })
    }

    /// Does `factorization` with `factor` give these shapes?
    fn explained_by(&self, factor: i64) -> bool {
        factorization(self.a * self.b, factor) == (self.a, self.b)
            && factorization(self.c * self.d, factor) == (self.c, self.d)
    }

    /// The `r` PEFT must be given to create these factors under `decompose_both`, or why
    /// none exists. Both factors full leave `r` free above PEFT's threshold: `stated` (the
    /// r the module's own α and σ imply, e.g. a PEFT folder's) when it qualifies, else the
    /// least that does.
    fn rank(&self, decompose_both: bool, stated: Option<usize>) -> Result<usize, String> {
        let half1 = self.a.max(self.c) as f64 / 2.0;
        let half2 = self.b.max(self.d) as f64 / 2.0;
        let r = match (self.w1_rank, self.w2_rank) {
            (Some(r1), Some(r2)) if r1 != r2 => {
                return Err(format!(
                    "its factors have ranks {r1} (W1) and {r2} (W2); PEFT gives both one r"
                ));
            }
            (Some(r), _) | (None, Some(r)) => r,
            (None, None) => {
                let need1 = if decompose_both { half1.ceil() } else { 0.0 };
                let least = half2.ceil().max(need1).max(1.0) as usize;
                stated.filter(|&r| r >= least).unwrap_or(least)
            }
        };
        let use_w1 = !(decompose_both && (r as f64) < half1);
        let use_w2 = (r as f64) >= half2;
        if use_w1 != self.w1_rank.is_none() || use_w2 != self.w2_rank.is_none() {
            let form = |full: bool| if full { "full" } else { "a product" };
            return Err(format!(
                "PEFT's rule with r = {r} and decompose_both = {decompose_both} makes W1 ({}×{}) \
                 {} and W2 ({}×{}) {}; this module stores W1 as {} and W2 as {}",
                self.a,
                self.c,
                form(use_w1),
                self.b,
                self.d,
                form(use_w2),
                form(self.w1_rank.is_none()),
                form(self.w2_rank.is_none()),
            ));
        }
        Ok(r)
    }
}

/// The first `decompose_factor` (every factor the modules show, then −1, then every value
/// up to the largest) that explains every module's shapes. Several can (a 4×8 split of 32
/// is both `factor 4` and `-1`); PEFT lays the module out the same under any of them.
fn decompose_factor(shapes: &[KronShape]) -> Option<i64> {
    let largest = shapes.iter().map(|s| s.a.max(s.c)).max().unwrap_or(1);
    let shown = shapes.iter().flat_map(|s| [s.a, s.c]);
    shown
        .map(|x| x as i64)
        .chain(std::iter::once(-1))
        .chain(1..=largest as i64)
        .find(|&f| shapes.iter().all(|s| s.explained_by(f)))
}

/// Renders a PEFT LOHA or LOKR folder (`peft_type` from the entries' kind).
pub fn render(ctx: &RenderCtx<'_>) -> Result<Rendered, Vec<EntryProblem>> {
    let entries = &ctx.set.entries;
    let kind = if entries.iter().any(|e| e.kind == Kind::Lokr) {
        Kind::Lokr
    } else {
        Kind::Loha
    };
    let mut problems: Vec<EntryProblem> = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind != kind)
        .map(|(i, e)| {
            ctx.problem(
                i,
                format!(
                    "a PEFT folder holds one adapter type, and this adapter's other modules are {}; \
                     this one is {}",
                    kind.as_str(),
                    e.kind.as_str()
                ),
            )
        })
        .collect();
    let conv = |i: usize, e: &Entry| {
        kernel_of(e).is_some()
            || matches!(&ctx.ids[i], ModuleId::Wan { diffusers, .. } if diffusers == "patch_embedding")
    };
    let mut config = BTreeMap::new();
    let linear: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].kind == kind)
        .filter(|&i| {
            let keep = !conv(i, &entries[i]);
            if !keep {
                problems.push(ctx.problem(
                    i,
                    "PEFT has no Conv3d LoHa/LoKr (its layers are Linear, Conv1d and Conv2d)",
                ));
            }
            keep
        })
        .collect();
    let ranks = match kind {
        Kind::Lokr => lokr_ranks(ctx, &linear, &mut problems, &mut config),
        _ => loha_ranks(ctx, &linear, &mut problems),
    };
    let both_full = kind == Kind::Lokr
        && ranks.keys().any(|&i| {
            KronShape::of(&entries[i]).is_some_and(|s| s.w1_rank.is_none() && s.w2_rank.is_none())
        });
    let (modules, tensors) = module_tensors(ctx, &ranks, &mut problems);
    if !problems.is_empty() {
        return Err(problems);
    }
    let plan = ConfigPlan::new(&modules, false, false, false);
    let peft_type = if kind == Kind::Lokr { "LOKR" } else { "LOHA" };
    let mut bytes = serde_json::to_vec_pretty(&config_json(&plan, peft_type, config))
        .expect("JSON values always serialise");
    bytes.push(b'\n');
    Ok(Rendered {
        stem: "adapter_model".into(),
        tensors,
        metadata: BTreeMap::from([("format".to_string(), "pt".to_string())]),
        sidecars: vec![("adapter_config.json".into(), bytes)],
        notes: both_full
            .then(|| {
                "PEFT scales a LoKr with both factors full by alpha/r too (LyCORIS by 1): its r is \
                 one PEFT lays out full (the module's own when it has one), its alpha r·σ"
                    .to_string()
            })
            .into_iter()
            .collect(),
    })
}

/// Per module (config path, r, α = σ·r) and its tensors under PEFT keys, copied as stored.
fn module_tensors(
    ctx: &RenderCtx<'_>,
    ranks: &BTreeMap<usize, usize>,
    problems: &mut Vec<EntryProblem>,
) -> (Vec<(String, usize, f64)>, Vec<super::translate::OutTensor>) {
    let entries = &ctx.set.entries;
    let mut modules = Vec::new();
    let mut tensors = Vec::new();
    for (&i, &r) in ranks {
        let e = &entries[i];
        let Some(alpha) = alpha_for(e.scale, r as f64) else {
            problems.push(ctx.problem(i, format!("no alpha gives σ = {} as alpha/{r}", e.scale)));
            continue;
        };
        modules.push((super::peft::config_path(&ctx.ids[i]), r, alpha));
        let name = ctx.ids[i].spell(super::Convention::Peft);
        for (&role, src) in &e.params {
            let suffix = suffix_of(role).unwrap_or("weight");
            match ctx.param(
                i,
                role,
                format!("{name}.{suffix}"),
                src.shape.clone(),
                false,
            ) {
                Ok(t) => tensors.push(t),
                Err(p) => problems.push(p),
            }
        }
    }
    (modules, tensors)
}

/// Each Linear LoKr's `r` (entry index → r), with the folder's `decompose_factor` and
/// `decompose_both` put in `config`; what PEFT cannot lay out goes to `problems`.
fn lokr_ranks(
    ctx: &RenderCtx<'_>,
    linear: &[usize],
    problems: &mut Vec<EntryProblem>,
    config: &mut BTreeMap<&'static str, Value>,
) -> BTreeMap<usize, usize> {
    let entries = &ctx.set.entries;
    let mut shapes = Vec::new();
    for &i in linear {
        match KronShape::of(&entries[i]) {
            Some(s) => shapes.push((i, s)),
            None => {
                problems.push(ctx.problem(i, "its factors are not the 2-D ones of a Linear LoKr"))
            }
        }
    }
    let all: Vec<KronShape> = shapes.iter().map(|(_, s)| *s).collect();
    let both = all.iter().any(|s| s.w1_rank.is_some());
    match decompose_factor(&all) {
        Some(f) => {
            config.insert("decompose_factor", Value::from(f));
            config.insert("decompose_both", Value::from(both));
        }
        None => problems.extend(shapes.iter().map(|&(i, s)| {
            ctx.problem(
                i,
                format!(
                    "no one decompose_factor gives every module's Kronecker split (this one: \
                     out {}·{}, in {}·{})",
                    s.a, s.b, s.c, s.d
                ),
            )
        })),
    }
    let mut ranks = BTreeMap::new();
    for (i, s) in shapes {
        let e = &entries[i];
        // The r a module's own α and σ imply (a PEFT folder's), kept when PEFT allows it.
        let stated = e
            .alpha
            .map(|a| a / e.scale)
            .filter(|r| r.is_finite() && *r >= 1.0 && r.fract() == 0.0)
            .map(|r| r as usize);
        match s.rank(both, stated) {
            Ok(r) => {
                ranks.insert(i, r);
            }
            Err(why) => problems.push(ctx.problem(i, why)),
        }
    }
    ranks
}

/// Each Linear LoHa's `r` (its factors' rank); anything else goes to `problems`.
fn loha_ranks(
    ctx: &RenderCtx<'_>,
    linear: &[usize],
    problems: &mut Vec<EntryProblem>,
) -> BTreeMap<usize, usize> {
    let mut ranks = BTreeMap::new();
    for &i in linear {
        let e = &ctx.set.entries[i];
        match (shape2(e, ParamRole::HadaW1A), e.rank) {
            (Some(_), Some(r)) if e.param(ParamRole::HadaT1).is_none() => {
                ranks.insert(i, r);
            }
            _ => problems.push(ctx.problem(i, "its factors are not the 2-D ones of a Linear LoHa")),
        }
    }
    ranks
}

/// The `LoHaConfig` / `LoKrConfig` fields PEFT 0.21.2 saves, with the plan's r, α and
/// patterns (`lora_alpha` is `alpha` here) and `extra` (LoKr's decomposition).
fn config_json(plan: &ConfigPlan, peft_type: &str, extra: BTreeMap<&str, Value>) -> Value {
    let lora = plan.to_json();
    let mut m = serde_json::Map::new();
    m.insert("peft_type".into(), peft_type.into());
    m.insert("r".into(), lora["r"].clone());
    m.insert("alpha".into(), lora["lora_alpha"].clone());
    m.insert("rank_pattern".into(), lora["rank_pattern"].clone());
    m.insert("alpha_pattern".into(), lora["alpha_pattern"].clone());
    m.insert("target_modules".into(), lora["target_modules"].clone());
    m.insert("rank_dropout".into(), Value::from(0.0));
    m.insert("module_dropout".into(), Value::from(0.0));
    m.insert("use_effective_conv2d".into(), false.into());
    m.insert("init_weights".into(), true.into());
    m.insert("exclude_modules".into(), Value::Null);
    m.insert("layers_to_transform".into(), Value::Null);
    m.insert("layers_pattern".into(), Value::Null);
    m.insert("modules_to_save".into(), Value::Null);
    m.insert("inference_mode".into(), true.into());
    m.insert("task_type".into(), Value::Null);
    m.insert("base_model_name_or_path".into(), Value::Null);
    if peft_type == "LOKR" {
        m.insert("rank_dropout_scale".into(), false.into());
    }
    for (k, v) in extra {
        m.insert(k.into(), v);
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::factorization;

    #[test]
    fn factorization_matches_peft_docstring_and_goldens() {
        // peft/tuners/lokr/layer.py's docstring examples.
        assert_eq!(factorization(256, -1), (16, 16));
        assert_eq!(factorization(128, -1), (8, 16));
        assert_eq!(factorization(127, -1), (1, 127));
        assert_eq!(factorization(128, 4), (4, 32));
        // The golden PEFT LOKR folder (decompose_factor 4): 80 = 4·20, 32 = 4·8.
        assert_eq!(factorization(80, 4), (4, 20));
        assert_eq!(factorization(32, 4), (4, 8));
        // A factor that does not divide: the largest divisor on the way, not above it.
        assert_eq!(factorization(90, 4), (3, 30));
    }
}
