//! The merge engine against independent oracles: PEFT `merge_and_unload` and diffusers
//! `fuse_lora` results (golden/references, from golden/wan_golden.py), the float64 SA3
//! references of golden/sa3 (spec sa3_lora.md formulas, cross-checked there against the
//! spec's §7.3 vectors and real PEFT), and properties whose answer is known by design
//! (strength 0 is the identity, order and thread count do not matter). Refusals assert that
//! nothing is left at the destination.
//!
//! These tests build the adapters' canonical entries by hand from the fixtures' manifests
//! (the PEFT-form `__applied` dicts the reference tools held, the SA3 native keys), so they
//! test the merge math and engine independently of the convention parsers.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use wanbake::adapter::{AdapterError, AdapterSpec, BoundSet, bind_adapter, bind_specs};
use wanbake::adapter::{
    AdapterSet, BaseIndex, Convention, Entry, Kind, ParamRole, ScaleSource, TensorSource,
};
use wanbake::gpu::CudaDevice;
use wanbake::io::{Checkpoint, DType, SafetensorsFile};
use wanbake::layout::OutputDType;
use wanbake::merge::{DoraStrength, MergeOptions, MergeOutcome, Merging, merge_release};
use wanbake::model::base_model::BaseModel;
use wanbake::model::wan_layout::Layout;
use wanbake::pipeline::{Compute, OutputChoices, OutputOptions};
use wanbake::release::staging::Replace;

// ---------------------------------------------------------------------------------------
// Building adapters by hand.

/// An adapter set over one safetensors file.
fn adapter_set(path: &Path, convention: Convention, entries: Vec<Entry>) -> AdapterSet {
    AdapterSet {
        path: path.to_path_buf(),
        convention,
        files: vec![SafetensorsFile::open(path).expect("adapter file")],
        entries,
        unparsed: Vec::new(),
        metadata: BTreeMap::new(),
        sidecars: Vec::new(),
        notes: Vec::new(),
        decoded_from: None,
    }
}

/// A tensor source for `key` of file 0, with its stored shape.
fn source(file: &SafetensorsFile, key: &str) -> TensorSource {
    let view = file.view(key).unwrap_or_else(|| panic!("no key {key}"));
    TensorSource {
        file: 0,
        key: key.to_string(),
        layer: None,
        transpose: false,
        shape: view.shape.to_vec(),
    }
}

fn entry(
    module: &str,
    target: &str,
    kind: Kind,
    params: BTreeMap<ParamRole, TensorSource>,
    scale: f64,
    scale_source: ScaleSource,
) -> Entry {
    let mut e = Entry::new(module, kind);
    e.source_keys = params.values().map(|s| s.key.clone()).collect();
    e.target = Some(target.to_string());
    // The canonical form's shapes: factors on the 2-D view (conv factors flattened),
    // magnitudes 1-D (legacy (72, 1) / (1, 24) squeezed), the rank from A or M.
    let mut params = params;
    for (role, src) in params.iter_mut() {
        let n: usize = src.shape.iter().product();
        src.shape = match role {
            ParamRole::A | ParamRole::B | ParamRole::M => vec![src.shape[0], n / src.shape[0]],
            ParamRole::Magnitude | ParamRole::MagnitudeR | ParamRole::MagnitudeC => vec![n],
            _ => src.shape.clone(),
        };
    }
    e.rank = params
        .get(&ParamRole::A)
        .or(params.get(&ParamRole::M))
        .map(|s| s.shape[0]);
    e.params = params;
    e.scale = scale;
    e.scale_source = scale_source;
    e
}

/// A hand-built adapter before binding: the merge helpers bind it to the base through the
/// library's one binding step (`adapter::bind_adapter`), as `bind_specs` does for files.
struct Unbound {
    set: AdapterSet,
    strength: f64,
    component: usize,
}

fn bound(set: AdapterSet, strength: f64) -> Unbound {
    Unbound {
        set,
        strength,
        component: 0,
    }
}

/// Binds hand-built adapters to `base` (one alias table per component), refusing or
/// allowing unmatched entries as `allow_unmatched` (the merge options') says.
fn bind_all(
    base: &BaseModel,
    adapters: Vec<Unbound>,
    allow_unmatched: bool,
) -> Result<BoundSet, AdapterError> {
    adapters
        .into_iter()
        .map(|u| {
            let comp = &base.components[u.component];
            let index = BaseIndex::new(
                &base.path.join(&comp.rel_dir),
                &comp.tensors,
                base.model(u.component),
            );
            bind_adapter(
                u.set,
                u.component,
                &index,
                u.strength,
                "hand-built",
                allow_unmatched,
            )
        })
        .collect()
}

/// How a test merges and writes: both halves of the options.
#[derive(Clone, Debug)]
struct Opts {
    merge: MergeOptions,
    output: OutputOptions,
}

/// Options with `dtype` and every other choice at its default, the output half through the
/// one builder the CLI and recipes use.
fn options(dtype: OutputDType) -> Opts {
    Opts {
        merge: MergeOptions::default(),
        output: OutputOptions::new(OutputChoices {
            dtype,
            ..OutputChoices::default()
        })
        .unwrap(),
    }
}

/// A merge's error, whichever stage refused.
type Failure = Box<dyn std::error::Error>;

/// The PEFT-form dict a reference tool held (`golden/references/<case>__applied`): per
/// module `lora_A.weight`, `lora_B.weight`, optional `lora_B.bias` and
/// `lora_magnitude_vector`, with PEFT's scaling per module in the metadata.
fn applied_set(applied: &Path) -> AdapterSet {
    let file = SafetensorsFile::open(applied).unwrap();
    let md = file.metadata().clone();
    let scaling: BTreeMap<String, f64> = serde_json::from_str(&md["scaling"]).unwrap();
    let skipped: Vec<String> = md
        .get("meta_skipped")
        .map(|s| serde_json::from_str(s).unwrap())
        .unwrap_or_default();
    let mut entries = Vec::new();
    for (module, &s) in &scaling {
        let key = |suffix: &str| format!("{module}.{suffix}");
        let has = |k: &str| file.view(k).is_some() && !skipped.contains(&k.to_string());
        let src = ScaleSource::PeftConfig { rslora: false };
        if has(&key("lora_A.weight")) {
            let mut p = BTreeMap::from([
                (ParamRole::A, source(&file, &key("lora_A.weight"))),
                (ParamRole::B, source(&file, &key("lora_B.weight"))),
            ]);
            let kind = if has(&key("lora_magnitude_vector")) {
                p.insert(
                    ParamRole::Magnitude,
                    source(&file, &key("lora_magnitude_vector")),
                );
                Kind::PeftDora
            } else {
                Kind::Lora
            };
            entries.push(entry(module, &key("weight"), kind, p, s, src.clone()));
        }
        if has(&key("lora_B.bias")) {
            let p = BTreeMap::from([(ParamRole::LoraBias, source(&file, &key("lora_B.bias")))]);
            entries.push(entry(module, &key("bias"), Kind::LoraBias, p, s, src));
        }
    }
    drop(file);
    adapter_set(applied, Convention::Peft, entries)
}

fn repo(rel: &str) -> PathBuf {
    common::repo().join(rel)
}

