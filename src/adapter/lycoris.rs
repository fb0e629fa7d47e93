//! LyCORIS modules in canonical form (spec lycoris.md §1, §2).
//!
//! Owns: `Param` (one stored LyCORIS tensor as f32 with its shape), `Factor`, `Module` (one
//! LyCORIS module's tensors by kind: LoHa, LoKr, Diag-OFT, BOFT, GLoRA, (IA)³, full),
//! `Module::from_tensors` (the kind detected from the tensor suffixes alone, no metadata),
//! `Module::scale_rule` (the scale and why: LoKr with both factors full is scale 1 whatever the
//! stored alpha says), `LycorisError` (naming the module and the shapes), reading LyCORIS
//! modules out of any naming's key set (`take_modules` / `with_modules`: the module is
//! whatever precedes a LyCORIS suffix, so `lycoris_…`, kohya `lora_unet_…`, ComfyUI and PEFT
//! names all work, and the name is resolved later against the base by `bind`), the canonical
//! entry of a module (kind, roles, rank, σ and why) and back (`module_of`), the fit of a
//! module to its target (`Module::fit`, through `check_entry` when binding: the one place
//! each LyCORIS shape rule lives; its `Fit` holds every dimension the formulas need and is
//! kept on the binding), and the fitted module with its loaded tensors that the merge
//! computes with (`Fitted`, whose tensors are checked against the fit, not the rules again).
//! Does not own: the formulas (`merge::lycoris`), name resolution (`bind`, `names`).
//!
//! `scale_rule` is LyCORIS's (files written by lycoris-lora, kohya/musubi). PEFT LOHA/LOKR
//! folders follow another rule that a PEFT reader must apply instead: PEFT 0.21.2 scales by
//! the config's `alpha / r` (after `rank_pattern`/`alpha_pattern`) for every module, a LoKr
//! with both factors full included (`tuners/lokr/layer.py`: `scaling = alpha / r`,
//! `make_kron(w1, w2, scaling)`).

use std::collections::BTreeMap;

use thiserror::Error;

use super::grammar::ScaleInfo;
use super::kinds::{Entry, Kind, ParamRole, ScaleSource};
use super::{KeyProblem, KeyRef, ParseInput};
use crate::io::DType;

/// One stored tensor, widened to f32, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// Its shape as stored.
    pub shape: Vec<usize>,
    /// Its values.
    pub data: Vec<f32>,
}

impl Param {
    /// A tensor from a shape and values (their counts are checked where it is used).
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Param {
        Param { shape, data }
    }

    /// The element count its shape implies.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A LoKr factor: stored full, or as the product `a@b`.
#[derive(Clone, Debug, PartialEq)]
pub enum Factor {
    /// `lokr_w1` / `lokr_w2`.
    Full(Param),
    /// `lokr_w1_a@lokr_w1_b` / `lokr_w2_a@lokr_w2_b`.
    Product(Param, Param),
    /// Tucker W2 (conv only): `lokr_t2 (r,r,*k)`, `lokr_w2_a (r,out_k)`, `lokr_w2_b (r,in_n)`.
    Tucker {
        /// `lokr_t2`.
        t: Param,
        /// `lokr_w2_a`, transposed vs the plain form.
        a: Param,
        /// `lokr_w2_b`.
        b: Param,
    },
}

/// One LyCORIS module's tensors, by kind (spec lycoris.md §1, §2).
#[derive(Clone, Debug, PartialEq)]
pub enum Module {
    /// `hada_w1_a (out,r)`, `hada_w1_b (r,in')`, `hada_w2_a`, `hada_w2_b`, `alpha`.
    Loha {
        /// `hada_w1_a`.
        w1_a: Param,
        /// `hada_w1_b`.
        w1_b: Param,
        /// `hada_w2_a`.
        w2_a: Param,
        /// `hada_w2_b`.
        w2_b: Param,
        /// Tucker cores `hada_t1`, `hada_t2` (r,r,*k) (conv only; then `hada_w*_a` is (r,out)
        /// and `hada_w*_b` (r,in)).
        t: Option<(Param, Param)>,
        /// `alpha`, if stored.
        alpha: Option<f64>,
    },
    /// `ΔW = s·kron(W1, W2)`.
    Lokr {
        /// W1.
        w1: Factor,
        /// W2, on the (out_k, in_n·∏k) view.
        w2: Factor,
        /// `alpha`, if stored.
        alpha: Option<f64>,
    },
    /// `oft_blocks (n,b,b)`, `alpha` = constraint, optional `rescale (out,…)`.
    DiagOft {
        /// `oft_blocks`.
        blocks: Param,
        /// The constraint (0 or absent: none).
        alpha: Option<f64>,
        /// `rescale`.
        rescale: Option<Param>,
    },
    /// `oft_blocks (m,n,b,b)`, `alpha` = constraint, optional `rescale`.
    Boft {
        /// `oft_blocks`.
        blocks: Param,
        /// The constraint (0 or absent: none).
        alpha: Option<f64>,
        /// `rescale`.
        rescale: Option<Param>,
    },
    /// `a1.weight (in',r)`, `a2.weight (r,in')`, `b1.weight (out,r)`, `b2.weight (r,in')`.
    Glora {
        /// `a1.weight`.
        a1: Param,
        /// `a2.weight`.
        a2: Param,
        /// `b1.weight`.
        b1: Param,
        /// `b2.weight`.
        b2: Param,
        /// `alpha`, if stored.
        alpha: Option<f64>,
    },
    /// `weight`, `on_input`.
    Ia3 {
        /// `weight`, (out,) or (in,).
        weight: Param,
        /// `on_input` (scales input columns when true).
        on_input: bool,
    },
    /// `diff` (target shape).
    Full {
        /// `diff`.
        diff: Param,
    },
}

/// A malformed or unsupported LyCORIS module.
#[derive(Debug, Error, PartialEq)]
pub enum LycorisError {
    /// Shapes that do not fit together or do not fit the target.
    #[error(
        "LyCORIS module `{module}` ({kind}): {what}{}; the file is malformed or was made for \
         another model",
        target_note(target)
    )]
    Shape {
        /// The module's name.
        module: String,
        /// Its kind.
        kind: &'static str,
        /// Expected vs found.
        what: String,
        /// The target's shape.
        target: Vec<usize>,
    },
    /// A LyCORIS feature wanbake does not compute.
    #[error("LyCORIS module `{module}` ({kind}): {what} is not supported by wanbake")]
    Unsupported {
        /// The module's name.
        module: String,
        /// Its kind.
        kind: &'static str,
        /// What.
        what: String,
    },
    /// Loaded tensors that are not what binding fitted (`Fitted::new`): an internal error.
    #[error("LyCORIS module `{module}` ({kind}): {what}, not the tensors binding checked")]
    Data {
        /// The module's name.
        module: String,
        /// Its kind.
        kind: &'static str,
        /// What differs.
        what: String,
    },
}

/// `; target weight is [..]` when a target is known.
fn target_note(target: &[usize]) -> String {
    if target.is_empty() {
        String::new()
    } else {
        format!("; target weight is {target:?}")
    }
}

/// The scale a module's delta is multiplied by, and why (spec lycoris.md §2).
#[derive(Clone, Debug, PartialEq)]
pub struct LycorisScale {
    /// The scale applied once.
    pub scale: f64,
    /// Why, for inspect and the report.
    pub why: String,
}

