//! Reading: where each canonical parameter lives in a checkpoint of a given layout.
//!
//! Owns: `ReadPlan::new`, which takes the names, dtypes and shapes of a checkpoint's tensors
//! (no data), a layout and optionally the `WanConfig`, and returns, for every canonical
//! (diffusers, PyTorch-layout) parameter, the stored tensor it comes from, the layer index
//! when that tensor is stacked, and the transform back to the PyTorch layout. Also owns
//! `infer_config`, which recovers the config from shapes when there is no config.json.
//! Does not own: the name table (`model::wan_names`) or moving bytes (`layout::conversion`).
//!
//! Every input key is accounted for: it maps to canonical parameters, or it is skipped and
//! reported (`norm_added_q`, which every reference ignores), or the plan fails naming it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::animate::{self, AnimateConfig};
use super::plan_error::{PlanError, StoredShapeMismatch};
use super::transform::Transform;
use super::wan::{CONTROL_UNSHUFFLE, ParamSpec, WanConfig};
use super::wan_layout::Layout;
use super::wan_names::{self, Dim, NameRow, Position, SKIPPED_MARKER, Scope, WanPart};
use crate::format::header::TensorInfo;
use crate::io::{DType, TensorView};

/// A tensor of the input as its header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    /// Name as stored (prefix included).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape as stored.
    pub shape: Vec<usize>,
}

impl From<&TensorView<'_>> for StoredTensor {
    fn from(t: &TensorView<'_>) -> StoredTensor {
        StoredTensor {
            name: t.name.to_string(),
            dtype: t.dtype,
            shape: t.shape.to_vec(),
        }
    }
}

impl From<&TensorInfo> for StoredTensor {
    fn from(t: &TensorInfo) -> StoredTensor {
        StoredTensor {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
        }
    }
}

/// Where one canonical parameter lives in the input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalSource {
    /// Canonical (diffusers) name.
    pub name: String,
    /// PyTorch-layout shape.
    pub shape: Vec<usize>,
    /// The stored tensor holding it.
    pub stored: String,
    /// Index along the stored tensor's leading layer axis, for stacked tensors.
    pub layer: Option<usize>,
    /// Shape of the stored data for this parameter (the layer's slice when stacked).
    pub stored_shape: Vec<usize>,
    /// Stored layout → PyTorch layout.
    pub to_canonical: Transform,
    /// Stored element type.
    pub dtype: DType,
}

/// A stored key that maps to no parameter on purpose, reported rather than dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedKey {
    /// Name as stored.
    pub name: String,
    /// Shape as stored.
    pub shape: Vec<usize>,
    /// Why it is skipped.
    pub reason: &'static str,
}

/// One line per reason for skipped keys (`(name, reason)` pairs, in order): the count, the
/// reason and the first few names, so the 14 blur kernels of an original Animate file are
/// one line, not fourteen.
pub fn skipped_lines<'k>(keys: impl IntoIterator<Item = (&'k str, &'k str)>) -> Vec<String> {
    const SHOWN: usize = 3;
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (name, reason) in keys {
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(name),
            None => by_reason.push((reason, vec![name])),
        }
    }
    by_reason
        .into_iter()
        .map(|(reason, names)| {
            let mut listed: Vec<String> =
                names.iter().take(SHOWN).map(|n| format!("`{n}`")).collect();
            if names.len() > SHOWN {
                listed.push(format!("and {} more", names.len() - SHOWN));
            }
            let what = crate::human::plural(names.len(), "key", "keys");
            format!("skipped {what} ({}): {reason}", listed.join(", "))
        })
        .collect()
}

