//! Whatever Heft's compressor keeps must inflate to the input exactly.
#![no_main]
use heft_core::compress::{compress, decompress, Codec, Compression};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let level = data.first().map_or(1, |b| u32::from(*b % 10));
    let mut packed = Vec::new();
    if compress(data, Compression::Zlib(level), &mut packed) == Codec::Deflate {
        let mut back = Vec::new();
        decompress(&packed, data.len(), &mut back).expect("our own output inflates");
        assert_eq!(back, data);
    }
    // Arbitrary bytes claimed to be deflate: an error, never a panic.
    let mut out = Vec::new();
    let _ = decompress(data, data.len() * 3, &mut out);
});
