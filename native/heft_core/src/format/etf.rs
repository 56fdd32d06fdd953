//! Reading the pieces of external term format (ETF) that the Heft format
//! embeds (docs/term-format.md, tag `etf`): pids, ports, references, funs,
//! big integers and bitstrings, without building them.
//!
//! [`crate::order`] needs their fields to put them in Erlang term order, and
//! a fun's captured variables (arbitrary terms, in ETF) are rewritten into
//! the Heft format by [`transcode`] so that one comparator walks them.
//! The layouts are those of the Erlang documentation, "External Term
//! Format"; every multi-byte integer is big-endian there.

use crate::codec::{DecodeError, Writer};

/// The version byte that starts every ETF piece.
pub const VERSION: u8 = 131;

mod tag {
    pub const NEW_FLOAT: u8 = 70;
    pub const BIT_BINARY: u8 = 77;
    pub const NEW_PID: u8 = 88;
    pub const NEW_PORT: u8 = 89;
    pub const NEWER_REFERENCE: u8 = 90;
    pub const SMALL_INTEGER: u8 = 97;
    pub const INTEGER: u8 = 98;
    pub const FLOAT: u8 = 99;
    pub const ATOM: u8 = 100;
    pub const REFERENCE: u8 = 101;
    pub const PORT: u8 = 102;
    pub const PID: u8 = 103;
    pub const SMALL_TUPLE: u8 = 104;
    pub const LARGE_TUPLE: u8 = 105;
    pub const NIL: u8 = 106;
    pub const STRING: u8 = 107;
    pub const LIST: u8 = 108;
    pub const BINARY: u8 = 109;
    pub const SMALL_BIG: u8 = 110;
    pub const LARGE_BIG: u8 = 111;
    pub const NEW_FUN: u8 = 112;
    pub const EXPORT: u8 = 113;
    pub const NEW_REFERENCE: u8 = 114;
    pub const SMALL_ATOM: u8 = 115;
    pub const MAP: u8 = 116;
    pub const ATOM_UTF8: u8 = 118;
    pub const SMALL_ATOM_UTF8: u8 = 119;
    pub const V4_PORT: u8 = 120;
}

/// An atom's text as ETF holds it.
#[derive(Clone, Copy, Debug)]
pub enum Text<'a> {
    /// UTF-8 bytes (also what the atom dictionary holds).
    Utf8(&'a [u8]),
    /// Latin-1 bytes (the old `ATOM_EXT` forms).
    Latin1(&'a [u8]),
}

/// A node: its name and creation.
#[derive(Clone, Copy, Debug)]
pub struct Node<'a> {
    /// The node's name.
    pub name: Text<'a>,
    /// Its incarnation.
    pub creation: u32,
}

/// The parts of one ETF term that term order looks at.
#[derive(Clone, Copy, Debug)]
pub enum Piece<'a> {
    /// An integer that fits in 64 bits.
    Int(i64),
    /// A big integer: sign and magnitude, least significant byte first.
    Big {
        /// True for a negative number.
        neg: bool,
        /// The magnitude, little-endian.
        mag: &'a [u8],
    },
    /// A float.
    Float(f64),
    /// An atom.
    Atom(Text<'a>),
    /// A reference: its node and its ID words (`ID[0]` first, as stored).
    Ref {
        /// Where it was made.
        node: Node<'a>,
        /// 4-byte big-endian words.
        words: &'a [u8],
    },
    /// A local fun.
    Fun {
        /// The defining module.
        module: Text<'a>,
        /// `OldIndex`.
        old_index: i64,
        /// `OldUniq`.
        old_uniq: i64,
        /// How many variables it captured.
        num_free: u32,
        /// The captured variables, `num_free` ETF terms back to back.
        env: &'a [u8],
    },
    /// An external fun `fun M:F/A`.
    Export {
        /// Module.
        module: Text<'a>,
        /// Function.
        function: Text<'a>,
        /// Arity.
        arity: u8,
    },
    /// A port.
    Port {
        /// Its node.
        node: Node<'a>,
        /// Its number.
        id: u64,
    },
    /// A pid.
    Pid {
        /// Its node.
        node: Node<'a>,
        /// `ID`.
        id: u32,
        /// `Serial`.
        serial: u32,
    },
    /// A binary or bitstring: bytes and length in bits.
    Bits(&'a [u8], u64),
    /// A tuple, list, map or `[]`, which the Heft format models itself:
    /// rewrite it with [`transcode`] before comparing.
    Compound,
}

/// A cursor over ETF bytes.
struct In<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> In<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let hi = u64::from(self.u32()?);
        Ok(hi << 32 | u64::from(self.u32()?))
    }

    fn atom(&mut self) -> Result<Text<'a>, DecodeError> {
        let t = self.u8()?;
        atom_body(self, t)
    }

    /// An integer field (`SMALL_INTEGER_EXT` or `INTEGER_EXT`).
    fn int(&mut self) -> Result<i64, DecodeError> {
        match self.u8()? {
            tag::SMALL_INTEGER => Ok(i64::from(self.u8()?)),
            tag::INTEGER => Ok(i64::from(self.u32()? as i32)),
            t => Err(DecodeError::BadTag(t)),
        }
    }
}