fn golden_manifest() -> Value {
    let text = std::fs::read_to_string(repo("golden/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sa3_manifest() -> Value {
    let text = std::fs::read_to_string(repo("golden/sa3/manifest.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sa3_kind(t: &str) -> Kind {
    match t {
        "lora" => Kind::Lora,
        "dora-rows" => Kind::DoraRows,
        "dora-cols" => Kind::DoraCols,
        "bora" => Kind::Bora,
        "lora-xs" => Kind::LoraXs,
        "dora-rows-xs" => Kind::DoraRowsXs,
        "dora-cols-xs" => Kind::DoraColsXs,
        "bora-xs" => Kind::BoraXs,
        other => panic!("unknown SA3 type {other}"),
    }
}

/// An SA3 native adapter (`<layer>.parametrizations.weight.0.<param>`) with the targets,
/// resolved type and scaling the fixture's manifest records. `rename` maps base names
/// (for the MLX-converted base).
fn sa3_set(case: &str, rename: &dyn Fn(&str) -> String) -> AdapterSet {
    let m = sa3_manifest();
    let c = &m["cases"][case];
    let path = repo(&format!("golden/sa3/{}", c["adapter"].as_str().unwrap()));
    let kind = sa3_kind(c["adapter_type_resolved"].as_str().unwrap());
    let scale = c["scaling"].as_f64().unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    let mut entries = Vec::new();
    for (layer, target) in c["targets"].as_object().unwrap() {
        let mut p = BTreeMap::new();
        for role in kind.roles() {
            let name = match role {
                ParamRole::A => "lora_A",
                ParamRole::B => "lora_B",
                ParamRole::M => "M_xs",
                ParamRole::Magnitude => "magnitude",
                ParamRole::MagnitudeR => "magnitude_r",
                ParamRole::MagnitudeC => "magnitude_c",
                _ => unreachable!(),
            };
            let key = format!("{layer}.parametrizations.weight.0.{name}");
            p.insert(*role, source(&file, &key));
        }
        let target = rename(target.as_str().unwrap());
        entries.push(entry(
            layer,
            &target,
            kind,
            p,
            scale,
            ScaleSource::Sa3Metadata,
        ));
    }
    drop(file);
    adapter_set(&path, Convention::Sa3, entries)
}

fn same(name: &str) -> String {
    name.to_string()
}

// ---------------------------------------------------------------------------------------
// Running and reading back.

fn merge(
    base: &Path,
    adapters: Vec<Unbound>,
    options: &Opts,
    dest: &Path,
) -> Result<MergeOutcome, Failure> {
    merge_on(base, adapters, options, dest, &Compute::Cpu)
}

/// [`merge`] with the targets computed on `compute`.
fn merge_on(
    base: &Path,
    adapters: Vec<Unbound>,
    options: &Opts,
    dest: &Path,
    compute: &Compute,
) -> Result<MergeOutcome, Failure> {
    let adapters = bind_all(
        &wanbake::quant::base::open(base).unwrap(),
        adapters,
        options.merge.allow_unmatched,
    )?;
    merge_bound(base, &adapters, options, dest, compute)
}

/// [`merge_on`] of adapters already bound (by `bind_specs`, as the command line binds).
fn merge_bound(
    base: &Path,
    adapters: &BoundSet,
    options: &Opts,
    dest: &Path,
    compute: &Compute,
) -> Result<MergeOutcome, Failure> {
    let base = wanbake::quant::base::open(base).unwrap();
    let merging = Merging {
        options: options.merge,
        compute,
        svd_cache: None,
    };
    let out = merge_release(
        &base,
        adapters,
        &options.output,
        &merging,
        dest,
        Replace::Never,
    )?;
    assert_eq!(out.report.device.used, compute.label());
    Ok(out)
}

/// Every route a merge can compute on here: the CPU band path, the whole-tensor program of
/// the CUDA route on the CPU reference backend, and CUDA itself when a device opens (left out
/// with a message otherwise). Each route is held to the same oracles.
fn routes() -> Vec<Compute> {
    static CUDA: OnceLock<Option<CudaDevice>> = OnceLock::new();
    let cuda = CUDA.get_or_init(|| {
        CudaDevice::open(0)
            .map_err(|e| eprintln!("no CUDA route in these tests: {e}"))
            .ok()
    });
    let mut routes = vec![Compute::Cpu, Compute::Reference];
    routes.extend(cuda.clone().map(Compute::Cuda));
    routes
}

/// A tensor as f64 (F64, F32, F16, BF16).
fn tensor_f64(file: &SafetensorsFile, name: &str) -> Vec<f64> {
    let v = file
        .view(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    match v.dtype {
        DType::F64 => v
            .bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => v.to_f32().unwrap().into_iter().map(f64::from).collect(),
    }
}

/// Every tensor of an output folder, by name (single-component outputs).
fn output_tensors(dir: &Path, component: &str) -> BTreeMap<String, (DType, Vec<usize>, Vec<u8>)> {
    let ck = Checkpoint::open_stored(dir).unwrap();
    let comp = ck
        .components
        .iter()
        .find(|c| c.name == component)
        .unwrap_or_else(|| panic!("no component `{component}`"));
    comp.tensors
        .tensors()
        .map(|t| {
            let v = t.view;
            (
                v.name.to_string(),
                (v.dtype, v.shape.to_vec(), v.bytes.to_vec()),
            )
        })
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bf16s(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Round to nearest even bf16 of an f64 (exact: through the f64 bits).
fn bf16_of(x: f64) -> u16 {
    let f = x as f32; // the references are f32 values, or f64 compared at bf16 precision
    wanbake::codec::dtype::round_to_bf16(f)
}

/// Distance in bf16 units in the last place, across zero too.
fn bf16_ulps(a: u16, b: u16) -> u32 {
    let ordered = |x: u16| -> i32 {
        if x & 0x8000 != 0 {
            -((x & 0x7fff) as i32)
        } else {
            x as i32
        }
    };
    (ordered(a) - ordered(b)).unsigned_abs()
}

/// Largest |got − ref| / max|ref| over a tensor.
fn rel_err(got: &[f32], reference: &[f64]) -> f64 {
    let scale = reference
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(f64::MIN_POSITIVE);
    got.iter()
        .zip(reference)
        .map(|(&g, &r)| (f64::from(g) - r).abs())
        .fold(0.0, f64::max)
        / scale
}

fn max_abs_err(got: &[f32], reference: &[f64]) -> f64 {
    got.iter()
        .zip(reference)
        .map(|(&g, &r)| (f64::from(g) - r).abs())
        .fold(0.0, f64::max)
}

/// Compares a merge of `base` (f32 output and bf16 output) with the reference file:
/// targeted tensors within `4·ε_f32·max|ref|` (golden/README.md) and one bf16 ulp; every
/// other tensor bit-identical to the base (f32) or its RNE narrowing (bf16). Returns the
/// worst relative error.
fn check_against_reference(
    base: &Path,
    component: &str,
    make: &dyn Fn() -> Vec<Unbound>,
    options_f32: &Opts,
    reference: &Path,
    what: &str,
) -> f64 {
    let tmp = common::tmp();
    let reference = SafetensorsFile::open(reference).unwrap();
    let base_ck = Checkpoint::open_stored(base).unwrap();
    let base_comp = base_ck
        .components
        .iter()
        .find(|c| c.name == component)
        .unwrap();
    let mut worst = 0.0f64;
    let mut bf16_by_route = Vec::new();
    for (compute, dtype) in routes()
        .into_iter()
        .flat_map(|c| [(c.clone(), OutputDType::F32), (c, OutputDType::BF16)])
    {
        let what = format!("{what} on {}", compute.label());
        let dest = tmp.path().join(format!("{}-{dtype:?}", compute.label()));
        let mut o = options_f32.clone();
        o.output.dtype = dtype;
        o.output.keep_f32 = Some(wanbake::layout::KeepF32::None);
        merge_on(base, make(), &o, &dest, &compute).unwrap_or_else(|e| panic!("{what}: {e}"));
        let out = output_tensors(&dest, component);
        if dtype == OutputDType::BF16 {
            bf16_by_route.push((compute.label(), out.clone()));
        }
        for t in base_comp.tensors.tensors() {
            let name = t.view.name;
            let (odt, shape, bytes) = &out[name];
            assert_eq!(shape.as_slice(), t.view.shape, "{what}: {name} shape");
            let expected: Vec<f64> = match reference.view(name) {
                Some(_) => tensor_f64(&reference, name),
                None => t
                    .view
                    .to_f32()
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            };
            match dtype {
                OutputDType::F32 => {
                    assert_eq!(*odt, DType::F32);
                    let got = f32s(bytes);
                    if reference.view(name).is_none() {
                        assert_eq!(bytes.as_slice(), t.view.bytes, "{what}: untouched {name}");
                        continue;
                    }
                    let e = rel_err(&got, &expected);
                    assert!(
                        e <= 4.0 * f64::from(f32::EPSILON),
                        "{what}: {name}: relative error {e:e}"
                    );
                    worst = worst.max(e);
                }
                _ => {
                    assert_eq!(*odt, DType::BF16);
                    for (i, (&g, &r)) in bf16s(bytes).iter().zip(&expected).enumerate() {
                        let d = bf16_ulps(g, bf16_of(r));
                        assert!(
                            d <= 1,
                            "{what}: {name}[{i}]: {d} bf16 ulps from the reference"
                        );
                    }
                }
            }
        }
    }
    routes_agree_within_one_bf16_ulp(&bf16_by_route, what);
    worst
}

type Outputs = BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>;

/// The bf16 outputs of every route against the CPU band path's: at most one ulp apart per
/// element (the routes sum contributions in different orders; see `merge::device`).
fn routes_agree_within_one_bf16_ulp(outputs: &[(&str, Outputs)], what: &str) {
    let Some(((_, cpu), others)) = outputs.split_first() else {
        return;
    };
    for (route, out) in others {
        let (mut differ, mut total) = (0usize, 0usize);
        for (name, (dtype, _, bytes)) in out {
            let theirs = &cpu[name].2;
            if *dtype != DType::BF16 {
                assert_eq!(bytes, theirs, "{what}: {route}: {name}");
                continue;
            }
            for (i, (&a, &b)) in bf16s(bytes).iter().zip(&bf16s(theirs)).enumerate() {
                let d = bf16_ulps(a, b);
                assert!(
                    d <= 1,
                    "{what}: {route} vs cpu: {name}[{i}] {d} bf16 ulps apart"
                );
                differ += usize::from(d == 1);
                total += 1;
            }
        }
        eprintln!("{what}: {route} vs cpu: {differ} of {total} bf16 elements one ulp apart");
    }
}

// ---------------------------------------------------------------------------------------
// WAN: PEFT merge_and_unload and diffusers fuse_lora.

fn wan_case(case: &str, strength_key: &str, strength: f64, mode: DoraStrength) {
    let m = golden_manifest();
    let c = &m["cases"][case];
    let base = repo(c["base"].as_str().unwrap());
    let applied = repo(c["applied"].as_str().unwrap());
    let reference = repo(c["strengths"][strength_key]["reference"].as_str().unwrap());
    let mut o = options(OutputDType::F32);
    o.merge.dora_strength = mode;
    let make = || vec![bound(applied_set(&applied), strength)];
    let e = check_against_reference(&base, "", &make, &o, &reference, case);
    eprintln!("{case} @ {strength} ({mode:?}): worst relative error {e:.3e}");
}

#[test]
fn peft_lora_matches_merge_and_unload() {
    wan_case("peft_plain", "1", 1.0, DoraStrength::Merge);
    wan_case("peft_plain", "0.5", 0.5, DoraStrength::Merge);
}

#[test]
fn peft_rslora_rank_alpha_patterns_and_conv3d_match_merge_and_unload() {
    wan_case("peft_rslora_pattern", "1", 1.0, DoraStrength::Merge);
}

#[test]
fn peft_dora_matches_merge_and_unload_with_strength_inside_the_norm() {
    wan_case("peft_dora", "1", 1.0, DoraStrength::Merge);
    wan_case("peft_dora", "1", 1.0, DoraStrength::Peft);
    // PEFT's strength 0.5 (scale_layer) sits inside the norm: only the peft mode is PEFT.
    wan_case("peft_dora", "0.5", 0.5, DoraStrength::Peft);
}

#[test]
fn peft_lora_bias_and_i2v_modules_match_merge_and_unload() {
    wan_case("peft_bias", "1", 1.0, DoraStrength::Merge);
    wan_case("peft_i2v", "1", 1.0, DoraStrength::Merge);
}

#[test]
fn diffusers_comfy_and_kohya_files_match_fuse_lora() {
    wan_case("diffusers_lora", "1", 1.0, DoraStrength::Merge);
    wan_case("diffusers_lora_nometa", "1", 1.0, DoraStrength::Merge);
    wan_case("kohya_lora", "1", 1.0, DoraStrength::Merge);
    wan_case("comfy_lora", "1", 1.0, DoraStrength::Merge);
    wan_case("comfy_lora", "0.5", 0.5, DoraStrength::Merge);
}

#[test]
fn a14b_experts_each_get_their_own_adapter() {
    let m = golden_manifest();
    let c = &m["cases"]["a14b_pair"];
    let base = repo(c["base"].as_str().unwrap());
    let tmp = common::tmp();
    let dest = tmp.path().join("out");
    let make = || {
        ["transformer", "transformer_2"]
            .iter()
            .enumerate()
            .map(|(i, expert)| {
                let applied = repo(c["experts"][expert]["applied"].as_str().unwrap());
                let mut b = bound(applied_set(&applied), 1.0);
                b.component = i;
                b
            })
            .collect::<Vec<_>>()
    };
    merge(&base, make(), &options(OutputDType::F32), &dest).unwrap();
    let listing = common::tree(&dest);
    for f in [
        "model_index.json",
        "transformer/config.json",
        "transformer_2/config.json",
    ] {
        assert!(listing.contains(&f.to_string()), "{f} missing: {listing:?}");
    }
    for expert in ["transformer", "transformer_2"] {
        let reference =
            SafetensorsFile::open(&repo(c["experts"][expert]["reference"].as_str().unwrap()))
                .unwrap();
        let out = output_tensors(&dest, expert);
        for t in reference.infos() {
            let got = f32s(&out[&t.name].2);
            let e = rel_err(&got, &tensor_f64(&reference, &t.name));
            assert!(
                e <= 4.0 * f64::from(f32::EPSILON),
                "{expert}/{}: {e:e}",
                t.name
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// SA3: the nine type names on the SA3 base (fused to_qkv, k = 3 Conv1d, conditioner).

fn sa3_base() -> PathBuf {
    repo("golden/sa3/base/model.safetensors")
}

/// Merges (case, strength) pairs into the SA3 base in f32 and compares every reference
/// tensor; returns the worst absolute error.
fn sa3_check(adapters: &[(&str, f64)], reference: &str, tol: f64) -> f64 {
    let tmp = common::tmp();
    let reference_file = SafetensorsFile::open(&repo(&format!("golden/sa3/{reference}"))).unwrap();
    let base = SafetensorsFile::open(&sa3_base()).unwrap();
    let mut worst = 0.0f64;
    for compute in routes() {
        let dest = tmp.path().join(compute.label());
        let bound_all = adapters
            .iter()
            .map(|(case, a)| bound(sa3_set(case, &same), *a))
            .collect();
        merge_on(
            &sa3_base(),
            bound_all,
            &options(OutputDType::F32),
            &dest,
            &compute,
        )
        .unwrap();
        let out = output_tensors(&dest, "");
        worst = worst.max(sa3_compare(&base, &out, &reference_file, tol));
    }
    worst
}

/// The worst absolute error of `out` against the SA3 reference (untouched tensors must be
/// the base's bytes).
fn sa3_compare(
    base: &SafetensorsFile,
    out: &Outputs,
    reference: &SafetensorsFile,
    tol: f64,
) -> f64 {
    let mut worst = 0.0f64;
    for t in base.infos() {
        let (_, _, bytes) = &out[&t.name];
        if reference.view(&t.name).is_none() {
            assert_eq!(
                bytes.as_slice(),
                base.view(&t.name).unwrap().bytes,
                "untouched {}",
                t.name
            );
            continue;
        }
        let e = max_abs_err(&f32s(bytes), &tensor_f64(reference, &t.name));
        assert!(e <= tol, "{}: max abs error {e:e} > {tol:e}", t.name);
        worst = worst.max(e);
    }
    worst
}

#[test]
fn sa3_all_nine_type_names_match_float64_references() {
    let m = sa3_manifest();
    for (case, c) in m["cases"].as_object().unwrap() {
        if c["format"] != "sa3-native"
            || c.get("adapters").is_some()
            || case.starts_with("strength")
        {
            continue;
        }
        let xs = case.ends_with("-xs");
        // README: a few f32 ulps of |W| (~1e-6) for the closed forms; the -xs bases come
        // from an SVD and move by ~1e-6, so 1e-5 there.
        let tol = if xs { 1e-5 } else { 1e-6 };
        let reference = c["reference"].as_str().unwrap();
        let e = sa3_check(&[(case, 1.0)], reference, tol);
        eprintln!("sa3 {case}: max abs error {e:.3e}");
    }
}

#[test]
fn sa3_application_weight_and_two_adapter_sum_match_references() {
    let e = sa3_check(
        &[("dora-rows", 0.5)],
        "references/strength0.5_dora-rows.safetensors",
        1e-6,
    );
    eprintln!("sa3 dora-rows @0.5: {e:.3e}");
    let e = sa3_check(
        &[("lora", 0.25), ("dora-rows", 0.75)],
        "references/two_adapter.safetensors",
        1e-6,
    );
    eprintln!("sa3 two adapters: {e:.3e}");
}

#[test]
fn sa3_peft_lora_and_dora_match_merge_and_unload() {
    let m = sa3_manifest();
    for case in ["peft_lora", "peft_dora"] {
        let c = &m["cases"][case];
        let path = repo(&format!("golden/sa3/{}", c["adapter"].as_str().unwrap()));
        let file = SafetensorsFile::open(&path).unwrap();
        let mut modules: Vec<String> = file
            .infos()
            .iter()
            .filter_map(|t| t.name.strip_suffix(".lora_A.weight").map(str::to_string))
            .collect();
        modules.sort();
        let entries = modules
            .iter()
            .map(|m| {
                let module = m.strip_prefix("base_model.model.").unwrap();
                let mut p = BTreeMap::from([
                    (ParamRole::A, source(&file, &format!("{m}.lora_A.weight"))),
                    (ParamRole::B, source(&file, &format!("{m}.lora_B.weight"))),
                ]);
                let kind = if case == "peft_dora" {
                    p.insert(
                        ParamRole::Magnitude,
                        source(&file, &format!("{m}.lora_magnitude_vector")),
                    );
                    Kind::PeftDora
                } else {
                    Kind::Lora
                };
                let target = format!("model.model.{module}.weight");
                entry(
                    module,
                    &target,
                    kind,
                    p,
                    2.0,
                    ScaleSource::PeftConfig { rslora: false },
                )
            })
            .collect();
        drop(file);
        let tmp = common::tmp();
        let dest = tmp.path().join("out");
        let set = adapter_set(&path, Convention::Peft, entries);
        merge(
            &sa3_base(),
            vec![bound(set, 1.0)],
            &options(OutputDType::F32),
            &dest,
        )
        .unwrap();
        let out = output_tensors(&dest, "");
        let reference = SafetensorsFile::open(&repo(&format!(
            "golden/sa3/{}",
            c["reference"].as_str().unwrap()
        )))
        .unwrap();
        let mut worst = 0.0f64;
        for t in reference.infos() {
            let e = max_abs_err(&f32s(&out[&t.name].2), &tensor_f64(&reference, &t.name));
            assert!(e <= 1e-6, "{case} {}: {e:e}", t.name);
            worst = worst.max(e);
        }
        eprintln!("sa3 {case}: max abs error {worst:.3e}");
    }
}

/// The SA3 base as an MLX conversion stores it (spec sa3_lora.md §4.4–§4.5): no
/// `model.model.` prefix, Conv1d weights (out, k, in), the conditioner baked in as
/// `cond.seconds_total_weight`.
fn mlx_base(dir: &Path) -> PathBuf {
    let base = SafetensorsFile::open(&sa3_base()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for t in base.infos() {
        let mut vals = base.read_f32(&t.name).unwrap();
        let mut shape = t.shape.clone();
        if let [o, i, k] = shape[..] {
            let mut p = vec![0.0f32; vals.len()];
            for a in 0..o {
                for b in 0..i {
                    for c in 0..k {
                        p[(a * k + c) * i + b] = vals[(a * i + b) * k + c];
                    }
                }
            }
            vals = p;
            shape = vec![o, k, i];
        }
        tensors.push((mlx_name(&t.name), shape, vals));
    }
    let path = dir.join("dit_mlx.safetensors");
    let refs: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.as_str(), s.clone(), v.clone()))
        .collect();
    common::write_f32(&path, &refs);
    path
}

fn mlx_name(torch: &str) -> String {
    if let Some(rest) =
        torch.strip_prefix("conditioner.conditioners.seconds_total.embedder.embedding.1.")
    {
        return format!("cond.seconds_total_{rest}");
    }
    torch
        .strip_prefix("model.model.")
        .unwrap_or(torch)
        .to_string()
}

#[test]
fn mlx_conv1d_layout_is_merged_in_pytorch_order_and_written_back() {
    let tmp = common::tmp();
    let base = mlx_base(tmp.path());
    let runs = routes()
        .into_iter()
        .flat_map(|c| [("lora", c.clone()), ("bora-xs", c)]);
    for (case, compute) in runs {
        let dest = tmp.path().join(format!("out-{case}-{}", compute.label()));
        let set = sa3_set(case, &mlx_name);
        merge_on(
            &base,
            vec![bound(set, 1.0)],
            &options(OutputDType::F32),
            &dest,
            &compute,
        )
        .unwrap();
        let out = output_tensors(&dest, "");
        let reference =
            SafetensorsFile::open(&repo(&format!("golden/sa3/references/{case}.safetensors")))
                .unwrap();
        let name = "preprocess_conv.weight";
        let (_, shape, bytes) = &out[name];
        assert_eq!(shape, &vec![8, 3, 8], "stays (out, k, in)");
        let got = f32s(bytes);
        let want = tensor_f64(&reference, "model.model.preprocess_conv.weight");
        // reference (8, 8, 3) torch order; output (8, 3, 8) MLX order.
        let tol = if case.ends_with("-xs") { 1e-5 } else { 1e-6 };
        for o in 0..8 {
            for i in 0..8 {
                for k in 0..3 {
                    let g = f64::from(got[(o * 3 + k) * 8 + i]);
                    let w = want[(o * 8 + i) * 3 + k];
                    assert!((g - w).abs() <= tol, "{case} [{o},{i},{k}]: {g} vs {w}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Properties.

fn weight_bytes(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    output_tensors(dir, "")
        .into_iter()
        .map(|(n, (_, _, b))| (n, b))
        .collect()
}

#[test]
fn strength_zero_gives_back_the_input_bytes() {
    let tmp = common::tmp();
    let dest = tmp.path().join("out");
    let adapters = vec![
        bound(sa3_set("bora", &same), 0.0),
        bound(sa3_set("lora-xs", &same), -0.0),
    ];
    let out = merge(&sa3_base(), adapters, &options(OutputDType::Keep), &dest).unwrap();
    let base = SafetensorsFile::open(&sa3_base()).unwrap();
    let got = weight_bytes(&dest);
    assert_eq!(got.len(), base.infos().len());
    for t in base.infos() {
        assert_eq!(
            got[&t.name],
            base.view(&t.name).unwrap().bytes,
            "{}",
            t.name
        );
    }
    assert_eq!(out.report.targets_merged, 0);
    assert!(out.report.adapters.iter().all(|a| a.skipped));
}

#[test]
fn adapter_order_does_not_change_a_byte() {
    let tmp = common::tmp();
    let cases = [("lora", 0.3), ("dora-cols", 0.7), ("bora-xs", -0.4)];
    let mut results = Vec::new();
    for (n, order) in [[0, 1, 2], [2, 0, 1], [1, 2, 0]].iter().enumerate() {
        let dest = tmp.path().join(format!("out{n}"));
        let adapters = order
            .iter()
            .map(|&i| bound(sa3_set(cases[i].0, &same), cases[i].1))
            .collect();
        merge(&sa3_base(), adapters, &options(OutputDType::BF16), &dest).unwrap();
        results.push(weight_bytes(&dest));
    }
    assert_eq!(results[0], results[1]);
    assert_eq!(results[0], results[2]);
}

#[test]
fn one_or_many_threads_give_the_same_bytes() {
    for compute in routes() {
        one_or_many_threads_on(&compute);
    }
}

fn one_or_many_threads_on(compute: &Compute) {
    let tmp = common::tmp();
    let mut results = Vec::new();
    for threads in [1, 3] {
        let dest = tmp.path().join(format!("t{threads}"));
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let adapters = vec![
                bound(sa3_set("dora-rows-xs", &same), 0.8),
                bound(sa3_set("bora", &same), 1.0),
            ];
            merge_on(
                &sa3_base(),
                adapters,
                &options(OutputDType::BF16),
                &dest,
                compute,
            )
            .unwrap();
        });
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(dest.join("wanbake.manifest.json")).unwrap())
                .unwrap();
        results.push(manifest["files"].clone());
    }
    assert_eq!(results[0], results[1], "{}", compute.label());
}

// ---------------------------------------------------------------------------------------
// Refusals: nothing is written.

#[track_caller]
fn assert_nothing_written(tmp: &Path) {
    let left: Vec<String> = common::tree(tmp)
        .into_iter()
        .filter(|p| !p.starts_with("inputs"))
        .collect();
    assert!(left.is_empty(), "output left behind: {left:?}");
}

fn refused(tmp: &Path, adapters: Vec<Unbound>, o: &Opts) -> String {
    let dest = tmp.join("out");
    match merge(&sa3_base(), adapters, o, &dest) {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => {
            assert_nothing_written(tmp);
            wanbake::error_text::chain(e.as_ref())
        }
    }
}

fn write_adapter(tmp: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> PathBuf {
    let dir = tmp.join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("a{}.safetensors", tensors.len()));
    common::write_f32(&path, tensors);
    path
}

/// A one-entry adapter whose module is `target`'s module (binding resolves it).
fn lora_on(path: &Path, target: &str, kind: Kind) -> AdapterSet {
    let module = target.strip_suffix(".weight").unwrap_or(target);
    lora_module_on(path, module, target, kind)
}

fn lora_module_on(path: &Path, module: &str, target: &str, kind: Kind) -> AdapterSet {
    let file = SafetensorsFile::open(path).unwrap();
    let mut p = BTreeMap::new();
    for t in file.infos() {
        let role = match t.name.as_str() {
            "A" => ParamRole::A,
            "B" => ParamRole::B,
            "m" => ParamRole::Magnitude,
            _ => continue,
        };
        p.insert(role, source(&file, &t.name));
    }
    drop(file);
    let e = entry(
        module,
        target,
        kind,
        p,
        1.0,
        ScaleSource::DefaultAlphaIsRank,
    );
    adapter_set(path, Convention::Comfy, vec![e])
}

const QKV: &str = "model.model.transformer.layers.0.self_attn.to_qkv.weight";

#[test]
fn refuses_shape_mismatch_naming_target_both_shapes_and_the_variant() {
    let tmp = common::tmp();
    // An adapter for the real SA3 small to_qkv (3072, 1024) on the tiny base (72, 24).
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 1024], vec![0.0; 1024]),
            ("B", vec![3072, 1], vec![0.0; 3072]),
        ],
    );
    let module = "model.transformer.layers.0.self_attn.to_qkv";
    let mut set = lora_module_on(&a, module, QKV, Kind::Lora);
    set.convention = Convention::Sa3;
    let msg = refused(
        tmp.path(),
        vec![bound(set, 1.0)],
        &options(OutputDType::F32),
    );
    for needle in [QKV, "[3072, 1]", "[72, 24]", "[72, 1]", "small"] {
        assert!(msg.contains(needle), "`{needle}` missing from: {msg}");
    }
}

#[test]
fn refuses_non_finite_adapter_values() {
    let tmp = common::tmp();
    let mut b = vec![0.1f32; 72];
    b[5] = f32::NAN;
    let a = write_adapter(
        tmp.path(),
        &[("A", vec![1, 24], vec![0.1; 24]), ("B", vec![72, 1], b)],
    );
    let msg = refused(
        tmp.path(),
        vec![bound(lora_on(&a, QKV, Kind::Lora), 1.0)],
        &options(OutputDType::F32),
    );
    assert!(msg.contains("B: element 5 is NaN"), "{msg}");
}

#[test]
fn strength_zero_skips_even_a_broken_adapter() {
    let tmp = common::tmp();
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 24], vec![f32::INFINITY; 24]),
            ("B", vec![72, 1], vec![0.1; 72]),
        ],
    );
    let dest = tmp.path().join("out");
    merge(
        &sa3_base(),
        vec![bound(lora_on(&a, QKV, Kind::Lora), 0.0)],
        &options(OutputDType::Keep),
        &dest,
    )
    .unwrap();
    let base = SafetensorsFile::open(&sa3_base()).unwrap();
    assert_eq!(weight_bytes(&dest)[QKV], base.view(QKV).unwrap().bytes);
}

#[test]
fn refuses_missing_parameters_for_a_kind() {
    let tmp = common::tmp();
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 24], vec![0.1; 24]),
            ("B", vec![72, 1], vec![0.1; 72]),
        ],
    );
    let msg = refused(
        tmp.path(),
        vec![bound(lora_on(&a, QKV, Kind::DoraRows), 1.0)],
        &options(OutputDType::F32),
    );
    assert!(msg.contains("lacks Magnitude"), "{msg}");
}

#[test]
fn refuses_unmatched_keys_unless_allowed_and_reports_them() {
    let tmp = common::tmp();
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 24], vec![0.1; 24]),
            ("B", vec![72, 1], vec![0.1; 72]),
        ],
    );
    // A second entry whose module the base does not have: binding finds it unmatched.
    let make = || {
        let mut set = lora_on(&a, QKV, Kind::Lora);
        let mut stray = set.entries[0].clone();
        stray.module = "lora_unet_foo".into();
        stray.source_keys = vec!["lora_unet_foo.lora_down.weight".into()];
        set.entries.push(stray);
        bound(set, 1.0)
    };
    let msg = refused(tmp.path(), vec![make()], &options(OutputDType::F32));
    assert!(
        // The way out (`--allow-unmatched`, `allow_unmatched = true`) is the front end's hint.
        msg.contains("lora_unet_foo.lora_down.weight")
            && msg.contains("1 entry binds to no tensor"),
        "{msg}"
    );
    let mut o = options(OutputDType::F32);
    o.merge.allow_unmatched = true;
    let out = merge(&sa3_base(), vec![make()], &o, &tmp.path().join("out")).unwrap();
    assert_eq!(
        out.report.adapters[0].unmatched_allowed,
        vec!["lora_unet_foo.lora_down.weight".to_string()]
    );
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("out/wanbake.manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        manifest["report"]["adapters"][0]["unmatched_allowed"][0],
        "lora_unet_foo.lora_down.weight"
    );
}

