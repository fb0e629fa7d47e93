//! Module names across adapter conventions.
//!
//! Owns: `ModuleId` (one module, or bare parameter, of the base model, independent of how
//! any adapter spells it), `Naming` (the name family a spelling uses: diffusers, original
//! Wan, MaxDiffusion NNX, or a generic path), the WAN module table derived from the layout
//! name table (`model::wan_names`, the one copy of the diffusers ↔ original ↔ NNX names),
//! every alias spelling of a module in every convention (`aliases`), and the spelling a
//! renderer writes (`ModuleId::spell`). Does not own: matching aliases against a base
//! (`bind`).
//!
//! Underscored spellings (kohya `lora_unet_…`) are only ever produced from dotted names and
//! looked up; they are never parsed back into dots (spec conventions.md §5.1, §11.2).

use std::collections::HashMap;
use std::sync::OnceLock;

use serde::Serialize;

use super::Convention;
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, Scope};

/// The name family a module spelling belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Naming {
    /// diffusers `WanTransformer3DModel` names (`blocks.0.attn1.to_q`).
    Diffusers,
    /// Original Wan-AI / ComfyUI names (`blocks.0.self_attn.q`).
    Wan,
    /// MaxDiffusion NNX paths (`blocks.0.attn1.query`).
    Nnx,
    /// Any other model: the base's own module path (SA3 prefixes stripped).
    Generic,
}

impl Naming {
    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Naming::Diffusers => "diffusers",
            Naming::Wan => "original Wan",
            Naming::Nnx => "NNX",
            Naming::Generic => "generic",
        }
    }
}

/// Which tensor of a module an entry changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `.weight` (NNX `.kernel` or `.scale`).
    Weight,
    /// `.bias`.
    Bias,
    /// The module is itself a parameter (`scale_shift_table` / `modulation`).
    Param,
}

/// One module (or bare parameter) of a base model, however adapters spell it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum ModuleId {
    /// A WAN transformer module, with its full name in each of the three namings.
    Wan {
        /// diffusers name (`blocks.0.attn1.to_q`).
        diffusers: String,
        /// Original Wan name (`blocks.0.self_attn.q`).
        wan: String,
        /// NNX path (`blocks.0.attn1.query`).
        nnx: String,
    },
    /// Any other module: its path relative to the model root, as PEFT names it (for SA3:
    /// relative to the DiT, `transformer.layers.0.self_attn.to_qkv`, or
    /// `conditioners.seconds_total.embedder.embedding.1` for the conditioner).
    Generic {
        /// The path.
        path: String,
    },
}

impl ModuleId {
    /// The name shown in reports (diffusers for WAN).
    pub fn display(&self) -> &str {
        match self {
            ModuleId::Wan { diffusers, .. } => diffusers,
            ModuleId::Generic { path } => path,
        }
    }

    /// The full module name a convention writes (without the tensor suffix).
    pub fn spell(&self, convention: Convention) -> String {
        match (self, convention) {
            (ModuleId::Wan { diffusers, .. }, Convention::Peft) => {
                format!("{PEFT_PREFIX}{diffusers}")
            }
            (ModuleId::Wan { diffusers, .. }, Convention::Diffusers) => {
                format!("{DIFFUSERS_PREFIX}{diffusers}")
            }
            (ModuleId::Wan { wan, .. }, Convention::Comfy) => format!("{COMFY_PREFIX}{wan}"),
            (ModuleId::Wan { wan, .. }, Convention::Kohya) => {
                format!("{KOHYA_PREFIX}{}", underscored(wan))
            }
            (ModuleId::Wan { diffusers, .. }, Convention::Lycoris) => {
                format!("{LYCORIS_PREFIX}{}", underscored(diffusers))
            }
            (ModuleId::Wan { diffusers, .. }, Convention::Sa3) => diffusers.clone(),
            (ModuleId::Wan { nnx, .. }, Convention::Nnx) => nnx.clone(),
            (ModuleId::Generic { path }, Convention::Peft) => format!("{PEFT_PREFIX}{path}"),
            (ModuleId::Generic { path }, Convention::Diffusers) => {
                format!("{DIFFUSERS_PREFIX}{path}")
            }
            (ModuleId::Generic { path }, Convention::Comfy) => format!("{COMFY_PREFIX}{path}"),
            (ModuleId::Generic { path }, Convention::Kohya) => {
                format!("{KOHYA_PREFIX}{}", underscored(path))
            }
            (ModuleId::Generic { path }, Convention::Lycoris) => {
                format!("{LYCORIS_PREFIX}{}", underscored(path))
            }
            (ModuleId::Generic { path }, Convention::Sa3) => sa3_native(path),
            (ModuleId::Generic { path }, Convention::Nnx) => path.clone(),
        }
    }
}

/// PEFT's wrapper prefix.
pub const PEFT_PREFIX: &str = "base_model.model.";
/// diffusers' transformer prefix.
pub const DIFFUSERS_PREFIX: &str = "transformer.";
/// ComfyUI / original-Wan LoRA prefix.
pub const COMFY_PREFIX: &str = "diffusion_model.";
/// kohya / musubi prefix.
pub const KOHYA_PREFIX: &str = "lora_unet_";
/// LyCORIS's own prefix (its `LORA_PREFIX`, in front of the trainer's underscored names).
pub const LYCORIS_PREFIX: &str = "lycoris_";

