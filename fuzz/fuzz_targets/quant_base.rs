//! Feeds arbitrary bytes, as a `.safetensors` file, to the quantized-base reader
//! (`quant::base::open_checkpoint`: format recognition, `quant::layers`' plans of comfy_quant
//! JSON, headers, scale shapes, and every `codec` decoder): it must return Ok or Err, never
//! panic or allocate without bound. A decoded checkpoint is re-checked: no side tensor of any
//! quantized format survives into it, and every tensor's bytes are its dtype times its shape.
//! Seeds worth giving it: the files of `golden/quant_base/` and `golden/quant_base/bad/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wanbake::quant::{base, convention};

fuzz_target!(|data: &[u8]| {
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("fuzz.safetensors");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(ck) = base::open_checkpoint(&path) {
        for c in &ck.components {
            for t in c.tensors.tensors() {
                assert!(!convention::is_side_tensor(t.view.name), "{}", t.view.name);
                assert_eq!(Some(t.view.bytes.len()), t.view.dtype.byte_len(t.view.numel()));
            }
        }
    }
});