impl Module {
    /// The kind's name as LyCORIS spells its algorithm.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Module::Loha { .. } => "loha",
            Module::Lokr { .. } => "lokr",
            Module::DiagOft { .. } => "diag-oft",
            Module::Boft { .. } => "boft",
            Module::Glora { .. } => "glora",
            Module::Ia3 { .. } => "ia3",
            Module::Full { .. } => "full",
        }
    }

    /// The scale rule that applies to this module (LoHa/LoKr/GLoRA; the others have none).
    pub fn scale_rule(&self) -> LycorisScale {
        let ratio = |alpha: Option<f64>, r: usize, what: &str| match alpha {
            Some(a) if a != 0.0 && r > 0 => LycorisScale {
                scale: a / r as f64,
                why: format!("alpha {a} / rank {r} ({what})"),
            },
            Some(_) | None => LycorisScale {
                scale: 1.0,
                why: format!("scale 1: alpha absent or 0 means alpha = rank ({what})"),
            },
        };
        match self {
            Module::Loha { w1_b, alpha, .. } => ratio(*alpha, w1_b.shape[0], "rank of hada_w1_b"),
            Module::Lokr { w1, w2, alpha } => match (w1, w2) {
                (Factor::Full(_), Factor::Full(_)) => LycorisScale {
                    scale: 1.0,
                    why: format!(
                        "LoKr, both factors full: scale 1, stored alpha {} ignored",
                        alpha.map_or("none".to_string(), |a| a.to_string())
                    ),
                },
                (_, Factor::Product(_, b) | Factor::Tucker { b, .. }) => {
                    ratio(*alpha, b.shape[0], "rank of lokr_w2_b")
                }
                (Factor::Product(_, b) | Factor::Tucker { b, .. }, Factor::Full(_)) => {
                    ratio(*alpha, b.shape[0], "rank of lokr_w1_b")
                }
            },
            Module::Glora { a1, alpha, .. } => ratio(
                *alpha,
                a1.shape.get(1).copied().unwrap_or(0),
                "rank of a1.weight",
            ),
            Module::DiagOft { alpha, .. } | Module::Boft { alpha, .. } => LycorisScale {
                scale: 1.0,
                why: format!(
                    "no scale: stored alpha {} is the rotation constraint",
                    alpha.unwrap_or(0.0)
                ),
            },
            Module::Ia3 { .. } => LycorisScale {
                scale: 1.0,
                why: "no scale: (IA)³ has no alpha".into(),
            },
            Module::Full { .. } => LycorisScale {
                scale: 1.0,
                why: "no scale: full diff".into(),
            },
        }
    }

    /// The module from its tensors, keyed by suffix (`hada_w1_a`, `lokr_w1`, `oft_blocks`,
    /// `a1.weight`, `weight`, `on_input`, `diff`, `alpha`, …). The kind is read from the
    /// suffixes alone; `boft` vs `diag-oft` from the rank of `oft_blocks`. `diff_b` is not part
    /// of the weight's module (it is a bias diff) and is ignored here.
    pub fn from_tensors(module: &str, t: &BTreeMap<String, Param>) -> Result<Module, LycorisError> {
        let scalar = |k: &str| t.get(k).and_then(|p| p.data.first()).map(|&v| f64::from(v));
        let alpha = scalar("alpha");
        let missing = |kind: &'static str, what: &str| LycorisError::Shape {
            module: module.to_string(),
            kind,
            what: format!(
                "{what} is missing (found: {})",
                t.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            target: Vec::new(),
        };
        let unsupported = |kind: &'static str, what: &str| LycorisError::Unsupported {
            module: module.to_string(),
            kind,
            what: what.to_string(),
        };
        if t.contains_key("dora_scale") {
            return Err(unsupported(
                "lycoris",
                "weight decomposition (`dora_scale`)",
            ));
        }
        let get = |kind: &'static str, k: &str| t.get(k).cloned().ok_or_else(|| missing(kind, k));
        if t.keys().any(|k| k.starts_with("hada_")) {
            let tucker = if t.contains_key("hada_t1") || t.contains_key("hada_t2") {
                Some((get("loha", "hada_t1")?, get("loha", "hada_t2")?))
            } else {
                None
            };
            return Ok(Module::Loha {
                w1_a: get("loha", "hada_w1_a")?,
                w1_b: get("loha", "hada_w1_b")?,
                w2_a: get("loha", "hada_w2_a")?,
                w2_b: get("loha", "hada_w2_b")?,
                t: tucker,
                alpha,
            });
        }
        if t.keys().any(|k| k.starts_with("lokr_")) {
            if t.contains_key("lokr_t1") {
                return Err(unsupported("lokr", "a Tucker W1 (`lokr_t1`)"));
            }
            let fac = |n: &str| -> Result<Factor, LycorisError> {
                match t.get(n) {
                    Some(p) => Ok(Factor::Full(p.clone())),
                    None if n == "lokr_w2" && t.contains_key("lokr_t2") => Ok(Factor::Tucker {
                        t: get("lokr", "lokr_t2")?,
                        a: get("lokr", "lokr_w2_a")?,
                        b: get("lokr", "lokr_w2_b")?,
                    }),
                    None => {
                        let (a, b) = (format!("{n}_a"), format!("{n}_b"));
                        if !t.contains_key(&a) && !t.contains_key(&b) {
                            return Err(missing("lokr", &format!("{n} (or {a} and {b})")));
                        }
                        Ok(Factor::Product(get("lokr", &a)?, get("lokr", &b)?))
                    }
                }
            };
            return Ok(Module::Lokr {
                w1: fac("lokr_w1")?,
                w2: fac("lokr_w2")?,
                alpha,
            });
        }
        if let Some(blocks) = t.get("oft_blocks") {
            let rescale = t.get("rescale").cloned();
            return Ok(match blocks.shape.len() {
                4 => Module::Boft {
                    blocks: blocks.clone(),
                    alpha,
                    rescale,
                },
                _ => Module::DiagOft {
                    blocks: blocks.clone(),
                    alpha,
                    rescale,
                },
            });
        }
        if t.keys()
            .any(|k| k.starts_with("a1.") || k.starts_with("b1."))
        {
            if t.contains_key("bm.weight") {
                return Err(unsupported("glora", "`bm.weight`"));
            }
            return Ok(Module::Glora {
                a1: get("glora", "a1.weight")?,
                a2: get("glora", "a2.weight")?,
                b1: get("glora", "b1.weight")?,
                b2: get("glora", "b2.weight")?,
                alpha,
            });
        }
        if let Some(on) = scalar("on_input") {
            return Ok(Module::Ia3 {
                weight: get("ia3", "weight")?,
                on_input: on != 0.0,
            });
        }
        if let Some(diff) = t.get("diff") {
            return Ok(Module::Full { diff: diff.clone() });
        }
        Err(missing(
            "lycoris",
            "a LyCORIS factor (hada_*, lokr_*, oft_blocks, a1/b1.weight, on_input, diff)",
        ))
    }
}

/// Every stored LyCORIS factor: its suffix after `<module>.` and its canonical role. (IA)³'s
/// `weight` takes `Ia3Out` or `Ia3In` from the module's `on_input`.
pub const TENSORS: [(&str, ParamRole); 21] = [
    ("hada_w1_a", ParamRole::HadaW1A),
    ("hada_w1_b", ParamRole::HadaW1B),
    ("hada_w2_a", ParamRole::HadaW2A),
    ("hada_w2_b", ParamRole::HadaW2B),
    ("hada_t1", ParamRole::HadaT1),
    ("hada_t2", ParamRole::HadaT2),
    ("lokr_w1", ParamRole::LokrW1),
    ("lokr_w1_a", ParamRole::LokrW1A),
    ("lokr_w1_b", ParamRole::LokrW1B),
    ("lokr_w2", ParamRole::LokrW2),
    ("lokr_w2_a", ParamRole::LokrW2A),
    ("lokr_w2_b", ParamRole::LokrW2B),
    ("lokr_t2", ParamRole::LokrT2),
    ("oft_blocks", ParamRole::OftBlocks),
    ("rescale", ParamRole::Rescale),
    ("a1.weight", ParamRole::GloraA1),
    ("a2.weight", ParamRole::GloraA2),
    ("b1.weight", ParamRole::GloraB1),
    ("b2.weight", ParamRole::GloraB2),
    ("weight", ParamRole::Ia3Out),
    ("weight", ParamRole::Ia3In),
];

/// Suffixes that make a module a LyCORIS module (every factor but the ambiguous `weight`,
/// plus `on_input`, plus the LyCORIS-only `lokr_t1` and `bm.weight` so that they are
/// refused with a reason instead of being read as something else). `alpha`, `weight` and
/// `dora_scale` belong to a module that has one of these (a lone `dora_scale` is a LoRA's
/// DoRA, which the LoRA grammar refuses with its own reason).
fn is_marker(suffix: &str) -> bool {
    suffix == "on_input"
        || suffix == "lokr_t1"
        || suffix == "bm.weight"
        || TENSORS.iter().any(|(s, _)| *s == suffix && *s != "weight")
}

