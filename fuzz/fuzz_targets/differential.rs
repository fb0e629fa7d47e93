//! Differential check of the hand-written header parser against the reference reader (the
//! safetensors crate): wanbake is stricter by design, never looser. Any input that
//! `Header::parse` accepts must be accepted by `SafeTensors::deserialize`, with the same
//! header length, tensors, dtypes, shapes, data offsets (begin and end relative to the data
//! section, and where each tensor's bytes really are) and `__metadata__` map.
//!
//! `tests/io.rs` (`the_header_parser_never_accepts_what_the_safetensors_crate_rejects`)
//! makes the same comparisons on seeded mutations in every `cargo test`; change both
//! together. Seeds: `fuzz/seeds/differential/` (README, Development).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use wanbake::format::header::Header;

fuzz_target!(|data: &[u8]| {
    let Ok(ours) = Header::parse(data) else {
        return;
    };
    let theirs = match safetensors::SafeTensors::deserialize(data) {
        Ok(t) => t,
        Err(e) => panic!("wanbake accepts what safetensors rejects: {e:?}"),
    };
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(data).expect("deserialized");
    assert_eq!(ours.data_start, 8 + header_len, "data section start");
    let their_map: BTreeMap<String, String> = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert_eq!(ours.metadata, their_map, "__metadata__");
    assert_eq!(ours.tensors.len(), theirs.len());
    assert_eq!(ours.tensors.len(), meta.tensors().len());
    for t in &ours.tensors {
        let v = theirs.tensor(&t.name).expect("same names");
        let info = meta.info(&t.name).expect("same names");
        assert_eq!(format!("{:?}", v.dtype()), t.dtype.as_str(), "{}", t.name);
        assert_eq!(v.shape(), t.shape.as_slice(), "{}", t.name);
        assert_eq!(info.data_offsets, (t.begin, t.end), "{}", t.name);
        assert_eq!(v.data().len(), t.end - t.begin, "{}", t.name);
        // Where the reference reader's view of the tensor lies in the file.
        let at = v.data().as_ptr() as usize - data.as_ptr() as usize;
        assert_eq!(at, ours.data_start + t.begin, "{}", t.name);
    }
});
