//! The Orbax container layer (src/io/orbax/) against real Orbax 0.12.8 / tensorstore 0.1.86
//! saves (golden/orbax/, made by golden/orbax_golden.py): every leaf of every layout reads
//! back bit for bit, whole and row by row; path resolution; metadata.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use wanbake::io::DType;
use wanbake::io::orbax::{self, Item, Level, ZarrVersion};

fn golden(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden/orbax")
        .join(p)
}

struct Leaf {
    path: Vec<String>,
    dtype: String,
    shape: Vec<u64>,
    bytes: Vec<u8>,
}

fn expected(case: &str) -> Vec<Leaf> {
    let text = std::fs::read_to_string(golden("expected.json")).unwrap();
    let v: Json = serde_json::from_str(&text).unwrap();
    v["cases"][case]
        .as_array()
        .unwrap_or_else(|| panic!("no case {case}"))
        .iter()
        .map(|l| Leaf {
            path: l["path"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_str().unwrap().to_string())
                .collect(),
            dtype: l["dtype"].as_str().unwrap().to_string(),
            shape: l["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect(),
            bytes: hex(l["hex"].as_str().unwrap()),
        })
        .collect()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn numpy_dtype(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U8 => "uint8",
        DType::BOOL => "bool",
        other => panic!("unexpected dtype {other:?}"),
    }
}

/// Every leaf of `item` equals the expected one, read whole and row by row.
fn check_item(dir: &Path, case: &str, zarr: ZarrVersion) {
    let item = Item::open(dir).unwrap();
    let exp = expected(case);
    assert_eq!(item.leaves().len(), exp.len(), "{case}: leaf count");
    for e in &exp {
        let name = e.path.join(".");
        let leaf = item
            .leaves()
            .iter()
            .find(|l| l.name() == name)
            .unwrap_or_else(|| panic!("{case}: no leaf {name}"));
        let keys: Vec<&str> = leaf.keys.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, e.path, "{case}: path of {name}");
        let a = item.array(&name).unwrap();
        let m = a.meta();
        assert_eq!(m.version, zarr, "{case}: {name}");
        assert_eq!(numpy_dtype(m.dtype), e.dtype, "{case}: dtype of {name}");
        assert_eq!(m.shape, e.shape, "{case}: shape of {name}");
        let whole = a.read_all(1 << 30).unwrap();
        assert!(whole == e.bytes, "{case}: bytes of {name} differ");
        if !e.shape.is_empty() {
            let mut rows = Vec::new();
            for r in a.rows(0..e.shape[0]).unwrap() {
                let (i, b) = r.unwrap();
                assert_eq!(i as usize, rows.len() / a.row_bytes().max(1) as usize);
                rows.extend_from_slice(&b);
            }
            assert!(rows == e.bytes, "{case}: rows of {name} differ");
            // A range that starts inside the array.
            if e.shape[0] > 1 {
                let rb = a.row_bytes() as usize;
                let tail: Vec<u8> = a
                    .rows(1..e.shape[0])
                    .unwrap()
                    .flat_map(|r| r.unwrap().1)
                    .collect();
                assert!(tail == e.bytes[rb..], "{case}: rows 1.. of {name} differ");
            }
        }
    }
}

#[test]
fn ocdbt_zarr2_reads_bit_for_bit() {
    check_item(&golden("ocdbt_zarr2"), "basic", ZarrVersion::V2);
}

#[test]
fn ocdbt_zarr3_many_chunks_reads_bit_for_bit() {
    check_item(&golden("ocdbt_zarr3"), "basic", ZarrVersion::V3);
    // chunk_byte_size 64 really split the arrays.
    let item = Item::open(&golden("ocdbt_zarr3")).unwrap();
    let a = item.array("params.big").unwrap();
    assert!(
        a.meta().grid().iter().product::<u64>() > 16,
        "{:?}",
        a.meta()
    );
}

#[test]
fn plain_zarr2_reads_bit_for_bit() {
    check_item(&golden("plain_zarr2"), "basic", ZarrVersion::V2);
    let item = Item::open(&golden("plain_zarr2")).unwrap();
    assert!(matches!(item.store, orbax::Store::Files { .. }));
}

#[test]
fn plain_zarr3_reads_bit_for_bit() {
    check_item(&golden("plain_zarr3"), "basic", ZarrVersion::V3);
}