/// The stored suffix of a LyCORIS role.
pub fn suffix_of(role: ParamRole) -> Option<&'static str> {
    TENSORS.iter().find(|(_, r)| *r == role).map(|(s, _)| *s)
}

/// The value of a 0-d (or one-element) tensor, integer or float, widened to f64.
fn scalar_value(input: &ParseInput<'_>, k: &KeyRef) -> Result<f64, String> {
    let view = input
        .files
        .get(k.file)
        .and_then(|f| f.view(&k.name))
        .ok_or_else(|| format!("`{}`: no such tensor", k.name))?;
    if k.numel() != 1 {
        return Err(format!(
            "`{}` is {:?}, expected a single value",
            k.name, k.shape
        ));
    }
    let b = view.bytes;
    let int = |n: usize| -> Option<[u8; 8]> {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(b.get(..n)?);
        // sign-extend
        if n < 8 && b.get(n - 1).is_some_and(|x| x & 0x80 != 0) {
            a[n..].iter_mut().for_each(|x| *x = 0xff);
        }
        Some(a)
    };
    let v = match view.dtype {
        DType::I64 | DType::U64 => int(8).map(|a| i64::from_le_bytes(a) as f64),
        DType::I32 => int(4).map(|a| i64::from_le_bytes(a) as f64),
        DType::I16 => int(2).map(|a| i64::from_le_bytes(a) as f64),
        DType::I8 => int(1).map(|a| i64::from_le_bytes(a) as f64),
        DType::U8 | DType::BOOL => b.first().map(|&x| f64::from(x)),
        DType::F64 => b
            .get(..8)
            .and_then(|s| s.try_into().ok())
            .map(f64::from_le_bytes),
        d if d.is_float() => view
            .to_f32()
            .ok()
            .and_then(|v| v.first().map(|&x| f64::from(x))),
        _ => None,
    }
    .ok_or_else(|| format!("`{}` ({}) is not a readable number", k.name, view.dtype))?;
    if !v.is_finite() {
        return Err(format!("`{}` is {v}, not a finite number", k.name));
    }
    Ok(v)
}

/// How a convention scales LoHa/LoKr/GLoRA: LyCORIS's own rule (`Module::scale_rule`), or a
/// fixed σ per module from a config (PEFT LOHA/LOKR: `alpha / r` after the patterns).
pub enum ScalePolicy<'a> {
    /// lycoris-lora's files (`lycoris_…`, kohya `lora_unet_…`, ComfyUI names).
    Lycoris,
    /// σ, α and its source for a module name (PEFT).
    Config(&'a dyn Fn(&str) -> Result<ScaleInfo, String>),
}

/// The LyCORIS modules of a key set, as entries (targets unbound). `split(key)` gives
/// `(module, suffix)` for a key of the convention's naming. Returns the entries, the keys
/// that belong to a LyCORIS module but could not be used (with the reason), and every other
/// key, untouched, for the convention's LoRA grammar.
pub fn take_modules(
    input: &ParseInput<'_>,
    keys: Vec<KeyRef>,
    split: impl Fn(&str) -> Option<(String, String)>,
    policy: &ScalePolicy<'_>,
) -> (Vec<Entry>, Vec<KeyProblem>, Vec<KeyRef>) {
    let mut lyco: BTreeMap<String, BTreeMap<String, KeyRef>> = BTreeMap::new();
    for k in &keys {
        if let Some((m, s)) = split(&k.name).filter(|(_, s)| is_marker(s)) {
            lyco.entry(m).or_default().insert(s, k.clone());
        }
    }
    // A module that also holds keys no LyCORIS suffix explains (a `lora_down.weight` next to
    // a `hada_w1_a`) is refused; its `alpha` is left to the LoRA grammar so the LoRA keeps it.
    let mut mixed: BTreeMap<String, String> = BTreeMap::new();
    for k in &keys {
        let own = split(&k.name).is_some_and(|(m, _)| lyco.contains_key(&m));
        if let Some(m) = lyco
            .keys()
            .find(|m| !own && k.name.starts_with(&format!("{m}.")))
        {
            mixed.entry(m.clone()).or_insert_with(|| k.name.clone());
        }
    }
    let mut rest = Vec::new();
    for k in keys {
        let attached = split(&k.name).and_then(|(m, s)| {
            let extra = matches!(s.as_str(), "alpha" | "weight" | "dora_scale");
            let attach = is_marker(&s) || (extra && !mixed.contains_key(&m));
            lyco.get_mut(&m).filter(|_| attach).map(|g| (g, s))
        });
        match attached {
            Some((g, s)) => {
                g.insert(s, k);
            }
            None => rest.push(k),
        }
    }
    let mut entries = Vec::new();
    let mut problems = Vec::new();
    for (module, keys) in lyco {
        let entry = match mixed.get(&module) {
            Some(other) => Err(format!(
                "module `{module}` holds LyCORIS tensors and `{other}`: one module has one \
                 algorithm"
            )),
            None => entry_of(input, &module, &keys, policy),
        };
        match entry {
            Ok(e) => entries.push(e),
            Err(reason) => problems.extend(keys.values().map(|k| KeyProblem {
                key: k.name.clone(),
                reason: reason.clone(),
            })),
        }
    }
    (entries, problems, rest)
}

/// One LyCORIS module's keys (by suffix) as a canonical entry.
fn entry_of(
    input: &ParseInput<'_>,
    module: &str,
    keys: &BTreeMap<String, KeyRef>,
    policy: &ScalePolicy<'_>,
) -> Result<Entry, String> {
    let mut shapes: BTreeMap<String, Param> = BTreeMap::new();
    for (s, k) in keys {
        let data = match s.as_str() {
            "alpha" | "on_input" => vec![scalar_value(input, k)? as f32],
            _ => Vec::new(),
        };
        shapes.insert(s.clone(), Param::new(k.shape.clone(), data));
    }
    let alpha = match keys.get("alpha") {
        Some(k) => Some(scalar_value(input, k)?),
        None => None,
    };
    let m = Module::from_tensors(module, &shapes).map_err(|e| e.to_string())?;
    let roles = m.roles();
    let mut e = Entry::new(module, m.kind());
    for role in &roles {
        let suffix = suffix_of(*role).unwrap_or("weight");
        let k = keys
            .get(suffix)
            .ok_or_else(|| format!("module `{module}`: `{suffix}` is missing"))?;
        e.params.insert(*role, k.source(k.shape.clone()));
        e.source_keys.push(k.name.clone());
    }
    let used: Vec<&str> = roles.iter().filter_map(|r| suffix_of(*r)).collect();
    for (s, k) in keys {
        let ia3_extra = s == "on_input" && e.kind == Kind::Ia3;
        if s == "alpha" || ia3_extra {
            e.source_keys.push(k.name.clone());
        } else if !(used.contains(&s.as_str()) || s == "weight" && e.kind == Kind::Ia3) {
            return Err(format!(
                "module `{module}` is a LyCORIS {} module, which has no `{s}` tensor",
                m.kind_name()
            ));
        }
    }
    e.source_keys.sort();
    e.rank = m.rank();
    e.alpha = alpha;
    match (policy, e.kind) {
        (ScalePolicy::Config(rule), Kind::Loha | Kind::Lokr) => {
            let s = rule(module)?;
            e.scale = s.scale;
            e.alpha = s.alpha;
            e.scale_source = s.source;
        }
        _ => {
            let r = m.scale_rule();
            e.scale = r.scale;
            e.scale_source = ScaleSource::Lycoris { rule: r.why };
        }
    }
    Ok(e)
}

