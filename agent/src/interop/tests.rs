//! Flight Recorder dumps as hang evidence, on hand-made dumps (the real ones are checked in
//! tests/integration/tests/interop_real.rs): frames become stacks, progress comes from
//! `pg_status`, and the mismatch categories come out in Flight Recorder's terms.

use std::collections::BTreeMap;

use comminsight_import::flight_recorder::{FrDump, FrEntry, FrFrame, PgConfig, PgStatus};

use super::fr_snapshot::snapshot;
use crate::hang::{analyze, HangSettings};

const T0: u64 = 1_700_000_000_000_000_000;

fn dump(rank: i64, entries: Vec<FrEntry>, completed: i64) -> FrDump {
    let ep = PgConfig {
        name: "7".into(),
        desc: "EXPERT_MODEL_PARALLEL_GROUP".into(),
        ranks: vec![0, 1, 2, 3],
    };
    FrDump {
        rank,
        version: "2.9".into(),
        pg_config: BTreeMap::from([("7".to_string(), ep)]),
        pg_status: BTreeMap::from([(
            1,
            PgStatus {
                last_enqueued: completed + entries.len() as i64,
                last_started: -1,
                last_completed: completed,
            },
        )]),
        entries,
        ..FrDump::default()
    }
}

fn a2a(seq: i64, dtype: &str, frames: Vec<FrFrame>) -> FrEntry {
    FrEntry {
        record_id: seq,
        pg_id: 1,
        pg_name: "7".into(),
        pg_desc: "EXPERT_MODEL_PARALLEL_GROUP".into(),
        collective_seq_id: seq,
        profiling_name: "nccl:all_to_all".into(),
        time_created_ns: T0 + seq as u64 * 1000,
        input_sizes: vec![vec![2048, 5120]],
        input_dtypes: vec![dtype.into()],
        state: "scheduled".into(),
        timeout_ms: 600_000,
        frames,
        ..FrEntry::default()
    }
}

#[test]
fn a_rank_that_never_issued_the_all_to_all_is_the_missing_source_with_the_waiters_stacks() {
    let frame = FrFrame {
        name: "dispatch".into(),
        filename: "moe.py".into(),
        line: 88,
    };
    // Ranks 0-2 wait in all-to-all 11; rank 3 finished 10 and issued nothing after it.
    let mut dumps: Vec<FrDump> = (0..3)
        .map(|r| dump(r, vec![a2a(11, "BFloat16", vec![frame.clone()])], 10))
        .collect();
    dumps.push(dump(3, vec![], 10));
    let snap = snapshot("j", &dumps);
    assert_eq!(
        snap.gaps.plugin_threshold_ms, 600_000,
        "the watchdog timeout"
    );
    let r0 = &snap.ranks[0];
    let stacks = r0.stacks.as_ref().expect("frames -> stacks");
    assert_eq!(stacks.mode, "flight_recorder");
    assert_eq!(stacks.threads[0].frames[0].name, "dispatch");
    assert_eq!(stacks.threads[0].frames[0].line, 88);
    assert_eq!(snap.ranks[3].colls[0].last_seq, 10, "pg_status is progress");
    assert_eq!(snap.comms[0].role, "ep");
    let a = analyze(&snap, &HangSettings::default(), &[]);
    assert_eq!(a.verdicts.len(), 1, "{:#?}", a.verdicts);
    let v = &a.verdicts[0];
    assert_eq!(v.source_ranks, vec![3]);
    assert_eq!(v.category.as_deref(), Some("missing"));
    assert_eq!((v.func.as_str(), v.seq), ("AlltoAll", 11));
    assert_eq!(v.absent_ranks, vec![3]);
    assert_eq!(
        v.evidence["stacks"]["0"]["threads"][0]["frames"][0]["file"],
        "moe.py"
    );
}

#[test]
fn a_rank_that_entered_with_another_data_type_is_a_type_mismatch() {
    let dumps: Vec<FrDump> = (0..4)
        .map(|r| {
            let t = if r == 2 { "Float" } else { "BFloat16" };
            dump(r, vec![a2a(11, t, vec![])], 10)
        })
        .collect();
    let a = analyze(&snapshot("j", &dumps), &HangSettings::default(), &[]);
    let types: Vec<_> = a
        .verdicts
        .iter()
        .filter(|v| v.category.as_deref() == Some("type"))
        .collect();
    assert_eq!(types.len(), 1, "{:#?}", a.verdicts);
    assert_eq!(types[0].source_ranks, vec![2]);
}
