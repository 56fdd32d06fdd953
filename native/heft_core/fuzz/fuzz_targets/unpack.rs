//! Arbitrary bytes as the stored body of every codec, with and without a
//! dictionary (itself arbitrary bytes: zstd takes any bytes as a raw-content
//! dictionary), under any claimed raw length and dictionary id:
//! `compress::unpack` answers the body or `CorruptBody`, never panics, and
//! a body it answers has exactly the claimed length.
//!
//! Input: codec selector, dictionary id, raw length (3 bytes, shifted by
//! up to 40 bits: any size, up to far beyond what fits in memory),
//! dictionary length, the dictionary, then the stored body.
#![no_main]
use heft_core::compress::{unpack, Codec};
use heft_core::dict::Dictionaries;
use heft_core::record::Header;
use libfuzzer_sys::fuzz_target;

const CODECS: [Codec; 6] = [
    Codec::Raw,
    Codec::Deflate,
    Codec::Zstd,
    Codec::Lz4,
    Codec::ZstdDict,
    Codec::ZstdBlock,
];

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let codec = CODECS[usize::from(data[0]) % CODECS.len()];
    // 0 (none), 1 (the one below), 2.. (missing).
    let dict_id = u32::from(data[1] % 4);
    let shift = u32::from(data[1] >> 2) % 41;
    let raw_len =
        (usize::from(data[2]) | (usize::from(data[3]) << 8) | (usize::from(data[4]) << 16))
            << shift;
    let dict_len = usize::from(data[5]).min(data.len() - 6);
    let (dict, stored) = data[6..].split_at(dict_len);
    let dicts = Dictionaries::new(3);
    if !dict.is_empty() {
        let d = dicts.add(dict).expect("a non-empty dictionary is taken");
        dicts.set_current(d.id());
    }
    let h = Header {
        codec,
        dict: if codec.uses_dict() { dict_id } else { 0 },
        header_len: 0,
        key_len: 0,
        stored_len: stored.len(),
        raw_len: if codec == Codec::Raw {
            stored.len()
        } else {
            raw_len
        },
    };
    let mut out = Vec::new();
    if let Ok(body) = unpack(&h, stored, &dicts, &mut out) {
        assert_eq!(body.len(), h.raw_len, "{codec:?}");
    }
    // The same bytes against a table with no dictionaries.
    let _ = unpack(&h, stored, &Dictionaries::new(3), &mut out);
});