/// For every canonical parameter, where it lives in the input.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadPlan {
    /// The input's layout.
    pub layout: Layout,
    /// The model config (given, or inferred from shapes).
    pub config: WanConfig,
    /// True when `config` was inferred from shapes (its head split is then a guess; see
    /// [`infer_config`]).
    pub config_inferred: bool,
    /// One entry per canonical parameter, in `WanConfig::diffusers_params` order.
    pub params: Vec<CanonicalSource>,
    /// Keys skipped on purpose.
    pub skipped: Vec<SkippedKey>,
    index: HashMap<String, usize>,
}

const SKIP_REASON: &str =
    "norm_added_q is unused by every WAN forward pass; diffusers and MaxDiffusion skip it on load";

/// A key resolved to one canonical parameter, before checking it against the config.
struct Found<'a> {
    stored: &'a StoredTensor,
    entry: &'static NameRow,
    block: Option<usize>,
    layer: Option<usize>,
    stored_shape: Vec<usize>,
    shape: Vec<usize>,
}

impl ReadPlan {
    /// Plans reading `tensors` (a whole checkpoint, every shard) stored in `layout`.
    /// Without `config`, the config is inferred from the shapes ([`infer_config`]).
    pub fn new(
        layout: Layout,
        tensors: &[StoredTensor],
        config: Option<&WanConfig>,
    ) -> Result<ReadPlan, PlanError> {
        let mut skipped = Vec::new();
        let mut parsed = Vec::new();
        let mut unknown = Vec::new();
        for t in tensors {
            if let Some(reason) = skip_reason(layout, &t.name) {
                skipped.push(SkippedKey {
                    name: t.name.clone(),
                    shape: t.shape.clone(),
                    reason,
                });
            } else if let Some((entry, pos)) = wan_names::parse_stored(layout, &t.name) {
                parsed.push((t, entry, pos));
            } else {
                unknown.push(t.name.clone());
            }
        }
        if !unknown.is_empty() {
            unknown.sort();
            return Err(PlanError::UnknownKeys {
                layout,
                keys: unknown,
            });
        }
        if let Some((t, _, _)) = parsed.iter().find(|(t, _, _)| !t.dtype.is_float()) {
            return Err(PlanError::NonFloat {
                key: t.name.clone(),
                dtype: t.dtype,
            });
        }
        let counts = match config {
            Some(c) => StackCounts {
                blocks: c.num_layers,
                vace: c.blocks_of(Scope::VaceBlock),
                motion_res: c.blocks_of(Scope::MotionRes),
                faces: c.blocks_of(Scope::FaceAdapter),
            },
            None => count_layers(&parsed)?,
        };
        let found = expand(layout, &parsed, counts.blocks)?;
        check_motion_out(layout, &found, counts.motion_res)?;
        let (config, config_inferred) = match config {
            Some(c) => (c.clone(), false),
            None => {
                let shapes = found
                    .iter()
                    .map(|f| (name_of(f), f.shape.clone()))
                    .collect();
                (infer_config(&shapes, counts)?, true)
            }
        };
        let params = check_against_config(layout, &config, found)?;
        let index = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        Ok(ReadPlan {
            layout,
            config,
            config_inferred,
            params,
            skipped,
            index,
        })
    }

    /// The canonical parameters (names and PyTorch shapes), in plan order.
    pub fn canonical_params(&self) -> Vec<ParamSpec> {
        self.params
            .iter()
            .map(|p| ParamSpec {
                name: p.name.clone(),
                shape: p.shape.clone(),
            })
            .collect()
    }

    /// Where the canonical parameter `name` lives.
    pub fn get(&self, name: &str) -> Option<&CanonicalSource> {
        self.index.get(name).map(|&i| &self.params[i])
    }
}

fn name_of(f: &Found<'_>) -> String {
    f.entry.canonical(f.block)
}

/// Why reading skips the stored key `name` of `layout`, if it does.
fn skip_reason(layout: Layout, name: &str) -> Option<&'static str> {
    if name.contains(SKIPPED_MARKER) {
        Some(SKIP_REASON)
    } else if layout == Layout::Wan && animate::is_blur_kernel(name) {
        Some(animate::BLUR_KERNEL_REASON)
    } else {
        None
    }
}

