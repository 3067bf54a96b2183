//! Issue 5: the daemon's online steps equal `replay`'s offline steps byte for byte, with each
//! process's operations arriving shuffled (inside the safe window), segments arriving a few at a
//! time in a random stream order, the template chosen mid-stream, and a `kill -9` of the agent
//! in the middle (nothing lost, nothing duplicated).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use comminsight_tests::*;
use comminsight_wire::record::{Body, Record, FLAG_REPEAT};
use comminsight_wire::segment::{read_segment, SegmentConfig, SegmentWriter};

/// A small deterministic PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Rewrite each process's stream with its operation records moved up to `jitter` records later
/// (a few ms of the synthetic job, far inside the 2 s safe window), in small segments.
/// Returns `(stream dir relative to the root, its segment files in order)`.
fn shuffle_streams(src: &Path, dst: &Path, jitter: u64) -> Vec<(PathBuf, Vec<PathBuf>)> {
    let mut segs = Vec::new();
    walk(src, &mut segs);
    let mut by_stream: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    for s in segs
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cis"))
    {
        let dir = s.parent().unwrap().strip_prefix(src).unwrap().to_path_buf();
        by_stream.entry(dir).or_default().push(s);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    for (rel, mut files) in by_stream {
        files.sort();
        let mut recs: Vec<Record> = Vec::new();
        for f in &files {
            let r = read_segment(f).expect("read segment");
            recs.extend(
                r.records
                    .into_iter()
                    .filter(|x| !matches!(x.body, Body::Segment(_)) && x.flags & FLAG_REPEAT == 0),
            );
        }
        let mut keyed: Vec<(u64, usize, Record)> = recs
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let k = (i as u64) * 1000;
                let k = match r.body {
                    Body::Coll(_) | Body::P2p(_) => k + (rng.next() % (jitter * 1000)),
                    _ => k,
                };
                (k, i, r)
            })
            .collect();
        keyed.sort_by_key(|(k, i, _)| (*k, *i));
        let dir = dst.join(&rel);
        let pid: u32 = rel
            .file_name()
            .unwrap()
            .to_string_lossy()
            .parse()
            .unwrap_or(1);
        let mut w = SegmentWriter::new(
            SegmentConfig {
                dir: dir.clone(),
                max_segment_bytes: 64 << 10,
                ..SegmentConfig::default()
            },
            pid,
        );
        let raws: Vec<_> = keyed
            .into_iter()
            .enumerate()
            .map(|(seq, (_, _, r))| {
                let mut raw = r.encode();
                raw.set_seq(seq as u64);
                raw
            })
            .collect();
        w.write(&raws);
        w.seal();
        assert!(
            !w.stats().failed && !raws.is_empty(),
            "{}: cannot write the shuffled segments: {:?} ({} records)",
            dir.display(),
            w.stats(),
            raws.len()
        );
        let mut written = Vec::new();
        walk(&dir, &mut written);
        written.sort();
        out.push((rel, written));
    }
    out
}

fn signal(c: &mut Child, sig: &str) {
    let pid = c.pid().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
    let _ = c.0.wait();
}

