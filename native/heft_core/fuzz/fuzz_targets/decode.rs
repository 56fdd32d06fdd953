//! Arbitrary bytes as a term, a key and a record header: decoding may fail,
//! never panic, and whatever decodes re-encodes to the same bytes when it
//! holds no back-references.
#![no_main]
use heft_core::codec::{decode, skip, ValueBuilder};
use heft_core::record::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Header::parse(data);
    let _ = skip(data);
    let (key, body) = data.split_at(data.len() / 3);
    let _ = decode(body, Some(key), &mut ValueBuilder);
    if let Ok(v) = decode(data, None, &mut ValueBuilder) {
        if !data.contains(&heft_core::codec::tag::REF) {
            // Canonical forms only: small ints, small atoms and small tuples
            // always use their one-byte tags when they can.
            let again = v.to_bytes();
            let back = decode(&again, None, &mut ValueBuilder).expect("re-encoding decodes");
            assert_eq!(back, v);
        }
    }
});