#[test]
fn refuses_an_adapter_that_binds_nothing() {
    let tmp = common::tmp();
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 24], vec![0.1; 24]),
            ("B", vec![72, 1], vec![0.1; 72]),
        ],
    );
    // Refused even when unmatched keys are allowed: an adapter must change something.
    let set = lora_module_on(&a, "nothing.here", QKV, Kind::Lora);
    let mut o = options(OutputDType::F32);
    o.merge.allow_unmatched = true;
    let msg = refused(tmp.path(), vec![bound(set, 1.0)], &o);
    assert!(msg.contains("binds to none of the"), "{msg}");
}

#[test]
fn non_finite_merged_result_discards_the_output_and_names_the_tensor() {
    let tmp = common::tmp();
    // Finite factors whose product overflows f32.
    let a = write_adapter(
        tmp.path(),
        &[
            ("A", vec![1, 24], vec![3e38; 24]),
            ("B", vec![72, 1], vec![3e38; 72]),
        ],
    );
    let msg = refused(
        tmp.path(),
        vec![bound(lora_on(&a, QKV, Kind::Lora), 1.0)],
        &options(OutputDType::F32),
    );
    assert!(msg.contains(QKV) && msg.contains("non-finite"), "{msg}");
}

#[test]
fn refuses_xs_rank_above_the_smaller_dimension() {
    let tmp = common::tmp();
    let a = write_adapter(tmp.path(), &[("M", vec![13, 13], vec![0.0; 169])]);
    let file = SafetensorsFile::open(&a).unwrap();
    let p = BTreeMap::from([(ParamRole::M, source(&file, "M"))]);
    drop(file);
    let target = "conditioner.conditioners.seconds_total.embedder.embedding.1.weight"; // (12, 16)
    let module = target.trim_end_matches(".weight");
    let e = entry(
        module,
        target,
        Kind::LoraXs,
        p,
        1.0,
        ScaleSource::Sa3Metadata,
    );
    let set = adapter_set(&a, Convention::Sa3, vec![e]);
    let msg = refused(
        tmp.path(),
        vec![bound(set, 1.0)],
        &options(OutputDType::F32),
    );
    assert!(msg.contains("rank 13") && msg.contains("= 12"), "{msg}");
}

