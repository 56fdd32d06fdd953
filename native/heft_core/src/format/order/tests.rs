//! The comparator against a model: a plain tree of Erlang terms with a
//! straightforward recursive term order, written from the Erlang reference
//! manual (and, for pids, ports, references and funs, from what OTP 25
//! answers). Terms are encoded the way the NIF encodes keys, with big
//! integers, pids, ports, references, funs and bitstrings as ETF pieces.

use super::*;
use crate::codec::Value;
use crate::testutil::Rng;

/// A model term.
#[derive(Clone, Debug)]
enum M {
    I(i128),
    F(f64),
    A(String),
    /// Node, creation, ID words (ID[0] first).
    Ref(String, u32, Vec<u32>),
    /// Module, old index, old uniq, captured variables.
    Fun(String, i64, i64, Vec<M>),
    Exp(String, String, u8),
    /// Node, creation, number.
    Port(String, u32, u64),
    /// Node, creation, id, serial.
    Pid(String, u32, u32, u32),
    T(Vec<M>),
    Map(Vec<(M, M)>),
    Nil,
    /// Non-empty elements and a tail that is not a list.
    L(Vec<M>, Box<M>),
    /// Bytes and bit length.
    Bits(Vec<u8>, u64),
}

use M::*;

fn class_of(m: &M) -> u8 {
    match m {
        I(_) | F(_) => 0,
        A(_) => 1,
        Ref(..) => 2,
        Fun(..) | Exp(..) => 3,
        Port(..) => 4,
        Pid(..) => 5,
        T(_) => 6,
        Map(_) => 7,
        Nil => 8,
        L(..) => 9,
        Bits(..) => 10,
    }
}

fn model_int_float(i: i128, f: f64) -> Ordering {
    // Model integers stay below 2^100 in magnitude.
    if f >= 2f64.powi(101) {
        return Less;
    }
    if f <= -(2f64.powi(101)) {
        return Greater;
    }
    let fl = f.floor();
    i.cmp(&(fl as i128)).then(if fl < f { Less } else { Equal })
}

fn bits_of(bytes: &[u8], n: u64) -> Vec<bool> {
    (0..n)
        .map(|i| bytes[(i / 8) as usize] & (0x80 >> (i % 8)) != 0)
        .collect()
}

fn ref_num(words: &[u32]) -> Vec<u32> {
    let mut w: Vec<u32> = words.to_vec();
    while w.last() == Some(&0) {
        w.pop();
    }
    w.reverse();
    w
}

fn model(a: &M, b: &M, exact: bool) -> Ordering {
    let (ca, cb) = (class_of(a), class_of(b));
    if ca != cb {
        return ca.cmp(&cb);
    }
    match (a, b) {
        (I(x), I(y)) => x.cmp(y),
        (F(x), F(y)) => x.partial_cmp(y).unwrap(),
        (I(_), F(_)) if exact => Less,
        (F(_), I(_)) if exact => Greater,
        (I(x), F(y)) => model_int_float(*x, *y),
        (F(x), I(y)) => model_int_float(*y, *x).reverse(),
        (A(x), A(y)) => x.cmp(y),
        (Ref(n1, c1, w1), Ref(n2, c2, w2)) => n1.cmp(n2).then(c1.cmp(c2)).then_with(|| {
            let (x, y) = (ref_num(w1), ref_num(w2));
            x.len().cmp(&y.len()).then(x.cmp(&y))
        }),
        (Fun(..), Exp(..)) => Less,
        (Exp(..), Fun(..)) => Greater,
        (Fun(m1, i1, u1, e1), Fun(m2, i2, u2, e2)) => m1
            .cmp(m2)
            .then(i1.cmp(i2))
            .then(u1.cmp(u2))
            .then(e1.len().cmp(&e2.len()))
            .then_with(|| seq(e1, e2, exact)),
        (Exp(m1, f1, a1), Exp(m2, f2, a2)) => (m1, f1, a1).cmp(&(m2, f2, a2)),
        (Port(n1, c1, i1), Port(n2, c2, i2)) => (n1, c1, i1).cmp(&(n2, c2, i2)),
        (Pid(n1, c1, i1, s1), Pid(n2, c2, i2, s2)) => (s1, i1, n1, c1).cmp(&(s2, i2, n2, c2)),
        (T(x), T(y)) => x.len().cmp(&y.len()).then_with(|| seq(x, y, exact)),
        (Map(x), Map(y)) => {
            let sorted = |m: &Vec<(M, M)>| {
                let mut v = m.clone();
                v.sort_by(|p, q| model(&p.0, &q.0, true));
                v
            };
            let (x, y) = (sorted(x), sorted(y));
            let kx: Vec<M> = x.iter().map(|p| p.0.clone()).collect();
            let ky: Vec<M> = y.iter().map(|p| p.0.clone()).collect();
            let vx: Vec<M> = x.iter().map(|p| p.1.clone()).collect();
            let vy: Vec<M> = y.iter().map(|p| p.1.clone()).collect();
            kx.len()
                .cmp(&ky.len())
                .then_with(|| seq(&kx, &ky, true))
                .then_with(|| seq(&vx, &vy, exact))
        }
        (Nil, Nil) => Equal,
        (L(x, xt), L(y, yt)) => {
            let o = model(&x[0], &y[0], exact);
            if o != Equal {
                return o;
            }
            model(&rest(x, xt), &rest(y, yt), exact)
        }
        (Bits(x, nx), Bits(y, ny)) => bits_of(x, *nx).cmp(&bits_of(y, *ny)),
        _ => unreachable!("same class"),
    }
}

