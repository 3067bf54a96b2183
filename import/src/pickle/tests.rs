use std::path::PathBuf;

use super::*;

/// The real Flight Recorder dumps (`<dir>/fr_traces/<scenario>/_dump_<rank>`), when this
/// machine has them (`COMMINSIGHT_REAL_TRACES` or `/work/shared/data/real-traces`).
pub(crate) fn real_fr_dir() -> Option<PathBuf> {
    let base = std::env::var_os("COMMINSIGHT_REAL_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/shared/data/real-traces"));
    let d = base.join("nvrx-fr-hang-16rank").join("fr_traces");
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!("skipped: no real Flight Recorder dumps at {}", d.display());
        None
    }
}

#[test]
fn real_dumps_parse_and_equal_their_json() {
    let Some(dir) = real_fr_dir() else { return };
    let mut n = 0;
    for sc in ["gpu_error_2nd", "lock_gil_1st"] {
        for r in 0..16 {
            let p = dir.join(sc).join(format!("_dump_{r}"));
            let bytes = std::fs::read(&p).unwrap();
            let v = parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(p.with_extension("json")).unwrap()).unwrap();
            assert_eq!(v.to_json(), json, "{}", p.display());
            assert!(v.get("entries").is_some());
            n += 1;
        }
    }
    assert_eq!(n, 32);
}

