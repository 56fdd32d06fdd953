//! What records like a few samples would take in a table with a given
//! compression, found by compressing the samples the way a table does
//! (`Heft.Memory.sizing/3` through the NIF in heft_nif's sizing.rs).
//!
//! Each sample is a record as a table encodes it: its canonical key and its
//! body (heft_nif's codec.rs). For each compression the body goes through
//! [`compress::compress`] and the record through [`record::write`]'s
//! layout, exactly as [`crate::Table::prepare`] does, so the stored bytes
//! are those a table would hold: header, key, stored body; and the arena
//! bytes are those bytes rounded up to the arena's size classes.
//!
//! A dictionary compression (`Zstd { dict: true }`) is predicted for records
//! the dictionary has not seen: each quarter of the samples is compressed
//! with a dictionary trained on the other three quarters (four-fold
//! cross-validation). A table trains
//! on some of its records and compresses the many others, so a dictionary
//! judged on its own training samples would promise too much. When
//! training fails (too few or too small samples), the prediction is that of
//! a table that has no dictionary yet: plain zstd, and `trained` false.
//!
//! Decode time is that of [`compress::unpack`] alone (the term decoding
//! that follows is the same for every codec): the least of three passes
//! over the records, per record. It is measured, so it depends on the
//! machine and its load; nothing checks it against a figure.

use std::time::Instant;

use crate::arena;
use crate::compress::{self, Codec, Compression};
use crate::dict::{self, Dictionaries};
use crate::record::{self, Header};
use crate::table::learn;

/// What records like the samples take with one compression.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub mode: Compression,
    /// Samples measured.
    pub records: usize,
    /// Keys and bodies as encoded (a table's `payload_raw_bytes`).
    pub raw_bytes: u64,
    /// Whole records as stored: header, key, stored body (a table's
    /// `payload_stored_bytes`).
    pub stored_bytes: u64,
    /// The arena blocks those records take (size classes included).
    pub arena_bytes: u64,
    /// Records whose body was stored compressed.
    pub compressed: usize,
    /// For a dictionary compression: whether a dictionary could be
    /// trained; the bytes of one (the largest of the folds') and the
    /// memory it takes in a table (its bytes and both digests).
    pub trained: bool,
    pub dict_bytes: usize,
    pub dict_memory: usize,
    /// Nanoseconds to decompress one record's body, on average.
    pub decode_ns: f64,
}

/// Predicts what the records `samples` (key, body) take with `mode`; a
/// dictionary compression trains dictionaries sized as a table sizes its
/// own ([`learn::dict_size`]: a tenth of the training samples' bytes,
/// between 1 KiB and `dict_max`).
pub fn predict<K: AsRef<[u8]>, B: AsRef<[u8]>>(
    samples: &[(K, B)],
    mode: Compression,
    dict_max: usize,
) -> Prediction {
    let level = match mode {
        Compression::Zstd { level, .. } => level,
        _ => compress::ZSTD_DEFAULT_LEVEL,
    };
    let mut p = Prediction {
        mode,
        records: samples.len(),
        raw_bytes: 0,
        stored_bytes: 0,
        arena_bytes: 0,
        compressed: 0,
        trained: false,
        dict_bytes: 0,
        dict_memory: 0,
        decode_ns: 0.0,
    };
    let all: Vec<usize> = (0..samples.len()).collect();
    let folds = match mode {
        Compression::Zstd { dict: true, .. } => dictionary_folds(samples, level, dict_max),
        _ => None,
    };
    let mut decode_ns = 0.0;
    match folds {
        Some(folds) => {
            p.trained = true;
            for (dicts, measured) in &folds {
                let d = dicts.current().expect("a trained dictionary is current");
                p.dict_bytes = p.dict_bytes.max(d.bytes().len());
                p.dict_memory = p.dict_memory.max(d.memory());
                decode_ns += measure(samples, measured, mode, dicts, &mut p);
            }
        }
        None => decode_ns = measure(samples, &all, mode, &Dictionaries::new(level), &mut p),
    }
    p.decode_ns = if samples.is_empty() {
        0.0
    } else {
        decode_ns / samples.len() as f64
    };
    p
}

/// Folds of the cross-validation: each measures a quarter of the samples
/// with a dictionary trained on the other three quarters.
const FOLDS: usize = 4;