/// Prefixes a module spelling may carry in front of a dotted root, in any convention.
const DOTTED_PREFIXES: [&str; 6] = [
    "",
    DIFFUSERS_PREFIX,
    PEFT_PREFIX,
    COMFY_PREFIX,
    "model.diffusion_model.",
    "pipe.dit.",
];

/// Prefixes in front of an underscored root: kohya/musubi, Wan/VideoX-Fun (double
/// underscore, spec conventions.md §5.1) and LyCORIS's standalone wrapper.
const UNDERSCORED_PREFIXES: [&str; 3] = [KOHYA_PREFIX, "lora_unet__", LYCORIS_PREFIX];

/// SA3 full-checkpoint prefixes (spec sa3_lora.md §4.1): an adapter layer `L` names the
/// base key `<prefix>L.weight` for one of these.
pub const SA3_PREFIXES: [&str; 4] = [
    "model.",
    "model.model.",
    "conditioner.",
    "model.conditioner.",
];

/// `a.b.c` → `a_b_c`.
pub fn underscored(s: &str) -> String {
    s.replace('.', "_")
}

/// Every spelling of a module whose root names (one per naming that applies) are `roots`.
pub fn aliases(root: &str) -> Vec<String> {
    let mut v: Vec<String> = DOTTED_PREFIXES
        .iter()
        .map(|p| format!("{p}{root}"))
        .collect();
    let us = underscored(root);
    v.extend(UNDERSCORED_PREFIXES.iter().map(|p| format!("{p}{us}")));
    v
}

/// The SA3-native module path of a DiT-relative path (spec sa3_lora.md §3.1).
pub fn sa3_native(path: &str) -> String {
    if path.starts_with("conditioners.") {
        path.to_string()
    } else {
        format!("model.{path}")
    }
}

/// The generic path of a base module `m` (a full-checkpoint name): SA3's `model.model.` and
/// `conditioner.` prefixes are removed (spec sa3_lora.md §4.1).
pub fn generic_path(m: &str) -> String {
    for p in ["model.model.", "conditioner."] {
        if let Some(rest) = m.strip_prefix(p) {
            return rest.to_string();
        }
    }
    m.to_string()
}

/// Root spellings of a generic base module `m`: itself and with each SA3 prefix removed.
pub fn generic_roots(m: &str) -> Vec<String> {
    let mut v = vec![m.to_string()];
    for p in SA3_PREFIXES {
        if let Some(rest) = m.strip_prefix(p)
            && !rest.is_empty()
        {
            v.push(rest.to_string());
        }
    }
    v.sort();
    v.dedup();
    v
}

/// One WAN module kind: a group of table rows sharing a module (weight + bias), or a bare
/// parameter. Names are block-relative for block modules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WanModule {
    /// Top-level or per block.
    pub scope: Scope,
    /// diffusers module name.
    pub diffusers: String,
    /// Original Wan module name.
    pub wan: String,
    /// NNX module path.
    pub nnx: String,
    /// Rows of `model::wan_names::entries()` per role.
    pub rows: Vec<(Role, usize)>,
}

impl WanModule {
    /// The module's id for block `block` (ignored for top-level modules).
    pub fn id(&self, block: Option<usize>) -> ModuleId {
        let full = |layout, local: &str| self.scope.full_in(layout, local, block);
        ModuleId::Wan {
            diffusers: full(Layout::Diffusers, &self.diffusers),
            wan: full(Layout::Wan, &self.wan),
            nnx: full(Layout::Nnx, &self.nnx),
        }
    }

    /// The table row of a role, if the module has that tensor.
    pub fn row(&self, role: Role) -> Option<usize> {
        self.rows.iter().find(|(r, _)| *r == role).map(|(_, i)| *i)
    }
}

/// Splits a parameter name into (module, role) by its suffix in `naming`.
fn split_param(name: &str, naming: Naming) -> (String, Role) {
    let weight_suffixes: &[&str] = match naming {
        Naming::Nnx => &[".kernel", ".scale"],
        _ => &[".weight"],
    };
    for s in weight_suffixes {
        if let Some(m) = name.strip_suffix(s) {
            return (m.to_string(), Role::Weight);
        }
    }
    if let Some(m) = name.strip_suffix(".bias") {
        return (m.to_string(), Role::Bias);
    }
    (name.to_string(), Role::Param)
}

fn build_wan_modules() -> Vec<WanModule> {
    let mut out: Vec<WanModule> = Vec::new();
    for (i, e) in wan_names::entries().iter().enumerate() {
        let (d, role) = split_param(e.diffusers, Naming::Diffusers);
        let (w, _) = split_param(e.wan, Naming::Wan);
        let (n, _) = split_param(e.nnx, Naming::Nnx);
        match out
            .iter_mut()
            .find(|m| m.scope == e.scope && m.diffusers == d)
        {
            Some(m) => m.rows.push((role, i)),
            None => out.push(WanModule {
                scope: e.scope,
                diffusers: d,
                wan: w,
                nnx: n,
                rows: vec![(role, i)],
            }),
        }
    }
    out
}