/// The original motion encoder's last convolution sits right after the residual blocks
/// (`convs.(R+1)`): any other index is not a parameter of the model.
fn check_motion_out(layout: Layout, found: &[Found<'_>], res: usize) -> Result<(), PlanError> {
    let misplaced: Vec<String> = found
        .iter()
        .filter(|f| f.entry.scope == Scope::MotionOut && layout == Layout::Wan)
        .filter(|f| f.block != Some(res))
        .map(|f| f.stored.name.clone())
        .collect();
    if misplaced.is_empty() {
        return Ok(());
    }
    Err(PlanError::UnexpectedKeys {
        layout,
        keys: misplaced,
    })
}

/// The number of blocks in each stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackCounts {
    /// L, the transformer blocks.
    pub blocks: usize,
    /// The VACE context blocks (0 for every other model).
    pub vace: usize,
    /// The Animate motion encoder's residual blocks (0 for every other model).
    pub motion_res: usize,
    /// The Animate face adapters (0 for every other model).
    pub faces: usize,
}

/// The stack sizes from the keys alone: one more than the largest block index of each
/// stack (unscanned), or for the blocks the leading axis of the stacked tensors (scanned;
/// they must agree, checked in `expand`).
fn count_layers(
    parsed: &[(&StoredTensor, &'static NameRow, Position)],
) -> Result<StackCounts, PlanError> {
    let blocks = count_blocks(parsed)?;
    Ok(StackCounts {
        blocks,
        vace: unscanned_count(parsed, Scope::VaceBlock),
        motion_res: unscanned_count(parsed, Scope::MotionRes),
        faces: unscanned_count(parsed, Scope::FaceAdapter),
    })
}

/// One more than the largest unscanned block index of `scope`'s stack (0 without one).
fn unscanned_count(parsed: &[(&StoredTensor, &'static NameRow, Position)], scope: Scope) -> usize {
    parsed
        .iter()
        .filter(|(_, e, _)| e.scope == scope)
        .filter_map(|(_, _, p)| match p {
            Position::Block(b) => Some(b + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// L: see [`count_layers`].
fn count_blocks(
    parsed: &[(&StoredTensor, &'static NameRow, Position)],
) -> Result<usize, PlanError> {
    let mut stacked: Vec<&StoredTensor> = parsed
        .iter()
        .filter(|(_, _, p)| *p == Position::Stacked)
        .map(|(t, _, _)| *t)
        .collect();
    stacked.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(first) = stacked.first() {
        return first
            .shape
            .first()
            .copied()
            .ok_or_else(|| PlanError::Stack {
                key: first.name.clone(),
                shape: first.shape.clone(),
                expected: 0,
            });
    }
    Ok(unscanned_count(parsed, Scope::Block))
}

/// Resolves every parsed key to its canonical parameter(s) with PyTorch shapes; stacked
/// keys become L parameters.
fn expand<'a>(
    layout: Layout,
    parsed: &[(&'a StoredTensor, &'static NameRow, Position)],
    num_layers: usize,
) -> Result<Vec<Found<'a>>, PlanError> {
    let mut found = Vec::new();
    for &(t, entry, pos) in parsed {
        let to_canonical = entry.from_canonical(layout).inverse();
        let stored_shape = match pos {
            Position::Stacked => match t.shape.split_first() {
                Some((&l, rest)) if l == num_layers => rest.to_vec(),
                _ => {
                    return Err(PlanError::Stack {
                        key: t.name.clone(),
                        shape: t.shape.clone(),
                        expected: num_layers,
                    });
                }
            },
            _ => t.shape.clone(),
        };
        let shape = to_canonical
            .apply_shape(&stored_shape)
            .map_err(|e| PlanError::Rank {
                key: t.name.clone(),
                reason: e.to_string(),
            })?;
        let blocks: Vec<(Option<usize>, Option<usize>)> = match pos {
            Position::Top => vec![(None, None)],
            Position::Block(b) => vec![(Some(b), None)],
            Position::Stacked => (0..num_layers).map(|i| (Some(i), Some(i))).collect(),
        };
        let pieces = entry.pieces(layout);
        if pieces.len() > 1 {
            found.extend(fused_pieces(t, &pieces, blocks[0].0)?);
            continue;
        }
        for (block, layer) in blocks {
            found.push(Found {
                stored: t,
                entry,
                block,
                layer,
                stored_shape: stored_shape.clone(),
                shape: shape.clone(),
            });
        }
    }
    Ok(found)
}

/// The parameters of a fused tensor (`NameRow::pieces`): piece k is the k-th of its equal
/// row blocks, read as layer k of the tensor seen as (pieces, rows / pieces, ...).
fn fused_pieces<'a>(
    t: &'a StoredTensor,
    pieces: &[&'static NameRow],
    block: Option<usize>,
) -> Result<Vec<Found<'a>>, PlanError> {
    let n = pieces.len();
    let mut slice = t.shape.clone();
    match slice.first_mut() {
        Some(rows) if *rows % n == 0 => *rows /= n,
        _ => {
            return Err(PlanError::Rank {
                key: t.name.clone(),
                reason: format!(
                    "a fused tensor of {n} equal row blocks, got shape {:?}",
                    t.shape
                ),
            });
        }
    }
    Ok(pieces
        .iter()
        .enumerate()
        .map(|(k, &entry)| Found {
            stored: t,
            entry,
            block,
            layer: Some(k),
            stored_shape: slice.clone(),
            shape: slice.clone(),
        })
        .collect())
}

/// Matches the resolved keys against the config's parameter list: every parameter present
/// once, nothing extra, every shape right.
fn check_against_config(
    layout: Layout,
    config: &WanConfig,
    found: Vec<Found<'_>>,
) -> Result<Vec<CanonicalSource>, PlanError> {
    let mut by_name = index_by_canonical(found)?;
    let expected = config.diffusers_params();
    check_names(layout, &expected, &by_name)?;
    let mut mismatches: BTreeMap<String, StoredShapeMismatch> = BTreeMap::new();
    let mut params = Vec::with_capacity(expected.len());
    for p in expected {
        let Some(f) = by_name.remove(&p.name) else {
            continue; // unreachable: check_names reported missing names
        };
        if f.shape != p.shape {
            let mismatch = shape_mismatch(layout, config, &f, &p);
            mismatches.entry(mismatch.key.clone()).or_insert(mismatch);
            continue;
        }
        params.push(CanonicalSource {
            name: p.name,
            shape: p.shape,
            stored: f.stored.name.clone(),
            layer: f.layer,
            stored_shape: f.stored_shape,
            to_canonical: f.entry.from_canonical(layout).inverse(),
            dtype: f.stored.dtype,
        });
    }
    if !mismatches.is_empty() {
        return Err(PlanError::Shapes {
            layout,
            mismatches: mismatches.into_values().collect(),
        });
    }
    Ok(params)
}

/// The resolved keys by canonical name; two keys for one parameter are an error.
fn index_by_canonical(found: Vec<Found<'_>>) -> Result<HashMap<String, Found<'_>>, PlanError> {
    let mut by_name: HashMap<String, Found<'_>> = HashMap::with_capacity(found.len());
    for f in found {
        let name = name_of(&f);
        if let Some(prev) = by_name.get(&name) {
            return Err(PlanError::Duplicate {
                canonical: name,
                first: prev.stored.name.clone(),
                second: f.stored.name.clone(),
            });
        }
        by_name.insert(name, f);
    }
    Ok(by_name)
}

/// Nothing the config lacks, nothing missing that it has.
fn check_names(
    layout: Layout,
    expected: &[ParamSpec],
    by_name: &HashMap<String, Found<'_>>,
) -> Result<(), PlanError> {
    let expected_names: BTreeSet<&str> = expected.iter().map(|p| p.name.as_str()).collect();
    let unexpected: BTreeSet<String> = by_name
        .iter()
        .filter(|(n, _)| !expected_names.contains(n.as_str()))
        .map(|(_, f)| f.stored.name.clone())
        .collect();
    if !unexpected.is_empty() {
        return Err(PlanError::UnexpectedKeys {
            layout,
            keys: unexpected.into_iter().collect(),
        });
    }
    let missing: BTreeSet<String> = expected
        .iter()
        .filter(|p| !by_name.contains_key(&p.name))
        .map(|p| stored_name_for(layout, &p.name))
        .collect();
    if !missing.is_empty() {
        return Err(PlanError::MissingKeys {
            layout,
            keys: missing.into_iter().collect(),
        });
    }
    Ok(())
}

/// A wrong shape, stated in the stored layout (stacked shapes with their L).
fn shape_mismatch(
    layout: Layout,
    config: &WanConfig,
    f: &Found<'_>,
    p: &ParamSpec,
) -> StoredShapeMismatch {
    let mut want = f
        .entry
        .from_canonical(layout)
        .apply_shape(&p.shape)
        .unwrap_or_else(|_| p.shape.clone());
    let pieces = f.entry.pieces(layout).len();
    if pieces > 1 {
        if let Some(rows) = want.first_mut() {
            *rows *= pieces;
        }
    } else if f.layer.is_some() {
        want.insert(0, config.num_layers);
    }
    StoredShapeMismatch {
        key: f.stored.name.clone(),
        expected: want,
        found: f.stored.shape.clone(),
    }
}

/// The name a canonical parameter has in `layout` (the stacked name for `nnx-scanned`).
fn stored_name_for(layout: Layout, canonical: &str) -> String {
    match wan_names::parse_canonical(canonical) {
        Some((e, block)) => e.stored_name(layout, block.unwrap_or(0)).0,
        None => canonical.to_string(),
    }
}

/// The head dimension assumed when a config is inferred from shapes: every released WAN
/// model has `attention_head_dim` 128 (spec wan.md §1.3).
pub const INFERRED_HEAD_DIM: usize = 128;

/// Recovers a `WanConfig` from canonical parameter shapes (PyTorch layout) and L.
///
/// Every field that shapes a parameter is recovered exactly: D, C_in, patch, Fq, T, F,
/// C_out, I, A, P and cross_attn_norm. The split of D into heads × head_dim shapes no
/// parameter, so it is a guess: Dh = 128 when D is a multiple of 128 (every released
/// model), else one head of width D. eps, rope_max_seq_len and qk_norm take diffusers'
/// defaults. Each size is read from the first parameter of the name table whose shape has
/// its symbol (`wan_names::first_axis_of`), so no parameter name is written here.
pub fn infer_config(
    shapes: &HashMap<String, Vec<usize>>,
    counts: StackCounts,
) -> Result<WanConfig, PlanError> {
    let num_layers = counts.blocks;
    if num_layers == 0 && counts.vace > 0 && read_dim(shapes, Dim::InChannels)?.is_none() {
        return Err(PlanError::VaceModuleOnly {
            blocks: counts.vace,
        });
    }
    let get = |dim: Dim| required_dim(shapes, dim);
    let optional = |dim: Dim| read_dim(shapes, dim);
    let (d, in_channels) = (get(Dim::Inner)?, get(Dim::InChannels)?);
    let patch_size = [get(Dim::PatchT)?, get(Dim::PatchH)?, get(Dim::PatchW)?];
    if num_layers == 0 {
        return Err(PlanError::Infer("no transformer blocks found".into()));
    }
    let proj = get(Dim::OutPatch)?;
    let patch_volume: usize = patch_size.iter().product();
    if patch_volume == 0 || proj % patch_volume != 0 {
        return Err(PlanError::Infer(format!(
            "{} has {proj} rows, not a multiple of the patch volume {patch_volume}",
            locate(Dim::OutPatch)?.0
        )));
    }
    // Wan-Animate's face adapter norms are one head wide: the split is read, not guessed.
    let read_head = optional(Dim::HeadDim)?.filter(|&h| h > 0 && d % h == 0);
    let (num_attention_heads, attention_head_dim) = if let Some(h) = read_head {
        (d / h, h)
    } else if d % INFERRED_HEAD_DIM == 0 {
        (d / INFERRED_HEAD_DIM, INFERRED_HEAD_DIM)
    } else {
        (1, d)
    };
    let has =
        |part| wan_names::first_of(part).is_some_and(|e| shapes.contains_key(&table_row_name(e)));
    let cross_attn_norm = has(WanPart::CrossAttnNorm);
    let vace_in_channels = optional(Dim::VaceIn)?;
    let vace_layers = match (vace_in_channels, counts.vace) {
        (None, 0) => None,
        (None, _) => {
            return Err(PlanError::Infer(format!(
                "{} VACE blocks but no `{}`: the VACE part alone (a VACE module file) is not \
                 a whole model",
                counts.vace,
                locate(Dim::VaceIn)?.0
            )));
        }
        _ => Some(infer_vace_layers(counts)?),
    };
    Ok(WanConfig {
        patch_size,
        num_attention_heads,
        attention_head_dim,
        in_channels,
        out_channels: Some(proj / patch_volume),
        text_dim: get(Dim::Text)?,
        freq_dim: get(Dim::Freq)?,
        ffn_dim: get(Dim::Ffn)?,
        num_layers,
        cross_attn_norm,
        image_dim: optional(Dim::Image)?,
        added_kv_proj_dim: optional(Dim::AddedKv)?,
        pos_embed_seq_len: optional(Dim::PosEmbed)?,
        vace_layers,
        vace_in_channels,
        inject_sample_info: has(WanPart::FpsEmbed),
        in_dim_ref_conv: optional(Dim::RefConvIn)?,
        in_dim_control_adapter: optional(Dim::ControlIn)?
            .map(unshuffled_channels)
            .transpose()?,
        animate: match has(WanPart::Animate) {
            true => Some(
                AnimateConfig::infer(
                    |n| shapes.get(n).cloned(),
                    counts.motion_res,
                    counts.faces,
                    num_layers,
                )
                .map_err(PlanError::Infer)?,
            ),
            false => None,
        },
        ..WanConfig::default()
    })
}

/// `in_dim_control_adapter` from the camera adapter's first convolution's input channels.
fn unshuffled_channels(channels: usize) -> Result<usize, PlanError> {
    if channels.is_multiple_of(CONTROL_UNSHUFFLE) {
        return Ok(channels / CONTROL_UNSHUFFLE);
    }
    Err(PlanError::Infer(format!(
        "`{}` has {channels} input channels, not a multiple of the camera adapter's pixel \
         unshuffle ({CONTROL_UNSHUFFLE})",
        locate(Dim::ControlIn)?.0
    )))
}

/// The blocks a VACE model's context blocks follow, which no weight records: every released
/// VACE model spaces its K context blocks evenly over its L blocks from block 0 (1.3B: 15
/// of 30, every 2nd; 14B: 8 of 40, every 5th; diffusers' convert_wan_to_diffusers.py
/// configs; ComfyUI's `VaceWanModel` assumes the same spacing), so that is the guess; any
/// other count needs a config.json saying `vace_layers`.
fn infer_vace_layers(counts: StackCounts) -> Result<Vec<usize>, PlanError> {
    let StackCounts { blocks, vace, .. } = counts;
    if vace == 0 || !blocks.is_multiple_of(vace) {
        return Err(PlanError::Infer(format!(
            "{vace} VACE blocks for {blocks} transformer blocks: which blocks they follow is \
             not in the weights and is not an even spacing; give a config.json with `vace_layers`"
        )));
    }
    Ok((0..blocks).step_by(blocks / vace).collect())
}

/// The canonical name of a row (block 0 for a block row).
fn table_row_name(e: &NameRow) -> String {
    e.stored_name(Layout::Diffusers, 0).0
}

/// Where `dim` is read back from: the canonical name, rank and axis of the first parameter
/// of the name table whose shape has it.
fn locate(dim: Dim) -> Result<(String, usize, usize), PlanError> {
    wan_names::first_axis_of(dim)
        .map(|(e, axis)| (table_row_name(e), e.shape.len(), axis))
        .ok_or_else(|| PlanError::Infer(format!("no WAN parameter has a {dim:?} axis")))
}

/// The size of `dim` in `shapes`, `None` when the parameter it is read from is absent.
fn read_dim(shapes: &HashMap<String, Vec<usize>>, dim: Dim) -> Result<Option<usize>, PlanError> {
    let (name, ndim, axis) = locate(dim)?;
    match shapes.get(&name) {
        None => Ok(None),
        Some(s) if s.len() == ndim => Ok(Some(s[axis])),
        Some(s) => Err(PlanError::Infer(format!(
            "`{name}` has shape {s:?}, expected {ndim} dimensions"
        ))),
    }
}

/// The size of `dim` in `shapes`; the parameter it is read from must be present.
fn required_dim(shapes: &HashMap<String, Vec<usize>>, dim: Dim) -> Result<usize, PlanError> {
    read_dim(shapes, dim)?.ok_or_else(|| {
        let name = locate(dim).map(|l| l.0).unwrap_or_default();
        PlanError::Infer(format!("`{name}` (canonical name) is missing"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_keys_are_one_line_per_reason_with_a_count() {
        let keys = [("a.kernel", "blur"), ("n", "unused"), ("b.kernel", "blur")]
            .into_iter()
            .chain((0..4).map(|_| ("c.kernel", "blur")));
        assert_eq!(
            skipped_lines(keys),
            [
                "skipped 6 keys (`a.kernel`, `b.kernel`, `c.kernel`, and 3 more): blur",
                "skipped 1 key (`n`): unused",
            ]
        );
    }
    use crate::model::wan::WanVariant;

    fn counts_of(c: &WanConfig) -> StackCounts {
        StackCounts {
            blocks: c.num_layers,
            vace: c.blocks_of(Scope::VaceBlock),
            motion_res: c.blocks_of(Scope::MotionRes),
            faces: c.blocks_of(Scope::FaceAdapter),
        }
    }

    fn shapes_of(config: &WanConfig) -> HashMap<String, Vec<usize>> {
        config
            .diffusers_params()
            .into_iter()
            .map(|p| (p.name, p.shape))
            .collect()
    }

    #[test]
    fn every_released_config_is_recovered_from_its_shapes() {
        for v in WanVariant::ALL {
            let c = v.config();
            assert_eq!(
                infer_config(&shapes_of(&c), counts_of(&c)).unwrap(),
                c,
                "{v:?}"
            );
        }
    }

    #[test]
    fn inference_errors_name_the_canonical_parameter() {
        let c = WanVariant::T2V1_3B.config();
        let mut shapes = shapes_of(&c);
        shapes.insert("proj_out.weight".into(), vec![64]);
        let e = infer_config(&shapes, counts_of(&c))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`proj_out.weight` has shape [64], expected 2 dimensions"),
            "{e}"
        );
        shapes.remove("patch_embedding.weight");
        let e = infer_config(&shapes, counts_of(&c))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`patch_embedding.weight` (canonical name) is missing"),
            "{e}"
        );
    }
}
