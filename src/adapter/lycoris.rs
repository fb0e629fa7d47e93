//! LyCORIS modules in canonical form (spec lycoris.md §1, §2).
//!
//! Owns: `Param` (one stored LyCORIS tensor as f32 with its shape), `Factor`, `Module` (one
//! LyCORIS module's tensors by kind: LoHa, LoKr, Diag-OFT, BOFT, GLoRA, (IA)³, full),
//! `Module::from_tensors` (the kind detected from the tensor suffixes alone, no metadata),
//! `Module::scale_rule` (the scale and why: LoKr with both factors full is scale 1 whatever the
//! stored alpha says) and `LycorisError` (naming the module and the shapes). Does not own: the
//! formulas (`merge::lycoris`), the file namings and binding (not wired yet, see issue 14).
//!
//! `scale_rule` is LyCORIS's (files written by lycoris-lora, kohya/musubi). PEFT LOHA/LOKR
//! folders follow another rule that a PEFT reader must apply instead: PEFT 0.21.2 scales by
//! the config's `alpha / r` (after `rank_pattern`/`alpha_pattern`) for every module, a LoKr
//! with both factors full included (`tuners/lokr/layer.py`: `scaling = alpha / r`,
//! `make_kron(w1, w2, scaling)`).

use std::collections::BTreeMap;

use thiserror::Error;

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

    /// (rows, cols) of a 2-D tensor whose values match its shape.
    pub fn dims2(&self) -> Option<(usize, usize)> {
        match self.shape[..] {
            [r, c] if r * c == self.data.len() => Some((r, c)),
            _ => None,
        }
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
        "LyCORIS module `{module}` ({kind}): {what}; target weight is {target:?}; \
         the file is malformed or was made for another model"
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
}

/// The scale a module's delta is multiplied by, and why (spec lycoris.md §2).
#[derive(Clone, Debug, PartialEq)]
pub struct ScaleRule {
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
    pub fn scale_rule(&self) -> ScaleRule {
        let ratio = |alpha: Option<f64>, r: usize, what: &str| match alpha {
            Some(a) if a != 0.0 && r > 0 => ScaleRule {
                scale: a / r as f64,
                why: format!("alpha {a} / rank {r} ({what})"),
            },
            Some(_) | None => ScaleRule {
                scale: 1.0,
                why: format!("scale 1: alpha absent or 0 means alpha = rank ({what})"),
            },
        };
        match self {
            Module::Loha { w1_b, alpha, .. } => ratio(*alpha, w1_b.shape[0], "rank of hada_w1_b"),
            Module::Lokr { w1, w2, alpha } => match (w1, w2) {
                (Factor::Full(_), Factor::Full(_)) => ScaleRule {
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
            Module::DiagOft { alpha, .. } | Module::Boft { alpha, .. } => ScaleRule {
                scale: 1.0,
                why: format!(
                    "no scale: stored alpha {} is the rotation constraint",
                    alpha.unwrap_or(0.0)
                ),
            },
            Module::Ia3 { .. } => ScaleRule {
                scale: 1.0,
                why: "no scale: (IA)³ has no alpha".into(),
            },
            Module::Full { .. } => ScaleRule {
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
