//! A table's zstd dictionaries: trained from its own records, numbered
//! from 1 in the order they were made, never changed once made. A record
//! compressed with a dictionary names its id in its header
//! (docs/term-format.md, "Records in the arena"), so a newer dictionary
//! applies to new writes while older records stay readable with theirs.
//!
//! Each dictionary is kept as its bytes (what is persisted and counted)
//! and digested twice, once for compressing at the table's level and once
//! for decompressing; the digests are what the per-thread contexts in
//! compress.rs reference while they run.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::zblock::{CDigest, DDigest};
use parking_lot::RwLock;

/// One dictionary.
pub struct Dict {
    id: u32,
    bytes: Box<[u8]>,
    cdict: CDigest,
    ddict: DDigest,
    /// Whether its content holds bytes that look random, which a
    /// random-looking body could match (compress.rs).
    noise: bool,
}

impl Dict {
    /// Its id in its table (1, 2, ...).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its bytes, as trained (what is persisted).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes of memory it takes: its bytes and both digests.
    pub fn memory(&self) -> usize {
        self.bytes.len() + self.cdict.sizeof() + self.ddict.sizeof()
    }

    /// True if some of its content looks random (deflate.rs,
    /// `holds_noise`): then a body that looks random is still tried with
    /// it, else stored raw untried.
    pub fn holds_noise(&self) -> bool {
        self.noise
    }

    pub(crate) fn cdict(&self) -> &CDigest {
        &self.cdict
    }

    pub(crate) fn ddict(&self) -> &DDigest {
        &self.ddict
    }
}

impl std::fmt::Debug for Dict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dict")
            .field("id", &self.id)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// Why a dictionary was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DictError {
    /// Installed out of order: ids are dense from 1.
    BadId { expected: u32, got: u32 },
    /// Empty or larger than [`MAX_DICT`].
    BadSize(usize),
    /// Training found nothing to learn (too few or too small samples).
    Training(String),
    /// The table has [`MAX_DICTS`] dictionaries already.
    TooMany,
    /// zstd refuses the bytes (a dictionary's header whose tables do not
    /// load: damage).
    Invalid,
}

impl std::fmt::Display for DictError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DictError::BadId { expected, got } => {
                write!(f, "dictionary {got} where {expected} was expected")
            }
            DictError::BadSize(n) => write!(f, "a dictionary of {n} bytes"),
            DictError::Training(why) => write!(f, "training failed: {why}"),
            DictError::TooMany => write!(f, "too many dictionaries"),
            DictError::Invalid => write!(f, "zstd refuses the dictionary"),
        }
    }
}

/// The largest dictionary a table takes.
pub const MAX_DICT: usize = 1 << 20;

/// The most dictionaries one table holds.
pub const MAX_DICTS: u32 = 1 << 16;

/// The dictionaries of one table.
pub struct Dictionaries {
    level: i32,
    list: RwLock<Vec<Arc<Dict>>>,
    /// Id of the dictionary new writes use; 0 for none.
    current: AtomicU32,
}

impl Dictionaries {
    /// No dictionaries yet; those added will compress at `level`.
    pub fn new(level: i32) -> Dictionaries {
        Dictionaries {
            level,
            list: RwLock::new(Vec::new()),
            current: AtomicU32::new(0),
        }
    }

