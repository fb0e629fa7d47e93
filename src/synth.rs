//! Synthetic checkpoints with the real shapes of released models, for benchmarks, the
//! dry-run checks of real-world recipes, and tests that need multi-GB inputs.
//!
//! Owns: `SynthModel`, `SynthSpec` and `synth_release`. Values are either zero (written as
//! sparse files: a 28 GB checkpoint costs no disk and no time) or a seeded pseudo-random
//! stream per tensor (`rng::SplitMix64`, seeded from the seed and the tensor's name:
//! independent of thread count and of tensor order).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use crate::format::header_layout::PlannedTensor;
use crate::io::{DType, dtype};
use crate::model::sa3::{Sa3Variant, sa3_params};
use crate::model::wan::{ParamSpec, WanConfig, WanVariant};
use crate::model::wan_layout::{Layout, stamp_config};
use crate::model::wan_names::parse_canonical;
use crate::release::staging::{Allocation, Replace, Staging};
use crate::release::writer::{ComponentOutput, OutputPlan};
use crate::release::{Hooks, Release, ReleaseError, ReleaseRequest, write_release};
use crate::rng::SplitMix64;

/// The model to imitate.
#[derive(Clone, Debug, PartialEq)]
pub enum SynthModel {
    /// A released WAN transformer (diffusers model folder).
    Wan(WanVariant),
    /// Wan 2.2 A14B: a pipeline folder with transformer/ and transformer_2/.
    WanA14B,
    /// Any WAN config (e.g. fewer layers for a quick test).
    WanConfig(Box<WanConfig>),
    /// A released SA3 size (single `model.safetensors`).
    Sa3(Sa3Variant),
}

impl SynthModel {
    /// Every released model, in the order `--help` lists them: the named values of
    /// `synth --model`.
    pub fn named() -> &'static [SynthModel] {
        static NAMED: LazyLock<Vec<SynthModel>> = LazyLock::new(|| {
            let mut v: Vec<SynthModel> = WanVariant::ALL.map(SynthModel::Wan).to_vec();
            v.push(SynthModel::WanA14B);
            v.extend(Sa3Variant::ALL.map(SynthModel::Sa3));
            v
        });
        &NAMED
    }

    /// The id of a released model (`wan2.1-t2v-1.3b`, `wan2.2-t2v-a14b`, `sa3-small`, ...:
    /// the ids of `inspect`); `None` for an arbitrary config.
    pub fn id(&self) -> Option<&'static str> {
        match self {
            SynthModel::Wan(v) => Some(v.id()),
            SynthModel::WanA14B => Some("wan2.2-t2v-a14b"),
            SynthModel::Sa3(v) => Some(v.id()),
            SynthModel::WanConfig(_) => None,
        }
    }

    /// The released model with this id.
    pub fn parse(s: &str) -> Option<SynthModel> {
        SynthModel::named()
            .iter()
            .find(|m| m.id() == Some(s))
            .cloned()
    }
}

impl clap::ValueEnum for SynthModel {
    fn value_variants<'a>() -> &'a [Self] {
        SynthModel::named()
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        self.id().map(clap::builder::PossibleValue::new)
    }
}

/// How tensors are filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// All zeros, written as sparse files.
    Zero,
    /// Seeded pseudo-random values of weight-like magnitude.
    Random {
        /// Seed.
        seed: u64,
    },
}

impl Fill {
    /// Both kinds (`random` with seed 0; [`Fill::seeded`] sets another).
    pub const ALL: [Fill; 2] = [Fill::Zero, Fill::Random { seed: 0 }];

    /// The kind's name, as `synth --fill` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Fill::Zero => "zero",
            Fill::Random { .. } => "random",
        }
    }

    /// The same kind with this seed (zeros have none).
    pub fn seeded(self, seed: u64) -> Fill {
        match self {
            Fill::Zero => Fill::Zero,
            Fill::Random { .. } => Fill::Random { seed },
        }
    }
}

crate::names::value_enum!(Fill);

/// A synthetic checkpoint request.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    /// Model to imitate.
    pub model: SynthModel,
    /// Storage dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// Values.
    pub fill: Fill,
    /// Override the number of WAN blocks (smaller test models).
    pub layers: Option<usize>,
    /// Shard size in bytes, if sharded output is wanted.
    pub shard_bytes: Option<u64>,
}

