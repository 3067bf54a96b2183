use comminsight_ascend::decode::{Phase, Source};
use comminsight_ascend::window::{Row, WindowKey};

use super::*;

/// The step lines of one window of a 4-rank group where everybody waits 10 units on each
/// peer, except on `slow` (100), from `ranks` only.
fn lines(seq: u64, slow: usize, ranks: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &r in ranks {
        let values = (0..4)
            .map(|j| if j == slow { 100.0 } else { 10.0 })
            .collect();
        let row = EpRow {
            job: "someone-else".into(),
            key: WindowKey {
                ep_group_id: 0xe9,
                instance_id: "6a1e2c3d-0000-4000-8000-00000000002a".into(),
                phase: Phase::Dispatch,
                window_seq: seq,
            },
            n: 4,
            source: Source::DeepepLl,
            hierarchical: false,
            row: Row {
                rank: r,
                values,
                steps: 10,
                t_start_ns: 1_000_000_000 * seq,
                t_end_ns: 1_000_000_000 * (seq + 1),
            },
        };
        let line = serde_json::json!({"stream": format!("j/h{r}/1"), "ep_row": row});
        serde_json::to_writer(&mut out, &line).unwrap();
        out.push(b'\n');
    }
    // A straggler line in the same push is not an EP row.
    out.extend_from_slice(b"{\"stream\":\"j/h/1\",\"step\":{},\"arrivals\":null}\n");
    out
}

#[test]
fn rows_of_every_host_make_windows_whose_findings_reach_gauges_files_and_counters() {
    let dir = crate::util::fs::ScratchDir::new("moe-sink");
    let out = MoeOutput::new(
        &MoeConfig::default(),
        vec![dir.path().join("moe")],
        "master",
        None,
    );
    let t0 = 5_000_000_000;
    // Two hosts' pushes: ranks 0-1, then 2-3.
    out.on_lines_at("j", &lines(0, 2, &[0, 1]), t0);
    assert!(
        out.values().groups.is_empty(),
        "half a window is not analysed"
    );
    out.on_lines_at("j", &lines(0, 2, &[2, 3]), t0);
    let v = out.values();
    let key = (
        "j".to_string(),
        "0x00000000000000e9".to_string(),
        "dispatch",
    );
    let g = &v.groups[&key];
    // Column 2 carries 4 * 100 of the 4 * 130 in the matrix: ratio 100 / 32.5.
    assert!((g.cols[2] - 100.0 / 32.5).abs() < 1e-6, "{:?}", g.cols);
    assert_eq!(g.cells.len(), 16);
    // 3.08 > 3: rank 2 is a slow sender, once.
    assert_eq!(v.findings[&(key.clone(), "sender_slow")], 1);
    let jsonl = std::fs::read_to_string(dir.path().join("moe/j.jsonl")).unwrap();
    let ev: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    assert_eq!(ev["job"], "j", "the push names the job, not the row");
    assert_eq!(ev["event"]["findings"][0]["kind"], "sender_slow");
    assert_eq!(ev["event"]["findings"][0]["rank"], 2);
    let log = std::fs::read_to_string(dir.path().join("moe/j.deepxtrace.log")).unwrap();
    assert!(
        log.contains("[Diagnose] InstanceID: 6a1e2c3d-0000-4000-8000-00000000002a EPSize: 4"),
        "{log}"
    );

    // Window 1: rank 3 never reports; 40 s later it is incomplete, and counted.
    out.on_lines_at("j", &lines(1, 9, &[0, 1, 2]), t0 + 1);
    out.tick_at(t0 + 39_000_000_000);
    assert!(!out
        .values()
        .findings
        .contains_key(&(key.clone(), "incomplete_window")));
    out.tick_at(t0 + 41_000_000_000);
    assert_eq!(
        out.values().findings[&(key.clone(), "incomplete_window")],
        1
    );
    let jsonl = std::fs::read_to_string(dir.path().join("moe/j.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(jsonl.lines().last().unwrap()).unwrap();
    assert_eq!(
        last["event"]["incomplete_window"]["missing_rows"],
        serde_json::json!([3])
    );
    // A repeated push (at least once) of a finished window is refused, not analysed twice.
    out.on_lines_at("j", &lines(0, 2, &[0, 1, 2, 3]), t0 + 42_000_000_000);
    assert_eq!(out.values().findings[&(key, "sender_slow")], 1);
}

#[test]
fn the_log_record_names_every_kind_of_finding() {
    use comminsight_ascend::report::{EpEvent, Finding};
    let key = WindowKey {
        ep_group_id: 7,
        instance_id: "x".into(),
        phase: Phase::Combine,
        window_seq: 3,
    };
    let mut e = EpEvent::incomplete(&key, 9, 16, vec![4, 5]);
    e.findings = vec![
        Finding::SenderSlow {
            rank: 1,
            value: 1.0,
            ratio: 4.0,
        },
        Finding::PathSlow {
            waiter: 9,
            peer: 3,
            value: 1.0,
            ratio: 6.0,
        },
    ];
    let ev = LogEvent::ep_window("h", "j", &e);
    let get = |k: &str| ev.attributes.iter().find(|a| a.0 == k).map(|a| a.1.clone());
    assert_eq!(get("comminsight.moe.phase"), Some("combine".into()));
    assert_eq!(
        get("comminsight.moe.sender_slow"),
        Some(crate::sinks::AttrValue::I64s(vec![1]))
    );
    assert_eq!(get("comminsight.moe.path_slow"), Some("3->9".into()));
    assert_eq!(
        get("comminsight.moe.missing_rows"),
        Some(crate::sinks::AttrValue::I64s(vec![4, 5]))
    );
    assert_eq!(
        (ev.event_name.as_str(), ev.time_ns),
        (crate::sinks::EVENT_MOE, 9)
    );
}
