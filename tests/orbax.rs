//! The Orbax container layer (src/io/orbax/) against real Orbax 0.12.8 / tensorstore 0.1.86
//! saves (golden/orbax/, made by golden/orbax_golden.py): every leaf of every layout reads
//! back bit for bit, whole and row by row; path resolution; metadata.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use wanbake::format::orbax::{self, Item, Level, ZarrVersion};
use wanbake::io::DType;

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

use wanbake::format::orbax::encode::{self, ArrayIn, MetadataLeaf};

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
    let whole = encode::encode_chunk(&data).unwrap();
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

// ---------------------------------------------------------------------------------------
// Malformed input: one test per failure, each checking the variant and that the message
// names the file (and key where there is one).

use wanbake::format::orbax::{FormatError, OrbaxError, ocdbt, zarr};

fn varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// A written item copied to a fresh temp dir (the golden files are never touched).
fn scratch_item() -> (tempfile::TempDir, PathBuf, String) {
    let items = written_items();
    let files = encode_written(&items[..1]);
    let dir = tempfile::tempdir().unwrap();
    write_tree(dir.path(), &files);
    let data = files
        .iter()
        .find(|(p, _)| p.contains("/d/"))
        .unwrap()
        .0
        .clone();
    let item = dir.path().join("wan_state");
    (dir, item, data.trim_start_matches("wan_state/").to_string())
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

fn format_err(e: &OrbaxError) -> &FormatError {
    e.format_error()
        .unwrap_or_else(|| panic!("expected a format error, got {e}"))
}

#[test]
fn malformed_truncated_data_file() {
    let (_t, item, data) = scratch_item();
    let path = item.join(&data);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    // The root node sits at the end of the data file: opening finds it outside.
    let e = Item::open(&item).unwrap_err();
    assert!(matches!(e, OrbaxError::OutsideFile { .. }), "{e}");
    assert!(e.to_string().contains(&data), "{e}");
}

#[test]
fn malformed_truncated_value_is_outside_its_file() {
    let (_t, item, data) = scratch_item();
    let it = Item::open(&item).unwrap();
    let key = "blocks.attn1.query.kernel/0.0.0";
    let v = it.store.get(key).unwrap().unwrap();
    let orbax::Value::Range { offset, length, .. } = &v else {
        panic!("expected out of line")
    };
    // Cut the file inside the chunk, after the store was opened.
    let path = item.join(&data);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..(*offset + *length / 2) as usize]).unwrap();
    let e = it
        .array("blocks.attn1.query.kernel")
        .unwrap()
        .read_all(1 << 20)
        .unwrap_err();
    assert!(matches!(e, OrbaxError::OutsideFile { .. }), "{e}");
    assert!(e.to_string().contains(key), "{e}");
}