// ---------------------------------------------------------------------------------------
// Through the binary: real parsing and binding, every convention, every refusal.

/// Runs `wanbake merge ARGS` in `cwd`.
fn wanbake(cwd: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["merge"];
    all.extend_from_slice(args);
    common::parts(&common::run(cwd, &all))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The adapter argument of a golden case: the PEFT folder, else the file.
fn case_adapter(files: &Value) -> String {
    let files: Vec<&str> = files
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let first = repo(files[0]);
    if files.iter().any(|f| f.ends_with("adapter_config.json")) {
        s(first.parent().unwrap())
    } else {
        s(&first)
    }
}

/// Expected merged values of a golden WAN case at one strength: the reference tool's
/// output, with the hand derivation (ComfyUI semantics, float64) for every target the
/// tool dropped, or for everything when the tool refused the file (golden/README.md).
fn expected_values(case: &Value, strength: &str) -> BTreeMap<String, Vec<f64>> {
    let st = &case["strengths"][strength];
    let mut out = BTreeMap::new();
    if let Some(r) = st["reference"].as_str() {
        let f = SafetensorsFile::open(&repo(r)).unwrap();
        for t in f.infos() {
            out.insert(t.name.clone(), tensor_f64(&f, &t.name));
        }
    }
    if let Some(h) = st["handderived"].as_str() {
        let f = SafetensorsFile::open(&repo(h)).unwrap();
        let dropped: Vec<&str> = case["dropped_by_reference"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["target"].as_str().unwrap())
            .collect();
        for t in f.infos() {
            if st["reference"].is_null() || dropped.contains(&t.name.as_str()) {
                out.insert(t.name.clone(), tensor_f64(&f, &t.name));
            }
        }
    }
    out
}

/// Runs the binary on a golden WAN case (f32 and bf16) and checks every tensor: merged
/// ones within 4·ε_f32·max|ref| (f32) and one bf16 ulp (bf16), the rest bit-identical to
/// the base (f32) or its RNE narrowing (bf16).
fn cli_wan_case(case_name: &str, strength: &str, extra: &[&str]) -> f64 {
    let m = golden_manifest();
    let c = &m["cases"][case_name];
    let base = repo(c["base"].as_str().unwrap());
    let adapter = format!("{}:{strength}", case_adapter(&c["adapter"]));
    let expected = expected_values(c, strength);
    assert!(!expected.is_empty(), "{case_name}: no expected values");
    let tmp = common::tmp();
    let base_ck = Checkpoint::open_stored(&base).unwrap();
    let base_comp = base_ck.single().unwrap();
    let mut worst = 0.0f64;
    for dtype in ["f32", "bf16"] {
        let out = tmp.path().join(dtype);
        let mut args = vec!["--base", base.to_str().unwrap(), "--adapter", &adapter];
        let out_s = s(&out);
        args.extend(["--out", &out_s, "--dtype", dtype, "--keep-f32", "none"]);
        args.extend_from_slice(extra);
        let (code, _, err) = wanbake(tmp.path(), &args);
        assert_eq!(code, 0, "{case_name}: {err}");
        let got = output_tensors(&out, "");
        for t in base_comp.tensors.tensors() {
            let name = t.view.name;
            let (_, _, bytes) = &got[name];
            let want = expected.get(name);
            if dtype == "f32" {
                match want {
                    None => assert_eq!(
                        bytes.as_slice(),
                        t.view.bytes,
                        "{case_name}: untouched {name}"
                    ),
                    Some(w) => {
                        let e = rel_err(&f32s(bytes), w);
                        assert!(
                            e <= 4.0 * f64::from(f32::EPSILON),
                            "{case_name}: {name}: {e:e}"
                        );
                        worst = worst.max(e);
                    }
                }
                continue;
            }
            let w: Vec<f64> = match want {
                Some(w) => w.clone(),
                None => t
                    .view
                    .to_f32()
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect(),
            };
            for (i, (&g, &r)) in bf16s(bytes).iter().zip(&w).enumerate() {
                let d = bf16_ulps(g, bf16_of(r));
                assert!(d <= 1, "{case_name}: {name}[{i}]: {d} bf16 ulps");
            }
        }
    }
    for name in expected.keys() {
        assert!(
            base_comp.tensors.contains(name),
            "{case_name}: expected tensor {name} not in the base"
        );
    }
    eprintln!("cli {case_name} @ {strength}: worst relative error {worst:.3e}");
    worst
}

#[test]
fn cli_peft_files_match_merge_and_unload() {
    cli_wan_case("peft_plain", "1", &[]);
    cli_wan_case("peft_plain", "0.5", &[]);
    cli_wan_case("peft_rslora_pattern", "1", &[]);
    cli_wan_case("peft_bias", "1", &[]);
    cli_wan_case("peft_i2v", "1", &[]);
    cli_wan_case("peft_dora", "1", &[]);
    cli_wan_case("peft_dora", "0.5", &["--dora-strength", "peft"]);
}

#[test]
fn cli_diffusers_comfy_kohya_files_match_fuse_lora_and_hand_derivations() {
    cli_wan_case("diffusers_lora", "1", &[]);
    cli_wan_case("diffusers_lora_nometa", "1", &[]);
    cli_wan_case("kohya_lora", "1", &[]);
    cli_wan_case("kohya_wanfun", "1", &[]);
    cli_wan_case("comfy_lora", "1", &[]);
    cli_wan_case("comfy_lora", "0.5", &[]);
    cli_wan_case("comfy_lora_ab", "1", &[]);
    cli_wan_case("comfy_i2v", "1", &[]);
}

#[test]
fn cli_a14b_gives_each_expert_its_own_adapter() {
    let m = golden_manifest();
    let c = &m["cases"]["a14b_pair"];
    let tmp = common::tmp();
    let out = tmp.path().join("out");
    let high = format!(
        "transformer={}",
        s(&repo(
            c["experts"]["transformer"]["adapter"].as_str().unwrap()
        ))
    );
    let low = format!(
        "transformer_2={}:1.0",
        s(&repo(
            c["experts"]["transformer_2"]["adapter"].as_str().unwrap()
        ))
    );
    let base = s(&repo(c["base"].as_str().unwrap()));
    let (code, stdout, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &base,
            "--adapter",
            &high,
            "--adapter",
            &low,
            "--out",
            &s(&out),
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("-> transformer_2"), "{stdout}");
    for expert in ["transformer", "transformer_2"] {
        let reference =
            SafetensorsFile::open(&repo(c["experts"][expert]["reference"].as_str().unwrap()))
                .unwrap();
        let got = output_tensors(&out, expert);
        for t in reference.infos() {
            let e = rel_err(&f32s(&got[&t.name].2), &tensor_f64(&reference, &t.name));
            assert!(
                e <= 4.0 * f64::from(f32::EPSILON),
                "{expert}/{}: {e:e}",
                t.name
            );
        }
    }
    assert!(out.join("model_index.json").is_file());
    // Without a component the pipeline base is ambiguous: a usage error, nothing written.
    let out2 = tmp.path().join("out2");
    let plain = s(&repo(
        c["experts"]["transformer"]["adapter"].as_str().unwrap(),
    ));
    let (code, _, err) = wanbake(
        tmp.path(),
        &["--base", &base, "--adapter", &plain, "--out", &s(&out2)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("transformer_2") && err.contains("transformer="),
        "{err}"
    );
    assert!(!out2.exists());
}

/// Runs the binary on SA3 adapters (golden/sa3 paths with optional :strength) and returns
/// the output tensors.
fn cli_sa3(
    tmp: &Path,
    adapters: &[&str],
    extra: &[&str],
) -> BTreeMap<String, (DType, Vec<usize>, Vec<u8>)> {
    let out = tmp.join(format!(
        "out-{}{}",
        adapters.join("+").replace(['/', ':'], "_"),
        extra.join("")
    ));
    let base = s(&sa3_base());
    let mut args = vec!["--base".to_string(), base];
    for a in adapters {
        args.push("--adapter".into());
        args.push(s(&repo(&format!("golden/sa3/{a}"))));
    }
    args.extend(["--out".into(), s(&out)]);
    args.extend(extra.iter().map(|x| x.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = wanbake(tmp, &refs);
    assert_eq!(code, 0, "{adapters:?}: {err}");
    output_tensors(&out, "")
}

fn check_sa3_output(
    got: &BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>,
    reference: &str,
    tol: f64,
) -> f64 {
    let reference = SafetensorsFile::open(&repo(&format!("golden/sa3/{reference}"))).unwrap();
    let base = SafetensorsFile::open(&sa3_base()).unwrap();
    let mut worst = 0.0f64;
    for t in base.infos() {
        let bytes = &got[&t.name].2;
        if reference.view(&t.name).is_none() {
            assert_eq!(
                bytes.as_slice(),
                base.view(&t.name).unwrap().bytes,
                "untouched {}",
                t.name
            );
            continue;
        }
        let e = max_abs_err(&f32s(bytes), &tensor_f64(&reference, &t.name));
        assert!(e <= tol, "{}: {e:e}", t.name);
        worst = worst.max(e);
    }
    worst
}

#[test]
fn cli_sa3_native_and_peft_files_match_float64_references() {
    let m = sa3_manifest();
    let tmp = common::tmp();
    for (case, c) in m["cases"].as_object().unwrap() {
        let files: Vec<String> = match c.get("adapters") {
            Some(list) => list
                .as_array()
                .unwrap()
                .iter()
                .zip(c["application_weights"].as_array().unwrap())
                .map(|(a, w)| format!("{}:{}", a.as_str().unwrap(), w))
                .collect(),
            None => {
                let a = c["adapter"].as_str().unwrap();
                let a = a.strip_suffix("/adapter_model.safetensors").unwrap_or(a);
                vec![format!("{a}:{}", c["application_weights"][0])]
            }
        };
        let refs: Vec<&str> = files.iter().map(String::as_str).collect();
        let got = cli_sa3(tmp.path(), &refs, &["--dtype", "f32"]);
        let tol = if case.ends_with("-xs") { 1e-5 } else { 1e-6 };
        let reference = c["reference"].as_str().unwrap();
        let e = check_sa3_output(&got, reference, tol);
        eprintln!("cli sa3 {case}: max abs error {e:.3e}");
        // bf16: within one ulp of the reference rounded to nearest even.
        let got = cli_sa3(
            tmp.path(),
            &refs,
            &["--dtype", "bf16", "--keep-f32", "none"],
        );
        let reference = SafetensorsFile::open(&repo(&format!("golden/sa3/{reference}"))).unwrap();
        for t in reference.infos() {
            let want = tensor_f64(&reference, &t.name);
            for (i, (&g, &r)) in bf16s(&got[&t.name].2).iter().zip(&want).enumerate() {
                let d = bf16_ulps(g, bf16_of(r));
                assert!(d <= 1, "{case} {}[{i}]: {d} bf16 ulps", t.name);
            }
        }
    }
}

#[test]
fn cli_svd_cache_is_hit_on_the_second_bake_and_corrupt_entries_are_recomputed() {
    let tmp = common::tmp();
    let cache = tmp.path().join("svd");
    std::fs::create_dir(&cache).unwrap();
    let cache_s = s(&cache);
    let run = |name: &str| {
        let out = tmp.path().join(name);
        let (code, stdout, err) = wanbake(
            tmp.path(),
            &[
                "--base",
                &s(&sa3_base()),
                "--adapter",
                &s(&repo("golden/sa3/adapters/bora-xs.safetensors")),
                "--adapter",
                &s(&repo("golden/sa3/adapters/lora-xs.safetensors")),
                "--out",
                &s(&out),
                "--svd-cache",
                &cache_s,
                "--json",
                // The band route's engine (faer): `auto` picks cuda where a device is found,
                // and its entries are cuSOLVER's (a device run showed this test assuming faer).
                "--device",
                "cpu",
            ],
        );
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        (v["report"]["svd"].clone(), weight_bytes(&out))
    };
    let (first, bytes1) = run("a");
    // The engine of the bases (issue 32), in the report and the manifest.
    let faer = wanbake::linalg::SvdEngine::Faer.id();
    assert_eq!(first["engine"].as_str(), Some(faer.as_str()), "{first}");
    let m: Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("a/wanbake.manifest.json")).unwrap())
            .unwrap();
    let recorded = m
        .pointer("/report/svd/engine")
        .or(m.pointer("/merge/svd/engine"));
    assert_eq!(recorded.and_then(Value::as_str), Some(faer.as_str()), "{m}");
    // Six targets, both adapters rank 2: one SVD per target.
    assert_eq!(
        (first["misses"].as_u64(), first["hits"].as_u64()),
        (Some(6), Some(0)),
        "{first}"
    );
    let (second, bytes2) = run("b");
    assert_eq!(
        (second["misses"].as_u64(), second["hits"].as_u64()),
        (Some(0), Some(6)),
        "{second}"
    );
    assert_eq!(bytes1, bytes2);
    // Corrupt one entry: it is reported as replaced, recomputed, and the output is the same.
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let mut b = std::fs::read(&entry).unwrap();
    let n = b.len();
    b[n - 3] ^= 0x55;
    std::fs::write(&entry, b).unwrap();
    let (third, bytes3) = run("c");
    assert_eq!(
        (third["replaced"].as_u64(), third["hits"].as_u64()),
        (Some(1), Some(5)),
        "{third}"
    );
    assert_eq!(bytes1, bytes3);
}

fn manifest_files(dir: &Path) -> Value {
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("wanbake.manifest.json")).unwrap()).unwrap();
    m["files"].clone()
}