/// [`FOLDS`] (dictionaries, records to measure): fold `f` measures the
/// samples at positions `f`, `f + FOLDS`, ... with a dictionary trained on
/// all the others. None if one cannot be trained.
fn dictionary_folds<K, B: AsRef<[u8]>>(
    samples: &[(K, B)],
    level: i32,
    dict_max: usize,
) -> Option<Vec<(Dictionaries, Vec<usize>)>> {
    let mut folds = Vec::with_capacity(FOLDS);
    for f in 0..FOLDS {
        let (measured, training): (Vec<usize>, Vec<usize>) =
            (0..samples.len()).partition(|i| i % FOLDS == f);
        let bodies: Vec<&[u8]> = training.iter().map(|&i| samples[i].1.as_ref()).collect();
        let bytes = bodies.iter().map(|b| b.len()).sum();
        let trained = dict::train(&bodies, learn::dict_size(bytes, dict_max), level).ok()?;
        let dicts = Dictionaries::new(level);
        let d = dicts.add(&trained).ok()?;
        dicts.set_current(d.id());
        folds.push((dicts, measured));
    }
    Some(folds)
}

/// Adds the records at `which` compressed with `mode` and `dicts` to `p`;
/// returns the nanoseconds their bodies take to decompress (least of
/// three passes).
fn measure<K: AsRef<[u8]>, B: AsRef<[u8]>>(
    samples: &[(K, B)],
    which: &[usize],
    mode: Compression,
    dicts: &Dictionaries,
    p: &mut Prediction,
) -> f64 {
    let records = which.iter().map(|&i| {
        let (key, body) = (samples[i].0.as_ref(), samples[i].1.as_ref());
        p.raw_bytes += (key.len() + body.len()) as u64;
        (key.len(), body)
    });
    let mut each = |total: usize, compressed: bool| {
        p.stored_bytes += total as u64;
        p.arena_bytes += arena::class_size(arena::class_of(total)) as u64;
        p.compressed += usize::from(compressed);
    };
    pack_and_time(records, mode, dicts, &mut each) as f64
}