/// What follows a list's first cell: its other cells, or its tail.
fn rest(es: &[M], t: &M) -> M {
    if es.len() > 1 {
        L(es[1..].to_vec(), Box::new(t.clone()))
    } else {
        t.clone()
    }
}

fn seq(x: &[M], y: &[M], exact: bool) -> Ordering {
    for (a, b) in x.iter().zip(y) {
        let o = model(a, b, exact);
        if o != Equal {
            return o;
        }
    }
    x.len().cmp(&y.len())
}

/// Atom names, interned as the table's dictionary would.
#[derive(Default)]
struct Names(Vec<String>);

impl Names {
    fn id(&mut self, s: &str) -> u32 {
        match self.0.iter().position(|n| n == s) {
            Some(i) => i as u32,
            None => {
                self.0.push(s.to_string());
                (self.0.len() - 1) as u32
            }
        }
    }

    fn name(&self, id: u32) -> &str {
        &self.0[id as usize]
    }
}

fn etf_atom(out: &mut Vec<u8>, s: &str) {
    out.push(119);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

fn etf_big(out: &mut Vec<u8>, i: i128) {
    let mag = i.unsigned_abs().to_le_bytes();
    let len = mag.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    out.extend_from_slice(&[110, len as u8, u8::from(i < 0)]);
    out.extend_from_slice(&mag[..len]);
}

/// A model term in ETF (no version byte).
fn etf(m: &M, out: &mut Vec<u8>) {
    match m {
        I(i) if (0..256).contains(i) => out.extend_from_slice(&[97, *i as u8]),
        I(i) if i32::try_from(*i).is_ok() => {
            out.push(98);
            out.extend_from_slice(&(*i as i32).to_be_bytes());
        }
        I(i) => etf_big(out, *i),
        F(f) => {
            out.push(70);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        A(s) => etf_atom(out, s),
        Ref(n, c, w) => {
            out.push(90);
            out.extend_from_slice(&(w.len() as u16).to_be_bytes());
            etf_atom(out, n);
            out.extend_from_slice(&c.to_be_bytes());
            w.iter()
                .for_each(|x| out.extend_from_slice(&x.to_be_bytes()));
        }
        Fun(module, old_index, old_uniq, env) => {
            let mut body = vec![0u8; 16 + 1];
            body.extend_from_slice(&(*old_index as u32).to_be_bytes());
            body.extend_from_slice(&(env.len() as u32).to_be_bytes());
            etf_atom(&mut body, module);
            etf(&I(i128::from(*old_index)), &mut body);
            etf(&I(i128::from(*old_uniq)), &mut body);
            etf(&Pid("nonode@nohost".into(), 0, 0, 0), &mut body);
            env.iter().for_each(|e| etf(e, &mut body));
            out.push(112);
            out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
            out.extend_from_slice(&body);
        }
        Exp(m, f, a) => {
            out.push(113);
            etf_atom(out, m);
            etf_atom(out, f);
            out.extend_from_slice(&[97, *a]);
        }
        Port(n, c, i) => {
            out.push(120);
            etf_atom(out, n);
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&c.to_be_bytes());
        }
        Pid(n, c, i, s) => {
            out.push(88);
            etf_atom(out, n);
            out.extend_from_slice(&i.to_be_bytes());
            out.extend_from_slice(&s.to_be_bytes());
            out.extend_from_slice(&c.to_be_bytes());
        }
        T(es) => {
            out.extend_from_slice(&[104, es.len() as u8]);
            es.iter().for_each(|e| etf(e, out));
        }
        Map(kvs) => {
            out.push(116);
            out.extend_from_slice(&(kvs.len() as u32).to_be_bytes());
            for (k, v) in kvs {
                etf(k, out);
                etf(v, out);
            }
        }
        Nil => out.push(106),
        L(es, t) => {
            out.push(108);
            out.extend_from_slice(&(es.len() as u32).to_be_bytes());
            es.iter().for_each(|e| etf(e, out));
            etf(t, out);
        }
        Bits(b, n) if n % 8 == 0 => {
            out.push(109);
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.extend_from_slice(b);
        }
        Bits(b, n) => {
            out.push(77);
            out.extend_from_slice(&(b.len() as u32).to_be_bytes());
            out.push((n % 8) as u8);
            out.extend_from_slice(b);
        }
    }
}

fn piece(m: &M) -> Value {
    let mut out = vec![131];
    etf(m, &mut out);
    Value::Etf(out)
}

/// A model term as the NIF would encode it as a key (map pairs in the
/// order given, which the comparator must not rely on).
fn value(m: &M, names: &mut Names) -> Value {
    match m {
        I(i) => match i64::try_from(*i) {
            Ok(i) => Value::Int(i),
            Err(_) => piece(m),
        },
        F(f) => Value::Float(*f),
        A(s) => Value::Atom(names.id(s)),
        Ref(..) | Fun(..) | Exp(..) | Port(..) | Pid(..) => piece(m),
        T(es) => Value::Tuple(es.iter().map(|e| value(e, names)).collect()),
        Map(kvs) => Value::Map(
            kvs.iter()
                .map(|(k, v)| (value(k, names), value(v, names)))
                .collect(),
        ),
        Nil => Value::Nil,
        L(es, t) => Value::List(
            es.iter().map(|e| value(e, names)).collect(),
            Box::new(value(t, names)),
        ),
        Bits(b, n) if n % 8 == 0 => Value::Binary(b.clone()),
        Bits(..) => piece(m),
    }
}

fn check(a: &M, b: &M, names: &mut Names) {
    let (ea, eb) = (value(a, names).to_bytes(), value(b, names).to_bytes());
    let name = |id| names.name(id);
    for exact in [false, true] {
        let want = model(a, b, exact);
        let got = try_compare(&ea, &eb, &name, exact).expect("well-formed keys");
        assert_eq!(got, want, "exact={exact}\n a = {a:?}\n b = {b:?}");
        let back = try_compare(&eb, &ea, &name, exact).unwrap();
        assert_eq!(back, want.reverse(), "antisymmetry\n a = {a:?}\n b = {b:?}");
    }
    check_prefix(a, b, names);
}

/// The keys' prefixes keep their term order: `a < b` gives
/// `prefix(a) <= prefix(b)`, `a == b` equal prefixes.
fn check_prefix(a: &M, b: &M, names: &mut Names) {
    let (ea, eb) = (value(a, names).to_bytes(), value(b, names).to_bytes());
    let name = |id| names.name(id);
    let pa = prefix(&ea, name).expect("a well-formed key has a prefix");
    let pb = prefix(&eb, name).expect("a well-formed key has a prefix");
    let ok = match model(a, b, false) {
        Less => pa <= pb,
        Equal => pa == pb,
        Greater => pa >= pb,
    };
    assert!(ok, "prefixes {pa:#x} vs {pb:#x}\n a = {a:?}\n b = {b:?}");
}

fn l(es: Vec<M>) -> M {
    if es.is_empty() {
        Nil
    } else {
        L(es, Box::new(Nil))
    }
}

fn a(s: &str) -> M {
    A(s.to_string())
}

fn pid(node: &str, creation: u32, id: u32, serial: u32) -> M {
    Pid(node.to_string(), creation, id, serial)
}

/// One representative of every class, in ascending term order.
fn one_of_each() -> Vec<M> {
    vec![
        I(-5),
        a("ok"),
        Ref("n@h".into(), 1, vec![1, 2, 3]),
        Fun("m".into(), 0, 1, vec![]),
        Exp("m".into(), "f".into(), 1),
        Port("n@h".into(), 1, 7),
        pid("n@h", 1, 7, 0),
        T(vec![]),
        Map(vec![]),
        Nil,
        l(vec![I(1)]),
        Bits(vec![], 0),
    ]
}

#[test]
fn classes_sort_in_erlang_order() {
    let mut names = Names::default();
    let all = one_of_each();
    for (i, x) in all.iter().enumerate() {
        for (j, y) in all.iter().enumerate() {
            check(x, y, &mut names);
            let (ex, ey) = (
                value(x, &mut names).to_bytes(),
                value(y, &mut names).to_bytes(),
            );
            assert_eq!(
                compare(&ex, &ey, |id| names.name(id)),
                i.cmp(&j),
                "{x:?} vs {y:?}"
            );
        }
    }
}

#[test]
fn numbers_compare_exactly_across_integers_floats_and_bignums() {
    let two53 = 9_007_199_254_740_992i128;
    let cases: Vec<(M, M, Ordering)> = vec![
        (I(1), F(1.0), Equal),
        (I(0), F(-0.0), Equal),
        (I(1), F(1.5), Less),
        (I(2), F(1.5), Greater),
        (I(-1), F(-0.5), Less),
        (I(-1), F(-1.5), Greater),
        (I(two53 + 1), F(9_007_199_254_740_992.0), Greater),
        (I(two53), F(9_007_199_254_740_992.0), Equal),
        (I(i128::from(i64::MAX)), F(TWO_63), Less),
        (I(i128::from(i64::MIN)), F(-TWO_63), Equal),
        (I(1 << 64), F(18_446_744_073_709_551_616.0), Equal),
        (I((1 << 64) + 1), F(18_446_744_073_709_551_616.0), Greater),
        (I(-(1 << 64) - 1), F(-18_446_744_073_709_551_616.0), Less),
        (I(1 << 80), F(1e300), Less),
        (I(-(1 << 80)), F(-1e300), Greater),
        (I(1 << 80), I(1 << 79), Greater),
        (I(-(1 << 80)), I(i128::from(i64::MIN)), Less),
        (I(1 << 70), I(i128::from(i64::MAX)), Greater),
        (F(0.1), F(0.2), Less),
    ];
    let mut names = Names::default();
    for (x, y, want) in &cases {
        assert_eq!(model(x, y, false), *want, "model: {x:?} vs {y:?}");
        check(x, y, &mut names);
    }
    // Map-key order: every integer before every float.
    assert_eq!(model(&I(100), &F(1.0), true), Less);
    check(&I(100), &F(1.0), &mut names);
}

#[test]
fn atoms_compare_by_name_whatever_their_ids_or_encoding() {
    let mut names = Names::default();
    // Interned out of order: ids do not follow names.
    for s in ["zeta", "alpha", "ÿ", "ā", "日本", "", "ab"] {
        names.id(s);
    }
    let atoms = ["", "ab", "alpha", "zeta", "ÿ", "ā", "日本"];
    for (i, x) in atoms.iter().enumerate() {
        for (j, y) in atoms.iter().enumerate() {
            let (ex, ey) = (
                value(&a(x), &mut names).to_bytes(),
                value(&a(y), &mut names).to_bytes(),
            );
            assert_eq!(compare(&ex, &ey, |id| names.name(id)), i.cmp(&j));
        }
    }
    // A latin-1 ETF atom (in a pid's node) against UTF-8 ones.
    let latin1 = |name: &[u8]| {
        let mut b = vec![131, 88, 100, 0, name.len() as u8];
        b.extend_from_slice(name);
        b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        Value::Etf(b).to_bytes()
    };
    let utf8 = value(&pid("ā", 0, 1, 0), &mut names).to_bytes();
    let y_umlaut = latin1(&[0xff]);
    assert_eq!(compare(&y_umlaut, &utf8, |id| names.name(id)), Less);
    let same = value(&pid("ÿ", 0, 1, 0), &mut names).to_bytes();
    assert_eq!(compare(&y_umlaut, &same, |id| names.name(id)), Equal);
}

#[test]
fn pids_ports_references_and_funs_follow_otp() {
    let mut names = Names::default();
    let cases = vec![
        // Pids: serial, then number, then node, then creation.
        (pid("b@h", 0, 5, 0), pid("a@h", 9, 6, 0), Less),
        (pid("b@h", 0, 9, 0), pid("a@h", 0, 1, 1), Less),
        (pid("a@h", 1, 5, 0), pid("b@h", 0, 5, 0), Less),
        (pid("a@h", 1, 5, 0), pid("a@h", 2, 5, 0), Less),
        // Ports: node, creation, number.
        (Port("a@h".into(), 9, 9), Port("b@h".into(), 0, 0), Less),
        (Port("a@h".into(), 1, 9), Port("a@h".into(), 2, 0), Less),
        (
            Port("a@h".into(), 1, 1 << 40),
            Port("a@h".into(), 1, 2),
            Greater,
        ),
        // References: node, creation, then the number from its high word;
        // high zero words do not count.
        (
            Ref("a@h".into(), 5, vec![9, 9, 9]),
            Ref("b@h".into(), 0, vec![1]),
            Less,
        ),
        (
            Ref("a@h".into(), 1, vec![1, 0]),
            Ref("a@h".into(), 1, vec![1]),
            Equal,
        ),
        (
            Ref("a@h".into(), 1, vec![9, 1]),
            Ref("a@h".into(), 1, vec![1, 2]),
            Less,
        ),
        (
            Ref("a@h".into(), 1, vec![0, 0, 1]),
            Ref("a@h".into(), 1, vec![7, 7]),
            Greater,
        ),
        // Local funs before external ones; captured variables last.
        (
            Fun("z".into(), 9, 9, vec![]),
            Exp("a".into(), "a".into(), 0),
            Less,
        ),
        (
            Fun("a".into(), 2, 0, vec![]),
            Fun("a".into(), 1, 5, vec![]),
            Greater,
        ),
        (
            Fun("a".into(), 1, 1, vec![I(1)]),
            Fun("a".into(), 1, 1, vec![F(1.0)]),
            Equal,
        ),
        (
            Fun("a".into(), 1, 1, vec![I(1), a("x")]),
            Fun("a".into(), 1, 1, vec![I(1), a("y")]),
            Less,
        ),
        (
            Fun("a".into(), 1, 1, vec![l(vec![I(1)])]),
            Fun("a".into(), 1, 1, vec![I(1), I(1)]),
            Less,
        ),
        (
            Fun(
                "a".into(),
                1,
                1,
                vec![Map(vec![(I(1), a("v")), (F(1.0), a("w"))])],
            ),
            Fun(
                "a".into(),
                1,
                1,
                vec![Map(vec![(F(1.0), a("w")), (I(1), a("v"))])],
            ),
            Equal,
        ),
        (
            Exp("m".into(), "f".into(), 2),
            Exp("m".into(), "f".into(), 1),
            Greater,
        ),
        (
            Exp("m".into(), "g".into(), 0),
            Exp("m".into(), "f".into(), 9),
            Greater,
        ),
    ];
    for (x, y, want) in &cases {
        assert_eq!(model(x, y, false), *want, "model: {x:?} vs {y:?}");
        check(x, y, &mut names);
    }
}

#[test]
fn compound_terms() {
    let mut names = Names::default();
    let m = |kvs: Vec<(M, M)>| Map(kvs);
    let cases = vec![
        (T(vec![I(9), I(9)]), T(vec![I(1), I(1), I(1)]), Less),
        (T(vec![I(1), a("b")]), T(vec![F(1.0), a("b")]), Equal),
        (T(vec![I(1), a("b")]), T(vec![F(1.0), a("c")]), Less),
        // Maps: size, keys in map-key order, values in key order.
        (m(vec![(a("a"), I(1))]), m(vec![(a("a"), F(1.0))]), Equal),
        (m(vec![(I(1), a("a"))]), m(vec![(F(1.0), a("a"))]), Less),
        (m(vec![(I(100), a("a"))]), m(vec![(F(1.0), a("a"))]), Less),
        (
            m(vec![(I(1), a("a")), (F(2.0), a("b"))]),
            m(vec![(F(1.0), a("a")), (I(2), a("b"))]),
            Less,
        ),
        (
            m(vec![(a("x"), I(1)), (a("y"), I(3))]),
            m(vec![(a("y"), I(2)), (a("x"), I(1))]),
            Greater,
        ),
        (
            m(vec![(I(1), I(1)), (I(2), I(2))]),
            m(vec![(I(3), I(0))]),
            Greater,
        ),
        // Lists: cell by cell; [] before any cell; improper tails.
        (l(vec![I(1), I(2)]), l(vec![I(1)]), Greater),
        (l(vec![I(1)]), l(vec![I(1), I(2)]), Less),
        (l(vec![I(1), I(2), I(3)]), l(vec![I(1), I(3)]), Less),
        (L(vec![I(1)], Box::new(I(2))), l(vec![I(1), I(2)]), Less),
        (
            L(vec![I(1)], Box::new(Bits(vec![], 0))),
            l(vec![I(1), I(2)]),
            Greater,
        ),
        (
            L(vec![I(1)], Box::new(a("x"))),
            L(vec![F(1.0)], Box::new(a("x"))),
            Equal,
        ),
        (
            L(vec![I(1), I(2)], Box::new(a("x"))),
            L(vec![I(1)], Box::new(a("x"))),
            Greater,
        ),
        (l(vec![I(1)]), Nil, Greater),
        // Bitstrings bit by bit, prefix first.
        (Bits(vec![1, 0], 9), Bits(vec![1, 0], 16), Less),
        (Bits(vec![0x20], 3), Bits(vec![1], 8), Greater),
        (Bits(vec![0x80], 1), Bits(vec![0x80], 8), Less),
        (Bits(b"abc".to_vec(), 24), Bits(b"abd".to_vec(), 24), Less),
    ];
    for (x, y, want) in &cases {
        assert_eq!(model(x, y, false), *want, "model: {x:?} vs {y:?}");
        check(x, y, &mut names);
    }
}

#[test]
fn deep_nesting_does_not_use_the_call_stack() {
    // Written directly: the model's own encoder recurses.
    let nested = |leaf: i64, list: bool| {
        let mut w = Writer::new();
        for _ in 0..100_000 {
            if list {
                w.list(1);
            } else {
                w.tuple(1);
            }
        }
        w.int(leaf);
        if list {
            (0..100_000).for_each(|_| w.nil());
        }
        w.buf
    };
    let names = |_| "";
    assert_eq!(compare(&nested(1, false), &nested(2, false), names), Less);
    assert_eq!(compare(&nested(2, true), &nested(1, true), names), Greater);
    assert_eq!(
        compare(&nested(1, true), &nested(1, true)[1..], names),
        Greater
    );
}

#[test]
fn malformed_input_falls_back_to_byte_order_without_panicking() {
    let names = |_| "";
    let good = Value::Tuple(vec![Value::Int(1), Value::Binary(b"xy".to_vec())]).to_bytes();
    for cut in 0..good.len() {
        let _ = compare(&good[..cut], &good, names);
        assert!(try_compare(&good[..cut], &good, &names, false).is_err() || cut == 0);
    }
    assert_eq!(compare(&[0x0b], &[0x0c], names), Less);
    assert!(try_compare(&[tag::ETF, 2, 131, 200], &[0x80], &names, false).is_err());
}

/// Terms drawn from small pools, so that equal and nearly equal pairs are
/// common.
fn gen(r: &mut Rng, depth: u32) -> M {
    let leaf = depth == 0 || r.below(3) == 0;
    let choice = if leaf { r.below(10) } else { 10 + r.below(5) };
    match choice {
        0 => I(r.pick(&[-2, -1, 0, 1, 2, 1 << 62, -(1 << 63), 1 << 64, -(1 << 70)])),
        1 => F(r.pick(&[
            -1.5,
            -1.0,
            -0.0,
            0.0,
            1.0,
            2.0,
            2.5,
            1e19,
            1.8446744073709552e19,
            -1e30,
        ])),
        2 => A(r.pick(&["a", "b", "ab", "ÿ", "ā"]).to_string()),
        3 => Ref(r.pick(&["a@h", "b@h"]).into(), r.pick(&[0, 1]), {
            let n = 1 + r.below(3) as usize;
            (0..n).map(|_| r.pick(&[0, 1, 7])).collect()
        }),
        4 => {
            if r.below(2) == 0 {
                Exp(
                    r.pick(&["m", "n"]).into(),
                    r.pick(&["f", "g"]).into(),
                    r.pick(&[0, 1]),
                )
            } else {
                let env = (0..r.below(3))
                    .map(|_| gen(r, depth.saturating_sub(1)))
                    .collect();
                Fun(
                    r.pick(&["m", "n"]).into(),
                    r.pick(&[0, 1]),
                    r.pick(&[5, 6]),
                    env,
                )
            }
        }
        5 => Port(
            r.pick(&["a@h", "b@h"]).into(),
            r.pick(&[0, 1]),
            r.pick(&[1, 2, 1 << 33]),
        ),
        6 => pid(
            r.pick(&["a@h", "b@h"]),
            r.pick(&[0, 1]),
            r.pick(&[1, 2]),
            r.pick(&[0, 1]),
        ),
        7 => Nil,
        8 => {
            let n = r.below(3) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| r.pick(&[0x00, 0x80, 0xff, b'a'])).collect();
            let bits = if n > 0 && r.below(2) == 0 {
                (n as u64 - 1) * 8 + 1 + r.below(7)
            } else {
                n as u64 * 8
            };
            let mut bytes = bytes;
            if bits % 8 != 0 {
                let last = bytes.len() - 1;
                bytes[last] &= 0xffu8 << (8 - bits % 8);
            }
            Bits(bytes, bits)
        }
        9 => I(r.below(3) as i128),
        10 | 11 => T((0..r.below(4)).map(|_| gen(r, depth - 1)).collect()),
        12 => {
            let n = 1 + r.below(3) as usize;
            let es = (0..n).map(|_| gen(r, depth - 1)).collect();
            let tail = if r.below(4) == 0 { gen(r, 0) } else { Nil };
            match tail {
                L(..) => L(es, Box::new(Nil)),
                t => L(es, Box::new(t)),
            }
        }
        _ => {
            // Distinct keys under map-key (exact) order.
            let mut kvs: Vec<(M, M)> = Vec::new();
            for _ in 0..r.below(4) {
                let k = gen(r, depth - 1);
                if kvs.iter().all(|(k2, _)| model(k2, &k, true) != Equal) {
                    kvs.push((k, gen(r, depth - 1)));
                }
            }
            Map(kvs)
        }
    }
}

