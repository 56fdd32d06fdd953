//! The kernel's view of a mapping, from /proc/self/smaps.
//!
//! smaps lists every mapping of the process in address order, each with
//! figures in kB; we read it line by line and stop once every mapping asked
//! for has been seen, so the kernel does not walk the page tables of the
//! rest of the process.

use std::fs::File;
use std::io::{self, BufRead, BufReader};

/// One mapping's memory, in bytes, as smaps reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingUsage {
    /// Length of the mapping (`Size`).
    pub size: u64,
    /// Pages of the mapping in RAM (`Rss`).
    pub resident: u64,
    /// Resident pages modified since they were last written back or
    /// loaded (`Shared_Dirty + Private_Dirty`). For a memory arena
    /// (anonymous memory or a memfd) every resident page counts: such pages
    /// are never written back, only swapped.
    pub dirty: u64,
    /// Pages of the mapping swapped out (`Swap`).
    pub swap: u64,
}

/// Looks up the mappings that start at each of `starts` in
/// /proc/self/smaps; `None` for an address that starts no mapping.
pub fn mappings(starts: &[u64]) -> io::Result<Vec<Option<MappingUsage>>> {
    let reader = BufReader::new(File::open("/proc/self/smaps")?);
    parse(reader, starts)
}

/// [`mappings`] over any smaps-formatted text.
pub fn parse(reader: impl BufRead, starts: &[u64]) -> io::Result<Vec<Option<MappingUsage>>> {
    let mut found: Vec<Option<MappingUsage>> = vec![None; starts.len()];
    let mut left = starts.len();
    let mut current: Option<usize> = None;
    for line in reader.lines() {
        let line = line?;
        if let Some(start) = mapping_start(&line) {
            if current.is_some() {
                left -= 1;
                if left == 0 {
                    break;
                }
            }
            current = starts.iter().position(|&s| s == start);
            if let Some(i) = current {
                found[i] = Some(MappingUsage::default());
            }
            continue;
        }
        let Some(u) = current.and_then(|i| found[i].as_mut()) else {
            continue;
        };
        let Some((name, kb)) = field(&line) else {
            continue;
        };
        let bytes = kb * 1024;
        match name {
            "Size" => u.size = bytes,
            "Rss" => u.resident = bytes,
            "Shared_Dirty" | "Private_Dirty" => u.dirty += bytes,
            "Swap" => u.swap = bytes,
            _ => {}
        }
    }
    Ok(found)
}

/// The start address of a mapping header line (`7f..-7f.. rw-s ...`).
fn mapping_start(line: &str) -> Option<u64> {
    let range = line.split_ascii_whitespace().next()?;
    let (start, end) = range.split_once('-')?;
    u64::from_str_radix(end, 16).ok()?;
    u64::from_str_radix(start, 16).ok()
}

/// A `Name:   123 kB` line.
fn field(line: &str) -> Option<(&str, u64)> {
    let (name, rest) = line.split_once(':')?;
    let mut parts = rest.split_ascii_whitespace();
    let n = parts.next()?.parse().ok()?;
    (parts.next() == Some("kB")).then_some((name, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a21000 r--p 00000000 fe:01 1234   /usr/bin/beam.smp
Size:                132 kB
Rss:                 128 kB
Private_Dirty:         0 kB
VmFlags: rd mr mw me dw sd
7f00aa000000-7f00ab000000 rw-s 00000000 00:01 99     /memfd:heft:users (deleted)
Size:              16384 kB
KernelPageSize:        4 kB
Rss:                8192 kB
Shared_Clean:          0 kB
Shared_Dirty:         12 kB
Private_Clean:         0 kB
Private_Dirty:      8180 kB
Swap:                 40 kB
VmFlags: rd wr sh mr mw me ms sd
7f00ab000000-7f00ab100000 rw-p 00000000 00:00 0
Size:               1024 kB
Rss:                1024 kB
Private_Dirty:      1024 kB
";

    #[test]
    fn finds_the_mapping_and_converts_kb_to_bytes() {
        let got = parse(SAMPLE.as_bytes(), &[0x7f00_aa00_0000, 0x1234]).unwrap();
        assert_eq!(
            got[0],
            Some(MappingUsage {
                size: 16384 * 1024,
                resident: 8192 * 1024,
                dirty: 8192 * 1024,
                swap: 40 * 1024,
            })
        );
        assert_eq!(got[1], None);
    }

    #[test]
    fn reads_this_process() {
        let mut a = crate::arena::Arena::new(&crate::Backing::Memory, "acct").unwrap();
        let off = a.alloc(40_000).unwrap();
        a.get_mut(off, 40_000).unwrap().fill(7);
        let got = mappings(&[a.address() as u64]).unwrap()[0].expect("arena mapping is listed");
        assert_eq!(got.size, a.mapped_bytes());
        assert!(got.resident >= 40_000 && got.dirty >= 40_000, "{got:?}");
    }
}