#[test]
fn online_steps_equal_replay_with_shuffled_arrival_and_a_kill_9() {
    let _g = one_job_at_a_time();
    let out = OutDir::new("steps-online");
    let job = out.path().join("job");
    testbed(
        &job,
        &[
            "--scenario",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/megatron.toml"),
            "--ranks",
            "16",
            "--steps",
            "200",
            "--synthetic",
        ],
        &[],
    )
    .assert_ok();
    let shuffled = out.path().join("shuffled");
    let streams = shuffle_streams(&job.join("inspector_logs"), &shuffled, 48);
    assert_eq!(streams.len(), 16);
    let rounds = streams.iter().map(|(_, f)| f.len()).max().unwrap();
    assert!(rounds >= 6, "want several segments per stream: {rounds}");

    // The daemon follows a directory the segments arrive in, a round at a time.
    let live = out.path().join("live");
    let state = out.path().join("state");
    std::fs::create_dir_all(&live).unwrap();
    let config = out.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = {state:?}\npoll_interval_ms = 20\ncheckpoint_interval_ms = 100\n\
             [sources]\nshm_enabled = false\nsegment_dirs = [{live:?}]\nscan_interval_ms = 50\nstale_after_s = 1\n\
             [archive]\nenabled = false\n[otlp]\nenabled = false\n[steps]\nsettle_ops = 3000\nstream_end_s = 10\n"
        ),
        // stream_end_s: a stream without a new segment for this long has ended and its session
        // drains; the next round's operations are then behind released ones ("late", counted
        // in job.json, processed out of order). It must outlast a round (each waits for a
        // checkpoint, spaced by the checkpoint's own duration), or online differs from offline
        // by arrival timing, not by the restart this test is about. Production's is 600 s.
    )
    .unwrap();
    let log = out.path().join("agent.log");
    let mut daemon = start_agent(&config, &log);
    let mut rng = Rng(42);
    let checkpoint = state.join("checkpoint.json");
    for k in 0..rounds {
        let mut order: Vec<usize> = (0..streams.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        for i in order {
            let (rel, files) = &streams[i];
            let Some(f) = files.get(k) else { continue };
            let dir = live.join(rel);
            std::fs::create_dir_all(&dir).unwrap();
            let tmp = dir.join(".incoming");
            std::fs::copy(f, &tmp).unwrap();
            std::fs::rename(&tmp, dir.join(f.file_name().unwrap())).unwrap();
        }
        // Let the agent take this round in and checkpoint it.
        let before = std::fs::metadata(&checkpoint)
            .and_then(|m| m.modified())
            .ok();
        assert!(wait_until(Duration::from_secs(20), || {
            std::fs::metadata(&checkpoint)
                .and_then(|m| m.modified())
                .ok()
                .is_some_and(|t| Some(t) != before)
        }));
        if k == rounds / 2 {
            // Mid-job, mid-step: no goodbye, the last checkpoint is all it keeps.
            signal(&mut daemon, "-KILL");
            daemon = start_agent(&config, &log);
        }
    }
    let job_json = state.join("results/steps/megatron/job.json");
    let done = wait_until(Duration::from_secs(60), || {
        std::fs::read(&job_json)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["open_ops"].as_object().is_some_and(|m| m.len() == 16))
    });
    signal(&mut daemon, "-TERM");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(done, "every stream ended in the agent's steps\n{log_text}");
    // The template was chosen while the job ran, from settled roles (not at the end).
    assert!(
        log_text
            .lines()
            .any(|l| l.contains("template megatron-1f1b v") && l.contains("chosen (roles settled)")),
        "{log_text}"
    );

    let replay_out = out.path().join("replay");
    let o = agent(&[
        "replay",
        shuffled.to_str().unwrap(),
        "--out",
        replay_out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let online = tree(&state.join("results/steps"));
    let offline = tree(&replay_out.join("steps"));
    assert_eq!(
        online.keys().collect::<Vec<_>>(),
        offline.keys().collect::<Vec<_>>()
    );
    assert_eq!(online.len(), 17, "16 stream files and job.json");
    for (k, v) in &online {
        if v != &offline[k] {
            let a = String::from_utf8_lossy(v);
            let b = String::from_utf8_lossy(&offline[k]);
            let first = a
                .lines()
                .zip(b.lines())
                .find(|(x, y)| x != y)
                .map(|(x, y)| format!("online:  {x}\noffline: {y}"))
                .unwrap_or_else(|| format!("{} vs {} lines", a.lines().count(), b.lines().count()));
            let chosen: Vec<&str> = log_text.lines().filter(|l| l.contains("chosen")).collect();
            panic!(
                "{}: online and offline differ\n{first}\n{chosen:?}",
                k.display()
            );
        }
    }

    // And the steps are right: boundaries equal the truth for every (rank, step).
    let truth = truth(&job);
    let mut got: BTreeMap<(u64, u64), (u64, u64)> = BTreeMap::new();
    for (k, v) in &online {
        if k.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        for line in String::from_utf8_lossy(v).lines() {
            let s: serde_json::Value = serde_json::from_str(line).unwrap();
            got.insert(
                (s["rank"].as_u64().unwrap(), s["step"].as_u64().unwrap()),
                (
                    s["first"]["coll_local_sn"].as_u64().unwrap(),
                    s["last"]["coll_local_sn"].as_u64().unwrap(),
                ),
            );
        }
    }
    let (mut ok, mut total) = (0, 0);
    for (rank, steps) in truth["steps"].as_object().unwrap() {
        for (i, s) in steps.as_array().unwrap().iter().enumerate() {
            let Some(p) = s.as_array() else { continue };
            total += 1;
            let want = (p[0].as_u64().unwrap(), p[1].as_u64().unwrap());
            ok += usize::from(got.get(&(rank.parse().unwrap(), i as u64)) == Some(&want));
        }
    }
    assert_eq!(total, 16 * 200);
    assert!(ok as f64 >= 0.999 * total as f64, "{ok}/{total}");
}
