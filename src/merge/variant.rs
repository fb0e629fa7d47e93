//! Which released base an adapter's shapes fit, for the hint of a shape-mismatch error.
//!
//! Owns: `hint`. For every bound entry with a low-rank pair it derives the (out, in') the
//! adapter was trained on (rows of `B`, columns of `A`) and compares it with the shape each
//! released WAN variant (`model::wan`) and SA3 size (`model::sa3`) gives that target. Does
//! not own: the tables themselves.

use std::collections::HashMap;

use crate::adapter::{AdapterSet, ParamRole};
use crate::layout::Layout;
use crate::layout::table::{Position, parse_stored};
use crate::model::sa3::{Sa3Variant, sa3_params};
use crate::model::wan::{ParamSpec, WanVariant};

/// `"\nhint: …"` naming the released variants every low-rank entry of `set` fits, or saying
/// none does; empty when the adapter has no low-rank entry with a bound target.
pub fn hint(set: &AdapterSet) -> String {
    let implied = implied_shapes(set);
    if implied.is_empty() {
        return String::new();
    }
    let mut fits = Vec::new();
    for v in WanVariant::ALL {
        let table = by_name(v.config().diffusers_params());
        let canonical = |t: &str| wan_canonical(t);
        if fits_table(&implied, &table, canonical) {
            fits.push(v.id().to_string());
        }
    }
    for v in Sa3Variant::ALL {
        let table = by_name(sa3_params(v));
        if fits_table(&implied, &table, |t: &str| Some(t.to_string())) {
            fits.push(v.id().to_string());
        }
    }
    if fits.is_empty() {
        "\nhint: its shapes fit no released WAN or SA3 variant (an adapter for a resized or \
         custom base?)"
            .into()
    } else {
        format!(
            "\nhint: this adapter seems made for {}; use that base",
            fits.join(" or ")
        )
    }
}

/// (target, out, in') of every bound entry with both `A` and `B`.
fn implied_shapes(set: &AdapterSet) -> Vec<(String, usize, usize)> {
    set.entries
        .iter()
        .filter_map(|e| {
            let target = e.target.clone()?;
            let a = e.param(ParamRole::A)?;
            let b = e.param(ParamRole::B)?;
            let rank = *a.shape.first()?;
            let out = *b.shape.first()?;
            let numel: usize = a.shape.iter().product();
            (rank > 0).then(|| (target, out, numel / rank))
        })
        .collect()
}

fn by_name(params: Vec<ParamSpec>) -> HashMap<String, Vec<usize>> {
    params.into_iter().map(|p| (p.name, p.shape)).collect()
}

/// The diffusers name of a WAN tensor stored under diffusers or original names.
fn wan_canonical(name: &str) -> Option<String> {
    [Layout::Diffusers, Layout::Wan]
        .iter()
        .find_map(|&l| parse_stored(l, name))
        .map(|(e, pos)| match pos {
            Position::Block(b) => format!("blocks.{b}.{}", e.diffusers),
            _ => e.diffusers.to_string(),
        })
}

/// True when at least one implied shape is found in `table` and every one found fits.
fn fits_table(
    implied: &[(String, usize, usize)],
    table: &HashMap<String, Vec<usize>>,
    canonical: impl Fn(&str) -> Option<String>,
) -> bool {
    let mut found = 0;
    for (target, out, inp) in implied {
        let Some(shape) = canonical(target).and_then(|c| table.get(&c)) else {
            continue;
        };
        let (o, i) = super::plan::matrix_view(shape);
        if (o, i) != (*out, *inp) {
            return false;
        }
        found += 1;
    }
    found > 0
}