fn wan_component(
    cfg: &WanConfig,
    rel_dir: &str,
    dtype: DType,
    shard: Option<u64>,
) -> ComponentOutput {
    let (layout, params) = synth_names(cfg);
    let mut config = serde_json::to_value(cfg).expect("config serialises");
    if let serde_json::Value::Object(m) = &mut config {
        m.insert("_class_name".into(), cfg.class_name().into());
        if layout != Layout::Diffusers {
            // The config and file name say the layout, as every output's do.
            stamp_config(m, layout);
        }
    }
    let mut cbytes = serde_json::to_vec_pretty(&config).expect("config serialises");
    cbytes.push(b'\n');
    ComponentOutput {
        rel_dir: rel_dir.into(),
        stem: layout.weights_stem("diffusion_pytorch_model"),
        tensors: planned(&params, dtype),
        metadata: BTreeMap::from([("format".to_string(), "pt".to_string())]),
        sidecars: vec![("config.json".into(), cbytes)],
        max_shard_bytes: shard,
    }
}

/// `cfg` cut to its first `layers` blocks, with the VACE blocks that follow one of them.
fn with_layers(mut cfg: WanConfig, layers: Option<usize>) -> WanConfig {
    if let Some(l) = layers {
        cfg.num_layers = l;
        if let Some(v) = &mut cfg.vace_layers {
            v.retain(|&b| b < l);
        }
    }
    cfg
}

/// The names a synthetic model is written in: diffusers', or the original Wan names for a
/// model part diffusers has no class for (Wan Fun's `ref_conv` and `control_adapter`, which
/// the released Fun files hold in original names).
fn synth_names(cfg: &WanConfig) -> (Layout, Vec<ParamSpec>) {
    let params = cfg.diffusers_params();
    let rows = || params.iter().filter_map(|p| parse_canonical(&p.name));
    if rows().all(|(row, _)| row.fits(Layout::Diffusers)) {
        return (Layout::Diffusers, params);
    }
    let wan = rows()
        .zip(&params)
        .map(|((row, block), p)| ParamSpec {
            name: row.stored_name(Layout::Wan, block.unwrap_or(0)).0,
            shape: p.shape.clone(),
        })
        .collect();
    (Layout::Wan, wan)
}

fn planned(params: &[ParamSpec], dtype: DType) -> Vec<PlannedTensor> {
    params
        .iter()
        .map(|p| PlannedTensor {
            name: p.name.clone(),
            dtype,
            shape: p.shape.clone(),
        })
        .collect()
}

/// The output plan of a synthetic checkpoint.
pub fn synth_plan(
    spec: &SynthSpec,
) -> Result<OutputPlan, crate::format::header_layout::LayoutError> {
    let wan = |cfg: WanConfig| with_layers(cfg, spec.layers);
    let (components, root) = match &spec.model {
        SynthModel::Wan(v) => (
            vec![wan_component(
                &wan(v.config()),
                "",
                spec.dtype,
                spec.shard_bytes,
            )],
            vec![],
        ),
        SynthModel::WanConfig(c) => (
            vec![wan_component(
                &wan((**c).clone()),
                "",
                spec.dtype,
                spec.shard_bytes,
            )],
            vec![],
        ),
        SynthModel::WanA14B => {
            let cfg = wan(WanVariant::T2V14B.config());
            let index = serde_json::json!({
                "_class_name": "WanPipeline",
                "boundary_ratio": 0.875,
                "transformer": ["diffusers", "WanTransformer3DModel"],
                "transformer_2": ["diffusers", "WanTransformer3DModel"],
            });
            let mut bytes = serde_json::to_vec_pretty(&index).expect("serialises");
            bytes.push(b'\n');
            (
                vec![
                    wan_component(&cfg, "transformer", spec.dtype, spec.shard_bytes),
                    wan_component(&cfg, "transformer_2", spec.dtype, spec.shard_bytes),
                ],
                vec![crate::release::writer::AuxFile {
                    rel_path: "model_index.json".into(),
                    bytes,
                }],
            )
        }
        SynthModel::Sa3(v) => (
            vec![ComponentOutput {
                rel_dir: PathBuf::new(),
                stem: "model".into(),
                tensors: planned(&sa3_params(*v), spec.dtype),
                metadata: BTreeMap::new(),
                sidecars: vec![],
                max_shard_bytes: spec.shard_bytes,
            }],
            vec![],
        ),
    };
    OutputPlan::build(&components, &root)
}

