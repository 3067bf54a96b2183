//! Issue 16 (say what was skipped, output hygiene), through the real binary: every offline
//! command over a job with a corrupt segment and an unreadable one ends with the `skipped ...`
//! line and carries the counts in its `--json`, goes on past the unreadable segment, and an
//! input without a single record (garbage segments, an empty directory) is exit 2 with one line
//! naming it. A closed standard output (`| head -1`) is a clean exit 0, and nothing written to
//! a pipe holds ANSI escape codes.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use comminsight_tests::*;
use serde_json::Value;

/// Bytes of the corrupt segment: 64 records of garbage.
const GARBAGE_RECORDS: usize = 64;

fn scenario() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/ddp.toml")
        .display()
        .to_string()
}

/// A synthetic 2-rank DDP job of `steps` steps under `out`; its segment root.
fn job(out: &Path, steps: u32) -> PathBuf {
    let steps = steps.to_string();
    let run = testbed(
        out,
        &[
            "--scenario",
            &scenario(),
            "--ranks",
            "2",
            "--steps",
            &steps,
            "--synthetic",
        ],
        &[],
    );
    run.assert_ok();
    out.join("inspector_logs")
}

/// Every process directory under `root`, sorted.
fn proc_dirs(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    walk(root, &mut files);
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|x| x == "cis"))
        .filter_map(|f| f.parent().map(Path::to_path_buf))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Garbage that is no record: no byte pattern of it has the record magic.
fn garbage(records: usize) -> Vec<u8> {
    (0..records * 128)
        .map(|i| (i * 7 % 251) as u8 | 1)
        .collect()
}

/// Rank 0's real segment moved to index 5, a garbage segment at index 0 and a directory named
/// like segment 1 (opening it works, reading it fails: unreadable even for root).
fn damage(root: &Path) -> PathBuf {
    let dir = proc_dirs(root)
        .into_iter()
        .next()
        .expect("a process directory");
    std::fs::rename(dir.join("seg-000000.cis"), dir.join("seg-000005.cis")).unwrap();
    std::fs::write(dir.join("seg-000000.cis"), garbage(GARBAGE_RECORDS)).unwrap();
    std::fs::create_dir(dir.join("seg-000001.cis")).unwrap();
    dir
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn last_line(s: &str) -> &str {
    s.lines().last().unwrap_or("")
}

/// The `skipped` object of a command's JSON output.
fn skipped_of(o: &Output) -> Value {
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            stderr(o)
        )
    });
    v["skipped"].clone()
}

fn assert_counts(s: &Value, what: &str) {
    assert_eq!(s["corrupt_records"], GARBAGE_RECORDS as u64, "{what}: {s}");
    assert_eq!(s["files_with_corrupt"], 1, "{what}: {s}");
    let files = s["unreadable_files"].as_u64().unwrap() + s["refused_files"].as_u64().unwrap();
    assert_eq!(files, 1, "{what}: {s}");
    let listed = [&s["unreadable"], &s["refused"]]
        .iter()
        .filter_map(|l| l.as_array())
        .flatten()
        .any(|f| {
            f["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("seg-000001.cis"))
        });
    assert!(listed, "{what}: the unreadable file is named: {s}");
    assert!(
        s["corrupt"][0]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("seg-000000.cis")),
        "{what}: {s}"
    );
}

fn assert_line(o: &Output, what: &str) {
    let err = stderr(o);
    let line = last_line(&err);
    assert!(
        line.starts_with(&format!(
            "comminsight-agent: skipped {GARBAGE_RECORDS} corrupt records in 1 file, 1 "
        )) && line.contains("seg-000001.cis ("),
        "{what}: the last stderr line says what was skipped: {err}"
    );
}