fn atom_body<'a>(r: &mut In<'a>, t: u8) -> Result<Text<'a>, DecodeError> {
    match t {
        tag::ATOM => {
            let n = r.u16()?;
            Ok(Text::Latin1(r.take(usize::from(n))?))
        }
        tag::SMALL_ATOM => {
            let n = r.u8()?;
            Ok(Text::Latin1(r.take(usize::from(n))?))
        }
        tag::ATOM_UTF8 => {
            let n = r.u16()?;
            Ok(Text::Utf8(r.take(usize::from(n))?))
        }
        tag::SMALL_ATOM_UTF8 => {
            let n = r.u8()?;
            Ok(Text::Utf8(r.take(usize::from(n))?))
        }
        t => Err(DecodeError::BadTag(t)),
    }
}

/// Reads a creation field: 4 bytes in the new forms, 1 in the old.
fn creation(r: &mut In<'_>, wide: bool) -> Result<u32, DecodeError> {
    if wide {
        r.u32()
    } else {
        Ok(u32::from(r.u8()?))
    }
}

/// The bit of a reference's second ID word that marks a magic reference
/// (one standing for an object of the VM: an `:atomics`, a `:counters`, a
/// NIF resource), as the running VM writes it; 0 until [`set_magic_mark`]
/// (then no reference counts as magic).
static MAGIC_MARK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Sets the bit [`is_magic_ref`] looks for (the NIF finds it at load, from
/// a reference it knows to be magic and one it knows not to be).
pub fn set_magic_mark(mask: u32) {
    MAGIC_MARK.store(mask, std::sync::atomic::Ordering::Relaxed);
}

/// The second ID word of a reference piece (`bytes`, starting with 131),
/// where a magic reference has its mark; `None` for other pieces.
pub fn ref_second_word(bytes: &[u8]) -> Option<u32> {
    match piece(bytes).ok()? {
        Piece::Ref { words, .. } => words
            .get(4..8)
            .map(|w| u32::from_be_bytes(w.try_into().expect("4 bytes"))),
        _ => None,
    }
}

/// True if `bytes` (an ETF piece) is a magic reference: its second ID word
/// has the mark [`set_magic_mark`] set.
pub fn is_magic_ref(bytes: &[u8]) -> bool {
    let mark = MAGIC_MARK.load(std::sync::atomic::Ordering::Relaxed);
    mark != 0
        && bytes.get(1) == Some(&tag::NEWER_REFERENCE)
        && ref_second_word(bytes).is_some_and(|w| w & mark != 0)
}

/// Parses a whole ETF piece (starting with the version byte) that must hold
/// exactly one term.
pub fn piece(bytes: &[u8]) -> Result<Piece<'_>, DecodeError> {
    match bytes.split_first() {
        Some((&VERSION, body)) => {
            let (p, used) = term(body)?;
            if used != body.len() {
                return Err(DecodeError::TrailingBytes(body.len() - used));
            }
            Ok(p)
        }
        Some((&b, _)) => Err(DecodeError::BadTag(b)),
        None => Err(DecodeError::Truncated),
    }
}

