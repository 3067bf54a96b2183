//! Unit tests of the report's pure parts (build, render, helpers) on hand-made inputs.

use super::model::{tenths, ReportModel};
use super::*;
use crate::straggler::{
    PeerWait, RankIndex, RankSummary, StepIndex, StragglerClass, StragglerReport,
};

fn summary(rank: i64, index: f64, class: StragglerClass) -> RankSummary {
    RankSummary {
        rank,
        host: format!("h{}", rank / 4),
        index,
        complete_steps: 3,
        max_index: index + 1.0,
        steps_over_threshold: u64::from(index > 10.0) * 3,
        top_causes: vec![],
        top_victims: if index > 10.0 {
            vec![PeerWait {
                rank: 0,
                wait_us: 1200,
                steps: 3,
            }]
        } else {
            vec![]
        },
        class,
        class_reason: format!("reason of {rank}"),
        // The root cause agrees with the seed here: rank 5's own excess (5 % of the step)
        // is a straggler's, the others' jitter (0.3 %) is not.
        root_index: index / 2.0,
        root_delay: if index > 10.0 { 5.0 } else { 0.3 },
        ..Default::default()
    }
}

fn inputs() -> Inputs {
    let mut ranks: Vec<RankSummary> = (0..8)
        .map(|r| summary(r, if r == 5 { 42.0 } else { 1.5 }, StragglerClass::None))
        .collect();
    ranks[5].class = StragglerClass::ComputeSlow;
    ranks.sort_by(|a, b| b.index.total_cmp(&a.index).then(a.rank.cmp(&b.rank)));
    let steps = (0..3)
        .map(|s| StepIndex {
            step: s,
            avg_step_us: 10_000.0,
            ranks: ranks
                .iter()
                .map(|r| RankIndex {
                    rank: r.rank,
                    index: r.index,
                    avg_cause_us: 0.0,
                    coverage_complete: true,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let mut durations = Vec::new();
    for s in 0..3u64 {
        for r in 0..8i64 {
            durations.push((r, s, 10_000 + s * 1000 + r as u64));
        }
    }
    let mut inp = Inputs::new(
        "/data/run one".into(),
        StragglerReport {
            job: "j</script>".into(),
            threshold: 10.0,
            steps,
            ranks,
            root_threshold: 1.0,
            root_min_delay: 2.0,
        },
    );
    inp.durations = durations;
    inp
}

#[test]
fn build_summarises_steps_and_stragglers() {
    let m = build(inputs());
    assert_eq!(m.ranks, (0..8).collect::<Vec<i64>>());
    assert_eq!(m.step_stats.len(), 3);
    assert_eq!(m.step_stats[1].min_us, 11_000);
    assert_eq!(m.step_stats[1].max_us, 11_007);
    assert!((m.step_stats[1].mean_us - 11_003.5).abs() < 1e-9);
    assert_eq!(m.step_stats[0].top_rank, 5);
    assert_eq!(m.summary.top.len(), 1);
    assert_eq!(m.summary.top[0].rank, 5);
    assert_eq!(m.summary.top[0].class, "compute-slow");
    assert_eq!(m.index[5], 420);
    assert_eq!(m.step_index[2][3], 15);
    assert!((m.summary.median_step_us - 11_003.5).abs() < 1e-9);
    assert!((m.summary.p95_step_us - 12_003.5).abs() < 1e-9);
    // Hosts come from the straggler summaries when no topology names them.
    assert_eq!(m.hosts, vec!["h0", "h1"]);
    assert_eq!(m.rank_host[5], 1);
    // The slowest step (2) and the top rank's peak are offered as traces.
    assert!(m.traces.iter().any(|t| t.first == 2 && t.last == 2));
    assert!(m.traces.iter().all(|t| t
        .command
        .starts_with("comminsight-agent trace '/data/run one' --job ")));
    assert!(m.ep.is_none());
}

#[test]
fn host_context_is_in_the_rank_drill_down() {
    use crate::straggler::host::{HostShares, HostTcpEvidence};
    let mut inp = inputs();
    let r5 = inp
        .straggler
        .ranks
        .iter_mut()
        .find(|r| r.rank == 5)
        .unwrap();
    r5.class = StragglerClass::CpuStarved;
    r5.host_shares = Some(HostShares {
        on_cpu_pct: 10.0,
        runnable_pct: 45.5,
        blocked_pct: 44.5,
        blocked_io_pct: 0.0,
        covered_s: 12.0,
    });
    // A rank the others never waited for: its details exist for the host context alone.
    let r3 = inp
        .straggler
        .ranks
        .iter_mut()
        .find(|r| r.rank == 3)
        .unwrap();
    r3.index = 0.0;
    r3.root_index = 0.0;
    r3.host_tcp = Some(HostTcpEvidence::of(&[(
        "10.0.0.4:40000".into(),
        "10.0.0.1:5000".into(),
        17,
    )]));
    let m = build(inp);
    let detail = |rank: i64| {
        let pos = m.ranks.iter().position(|r| *r == rank).unwrap() as u32;
        m.details.iter().find(|d| d.pos == pos).cloned()
    };
    let d5 = detail(5).expect("rank 5's details");
    assert_eq!(d5.class, "cpu-starved");
    assert_eq!(
        d5.host_cpu,
        "on-CPU 10.0 %, runnable 45.5 %, blocked 44.5 % (I/O 0.0 %) over 12.0 s"
    );
    assert_eq!(d5.host_tcp, "");
    let d3 = detail(3).expect("rank 3's details");
    assert_eq!(
        d3.host_tcp,
        "17 retransmits (17 on 10.0.0.4:40000 -> 10.0.0.1:5000)"
    );
    assert_eq!(
        detail(2).map(|d| d.host_cpu),
        Some(String::new()),
        "no host streams"
    );
    assert!(render(&m).contains("\"host_cpu\":\"on-CPU 10.0 %"));
}

#[test]
fn gpu_evidence_is_in_the_rank_drill_down() {
    use crate::straggler::gpu::{HostGpuEvidence, NvlinkErrors};
    let mut inp = inputs();
    let r5 = inp
        .straggler
        .ranks
        .iter_mut()
        .find(|r| r.rank == 5)
        .unwrap();
    r5.class = StragglerClass::GpuThrottled;
    r5.host_gpu = Some(HostGpuEvidence {
        covered_s: 12.0,
        slowdown_pct: 38.0,
        reasons: vec!["hw_slowdown".into()],
        min_sm_clock_mhz: 1100,
        nvlink_errors: 1204,
        links: vec![
            NvlinkErrors {
                gpu: "0000:ab:00.0".into(),
                link: 3,
                errors: 1200,
            },
            NvlinkErrors {
                gpu: "0000:ab:00.0".into(),
                link: comminsight_wire::gpu::ALL_LINKS,
                errors: 4,
            },
        ],
        xids: vec![79],
    });
    // A rank with GPU samples and nothing to say of them.
    let r2 = inp
        .straggler
        .ranks
        .iter_mut()
        .find(|r| r.rank == 2)
        .unwrap();
    r2.host_gpu = Some(HostGpuEvidence::default());
    let m = build(inp);
    let detail = |rank: i64| {
        let pos = m.ranks.iter().position(|r| *r == rank).unwrap() as u32;
        m.details.iter().find(|d| d.pos == pos).cloned()
    };
    let d5 = detail(5).expect("rank 5's details");
    assert_eq!(d5.class, "gpu-throttled");
    assert_eq!(
        d5.host_gpu,
        "GPU clocks held down 38.0 % of 12.0 s (hw_slowdown), SM clock down to 1100 MHz; \
         NVLink 3 of 0000:ab:00.0 +1200 errors; NVLinks (all) of 0000:ab:00.0 +4 errors; XID 79"
    );
    assert_eq!(detail(2).map(|d| d.host_gpu), Some(String::new()));
    let html = render(&m);
    assert!(html.contains("\"host_gpu\":\"GPU clocks held down 38.0 %"));
    assert!(html.contains("rows.push([\"GPU\", d.host_gpu])"));
    assert!(html.contains(".badge.gpu-throttled{"));
}

#[test]
fn render_escapes_the_embedded_data_and_has_no_urls() {
    let m = build(inputs());
    let html = render(&m);
    assert!(!html.contains("j</script>"), "job name not escaped");
    assert!(html.contains("CommInsight report: j&lt;/script&gt;"));
    assert!(html.contains("j<\\/script>"));
    assert_eq!(html.matches("</script>").count(), 2);
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(!html.contains("id=\"ep\""), "EP section only with matrices");
    // The embedded JSON is the model.
    let start = html.find("id=\"data\">").unwrap() + "id=\"data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let back: ReportModel = serde_json::from_str(&html[start..end]).unwrap();
    assert_eq!(back, m);
}

#[test]
fn ep_section_only_with_matrices() {
    let mut m = build(inputs());
    m.ep = Some(model::EpMatrices {
        matrices: vec![model::EpMatrix {
            title: "ep0".into(),
            ranks: vec![0, 1],
            bytes: vec![vec![0, 5], vec![7, 0]],
        }],
        ..Default::default()
    });
    assert!(render(&m).contains("id=\"ep\""));
}

/// Window `seq` of a 4-rank EP group: everybody waits 10 on each peer, 100 on `slow`.
fn ep_rows(seq: u64, slow: Option<usize>) -> Vec<crate::moe::EpRow> {
    use comminsight_ascend::decode::{Phase, Source};
    use comminsight_ascend::window::{Row, WindowKey};
    (0..4u32)
        .map(|r| crate::moe::EpRow {
            job: "j".into(),
            key: WindowKey {
                ep_group_id: 1,
                instance_id: "i".into(),
                phase: Phase::Combine,
                window_seq: seq,
            },
            n: 4,
            source: Source::Mc2,
            hierarchical: false,
            row: Row {
                rank: r,
                values: (0..4)
                    .map(|j| if Some(j) == slow { 100.0 } else { 10.0 })
                    .collect(),
                steps: 1,
                t_start_ns: seq,
                t_end_ns: seq + 1,
            },
        })
        .collect()
}

#[test]
fn the_ep_section_shows_each_groups_strongest_window() {
    let mut rows = ep_rows(0, None);
    rows.extend(ep_rows(1, Some(2)));
    rows.extend(ep_rows(2, None));
    let (ws, _) = crate::offline::moe::windows_of(rows, &crate::moe::MoeConfig::default());
    let v = super::ep::view(&ws).unwrap();
    assert_eq!((v.windows, v.findings, v.lines.len()), (3, 1, 1));
    assert_eq!(v.waits.len(), 1, "one group, one phase");
    let w = &v.waits[0];
    assert_eq!((w.window_seq, w.phase.as_str()), (1, "combine"));
    assert_eq!(w.senders, vec![2]);
    // 100 over the mean cell 32.5: 3.1x, in tenths.
    assert_eq!((w.ratio[0][2], w.ratio[0][1]), (31, 3));
    assert!(
        v.lines[0].contains("rank 2 is a slow sender"),
        "{}",
        v.lines[0]
    );
    assert!(super::ep::view(&[]).is_none());
    let mut m = build(inputs());
    m.ep = Some(v);
    let html = render(&m);
    assert!(html.contains("MoE EP wait matrices"));
}

#[test]
fn helpers() {
    assert_eq!(rank_list(&[8, 0, 1, 2, 5, 7, 2]), "0-2,5,7-8");
    assert_eq!(rank_list(&[]), "");
    assert_eq!(shell_quote("/a/b-c_1.d"), "/a/b-c_1.d");
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(tenths(12.345), 123);
    assert_eq!(tenths(f64::NAN), 0);
    assert_eq!(tenths(250.0), 1000);
    assert_eq!(
        trace_command("d", "my job", 3, 4, Some("1-2")),
        "comminsight-agent trace d --job 'my job' --steps 3..4 --ranks 1-2 -o my_job-steps-3-4.pftrace"
    );
}