#[test]
fn jax_arrays_and_nnx_value_and_lora_read_bit_for_bit() {
    check_item(&golden("jax_arrays"), "jax_arrays", ZarrVersion::V2);
    check_item(&golden("nnx_value"), "nnx_value", ZarrVersion::V2);
    check_item(&golden("lora"), "lora", ZarrVersion::V2);
}

#[test]
fn value_suffix_is_recognised_only_last() {
    let item = Item::open(&golden("nnx_value")).unwrap();
    let l = item
        .leaves()
        .iter()
        .find(|l| l.name() == "blocks.value.kernel.value")
        .unwrap();
    assert!(l.has_value_suffix());
    assert_eq!(l.path_without_value(), ["blocks", "value", "kernel"]);
    assert!(
        item.leaves().iter().all(|l| l.has_value_suffix()),
        "every nnx.State leaf ends in value"
    );
    let plain = Item::open(&golden("jax_arrays")).unwrap();
    assert!(plain.leaves().iter().all(|l| !l.has_value_suffix()));
}

#[test]
fn lora_custom_metadata_is_exposed() {
    let item = Item::open(&golden("lora")).unwrap();
    let m = item.metadata.as_ref().unwrap();
    assert_eq!(
        m.custom("lora"),
        Some(&serde_json::json!({"rank": 4, "alpha": 8.0}))
    );
    assert_eq!(item.tree.use_ocdbt, Some(true));
    assert_eq!(item.tree.use_zarr3, Some(false));
    let names: Vec<String> = item.leaves().iter().map(|l| l.name()).collect();
    assert!(names.contains(&"params.params.blocks.attn1.query.kernel_lora_a".to_string()));
}

#[test]
fn manager_root_resolves_to_the_latest_step() {
    let r = orbax::resolve(&golden("manager")).unwrap();
    assert_eq!(r.level, Level::Root);
    assert_eq!(r.step, Some(3));
    assert_eq!(r.items.keys().collect::<Vec<_>>(), ["items"]);
    assert_eq!(
        r.step_metadata.as_ref().unwrap().custom("lora"),
        Some(&serde_json::json!({"rank": 8, "alpha": 16}))
    );
    check_item(&r.items["items"], "manager_step3", ZarrVersion::V2);

    let s = orbax::resolve(&golden("manager/1")).unwrap();
    assert_eq!((s.level, s.step), (Level::Step, Some(1)));
    check_item(&s.items["items"], "manager_step1", ZarrVersion::V2);

    let i = orbax::resolve(&golden("manager/1/items")).unwrap();
    assert_eq!(i.level, Level::Item);
    assert_eq!(i.items.keys().collect::<Vec<_>>(), ["items"]);

    let e = orbax::resolve(&golden("manager/1/items/d")).unwrap_err();
    assert!(e.to_string().contains("no _METADATA"), "{e}");
}

#[test]
fn ocdbt_root_refers_to_the_per_process_database() {
    let item = Item::open(&golden("ocdbt_zarr2")).unwrap();
    let orbax::Store::Ocdbt(db) = &item.store else {
        panic!("expected OCDBT");
    };
    let m = &db.manifest;
    assert_eq!(m.config.max_inline_value_bytes, 1024);
    // The big chunk is out of line, in a per-process data file.
    match db.get("params.big/0.0").unwrap() {
        orbax::Value::Range { file, .. } => {
            assert!(
                file.to_string_lossy().contains("ocdbt.process_0/d/"),
                "{file:?}"
            )
        }
        v => panic!("expected an out-of-line value, got {v:?}"),
    }
    assert!(matches!(
        db.get("params.w_f32/.zarray"),
        Some(orbax::Value::Inline(_))
    ));
}

// ---------------------------------------------------------------------------------------
// Encoders.

use wanbake::io::orbax::encode::{self, ArrayIn, MetadataLeaf};

/// Deterministic pseudo-random bytes (an LCG): no test depends on a rng crate's stream.
fn lcg_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) as u8
        })
        .collect()
}

/// bf16 values in [-2, 2): random mantissas under a fixed exponent range, never NaN.
fn bf16_bytes(seed: u64, n: usize) -> Vec<u8> {
    let r = lcg_bytes(seed, 2 * n);
    r.chunks(2)
        .flat_map(|c| {
            let f = (f32::from(c[0]) - 128.0) / 64.0 + f32::from(c[1]) / 65536.0;
            ((f.to_bits() >> 16) as u16).to_le_bytes()
        })
        .collect()
}

