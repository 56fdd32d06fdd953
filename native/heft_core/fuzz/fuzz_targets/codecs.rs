//! Whatever `compress::compress` keeps, with every compression (zlib at
//! any level, lz4, zstd at any level, zstd with a dictionary trained or
//! taken from the input), unpacks to the input exactly; a body it stores
//! raw is one that would not have paid.
//!
//! Input: mode selector, level, dictionary length, the dictionary, then
//! the body.
#![no_main]
use heft_core::compress::{compress, unpack, Codec, Compression};
use heft_core::dict::Dictionaries;
use heft_core::record::Header;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let level = i32::from(data[1] % 22) + 1;
    let mode = match data[0] % 5 {
        0 => Compression::None,
        1 => Compression::Zlib(u32::from(data[1] % 10)),
        2 => Compression::Lz4,
        3 => Compression::Zstd { level, dict: false },
        _ => Compression::Zstd { level, dict: true },
    };
    let dict_len = usize::from(data[2]).min(data.len() - 3);
    let (dict, body) = data[3..].split_at(dict_len);
    let dicts = Dictionaries::new(level);
    if !dict.is_empty() {
        let d = dicts.add(dict).expect("a non-empty dictionary is taken");
        dicts.set_current(d.id());
    }
    let mut packed = Vec::new();
    let p = compress(body, mode, &dicts, &mut packed);
    if p.codec == Codec::Raw {
        assert!(packed.is_empty());
        return;
    }
    assert!(packed.len() < body.len(), "{mode:?} kept a body that grew");
    let h = Header {
        codec: p.codec,
        dict: p.dict,
        header_len: 0,
        key_len: 0,
        stored_len: packed.len(),
        raw_len: body.len(),
    };
    let mut back = Vec::new();
    let got = unpack(&h, &packed, &dicts, &mut back).expect("what compress kept unpacks");
    assert_eq!(got, body, "{mode:?}");
});
