//! The hash index against a BTreeMap model, with a deliberately weak hash
//! so that ties and long runs are common.
#![no_main]
use std::collections::BTreeMap;

use heft_core::index::HashIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut ix = HashIndex::new("fuzz");
    let mut model = BTreeMap::new();
    for pair in data.chunks_exact(2) {
        let key = u64::from(pair[1] & 0x7f);
        let hash = hash_of(key);
        // Entries compare by (hash, key).
        let cmp = |loc: u64| (hash_of(loc - 8), loc - 8).cmp(&(hash, key));
        if pair[0] % 3 == 0 {
            if let Some(p) = ix.find(hash, cmp) {
                ix.remove_at(p);
            }
            model.remove(&key);
        } else {
            ix.insert(hash, key + 8, cmp);
            model.insert(key, ());
        }
        assert_eq!(ix.len(), model.len());
    }
    for &key in model.keys() {
        let hash = hash_of(key);
        assert!(ix
            .find(hash, |loc| (hash_of(loc - 8), loc - 8).cmp(&(hash, key)))
            .is_some());
    }
});

/// Few distinct hashes, equal in their top bits or in all of them.
fn hash_of(key: u64) -> u64 {
    (key % 5) << 61 | key % 3
}
