//! Binding adapter entries to the tensors of a base checkpoint.
//!
//! Owns: `BaseIndex`, the alias table built from the base's own keys (as ComfyUI does, spec
//! conventions.md §5.1, §11.2): for every base module, every spelling of it in every
//! convention and naming (diffusers, original Wan, NNX, generic with SA3 prefixes), with
//! stacked NNX tensors expanded per layer; `AdapterSet::bind`, which picks the naming the
//! adapter's names use, fills `Entry::target` / `Entry::binding`, checks every entry's
//! shapes against its target on the 2-D view, and reports what binds to nothing; and
//! `resolve_names`, the same resolution against the WAN name table alone (no base), used by
//! `translate`. Does not own: the spellings themselves (`names`), variant guesses
//! (`variant`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::kinds::{Binding, Entry, Kind, ParamRole, view_2d};
use super::names::{
    self, ModuleId, Naming, Role, WanModule, generic_path, generic_path_of_spelling, generic_roots,
    preferred_naming, wan_module_of_row, wan_modules, wan_root,
};
use super::{AdapterError, AdapterSet, EntryProblem};
use crate::io::{DType, TensorSet};
use crate::model::base_model::ComponentModel;
use crate::model::fingerprint::Fingerprint;
use crate::model::sa3;
use crate::model::transform::Transform;
use crate::model::wan_layout::Layout;
use crate::model::wan_names::{self, Position, SKIPPED_MARKER, Scope};

/// One base tensor (or one layer of a stacked one) an entry can change.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BaseTarget {
    /// Stored name.
    pub tensor: String,
    /// Layer of a stacked tensor.
    pub layer: Option<usize>,
    /// Stored → PyTorch layout.
    #[serde(skip)]
    pub to_canonical: Transform,
    /// PyTorch-layout shape.
    pub shape: Vec<usize>,
    /// Canonical name (diffusers for WAN).
    pub canonical: String,
}

/// One base module with its tensors per role.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseModule {
    /// Its identity.
    pub id: ModuleId,
    /// Role → index into `BaseIndex::targets` (empty for the name-only WAN index).
    pub roles: BTreeMap<Role, usize>,
}

/// How a module spelling resolves under one naming.
#[derive(Clone, Debug, PartialEq)]
enum Hit {
    One(usize),
    Many(Vec<usize>),
}

/// The alias table of a base: every spelling of every module, per naming.
#[derive(Clone, Debug)]
pub struct BaseIndex {
    /// The base path (for messages).
    pub path: PathBuf,
    /// Base tensors (WAN stacked tensors once per layer).
    pub targets: Vec<BaseTarget>,
    /// Base modules.
    pub modules: Vec<BaseModule>,
    /// The WAN layout the base is stored in, when it is a WAN transformer.
    pub layout: Option<Layout>,
    /// What the base is.
    pub fingerprint: Option<Fingerprint>,
    /// Number of stored tensors.
    pub tensor_count: usize,
    /// Stored tensors whose dtype is not a float (no adapter can change them).
    non_float: BTreeMap<String, DType>,
    aliases: HashMap<(Naming, String), Hit>,
    by_id: HashMap<ModuleId, usize>,
    /// Generic modules with their full stored module name (for SA3-prefixed roots).
    generic_full: Vec<(usize, String)>,
}

fn row_index(e: &'static wan_names::NameRow) -> Option<usize> {
    wan_names::entries().iter().position(|x| std::ptr::eq(x, e))
}

impl BaseIndex {
    fn empty(path: &Path) -> BaseIndex {
        BaseIndex {
            path: path.to_path_buf(),
            targets: Vec::new(),
            modules: Vec::new(),
            layout: None,
            fingerprint: None,
            tensor_count: 0,
            non_float: BTreeMap::new(),
            aliases: HashMap::new(),
            by_id: HashMap::new(),
            generic_full: Vec::new(),
        }
    }

