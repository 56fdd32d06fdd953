//! A sieve: what a match specification's heads and guards say about the
//! records it can match, tested on a record's stored bytes, so that a scan
//! decodes (and, where the key decides, decompresses) only the records
//! that may match. It is a filter before the VM's own matcher, which still
//! runs the whole specification on the records the sieve keeps: a sieve
//! may keep records the specification does not match, never drop one it
//! matches. Every test that cannot be decided on the bytes (a back
//! reference, an external-format piece, a compound compared with `=:=`)
//! passes.
//!
//! A sieve holds clauses, one a specification clause, each a list of
//! [`Test`]s on terms found by a [`Path`] from the object: element indices
//! (0-based) into nested tuples. lib/heft/match_spec.ex (`sieve/2`) builds
//! them; terms are in the format of docs/term-format.md, constants in the
//! canonical form of keys. A record passes if every test of some clause
//! passes. Tests on the key (paths that start at the key's element) are run
//! first, on the key alone: a record no clause's key tests pass is dropped
//! without its body.

use std::cmp::Ordering;

use crate::codec::{self, tag, Reader};
use crate::order;

/// Element indices into nested tuples, from the object.
pub type Path = Vec<u32>;

/// A comparison of a guard, in Erlang term order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `<`
    Lt,
    /// `=<`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `/=`
    Ne,
    /// `=:=`
    ExactEq,
    /// `=/=`
    ExactNe,
}

/// A type test of a guard (`is_integer/1`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Integer,
    Float,
    Number,
    Atom,
    Binary,
    Tuple,
    List,
    Map,
}

/// One condition a record must meet for a clause to match it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Test {
    /// The term at `path` is a tuple of `arity` elements.
    Arity { path: Path, arity: u32 },
    /// The term at `path` compares to the constant `value` (a scalar's
    /// canonical encoding) as `op` says.
    Cmp { path: Path, op: Op, value: Vec<u8> },
    /// The terms at two paths are the same (`=:=`): a variable repeated in
    /// a head.
    Same { a: Path, b: Path },
    /// The term at `path` is of `ty`.
    Is { path: Path, ty: Type },
}

/// The tests of one clause.
pub type Clause = Vec<Test>;

/// A whole sieve: the clauses, and the object's key element (0-based).
#[derive(Clone, Debug)]
pub struct Sieve {
    clauses: Vec<Clause>,
    key_index: u32,
}

/// What a test says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    Pass,
    Fail,
}

impl Sieve {
    /// A sieve of `clauses` for objects whose key is element `keypos`
    /// (1-based).
    pub fn new(clauses: Vec<Clause>, keypos: usize) -> Sieve {
        Sieve {
            clauses,
            key_index: keypos.saturating_sub(1) as u32,
        }
    }

    /// Whether the record with this `key` (its stored, canonical encoding)
    /// may match; `body` gives its uncompressed body when a test needs it
    /// (`None` if it cannot: the record is kept). `atom_name` names the
    /// table's atom ids.
    pub fn keeps<'b, 'n>(
        &self,
        key: &'b [u8],
        body: impl FnOnce() -> Option<&'b [u8]>,
        atom_name: impl Fn(u32) -> &'n str + Copy,
    ) -> bool {
        let on_key = |t: &Test| match t {
            Test::Arity { path, .. } | Test::Cmp { path, .. } | Test::Is { path, .. } => {
                path.first() == Some(&self.key_index)
            }
            Test::Same { a, b } => {
                a.first() == Some(&self.key_index) && b.first() == Some(&self.key_index)
            }
        };
        let key_root = |path: &[u32]| -> Located<'b> {
            match path.split_first() {
                Some((_, rest)) => locate(key, key, rest),
                None => Located::Unknown,
            }
        };
        // First the key: clauses whose key tests all pass.
        let alive: Vec<&Clause> = self
            .clauses
            .iter()
            .filter(|c| {
                c.iter()
                    .filter(|t| on_key(t))
                    .all(|t| check(t, &key_root, atom_name) == Verdict::Pass)
            })
            .collect();
        if alive.is_empty() {
            return false;
        }
        if alive.iter().all(|c| c.iter().all(on_key)) {
            return true;
        }
        let Some(body) = body() else {
            return true;
        };
        let root = |path: &[u32]| locate(body, key, path);
        alive.iter().any(|c| {
            c.iter()
                .filter(|t| !on_key(t))
                .all(|t| check(t, &root, atom_name) == Verdict::Pass)
        })
    }
}

