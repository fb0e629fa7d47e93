//! From adapter specs (`--adapter`, a recipe's `[[adapter]]`) to adapters bound to the base's
//! transformers.
//!
//! Owns: `components_of` (which transformer(s) of a base a spec names, with the errors that
//! tell the user how to say it) and `bind_specs` (open every adapter once per component it
//! applies to, bind it with the adapter module's alias table of that component, collect the
//! keys that matched nothing), and the types that say it was done: `BoundAdapter` (made
//! only here, by `AdapterSet::bind`, which checks every entry once: the target exists, is a
//! float tensor and the entry's parameters fit it; some entry binds; keys that match nothing
//! are refused unless allowed) and `BoundSet`. `pipeline::plan` trusts both and re-checks
//! nothing. Does not own: parsing adapters, the alias table and the fit rules (the rest of
//! `adapter`), planning (`pipeline::plan`). Shared by `wanbake merge`, `extract` and recipes.

use std::collections::BTreeMap;

use super::spec::{AdapterSpec, ComponentChoice};
use super::{AdapterError, AdapterOptions, AdapterSet, BaseIndex};
use crate::io::Checkpoint;
use crate::model::base_model::BaseModel;

/// An adapter bound to one transformer of the base: every entry it holds has passed
/// `AdapterSet::bind` against that transformer (it cannot be made any other way).
// A private field, not `#[non_exhaustive]`: the crate's other modules must not make one
// either.
#[allow(clippy::manual_non_exhaustive)]
#[derive(Debug)]
pub struct BoundAdapter {
    /// The adapter; `Entry::target` and `Entry::binding` are set on every bound entry.
    pub set: AdapterSet,
    /// Index of the base component (`Checkpoint::components`) it was bound to.
    pub component: usize,
    /// Application weight `a` (finite; 0 skips the adapter).
    pub strength: f64,
    /// The `--adapter` argument as given.
    pub shown: String,
    /// Adapter keys that matched nothing (non-empty only when unmatched keys are allowed).
    pub unmatched: Vec<String>,
    /// Only `bind_adapter` makes one.
    _bound: (),
}

/// Every adapter of a merge, bound (`bind_specs`). Derefs to the adapters in spec order.
#[derive(Debug, Default)]
pub struct BoundSet(Vec<BoundAdapter>);

impl std::ops::Deref for BoundSet {
    type Target = [BoundAdapter];
    fn deref(&self) -> &[BoundAdapter] {
        &self.0
    }
}

impl FromIterator<BoundAdapter> for BoundSet {
    fn from_iter<I: IntoIterator<Item = BoundAdapter>>(iter: I) -> BoundSet {
        BoundSet(iter.into_iter().collect())
    }
}

/// Binds an opened adapter to base component `component`, whose alias table is `index`
/// (built once per component by the caller): the one place an adapter's entries are checked
/// against the base.
pub fn bind_adapter(
    mut set: AdapterSet,
    component: usize,
    index: &BaseIndex,
    strength: f64,
    shown: &str,
    allow_unmatched: bool,
) -> Result<BoundAdapter, AdapterError> {
    let report = set.bind(index, allow_unmatched)?;
    let mut unmatched: Vec<String> = set.unparsed.iter().map(|k| k.key.clone()).collect();
    unmatched.extend(report.unmatched.iter().flat_map(|p| p.keys.iter().cloned()));
    unmatched.sort();
    unmatched.dedup();
    Ok(BoundAdapter {
        set,
        component,
        strength,
        shown: shown.to_string(),
        unmatched,
        _bound: (),
    })
}

/// The base components (indexes into `Checkpoint::components`) a spec applies to. A base
/// with several transformers needs a component on every spec.
pub fn components_of(spec: &AdapterSpec, base: &Checkpoint) -> Result<Vec<usize>, AdapterError> {
    let names = || base.components.iter().map(|c| c.name.clone()).collect();
    match &spec.component {
        ComponentChoice::All => Ok((0..base.components.len()).collect()),
        ComponentChoice::Only if base.components.len() == 1 => Ok(vec![0]),
        ComponentChoice::Only => Err(AdapterError::ComponentNeeded {
            adapter: spec.text.clone(),
            components: names(),
        }),
        ComponentChoice::Named(n) => base
            .components
            .iter()
            .position(|c| &c.name == n)
            .map(|i| vec![i])
            .ok_or_else(|| AdapterError::NoSuchComponent {
                adapter: spec.text.clone(),
                named: n.clone(),
                components: names(),
            }),
    }
}

/// Opens and binds every spec's adapter to each component it names, in spec order. Keys
/// the parser did not consume (at open) and entries the binder could not place (at bind)
/// are refused unless `allow_unmatched`; when allowed they travel in
/// `BoundAdapter::unmatched` to the report.
pub fn bind_specs(
    specs: &[AdapterSpec],
    base: &BaseModel,
    allow_unmatched: bool,
) -> Result<BoundSet, AdapterError> {
    let mut indexes: BTreeMap<usize, BaseIndex> = BTreeMap::new();
    let mut out = Vec::new();
    for spec in specs {
        for ci in components_of(spec, base)? {
            let comp = &base.components[ci];
            let index = indexes.entry(ci).or_insert_with(|| {
                BaseIndex::new(&comp.dir(&base.path), &comp.tensors, base.model(ci))
            });
            let opts = AdapterOptions {
                from: spec.from,
                scale: spec.scale,
                allow_unmatched,
            };
            let set = AdapterSet::open(&spec.path, &opts)?;
            out.push(bind_adapter(
                set,
                ci,
                index,
                spec.strength,
                &spec.text,
                allow_unmatched,
            )?);
        }
    }
    Ok(BoundSet(out))
}