    /// Builds the alias table of one state dict (a model, or one transformer of a
    /// pipeline) whose model facts are `model`. `path` is only used in messages. A base
    /// with stray keys is read in the layout that explains the most of them.
    pub fn new(path: &Path, tensors: &TensorSet, model: &ComponentModel) -> BaseIndex {
        let mut ix = BaseIndex::empty(path);
        let names: Vec<&str> = tensors.names().collect();
        ix.tensor_count = names.len();
        ix.layout = model.layout.closest;
        let mlx = ix.layout.is_none() && sa3::is_mlx_dit(names.iter().copied());
        for t in tensors.tensors() {
            let name = t.view.name;
            let shape = t.view.shape;
            if !t.view.dtype.is_float() {
                ix.non_float.insert(name.to_string(), t.view.dtype);
            }
            let wan = ix
                .layout
                .filter(|_| !name.contains(SKIPPED_MARKER))
                .and_then(|l| wan_names::parse_stored(l, name).map(|p| (l, p)));
            match wan {
                Some((l, (row, pos))) => ix.add_wan(l, row, pos, name, shape),
                None if mlx => ix.add_mlx(name, shape),
                None => ix.add_generic(name, shape),
            }
        }
        ix.fingerprint = Some(model.fingerprint.clone());
        ix.build_aliases();
        ix
    }

    /// A name-only index of a WAN transformer with `blocks` blocks and every optional
    /// module (image branch included), for resolving names without a base.
    pub fn wan_names(blocks: usize) -> BaseIndex {
        let mut ix = BaseIndex::empty(Path::new("<WAN name table>"));
        for m in wan_modules() {
            match m.scope {
                Scope::Top | Scope::MotionOut => ix.module_for(m.id(None)),
                Scope::Block
                | Scope::VaceBlock
                | Scope::FaceAdapter
                | Scope::MotionRes
                | Scope::MotionFc => {
                    for b in 0..blocks {
                        ix.module_for(m.id(Some(b)));
                    }
                    0
                }
            };
        }
        ix.build_aliases();
        ix
    }

    fn module_for(&mut self, id: ModuleId) -> usize {
        if let Some(&i) = self.by_id.get(&id) {
            return i;
        }
        self.modules.push(BaseModule {
            id: id.clone(),
            roles: BTreeMap::new(),
        });
        self.by_id.insert(id, self.modules.len() - 1);
        self.modules.len() - 1
    }

    fn push_target(&mut self, module: usize, role: Role, t: BaseTarget) {
        self.targets.push(t);
        let ti = self.targets.len() - 1;
        self.modules[module].roles.insert(role, ti);
    }

    fn add_wan(
        &mut self,
        layout: Layout,
        row: &'static wan_names::NameRow,
        pos: Position,
        name: &str,
        shape: &[usize],
    ) {
        // A fused tensor of the original names (Wan-Animate's `linear1_kv`) is changed
        // whole, as ComfyUI does; its pieces are no module of their own there.
        let fused = row.pieces(layout).len() > 1;
        let Some((mi, role)) = row_index(row)
            .and_then(wan_module_of_row)
            .filter(|_| !fused)
        else {
            return self.add_generic(name, shape);
        };
        let module: &WanModule = &wan_modules()[mi];
        let to_canonical = row.from_canonical(layout).inverse();
        let mut add = |block: Option<usize>, layer: Option<usize>, stored: &[usize]| {
            let id = module.id(block);
            let canonical = row.canonical(block);
            let shape = to_canonical
                .apply_shape(stored)
                .unwrap_or_else(|_| stored.to_vec());
            let m = self.module_for(id);
            self.push_target(
                m,
                role,
                BaseTarget {
                    tensor: name.to_string(),
                    layer,
                    to_canonical,
                    shape,
                    canonical,
                },
            );
        };
        match pos {
            Position::Top => add(None, None, shape),
            Position::Block(b) => add(Some(b), None, shape),
            Position::Stacked => {
                if let Some((&layers, rest)) = shape.split_first() {
                    for l in 0..layers {
                        add(Some(l), Some(l), rest);
                    }
                }
            }
        }
    }