fn refused_name(bytes: &[u8]) -> (&'static str, usize, String) {
    match parse(bytes) {
        Err(PickleError::Refused {
            opcode,
            offset,
            what,
        }) => (opcode, offset, what),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn code_opcodes_are_refused_before_anything() {
    let (op, at, what) = refused_name(b"cos\nsystem\n(S'echo'\ntR.");
    assert_eq!((op, at), ("GLOBAL", 0));
    assert!(what.contains("os.system"), "{what}");
    let msg = parse(b"cos\nsystem\n(S'echo'\ntR.")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("only plain data") && msg.contains("byte 0"),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
    // REDUCE on plain data is refused at its own offset.
    let (op, at, _) = refused_name(b"\x80\x02N)R.");
    assert_eq!((op, at), ("REDUCE", 4));
    // STACK_GLOBAL names what it wanted.
    let (op, at, what) = refused_name(b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.");
    assert_eq!((op, at), ("STACK_GLOBAL", 18));
    assert!(what.contains("builtins.eval"), "{what}");
    // A long name is truncated.
    let mut g = b"c".to_vec();
    g.extend(std::iter::repeat_n(b'a', 500));
    g.extend(b"\nb\n.");
    let (_, _, what) = refused_name(&g);
    assert!(what.len() < 120, "{what}");
    for (b, name) in [
        (&b"\x80\x02N}b."[..], "BUILD"),
        (b"(i__main__\nX\n.", "INST"),
        (b"\x80\x02N)\x81.", "NEWOBJ"),
        (b"\x80\x02\x82\x01.", "EXT1"),
        (b"Pid\n.", "PERSID"),
        (b"\x80\x05\x97.", "NEXT_BUFFER"),
    ] {
        assert_eq!(refused_name(b).0, name);
    }
    assert!(matches!(
        parse(b"\x80\x02\xff."),
        Err(PickleError::UnknownOpcode {
            byte: 0xff,
            offset: 2
        })
    ));
}

#[test]
fn plain_data_of_every_protocol() {
    // Protocol 0: dict with text ints, a quoted string, a float, a list.
    let v = parse(b"(dp0\nS'a'\np1\nI5\nsS'b'\np2\n(lp3\nF1.5\naI01\nasg1\nL-3L\ns.").unwrap();
    assert_eq!(v.to_json(), serde_json::json!({"a": -3, "b": [1.5, true]}));
    // Protocol 4: frame, set, frozenset, bytes, tuple keys, memoize.
    let v = parse(
        b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00}\x94(K\x01K\x02\x86\x94\x8f\x94(K\x03\x90C\x02hiC\x02yo\x8c\x01x(K\x07\x91u.",
    )
    .unwrap();
    assert_eq!(
        v.to_json(),
        serde_json::json!({"[1,2]": [3], "hi": "yo", "x": [7]})
    );
    // Big and small binary ints, floats, None, NaN as null.
    let v = parse(b"\x80\x02(\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01J\xff\xff\xff\xffG\x7f\xf8\x00\x00\x00\x00\x00\x00NM\x01\x01l.")
        .unwrap();
    assert_eq!(
        v.to_json(),
        serde_json::json!([18446744073709551616.0, -1, null, null, 257])
    );
}

#[test]
fn shared_lists_see_later_appends() {
    let v = parse(b"\x80\x02]q\x00}(X\x01\x00\x00\x00xh\x00X\x01\x00\x00\x00yh\x00u0K\x01a.");
    // After POP of the dict, the list gets 1 and is returned.
    assert_eq!(v.unwrap().to_json(), serde_json::json!([1]));
    let v = parse(b"\x80\x02]q\x00}q\x01(X\x01\x00\x00\x00xh\x00u0K\x01a0h\x01.").unwrap();
    assert_eq!(v.to_json(), serde_json::json!({"x": [1]}));
}

#[test]
fn self_reference_and_memo_bombs_are_bounded() {
    // l = []; l.append(l)
    let e = parse(b"\x80\x02]q\x00h\x00a.").unwrap_err();
    assert!(matches!(e, PickleError::Limit { .. }), "{e}");
    // Nested doubling: each level a tuple of two references to the previous one.
    let mut b = b"\x80\x02X\x04\x00\x00\x00abcdq\x00".to_vec();
    for i in 0..60u8 {
        b.extend([b'h', i, b'h', i, 0x86, b'q', i + 1]);
    }
    b.push(b'.');
    let e = parse(&b).unwrap_err();
    assert!(e.to_string().contains("too large"), "{e}");
}

#[test]
fn truncated_and_huge_lengths_are_errors() {
    for b in [
        &b""[..],
        b"\x80",
        b"\x80\x02",
        b"\x80\x02X\x05\x00\x00\x00ab",
        b"\x80\x02J\x01\x02",
        b"\x80\x02]",
        b"I12",
        b"\x80\x02\x8b\xff\xff\xff\x7f.",
    ] {
        let e = parse(b).unwrap_err();
        assert!(
            matches!(e, PickleError::Truncated { .. } | PickleError::Limit { .. }),
            "{b:?}: {e}"
        );
    }
    // 8-byte lengths near u64::MAX never allocate.
    let e = parse(b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabc.").unwrap_err();
    assert!(matches!(e, PickleError::Truncated { .. }), "{e}");
    let e = parse(b"\x80\x04\x8e\xf0\xff\xff\xff\xff\xff\xff\x7f.").unwrap_err();
    assert!(matches!(e, PickleError::Truncated { .. }), "{e}");
    // Stack underflow, missing mark, bad memo key.
    for b in [
        &b"\x80\x02."[..],
        b"\x80\x02e.",
        b"\x80\x02h\x03.",
        b"\x80\x02K\x01a.",
    ] {
        assert!(
            matches!(parse(b), Err(PickleError::Invalid { .. })),
            "{b:?}"
        );
    }
}

#[test]
fn deep_nesting_is_refused_not_overflowed() {
    let mut b = b"\x80\x02".to_vec();
    b.extend(std::iter::repeat_n(b']', 100_000));
    b.extend(std::iter::repeat_n(b'a', 99_999));
    b.push(b'.');
    let e = parse(&b).unwrap_err();
    assert!(e.to_string().contains("nested deeper"), "{e}");
    let mut ok = b"\x80\x02".to_vec();
    ok.extend(std::iter::repeat_n(b']', 150));
    ok.extend(std::iter::repeat_n(b'a', 149));
    ok.push(b'.');
    assert!(parse(&ok).is_ok());
}

/// xorshift64: a deterministic stream of pseudo-random numbers.
pub(crate) struct XorShift(pub u64);

impl XorShift {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// `base` with a few random byte changes, insertions, deletions or a cut.
    pub(crate) fn mutate(&mut self, base: &[u8]) -> Vec<u8> {
        let mut b = base.to_vec();
        let n = 1 + self.next() % 8;
        for _ in 0..n {
            let len = b.len().max(1) as u64;
            let at = (self.next() % len) as usize;
            match self.next() % 6 {
                0 => b.truncate(at),
                1 if at < b.len() => {
                    b.remove(at);
                }
                2 => b.insert(at.min(b.len()), self.next() as u8),
                3 if at < b.len() => b[at] = [0x00, 0x7f, 0x80, 0xff][(self.next() % 4) as usize],
                _ if at < b.len() => b[at] = self.next() as u8,
                _ => {}
            }
        }
        b
    }
}

#[test]
fn random_mutations_of_a_real_dump_never_panic() {
    let Some(dir) = real_fr_dir() else { return };
    let base = std::fs::read(dir.join("gpu_error_2nd").join("_dump_9")).unwrap();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0;
    for _ in 0..20_000 {
        let m = rng.mutate(&base);
        if let Ok(v) = parse(&m) {
            let _ = v.to_json();
            ok += 1;
        }
    }
    eprintln!("{ok} of 20000 mutations still parse");
}