/// Parses the term at the start of `bytes` (no version byte); returns it
/// and its length.
pub fn term(bytes: &[u8]) -> Result<(Piece<'_>, usize), DecodeError> {
    let mut r = In { buf: bytes, pos: 0 };
    let t = r.u8()?;
    let p = match t {
        tag::SMALL_INTEGER => Piece::Int(i64::from(r.u8()?)),
        tag::INTEGER => Piece::Int(i64::from(r.u32()? as i32)),
        tag::SMALL_BIG | tag::LARGE_BIG => {
            let n = if t == tag::SMALL_BIG {
                usize::from(r.u8()?)
            } else {
                r.u32()? as usize
            };
            let neg = r.u8()? != 0;
            Piece::Big {
                neg,
                mag: r.take(n)?,
            }
        }
        tag::NEW_FLOAT => Piece::Float(f64::from_bits(r.u64()?)),
        tag::FLOAT => {
            let raw = r.take(31)?;
            let text = std::str::from_utf8(raw)
                .map_err(|_| DecodeError::Builder("unreadable FLOAT_EXT"))?;
            let f = text
                .trim_end_matches('\0')
                .trim()
                .parse::<f64>()
                .map_err(|_| DecodeError::Builder("unreadable FLOAT_EXT"))?;
            Piece::Float(f)
        }
        tag::ATOM | tag::SMALL_ATOM | tag::ATOM_UTF8 | tag::SMALL_ATOM_UTF8 => {
            Piece::Atom(atom_body(&mut r, t)?)
        }
        tag::NEWER_REFERENCE | tag::NEW_REFERENCE => {
            let n = usize::from(r.u16()?);
            let name = r.atom()?;
            let creation = creation(&mut r, t == tag::NEWER_REFERENCE)?;
            let words = r.take(n.checked_mul(4).ok_or(DecodeError::BadLength(n as u64))?)?;
            Piece::Ref {
                node: Node { name, creation },
                words,
            }
        }
        tag::REFERENCE => {
            let name = r.atom()?;
            let words = r.take(4)?;
            let creation = creation(&mut r, false)?;
            Piece::Ref {
                node: Node { name, creation },
                words,
            }
        }
        tag::NEW_PID | tag::PID => {
            let name = r.atom()?;
            let id = r.u32()?;
            let serial = r.u32()?;
            let creation = creation(&mut r, t == tag::NEW_PID)?;
            Piece::Pid {
                node: Node { name, creation },
                id,
                serial,
            }
        }
        tag::NEW_PORT | tag::PORT | tag::V4_PORT => {
            let name = r.atom()?;
            let id = if t == tag::V4_PORT {
                r.u64()?
            } else {
                u64::from(r.u32()?)
            };
            let creation = creation(&mut r, t != tag::PORT)?;
            Piece::Port {
                node: Node { name, creation },
                id,
            }
        }
        tag::NEW_FUN => {
            // Size counts itself and everything after the tag.
            let size = r.u32()? as usize;
            let end = size
                .checked_add(1)
                .ok_or(DecodeError::BadLength(size as u64))?;
            let _arity = r.u8()?;
            let _uniq = r.take(16)?;
            let _index = r.u32()?;
            let num_free = r.u32()?;
            let module = r.atom()?;
            let old_index = r.int()?;
            let old_uniq = r.int()?;
            let pid_start = r.pos;
            let (_, pid_len) = term(bytes.get(pid_start..).ok_or(DecodeError::Truncated)?)?;
            r.pos = pid_start + pid_len;
            let env = bytes.get(r.pos..end).ok_or(DecodeError::Truncated)?;
            r.pos = end;
            Piece::Fun {
                module,
                old_index,
                old_uniq,
                num_free,
                env,
            }
        }
        tag::EXPORT => {
            let module = r.atom()?;
            let function = r.atom()?;
            let arity = match r.int()? {
                a @ 0..=255 => a as u8,
                a => return Err(DecodeError::BadLength(a as u64)),
            };
            Piece::Export {
                module,
                function,
                arity,
            }
        }
        tag::BINARY => {
            let n = r.u32()? as usize;
            let data = r.take(n)?;
            Piece::Bits(data, n as u64 * 8)
        }
        tag::BIT_BINARY => {
            let n = r.u32()? as usize;
            let bits = r.u8()?;
            let data = r.take(n)?;
            if n == 0 || bits == 0 || bits > 8 {
                return Err(DecodeError::Builder("malformed BIT_BINARY_EXT"));
            }
            Piece::Bits(data, (n as u64 - 1) * 8 + u64::from(bits))
        }
        tag::SMALL_TUPLE | tag::LARGE_TUPLE | tag::NIL | tag::STRING | tag::LIST | tag::MAP => {
            r.pos = skip(bytes)?;
            Piece::Compound
        }
        t => return Err(DecodeError::BadTag(t)),
    };
    Ok((p, r.pos))
}

/// The length of the term at the start of `bytes` (no version byte).
pub fn skip(bytes: &[u8]) -> Result<usize, DecodeError> {
    let mut r = In { buf: bytes, pos: 0 };
    let mut pending: u64 = 1;
    while pending > 0 {
        pending -= 1;
        let start = r.pos;
        let t = r.u8()?;
        match t {
            tag::SMALL_TUPLE => pending += u64::from(r.u8()?),
            tag::LARGE_TUPLE => pending += u64::from(r.u32()?),
            tag::NIL => {}
            tag::STRING => {
                let n = r.u16()?;
                r.take(usize::from(n))?;
            }
            tag::LIST => pending += u64::from(r.u32()?) + 1,
            tag::MAP => pending += 2 * u64::from(r.u32()?),
            _ => {
                let rest = bytes.get(start..).ok_or(DecodeError::Truncated)?;
                let (_, n) = term(rest)?;
                r.pos = start + n;
            }
        }
        if pending > bytes.len() as u64 {
            return Err(DecodeError::BadLength(pending));
        }
    }
    Ok(r.pos)
}