impl Module {
    /// The canonical kind.
    pub fn kind(&self) -> Kind {
        match self {
            Module::Loha { .. } => Kind::Loha,
            Module::Lokr { .. } => Kind::Lokr,
            Module::DiagOft { .. } => Kind::DiagOft,
            Module::Boft { .. } => Kind::Boft,
            Module::Glora { .. } => Kind::Glora,
            Module::Ia3 { .. } => Kind::Ia3,
            Module::Full { .. } => Kind::Diff,
        }
    }

    /// The roles of the tensors this module holds (scalars excluded).
    pub fn roles(&self) -> Vec<ParamRole> {
        use ParamRole::*;
        let fac = |f: &Factor, full, a, b| match f {
            Factor::Full(_) => vec![full],
            Factor::Product(..) => vec![a, b],
            Factor::Tucker { .. } => vec![LokrT2, a, b],
        };
        match self {
            Module::Loha { t, .. } => {
                let mut v = vec![HadaW1A, HadaW1B, HadaW2A, HadaW2B];
                if t.is_some() {
                    v.extend([HadaT1, HadaT2]);
                }
                v
            }
            Module::Lokr { w1, w2, .. } => {
                let mut v = fac(w1, LokrW1, LokrW1A, LokrW1B);
                v.extend(fac(w2, LokrW2, LokrW2A, LokrW2B));
                v
            }
            Module::DiagOft { rescale, .. } | Module::Boft { rescale, .. } => {
                let mut v = vec![OftBlocks];
                v.extend(rescale.as_ref().map(|_| Rescale));
                v
            }
            Module::Glora { .. } => vec![GloraA1, GloraA2, GloraB1, GloraB2],
            Module::Ia3 { on_input, .. } => vec![if *on_input { Ia3In } else { Ia3Out }],
            Module::Full { .. } => vec![ParamRole::Diff],
        }
    }

    /// The rank the scale rule divides by (LoHa, LoKr with a decomposed factor, GLoRA).
    pub fn rank(&self) -> Option<usize> {
        match self {
            Module::Loha { w1_b, .. } => w1_b.shape.first().copied(),
            Module::Lokr { w1, w2, .. } => match (w1, w2) {
                (_, Factor::Product(_, b) | Factor::Tucker { b, .. })
                | (Factor::Product(_, b) | Factor::Tucker { b, .. }, Factor::Full(_)) => {
                    b.shape.first().copied()
                }
                (Factor::Full(_), Factor::Full(_)) => None,
            },
            Module::Glora { a1, .. } => a1.shape.get(1).copied(),
            _ => None,
        }
    }
}

/// The module of a LyCORIS entry, from its tensors loaded as f32 (`data` by role).
pub fn module_of(
    entry: &Entry,
    data: &BTreeMap<ParamRole, Vec<f32>>,
) -> Result<Module, LycorisError> {
    let mut t: BTreeMap<String, Param> = BTreeMap::new();
    for (role, src) in &entry.params {
        if let Some(s) = suffix_of(*role) {
            let v = data.get(role).cloned().unwrap_or_default();
            t.insert(s.to_string(), Param::new(src.shape.clone(), v));
        }
        if matches!(role, ParamRole::Ia3Out | ParamRole::Ia3In) {
            let on = f32::from(u8::from(*role == ParamRole::Ia3In));
            t.insert("on_input".into(), Param::new(Vec::new(), vec![on]));
        }
    }
    if let Some(a) = entry.alpha {
        t.insert("alpha".into(), Param::new(Vec::new(), vec![a as f32]));
    }
    Module::from_tensors(&entry.module, &t)
}

/// A LyCORIS entry fitted to its target (PyTorch layout) when binding, before anything is
/// computed: `Module::fit` on the entry's shapes.
pub fn check_entry(entry: &Entry, target: &[usize]) -> Result<Fit, String> {
    let m = module_of(entry, &BTreeMap::new()).map_err(|e| e.to_string())?;
    m.fit(&entry.module, target).map_err(|e| e.to_string())
}

/// The fitted module of a bound LyCORIS entry: `fit` (made when binding) with the entry's
/// tensors loaded as f32 (`data` by role).
pub fn fitted(
    entry: &Entry,
    fit: Fit,
    data: &BTreeMap<ParamRole, Vec<f32>>,
) -> Result<Fitted, LycorisError> {
    Fitted::new(fit, module_of(entry, data)?, &entry.module)
}

/// A LyCORIS module fitted to its target (`Module::fit`, once, when binding): the target's
/// (out, in') view and every dimension the formulas of `merge::lycoris` index with. The
/// binding keeps it (`Binding::lycoris`) until the merge pairs it with the loaded tensors
/// (`Fitted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    /// Rows of the target.
    pub out: usize,
    /// Columns of its (out, in') view: in·∏k.
    pub inp: usize,
    /// The kind's dimensions.
    pub dims: FitDims,
}

/// The dimensions of a fitted module, by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitDims {
    /// `ΔW = s·W1 ⊙ W2`, both (out, in'), each a product or a Tucker product.
    Loha {
        /// W1.
        w1: FactorFit,
        /// W2.
        w2: FactorFit,
    },
    /// `ΔW = s·kron(W1, W2)`, W1 (a, b) and W2 (c, d) with a·c = out and b·d = in'.
    Lokr {
        /// W1.
        w1: FactorFit,
        /// W2, a conv W2 on its (out_k, in_n·∏k) view.
        w2: FactorFit,
    },
    /// `n` blocks of `b` rows, n·b = out.
    DiagOft {
        /// Blocks.
        n: usize,
        /// Rows of a block.
        b: usize,
    },
    /// `stages` (1 to log2(n)+1) of `n` blocks (a power of two) of `b` rows (even), n·b = out.
    Boft {
        /// Stages.
        stages: usize,
        /// Blocks per stage.
        n: usize,
        /// Rows of a block.
        b: usize,
    },
    /// `a1 (in', ra)`, `a2 (ra, in')`, `b1 (out, rb)`, `b2 (rb, in')`.
    Glora {
        /// Rank of a1·a2.
        ra: usize,
        /// Rank of b1·b2.
        rb: usize,
    },
    /// (IA)³: which channels the weight scales.
    Ia3(Ia3Side),
    /// `diff` of the target's shape.
    Full,
}

/// The channels an (IA)³ weight scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ia3Side {
    /// `on_input = 0`: one value per output row.
    Out,
    /// `on_input = 1`: one value per input channel (the target's `shape[1]`), each scaling
    /// the `per` = ∏k consecutive columns of its kernel.
    In {
        /// Columns per input channel.
        per: usize,
    },
}

/// The form of one factor of a product and its sizes: LoHa's W1 and W2 (a product or a
/// Tucker product), LoKr's W1 and W2 (any form).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FactorFit {
    /// Stored whole: (rows, cols) on its flattened view (a conv W2: (out_k, in_n·∏k)).
    Full {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// `a (rows, rank) @ b (rank, cols)`.
    Product {
        /// Rows.
        rows: usize,
        /// Inner dimension.
        rank: usize,
        /// Columns.
        cols: usize,
    },
    /// `W[p,q,…] = Σ_ij t[i,j,…]·a[i,p]·b[j,q]`, core `t (ra, rb, *k)`, `a (ra, rows)`,
    /// `b (rb, ch)`: (rows, ch·kernel).
    Tucker {
        /// Rows.
        rows: usize,
        /// First rank of the core.
        ra: usize,
        /// Second rank of the core.
        rb: usize,
        /// Input channels.
        ch: usize,
        /// ∏k of the core's (the target's) kernel.
        kernel: usize,
    },
}

impl FactorFit {
    /// Rows of the factor's view.
    pub fn rows(self) -> usize {
        match self {
            FactorFit::Full { rows, .. }
            | FactorFit::Product { rows, .. }
            | FactorFit::Tucker { rows, .. } => rows,
        }
    }

    /// Columns of the factor's view.
    pub fn cols(self) -> usize {
        match self {
            FactorFit::Full { cols, .. } | FactorFit::Product { cols, .. } => cols,
            FactorFit::Tucker { ch, kernel, .. } => ch * kernel,
        }
    }
}