fn f32_bytes(seed: u64, n: usize) -> Vec<u8> {
    let r = lcg_bytes(seed, 4 * n);
    r.chunks(4)
        .flat_map(|c| {
            let f = (f32::from(c[0]) - 128.0) / 32.0 + f32::from(c[1]) / 4096.0;
            f.to_le_bytes()
        })
        .collect()
}

/// One array to write: dict keys, dtype, shape, C-order bytes.
type WrittenArray = (Vec<String>, DType, Vec<u64>, Vec<u8>);
/// One item: folder name, arrays, B+tree node budget.
type WrittenItem = (&'static str, Vec<WrittenArray>, usize);

/// The items the encoder roundtrip writes: a WAN-like scanned tree (bf16 stacked
/// (L, in, out) large enough to be out of line, f32 norms, a scalar), once with default
/// node sizes (one leaf) and once with a tiny node budget (interior nodes, height 2).
fn written_items() -> Vec<WrittenItem> {
    let k = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let tree = vec![
        (
            k(&["blocks", "attn1", "query", "kernel"]),
            DType::BF16,
            vec![3, 16, 24],
            bf16_bytes(1, 3 * 16 * 24),
        ),
        (
            k(&["blocks", "attn1", "query", "bias"]),
            DType::BF16,
            vec![3, 24],
            bf16_bytes(2, 3 * 24),
        ),
        (
            k(&["blocks", "norm2", "scale"]),
            DType::F32,
            vec![3, 16],
            f32_bytes(3, 3 * 16),
        ),
        (
            k(&["condition_embedder", "time_proj", "kernel"]),
            DType::F32,
            vec![8, 32],
            f32_bytes(4, 8 * 32),
        ),
        (
            k(&["scale_shift_table"]),
            DType::F32,
            vec![1, 2, 16],
            f32_bytes(5, 32),
        ),
        (
            k(&["step"]),
            DType::I32,
            vec![],
            7i32.to_le_bytes().to_vec(),
        ),
    ];
    vec![
        ("wan_state", tree.clone(), encode::DEFAULT_NODE_BUDGET),
        ("split_nodes", tree, 200),
    ]
}

fn encode_written(budget_items: &[WrittenItem]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, arrays, budget) in budget_items {
        let ins: Vec<ArrayIn> = arrays
            .iter()
            .map(|(keys, dtype, shape, data)| ArrayIn {
                keys: keys.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                data,
            })
            .collect();
        for (p, b) in encode::encode_item(&ins, *budget).unwrap() {
            out.push((format!("{name}/{p}"), b));
        }
    }
    out
}

