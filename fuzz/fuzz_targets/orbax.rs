//! Feeds arbitrary bytes to every parser of the Orbax layer (OCDBT manifest, B+tree node,
//! version-tree node, zarr `.zarray` / `zarr.json`, shard index, `_METADATA`,
//! `_CHECKPOINT_METADATA`, chunk decoding): each must return Ok or Err, never panic,
//! overflow or allocate without bound. A decoded leaf's inline values must fit the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wanbake::format::orbax::{metadata, ocdbt, zarr};

fuzz_target!(|data: &[u8]| {
    let _ = ocdbt::decode_manifest(data);
    if let Ok(ocdbt::BtreeNode::Leaf(entries)) = ocdbt::decode_btree_node(data, b"t/", 1 << 20)
    {
        for e in &entries {
            if let ocdbt::LeafValue::Inline(v) = &e.value {
                assert!(v.len() <= 1 << 20);
            }
        }
    }
    let _ = ocdbt::decode_version_node(data, b"", 4);
    if let Ok(m) = zarr::parse_zarray(data) {
        assert_eq!(m.shape.len(), m.chunk_shape.len());
        let _ = m.grid();
    }
    if let Ok(m) = zarr::parse_zarr_json(data) {
        let _ = m.grid();
    }
    if let Some((&n, rest)) = data.split_first() {
        let _ = zarr::parse_shard_index(rest, usize::from(n), n % 2 == 0, 1 << 20);
        let _ = zarr::decode_chunk(rest, zarr::Compressor::Zstd, n % 2 == 0, u64::from(n) * 16);
    }
    let _ = metadata::parse_tree_metadata(data);
    let _ = metadata::parse_checkpoint_metadata(data);
});