    /// A tensor of an MLX SA3 DiT: bound under its PyTorch name, with its PyTorch-layout
    /// shape (a Conv1d's (out, k, in) read as (out, in, k), spec sa3_lora.md §4.4); the merge
    /// reads and writes it in the stored order (`pipeline::RowOrder`).
    fn add_mlx(&mut self, name: &str, shape: &[usize]) {
        let torch = sa3::torch_name_of_mlx(name);
        let torch_shape = match shape {
            [o, k, i] => vec![*o, *i, *k],
            s => s.to_vec(),
        };
        self.add_generic_as(name, &torch, &torch_shape);
    }

    fn add_generic(&mut self, name: &str, shape: &[usize]) {
        self.add_generic_as(name, name, shape);
    }

    /// A generic tensor `stored`, bound as module + role of `name` with `shape`.
    fn add_generic_as(&mut self, stored: &str, name: &str, shape: &[usize]) {
        let (module, role) = if let Some(m) = name.strip_suffix(".weight") {
            (m, Role::Weight)
        } else if let Some(m) = name.strip_suffix(".bias") {
            (m, Role::Bias)
        } else {
            (name, Role::Param)
        };
        let id = ModuleId::Generic {
            path: generic_path(module),
        };
        let mi = self.module_for(id);
        self.push_target(
            mi,
            role,
            BaseTarget {
                tensor: stored.to_string(),
                layer: None,
                to_canonical: Transform::Identity,
                shape: shape.to_vec(),
                canonical: name.to_string(),
            },
        );
        // Remember the full module name for the SA3-prefixed roots.
        self.generic_full.push((mi, module.to_string()));
    }

    fn build_aliases(&mut self) {
        let mut aliases: HashMap<(Naming, String), Hit> = HashMap::new();
        let mut add = |naming: Naming, root: &str, mi: usize| {
            for a in names::aliases(root) {
                match aliases.get_mut(&(naming, a.clone())) {
                    None => {
                        aliases.insert((naming, a), Hit::One(mi));
                    }
                    Some(Hit::One(other)) if *other != mi => {
                        let o = *other;
                        aliases.insert((naming, a), Hit::Many(vec![o, mi]));
                    }
                    Some(Hit::Many(v)) if !v.contains(&mi) => v.push(mi),
                    Some(_) => {}
                }
            }
        };
        for (mi, m) in self.modules.iter().enumerate() {
            match &m.id {
                ModuleId::Wan { .. } => {
                    for n in [Naming::Diffusers, Naming::Wan, Naming::Nnx] {
                        if let Some(root) = wan_root(&m.id, n) {
                            add(n, root, mi);
                        }
                    }
                }
                ModuleId::Generic { path } => add(Naming::Generic, path, mi),
            }
        }
        for (mi, full) in &self.generic_full {
            for root in generic_roots(full) {
                add(Naming::Generic, &root, *mi);
            }
        }
        self.aliases = aliases;
    }

    fn lookup(&self, naming: Naming, spelling: &str) -> Option<&Hit> {
        self.aliases.get(&(naming, spelling.to_string()))
    }

    /// How many of `modules` resolve to exactly one module under each WAN naming.
    fn naming_counts(&self, modules: &[&str]) -> BTreeMap<Naming, usize> {
        let mut counts = BTreeMap::new();
        for n in [Naming::Diffusers, Naming::Wan, Naming::Nnx] {
            let c = modules
                .iter()
                .filter(|m| matches!(self.lookup(n, m), Some(Hit::One(_))))
                .count();
            counts.insert(n, c);
        }
        counts
    }

    /// The WAN naming the adapter uses: the one resolving most of its module names, ties
    /// going to the convention's usual naming.
    fn choose_naming(&self, modules: &[&str], preferred: Naming) -> Naming {
        let counts = self.naming_counts(modules);
        let best = counts.values().copied().max().unwrap_or(0);
        if best == 0 {
            return Naming::Generic;
        }
        if counts.get(&preferred) == Some(&best) {
            return preferred;
        }
        counts
            .into_iter()
            .find(|(_, c)| *c == best)
            .map_or(preferred, |(n, _)| n)
    }