fn write_tree(root: &Path, files: &[(String, Vec<u8>)]) {
    for (p, b) in files {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b).unwrap();
    }
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[test]
fn zarray_encoder_matches_tensorstore() {
    // Every .zarray Orbax wrote for the basic tree, re-encoded from its parsed fields.
    let item = Item::open(&golden("plain_zarr2")).unwrap();
    for leaf in item.leaves() {
        let name = leaf.name();
        let real = std::fs::read(golden("plain_zarr2").join(&name).join(".zarray")).unwrap();
        let m = item.array(&name).unwrap().meta().clone();
        let ours = encode::encode_zarray(&m.shape, m.dtype, &m.chunk_shape).unwrap();
        assert_eq!(
            String::from_utf8(ours).unwrap(),
            String::from_utf8(real).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn metadata_encoder_matches_orbax() {
    let real = std::fs::read(golden("jax_arrays/_METADATA")).unwrap();
    let item = Item::open(&golden("jax_arrays")).unwrap();
    let leaves: Vec<MetadataLeaf> = item
        .leaves()
        .iter()
        .rev() // order of the input does not matter
        .map(|l| MetadataLeaf {
            keys: l.keys.iter().map(|k| k.key.clone()).collect(),
            shape: l.write_shape.clone().unwrap(),
        })
        .collect();
    assert_eq!(
        String::from_utf8(encode::encode_tree_metadata(&leaves)).unwrap(),
        String::from_utf8(real).unwrap()
    );
    // _CHECKPOINT_METADATA: Orbax's structure with the clock replaced by 0.
    let real = std::fs::read_to_string(golden("jax_arrays/_CHECKPOINT_METADATA")).unwrap();
    let ours = String::from_utf8(encode::encode_checkpoint_metadata(
        &Json::String(encode::STANDARD_HANDLER.into()),
        &serde_json::Map::new(),
    ))
    .unwrap();
    let zero_clock = regex::Regex::new(r#"_nsecs": \d+"#)
        .unwrap()
        .replace_all(&real, r#"_nsecs": 0"#);
    assert_eq!(ours, zero_clock);
}

#[test]
fn chunk_encoder_is_the_same_however_the_bytes_are_fed() {
    let data = bf16_bytes(9, 300_000);
    let whole = encode::encode_chunk(&data);
    let mut e = encode::ChunkEncoder::new(Vec::new(), data.len() as u64).unwrap();
    for piece in data.chunks(4099) {
        e.write_all(piece).unwrap();
    }
    assert_eq!(e.finish().unwrap(), whole);
    assert_eq!(zstd::decode_all(whole.as_slice()).unwrap(), data);
}

#[test]
fn encoded_items_read_back_with_wanbake_reader() {
    let items = written_items();
    let files = encode_written(&items);
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &files);
    for (name, arrays, _) in &items {
        let item = Item::open(&dir.path().join(name)).unwrap();
        let orbax::Store::Ocdbt(db) = &item.store else {
            panic!("expected OCDBT")
        };
        let h = db.manifest.latest().unwrap().root_height;
        if *name == "split_nodes" {
            assert!(h >= 2, "tiny node budget must give interior nodes, got {h}");
        } else {
            assert_eq!(h, 0);
        }
        for (keys, dtype, shape, data) in arrays {
            let a = item.array(&keys.join(".")).unwrap();
            assert_eq!((a.meta().dtype, &a.meta().shape), (*dtype, shape));
            assert!(a.read_all(1 << 30).unwrap() == *data, "{name} {keys:?}");
        }
    }
}

/// Encoder output bytes are held to the bytes Orbax 0.12.8 + tensorstore 0.1.86 restored
/// (golden/orbax/written/, checked by `golden/orbax_golden.py check`, result in
/// golden/orbax/restored.json). With WANBAKE_WRITE_ORBAX_GOLDEN=1 the test rewrites
/// golden/orbax/written/ instead (then rerun the check script).
#[test]
fn encoded_items_are_the_bytes_orbax_restored() {
    let items = written_items();
    let files = encode_written(&items);
    let root = golden("written");
    if std::env::var_os("WANBAKE_WRITE_ORBAX_GOLDEN").is_some() {
        let _ = std::fs::remove_dir_all(&root);
        write_tree(&root, &files);
        return;
    }
    let restored: Json =
        serde_json::from_str(&std::fs::read_to_string(golden("restored.json")).unwrap()).unwrap();
    // Same file set and bytes as what the script checked.
    let checked = restored["files"].as_object().unwrap();
    let mut ours: Vec<String> = files.iter().map(|(p, _)| p.clone()).collect();
    ours.sort();
    assert_eq!(
        checked.keys().cloned().collect::<Vec<_>>(),
        ours,
        "file set changed: regenerate golden/orbax/written and rerun the check"
    );
    for (p, b) in &files {
        assert_eq!(
            checked[p].as_str().unwrap(),
            sha256_hex(b),
            "{p}: encoder output changed since Orbax restored it"
        );
        assert_eq!(
            &std::fs::read(root.join(p)).unwrap(),
            b,
            "{p}: committed bytes differ"
        );
    }
    // Orbax restored every leaf with our path, dtype, shape and bytes, and tensorstore
    // listed exactly the keys wanbake's reader finds.
    for (name, arrays, _) in &items {
        let item = Item::open(&root.join(name)).unwrap();
        let keys = item.store.keys().unwrap();
        assert_eq!(
            restored["ocdbt_keys"][name],
            serde_json::json!(keys),
            "{name}"
        );
        let leaves = restored["items"][name].as_array().unwrap();
        assert_eq!(leaves.len(), arrays.len(), "{name}");
        for (keys, dtype, shape, data) in arrays {
            let l = leaves
                .iter()
                .find(|l| l["path"] == serde_json::json!(keys))
                .unwrap_or_else(|| panic!("{name}: Orbax did not restore {keys:?}"));
            assert_eq!(l["dtype"], numpy_dtype(*dtype), "{name} {keys:?}");
            assert_eq!(l["shape"], serde_json::json!(shape), "{name} {keys:?}");
            assert_eq!(l["sha256"], sha256_hex(data), "{name} {keys:?}");
        }
    }
}