/// Writes a synthetic checkpoint as a release (with manifest) at `dest`; `hooks` run as
/// `release::write_release` runs them.
pub fn synth_release(
    spec: &SynthSpec,
    dest: &Path,
    replace: Replace,
    hooks: Hooks<'_>,
) -> Result<Release, ReleaseError> {
    let plan = synth_plan(spec).map_err(|e| ReleaseError::Produce(e.into()))?;
    let allocation = match spec.fill {
        Fill::Zero => Allocation::Sparse,
        Fill::Random { .. } => Allocation::Reserve,
    };
    let options = serde_json::json!({
        "model": format!("{:?}", spec.model),
        "dtype": spec.dtype.as_str(),
        "fill": format!("{:?}", spec.fill),
        "layers": spec.layers,
        "shard_bytes": spec.shard_bytes,
    });
    let req = ReleaseRequest {
        dest,
        plan,
        input_paths: &[],
        inputs: vec![],
        hash_while_writing: Vec::new(),
        command: "synth",
        options,
        replace,
        allocation,
    };
    let fill = spec.fill;
    write_release(
        req,
        |staging| {
            let plan = staging.plan();
            let jobs: Vec<(String, crate::release::writer::Slot)> =
                plan.slots().map(|(_, n, s)| (n.to_string(), s)).collect();
            staging.for_each_in_file_order(
                &jobs,
                |(_, slot)| (*slot, 0),
                || (),
                |_, (name, slot)| -> Result<(), SynthFillError> {
                    let Fill::Random { seed } = fill else {
                        return Ok(());
                    };
                    let info = &plan.files[slot.file].layout.tensors[slot.tensor];
                    fill_random(staging, *slot, info, seed).map_err(|source| SynthFillError {
                        tensor: name.clone(),
                        source: Box::new(source),
                    })
                },
            )?;
            Ok::<_, SynthFillError>(serde_json::json!({ "tensors": plan.tensor_count() }))
        },
        hooks,
    )
}

/// Writing a synthetic tensor failed.
#[derive(Debug, thiserror::Error)]
#[error("tensor `{tensor}`")]
pub struct SynthFillError {
    /// The tensor.
    tensor: String,
    /// Why.
    #[source]
    source: Box<crate::release::staging::WriteError>,
}

fn fill_random(
    staging: &crate::release::staging::Staging,
    slot: crate::release::writer::Slot,
    info: &crate::format::header::TensorInfo,
    seed: u64,
) -> Result<(), crate::release::staging::WriteError> {
    const CHUNK: usize = 1 << 20;
    let numel = info.numel();
    let fan_in: usize = info.shape.iter().skip(1).product::<usize>().max(1);
    let is_norm =
        info.shape.len() == 1 && (info.name.contains("norm") || info.name.contains("scale"));
    let amp = if info.shape.len() >= 2 {
        1.0 / (fan_in as f32).sqrt()
    } else {
        0.1
    };
    let mut rng = SplitMix64::new(seed ^ fnv1a(info.name.as_bytes()));
    let size = info.dtype.element_bytes();
    let mut vals = vec![0f32; CHUNK.min(numel)];
    let mut bytes = vec![0u8; vals.len() * size];
    let mut done = 0;
    while done < numel {
        let n = CHUNK.min(numel - done);
        for v in &mut vals[..n] {
            // k/2²³ − 1 with 24 bits, the value `(k/2²⁴)·2 − 1` the fill has always drawn.
            let u = rng.signed_f32();
            *v = if is_norm { 1.0 + 0.1 * u } else { amp * u };
        }
        dtype::narrow_from_f32(info.dtype, &vals[..n], &mut bytes[..n * size]).map_err(|e| {
            crate::release::staging::WriteError::Io {
                path: info.name.clone().into(),
                source: std::io::Error::other(e),
            }
        })?;
        staging.write(slot, done * size, &bytes[..n * size])?;
        done += n;
    }
    Ok(())
}

/// FNV-1a, to derive a per-tensor seed from its name.
fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Writes only the skeleton of a synthetic checkpoint at `dest`: every header, config.json
/// and index as a real release would have them, tensor data as sparse zeros, no manifest
/// and no hashing. Seconds even for a 14B model, and no disk used: for planning and dry
/// runs (`bake --dry-run`) against the real shapes. `dest` must not exist; the folder
/// appears complete or not at all (written beside it, then renamed).
pub fn write_skeleton(spec: &SynthSpec, dest: &Path) -> Result<OutputPlan, ReleaseError> {
    let plan = synth_plan(spec).map_err(|e| ReleaseError::Produce(e.into()))?;
    let staging = Staging::begin(dest, plan.clone(), &[], Replace::Never, Allocation::Sparse)?;
    staging.commit_unsealed()?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fun_extras_are_written_in_original_names_and_vace_layers_follow_the_blocks_kept() {
        let (layout, params) = synth_names(&WanVariant::FunV11Control1_3B.config());
        assert_eq!(layout, Layout::Wan);
        let names: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
        assert!(names.contains(&"ref_conv.weight") && names.contains(&"head.head.weight"));
        assert_eq!(
            synth_names(&WanVariant::Vace14B.config()).0,
            Layout::Diffusers
        );
        let cut = with_layers(WanVariant::Vace14B.config(), Some(6));
        assert_eq!(cut.vace_layers, Some(vec![0, 5]));
    }
}