/// One factor's tensors, borrowed: LoHa's pairs and LoKr's factors in one form.
#[derive(Clone, Copy, Debug)]
pub enum FactorRef<'a> {
    /// Stored whole.
    Full(&'a Param),
    /// `a`, `b` of `a@b`.
    Product(&'a Param, &'a Param),
    /// Core `t`, `a`, `b` of a Tucker product.
    Tucker(&'a Param, &'a Param, &'a Param),
}

impl<'a> FactorRef<'a> {
    /// A LoHa pair: `a@b`, or with core `t` its Tucker product.
    pub fn loha(a: &'a Param, b: &'a Param, t: Option<&'a Param>) -> FactorRef<'a> {
        match t {
            Some(t) => FactorRef::Tucker(t, a, b),
            None => FactorRef::Product(a, b),
        }
    }
}

impl<'a> From<&'a Factor> for FactorRef<'a> {
    fn from(f: &'a Factor) -> FactorRef<'a> {
        match f {
            Factor::Full(p) => FactorRef::Full(p),
            Factor::Product(a, b) => FactorRef::Product(a, b),
            Factor::Tucker { t, a, b } => FactorRef::Tucker(t, a, b),
        }
    }
}

/// Names of a factor's tensors in messages: [whole, a, b, Tucker core].
type FactorNames = [&'static str; 4];
const LOHA_W1: FactorNames = ["", "hada_w1_a", "hada_w1_b", "hada_t1"];
const LOHA_W2: FactorNames = ["", "hada_w2_a", "hada_w2_b", "hada_t2"];
const LOKR_W1: FactorNames = ["lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_t1"];
const LOKR_W2: FactorNames = ["lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2"];

/// A factor's form and sizes from its shapes, the one rule of each form: a whole factor is at
/// least 2-D with rows (a conv W2 is flattened), a product's inner dimensions agree, a Tucker
/// core `(ra, rb, *k)` goes with `a (ra, rows)` and `b (rb, ch)`, k the target's `kernel`,
/// which a matrix target does not have (lycoris-lora 4.1.3 makes cores for convolutions
/// only, `use_tucker` is ignored on a Linear, and its module for one has no core to load;
/// golden/lycoris/rules).
fn factor_fit(f: FactorRef<'_>, n: FactorNames, kernel: &[usize]) -> Result<FactorFit, String> {
    match f {
        FactorRef::Full(p) => match p.shape.split_first() {
            Some((&rows, rest)) if !rest.is_empty() && rows > 0 => Ok(FactorFit::Full {
                rows,
                cols: rest.iter().product(),
            }),
            _ => Err(format!("{} is {:?}, expected a matrix", n[0], p.shape)),
        },
        FactorRef::Product(a, b) => match (&a.shape[..], &b.shape[..]) {
            (&[rows, rank], &[rank2, cols]) if rank == rank2 => {
                Ok(FactorFit::Product { rows, rank, cols })
            }
            _ => Err(format!(
                "{} is {:?} and {} is {:?}: expected (m, r) and (r, n)",
                n[1], a.shape, n[2], b.shape
            )),
        },
        FactorRef::Tucker(t, ..) if kernel.is_empty() => Err(format!(
            "Tucker core {} is {:?}: a Tucker core belongs to a convolution, the target is a \
             matrix",
            n[3], t.shape
        )),
        FactorRef::Tucker(t, a, b) => match (&t.shape[..], &a.shape[..], &b.shape[..]) {
            ([ra, rb, k @ ..], &[ra2, rows], &[rb2, ch])
                if *ra == ra2 && *rb == rb2 && k == kernel =>
            {
                Ok(FactorFit::Tucker {
                    rows,
                    ra: *ra,
                    rb: *rb,
                    ch,
                    kernel: k.iter().product(),
                })
            }
            _ => Err(format!(
                "Tucker core {} is {:?}, {} is {:?}, {} is {:?}: expected (r1, r2, *k), (r1, out), \
                 (r2, in) with k the target's kernel {kernel:?}",
                n[3], t.shape, n[1], a.shape, n[2], b.shape
            )),
        },
    }
}

/// BOFT's stage i pairs rows 2^i·b/2 apart in groups of 2^i·b rows, which n·b rows hold
/// while 2^i ≤ n: 1 to log2(n)+1 stages for a power-of-two `n` (lycoris-lora 4.1.3,
/// `functional/boft.py`: `weight_gen` caps `boft_m` there and `_diff_weight`'s
/// `unflatten(0, (-1, 2, k))` fails past it; golden/lycoris/rules).
fn boft_stages_fit(stages: usize, n: usize) -> bool {
    stages >= 1 && stages - 1 <= n.trailing_zeros() as usize
}

impl Module {
    /// This module fitted to a target weight of `target` shape (PyTorch layout), from its
    /// tensors' shapes alone: the one place each LyCORIS shape rule lives. The refusal names
    /// the module, the shapes and the target.
    pub fn fit(&self, module: &str, target: &[usize]) -> Result<Fit, LycorisError> {
        let err = |what: String| LycorisError::Shape {
            module: module.to_string(),
            kind: self.kind_name(),
            what,
            target: target.to_vec(),
        };
        let (out, in_ch, kernel, inp) = match target {
            [o, i, k @ ..] if *o > 0 && *i * k.iter().product::<usize>() > 0 => {
                (*o, *i, k, *i * k.iter().product::<usize>())
            }
            _ => return Err(err("the target is not a weight matrix or kernel".into())),
        };
        let whole = |f: FactorFit, what: &str| {
            if (f.rows(), f.cols()) == (out, inp) {
                Ok(f)
            } else {
                Err(err(format!(
                    "{what} is ({}, {}), expected ({out}, {inp})",
                    f.rows(),
                    f.cols()
                )))
            }
        };
        let oft = |blocks: &Param, rescale: &Option<Param>, n: usize, b: usize| {
            if n * b != out {
                return Err(err(format!(
                    "oft_blocks is {:?}: {n} blocks of {b} rows cover {} rows, expected {out}",
                    blocks.shape,
                    n * b
                )));
            }
            match rescale {
                Some(r) if r.shape.first() != Some(&out) || r.numel() != out => Err(err(format!(
                    "rescale is {:?}, expected ({out}, 1, …)",
                    r.shape
                ))),
                _ => Ok(()),
            }
        };
        let dims = match self {
            Module::Loha {
                w1_a,
                w1_b,
                w2_a,
                w2_b,
                t,
                ..
            } => {
                let (t1, t2) = (t.as_ref().map(|x| &x.0), t.as_ref().map(|x| &x.1));
                let w1 = factor_fit(FactorRef::loha(w1_a, w1_b, t1), LOHA_W1, kernel);
                let w2 = factor_fit(FactorRef::loha(w2_a, w2_b, t2), LOHA_W2, kernel);
                FitDims::Loha {
                    w1: whole(w1.map_err(&err)?, "W1")?,
                    w2: whole(w2.map_err(&err)?, "W2")?,
                }
            }
            Module::Lokr { w1, w2, .. } => {
                let f1 = factor_fit(w1.into(), LOKR_W1, &[]).map_err(&err)?;
                let f2 = factor_fit(w2.into(), LOKR_W2, kernel).map_err(&err)?;
                let (a, b, c, d) = (f1.rows(), f1.cols(), f2.rows(), f2.cols());
                if a.checked_mul(c).zip(b.checked_mul(d)) != Some((out, inp)) {
                    return Err(err(format!(
                        "kron of W1 ({a}, {b}) and W2 ({c}, {d}) is ({}, {}), expected ({out}, {inp})",
                        a.saturating_mul(c),
                        b.saturating_mul(d)
                    )));
                }
                FitDims::Lokr { w1: f1, w2: f2 }
            }
            Module::DiagOft {
                blocks, rescale, ..
            } => match blocks.shape[..] {
                [n, b, b2] if b == b2 => {
                    oft(blocks, rescale, n, b)?;
                    FitDims::DiagOft { n, b }
                }
                _ => {
                    return Err(err(format!(
                        "oft_blocks is {:?}, expected (n, b, b)",
                        blocks.shape
                    )));
                }
            },
            Module::Boft {
                blocks, rescale, ..
            } => match blocks.shape[..] {
                [stages, n, b, b2]
                    if b == b2
                        && n.is_power_of_two()
                        && b.is_multiple_of(2)
                        && boft_stages_fit(stages, n) =>
                {
                    oft(blocks, rescale, n, b)?;
                    FitDims::Boft { stages, n, b }
                }
                _ => {
                    return Err(err(format!(
                        "oft_blocks is {:?}: BOFT needs (stages, n, b, b) with n a power of two, \
                         b even and at most log2(n)+1 stages",
                        blocks.shape
                    )));
                }
            },
            Module::Glora { a1, a2, b1, b2, .. } => {
                match (&a1.shape[..], &a2.shape[..], &b1.shape[..], &b2.shape[..]) {
                    (&[i1, ra], &[ra2, i2], &[o, rb], &[rb2, i3])
                        if (i1, i2, i3, o) == (inp, inp, inp, out) && ra == ra2 && rb == rb2 =>
                    {
                        FitDims::Glora { ra, rb }
                    }
                    _ => {
                        return Err(err(format!(
                            "a1.weight {:?}, a2.weight {:?}, b1.weight {:?}, b2.weight {:?}: \
                             expected ({inp}, r), (r, {inp}), ({out}, r'), (r', {inp})",
                            a1.shape, a2.shape, b1.shape, b2.shape
                        )));
                    }
                }
            }
            // lycoris-lora makes the weight (out,) or (in,) on a Linear and (1, out|in, 1, …)
            // on a conv, and multiplies W by it broadcast over shape[0] or shape[1]
            // (modules/ia3.py `_ia3_weight`): the input side is exactly the target's input
            // channels, each over its kernel's columns (golden/lycoris/rules).
            Module::Ia3 { weight, on_input } => {
                let len = weight.numel();
                let one_axis = weight.shape.iter().filter(|&&d| d != 1).count() <= 1;
                let channels = if *on_input { in_ch } else { out };
                if !(one_axis && len > 0 && len == channels) {
                    return Err(err(format!(
                        "weight is {:?} with on_input {}, expected the {} channels ({channels})",
                        weight.shape,
                        u8::from(*on_input),
                        if *on_input { "input" } else { "output" },
                    )));
                }
                FitDims::Ia3(if *on_input {
                    Ia3Side::In { per: inp / in_ch }
                } else {
                    Ia3Side::Out
                })
            }
            Module::Full { diff } => {
                if diff.shape != target {
                    return Err(err(format!(
                        "diff is {:?}, expected {target:?}",
                        diff.shape
                    )));
                }
                FitDims::Full
            }
        };
        Ok(Fit { out, inp, dims })
    }
}

/// A fitted module with its tensors loaded: what `merge::lycoris::delta` computes with. Made
/// only by `Fitted::new`, which checks that the module is of the fit's kind and factor forms
/// and that each tensor holds the values its fitted shape needs, so the formulas index
/// without checks of their own.
#[derive(Clone, Debug, PartialEq)]
pub struct Fitted {
    fit: Fit,
    module: Module,
}

impl Fitted {
    /// `module`, its tensors loaded, with the `fit` its shapes got when binding; `name` (the
    /// module's) goes into the error. Not a shape rule: a check that the loaded data is what
    /// was fitted (each size is the element count of a shape the fit accepted).
    pub fn new(fit: Fit, module: Module, name: &str) -> Result<Fitted, LycorisError> {
        let Fit { out, inp, dims } = fit;
        let mut sizes: Vec<(&str, &Param, usize)> = Vec::new();
        let same = match (dims, &module) {
            (
                FitDims::Loha { w1, w2 },
                Module::Loha {
                    w1_a,
                    w1_b,
                    w2_a,
                    w2_b,
                    t,
                    ..
                },
            ) => {
                let (t1, t2) = (t.as_ref().map(|x| &x.0), t.as_ref().map(|x| &x.1));
                factor_sizes(w1, FactorRef::loha(w1_a, w1_b, t1), LOHA_W1, &mut sizes)
                    && factor_sizes(w2, FactorRef::loha(w2_a, w2_b, t2), LOHA_W2, &mut sizes)
            }
            (FitDims::Lokr { w1, w2 }, Module::Lokr { w1: f1, w2: f2, .. }) => {
                factor_sizes(w1, f1.into(), LOKR_W1, &mut sizes)
                    && factor_sizes(w2, f2.into(), LOKR_W2, &mut sizes)
            }
            (
                FitDims::DiagOft { n, b },
                Module::DiagOft {
                    blocks, rescale, ..
                },
            ) => {
                sizes.push(("oft_blocks", blocks, n * b * b));
                sizes.extend(rescale.as_ref().map(|r| ("rescale", r, out)));
                true
            }
            (
                FitDims::Boft { stages, n, b },
                Module::Boft {
                    blocks, rescale, ..
                },
            ) => {
                sizes.push(("oft_blocks", blocks, stages * n * b * b));
                sizes.extend(rescale.as_ref().map(|r| ("rescale", r, out)));
                true
            }
            (FitDims::Glora { ra, rb }, Module::Glora { a1, a2, b1, b2, .. }) => {
                sizes.extend([
                    ("a1.weight", a1, inp * ra),
                    ("a2.weight", a2, ra * inp),
                    ("b1.weight", b1, out * rb),
                    ("b2.weight", b2, rb * inp),
                ]);
                true
            }
            (FitDims::Ia3(side), Module::Ia3 { weight, on_input }) => {
                let (len, input) = match side {
                    Ia3Side::Out => (out, false),
                    Ia3Side::In { per } => (inp / per, true),
                };
                sizes.push(("weight", weight, len));
                input == *on_input
            }
            (FitDims::Full, Module::Full { diff }) => {
                sizes.push(("diff", diff, out * inp));
                true
            }
            _ => false,
        };
        let data_err = |what: String| LycorisError::Data {
            module: name.to_string(),
            kind: module.kind_name(),
            what,
        };
        if !same {
            return Err(data_err(format!(
                "its tensors are not the module binding fitted ({dims:?})"
            )));
        }
        if let Some((tensor, p, want)) = sizes.iter().find(|(_, p, want)| p.data.len() != *want) {
            return Err(data_err(format!(
                "{tensor} holds {} values, its fitted shape {:?} needs {want}",
                p.data.len(),
                p.shape
            )));
        }
        Ok(Fitted { fit, module })
    }

    /// The fit.
    pub fn fit(&self) -> &Fit {
        &self.fit
    }

    /// The module, its tensors loaded.
    pub fn module(&self) -> &Module {
        &self.module
    }
}

/// The tensors of factor `r` with the values each must hold by fit `f`; false when `r` is not
/// of `f`'s form.
fn factor_sizes<'a>(
    f: FactorFit,
    r: FactorRef<'a>,
    n: FactorNames,
    sizes: &mut Vec<(&'static str, &'a Param, usize)>,
) -> bool {
    match (f, r) {
        (FactorFit::Full { rows, cols }, FactorRef::Full(p)) => sizes.push((n[0], p, rows * cols)),
        (FactorFit::Product { rows, rank, cols }, FactorRef::Product(a, b)) => {
            sizes.extend([(n[1], a, rows * rank), (n[2], b, rank * cols)]);
        }
        (
            FactorFit::Tucker {
                rows,
                ra,
                rb,
                ch,
                kernel,
            },
            FactorRef::Tucker(t, a, b),
        ) => sizes.extend([
            (n[3], t, ra * rb * kernel),
            (n[1], a, ra * rows),
            (n[2], b, rb * ch),
        ]),
        _ => return false,
    }
    true
}

/// Every suffix `take_modules` splits off, longest first so `x.a1.weight` is module `x`.
fn suffixes() -> &'static [&'static str] {
    static S: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let mut v: Vec<&str> = TENSORS.iter().map(|(s, _)| *s).collect();
        v.extend(["on_input", "alpha", "lokr_t1", "bm.weight", "dora_scale"]);
        v.sort_by_key(|s| std::cmp::Reverse(s.len()));
        v.dedup();
        v
    })
}