#[test]
fn every_offline_command_says_what_it_skipped_and_reads_on() {
    let out = OutDir::new("skipped-input");
    let root = job(out.path(), 20);
    damage(&root);
    let dir = root.to_str().unwrap();

    // --json: the counts, and the analysis still saw both ranks (it read past the damage).
    let roles = agent(&["roles", dir, "--json"]);
    assert_eq!(roles.status.code(), Some(0), "{}", stderr(&roles));
    assert_counts(&skipped_of(&roles), "roles");
    let v: Value = serde_json::from_slice(&roles.stdout).unwrap();
    assert_eq!(v["world"], 2, "both ranks found: {v}");
    assert_line(&roles, "roles");

    for cmd in ["steps", "hang", "straggler"] {
        let o = agent(&[cmd, dir, "--json"]);
        assert_ne!(o.status.code(), Some(2), "{cmd}: {}", stderr(&o));
        assert_counts(&skipped_of(&o), cmd);
        assert_line(&o, cmd);
    }
    let replay_out = out.path().join("replay");
    let o = agent(&[
        "replay",
        dir,
        "--out",
        replay_out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "replay: {}", stderr(&o));
    assert_counts(&skipped_of(&o), "replay");
    assert_line(&o, "replay");

    // Human output: the same last line.
    for cmd in ["roles", "steps", "hang", "straggler"] {
        assert_line(&agent(&[cmd, dir]), cmd);
    }
    let html = out.path().join("r.html");
    assert_line(
        &agent(&["report", dir, "-o", html.to_str().unwrap()]),
        "report",
    );
    let pb = out.path().join("t.pftrace");
    let o = agent(&["trace", dir, "--steps", "0..3", "-o", pb.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "trace: {}", stderr(&o));
    assert_line(&o, "trace");

    // dump: the corrupt records are not plugin drops.
    let o = agent(&["dump", dir, "--summary", "--json"]);
    assert_eq!(o.status.code(), Some(0), "dump: {}", stderr(&o));
    let s: Value = serde_json::from_slice(&o.stdout).unwrap();
    // (dump lists regular files only: the directory named like a segment is not one.)
    assert_eq!(
        s["skipped"]["corrupt_records"], GARBAGE_RECORDS as u64,
        "{s}"
    );
    assert_eq!(s["skipped"]["files_with_corrupt"], 1, "{s}");
    let procs = s["processes"].as_array().unwrap();
    let corrupt: u64 = procs.iter().map(|p| p["corrupt"].as_u64().unwrap()).sum();
    assert_eq!(corrupt, GARBAGE_RECORDS as u64, "{s}");
    for p in procs {
        assert_eq!(p["ring_drops"], 0, "{p}");
        assert_eq!(p["seq_gaps"], 0, "corrupt records are not gaps: {p}");
    }
    assert!(
        last_line(&stderr(&o))
            == format!("comminsight-agent: skipped {GARBAGE_RECORDS} corrupt records in 1 file"),
        "dump: {}",
        stderr(&o)
    );
    let warnings = stderr(&o)
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .count();
    assert!(
        warnings <= 6,
        "a bounded number of problem lines: {}",
        stderr(&o)
    );
}

/// Every offline command over `dir`, each with its required arguments.
fn commands(dir: &str, scratch: &Path) -> Vec<Vec<String>> {
    let s = |p: &str| scratch.join(p).display().to_string();
    [
        vec!["dump", dir],
        vec!["roles", dir],
        vec!["steps", dir],
        vec!["hang", dir],
        vec!["straggler", dir],
        vec!["replay", dir, "--out", &s("replay")],
        vec!["report", dir, "-o", &s("r.html")],
        vec!["trace", dir, "--steps", "0..1", "-o", &s("t.pftrace")],
    ]
    .into_iter()
    .map(|c| c.into_iter().map(String::from).collect())
    .collect()
}

#[test]
fn an_input_without_records_is_exit_2_with_one_line() {
    let out = OutDir::new("skipped-none");
    let garbage_dir = out.path().join("garbage");
    let procdir = garbage_dir.join("job/host0/123");
    std::fs::create_dir_all(&procdir).unwrap();
    std::fs::write(procdir.join("seg-000000.cis"), garbage(10)).unwrap();
    std::fs::write(procdir.join("seg-000001.cis"), b"").unwrap();
    std::fs::write(garbage_dir.join("notes.txt"), b"not a segment").unwrap();
    let empty = out.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let scratch = out.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    for dir in [&garbage_dir, &empty] {
        let d = dir.to_str().unwrap();
        for c in commands(d, &scratch) {
            let args: Vec<&str> = c.iter().map(String::as_str).collect();
            let o = agent(&args);
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{c:?}: exit 2: {err}");
            let lines: Vec<&str> = err.lines().collect();
            assert_eq!(lines.len(), 1, "{c:?}: one line: {err}");
            assert!(lines[0].contains(d), "{c:?}: names the directory: {err}");
            assert!(o.stdout.is_empty(), "{c:?}: nothing on stdout");
        }
    }
    let o = agent(&["roles", garbage_dir.to_str().unwrap()]);
    assert!(
        stderr(&o).contains("no CommInsight records") && stderr(&o).contains("10 corrupt records"),
        "{}",
        stderr(&o)
    );
}

/// `comminsight-agent ARGS | head -1`: the agent's status and standard error.
fn head_1(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(bin_dir().join("comminsight-agent"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is dropped here: the pipe is closed with most of the output unread.
    assert!(!first.is_empty(), "{args:?}: a first line");
    let o = child.wait_with_output().unwrap();
    (o.status.code(), stderr(&o))
}

#[test]
fn a_closed_pager_is_a_clean_exit_and_pipes_get_no_ansi_codes() {
    let out = OutDir::new("skipped-pipe");
    let root = job(out.path(), 2000);
    let dir = root.to_str().unwrap();
    for args in [
        vec!["dump", dir],
        vec!["dump", dir, "--json"],
        vec!["steps", dir],
        vec!["steps", dir, "--json"],
        vec!["straggler", dir, "--json"],
    ] {
        let (code, err) = head_1(&args);
        assert_eq!(code, Some(0), "{args:?}: exit 0 after | head -1: {err}");
        assert!(
            !err.to_lowercase().contains("broken pipe") && !err.contains("panicked"),
            "{args:?}: no error text: {err}"
        );
    }
    // Offline output and the daemon's log written to pipes / files: no escape codes.
    for args in [
        vec!["roles", dir],
        vec!["hang", dir],
        vec!["dump", dir, "--summary"],
    ] {
        let o = agent(&args);
        assert!(
            !o.stdout.contains(&0x1b) && !o.stderr.contains(&0x1b),
            "{args:?}: ANSI codes in piped output"
        );
    }
    let conf = out.path().join("agent.toml");
    let state = out.path().join("state");
    std::fs::write(
        &conf,
        format!(
            "[agent]\nstate_dir = \"{}\"\n[sources]\nshm_enabled = false\nsegment_dirs = [\"{}\"]\n[otlp]\nenabled = false\n[archive]\nenabled = false\n[master]\nlisten = \"\"\n[log]\nlevel = \"debug\"\n",
            state.display(),
            root.display()
        ),
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let mut daemon = start_agent(&conf, &log);
    let started = wait_until(std::time::Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.lines().count() >= 2)
    });
    let _ = Command::new("kill").arg(daemon.pid().to_string()).status();
    let _ = daemon.0.wait();
    let text = std::fs::read(&log).unwrap();
    assert!(
        started,
        "the daemon logged: {}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        !text.contains(&0x1b),
        "no ANSI codes in a log file: {}",
        String::from_utf8_lossy(&text)
    );
}
