//! A table's atom dictionary: encoded terms name atoms by a small id, and the
//! dictionary maps ids to names (UTF-8) and back. Ids are dense, assigned in
//! first-use order, and never reused while the table lives.

use std::collections::HashMap;

/// Atom names by id and ids by name.
#[derive(Default)]
pub struct AtomTable {
    names: Vec<Box<str>>,
    ids: HashMap<Box<str>, u32>,
    name_bytes: usize,
}

impl AtomTable {
    /// An empty dictionary.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `name`, adding it if new.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.into());
        self.ids.insert(name.into(), id);
        self.name_bytes += name.len();
        id
    }

    /// The name of `id`.
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(|s| &**s)
    }

    /// Number of atoms.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when no atom has been stored.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Heap bytes, estimated from capacities: the id vector, the hash map's
    /// buckets (entry plus one control byte each) and two copies of every
    /// name. The allocator's own slack is not included.
    pub fn heap_bytes(&self) -> u64 {
        let vec = self.names.capacity() * std::mem::size_of::<Box<str>>();
        let map = self.ids.capacity() * (std::mem::size_of::<(Box<str>, u32)>() + 1);
        (vec + map + 2 * self.name_bytes) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_stable_and_round_trip() {
        let mut t = AtomTable::new();
        assert_eq!(t.intern("ok"), 0);
        assert_eq!(t.intern("héllo"), 1);
        assert_eq!(t.intern("ok"), 0);
        assert_eq!(t.name(1), Some("héllo"));
        assert_eq!(t.name(2), None);
        assert_eq!(t.len(), 2);
        assert!(t.heap_bytes() > 0);
    }
}