/// A term found by a path.
#[derive(Clone, Copy, Debug)]
enum Located<'b> {
    /// The term's encoding starts these bytes (it may be followed by
    /// others).
    Term(&'b [u8]),
    /// The path leads nowhere: a tuple is not there, or is smaller. No
    /// record with such an object matches the head.
    Absent,
    /// It cannot be told from the bytes (a back reference on the way).
    Unknown,
}

/// The term at `path` in the term `bytes` starts; `key` stands for a `KEY`
/// tag.
fn locate<'b>(mut bytes: &'b [u8], key: &'b [u8], path: &[u32]) -> Located<'b> {
    for &i in path {
        if bytes.first() == Some(&tag::KEY) {
            bytes = key;
        }
        let Some((arity, header)) = tuple_header(bytes) else {
            return match bytes.first() {
                Some(&tag::REF) | None => Located::Unknown,
                _ => Located::Absent,
            };
        };
        if u64::from(i) >= arity {
            return Located::Absent;
        }
        let mut at = header;
        for _ in 0..i {
            match bytes.get(at..).map(codec::skip) {
                Some(Ok(n)) => at += n,
                _ => return Located::Unknown,
            }
        }
        bytes = &bytes[at..];
    }
    if bytes.first() == Some(&tag::KEY) {
        bytes = key;
    }
    match bytes.first() {
        None | Some(&tag::REF) => Located::Unknown,
        Some(_) => Located::Term(bytes),
    }
}

/// A tuple's arity and the length of its header, if `bytes` starts one.
fn tuple_header(bytes: &[u8]) -> Option<(u64, usize)> {
    let t = *bytes.first()?;
    if (tag::SMALL_TUPLE..tag::SMALL_TUPLE + 16).contains(&t)
        || (tag::UNSHARED_SMALL_TUPLE..tag::UNSHARED_SMALL_TUPLE + 16).contains(&t)
    {
        return Some((u64::from(t & 0x0f), 1));
    }
    if t == tag::TUPLE || t == tag::UNSHARED_TUPLE {
        let mut r = Reader::new(bytes);
        r.u8().ok()?;
        let n = r.varint().ok()?;
        return Some((n, r.position()));
    }
    None
}

/// The encoding of the term `bytes` starts, alone.
fn one_term(bytes: &[u8]) -> Option<&[u8]> {
    codec::skip(bytes).ok().map(|n| &bytes[..n])
}

/// Whether a term is a scalar that compares by its bytes: not a compound,
/// a back reference or an external-format piece.
fn plain_scalar(bytes: &[u8]) -> bool {
    match bytes.first() {
        Some(&t) => {
            t == tag::NIL
                || t == tag::INT
                || t == tag::FLOAT
                || t == tag::ATOM
                || t == tag::BINARY
                || t >= tag::SMALL_ATOM
        }
        None => false,
    }
}