#[test]
fn malformed_flipped_byte_is_a_crc_mismatch() {
    let (_t, item, data) = scratch_item();
    let m = item.join("manifest.ocdbt");
    let mut bytes = std::fs::read(&m).unwrap();
    bytes[30] ^= 0x40;
    std::fs::write(&m, &bytes).unwrap();
    let e = Item::open(&item).unwrap_err();
    assert!(
        matches!(
            format_err(&e),
            FormatError::CrcMismatch {
                what: "manifest",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("manifest.ocdbt"), "{e}");

    // A flipped byte inside the B+tree node (the data file's tail).
    let (_t2, item, _) = scratch_item();
    let path = item.join(&data);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = Item::open(&item).unwrap_err();
    assert!(
        matches!(
            format_err(&e),
            FormatError::CrcMismatch {
                what: "b-tree node",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn malformed_wrong_magic() {
    let mut m = encode::encode_manifest([0; 16], 0, None, "d/x");
    m[0] = 0x0d;
    assert!(matches!(
        ocdbt::decode_manifest(&m),
        Err(FormatError::BadMagic {
            found: 0x0ddb3a2a,
            ..
        })
    ));
    // A node where a manifest is expected.
    let node = encode::encode_leaf_node(&[(b"k", &encode::Stored::Inline(vec![1]))], "d/x");
    assert!(matches!(
        ocdbt::decode_manifest(&node),
        Err(FormatError::BadMagic { .. })
    ));
}

/// An object with a chosen version and compression byte and a valid crc.
fn object(magic: u32, version: u8, compression: u8, body: &[u8]) -> Vec<u8> {
    let mut o = encode::encode_object(magic, body);
    o[12] = version;
    o[13] = compression;
    let n = o.len();
    let crc = crc32c::crc32c(&o[..n - 4]);
    o[n - 4..].copy_from_slice(&crc.to_le_bytes());
    o
}

#[test]
fn malformed_unknown_version_and_compression_and_length() {
    let m = object(ocdbt::MANIFEST_MAGIC, 1, 0, b"x");
    assert!(matches!(
        ocdbt::decode_manifest(&m),
        Err(FormatError::UnknownVersion { version: 1, .. })
    ));
    let m = object(ocdbt::MANIFEST_MAGIC, 0, 2, b"x");
    assert!(matches!(
        ocdbt::decode_manifest(&m),
        Err(FormatError::UnknownCompression { method: 2, .. })
    ));
    let mut m = encode::encode_manifest([0; 16], 0, None, "d/x");
    m.push(0);
    assert!(matches!(
        ocdbt::decode_manifest(&m),
        Err(FormatError::LengthMismatch { .. })
    ));
    assert!(matches!(
        ocdbt::decode_manifest(&[0x0c, 0xdb]),
        Err(FormatError::TooShort { len: 2, .. })
    ));
    // zstd compression that does not decode.
    let m = object(ocdbt::MANIFEST_MAGIC, 0, 1, b"not zstd");
    assert!(matches!(
        ocdbt::decode_manifest(&m),
        Err(FormatError::Decompress { .. })
    ));
}

#[test]
fn malformed_reference_outside_its_data_file() {
    let (_t, item, _) = scratch_item();
    let root = encode::ChildRef {
        first_key: Vec::new(),
        offset: 1 << 40,
        length: 100,
        num_keys: 1,
        num_tree_bytes: 100,
        num_indirect_value_bytes: 0,
    };
    let data = std::fs::read_dir(item.join("ocdbt.process_0/d"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let rel = format!("ocdbt.process_0/d/{}", data.to_string_lossy());
    std::fs::write(
        item.join("manifest.ocdbt"),
        encode::encode_manifest([0; 16], 0, Some(&root), &rel),
    )
    .unwrap();
    let e = Item::open(&item).unwrap_err();
    let OrbaxError::OutsideFile {
        offset, file_len, ..
    } = &e
    else {
        panic!("{e}")
    };
    assert_eq!(*offset, 1 << 40);
    assert!(*file_len < 1 << 20);

    // A value reference into a missing data file names the file.
    let leaf = encode::encode_leaf_node(
        &[(
            b"a/.zarray".as_slice(),
            &encode::Stored::OutOfLine {
                offset: 0,
                length: 4,
            },
        )],
        "d/nowhere",
    );
    let path = item.join("ocdbt.process_0/d/node");
    std::fs::write(&path, &leaf).unwrap();
    let root = encode::ChildRef {
        length: leaf.len() as u64,
        offset: 0,
        ..root
    };
    std::fs::write(
        item.join("manifest.ocdbt"),
        encode::encode_manifest([0; 16], 0, Some(&root), "ocdbt.process_0/d/node"),
    )
    .unwrap();
    let db = orbax::Ocdbt::open(&item).unwrap();
    let e = db
        .get("a/.zarray")
        .unwrap()
        .read_all("a/.zarray", 100)
        .unwrap_err();
    assert!(e.to_string().contains("d/nowhere"), "{e}");
}

#[test]
fn malformed_missing_chunk_without_fill_value() {
    let t = tempfile::tempdir().unwrap();
    let item = t.path().join("item");
    copy_dir(&golden("plain_zarr2"), &item);
    std::fs::remove_file(item.join("params.w_f32/0.0")).unwrap();
    let it = Item::open(&item).unwrap();
    let e = it
        .array("params.w_f32")
        .unwrap()
        .read_all(1 << 20)
        .unwrap_err();
    let OrbaxError::MissingKey { key, hint, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(key, "params.w_f32/0.0");
    assert!(
        hint.as_deref().unwrap().contains("fill_value is null"),
        "{e}"
    );
    // Streaming rows says the same.
    let a = it.array("params.w_f32").unwrap();
    let mut rows = a.rows(0..3).unwrap();
    assert!(matches!(
        rows.next(),
        Some(Err(OrbaxError::MissingKey { .. }))
    ));

    // zarr v3 has a fill value: a missing shard reads as zeros.
    let item3 = t.path().join("item3");
    copy_dir(&golden("plain_zarr3"), &item3);
    // Shards are (3, 4, 1): shard c/0/0/2 holds every element [i][j][2].
    std::fs::remove_file(item3.join("params.stacked/c/0/0/2")).unwrap();
    let it = Item::open(&item3).unwrap();
    let got = it
        .array("params.stacked")
        .unwrap()
        .read_all(1 << 20)
        .unwrap();
    let exp = expected("basic");
    let mut want = exp
        .iter()
        .find(|l| l.path == ["params", "stacked"])
        .unwrap()
        .bytes
        .clone();
    for i in 0..3 {
        for j in 0..4 {
            let at = ((i * 4 + j) * 5 + 2) * 2;
            want[at] = 0;
            want[at + 1] = 0;
        }
    }
    assert!(got == want, "a missing shard reads as the fill value 0");
}

/// Leaf node body: height 0, no data files, then `rest`.
fn leaf_body(rest: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8, 0u8];
    b.extend_from_slice(rest);
    b
}

#[test]
fn malformed_node_claims_more_entries_than_its_length() {
    let mut rest = Vec::new();
    varint(&mut rest, 1000);
    rest.extend_from_slice(&[1, 1, 1]);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::TooLarge {
            field: "num_entries",
            value: 1000,
            ..
        })
    ));
    // A data-file table claiming 2^40 files.
    let mut b = vec![0u8];
    varint(&mut b, 1 << 40);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &b);
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::TooLarge {
            field: "num_files",
            ..
        })
    ));
    // A node with no entries.
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&[0]));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::Invalid {
            field: "num_entries",
            ..
        })
    ));
}