    /// The zstd level dictionaries are digested for.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// How many there are (the highest id).
    pub fn len(&self) -> usize {
        self.list.read().len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dictionary `id`, if the table has it.
    pub fn get(&self, id: u32) -> Option<Arc<Dict>> {
        let i = (id as usize).checked_sub(1)?;
        self.list.read().get(i).cloned()
    }

    /// All of them, by id.
    pub fn all(&self) -> Vec<Arc<Dict>> {
        self.list.read().clone()
    }

    /// Those with ids above `after`, by id (what a journal has not yet
    /// logged).
    pub fn since(&self, after: usize) -> Vec<Arc<Dict>> {
        let list = self.list.read();
        list.get(after..).map(<[_]>::to_vec).unwrap_or_default()
    }

    /// The dictionary new writes use, if any.
    pub fn current(&self) -> Option<Arc<Dict>> {
        match self.current.load(Ordering::Acquire) {
            0 => None,
            id => self.get(id),
        }
    }

    /// Makes `id` (which must exist) the dictionary of new writes.
    pub fn set_current(&self, id: u32) {
        debug_assert!(id == 0 || self.get(id).is_some());
        self.current.store(id, Ordering::Release);
    }

    /// Adds a dictionary under the next id and returns it; it is not
    /// used for writes until [`Dictionaries::set_current`].
    pub fn add(&self, bytes: &[u8]) -> Result<Arc<Dict>, DictError> {
        let mut list = self.list.write();
        let id = list.len() as u32 + 1;
        self.push(&mut list, id, bytes)
    }

    /// Adds dictionary `id` read back from disk: ids come in order, and
    /// one already present must have the same bytes.
    pub fn install(&self, id: u32, bytes: &[u8]) -> Result<Arc<Dict>, DictError> {
        let mut list = self.list.write();
        let next = list.len() as u32 + 1;
        if id < next && *list[id as usize - 1].bytes == *bytes {
            return Ok(list[id as usize - 1].clone());
        }
        if id != next {
            return Err(DictError::BadId {
                expected: next,
                got: id,
            });
        }
        self.push(&mut list, id, bytes)
    }

    fn push(
        &self,
        list: &mut Vec<Arc<Dict>>,
        id: u32,
        bytes: &[u8],
    ) -> Result<Arc<Dict>, DictError> {
        if bytes.is_empty() || bytes.len() > MAX_DICT {
            return Err(DictError::BadSize(bytes.len()));
        }
        if id > MAX_DICTS {
            return Err(DictError::TooMany);
        }
        let cdict = CDigest::new(bytes, self.level).ok_or(DictError::Invalid)?;
        let ddict = DDigest::new(bytes).ok_or(DictError::Invalid)?;
        let d = Arc::new(Dict {
            id,
            bytes: bytes.into(),
            cdict,
            ddict,
            noise: crate::deflate::holds_noise(&bytes[crate::zblock::content_start(bytes)..]),
        });
        list.push(d.clone());
        Ok(d)
    }

    /// Bytes of memory all of them take.
    pub fn memory(&self) -> usize {
        self.list.read().iter().map(|d| d.memory()).sum()
    }

    /// Bytes of all of them as trained.
    pub fn bytes(&self) -> usize {
        self.list.read().iter().map(|d| d.bytes.len()).sum()
    }
}

/// Trains a dictionary of at most `max_bytes` on `samples` (record bodies
/// as encoded, before compression) for compressing at `level` (see
/// [`crate::zblock::train`]).
pub fn train<S: AsRef<[u8]>>(
    samples: &[S],
    max_bytes: usize,
    level: i32,
) -> Result<Vec<u8>, DictError> {
    let max_bytes = max_bytes.clamp(256, MAX_DICT);
    let sizes: Vec<usize> = samples.iter().map(|s| s.as_ref().len()).collect();
    let mut flat = Vec::with_capacity(sizes.iter().sum());
    samples
        .iter()
        .for_each(|s| flat.extend_from_slice(s.as_ref()));
    let dict = crate::zblock::train(&flat, &sizes, max_bytes, level)
        .map_err(|e| DictError::Training(e.to_string()))?;
    if dict.is_empty() {
        return Err(DictError::Training("empty dictionary".into()));
    }
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_reinstalling_the_same_bytes_is_a_no_op() {
        let d = Dictionaries::new(3);
        assert!(d.current().is_none());
        assert_eq!(d.add(b"first dictionary").unwrap().id(), 1);
        assert_eq!(d.install(2, b"second").unwrap().id(), 2);
        assert_eq!(d.install(2, b"second").unwrap().id(), 2);
        assert!(matches!(
            d.install(2, b"other"),
            Err(DictError::BadId {
                expected: 3,
                got: 2
            })
        ));
        assert!(matches!(
            d.install(5, b"x"),
            Err(DictError::BadId {
                expected: 3,
                got: 5
            })
        ));
        assert!(matches!(d.add(b""), Err(DictError::BadSize(0))));
        // A zstd dictionary header (its magic) over tables that do not
        // load is refused, not a panic.
        let mut bad = 0xEC30_A437u32.to_le_bytes().to_vec();
        bad.extend_from_slice(&[0xFF; 64]);
        assert!(matches!(d.add(&bad), Err(DictError::Invalid)));
        assert_eq!(d.len(), 2);
        d.set_current(2);
        assert_eq!(d.current().unwrap().bytes(), b"second");
        assert_eq!(d.len(), 2);
        assert_eq!(d.since(1).len(), 1);
        assert_eq!(d.bytes(), 22);
        assert!(d.memory() > d.bytes());
        assert!(d.get(0).is_none() && d.get(3).is_none());
    }

    #[test]
    fn training_learns_from_similar_samples() {
        let samples: Vec<Vec<u8>> = (0..2000)
            .map(|i| {
                format!("{{\"id\":{i},\"name\":\"user-{i}\",\"email\":\"user{i}@example.com\"}}")
                    .into_bytes()
            })
            .collect();
        let dict = train(&samples, 4096, 3).unwrap();
        assert!(!dict.is_empty() && dict.len() <= 4096);
        assert!(train(&[b"x"], 4096, 3).is_err());
    }

    /// JSON-like records of about 1 KB in the manner of `mix bench`'s: a
    /// head of per-record fields, events drawn from a pool, a note.
    fn json_like(i: u64) -> Vec<u8> {
        const WORDS: [&str; 8] = [
            "login", "logout", "view", "click", "search", "purchase", "share", "like",
        ];
        let mut s = format!(
            "{{\"id\":{i},\"name\":\"user-{i}\",\"email\":\"user-{i}@example.com\",\
             \"age\":{},\"address\":{{\"street\":\"{} Main Street\",\"zip\":\"{}\"}},\"events\":[",
            i % 90,
            i % 997,
            10_000 + i % 89_999
        );
        for n in 0..24 {
            let w = WORDS[((i * 7 + n * 3) ^ (i >> 2)) as usize % WORDS.len()];
            s += &format!(
                "{{\"type\":\"{w}\",\"at\":{},\"ok\":{}}},",
                1_700_000_000 + i * 40 + n,
                (i + n) % 7 != 0
            );
        }
        s += "],\"note\":\"";
        let mut k = i;
        while s.len() < 1020 {
            k = k
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            s += WORDS[(k >> 60) as usize % WORDS.len()];
            s.push(' ');
        }
        s.truncate(1020);
        s += "\"}";
        s.into_bytes()
    }

    #[test]
    fn a_dictionary_trained_for_the_level_it_is_used_at_stores_fewer_bytes() {
        use crate::compress::{compress, Codec, Compression};
        let records: Vec<Vec<u8>> = (1..4000).map(json_like).collect();
        let (train_on, held_out) = records.split_at(3000);
        let stored = |trained_for: i32| {
            let dicts = Dictionaries::new(9);
            let d = dicts.add(&train(train_on, 16 * 1024, trained_for).unwrap());
            dicts.set_current(d.unwrap().id());
            let mode = Compression::Zstd {
                level: 9,
                dict: true,
            };
            let mut out = Vec::new();
            held_out
                .iter()
                .map(|r| match compress(r, mode, &dicts, &mut out).codec {
                    Codec::Raw => r.len(),
                    _ => out.len(),
                })
                .sum::<usize>()
        };
        let (for_3, for_9) = (stored(3), stored(9));
        assert!(for_9 < for_3, "trained for 9: {for_9} B, for 3: {for_3} B");
    }
}