    /// Resolves one spelling: under `naming`, then as a generic name.
    fn resolve(&self, naming: Naming, spelling: &str) -> Result<usize, String> {
        for n in [naming, Naming::Generic] {
            match self.lookup(n, spelling) {
                Some(Hit::One(i)) => return Ok(*i),
                Some(Hit::Many(v)) => {
                    return Err(format!(
                        "`{spelling}` is ambiguous: it spells {}",
                        v.iter()
                            .map(|i| format!("`{}`", self.modules[*i].id.display()))
                            .collect::<Vec<_>>()
                            .join(" and ")
                    ));
                }
                None => {}
            }
        }
        let other = [Naming::Diffusers, Naming::Wan, Naming::Nnx]
            .into_iter()
            .filter(|n| *n != naming)
            .find(|n| matches!(self.lookup(*n, spelling), Some(Hit::One(_))));
        Err(match other {
            Some(n) => format!(
                "`{spelling}` is a {} name, but this adapter's other names are {} names; \
                 a file mixing namings is not bound",
                n.as_str(),
                naming.as_str()
            ),
            None => format!("no base module is spelled `{spelling}`"),
        })
    }

    /// The module `entry` changes, its role and target index.
    fn target_of(&self, mi: usize, entry: &Entry) -> Result<(Role, usize), String> {
        let m = &self.modules[mi];
        let role = if entry.targets_bias() {
            Role::Bias
        } else if m.roles.contains_key(&Role::Weight) || !m.roles.contains_key(&Role::Param) {
            Role::Weight
        } else {
            Role::Param
        };
        match m.roles.get(&role) {
            Some(&t) => Ok((role, t)),
            None => Err(format!(
                "base module `{}` has no {}",
                m.id.display(),
                match role {
                    Role::Weight => "weight",
                    Role::Bias => "bias",
                    Role::Param => "parameter",
                }
            )),
        }
    }
}

/// One entry as bound.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BoundEntry {
    /// The module as the adapter spells it.
    pub module: String,
    /// The kind.
    pub kind: Kind,
    /// The base module it binds to.
    pub base_module: ModuleId,
    /// The base tensor.
    pub target: String,
    /// Layer of a stacked base tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<usize>,
    /// Canonical name of the target.
    pub canonical: String,
    /// PyTorch-layout shape of the target.
    pub shape: Vec<usize>,
}

/// What binding found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BindReport {
    /// The naming the adapter's module names use.
    pub naming: Naming,
    /// Every bound entry, in entry order.
    pub bound: Vec<BoundEntry>,
    /// Entries that bind to nothing (only when unmatched entries are allowed).
    pub unmatched: Vec<EntryProblem>,
    /// Base tensors changed (distinct targets).
    pub targets: usize,
}

/// Checks an entry's tensors against a target of PyTorch-layout `shape`: a LyCORIS entry's
/// fit to it (`lycoris::check_entry`), which the binding keeps, or the 2-D view rules.
pub fn check_fit(entry: &Entry, shape: &[usize]) -> Result<Option<super::lycoris::Fit>, String> {
    if entry.kind.is_lycoris() {
        return super::lycoris::check_entry(entry, shape).map(Some);
    }
    check_view(entry, shape).map(|()| None)
}