#[test]
fn cli_threads_and_adapter_order_do_not_change_a_byte() {
    let tmp = common::tmp();
    let base = s(&sa3_base());
    let a = s(&repo("golden/sa3/adapters/bora.safetensors")) + ":0.7";
    let b = s(&repo("golden/sa3/adapters/dora-cols-xs.safetensors")) + ":-0.3";
    let c = s(&repo("golden/sa3/peft_dora")) + ":1.5";
    let mut files = Vec::new();
    for (i, (threads, order)) in [
        ("1", [&a, &b, &c]),
        ("2", [&c, &a, &b]),
        ("3", [&b, &c, &a]),
    ]
    .iter()
    .enumerate()
    {
        let out = tmp.path().join(format!("o{i}"));
        let mut args = vec!["--threads", threads, "merge", "--base", &base];
        for x in order {
            args.extend(["--adapter", x.as_str()]);
        }
        let out_s = s(&out);
        args.extend(["--out", &out_s, "--dtype", "bf16"]);
        let (code, _, err) = common::parts(&common::run(tmp.path(), &args));
        assert_eq!(code, 0, "{err}");
        files.push(manifest_files(&out));
    }
    assert_eq!(files[0], files[1]);
    assert_eq!(files[0], files[2]);
}

#[test]
fn cli_strength_zero_writes_the_input_back_bit_for_bit() {
    let tmp = common::tmp();
    let out = tmp.path().join("out");
    let (code, stdout, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&repo("golden/models/t2v")),
            "--adapter",
            &(s(&repo("golden/adapters/comfy_lora/comfy_lora.safetensors")) + ":0"),
            "--out",
            &s(&out),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("skipped (strength 0)"), "{stdout}");
    let base = Checkpoint::open_stored(&repo("golden/models/t2v")).unwrap();
    let got = output_tensors(&out, "");
    for t in base.single().unwrap().tensors.tensors() {
        assert_eq!(
            got[t.view.name].2.as_slice(),
            t.view.bytes,
            "{}",
            t.view.name
        );
    }
}

