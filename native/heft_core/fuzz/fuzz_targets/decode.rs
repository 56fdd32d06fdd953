//! Arbitrary bytes as a term, a key and a record header: decoding may fail,
//! never panic, and whatever decodes re-encodes to the same bytes when it
//! holds no back-references. The lean path (`decode_record`) decodes
//! exactly what the id-keeping decoder does, hint or no hint.
#![no_main]
use heft_core::codec::{decode, decode_record, skip, Scratch, ValueBuilder};
use heft_core::record::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Header::parse(data);
    let _ = skip(data);
    let (key, body) = data.split_at(data.len() / 3);
    let full = decode(body, Some(key), &mut ValueBuilder);
    for known_unshared in [false, true] {
        let lean = decode_record(
            body,
            Some(key),
            known_unshared,
            &mut ValueBuilder,
            &mut Scratch::default(),
        );
        assert_eq!(lean.is_ok(), full.is_ok(), "{lean:?} vs {full:?}");
        if let (Ok(l), Ok(f)) = (&lean, &full) {
            assert_eq!(l, f);
        }
    }
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