/// Checks an entry's tensors (not LyCORIS) against a target of PyTorch-layout `shape` on
/// the 2-D view.
fn check_view(entry: &Entry, shape: &[usize]) -> Result<(), String> {
    let shown = |r: ParamRole| {
        entry
            .param(r)
            .map(|s| format!("{:?}", s.shape))
            .unwrap_or_default()
    };
    match entry.kind {
        Kind::Diff => {
            let d = entry.param(ParamRole::Diff).map(|s| s.shape.as_slice());
            if d != Some(shape) {
                return Err(format!(
                    "diff {} needs a target of that shape, found {shape:?}",
                    shown(ParamRole::Diff)
                ));
            }
            return Ok(());
        }
        Kind::DiffBias | Kind::LoraBias => {
            let role = if entry.kind == Kind::DiffBias {
                ParamRole::DiffBias
            } else {
                ParamRole::LoraBias
            };
            let d = entry.param(role).map(|s| s.shape.as_slice());
            if d != Some(shape) {
                return Err(format!(
                    "bias delta {} needs a bias of that shape, found {shape:?}",
                    shown(role)
                ));
            }
            return Ok(());
        }
        _ => {}
    }
    let missing = entry.missing_roles();
    if !missing.is_empty() {
        let roles = |r: &[ParamRole]| {
            let names: Vec<String> = r.iter().map(|r| format!("{r:?}")).collect();
            names.join(", ")
        };
        return Err(format!(
            "the entry is {:?} but lacks {}: that kind needs {}",
            entry.kind,
            roles(&missing),
            roles(entry.kind.roles())
        ));
    }
    let Some((out, inp)) = view_2d(shape) else {
        return Err(format!(
            "a low-rank update needs a matrix target, found shape {shape:?}"
        ));
    };
    if let Some(k) = &entry.conv_kernel
        && shape.get(2..) != Some(k.as_slice())
    {
        return Err(format!(
            "the factors are conv factors with kernel {k:?}, the target has shape {shape:?}"
        ));
    }
    let expect = |r: ParamRole, want: Vec<usize>| -> Result<(), String> {
        match entry.param(r) {
            Some(s) if s.shape == want => Ok(()),
            Some(s) => Err(format!(
                "{r:?} {:?} does not fit the target {shape:?} (2-D view ({out}, {inp})): expected {want:?}",
                s.shape
            )),
            None => Err(format!("{r:?} is missing")),
        }
    };
    let rank = entry.rank.unwrap_or(0);
    let rows = || -> Vec<usize> { vec![out] };
    let cols = || -> Vec<usize> { vec![inp] };
    match entry.kind {
        Kind::Lora | Kind::PeftDora | Kind::DoraRows | Kind::DoraCols | Kind::Bora => {
            expect(ParamRole::B, vec![out, rank])?;
            expect(ParamRole::A, vec![rank, inp])?;
        }
        _ => {
            expect(ParamRole::M, vec![rank, rank])?;
            if rank > out.min(inp) {
                return Err(format!(
                    "-xs rank {rank} exceeds min(out, in') = {} of the target {shape:?}",
                    out.min(inp)
                ));
            }
        }
    }
    match entry.kind {
        Kind::PeftDora | Kind::DoraRows | Kind::DoraRowsXs => expect(ParamRole::Magnitude, rows()),
        Kind::DoraCols | Kind::DoraColsXs => expect(ParamRole::Magnitude, cols()),
        Kind::Bora | Kind::BoraXs => {
            expect(ParamRole::MagnitudeR, rows())?;
            expect(ParamRole::MagnitudeC, cols())
        }
        _ => Ok(()),
    }
}

fn problem(e: &Entry, reason: String) -> EntryProblem {
    EntryProblem {
        module: e.module.clone(),
        kind: e.kind.as_str().to_string(),
        keys: e.source_keys.clone(),
        reason,
    }
}