/// `(module, suffix)` of a key `<module>.<suffix>` for a LyCORIS suffix (any naming: the
/// module is whatever precedes it, dotted or underscored).
pub fn split_key(key: &str) -> Option<(String, String)> {
    suffixes().iter().find_map(|s| {
        let m = key.strip_suffix(s)?.strip_suffix('.')?;
        (!m.is_empty()).then(|| (m.to_string(), s.to_string()))
    })
}

/// A convention's LoRA parse with its LyCORIS modules taken out first: `rest` gets the
/// keys that are not LyCORIS, and its result is merged with the LyCORIS entries.
pub fn with_modules(
    input: &ParseInput<'_>,
    policy: &ScalePolicy<'_>,
    rest: impl FnOnce(&[KeyRef]) -> super::Parsed,
) -> super::Parsed {
    let (entries, problems, keys) = take_modules(input, input.keys.clone(), split_key, policy);
    let mut parsed = rest(&keys);
    parsed.entries.extend(entries);
    parsed.unparsed.extend(problems);
    parsed
}

/// What `inspect` says about the structure of a LyCORIS entry: rank, LoKr factors, OFT
/// blocks and stages, (IA)³ side, Tucker cores.
pub fn structure(entry: &Entry) -> String {
    let Ok(m) = module_of(entry, &BTreeMap::new()) else {
        return "malformed".into();
    };
    let fac = |f: &Factor| match f {
        Factor::Full(p) => format!("full {:?}", p.shape),
        Factor::Product(a, b) => format!(
            "rank {} ({}, {})",
            b.shape.first().copied().unwrap_or(0),
            a.shape.first().copied().unwrap_or(0),
            b.shape.get(1).copied().unwrap_or(0)
        ),
        Factor::Tucker { t, .. } => format!(
            "Tucker rank {}, kernel {:?}",
            t.shape.first().copied().unwrap_or(0),
            t.shape.get(2..).unwrap_or(&[])
        ),
    };
    let rescale = |r: &Option<Param>| if r.is_some() { ", rescale" } else { "" };
    match &m {
        Module::Loha { t, .. } => format!(
            "rank {}{}",
            m.rank().unwrap_or(0),
            if t.is_some() { ", Tucker cores" } else { "" }
        ),
        Module::Lokr { w1, w2, .. } => format!("W1 {}, W2 {}", fac(w1), fac(w2)),
        Module::DiagOft {
            blocks, rescale: r, ..
        } => format!(
            "{} blocks of {}{}",
            blocks.shape.first().copied().unwrap_or(0),
            blocks.shape.get(1).copied().unwrap_or(0),
            rescale(r)
        ),
        Module::Boft {
            blocks, rescale: r, ..
        } => format!(
            "{} stages × {} blocks of {}{}",
            blocks.shape.first().copied().unwrap_or(0),
            blocks.shape.get(1).copied().unwrap_or(0),
            blocks.shape.get(2).copied().unwrap_or(0),
            rescale(r)
        ),
        Module::Glora { .. } => format!("rank {}", m.rank().unwrap_or(0)),
        Module::Ia3 { weight, on_input } => format!(
            "{} {} channels",
            weight.numel(),
            if *on_input { "input" } else { "output" }
        ),
        Module::Full { diff } => format!("full {:?}", diff.shape),
    }
}

