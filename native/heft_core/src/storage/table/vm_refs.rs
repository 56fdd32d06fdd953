//! The VM objects a table's records name: the magic references of
//! `:atomics`, `:counters` and NIF resources, which the VM frees once no
//! term refers to them. ETS keeps such an object alive while a record holds
//! its reference; Heft stores the reference as ETF bytes, which do not. So a
//! table that has stored one counts, for each such reference (by its ETF
//! bytes), the records that hold it. A record is walked for them (key and
//! body, decompressed) when it is placed and when it is freed, if its key
//! is one whose records have held some (tracked keys, with how many of
//! their records do), or if the NIF's encoder saw one in it: the records
//! of other keys cost a lookup of their key. The NIF keeps a live copy of
//! each reference counted, and lets it go once no record holds it.

use std::collections::HashMap;

use crate::codec;
use crate::compress;
use crate::dict::Dictionaries;
use crate::etf;
use crate::record::Header;

/// Magic references held by a table's records, with how many records hold
/// each.
#[derive(Default)]
pub(super) struct VmRefs {
    counts: HashMap<Vec<u8>, u32>,
    /// Keys (as stored) with records holding some, and how many.
    keys: HashMap<Vec<u8>, u32>,
    /// References whose count fell to zero since the NIF last looked.
    dead: Vec<Vec<u8>>,
    scratch: Vec<u8>,
}

impl VmRefs {
    /// The record `bytes` was placed; `seen`: the encoder saw a magic
    /// reference in it.
    pub(super) fn add(&mut self, bytes: &[u8], seen: bool, dicts: &Dictionaries) {
        let VmRefs {
            counts,
            keys,
            scratch,
            ..
        } = self;
        let Some(key) = key_of(bytes) else { return };
        if !seen && !keys.contains_key(key) {
            return;
        }
        let mut held = false;
        each(bytes, dicts, scratch, |piece| {
            held = true;
            *counts.entry(piece.to_vec()).or_default() += 1;
        });
        if held {
            *keys.entry(key.to_vec()).or_default() += 1;
        }
    }

    /// The record `bytes` is freed.
    pub(super) fn remove(&mut self, bytes: &[u8], dicts: &Dictionaries) {
        let VmRefs {
            counts,
            keys,
            dead,
            scratch,
        } = self;
        let Some(key) = key_of(bytes) else { return };
        let Some(records) = keys.get_mut(key) else {
            return;
        };
        let mut held = false;
        each(bytes, dicts, scratch, |piece| {
            held = true;
            // A reference not counted (a record loaded from disk: its
            // object is gone with the VM that made it) is passed over.
            if let Some(n) = counts.get_mut(piece) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(piece);
                    dead.push(piece.to_vec());
                }
            }
        });
        if held {
            *records -= 1;
            if *records == 0 {
                keys.remove(key);
            }
        }
    }

    /// Every record is gone.
    pub(super) fn clear(&mut self) {
        self.dead
            .extend(self.counts.drain().map(|(piece, _)| piece));
        self.keys.clear();
    }

    /// Records holding `piece`.
    pub(super) fn count(&self, piece: &[u8]) -> usize {
        self.counts.get(piece).map_or(0, |&n| n as usize)
    }

    /// The references no record holds any more, since the last call.
    pub(super) fn take_dead(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.dead)
    }

    /// Heap bytes of the counts and keys (an estimate: each one's bytes
    /// and the maps' entries).
    pub(super) fn heap_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(Vec<u8>, u32)>() as u64 + 8;
        self.counts
            .keys()
            .chain(self.keys.keys())
            .map(|k| k.capacity() as u64 + entry)
            .sum::<u64>()
    }
}

/// The stored key of the record `bytes`.
fn key_of(bytes: &[u8]) -> Option<&[u8]> {
    let h = Header::parse(bytes).ok()?;
    Some(&bytes[h.key_start()..h.body_start()])
}

/// Calls `f` with each magic reference in the record `bytes` (key and
/// body), decompressing the body into `scratch` if need be. A record that
/// does not parse holds none (it cannot have been placed).
fn each(bytes: &[u8], dicts: &Dictionaries, scratch: &mut Vec<u8>, mut f: impl FnMut(&[u8])) {
    let Ok(h) = Header::parse(bytes) else { return };
    let key = &bytes[h.key_start()..h.body_start()];
    let stored = &bytes[h.body_start()..h.total_len()];
    let mut magic = |piece: &[u8]| {
        if etf::is_magic_ref(piece) {
            f(piece)
        }
    };
    let _ = codec::etfs_all(key, &mut magic);
    scratch.clear();
    if let Ok(body) = compress::unpack(&h, stored, dicts, scratch) {
        let _ = codec::etfs_all(body, &mut magic);
    }
}