#[test]
fn cli_default_bf16_keeps_the_diffusers_fp32_modules_merged_in_f32() {
    let m = golden_manifest();
    let c = &m["cases"]["comfy_lora"];
    let tmp = common::tmp();
    let out = tmp.path().join("out");
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&repo("golden/models/t2v")),
            "--adapter",
            &case_adapter(&c["adapter"]),
            "--out",
            &s(&out),
            "--dtype",
            "bf16",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let got = output_tensors(&out, "");
    let expected = expected_values(c, "1");
    // blocks.2.scale_shift_table (diff_m) and blocks.0.norm2 (norm3 diff/diff_b) are
    // _keep_in_fp32_modules: they stay f32 and carry the merged value.
    for name in [
        "blocks.2.scale_shift_table",
        "blocks.0.norm2.weight",
        "blocks.0.norm2.bias",
    ] {
        let (dt, _, bytes) = &got[name];
        assert_eq!(*dt, DType::F32, "{name}");
        let e = rel_err(&f32s(bytes), &expected[name]);
        assert!(e <= 4.0 * f64::from(f32::EPSILON), "{name}: {e:e}");
    }
    assert_eq!(got["blocks.0.attn1.to_q.weight"].0, DType::BF16);
}

#[test]
fn cli_layout_nnx_scanned_writes_the_merged_weights_transposed_and_stacked() {
    let m = golden_manifest();
    let c = &m["cases"]["peft_plain"];
    let tmp = common::tmp();
    let out = tmp.path().join("nnx");
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&repo("golden/models/t2v")),
            "--adapter",
            &case_adapter(&c["adapter"]),
            "--out",
            &s(&out),
            "--layout",
            "nnx-scanned",
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let got = output_tensors(&out, "");
    let (_, shape, bytes) = &got["blocks.attn1.query.kernel"];
    assert_eq!(shape, &vec![3, 32, 32]);
    let kernel = f32s(bytes);
    let reference =
        SafetensorsFile::open(&repo("golden/references/peft_plain.safetensors")).unwrap();
    for l in 0..3 {
        let w = tensor_f64(&reference, &format!("blocks.{l}.attn1.to_q.weight"));
        // kernel[l, i, o] = W[o, i]
        let mut t = vec![0.0f32; 32 * 32];
        for o in 0..32 {
            for i in 0..32 {
                t[o * 32 + i] = kernel[l * 1024 + i * 32 + o];
            }
        }
        let e = rel_err(&t, &w);
        assert!(e <= 4.0 * f64::from(f32::EPSILON), "layer {l}: {e:e}");
    }
    let config: Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["_wanbake_layout"], "nnx-scanned");

    // That NNX output as a base: the same adapter binds to it and the merge, written back
    // as diffusers, equals PEFT's result on the diffusers base.
    let plain = tmp.path().join("nnx-plain");
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&repo("golden/models/t2v")),
            "--adapter",
            &(case_adapter(&c["adapter"]) + ":0"),
            "--out",
            &s(&plain),
            "--layout",
            "nnx-scanned",
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let back = tmp.path().join("back");
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&plain),
            "--adapter",
            &case_adapter(&c["adapter"]),
            "--out",
            &s(&back),
            "--layout",
            "diffusers",
            "--dtype",
            "f32",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let got = output_tensors(&back, "");
    for t in reference.infos() {
        let e = rel_err(&f32s(&got[&t.name].2), &tensor_f64(&reference, &t.name));
        assert!(e <= 4.0 * f64::from(f32::EPSILON), "{}: {e:e}", t.name);
    }
}

#[track_caller]
fn cli_refused(args: &[&str], code: i32, needles: &[&str]) {
    let tmp = common::tmp();
    let out = tmp.path().join("out");
    let mut all: Vec<&str> = args.to_vec();
    let out_s = s(&out);
    all.extend(["--out", &out_s]);
    let (got, stdout, err) = wanbake(tmp.path(), &all);
    assert_eq!(got, code, "stdout: {stdout}\nstderr: {err}");
    for n in needles {
        assert!(err.contains(n), "`{n}` missing from: {err}");
    }
    assert!(
        common::tree(tmp.path()).is_empty(),
        "left behind: {:?}",
        common::tree(tmp.path())
    );
}

#[test]
fn cli_refusals_write_nothing() {
    let t2v = s(&repo("golden/models/t2v"));
    let mismatch = s(&repo(
        "golden/adapters/mismatch_1p3b_like/mismatch_1p3b_like.safetensors",
    ));
    cli_refused(
        &["--base", &t2v, "--adapter", &mismatch],
        1,
        &[
            "mismatch_1p3b_like.safetensors",
            "blocks.0.attn1.to_q.weight",
            "[48, 4]",
            "[32, 32]",
            "inner_dim 48",
        ],
    );
    let peft = s(&repo("golden/adapters/peft_plain"));
    for bad in ["nan", "inf", "x"] {
        cli_refused(
            &["--base", &t2v, "--adapter", &format!("{peft}:{bad}")],
            2,
            &["not a finite number"],
        );
    }
    cli_refused(
        &[
            "--base",
            &t2v,
            "--adapter",
            &format!("transformer_2={peft}"),
        ],
        2,
        &["no transformer `transformer_2`"],
    );
    cli_refused(
        &["--base", &t2v, "--adapter", &peft, "--dtype", "fp8"],
        2,
        &[
            "invalid value 'fp8'",
            "possible values: keep, bf16, f16, f32",
        ],
    );
    cli_refused(
        &[
            "--base",
            &t2v,
            "--adapter",
            &peft,
            "--dora-strength",
            "inside",
        ],
        2,
        &["invalid value 'inside'", "possible values: merge, peft"],
    );
    cli_refused(
        &[
            "--base",
            &t2v,
            "--adapter",
            &peft,
            "--svd-cache",
            // Created when missing, so one that cannot be: under a regular file.
            &format!("{}/cache", s(&repo("golden/models/t2v/config.json"))),
        ],
        2,
        &["--svd-cache"],
    );
    // An SA3 adapter on a WAN base binds nothing.
    let sa3 = s(&repo("golden/sa3/adapters/lora.safetensors"));
    cli_refused(
        &["--base", &t2v, "--adapter", &sa3],
        1,
        &["lora.safetensors"],
    );
}