impl AdapterSet {
    /// Binds every entry to a tensor of `base`: fills `Entry::target` and
    /// `Entry::binding`, checks shapes (2-D view rules of `kinds`; a LyCORIS entry's fit,
    /// kept in `Binding::lycoris`), and reports entries
    /// that bind to nothing. Errors: shapes that do not fit (always), no entry bound at all
    /// (always, naming the base variant the adapter appears to target), unmatched entries
    /// (unless `allow_unmatched`: then they are reported, never applied).
    pub fn bind(
        &mut self,
        base: &BaseIndex,
        allow_unmatched: bool,
    ) -> Result<BindReport, AdapterError> {
        let modules: Vec<&str> = self.entries.iter().map(|e| e.module.as_str()).collect();
        let naming = base.choose_naming(&modules, preferred_naming(self.convention));
        let mut bound = Vec::new();
        // (entry index, problem)
        let mut unmatched: Vec<(usize, EntryProblem)> = Vec::new();
        let mut shapes: Vec<(usize, EntryProblem)> = Vec::new();
        let mut plans = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let resolved = base
                .resolve(naming, &e.module)
                .and_then(|mi| base.target_of(mi, e).map(|t| (mi, t)));
            match resolved {
                Err(reason) => unmatched.push((i, problem(e, reason))),
                Ok((mi, (_, ti))) => {
                    let t = &base.targets[ti];
                    let fit = match base.non_float.get(&t.tensor) {
                        Some(d) => Err(format!("the base tensor is {d}, not a float")),
                        None => check_fit(e, &t.shape),
                    };
                    match fit {
                        Ok(lycoris) => plans.push((i, mi, ti, lycoris)),
                        Err(reason) => shapes.push((
                            i,
                            problem(
                                e,
                                format!("target `{}`{}: {reason}", t.tensor, layer_note(t.layer)),
                            ),
                        )),
                    }
                }
            }
        }
        // The entries in question, explained in model terms first when their names or
        // shapes say which other variant they were made for (computed over these entries
        // alone: the modules that fit say nothing about the ones that do not).
        let explain = |problems: &[(usize, EntryProblem)]| {
            let which: Vec<usize> = problems.iter().map(|(i, _)| *i).collect();
            let terms = super::variant::model_terms(self, &which, base);
            let rest: Vec<usize> = which
                .iter()
                .copied()
                .filter(|i| terms.as_ref().is_none_or(|t| !t.explained.contains(i)))
                .collect();
            (terms.map(|t| t.line), rest)
        };
        let problems = |v: Vec<(usize, EntryProblem)>| v.into_iter().map(|(_, p)| p).collect();
        if !shapes.is_empty() {
            let (explained, rest) = explain(&shapes);
            return Err(AdapterError::Shapes {
                adapter: self.path.clone(),
                base: base.path.clone(),
                entries: problems(shapes),
                explained,
                hint: (!rest.is_empty())
                    .then(|| super::variant::mismatch_line_of(self, &rest, base)),
            });
        }
        if plans.is_empty() {
            let (explained, _) = explain(&unmatched);
            return Err(AdapterError::NoBinding {
                adapter: self.path.clone(),
                base: base.path.clone(),
                base_tensors: base.tensor_count,
                guess: super::variant::mismatch_line(self, base),
                explained: explained.map(|line| {
                    Box::new(super::error::Explained {
                        line,
                        entries: problems(unmatched),
                    })
                }),
            });
        }
        let unmatched: Vec<EntryProblem> = if !unmatched.is_empty() && !allow_unmatched {
            let (hint, _) = explain(&unmatched);
            return Err(AdapterError::Unmatched {
                adapter: self.path.clone(),
                base: base.path.clone(),
                entries: problems(unmatched),
                hint,
            });
        } else {
            problems(unmatched)
        };
        let mut targets: Vec<&str> = Vec::new();
        for (i, mi, ti, lycoris) in plans {
            let t = &base.targets[ti];
            let e = &mut self.entries[i];
            e.target = Some(t.tensor.clone());
            e.binding = Some(Binding {
                tensor: t.tensor.clone(),
                layer: t.layer,
                to_canonical: t.to_canonical,
                shape: t.shape.clone(),
                canonical: t.canonical.clone(),
                lycoris,
            });
            targets.push(&t.canonical);
            bound.push(BoundEntry {
                module: e.module.clone(),
                kind: e.kind,
                base_module: base.modules[mi].id.clone(),
                target: t.tensor.clone(),
                layer: t.layer,
                canonical: t.canonical.clone(),
                shape: t.shape.clone(),
            });
        }
        targets.sort();
        targets.dedup();
        Ok(BindReport {
            naming,
            targets: targets.len(),
            bound,
            unmatched,
        })
    }
}

fn layer_note(layer: Option<usize>) -> String {
    layer.map(|l| format!(" layer {l}")).unwrap_or_default()
}

/// The largest block index any module spelling mentions, plus one (`blocks.N.` or
/// `blocks_N_`).
pub fn blocks_mentioned(modules: &[&str]) -> usize {
    let mut max = 0;
    for m in modules {
        for sep in ["blocks.", "blocks_"] {
            let mut rest = *m;
            while let Some(i) = rest.find(sep) {
                rest = &rest[i + sep.len()..];
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                if let Ok(n) = digits.parse::<usize>() {
                    max = max.max(n + 1);
                }
            }
        }
    }
    max
}