#[cfg(test)]
mod tests {
    use crate::codec::Value;
    use crate::compress::Compression;
    use crate::table::tests::{int_key, table_of};
    use crate::table::{Kind, Table};

    const MARK: u32 = 1 << 17;

    /// A reference's ETF bytes: ID words 0, `id1`, 7 on `nonode@nohost`.
    fn reference(id1: u32) -> Vec<u8> {
        let mut b = vec![131, 90, 0, 3, 119, 13];
        b.extend_from_slice(b"nonode@nohost");
        for w in [0u32, 0, id1, 7] {
            b.extend_from_slice(&w.to_be_bytes());
        }
        b
    }

    fn put(t: &Table, k: u64, refs: &[Vec<u8>]) {
        put_as(t, k, refs, true)
    }

    /// `seen`: the record says it holds its magic references, as the NIF's
    /// encoder does (not a copy the table makes itself).
    fn put_as(t: &Table, k: u64, refs: &[Vec<u8>], seen: bool) {
        let mut elems = vec![Value::Binary(vec![7; 300])];
        elems.extend(refs.iter().map(|r| Value::Etf(r.clone())));
        let mut p = t.prepare(&int_key(k), &Value::Tuple(elems).to_bytes());
        if seen && refs.iter().any(|r| crate::etf::is_magic_ref(r)) {
            p.holds_vm_refs();
        }
        t.insert(&[p]).unwrap();
    }

    #[test]
    fn records_holding_a_magic_reference_are_counted_until_none_does() {
        crate::etf::set_magic_mark(MARK);
        let (a, b, plain) = (reference(MARK | 1), reference(MARK | 2), reference(3));
        assert!(crate::etf::is_magic_ref(&a) && !crate::etf::is_magic_ref(&plain));
        for kind in [Kind::Set, Kind::Bag, Kind::OrderedSet] {
            for compression in [Compression::None, Compression::Zlib(1)] {
                let t = table_of(kind, compression);
                put(&t, 1, std::slice::from_ref(&plain));
                assert!(t.unheld_vm_refs(&[]).unwrap().is_empty());
                put(&t, 2, &[a.clone(), b.clone()]);
                put(&t, 3, std::slice::from_ref(&a));
                assert_eq!(t.vm_ref_count(&a).unwrap(), 2);
                assert_eq!(t.vm_ref_count(&b).unwrap(), 1);
                assert_eq!(t.vm_ref_count(&plain).unwrap(), 0);
                // Overwritten (a bag adds an object: key 2 keeps b).
                put(&t, 2, std::slice::from_ref(&plain));
                let b_left = usize::from(kind == Kind::Bag);
                assert_eq!(t.vm_ref_count(&b).unwrap(), b_left);
                let k = int_key(3);
                assert!(t.remove(t.hash(&k), &k, None).unwrap());
                let dead = t.unheld_vm_refs(&[]).unwrap();
                match kind {
                    Kind::Bag => assert!(dead.is_empty(), "{kind:?}"),
                    _ => assert_eq!(dead, vec![b.clone(), a.clone()], "{kind:?}"),
                }
                put(&t, 4, std::slice::from_ref(&b));
                t.clear().unwrap();
                let mut dead = t.unheld_vm_refs(&[]).unwrap();
                dead.sort();
                let mut all = match kind {
                    Kind::Bag => vec![a.clone(), b.clone()],
                    _ => vec![b.clone()],
                };
                all.sort();
                assert_eq!(dead, all, "{kind:?}");
                assert_eq!(t.vm_ref_count(&b).unwrap(), 0);
                // Asked about: unheld if no record holds it.
                put(&t, 5, std::slice::from_ref(&a));
                assert_eq!(
                    t.unheld_vm_refs(&[a.clone(), b.clone()]).unwrap(),
                    vec![b.clone()]
                );
                // A record of a tracked key placed without the encoder's
                // word (as re-compression places its copies) is counted.
                let bag = usize::from(kind == Kind::Bag);
                put_as(&t, 5, &[a.clone(), plain.clone()], false);
                assert_eq!(t.vm_ref_count(&a).unwrap(), 1 + bag, "{kind:?}");
                // Unflagged, of a key never tracked: not walked.
                put_as(&t, 6, std::slice::from_ref(&b), false);
                assert_eq!(t.vm_ref_count(&b).unwrap(), 0);
                let k = int_key(5);
                assert!(t.remove(t.hash(&k), &k, None).unwrap());
                assert_eq!(t.vm_ref_count(&a).unwrap(), 0, "{kind:?}");
                assert_eq!(t.unheld_vm_refs(&[]).unwrap(), vec![a.clone()]);
            }
        }
    }
}
