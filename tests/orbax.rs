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