/// Resolves every entry's module id without a base: WAN names through the layout name
/// table (in any naming and convention spelling, kohya included), anything else as a
/// generic path with the convention's prefix removed.
pub fn resolve_names(set: &AdapterSet) -> Result<Vec<ModuleId>, AdapterError> {
    let modules: Vec<&str> = set.entries.iter().map(|e| e.module.as_str()).collect();
    let ix = BaseIndex::wan_names(blocks_mentioned(&modules));
    let naming = ix.choose_naming(&modules, preferred_naming(set.convention));
    let mut ids = Vec::new();
    let mut problems = Vec::new();
    for e in &set.entries {
        match ix.resolve(naming, &e.module) {
            Ok(mi) => ids.push(ix.modules[mi].id.clone()),
            Err(_) => match generic_path_of_spelling(&e.module, set.convention) {
                Some(path) => ids.push(ModuleId::Generic { path }),
                None => problems.push(problem(
                    e,
                    "not a WAN module name, and kohya's underscored names cannot be turned back \
                     into module paths without the base's own keys"
                        .into(),
                )),
            },
        }
    }
    if !problems.is_empty() {
        return Err(AdapterError::Names {
            path: set.path.clone(),
            entries: problems,
        });
    }
    Ok(ids)
}

/// The WAN module id of every entry whose name resolves in the WAN name table (in the
/// naming most of the adapter uses), `None` for the others. Never fails.
pub fn wan_ids(set: &AdapterSet) -> Vec<Option<ModuleId>> {
    let modules: Vec<&str> = set.entries.iter().map(|e| e.module.as_str()).collect();
    let ix = BaseIndex::wan_names(blocks_mentioned(&modules));
    let naming = ix.choose_naming(&modules, preferred_naming(set.convention));
    set.entries
        .iter()
        .map(|e| match ix.lookup(naming, &e.module) {
            Some(Hit::One(i)) => Some(ix.modules[*i].id.clone()),
            _ => None,
        })
        .collect()
}

/// The ids of a bound set (after `bind`): the base module of every entry, or `None` for
/// entries left unmatched.
pub fn bound_ids(set: &AdapterSet, report: &BindReport) -> Vec<Option<ModuleId>> {
    let mut by_entry: HashMap<(&str, Kind), &ModuleId> = HashMap::new();
    for b in &report.bound {
        by_entry.insert((b.module.as_str(), b.kind), &b.base_module);
    }
    set.entries
        .iter()
        .map(|e| {
            by_entry
                .get(&(e.module.as_str(), e.kind))
                .map(|id| (*id).clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_counted_in_both_spellings() {
        assert_eq!(
            blocks_mentioned(&["lora_unet_blocks_11_ffn_0", "diffusion_model.blocks.3.x"]),
            12
        );
        assert_eq!(blocks_mentioned(&["proj_out"]), 0);
    }

    #[test]
    fn name_index_resolves_every_convention_and_keeps_the_norm_swap() {
        let ix = BaseIndex::wan_names(2);
        let id = |n: Naming, s: &str| {
            ix.modules[ix.resolve(n, s).unwrap()]
                .id
                .display()
                .to_string()
        };
        assert_eq!(
            id(Naming::Wan, "lora_unet_blocks_1_self_attn_o"),
            "blocks.1.attn1.to_out.0"
        );
        assert_eq!(
            id(Naming::Wan, "lora_unet__blocks_1_ffn_0"),
            "blocks.1.ffn.net.0.proj"
        );
        assert_eq!(
            id(Naming::Wan, "diffusion_model.blocks.0.norm3"),
            "blocks.0.norm2"
        );
        assert_eq!(id(Naming::Diffusers, "blocks.0.norm2"), "blocks.0.norm2");
        assert_eq!(
            id(Naming::Wan, "diffusion_model.blocks.1.modulation"),
            "blocks.1.scale_shift_table"
        );
        assert_eq!(
            id(Naming::Nnx, "blocks.1.ffn.proj_out"),
            "blocks.1.ffn.net.2"
        );
        // The original Wan `norm2` (FFN norm) has no parameters: it must not bind to the
        // diffusers `norm2` (which is the original `norm3`).
        assert!(
            ix.resolve(Naming::Wan, "diffusion_model.blocks.0.norm2")
                .is_err()
        );
        assert!(ix.resolve(Naming::Wan, "blocks.5.self_attn.q").is_err());
    }
}
