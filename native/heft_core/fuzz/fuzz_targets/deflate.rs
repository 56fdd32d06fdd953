//! Whatever Heft's compressor keeps must inflate to the input exactly; the
//! in-house inflater accepts exactly what flate2 accepts.
#![no_main]
use flate2::{Decompress, FlushDecompress, Status};
use heft_core::compress::{compress, decompress, Codec, Compression};
use heft_core::dict::Dictionaries;
use heft_core::deflate::{inflate, InflateError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let level = data.first().map_or(1, |b| u32::from(*b % 10));
    let mut packed = Vec::new();
    let dicts = Dictionaries::new(3);
    if compress(data, Compression::Zlib(level), &dicts, &mut packed).codec == Codec::Deflate {
        let mut back = Vec::new();
        decompress(&packed, data.len(), &mut back).expect("our own output inflates");
        assert_eq!(back, data);
    }
    // Arbitrary bytes claimed to be deflate: an error, never a panic.
    let mut out = Vec::new();
    let _ = decompress(data, data.len() * 3, &mut out);
    // The in-house inflater agrees with flate2 (where it does not defer a
    // dynamic block to it), for a few claimed lengths.
    for len in [data.len() / 2, data.len() * 3, usize::from(data.get(1).copied().unwrap_or(0)) * 16] {
        let mut d = Decompress::new(false);
        let mut theirs = Vec::with_capacity(len);
        let theirs = match d.decompress_vec(data, &mut theirs, FlushDecompress::Finish) {
            Ok(Status::StreamEnd) if theirs.len() == len && d.total_in() == data.len() as u64 => {
                Some(theirs)
            }
            _ => None,
        };
        match inflate(data, len, &mut out) {
            Ok(()) => assert_eq!(Some(out.clone()), theirs),
            Err(InflateError::Corrupt) => assert_eq!(theirs, None),
            Err(InflateError::Dynamic) => {}
        }
    }
});