/// Every enumerated flag of every command is checked by the parser against the library's
/// own names (case-sensitively, the same on every command): a bad value exits 2, names the
/// flag and lists exactly the values that command accepts, and nothing is written.
#[test]
fn every_enumerated_flag_lists_the_values_its_command_accepts() {
    let layouts = "diffusers, wan, nnx, nnx-scanned";
    let formats = "fp8-scaled, gguf:q8_0, gguf:q4_0, gguf:q5_0, gguf:bf16, gguf:f16";
    let conventions = "peft, diffusers, comfy, kohya, lycoris, sa3, nnx";
    let devices = "auto, cpu, cuda";
    let floats = "bf16, f16, f32";
    let cases: &[(&str, &str, &str)] = &[
        ("merge", "--dtype", "keep, bf16, f16, f32"),
        ("merge", "--layout", layouts),
        ("merge", "--dora-strength", "merge, peft"),
        ("merge", "--to", formats),
        ("merge", "--device", devices),
        ("restack", "--to", layouts),
        ("restack", "--from", layouts),
        ("restack", "--dtype", "keep, bf16, f16, f32"),
        ("restack", "--device", devices),
        ("convert", "--dtype", floats),
        ("convert", "--to", formats),
        ("synth", "--dtype", floats),
        ("synth", "--fill", "zero, random"),
        ("synth", "--model", "wan2.1-t2v-1.3b, wan2.1-t2v-14b"),
        ("extract", "--to", "comfy, peft]"),
        ("extract", "--svd", "randomized, exact]"),
        ("extract", "--device", devices),
        ("translate", "--to", conventions),
        ("translate", "--from", conventions),
        ("bake", "--device", devices),
    ];
    let tmp = common::tmp();
    for (command, flag, values) in cases {
        for bad in ["bogus", "BF16", "Wan", "PEFT"] {
            let (code, _, err) = common::parts(&common::run(tmp.path(), &[command, flag, bad]));
            assert_eq!(code, 2, "{command} {flag} {bad}: {err}");
            assert!(
                err.contains(&format!("invalid value '{bad}' for '{flag} <")),
                "{command} {flag} {bad}: {err}"
            );
            assert!(
                err.contains(&format!("[possible values: {values}")),
                "{command} {flag} {bad}: {err}"
            );
        }
    }
    assert!(common::tree(tmp.path()).is_empty());
}