/// Rewrites `count` ETF terms (no version byte) into the Heft format,
/// appending to `w`: tuples, lists, maps, `[]`, binaries, floats and
/// integers that fit in 64 bits become Heft terms; atoms, pids, ports,
/// references, funs, big integers and bitstrings stay ETF pieces (the
/// comparator reads atoms by name there). Returns the bytes consumed.
pub fn transcode(bytes: &[u8], count: usize, w: &mut Writer) -> Result<usize, DecodeError> {
    let mut r = In { buf: bytes, pos: 0 };
    let mut pending = count as u64;
    let mut piece = Vec::new();
    while pending > 0 {
        pending -= 1;
        let start = r.pos;
        let t = r.u8()?;
        match t {
            tag::SMALL_TUPLE | tag::LARGE_TUPLE => {
                let n = if t == tag::SMALL_TUPLE {
                    u64::from(r.u8()?)
                } else {
                    u64::from(r.u32()?)
                };
                w.tuple(n as usize);
                pending += n;
            }
            tag::NIL => w.nil(),
            tag::STRING => {
                let n = r.u16()?;
                let chars = r.take(usize::from(n))?;
                if chars.is_empty() {
                    w.nil();
                } else {
                    w.list(chars.len());
                    chars.iter().for_each(|&c| w.int(i64::from(c)));
                    w.nil();
                }
            }
            tag::LIST => {
                let n = r.u32()?;
                w.list(n as usize);
                pending += u64::from(n) + 1;
            }
            tag::MAP => {
                let n = r.u32()?;
                w.map(n as usize);
                pending += 2 * u64::from(n);
            }
            _ => {
                let rest = bytes.get(start..).ok_or(DecodeError::Truncated)?;
                let (p, n) = term(rest)?;
                r.pos = start + n;
                match p {
                    Piece::Int(i) => w.int(i),
                    Piece::Float(f) => w.float(f, false),
                    Piece::Bits(data, bits) if t == tag::BINARY && bits % 8 == 0 => {
                        w.binary(data);
                    }
                    _ => {
                        piece.clear();
                        piece.push(VERSION);
                        piece.extend_from_slice(&rest[..n]);
                        w.etf(&piece);
                    }
                }
            }
        }
        if pending > bytes.len() as u64 {
            return Err(DecodeError::BadLength(pending));
        }
    }
    Ok(r.pos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode, Value, ValueBuilder};

    #[test]
    fn a_pid_piece_gives_its_fields() {
        // term_to_binary(:erlang.list_to_pid(~c"<0.5.1>")) on a nonode VM.
        let mut b = vec![131, 88, 100, 0, 13];
        b.extend_from_slice(b"nonode@nohost");
        b.extend_from_slice(&[0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 0]);
        match piece(&b).unwrap() {
            Piece::Pid { node, id, serial } => {
                assert!(matches!(node.name, Text::Latin1(n) if n == b"nonode@nohost"));
                assert_eq!((id, serial, node.creation), (5, 1, 0));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compound_terms_transcode_into_the_heft_format() {
        // {1, [2 | 3], "ab" (as a STRING_EXT), #{}, <<7>>, 2.5}
        let etf = [
            104, 6, 97, 1, 108, 0, 0, 0, 1, 97, 2, 97, 3, 107, 0, 2, b'a', b'b', 116, 0, 0, 0, 0,
            109, 0, 0, 0, 1, 7, 70, 64, 4, 0, 0, 0, 0, 0, 0,
        ];
        let mut w = Writer::new();
        assert_eq!(transcode(&etf, 1, &mut w), Ok(etf.len()));
        let v = decode(&w.buf, None, &mut ValueBuilder).unwrap();
        let list = |es: Vec<Value>, t: Value| Value::List(es, Box::new(t));
        assert_eq!(
            v,
            Value::Tuple(vec![
                Value::Int(1),
                list(vec![Value::Int(2)], Value::Int(3)),
                list(vec![Value::Int(97), Value::Int(98)], Value::Nil),
                Value::Map(vec![]),
                Value::Binary(vec![7]),
                Value::Float(2.5),
            ])
        );
        assert_eq!(skip(&etf), Ok(etf.len()));
    }

    #[test]
    fn truncated_and_unknown_pieces_are_errors() {
        let pid = [131, 88, 100, 0, 1, b'a', 0, 0, 0, 5];
        assert!(piece(&pid).is_err());
        assert!(piece(&[131, 200]).is_err());
        assert!(piece(&[]).is_err());
        assert!(piece(&[130, 97, 1]).is_err());
        // A list claiming 2^32-1 elements.
        assert!(skip(&[108, 255, 255, 255, 255, 106]).is_err());
    }
}