#[test]
fn malformed_lengths_that_overflow() {
    // One out-of-line value at offset 2^64 - 2, length 10.
    let leaf = encode::encode_leaf_node(
        &[(
            b"k".as_slice(),
            &encode::Stored::OutOfLine {
                offset: u64::MAX - 1,
                length: 10,
            },
        )],
        "d/x",
    );
    assert!(matches!(
        ocdbt::decode_btree_node(&leaf, b"", 1 << 20),
        Err(FormatError::RangeOverflow { index: 0, .. })
    ));
    // A varint of 11 bytes.
    let mut rest = vec![0xff; 10];
    rest.push(0x01);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::BadVarint { .. })
    ));
    // An inline value longer than the node.
    let mut rest = Vec::new();
    varint(&mut rest, 1); // entries
    varint(&mut rest, 1); // key suffix length
    rest.push(b'k');
    varint(&mut rest, 500); // value length
    rest.push(0); // inline
    rest.extend_from_slice(b"short");
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::Truncated { field: "value", .. })
    ));
    // An array whose byte size overflows.
    let z = br#"{"chunks":[1,1],"compressor":null,"dimension_separator":".","dtype":"<f4","fill_value":null,"filters":null,"order":"C","shape":[18446744073709551615,4],"zarr_format":2}"#;
    assert!(matches!(
        zarr::parse_zarray(z),
        Err(FormatError::TooLarge { field: "shape", .. })
    ));
}