fn check<'b, 'n>(
    test: &Test,
    at: &impl Fn(&[u32]) -> Located<'b>,
    atom_name: impl Fn(u32) -> &'n str + Copy,
) -> Verdict {
    let pass_if = |b: bool| if b { Verdict::Pass } else { Verdict::Fail };
    match test {
        Test::Arity { path, arity } => match at(path) {
            Located::Term(t) => match tuple_header(t) {
                Some((n, _)) => pass_if(n == u64::from(*arity)),
                None if t.first() == Some(&tag::ETF) => Verdict::Pass,
                None => Verdict::Fail,
            },
            Located::Absent => Verdict::Fail,
            Located::Unknown => Verdict::Pass,
        },
        Test::Cmp { path, op, value } => {
            let t = match at(path) {
                Located::Term(t) => t,
                Located::Absent => return Verdict::Fail,
                Located::Unknown => return Verdict::Pass,
            };
            let Some(term) = one_term(t) else {
                return Verdict::Pass;
            };
            match op {
                Op::ExactEq => {
                    // `=:=`: equal in map-key order (1 and 1.0 differ); a
                    // zero of either sign passes, and the VM decides.
                    pass_if(order::compare_exact(term, value, atom_name) == Ordering::Equal)
                }
                Op::ExactNe => pass_if(!(plain_scalar(term) && term == value.as_slice())),
                _ => {
                    let o = order::compare(term, value, atom_name);
                    pass_if(match op {
                        Op::Lt => o == Ordering::Less,
                        Op::Le => o != Ordering::Greater,
                        Op::Gt => o == Ordering::Greater,
                        Op::Ge => o != Ordering::Less,
                        Op::Eq => o == Ordering::Equal,
                        Op::Ne => o != Ordering::Equal,
                        Op::ExactEq | Op::ExactNe => unreachable!("handled above"),
                    })
                }
            }
        }
        Test::Same { a, b } => match (at(a), at(b)) {
            (Located::Absent, _) | (_, Located::Absent) => Verdict::Fail,
            (Located::Term(x), Located::Term(y)) => match (one_term(x), one_term(y)) {
                (Some(x), Some(y)) if plain_scalar(x) && plain_scalar(y) => {
                    pass_if(order::compare_exact(x, y, atom_name) == Ordering::Equal)
                }
                _ => Verdict::Pass,
            },
            _ => Verdict::Pass,
        },
        Test::Is { path, ty } => {
            let t = match at(path) {
                Located::Term(t) => t,
                Located::Absent => return Verdict::Fail,
                Located::Unknown => return Verdict::Pass,
            };
            let Some(&first) = t.first() else {
                return Verdict::Pass;
            };
            if first == tag::ETF {
                // A big integer, a pid, a bitstring...: the VM decides.
                return Verdict::Pass;
            }
            let integer = first == tag::INT || first >= tag::SMALL_INT;
            let float = first == tag::FLOAT;
            pass_if(match ty {
                Type::Integer => integer,
                Type::Float => float,
                Type::Number => integer || float,
                Type::Atom => {
                    first == tag::ATOM || (tag::SMALL_ATOM..tag::SMALL_INT).contains(&first)
                }
                Type::Binary => first == tag::BINARY,
                Type::Tuple => tuple_header(t).is_some(),
                Type::List => first == tag::LIST || first == tag::NIL,
                Type::Map => first == tag::MAP,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Value;

    fn names(_: u32) -> &'static str {
        "a"
    }

    fn enc(v: &Value) -> Vec<u8> {
        v.to_bytes()
    }

    /// `{{rec, K}, K, <<...>>}`: key `{rec, K}` at 1, stored once.
    fn record(k: i64) -> (Vec<u8>, Vec<u8>) {
        let key = Value::Tuple(vec![Value::Atom(0), Value::Int(k)]);
        let mut w = codec::Writer::new();
        w.tuple(3);
        w.key();
        w.int(k);
        w.binary(&[7; 30]);
        (enc(&key), w.buf)
    }

    fn cmp(path: &[u32], op: Op, v: i64) -> Test {
        Test::Cmp {
            path: path.to_vec(),
            op,
            value: enc(&Value::Int(v)),
        }
    }

    fn arity3() -> Test {
        Test::Arity {
            path: vec![],
            arity: 3,
        }
    }

    #[test]
    fn a_guard_on_the_key_drops_records_without_their_body() {
        let s = Sieve::new(vec![vec![arity3(), cmp(&[0, 1], Op::Lt, 10)]], 1);
        for k in [0, 9, 10, 500] {
            let (key, body) = record(k);
            let mut asked = false;
            let kept = s.keeps(
                &key,
                || {
                    asked = true;
                    Some(&body)
                },
                names,
            );
            assert_eq!(kept, k < 10, "{k}");
            assert_eq!(asked, k < 10, "the body is read only for a key that passes");
        }
    }

    #[test]
    fn a_guard_on_the_body_reads_the_body() {
        for (op, want) in [
            (Op::Lt, [true, false, false]),
            (Op::Le, [true, true, false]),
            (Op::Gt, [false, false, true]),
            (Op::Ge, [false, true, true]),
            (Op::Eq, [false, true, false]),
            (Op::Ne, [true, false, true]),
            (Op::ExactEq, [false, true, false]),
            (Op::ExactNe, [true, false, true]),
        ] {
            let s = Sieve::new(vec![vec![arity3(), cmp(&[1], op, 10)]], 1);
            for (k, w) in [9, 10, 11].into_iter().zip(want) {
                let (key, body) = record(k);
                assert_eq!(s.keeps(&key, || Some(&body), names), w, "{op:?} {k}");
            }
        }
    }

    #[test]
    fn the_first_clause_that_passes_keeps_a_record() {
        let s = Sieve::new(
            vec![
                vec![arity3(), cmp(&[1], Op::Lt, 5)],
                vec![arity3(), cmp(&[1], Op::Gt, 50)],
            ],
            1,
        );
        let kept: Vec<i64> = (0..100)
            .filter(|&k| {
                let (key, body) = record(k);
                s.keeps(&key, || Some(&body), names)
            })
            .collect();
        assert_eq!(kept, (0..5).chain(51..100).collect::<Vec<_>>());
    }

    #[test]
    fn wrong_shapes_fail_and_what_cannot_be_told_passes() {
        let (key, body) = record(3);
        let keeps =
            |tests: Vec<Test>| Sieve::new(vec![tests], 1).keeps(&key, || Some(&body), names);
        // Another arity, a path past the tuple, into a non-tuple.
        assert!(!keeps(vec![Test::Arity {
            path: vec![],
            arity: 4
        }]));
        assert!(!keeps(vec![cmp(&[7], Op::Eq, 3)]));
        assert!(!keeps(vec![cmp(&[1, 0], Op::Eq, 3)]));
        // Types.
        assert!(keeps(vec![Test::Is {
            path: vec![1],
            ty: Type::Integer
        }]));
        assert!(keeps(vec![Test::Is {
            path: vec![2],
            ty: Type::Binary
        }]));
        assert!(!keeps(vec![Test::Is {
            path: vec![2],
            ty: Type::Atom
        }]));
        assert!(keeps(vec![Test::Is {
            path: vec![0],
            ty: Type::Tuple
        }]));
        // A repeated variable: element 1 and the key's element 1 are both 3.
        assert!(keeps(vec![Test::Same {
            a: vec![1],
            b: vec![0, 1]
        }]));
        assert!(!keeps(vec![Test::Same {
            a: vec![1],
            b: vec![0, 0]
        }]));
        // 1 and 1.0 are `==`, not `=:=`.
        let one_float = Test::Cmp {
            path: vec![1],
            op: Op::Eq,
            value: enc(&Value::Float(3.0)),
        };
        assert!(keeps(vec![one_float]));
        let exact = Test::Cmp {
            path: vec![1],
            op: Op::ExactEq,
            value: enc(&Value::Float(3.0)),
        };
        assert!(!keeps(vec![exact]));
        // A back reference on the way cannot be told: it passes.
        let mut w = codec::Writer::new();
        w.tuple(3);
        w.key();
        w.backref(0);
        w.int(1);
        let shared = w.buf;
        let s = Sieve::new(vec![vec![cmp(&[1], Op::Eq, 99)]], 1);
        assert!(s.keeps(&key, || Some(&shared), names));
        // So does a record whose body cannot be had.
        assert!(s.keeps(&key, || None, names));
    }
}