/// A copy of `es` with one element, drawn at random, replaced by `f` of it.
fn with_one(r: &mut Rng, es: &[M], f: fn(&mut Rng, &M) -> M) -> Vec<M> {
    let mut es = es.to_vec();
    let i = r.below(es.len() as u64) as usize;
    es[i] = f(r, &es[i]);
    es
}

/// A copy of `m` with one leaf changed (or `m` itself), for near misses.
fn mutate(r: &mut Rng, m: &M) -> M {
    match m {
        T(es) if !es.is_empty() && r.below(3) != 0 => T(with_one(r, es, mutate)),
        L(es, t) if r.below(3) != 0 => L(with_one(r, es, mutate), t.clone()),
        _ if r.below(2) == 0 => m.clone(),
        _ => gen(r, 1),
    }
}

#[test]
fn random_terms_agree_with_the_model() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let mut names = Names::default();
    for _ in 0..30_000 {
        let x = gen(&mut r, 4);
        let y = if r.below(2) == 0 {
            mutate(&mut r, &x)
        } else {
            gen(&mut r, 4)
        };
        check(&x, &y, &mut names);
    }
}

#[test]
fn sorting_by_the_comparator_matches_sorting_the_model() {
    let mut r = Rng(42);
    let mut names = Names::default();
    let terms: Vec<M> = (0..2_000).map(|_| gen(&mut r, 3)).collect();
    let mut by_model = terms.clone();
    by_model.sort_by(|x, y| model(x, y, false));
    let mut encoded: Vec<(Vec<u8>, usize)> = terms
        .iter()
        .enumerate()
        .map(|(i, t)| (value(t, &mut names).to_bytes(), i))
        .collect();
    encoded.sort_by(|x, y| compare(&x.0, &y.0, |id| names.name(id)));
    for (pos, (_, i)) in encoded.iter().enumerate() {
        assert_eq!(
            model(&terms[*i], &by_model[pos], false),
            Equal,
            "position {pos}"
        );
    }
}