#[test]
fn malformed_node_structure() {
    // Keys out of order.
    let mut rest = Vec::new();
    varint(&mut rest, 2);
    varint(&mut rest, 0); // prefix of key 1
    varint(&mut rest, 1);
    varint(&mut rest, 1);
    rest.extend_from_slice(b"ba");
    rest.extend_from_slice(&[0, 0, 0, 0]); // lengths and kinds
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::KeyOrder { index: 1, .. })
    ));
    // A data-file id outside the table.
    let mut rest = Vec::new();
    varint(&mut rest, 1);
    varint(&mut rest, 1);
    rest.push(b'k');
    varint(&mut rest, 4);
    rest.push(1); // out of line
    varint(&mut rest, 3); // file id 3 of 0
    varint(&mut rest, 0);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::FileIdOutOfRange {
            id: 3,
            files: 0,
            ..
        })
    ));
    // A value kind of 7.
    let mut rest = Vec::new();
    varint(&mut rest, 1);
    varint(&mut rest, 1);
    rest.push(b'k');
    varint(&mut rest, 0);
    rest.push(7);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &leaf_body(&rest));
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::Invalid {
            field: "value_kind",
            ..
        })
    ));
    // Bytes after the last field.
    let mut node_body = leaf_body(&[]);
    let good = encode::encode_leaf_node(&[(b"k", &encode::Stored::Inline(vec![1]))], "d/x");
    let decoded_body = &good[14..good.len() - 4];
    node_body.clear();
    node_body.extend_from_slice(decoded_body);
    node_body.push(9);
    let node = encode::encode_object(ocdbt::BTREE_NODE_MAGIC, &node_body);
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 1 << 20),
        Err(FormatError::TrailingBytes { extra: 1, .. })
    ));
    // A zstd-compressed node that decodes past the config's max_decoded_node_bytes.
    let big = encode::encode_leaf_node(&[(b"k", &encode::Stored::Inline(vec![0; 1000]))], "d/x");
    let body = zstd::encode_all(&big[14..big.len() - 4], 3).unwrap();
    let node = object(ocdbt::BTREE_NODE_MAGIC, 0, 1, &body);
    assert!(ocdbt::decode_btree_node(&node, b"", 1 << 20).is_ok());
    assert!(matches!(
        ocdbt::decode_btree_node(&node, b"", 100),
        Err(FormatError::DecodedTooLarge { limit: 100, .. })
    ));
}