/// Every WAN module kind (derived once from the name table, `model::wan_names`).
pub fn wan_modules() -> &'static [WanModule] {
    static M: OnceLock<Vec<WanModule>> = OnceLock::new();
    M.get_or_init(build_wan_modules)
}

/// For a table row: (index into `wan_modules()`, role).
pub fn wan_module_of_row(row: usize) -> Option<(usize, Role)> {
    static MAP: OnceLock<HashMap<usize, (usize, Role)>> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut m = HashMap::new();
        for (mi, module) in wan_modules().iter().enumerate() {
            for (role, row) in &module.rows {
                m.insert(*row, (mi, *role));
            }
        }
        m
    })
    .get(&row)
    .copied()
}

/// The root spelling of a WAN module id in one naming.
pub fn wan_root(id: &ModuleId, naming: Naming) -> Option<&str> {
    match (id, naming) {
        (ModuleId::Wan { diffusers, .. }, Naming::Diffusers) => Some(diffusers),
        (ModuleId::Wan { wan, .. }, Naming::Wan) => Some(wan),
        (ModuleId::Wan { nnx, .. }, Naming::Nnx) => Some(nnx),
        (ModuleId::Generic { path }, Naming::Generic) => Some(path),
        _ => None,
    }
}

/// The naming an adapter convention normally uses for WAN modules (the preferred choice
/// when a file's names resolve equally well under two).
pub fn preferred_naming(c: Convention) -> Naming {
    match c {
        Convention::Peft | Convention::Diffusers | Convention::Sa3 | Convention::Lycoris => {
            Naming::Diffusers
        }
        Convention::Comfy | Convention::Kohya => Naming::Wan,
        Convention::Nnx => Naming::Nnx,
    }
}

/// Removes the prefix a convention puts in front of dotted module paths, for generic
/// (non-WAN) names without a base: PEFT `base_model.model.`, diffusers `transformer.`,
/// ComfyUI `diffusion_model.`, SA3-native `model.` (DiT). `None` for kohya, whose
/// underscored names cannot be turned back into paths without a base.
pub fn generic_path_of_spelling(module: &str, c: Convention) -> Option<String> {
    let strip = |p: &str| module.strip_prefix(p).unwrap_or(module).to_string();
    match c {
        Convention::Peft => Some(strip(PEFT_PREFIX)),
        Convention::Diffusers => Some(strip(DIFFUSERS_PREFIX)),
        Convention::Comfy => Some(
            module
                .strip_prefix("model.diffusion_model.")
                .or_else(|| module.strip_prefix(COMFY_PREFIX))
                .unwrap_or(module)
                .to_string(),
        ),
        Convention::Kohya | Convention::Lycoris => None,
        Convention::Sa3 => Some(if module.starts_with("conditioners.") {
            module.to_string()
        } else {
            strip("model.")
        }),
        Convention::Nnx => Some(module.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_table_groups_weight_and_bias_and_keeps_the_norm_swap() {
        let m = wan_modules();
        let q = m.iter().find(|m| m.diffusers == "attn1.to_q").unwrap();
        assert_eq!(
            (q.wan.as_str(), q.nnx.as_str()),
            ("self_attn.q", "attn1.query")
        );
        assert!(q.row(Role::Weight).is_some() && q.row(Role::Bias).is_some());
        let n2 = m.iter().find(|m| m.diffusers == "norm2").unwrap();
        assert_eq!(
            (n2.wan.as_str(), n2.nnx.as_str()),
            ("norm3", "norm2.layer_norm")
        );
        let ss = m
            .iter()
            .find(|m| m.diffusers == "scale_shift_table" && m.scope == Scope::Block)
            .unwrap();
        assert_eq!(ss.wan, "modulation");
        assert!(ss.row(Role::Param).is_some());
        let head = m.iter().find(|m| m.diffusers == "proj_out").unwrap();
        assert_eq!(head.wan, "head.head");
    }

    #[test]
    fn spellings_per_convention() {
        let id = wan_modules()
            .iter()
            .find(|m| m.diffusers == "attn1.to_out.0")
            .unwrap()
            .id(Some(3));
        assert_eq!(
            id.spell(Convention::Kohya),
            "lora_unet_blocks_3_self_attn_o"
        );
        assert_eq!(
            id.spell(Convention::Comfy),
            "diffusion_model.blocks.3.self_attn.o"
        );
        assert_eq!(
            id.spell(Convention::Peft),
            "base_model.model.blocks.3.attn1.to_out.0"
        );
        assert_eq!(id.spell(Convention::Nnx), "blocks.3.attn1.proj_attn");
        let g = ModuleId::Generic {
            path: "transformer.layers.0.self_attn.to_qkv".into(),
        };
        assert_eq!(
            g.spell(Convention::Sa3),
            "model.transformer.layers.0.self_attn.to_qkv"
        );
        assert!(aliases("blocks.0.ffn.0").contains(&"lora_unet__blocks_0_ffn_0".to_string()));
    }
}