/// Why entry `e` (a LyCORIS module) cannot be written in convention `to`, or `None` when it
/// can (kohya, lycoris, a Linear LoHa/LoKr to PEFT, or `e` is not a LyCORIS module). A
/// LoHa/LoKr/OFT/... is not a LoRA: turning
/// one into LoRA factors is an approximation, which is `wanbake extract`'s job.
pub fn refusal(e: &Entry, to: super::Convention) -> Option<String> {
    use super::Convention;
    if !e.kind.is_lycoris() || matches!(to, Convention::Kohya | Convention::Lycoris) {
        return None;
    }
    let extract = "a LyCORIS module is not a LoRA; for LoRA factors that approximate it, merge \
                   it and run `wanbake extract` on the result";
    let tucker =
        e.params.contains_key(&ParamRole::HadaT1) || e.params.contains_key(&ParamRole::LokrT2);
    Some(match (to, e.kind) {
        (Convention::Peft, Kind::DiagOft | Kind::Boft) => format!(
            "PEFT's OFT/BOFT are another parametrisation (input columns, another Cayley \
             convention): not the same adapter; {extract}"
        ),
        (Convention::Peft, Kind::Loha | Kind::Lokr) if tucker => {
            format!("PEFT has no Conv3d LoHa/LoKr (Tucker cores); {extract}")
        }
        // Linear LoHa/LoKr: `adapter::peft_lycoris` writes them, or refuses each module
        // PEFT's layout rules cannot reproduce.
        (Convention::Peft, Kind::Loha | Kind::Lokr) => return None,
        (Convention::Peft, _) => {
            format!("PEFT has no LyCORIS {} module; {extract}", e.kind.as_str())
        }
        _ => format!("{to} files hold LoRA factors and diffs only; {extract}"),
    })
}