#[test]
fn malformed_zarr_metadata_and_chunks() {
    let ok = br#"{"chunks":[2],"compressor":{"id":"zstd","level":1},"dimension_separator":".","dtype":"<f4","fill_value":null,"filters":null,"order":"C","shape":[3],"zarr_format":2}"#;
    assert!(zarr::parse_zarray(ok).is_ok());
    let with = |from: &str, to: &str| {
        let s = String::from_utf8(ok.to_vec()).unwrap().replace(from, to);
        zarr::parse_zarray(s.as_bytes())
    };
    assert!(matches!(
        with("\"C\"", "\"F\""),
        Err(FormatError::Unsupported { .. })
    ));
    assert!(matches!(
        with("<f4", ">f4"),
        Err(FormatError::Unsupported { .. })
    ));
    assert!(matches!(
        with("\"zstd\"", "\"blosc\""),
        Err(FormatError::Unsupported { .. })
    ));
    assert!(matches!(with("[2]", "[0]"), Err(FormatError::Json { .. })));
    assert!(matches!(
        with("[2]", "[2,2]"),
        Err(FormatError::Json { .. })
    ));
    assert!(matches!(
        zarr::parse_zarray(b"{\"zarr_format\":2"),
        Err(FormatError::Json { .. })
    ));
    assert!(matches!(
        zarr::parse_zarr_json(br#"{"zarr_format":3,"node_type":"array","shape":[2],"data_type":"float32","chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},"codecs":[{"name":"bytes","configuration":{"endian":"little"}}],"fill_value":null}"#),
        Err(FormatError::Json { .. })
    ));
    // A chunk that decodes to the wrong length.
    let frame = encode::encode_chunk(&[0u8; 12]).unwrap();
    assert!(matches!(
        zarr::decode_chunk(&frame, zarr::Compressor::Zstd, false, 8),
        Err(FormatError::DecodedTooLarge { .. })
    ));
    assert!(matches!(
        zarr::decode_chunk(&frame, zarr::Compressor::Zstd, false, 16),
        Err(FormatError::Invalid {
            field: "decoded length",
            ..
        })
    ));
    // Shard index: crc mismatch, and an entry outside the shard.
    let mut idx = Vec::new();
    idx.extend_from_slice(&0u64.to_le_bytes());
    idx.extend_from_slice(&8u64.to_le_bytes());
    let crc = crc32c::crc32c(&idx);
    let mut good = idx.clone();
    good.extend_from_slice(&crc.to_le_bytes());
    assert_eq!(
        zarr::parse_shard_index(&good, 1, true, 100).unwrap(),
        vec![Some((0, 8))]
    );
    let mut bad = good.clone();
    bad[0] ^= 1;
    assert!(matches!(
        zarr::parse_shard_index(&bad, 1, true, 100),
        Err(FormatError::CrcMismatch { .. })
    ));
    assert!(matches!(
        zarr::parse_shard_index(&good, 1, true, 4),
        Err(FormatError::Invalid {
            field: "offset",
            ..
        })
    ));
}

#[test]
fn malformed_metadata_json() {
    use wanbake::format::orbax::metadata;
    assert!(matches!(
        metadata::parse_tree_metadata(b"[]"),
        Err(FormatError::Json { .. })
    ));
    assert!(matches!(
        metadata::parse_tree_metadata(b"{\"params\": {}}"),
        Err(FormatError::Unsupported { .. })
    ));
    // Two leaves with one array name.
    let dup = br#"{"tree_metadata": {"('a.b',)": {"key_metadata": [{"key": "a.b", "key_type": 2}], "value_metadata": {"value_type": "jax.Array"}}, "('a', 'b')": {"key_metadata": [{"key": "a", "key_type": 2}, {"key": "b", "key_type": 2}], "value_metadata": {"value_type": "jax.Array"}}}}"#;
    assert!(matches!(
        metadata::parse_tree_metadata(dup),
        Err(FormatError::Json { .. })
    ));
    assert!(matches!(
        metadata::parse_checkpoint_metadata(br#"{"custom_metadata": 3}"#),
        Err(FormatError::Json { .. })
    ));
    // The file's path is in the message.
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("_METADATA"), b"{").unwrap();
    let e = Item::open(t.path()).unwrap_err();
    assert!(e.to_string().contains("_METADATA"), "{e}");
}

/// A deterministic stand-in for the fuzz target (CI has no cargo-fuzz): every truncation and
/// a sweep of byte changes of real objects, with the crc fixed up so the body parsers see
/// them, must give Ok or Err, never a panic.
#[test]
fn parsers_survive_mutated_real_objects() {
    let (_t, item, data) = scratch_item();
    let manifest = std::fs::read(item.join("manifest.ocdbt")).unwrap();
    let df = std::fs::read(item.join(&data)).unwrap();
    let db = orbax::Ocdbt::open(&item).unwrap();
    let root = db.manifest.latest().unwrap().root.clone().unwrap();
    let node = df[root.offset as usize..(root.offset + root.length) as usize].to_vec();
    let real_manifest = std::fs::read(golden("ocdbt_zarr2/manifest.ocdbt")).unwrap();
    let zarray = std::fs::read(golden("plain_zarr2/params.w_bf16/.zarray")).unwrap();
    let zjson = std::fs::read(golden("plain_zarr3/params.stacked/zarr.json")).unwrap();
    let meta = std::fs::read(golden("jax_arrays/_METADATA")).unwrap();
    let fix_crc = |b: &mut Vec<u8>| {
        if b.len() >= 16 {
            let n = b.len();
            let len = (n as u64).to_le_bytes();
            b[4..12].copy_from_slice(&len);
            let crc = crc32c::crc32c(&b[..n - 4]);
            b[n - 4..].copy_from_slice(&crc.to_le_bytes());
        }
    };
    let all = |b: &[u8]| {
        let _ = ocdbt::decode_manifest(b);
        let _ = ocdbt::decode_btree_node(b, b"", 1 << 20);
        let _ = ocdbt::decode_version_node(b, b"", 4);
        let _ = zarr::parse_zarray(b);
        let _ = zarr::parse_zarr_json(b);
        let _ = wanbake::format::orbax::metadata::parse_tree_metadata(b);
    };
    for obj in [&manifest, &node, &real_manifest] {
        for cut in 0..obj.len() {
            all(&obj[..cut]);
            // The same length inside a valid envelope: the body parser sees the cut.
            let mut b = obj[..cut.max(16)].to_vec();
            fix_crc(&mut b);
            all(&b);
        }
        for i in 14..obj.len().saturating_sub(4) {
            for x in [0x00u8, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = obj.clone();
                b[i] = x;
                fix_crc(&mut b);
                all(&b);
            }
        }
    }
    for doc in [&zarray, &zjson, &meta] {
        for cut in 0..doc.len() {
            all(&doc[..cut]);
        }
        for i in 0..doc.len() {
            for x in [b'0', b'9', b'-', b'"', b'[', b'{', b'}', b'x'] {
                let mut b = doc.clone();
                b[i] = x;
                all(&b);
            }
        }
    }
}

#[test]
fn multi_generation_database_reads_its_latest_version() {
    let db = orbax::Ocdbt::open(&golden("multigen")).unwrap();
    let text = std::fs::read_to_string(golden("expected.json")).unwrap();
    let v: Json = serde_json::from_str(&text).unwrap();
    let want = v["multigen"].as_object().unwrap();
    let keys: Vec<&str> = db.entries().map(|(k, _)| k).collect();
    assert_eq!(keys, want.keys().map(String::as_str).collect::<Vec<_>>());
    let mut indirect = 0;
    for (k, hexv) in want {
        let val = db.get(k).unwrap();
        indirect += usize::from(matches!(val, orbax::Value::Range { .. }));
        assert_eq!(
            val.read_all(k, 1 << 20).unwrap(),
            hex(hexv.as_str().unwrap()),
            "{k}"
        );
    }
    assert!(indirect > 0, "some values are out of line");
    let m = &db.manifest;
    // Generation 1 is the empty database tensorstore creates, then one per write.
    assert_eq!(m.latest().unwrap().generation, 21);
    // Generations 1..=16 left the manifest for a version-tree leaf node.
    assert!(!m.version_nodes.is_empty(), "{m:?}");
    let inline_first = m.versions[0].generation;
    // Follow every version-tree node down to its leaves: together they hold every older
    // generation exactly once.
    let mut older = Vec::new();
    let mut todo: Vec<ocdbt::VersionNodeRef> = m.version_nodes.clone();
    while let Some(n) = todo.pop() {
        match db.read_version_node(&n).unwrap() {
            ocdbt::VersionNode::Leaf(vs) => {
                assert_eq!(n.height, 0);
                assert_eq!(vs.last().unwrap().generation, n.generation);
                older.extend(vs.iter().map(|v| v.generation));
            }
            ocdbt::VersionNode::Interior(h, children) => {
                assert_eq!(h, n.height);
                todo.extend(children);
            }
        }
    }
    older.sort();
    assert_eq!(older, (1..inline_first).collect::<Vec<u64>>());
}

#[test]
fn a_large_single_chunk_array_streams_row_by_row() {
    // One chunk of (6, 128, 256) bf16, out of line: rows come from one zstd stream.
    let data = bf16_bytes(11, 6 * 128 * 256);
    let arrays = [ArrayIn {
        keys: vec!["blocks".into(), "ffn".into(), "kernel".into()],
        dtype: DType::BF16,
        shape: vec![6, 128, 256],
        data: &data,
    }];
    let dir = tempfile::tempdir().unwrap();
    let files = encode::encode_item(&arrays, encode::DEFAULT_NODE_BUDGET).unwrap();
    write_tree(dir.path(), &files);
    let item = Item::open(dir.path()).unwrap();
    let a = item.array("blocks.ffn.kernel").unwrap();
    assert_eq!(a.meta().grid(), [1, 1, 1]);
    let rb = a.row_bytes() as usize;
    assert_eq!(rb, 128 * 256 * 2);
    for (i, r) in a.rows(2..6).unwrap().enumerate() {
        let (row, bytes) = r.unwrap();
        assert_eq!(row as usize, i + 2);
        assert!(bytes == data[(i + 2) * rb..(i + 3) * rb], "row {row}");
    }
    // A limit below the array's size refuses the whole read but not the rows.
    assert!(a.read_all(1000).is_err());
}

#[test]
fn malformed_tree_reaching_a_node_twice() {
    // An interior root whose two children are the same leaf: its key is reached twice.
    let t = tempfile::tempdir().unwrap();
    let leaf = encode::encode_leaf_node(
        &[(b"k".as_slice(), &encode::Stored::Inline(vec![1]))],
        "d/x",
    );
    let child = |first: &[u8]| encode::ChildRef {
        first_key: first.to_vec(),
        offset: 0,
        length: leaf.len() as u64,
        num_keys: 1,
        num_tree_bytes: leaf.len() as u64,
        num_indirect_value_bytes: 0,
    };
    let root = encode::encode_interior_node(1, &[child(b"a"), child(b"b")], "d/x");
    let mut file = leaf.clone();
    file.extend_from_slice(&root);
    std::fs::create_dir_all(t.path().join("d")).unwrap();
    std::fs::write(t.path().join("d/x"), &file).unwrap();
    let root_ref = encode::ChildRef {
        first_key: b"a".to_vec(),
        offset: leaf.len() as u64,
        length: root.len() as u64,
        num_keys: 2,
        num_tree_bytes: 0,
        num_indirect_value_bytes: 0,
    };
    std::fs::write(
        t.path().join("manifest.ocdbt"),
        encode::encode_manifest([0; 16], 1, Some(&root_ref), "d/x"),
    )
    .unwrap();
    let e = orbax::Ocdbt::open(t.path()).unwrap_err();
    assert!(e.to_string().contains("reached twice"), "{e}");
    // A child whose height is not its parent's minus one.
    std::fs::write(
        t.path().join("manifest.ocdbt"),
        encode::encode_manifest([0; 16], 3, Some(&root_ref), "d/x"),
    )
    .unwrap();
    let e = orbax::Ocdbt::open(t.path()).unwrap_err();
    assert!(
        matches!(
            format_err(&e),
            FormatError::Invalid {
                field: "height",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn malformed_data_file_path_leaving_the_database() {
    let (_t, item, _) = scratch_item();
    let root = encode::ChildRef {
        first_key: Vec::new(),
        offset: 0,
        length: 100,
        num_keys: 1,
        num_tree_bytes: 100,
        num_indirect_value_bytes: 0,
    };
    for path in ["../secret", "/etc/passwd", "d/./x"] {
        std::fs::write(
            item.join("manifest.ocdbt"),
            encode::encode_manifest([0; 16], 0, Some(&root), path),
        )
        .unwrap();
        let e = Item::open(&item).unwrap_err();
        assert!(
            matches!(format_err(&e), FormatError::Invalid { field: "path", .. }),
            "{path}: {e}"
        );
    }
}