/// The wildcard of [`compare_bound`], as a model atom.
fn wild() -> M {
    A(WILDCARD.to_string())
}

/// [`compare_bound`] in the model: term order until a wildcard of `b`,
/// `Equal` from there (a wildcard as a list tail stands for the rest of
/// the list).
fn model_bound(a: &M, b: &M) -> Ordering {
    if matches!(b, A(s) if s == WILDCARD) {
        return Equal;
    }
    match (a, b) {
        (T(x), T(y)) if x.len() == y.len() => {
            for (p, q) in x.iter().zip(y) {
                let o = model_bound(p, q);
                if o != Equal || contains_wild(q) {
                    return o;
                }
            }
            Equal
        }
        (L(x, xt), L(y, yt)) => {
            let o = model_bound(&x[0], &y[0]);
            if o != Equal || contains_wild(&y[0]) {
                return o;
            }
            model_bound(&rest(x, xt), &rest(y, yt))
        }
        _ => model(a, b, false),
    }
}

fn contains_wild(m: &M) -> bool {
    match m {
        A(s) => s == WILDCARD,
        T(es) => es.iter().any(contains_wild),
        L(es, t) => es.iter().any(contains_wild) || contains_wild(t),
        _ => false,
    }
}

/// `m` with one subterm outside maps (a tuple element, a list element,
/// the rest of a list from some cell on, or `m` itself) replaced by the
/// wildcard: the bounds the match-spec planner makes of partly bound keys.
fn wildify(r: &mut Rng, m: &M) -> M {
    match m {
        T(es) if !es.is_empty() && r.below(4) != 0 => T(with_one(r, es, wildify)),
        L(es, t) if r.below(4) != 0 => match r.below(3) {
            // The rest of the list from some cell on.
            0 => {
                let i = r.below(es.len() as u64) as usize;
                L(es[..=i].to_vec(), Box::new(wild()))
            }
            1 => L(with_one(r, es, wildify), t.clone()),
            _ => L(es.clone(), Box::new(wildify(r, t))),
        },
        _ => wild(),
    }
}

