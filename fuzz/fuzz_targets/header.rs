//! Feeds arbitrary bytes to the safetensors header parser: it must return Ok or Err, never
//! panic, overflow or allocate without bound. Successful parses are re-checked: every range
//! lies inside the data section and the ranges tile it exactly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wanbake::format::header::Header;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::parse(data) {
        let data_len = data.len() - h.data_start;
        let mut cursor = 0;
        for t in &h.tensors {
            assert_eq!(t.begin, cursor);
            assert!(t.end <= data_len);
            cursor = t.end;
        }
        assert_eq!(cursor, data_len);
    }
});
