//! The sieve a select's walk passes to `sieve_chunk` (ops.rs), from the
//! terms lib/heft/match_spec.ex (`sieve/2`) builds: a list of clauses, each
//! a list of tests
//!
//!   {:arity, path, n} | {:cmp, path, op, constant} | {:same, path, path}
//!   | {:is, path, type}
//!
//! where a path is a list of 0-based element indices from the object, `op`
//! one of `:<`, `:"=<"`, `:>`, `:>=`, `:==`, `:"/="`, `:"=:="`, `:"=/="`, and
//! `type` one of `:integer`, `:float`, `:number`, `:atom`, `:binary`,
//! `:tuple`, `:list`, `:map`. Constants are encoded as keys of the table
//! (its atom ids, canonical form), which heft_core::sieve compares against.

use heft_core::sieve::{Clause, Op, Sieve, Test, Type};
use rustler::{Atom, Env, NifResult, Term};

use crate::codec::{EncodeError, TermEncoder};
use crate::errors::{badarg, retry_cpu};
use crate::ops::Sched;
use crate::resource::TableRes;

mod atoms {
    rustler::atoms! {
        arity, cmp, same, is,
        lt = "<", le = "=<", gt = ">", ge = ">=", eq = "==", ne = "/=",
        exact_eq = "=:=", exact_ne = "=/=",
        integer, float, number, atom, binary, tuple, list, map,
    }
}

/// The sieve `term` describes, or `Err(retry marker)` where a constant is
/// too big to encode on a normal scheduler.
pub fn decode<'a>(
    env: Env<'a>,
    sched: Sched,
    t: &TableRes,
    term: Term<'a>,
) -> NifResult<Result<Sieve, Term<'a>>> {
    let bad = || badarg("not a sieve");
    let mut enc = TermEncoder::new(&t.atoms, sched.budget());
    let clauses: Vec<Vec<Term>> = term.decode().map_err(|_| bad())?;
    let mut out: Vec<Clause> = Vec::with_capacity(clauses.len());
    for clause in clauses {
        let mut tests = Vec::with_capacity(clause.len());
        for test in clause {
            let elems = rustler::types::tuple::get_tuple(test).map_err(|_| bad())?;
            let what: Atom = elems.first().ok_or_else(bad)?.decode().map_err(|_| bad())?;
            let path = |i: usize| -> NifResult<Vec<u32>> {
                elems.get(i).ok_or_else(bad)?.decode().map_err(|_| bad())
            };
            tests.push(match elems.len() {
                3 if what == atoms::arity() => Test::Arity {
                    path: path(1)?,
                    arity: elems[2].decode().map_err(|_| bad())?,
                },
                3 if what == atoms::same() => Test::Same {
                    a: path(1)?,
                    b: path(2)?,
                },
                3 if what == atoms::is() => Test::Is {
                    path: path(1)?,
                    ty: type_of(elems[2].decode().map_err(|_| bad())?).ok_or_else(bad)?,
                },
                4 if what == atoms::cmp() => {
                    let op = op_of(elems[2].decode().map_err(|_| bad())?).ok_or_else(bad)?;
                    let value = match enc.key(env, elems[3]) {
                        Ok(v) => v,
                        Err(EncodeError::TooBig) => return Ok(Err(retry_cpu(env))),
                        Err(e) => return Err(badarg(e.message())),
                    };
                    Test::Cmp {
                        path: path(1)?,
                        op,
                        value,
                    }
                }
                _ => return Err(bad()),
            });
        }
        out.push(tests);
    }
    Ok(Ok(Sieve::new(out, t.keypos)))
}

fn op_of(a: Atom) -> Option<Op> {
    Some(match a {
        a if a == atoms::lt() => Op::Lt,
        a if a == atoms::le() => Op::Le,
        a if a == atoms::gt() => Op::Gt,
        a if a == atoms::ge() => Op::Ge,
        a if a == atoms::eq() => Op::Eq,
        a if a == atoms::ne() => Op::Ne,
        a if a == atoms::exact_eq() => Op::ExactEq,
        a if a == atoms::exact_ne() => Op::ExactNe,
        _ => return None,
    })
}

fn type_of(a: Atom) -> Option<Type> {
    Some(match a {
        a if a == atoms::integer() => Type::Integer,
        a if a == atoms::float() => Type::Float,
        a if a == atoms::number() => Type::Number,
        a if a == atoms::atom() => Type::Atom,
        a if a == atoms::binary() => Type::Binary,
        a if a == atoms::tuple() => Type::Tuple,
        a if a == atoms::list() => Type::List,
        a if a == atoms::map() => Type::Map,
        _ => return None,
    })
}