/// Writes LyCORIS entry `i` as `<name>.<suffix>` for each of its tensors (byte for byte),
/// `<name>.alpha` and (IA)³'s `<name>.on_input`, with an alpha that makes LyCORIS's own rule
/// give the entry's σ exactly (a PEFT module's σ may have none: refused).
pub fn render_module(
    ctx: &super::translate::RenderCtx<'_>,
    i: usize,
    name: &str,
    tensors: &mut Vec<super::translate::OutTensor>,
) -> Result<(), super::EntryProblem> {
    use super::translate::{OutData, OutTensor, alpha_linear, scalar_dtype};
    let e = &ctx.set.entries[i];
    let m = module_of(e, &BTreeMap::new()).map_err(|err| ctx.problem(i, err.to_string()))?;
    let alpha = match (&e.scale_source, e.kind, m.rank()) {
        (ScaleSource::Lycoris { .. }, _, _) | (_, Kind::DiagOft | Kind::Boft | Kind::Ia3, _) => {
            e.alpha
        }
        (_, _, None) if e.scale == 1.0 => None,
        (_, _, None) => {
            return Err(ctx.problem(
                i,
                format!(
                    "LyCORIS's rule scales a LoKr with both factors full by 1, this module's σ is {}",
                    e.scale
                ),
            ));
        }
        (_, _, Some(_)) => Some(alpha_linear(e).ok_or_else(|| {
            ctx.problem(
                i,
                format!("no alpha reproduces σ = {} as alpha/rank", e.scale),
            )
        })?),
    };
    for role in m.roles() {
        let src = e
            .param(role)
            .ok_or_else(|| ctx.problem(i, format!("internal: {role:?} missing")))?;
        let suffix = suffix_of(role).unwrap_or("weight");
        tensors.push(ctx.param(
            i,
            role,
            format!("{name}.{suffix}"),
            src.shape.clone(),
            false,
        )?);
    }
    if let Some(a) = alpha {
        tensors.push(OutTensor {
            name: format!("{name}.alpha"),
            dtype: scalar_dtype(a),
            shape: Vec::new(),
            data: OutData::Scalar { value: a },
        });
    }
    if let Module::Ia3 { on_input, .. } = m {
        tensors.push(OutTensor {
            name: format!("{name}.on_input"),
            dtype: DType::I64,
            shape: Vec::new(),
            data: OutData::Scalar {
                value: f64::from(u8::from(on_input)),
            },
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The fit's rules and refusals, and `Fitted`'s check of loaded tensors against a fit.
    use super::*;

    fn p(shape: &[usize]) -> Param {
        let n = shape.iter().product::<usize>();
        Param::new(
            shape.to_vec(),
            (0..n).map(|i| (i as f32 * 0.37).sin() * 0.1).collect(),
        )
    }

    /// A module's tensors as binding sees them: shapes, no values.
    fn shapes(shape: &[usize]) -> Param {
        Param::new(shape.to_vec(), Vec::new())
    }

    #[test]
    fn refusals_name_module_and_shapes() {
        let target = [32usize, 32];
        // Kronecker shape that does not multiply to the target
        let m = Module::Lokr {
            w1: Factor::Full(p(&[4, 4])),
            w2: Factor::Full(p(&[8, 4])),
            alpha: None,
        };
        let e = m
            .fit("lycoris_blocks_0_attn1_to_q", &target)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lycoris_blocks_0_attn1_to_q")
                && e.contains("(4, 4)")
                && e.contains("(8, 4)")
                && e.contains("[32, 32]"),
            "{e}"
        );
        // non-power-of-two BOFT block count
        let m = Module::Boft {
            blocks: p(&[2, 8 / 2 * 3, 2, 2]),
            alpha: None,
            rescale: None,
        };
        let e = m.fit("x", &[24, 4]).unwrap_err().to_string();
        assert!(
            e.contains("power of two") && e.contains("[2, 12, 2, 2]"),
            "{e}"
        );
        // missing factor
        let mut t = BTreeMap::new();
        t.insert("hada_w1_a".to_string(), p(&[32, 4]));
        t.insert("hada_w1_b".to_string(), p(&[4, 32]));
        t.insert("hada_w2_a".to_string(), p(&[32, 4]));
        let e = Module::from_tensors("lycoris_m", &t)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lycoris_m") && e.contains("hada_w2_b is missing"),
            "{e}"
        );
        // LoHa factors of the wrong size
        let m = Module::Loha {
            w1_a: p(&[32, 4]),
            w1_b: p(&[4, 16]),
            w2_a: p(&[32, 4]),
            w2_b: p(&[4, 16]),
            t: None,
            alpha: Some(4.0),
        };
        let e = m.fit("lycoris_m", &target).unwrap_err().to_string();
        assert!(e.contains("(32, 16), expected (32, 32)"), "{e}");
        // Tucker core of the wrong rank
        let m = Module::Loha {
            w1_a: p(&[2, 32]),
            w1_b: p(&[2, 4]),
            w2_a: p(&[2, 32]),
            w2_b: p(&[2, 4]),
            t: Some((p(&[3, 2, 1, 2, 2]), p(&[2, 2, 1, 2, 2]))),
            alpha: None,
        };
        let e = m
            .fit("lycoris_patch_embedding", &[32, 4, 1, 2, 2])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lycoris_patch_embedding") && e.contains("hada_t1 is [3, 2, 1, 2, 2]"),
            "{e}"
        );
        // a Tucker LoHa missing one core
        t.insert("hada_w2_b".to_string(), p(&[4, 32]));
        t.insert("hada_t1".to_string(), p(&[4, 4, 1, 2, 2]));
        let e = Module::from_tensors("lycoris_m", &t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hada_t2 is missing"), "{e}");
        // LyCORIS DoRA is refused, not silently mis-merged
        t.insert("dora_scale".to_string(), p(&[32, 1]));
        let e = Module::from_tensors("lycoris_m", &t)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dora_scale") && e.contains("not supported"),
            "{e}"
        );
    }

    #[test]
    fn ia3_takes_the_target_input_channels_each_over_its_kernel_columns() {
        let conv = [32usize, 4, 1, 2, 2];
        let ia3 = |shape: &[usize], on_input| Module::Ia3 {
            weight: shapes(shape),
            on_input,
        };
        let fit = ia3(&[1, 4, 1, 1, 1], true).fit("m", &conv).expect("fit");
        assert_eq!(
            fit,
            Fit {
                out: 32,
                inp: 16,
                dims: FitDims::Ia3(Ia3Side::In { per: 4 })
            }
        );
        let fit = ia3(&[32], false).fit("m", &conv).expect("fit");
        assert_eq!(fit.dims, FitDims::Ia3(Ia3Side::Out));
        // in·∏k values, or fewer channels: lycoris-lora refuses both (golden/lycoris/rules)
        for bad in [[1, 16, 1, 1, 1], [1, 2, 1, 1, 1]] {
            let e = ia3(&bad, true).fit("m", &conv).unwrap_err().to_string();
            assert!(e.contains("expected the input channels (4)"), "{e}");
        }
        let e = ia3(&[16], true)
            .fit("m", &[32, 32])
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected the input channels (32)"), "{e}");
    }

    #[test]
    fn boft_takes_one_to_log2_n_plus_one_stages_and_any_count_past_them_is_refused() {
        let boft = |stages| Module::Boft {
            blocks: shapes(&[stages, 8, 4, 4]),
            alpha: None,
            rescale: None,
        };
        for stages in 1..=4 {
            let fit = boft(stages).fit("m", &[32, 80]).expect("fit");
            assert_eq!(fit.dims, FitDims::Boft { stages, n: 8, b: 4 });
        }
        // 65 overflowed the merge's old `1 << (m - 1)`; no count past log2(n)+1 panics
        for stages in [0, 5, 63, 64, 65, 66, 1000, usize::MAX] {
            let e = boft(stages).fit("m", &[32, 80]).unwrap_err().to_string();
            assert!(e.contains("at most log2(n)+1 stages"), "{stages}: {e}");
        }
    }

    #[test]
    fn a_tucker_core_needs_a_convolution_with_its_kernel() {
        let loha = |t: &[usize], a: &[usize], b: &[usize]| Module::Loha {
            w1_a: shapes(a),
            w1_b: shapes(b),
            w2_a: shapes(a),
            w2_b: shapes(b),
            t: Some((shapes(t), shapes(t))),
            alpha: None,
        };
        let fit = loha(&[2, 2, 1, 2, 2], &[2, 32], &[2, 4])
            .fit("m", &[32, 4, 1, 2, 2])
            .expect("fit");
        let w = FactorFit::Tucker {
            rows: 32,
            ra: 2,
            rb: 2,
            ch: 4,
            kernel: 4,
        };
        assert_eq!(fit.dims, FitDims::Loha { w1: w, w2: w });
        // on a Linear (lycoris-lora has no core there: golden/lycoris/rules)
        let e = loha(&[2, 2], &[2, 32], &[2, 32])
            .fit("m", &[32, 32])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("hada_t1 is [2, 2]") && e.contains("belongs to a convolution"),
            "{e}"
        );
        let lokr = Module::Lokr {
            w1: Factor::Full(shapes(&[4, 4])),
            w2: Factor::Tucker {
                t: shapes(&[2, 2]),
                a: shapes(&[2, 8]),
                b: shapes(&[2, 8]),
            },
            alpha: None,
        };
        let e = lokr.fit("m", &[32, 32]).unwrap_err().to_string();
        assert!(e.contains("lokr_t2 is [2, 2]"), "{e}");
        // a core of another kernel than the target's
        let e = loha(&[2, 2, 1, 1, 4], &[2, 32], &[2, 4])
            .fit("m", &[32, 4, 1, 2, 2])
            .unwrap_err()
            .to_string();
        assert!(e.contains("the target's kernel [1, 2, 2]"), "{e}");
    }

    #[test]
    fn fitted_checks_the_loaded_values_against_the_fit_not_the_rules() {
        let target = [32usize, 32];
        let bound = Module::Glora {
            a1: shapes(&[32, 4]),
            a2: shapes(&[4, 32]),
            b1: shapes(&[32, 2]),
            b2: shapes(&[2, 32]),
            alpha: None,
        };
        let fit = bound.fit("m", &target).expect("fit");
        assert_eq!(fit.dims, FitDims::Glora { ra: 4, rb: 2 });
        let loaded = |b2: Param| Module::Glora {
            a1: p(&[32, 4]),
            a2: p(&[4, 32]),
            b1: p(&[32, 2]),
            b2,
            alpha: None,
        };
        let f = Fitted::new(fit, loaded(p(&[2, 32])), "m").expect("fitted");
        assert_eq!((f.fit(), f.module()), (&fit, &loaded(p(&[2, 32]))));
        // fewer values than the fitted shape needs
        let short = Param::new(vec![2, 32], vec![0.0; 63]);
        let e = Fitted::new(fit, loaded(short), "lycoris_m")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("lycoris_m") && e.contains("b2.weight holds 63 values") && e.contains("64"),
            "{e}"
        );
        // another kind than the fit's
        let e = Fitted::new(fit, Module::Full { diff: p(&[32, 32]) }, "m")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not the module binding fitted"), "{e}");
    }
}