/// Compresses each record's body (given with its key's length) as a table
/// with `mode` and `dicts` would, calling `each` with the whole record's
/// stored length (header, key, body) and whether its body was compressed;
/// then decompresses them all three times. The nanoseconds of the fastest
/// pass. What Heft.Memory.sizing/3 predicts and a table's `:auto` rule
/// (learn.rs) chooses by.
pub(crate) fn pack_and_time<'a>(
    records: impl Iterator<Item = (usize, &'a [u8])>,
    mode: Compression,
    dicts: &Dictionaries,
    each: &mut dyn FnMut(usize, bool),
) -> u128 {
    let mut out = Vec::new();
    let mut stored = Vec::new();
    for (key_len, body) in records {
        let packed = compress::compress(body, mode, dicts, &mut out);
        let kept: &[u8] = if packed.codec == Codec::Raw {
            body
        } else {
            &out
        };
        let header_len = record::header_len(packed, key_len, kept.len(), body.len());
        each(
            header_len + key_len + kept.len(),
            packed.codec != Codec::Raw,
        );
        let h = Header {
            codec: packed.codec,
            dict: packed.dict,
            header_len,
            key_len,
            stored_len: kept.len(),
            raw_len: body.len(),
        };
        stored.push((h, kept.to_vec()));
    }
    let mut back = Vec::new();
    let mut best = u128::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        for (h, bytes) in &stored {
            let body = compress::unpack(h, bytes, dicts, &mut back)
                .expect("a body compress() made unpacks");
            std::hint::black_box(body);
        }
        best = best.min(t0.elapsed().as_nanos());
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Kind, Options};
    use crate::Table;

    /// Records shaped like the bench's small map: a short varying key and
    /// a body of field names and values.
    fn records(n: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|i| {
                let key = crate::codec::Value::Int(i as i64).to_bytes();
                let body = format!(
                    "{{\"id\":{i},\"name\":\"user-{i}\",\"age\":{},\"plan\":\"free\"}}",
                    i % 90
                )
                .into_bytes();
                (key, body)
            })
            .collect()
    }

    const MODES: [Compression; 5] = [
        Compression::None,
        Compression::Zlib(1),
        Compression::Lz4,
        Compression::Zstd {
            level: 3,
            dict: false,
        },
        Compression::Zstd {
            level: 3,
            dict: true,
        },
    ];

    /// A real table with `mode` holding `recs` (a dictionary table gets
    /// one trained on `train`, as the table's own training would).
    fn stored_in_table(
        recs: &[(Vec<u8>, Vec<u8>)],
        train: &[(Vec<u8>, Vec<u8>)],
        mode: Compression,
    ) -> crate::Stats {
        let t = Table::new(&Options {
            backing: crate::Backing::Memory,
            compression: mode,
            label: "sizing".into(),
            kind: Kind::Set,
        })
        .unwrap();
        if let Compression::Zstd { dict: true, level } = mode {
            let bodies: Vec<&[u8]> = train.iter().map(|(_, b)| b.as_slice()).collect();
            let d = t
                .dictionaries()
                .add(&dict::train(&bodies, 16 * 1024, level).unwrap())
                .unwrap();
            t.dictionaries().set_current(d.id());
        }
        let prepared: Vec<_> = recs.iter().map(|(k, b)| t.prepare(k, b)).collect();
        t.insert(&prepared).unwrap();
        t.stats().unwrap()
    }

    #[test]
    fn predictions_match_what_a_table_stores_with_each_codec() {
        let samples = records(2000);
        for mode in MODES {
            let p = predict(&samples, mode, 16 * 1024);
            assert_eq!(p.records, 2000);
            // The table holds the samples; a dictionary table's dictionary
            // is trained on other records like them (a table compresses
            // many records its dictionary never saw).
            let others = records(4000).split_off(2000);
            let s = stored_in_table(&samples, &others, mode);
            assert_eq!(s.size, 2000);
            let (predicted, real) = (p.stored_bytes as f64, s.payload_stored_bytes as f64);
            // Dictionary blocks show which records a dictionary was
            // trained on (the folds' vs the table's): within 8% there.
            let within = if matches!(mode, Compression::Zstd { dict: true, .. }) {
                0.08
            } else {
                0.05
            };
            assert!(
                (predicted - real).abs() <= within * real,
                "{mode:?}: predicted {predicted} stored bytes, a table stores {real}"
            );
            let (predicted, real) = (p.arena_bytes as f64, s.arena_live_bytes as f64);
            assert!(
                (predicted - real).abs() <= within * real,
                "{mode:?}: predicted {predicted} arena bytes, a table takes {real}"
            );
            assert_eq!(p.raw_bytes, s.payload_raw_bytes, "{mode:?}");
            assert!(p.decode_ns >= 0.0);
        }
    }

    #[test]
    fn a_dictionary_prediction_trains_one_and_beats_plain_zstd_on_small_records() {
        let samples = records(2000);
        let plain = predict(&samples, MODES[3], 16 * 1024);
        let dict = predict(&samples, MODES[4], 16 * 1024);
        assert!(dict.trained && dict.dict_bytes > 0 && dict.dict_memory > dict.dict_bytes);
        assert!(
            dict.stored_bytes * 3 < plain.stored_bytes * 2,
            "dictionary {} vs plain {}",
            dict.stored_bytes,
            plain.stored_bytes
        );
        assert!(!plain.trained && plain.dict_bytes == 0);
    }

    #[test]
    fn too_few_samples_to_train_predict_a_table_without_a_dictionary() {
        let samples = records(3);
        let dict = predict(&samples, MODES[4], 16 * 1024);
        let plain = predict(&samples, MODES[3], 16 * 1024);
        assert!(!dict.trained);
        assert_eq!(dict.stored_bytes, plain.stored_bytes);
        let none: [(Vec<u8>, Vec<u8>); 0] = [];
        assert_eq!(predict(&none, MODES[4], 4096).stored_bytes, 0);
    }

    #[test]
    fn incompressible_bodies_are_predicted_raw_by_every_codec() {
        let samples: Vec<(Vec<u8>, Vec<u8>)> = (0..200u32)
            .map(|i| {
                (
                    crate::codec::Value::Int(i64::from(i)).to_bytes(),
                    crate::testutil::noise(i + 1, 1024),
                )
            })
            .collect();
        let none = predict(&samples, Compression::None, 4096);
        for mode in MODES {
            let p = predict(&samples, mode, 4096);
            assert_eq!(p.compressed, 0, "{mode:?}");
            assert_eq!(p.stored_bytes, none.stored_bytes, "{mode:?}");
        }
    }
}
