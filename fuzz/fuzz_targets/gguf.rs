//! Feeds arbitrary bytes to the GGUF parser (`wanbake::format::gguf::parse`): it must return Ok or
//! Err, never panic, overflow or allocate without bound. A successful parse is re-checked: every
//! tensor's data is aligned, lies inside the file, overlaps no other, its row is whole blocks,
//! and it decodes (`ggml::dequantize`) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wanbake::format::gguf;
use wanbake::codec::ggml;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = gguf::parse(data) {
        assert!(g.alignment.is_power_of_two());
        let mut spans = Vec::new();
        for (i, t) in g.tensors.iter().enumerate() {
            let r = g.range(i);
            assert!(r.end <= data.len());
            assert_eq!(r.start as u64 % g.alignment, 0);
            assert_eq!(t.ne[0] % t.ty.block_size() as u64, 0);
            spans.push((r.start, r.end));
            let n = t.numel().unwrap() as usize;
            // Bounded by the bytes the file holds (Q2_K, the densest type: 256 in 84 bytes).
            assert!(n <= 4 * r.len());
            let mut out = vec![0f32; n];
            ggml::dequantize(t.ty, &data[r], &mut out);
        }
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[1].0 >= w[0].1);
        }
    }
});