/// Bounds built from partly bound list, tuple and improper-list keys agree
/// with the model, and the keys `Equal` to each form one run of the term
/// order (so that a range walk between the ends finds exactly them).
#[test]
fn a_bound_with_wildcards_matches_one_run_of_keys_including_list_tails() {
    let mut r = Rng(0x5EED_B0D5);
    let mut names = Names::default();
    let mut keys: Vec<M> = (0..600).map(|_| gen(&mut r, 3)).collect();
    // Lists sharing heads: [3], [3, 0], [3, 1], [3 | a], [4], ...
    for h in [3, 4] {
        keys.push(l(vec![I(h)]));
        for t in [0, 1] {
            keys.push(l(vec![I(h), I(t)]));
            keys.push(l(vec![I(h), I(t), I(0)]));
        }
        keys.push(L(vec![I(h)], Box::new(a("a"))));
        keys.push(L(vec![I(h), I(0)], Box::new(I(9))));
    }
    keys.sort_by(|x, y| model(x, y, false));
    let encoded: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| value(k, &mut names).to_bytes())
        .collect();
    let mut bounds: Vec<M> = (0..300)
        .map(|i| wildify(&mut r, &keys[i * 7 % keys.len()]))
        .collect();
    bounds.push(L(vec![I(3)], Box::new(wild())));
    bounds.push(L(vec![I(3), wild()], Box::new(Nil)));
    for b in &bounds {
        let eb = value(b, &mut names).to_bytes();
        let got: Vec<Ordering> = encoded
            .iter()
            .map(|k| compare_bound(k, &eb, |id| names.name(id)))
            .collect();
        let want: Vec<Ordering> = keys.iter().map(|k| model_bound(k, b)).collect();
        assert_eq!(got, want, "bound {b:?}");
        // Less..., Equal..., Greater...: one run.
        assert!(got.windows(2).all(|w| w[0] <= w[1]), "not one run: {b:?}");
    }
    let three = value(&bounds[300], &mut names).to_bytes();
    let cases = [
        (l(vec![I(3), I(0)]), Equal),
        (L(vec![I(3)], Box::new(a("a"))), Equal),
        (l(vec![I(3)]), Equal),
        (l(vec![I(4)]), Greater),
        (Nil, Less),
    ];
    for (k, want) in cases {
        let ek = value(&k, &mut names).to_bytes();
        assert_eq!(
            compare_bound(&ek, &three, |id| names.name(id)),
            want,
            "{k:?}"
        );
    }
}