/// A bad keep-f32 policy is a usage error that names the flag once (the library's message
/// names no flag; each front end adds its own), on merge and restack alike; a recipe names
/// its field instead.
#[test]
fn a_bad_keep_f32_policy_names_the_flag_once() {
    let t2v = s(&repo("golden/models/t2v"));
    let peft = s(&repo("golden/adapters/peft_plain"));
    let tmp = common::tmp();
    for args in [
        vec!["merge", "--base", &t2v, "--adapter", &peft],
        vec!["restack", &t2v, "--to", "wan", "--dtype", "bf16"],
    ] {
        let mut all = args.clone();
        all.extend(["--keep-f32", "bogus", "--out", "out"]);
        let (code, _, err) = common::parts(&common::run(tmp.path(), &all));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("`bogus` is not diffusers, maxdiffusion, none or regex:PATTERN"),
            "{args:?}: {err}"
        );
        assert_eq!(err.matches("--keep-f32").count(), 1, "{args:?}: {err}");
        assert!(common::tree(tmp.path()).is_empty());
    }
    let recipe = tmp.path().join("r.toml");
    std::fs::write(
        &recipe,
        format!(
            "[base]\npath = \"{t2v}\"\n\n[[adapter]]\npath = \"{peft}\"\n\n\
             [output]\ndir = \"out\"\nkeep_f32 = \"regex:(\"\n"
        ),
    )
    .unwrap();
    let (code, _, err) = common::parts(&common::run(tmp.path(), &["bake", "r.toml"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("output.keep_f32: regex `(`"), "{err}");
    assert!(!err.contains("--keep-f32"), "{err}");
}

#[test]
fn cli_refuses_non_finite_adapters_and_merged_results() {
    let tmp = common::tmp();
    let inputs = tmp.path().join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    let key = "diffusion_model.blocks.0.self_attn.q";
    let write = |name: &str, down: f32, up: f32| {
        let p = inputs.join(name);
        common::write_f32(
            &p,
            &[
                (
                    &format!("{key}.lora_down.weight"),
                    vec![1, 32],
                    vec![down; 32],
                ),
                (&format!("{key}.lora_up.weight"), vec![32, 1], vec![up; 32]),
            ],
        );
        s(&p)
    };
    let nan = write("nan.safetensors", f32::NAN, 1.0);
    let huge = write("huge.safetensors", 3e38, 3e38);
    let t2v = s(&repo("golden/models/t2v"));
    for (adapter, needles) in [
        (&nan, vec!["nan.safetensors", "lora_down.weight", "NaN"]),
        (&huge, vec!["blocks.0.attn1.to_q.weight", "non-finite"]),
    ] {
        let out = tmp.path().join("out");
        let (code, _, err) = wanbake(
            tmp.path(),
            &["--base", &t2v, "--adapter", adapter, "--out", &s(&out)],
        );
        assert_eq!(code, 1, "{err}");
        for n in needles {
            assert!(err.contains(n), "`{n}` missing from: {err}");
        }
        assert_eq!(
            common::tree(tmp.path()),
            vec![
                "inputs",
                "inputs/huge.safetensors",
                "inputs/nan.safetensors"
            ]
        );
    }
}

#[test]
fn cli_unmatched_keys_are_refused_unless_allowed_and_then_reported() {
    let tmp = common::tmp();
    let inputs = tmp.path().join("inputs");
    std::fs::create_dir(&inputs).unwrap();
    let p = inputs.join("extra.safetensors");
    let key = "diffusion_model.blocks.0.self_attn.q";
    common::write_f32(
        &p,
        &[
            (
                &format!("{key}.lora_down.weight"),
                vec![1, 32],
                vec![0.1; 32],
            ),
            (&format!("{key}.lora_up.weight"), vec![32, 1], vec![0.1; 32]),
            (
                "diffusion_model.blocks.0.not_a_module.lora_down.weight",
                vec![1, 32],
                vec![0.1; 32],
            ),
            (
                "diffusion_model.blocks.0.not_a_module.lora_up.weight",
                vec![32, 1],
                vec![0.1; 32],
            ),
        ],
    );
    let t2v = s(&repo("golden/models/t2v"));
    let out = tmp.path().join("out");
    let (code, _, err) = wanbake(
        tmp.path(),
        &["--base", &t2v, "--adapter", &s(&p), "--out", &s(&out)],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not_a_module"), "{err}");
    assert!(!out.exists());
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &t2v,
            "--adapter",
            &s(&p),
            "--out",
            &s(&out),
            "--allow-unmatched",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let m: Value =
        serde_json::from_slice(&std::fs::read(out.join("wanbake.manifest.json")).unwrap()).unwrap();
    let listed = m["report"]["adapters"][0]["unmatched_allowed"].to_string();
    assert!(listed.contains("not_a_module.lora_down.weight"), "{listed}");
    assert_eq!(m["report"]["adapters"][0]["targets_merged"], 1);
}

#[test]
fn cli_help_documents_the_expert_syntax_and_strength_semantics() {
    let tmp = common::tmp();
    let out = common::ok(common::run(tmp.path(), &["merge", "--help"]));
    for needle in [
        "transformer_2=low_noise.safetensors:1.0",
        "--dora-strength peft",
        "a = 0 skips the adapter",
        "MaxDiffusion adds diffs unscaled",
    ] {
        assert!(out.contains(needle), "`{needle}` missing from --help");
    }
}

#[test]
fn cli_shard_size_shards_the_output_and_keeps_every_value() {
    let m = golden_manifest();
    let c = &m["cases"]["peft_plain"];
    let tmp = common::tmp();
    let out = tmp.path().join("out");
    let (code, _, err) = wanbake(
        tmp.path(),
        &[
            "--base",
            &s(&repo("golden/models/t2v")),
            "--adapter",
            &case_adapter(&c["adapter"]),
            "--out",
            &s(&out),
            "--dtype",
            "f32",
            "--shard-size",
            "60KB",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let listing = common::tree(&out);
    assert!(
        listing.contains(&"diffusion_pytorch_model.safetensors.index.json".to_string()),
        "{listing:?}"
    );
    assert!(
        listing
            .iter()
            .filter(|f| f.ends_with("-of-00004.safetensors"))
            .count()
            == 4,
        "{listing:?}"
    );
    let got = output_tensors(&out, "");
    let reference =
        SafetensorsFile::open(&repo("golden/references/peft_plain.safetensors")).unwrap();
    for t in reference.infos() {
        let e = rel_err(&f32s(&got[&t.name].2), &tensor_f64(&reference, &t.name));
        assert!(e <= 4.0 * f64::from(f32::EPSILON), "{}: {e:e}", t.name);
    }
    assert_eq!(got.len(), 96);
}

// ---------------------------------------------------------------------------------------
// --device: which route runs, and the manifest's record of it.

/// Runs `merge --device DEVICE` of the SA3 bora-xs adapter (GEMMs, norms and an SVD) in bf16.
fn cli_merge_on(cwd: &Path, device: &str, out: &Path) -> (i32, String, String) {
    let base = s(&sa3_base());
    let a = s(&repo("golden/sa3/adapters/bora-xs.safetensors")) + ":0.8";
    let out_s = s(out);
    wanbake(
        cwd,
        &[
            "--base",
            &base,
            "--adapter",
            &a,
            "--out",
            &out_s,
            "--dtype",
            "bf16",
            "--device",
            device,
        ],
    )
}

fn device_used(out: &Path) -> Value {
    let m: Value =
        serde_json::from_slice(&std::fs::read(out.join("wanbake.manifest.json")).unwrap()).unwrap();
    m["report"]["device"].clone()
}

#[test]
fn cli_device_flag_picks_the_route_and_the_manifest_says_which_ran() {
    let tmp = common::tmp();
    let gpu = CudaDevice::open(0).map_err(|e| e.to_string());
    let cpu_out = tmp.path().join("cpu");
    let (code, stdout, err) = cli_merge_on(tmp.path(), "cpu", &cpu_out);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("device: cpu (--device cpu)"), "{stdout}");
    assert_eq!(device_used(&cpu_out)["used"], "cpu");
    assert!(device_used(&cpu_out)["name"].is_null());

    let auto_out = tmp.path().join("auto");
    let (code, stdout, err) = cli_merge_on(tmp.path(), "auto", &auto_out);
    assert_eq!(code, 0, "{err}");
    match &gpu {
        Err(why) => {
            // The fallback says why, and is the CPU route byte for byte.
            // One short line on stdout; `--device cuda`'s error says everything (`why`).
            let line = stdout
                .lines()
                .find(|l| l.starts_with("device: cpu ("))
                .unwrap_or_else(|| panic!("{stdout}"));
            assert!(line.len() < 100, "{line}");
            assert!(!why.is_empty());
            assert_eq!(device_used(&auto_out)["used"], "cpu");
            assert_eq!(manifest_files(&auto_out), manifest_files(&cpu_out));
        }
        Ok(_) => {
            assert!(stdout.contains("device: cuda: "), "{stdout}");
            assert_eq!(device_used(&auto_out)["used"], "cuda");
            assert!(device_used(&auto_out)["name"].is_string());
        }
    }

    let cuda_out = tmp.path().join("cuda");
    let (code, stdout, err) = cli_merge_on(tmp.path(), "cuda", &cuda_out);
    match &gpu {
        Err(_) => {
            assert_eq!(code, 1, "stdout: {stdout}\nstderr: {err}");
            assert!(err.contains("CUDA is unavailable"), "{err}");
            assert!(err.contains("--device cpu"), "{err}");
            assert!(!err.contains("panicked"), "{err}");
            assert!(!cuda_out.exists(), "nothing may be written");
        }
        Ok(_) => {
            assert_eq!(code, 0, "{err}");
            assert_eq!(device_used(&cuda_out)["used"], "cuda");
        }
    }

    let (code, _, err) = cli_merge_on(tmp.path(), "gpu", &tmp.path().join("bad"));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "invalid value 'gpu' for '--device <DEVICE>'\n  [possible values: auto, cpu, cuda]"
        ),
        "{err}"
    );
    // Only the releases that succeeded exist: no `bad`, no temporaries.
    let mut left = common::tree(tmp.path());
    left.retain(|p| !p.contains('/'));
    let mut want = vec!["auto", "cpu"];
    if gpu.is_ok() {
        want.push("cuda");
    }
    assert_eq!(left, want);
}

/// Merges PEFT DoRA (row norms) and a diffusers LoRA into the golden WAN base, written in
/// `layout` as bf16, on every route; the routes agree to one bf16 ulp. The NNX layouts send
/// the whole-tensor route through its transposing writer, and a base restacked to NNX makes
/// it read transposed kernels.
#[test]
fn every_route_agrees_through_the_transposing_layouts_and_on_nnx_bases() {
    let m = golden_manifest();
    let tmp = common::tmp();
    let golden_base = repo(m["cases"]["peft_dora"]["base"].as_str().unwrap());
    let nnx_base = tmp.path().join("nnx-base");
    let (code, _, err) = common::parts(&common::run(
        tmp.path(),
        &[
            "restack",
            s(&golden_base).as_str(),
            "--to",
            "nnx",
            "--out",
            s(&nnx_base).as_str(),
        ],
    ));
    assert_eq!(code, 0, "{err}");
    // Bound as the command line binds them, so the names follow the base's layout.
    let make = |base: &Path| {
        let specs: Vec<AdapterSpec> = ["peft_dora", "diffusers_lora"]
            .iter()
            .map(|case| AdapterSpec::parse(&(case_adapter(&m["cases"][case]["adapter"]) + ":0.7")))
            .collect::<Result<_, _>>()
            .unwrap();
        bind_specs(&specs, &wanbake::quant::base::open(base).unwrap(), false).unwrap()
    };
    for (base, layout) in [
        (&golden_base, Layout::Nnx),
        (&golden_base, Layout::NnxScanned),
        (&nnx_base, Layout::Diffusers),
    ] {
        let mut o = options(OutputDType::BF16);
        o.output.layout = Some(layout);
        let mut outputs = Vec::new();
        for compute in routes() {
            let dest = tmp.path().join(format!("{layout:?}-{}", compute.label()));
            let base_name = base.file_name().unwrap().to_string_lossy();
            let what = format!("{base_name} → {layout:?}");
            merge_bound(base, &make(base), &o, &dest, &compute)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            outputs.push((compute.label(), output_tensors(&dest, "")));
        }
        routes_agree_within_one_bf16_ulp(&outputs, &format!("{layout:?}"));
    }
}

/// The -xs bases one CPU route stores in the SVD cache are the ones the other reads (both
/// are faer's, the engine that keys them): the whole-tensor route (the CUDA program, here on
/// the CPU reference backend, its bases on a reference lane) misses and stores, the band
/// route then hits every entry, and the two outputs agree.
#[test]
fn the_svd_cache_is_shared_between_routes() {
    let tmp = common::tmp();
    let cache_dir = tmp.path().join("cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let cache = wanbake::linalg::SvdCache::open(&cache_dir).unwrap();
    let base = wanbake::quant::base::open(&sa3_base()).unwrap();
    let mut outputs = Vec::new();
    let mut reports = Vec::new();
    let routes = [Compute::Reference, Compute::Cpu];
    for compute in &routes {
        let dest = tmp.path().join(compute.label());
        let adapters = bind_all(&base, vec![bound(sa3_set("bora-xs", &same), 0.9)], false).unwrap();
        let o = options(OutputDType::BF16);
        let merging = Merging {
            options: o.merge,
            compute,
            svd_cache: Some(&cache),
        };
        let out =
            merge_release(&base, &adapters, &o.output, &merging, &dest, Replace::Never).unwrap();
        reports.push(out.report.svd.clone());
        outputs.push((compute.label(), output_tensors(&dest, "")));
    }
    assert!(reports[0].misses > 0, "{:?}", reports[0]);
    assert_eq!((reports[0].hits, reports[0].computed), (0, 0));
    assert_eq!(reports[1].hits, reports[0].misses, "{:?}", reports[1]);
    assert_eq!(reports[1].misses + reports[1].replaced, 0);
    // Both CPU routes compute with faer (issue 32: the engine keys the cache and is reported).
    for r in &reports {
        assert_eq!(r.engine, Some(wanbake::linalg::SvdEngine::Faer), "{r:?}");
    }
    outputs.reverse(); // the band route first: the one the others are compared to
    routes_agree_within_one_bf16_ulp(&outputs, "bora-xs through the shared cache");
}

#[test]
fn an_i2v_adapter_on_a_t2v_base_is_explained_in_model_terms_first() {
    let tmp = common::tmp();
    let g = common::repo().join("golden");
    for (adapter, modules) in [
        ("adapters/peft_i2v", "attn2.add_k_proj"),
        (
            "adapters/comfy_i2v/comfy_i2v.safetensors",
            "cross_attn.k_img",
        ),
    ] {
        let o = common::run(
            tmp.path(),
            &[
                "merge",
                "--base",
                g.join("models/t2v").to_str().unwrap(),
                "--adapter",
                g.join(adapter).to_str().unwrap(),
                "--out",
                "out",
                "--device",
                "cpu",
            ],
        );
        let (code, _, err) = common::parts(&o);
        assert_eq!(code, 1, "{err}");
        let first = err.lines().next().unwrap_or_default();
        // The spec (wan.md): add_k_proj / k_img exist only with image_dim = 1280, Wan 2.1
        // I2V/FLF2V; the golden t2v model has no image branch.
        assert!(
            first.contains("targets the image cross-attention")
                && first.contains("Wan 2.1 I2V/FLF2V"),
            "{err}"
        );
        // ... then the list, one line per unbound module, naming the base as given.
        assert!(err.lines().skip(1).any(|l| l.contains(modules)), "{err}");
        let base = format!("of the base {}:", g.join("models/t2v").display());
        assert!(err.contains(&base), "{err}");
        assert!(!tmp.path().join("out").exists());
        // `inspect --base` gives the same explanation, first among its problems, and in the
        // report as the verdict.
        let o = common::run(
            tmp.path(),
            &[
                "inspect",
                g.join(adapter).to_str().unwrap(),
                "--base",
                g.join("models/t2v").to_str().unwrap(),
            ],
        );
        let (code, out, err) = common::parts(&o);
        assert_eq!(code, 1, "{err}");
        let first = err.lines().next().unwrap_or_default();
        assert!(first.contains("targets the image cross-attention"), "{err}");
        assert!(
            out.lines()
                .any(|l| l.contains("verdict:") && l.contains("Wan 2.1 I2V/FLF2V")),
            "{out}"
        );
    }
}

/// The whole-tensor route computes -xs bases on a lane before the target's merge takes one,
/// and writes each merged tensor while holding its lane; that hung on an H200 (`--device
/// cuda`, SA3-small, 28 -xs targets) and on the CPU reference lanes at the same size under
/// a one-chunk window, until a worker waiting for a lane no longer counted as one a write
/// may wait for (`pipeline::compute`'s unit test provokes it deterministically; the golden
/// model here is too small to). Here: the reference route with 8 workers through a
/// one-chunk window completes and writes the default window's bytes.
#[test]
fn xs_bases_on_lanes_complete_through_a_one_chunk_window() {
    let tmp = common::tmp();
    let run = |name: &str, geometry: Option<wanbake::release::ordered::Geometry>| {
        let dest = tmp.path().join(name);
        let to = dest.clone();
        let (done, result) = std::sync::mpsc::channel();
        // A thread of its own, so that a hang fails the test instead of hanging it.
        std::thread::spawn(move || {
            let base = wanbake::quant::base::open(&sa3_base()).unwrap();
            let sets = vec![
                bound(sa3_set("bora-xs", &same), 0.9),
                bound(sa3_set("lora-xs", &same), -0.4),
            ];
            let adapters = bind_all(&base, sets, false).unwrap();
            let o = options(OutputDType::BF16);
            let merging = Merging {
                options: o.merge,
                compute: &Compute::Reference,
                svd_cache: None,
            };
            let merge = || {
                merge_release(&base, &adapters, &o.output, &merging, &to, Replace::Never)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(8).build();
            let r = pool.unwrap().install(|| match geometry {
                Some(g) => wanbake::release::ordered::with_geometry(g, merge),
                None => merge(),
            });
            let _ = done.send(r);
        });
        let r = result
            .recv_timeout(std::time::Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{name}: the merge hung ({e})"));
        r.unwrap_or_else(|e| panic!("{name}: {e}"));
        output_tensors(&dest, "")
    };
    let tight = wanbake::release::ordered::Geometry {
        chunk: 4096,
        window: 1,
        small: 0,
    };
    let windowed = run("tight", Some(tight));
    let default = run("default", None);
    assert!(windowed == default, "a one-chunk window changed the output");
}
