//! From `--adapter` specs to adapters bound to the base's transformers.
//!
//! Owns: `components_of` (which transformer(s) of a base a spec names, with the errors that
//! tell the user how to say it) and `bind_specs` (open every adapter once per component it
//! applies to, bind it with the adapter module's alias table of that component, collect the
//! keys that matched nothing). Does not own: parsing adapters or the alias table
//! (`adapter`), planning the merge (`merge::plan`). Shared by `wanbake merge` and recipes.

use std::collections::BTreeMap;

use super::error::MergeError;
use super::plan::BoundAdapter;
use super::spec::{AdapterSpec, ComponentChoice};
use crate::adapter::{AdapterOptions, AdapterSet, BaseIndex};
use crate::io::Checkpoint;

/// The base components (indexes into `Checkpoint::components`) a spec applies to. A base
/// with several transformers needs a component on every spec (`MergeError::Usage`).
pub fn components_of(spec: &AdapterSpec, base: &Checkpoint) -> Result<Vec<usize>, MergeError> {
    let names = || {
        base.components
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match &spec.component {
        ComponentChoice::All => Ok((0..base.components.len()).collect()),
        ComponentChoice::Only if base.components.len() == 1 => Ok(vec![0]),
        ComponentChoice::Only => Err(MergeError::Usage(format!(
            "adapter `{}`: the base has {} transformers ({}); say which one it is for, \
             e.g. --adapter {}={}, or all={} for every one",
            spec.text,
            base.components.len(),
            names(),
            base.components[0].name,
            spec.text,
            spec.text
        ))),
        ComponentChoice::Named(n) => base
            .components
            .iter()
            .position(|c| &c.name == n)
            .map(|i| vec![i])
            .ok_or_else(|| {
                let have = if base.components.len() == 1 {
                    "a single model (drop the prefix)".to_string()
                } else {
                    format!("transformers {}", names())
                };
                MergeError::Usage(format!(
                    "adapter `{}`: the base has no transformer `{n}`; it has {have}",
                    spec.text
                ))
            }),
    }
}

/// Opens and binds every spec's adapter to each component it names, in spec order. Keys
/// the parser did not consume and entries the binder could not place are refused by the
/// adapter module unless `allow_unmatched`; when allowed they travel in
/// `BoundAdapter::unmatched` to the merge report.
pub fn bind_specs(
    specs: &[AdapterSpec],
    base: &Checkpoint,
    allow_unmatched: bool,
) -> Result<Vec<BoundAdapter>, MergeError> {
    let mut indexes: BTreeMap<usize, BaseIndex> = BTreeMap::new();
    let mut out = Vec::new();
    for spec in specs {
        for ci in components_of(spec, base)? {
            let comp = &base.components[ci];
            let index = indexes
                .entry(ci)
                .or_insert_with(|| BaseIndex::new(&base.path.join(&comp.rel_dir), &comp.tensors));
            let opts = AdapterOptions {
                from: spec.from,
                scale: spec.scale,
                allow_unmatched,
            };
            let mut set = AdapterSet::open(&spec.path, &opts)?;
            let report = set.bind(index)?;
            let mut unmatched: Vec<String> = set.unparsed.iter().map(|k| k.key.clone()).collect();
            unmatched.extend(report.unmatched.iter().flat_map(|p| p.keys.iter().cloned()));
            out.push(BoundAdapter {
                set,
                component: ci,
                strength: spec.strength,
                shown: spec.text.clone(),
                unmatched,
            });
        }
    }
    Ok(out)
}
