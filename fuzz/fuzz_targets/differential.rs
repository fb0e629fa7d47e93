//! Differential check of the hand-written header parser against the reference reader (the
//! safetensors crate): wanbake is stricter by design, never looser. Any input that
//! `Header::parse` accepts must be accepted by `SafeTensors::deserialize`, with the same
//! tensors, dtypes, shapes and data lengths.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wanbake::io::Header;

fuzz_target!(|data: &[u8]| {
    let Ok(ours) = Header::parse(data) else {
        return;
    };
    let theirs = match safetensors::SafeTensors::deserialize(data) {
        Ok(t) => t,
        Err(e) => panic!("wanbake accepts what safetensors rejects: {e:?}"),
    };
    assert_eq!(ours.tensors.len(), theirs.len());
    for t in &ours.tensors {
        let v = theirs.tensor(&t.name).expect("same names");
        assert_eq!(format!("{:?}", v.dtype()), t.dtype.as_str());
        assert_eq!(v.shape(), t.shape.as_slice());
        assert_eq!(v.data().len(), t.end - t.begin);
    }
});