#[test]
fn prefixes_keep_term_order_where_keys_share_their_first_bytes_or_round_alike() {
    let mut names = Names::default();
    let long = |s: &str| A(s.to_string());
    let bin = |b: &[u8]| Bits(b.to_vec(), b.len() as u64 * 8);
    let two53 = 9_007_199_254_740_992i128;
    let terms = vec![
        I(two53),
        I(two53 + 1),
        F(9_007_199_254_740_992.0),
        I(i128::from(i64::MAX)),
        I(i128::from(i64::MAX) - 1),
        F(TWO_63),
        I(1 << 64),
        F(1e300),
        F(-1e300),
        I(-(1 << 80)),
        I(i128::from(i64::MIN)),
        F(-0.0),
        F(0.0),
        I(0),
        F(f64::MIN_POSITIVE),
        long("user_account_1"),
        long("user_account_2"),
        long("user_acc"),
        long("user_ac"),
        long("\u{0}"),
        long(""),
        bin(b"abcdefgh1"),
        bin(b"abcdefgh2"),
        bin(b"abcdefgh"),
        bin(b"abcdefg"),
        bin(b""),
        Bits(vec![0x80], 1),
        Bits(vec![0x00, 0x01], 16),
        T(vec![long("user"), I(1)]),
        T(vec![long("user"), I(2)]),
        T(vec![long("users"), I(1)]),
        T(vec![I(1), F(1.0)]),
        T(vec![F(1.0), I(1)]),
        T(vec![T(vec![T(vec![I(7)])])]),
        T(vec![T(vec![T(vec![I(8)])])]),
        T((0..5000).map(|i| I(i % 3)).collect()),
        T((0..5001).map(|i| I(i % 3)).collect()),
        T((0..4095).map(|_| I(9)).collect()),
        T((0..4094).map(|_| I(9)).collect()),
        l(vec![I(1), I(2)]),
        l(vec![F(1.0)]),
        L(vec![I(1)], Box::new(I(3))),
        l(vec![l(vec![l(vec![I(1)])])]),
        Map(vec![(I(1), I(2))]),
        Map(vec![]),
        Nil,
    ];
    for x in &terms {
        for y in &terms {
            check_prefix(x, y, &mut names);
        }
    }
    // Keys that differ in their first bytes are told apart by them.
    let (x, y) = (
        value(&long("alpha"), &mut names).to_bytes(),
        value(&long("beta"), &mut names).to_bytes(),
    );
    let name = |id| names.name(id);
    assert!(prefix(&x, name) < prefix(&y, name));
    let (x, y) = (Value::Int(1).to_bytes(), Value::Int(2).to_bytes());
    assert!(prefix(&x, name) < prefix(&y, name));
    // Input the table never stores has none.
    assert_eq!(prefix(&[0x0b], name), None);
    assert_eq!(prefix(&[], name), None);
}

#[test]
fn same_bytes_is_slice_equality_at_every_length() {
    let base: Vec<u8> = (0..40).collect();
    for len in 0..=base.len() {
        let a = &base[..len];
        assert!(same_bytes(a, a));
        if len > 0 {
            assert!(!same_bytes(a, &base[..len - 1]));
        }
        for i in 0..len {
            let mut b = a.to_vec();
            b[i] ^= 0x80;
            assert!(!same_bytes(a, &b), "length {len}, byte {i}");
        }
    }
    assert!(!same_bytes(&[1], &[1, 1]));
}
