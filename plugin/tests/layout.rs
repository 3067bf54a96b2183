//! The `#[repr(C)]` ABI types against the measured layout in research/nccl-abi.md §2.6 (the
//! output of `nccl_layout.c` compiled against NCCL's own headers): every SIZE / FIELD / CONST line
//! for the types we implement must match our table, and every row of our table must be in the doc.

use std::collections::BTreeMap;

use nccl_profiler_comminsight::abi::{self, v4, v5, v6, LayoutRow};

const TYPES: &[&str] = &[
    "ncclProfiler_v4_t",
    "ncclProfiler_v5_t",
    "ncclProfiler_v6_t",
    "ncclProfilerEventDescr_v4_t",
    "ncclProfilerEventDescr_v5_t",
    "ncclProfilerEventDescr_v6_t",
    "ncclProfilerEventStateArgs_v4_t",
    "ncclProfilerEventStateArgs_v5_t",
    "ncclProfilerEventStateArgs_v6_t",
    "ncclProfilerNetIbDescr_v1_t",
    "ncclProfilerNetSockDescr_v1_t",
];

fn doc() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/research/nccl-abi.md"
    );
    std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("cannot read the ABI reference {path} ({e}); the layout test needs research/nccl-abi.md §2.6")
    })
}

fn num(field: &str, key: &str) -> usize {
    field
        .strip_prefix(key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("malformed {key}: {field:?}"))
}

/// name -> (first, second) where SIZE = (align, size), FIELD = (off, size).
fn parse(doc: &str) -> (BTreeMap<String, (usize, usize)>, BTreeMap<String, i64>) {
    let mut rows = BTreeMap::new();
    let mut consts = BTreeMap::new();
    for line in doc.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["SIZE", name, size, align] => {
                rows.insert(name.to_string(), (num(align, "align="), num(size, "size=")));
            }
            ["FIELD", name, off, size] => {
                rows.insert(name.to_string(), (num(off, "off="), num(size, "size=")));
            }
            ["CONST", name, value] => {
                consts.insert(name.to_string(), value.parse().expect("CONST value"));
            }
            _ => {}
        }
    }
    (rows, consts)
}

fn ours() -> BTreeMap<String, (usize, usize)> {
    let tables: &[&[LayoutRow]] = &[
        v4::PROFILER_V4,
        v5::PROFILER_V5,
        v6::PROFILER_V6,
        v4::DESCR_V4,
        v5::DESCR_V5,
        v6::DESCR_V6,
        abi::STATE_ARGS_V4,
        abi::STATE_ARGS_V5,
        abi::STATE_ARGS_V6,
        abi::NET_IB_V1,
        abi::NET_SOCK_V1,
    ];
    let mut m = BTreeMap::new();
    for t in tables {
        for (name, a, b) in t.iter() {
            assert!(
                m.insert(name.to_string(), (*a, *b)).is_none(),
                "duplicate row {name}"
            );
        }
    }
    m
}

fn type_of(name: &str) -> &str {
    name.split('.').next().unwrap()
}

#[test]
fn every_documented_offset_and_size_matches_our_types() {
    let (doc_rows, _) = parse(&doc());
    let ours = ours();
    let mut checked = 0;
    for (name, want) in doc_rows.iter().filter(|(n, _)| TYPES.contains(&type_of(n))) {
        let got = ours
            .get(name)
            .unwrap_or_else(|| panic!("{name} is in nccl-abi.md §2.6 but not in our layout table"));
        assert_eq!(
            got, want,
            "{name}: ours (off|align, size) = {got:?}, doc = {want:?}"
        );
        checked += 1;
    }
    for name in ours.keys() {
        assert!(
            doc_rows.contains_key(name),
            "{name} is in our table but not in nccl-abi.md §2.6"
        );
    }
    assert!(
        checked >= 200,
        "only {checked} rows checked: did §2.6 change format?"
    );
}

#[test]
fn every_documented_constant_matches() {
    let (_, consts) = parse(&doc());
    assert!(consts.len() >= 50, "CONST lines missing from §2.6");
    let ours: BTreeMap<&str, i64> = abi::CONSTANTS.iter().copied().collect();
    for (name, want) in &consts {
        assert_eq!(ours.get(name.as_str()), Some(want), "CONST {name}");
    }
    assert_eq!(
        ours.len(),
        consts.len(),
        "we define constants the doc does not list"
    );
}
