//! The shim in real processes: Python rank processes drive the libnccl stand-in through ctypes
//! with `LD_PRELOAD=libcomminsight-preload.so`; the plugin's comm_init records show the names.

mod common;

use common::run_job;

#[test]
fn names_from_announcements_and_nothing_else() {
    let with = run_job("main", 4, true, &[]);
    for r in 0..4 {
        let name = |l| with.name(r, l);
        assert_eq!(name("plain"), "", "rank {r}: nothing announced yet");
        assert_eq!(name("world"), "global:default_pg:0", "rank {r}");
        assert_eq!(
            name("tp"),
            format!("tp:TENSOR_MODEL_PARALLEL_GROUP:{}", 1 + r / 2),
            "rank {r}: split child of a named parent gets its own name"
        );
        assert_eq!(name("nogroup"), "", "rank {r}: no inherited parent name");
        assert_eq!(
            name("named"),
            "mine:custom",
            "rank {r}: the caller's name wins"
        );
        assert_eq!(
            name("dp"),
            "dp:DATA_PARALLEL_GROUP:5",
            "rank {r}: size rule"
        );
        assert_eq!(
            name("after_bad"),
            "",
            "rank {r}: bad announcements change nothing"
        );
        let o = &with.ranks[r];
        let xp = o.stderr_lines(&["NCCL WARN", "unknown role \"xp\""]);
        assert_eq!(
            xp.len(),
            1,
            "rank {r}: one WARN for the role:\n{}",
            o.stderr
        );
        let member = o.stderr_lines(&["NCCL WARN", "is not in the ranks"]);
        assert_eq!(member.len(), 1, "rank {r}:\n{}", o.stderr);
        assert!(
            o.stderr_lines(&["CommInsight WARN"]).is_empty(),
            "rank {r}: the plugin logged them, no stderr fallback:\n{}",
            o.stderr
        );
    }

    let without = run_job("main", 4, false, &[]);
    for r in 0..4 {
        for l in ["plain", "world", "tp", "nogroup", "dp", "after_bad"] {
            assert_eq!(without.name(r, l), "", "rank {r} {l} without the shim");
        }
        assert_eq!(without.name(r, "named"), "mine:custom");
        let (a, b) = (with.ranks[r].results(), without.ranks[r].results());
        assert!(!a.is_empty());
        assert_eq!(a, b, "rank {r}: all-reduce results differ with the shim");
    }
}

#[test]
fn comm_role_from_the_environment() {
    let j = run_job("envrole", 2, true, &[("COMMINSIGHT_COMM_ROLE", "DP")]);
    for r in 0..2 {
        assert_eq!(j.name(r, "plain"), "dp");
    }
    let j = run_job("envrole", 2, true, &[("COMMINSIGHT_COMM_ROLE", "zz")]);
    for r in 0..2 {
        assert_eq!(j.name(r, "plain"), "");
        let o = &j.ranks[r];
        let w = o.stderr_lines(&["NCCL WARN", "COMMINSIGHT_COMM_ROLE", "\"zz\""]);
        assert_eq!(w.len(), 1, "rank {r}:\n{}", o.stderr);
    }
}

#[test]
fn libnccl_loaded_late_with_rtld_local() {
    // 2.27: the first release with commName (ncclConfig_v22700), profiler ABI v4.
    for v in ["2.30", "2.27"] {
        let j = run_job("late", 2, true, &[("COMMINSIGHT_TESTBED_NCCL_VERSION", v)]);
        for r in 0..2 {
            assert_eq!(
                j.name(r, "late"),
                "tp:TENSOR_MODEL_PARALLEL_GROUP:1",
                "NCCL {v}"
            );
            assert_eq!(j.ranks[r].results().len(), 1);
        }
    }
}

#[test]
fn shrink_keeps_the_parent_name() {
    let j = run_job("shrink", 4, true, &[]);
    let sum: f32 = (0..3).map(|r| (r + 1) as f32 * 0.5).sum();
    for r in 0..3 {
        assert_eq!(j.name(r, "world"), "global:default_pg:0");
        assert_eq!(
            j.name(r, "shrunk_cfg"),
            "global:default_pg:0",
            "given unnamed config"
        );
        assert_eq!(
            j.name(r, "shrunk_null"),
            "global:default_pg:0",
            "NULL config inherits"
        );
        let res = j.ranks[r].results();
        assert_eq!(res.len(), 2);
        let first: f32 = res[0]
            .split_whitespace()
            .nth(2)
            .expect("value")
            .parse()
            .expect("f32");
        assert_eq!(first, sum, "3-rank all-reduce on the shrunk comm");
    }
}

#[test]
fn warnings_go_to_stderr_without_the_plugin() {
    let j = run_job(
        "envrole",
        2,
        true,
        &[
            ("COMMINSIGHT_COMM_ROLE", "zz"),
            ("NCCL_PROFILER_PLUGIN", "none"),
        ],
    );
    assert!(j.names.is_empty(), "no plugin, no records");
    for r in 0..2 {
        let o = &j.ranks[r];
        let w = o.stderr_lines(&["CommInsight WARN", "COMMINSIGHT_COMM_ROLE", "\"zz\""]);
        assert_eq!(w.len(), 1, "rank {r}:\n{}", o.stderr);
        assert!(o.stderr_lines(&["NCCL WARN", "zz"]).is_empty());
    }
}
