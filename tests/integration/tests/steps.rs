//! Issue 5: steps rebuilt from the communication records match the test bed's truth.

use std::collections::BTreeMap;
use std::path::Path;

use comminsight_tests::*;

fn scenario(name: &str) -> String {
    format!(
        "{}/../../tests/scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// `comminsight-agent steps OUT --json [extra]` scored against truth.json's `steps`: (matching
/// (rank, step) boundaries, truth pairs, steps whose boundaries are wrong yet claim complete
/// coverage, template name).
fn score(out: &Path, extra: &[&str]) -> (usize, usize, usize, String) {
    let mut args = vec!["steps", out.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let o = agent(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("steps --json");
    let template = v["template"]["name"].as_str().unwrap_or("none").to_string();
    let mut got: BTreeMap<(u64, u64), (u64, u64, bool)> = BTreeMap::new();
    for s in v["steps"].as_array().expect("steps") {
        got.insert(
            (s["rank"].as_u64().unwrap(), s["step"].as_u64().unwrap()),
            (
                s["first"]["coll_local_sn"].as_u64().unwrap(),
                s["last"]["coll_local_sn"].as_u64().unwrap(),
                s["coverage_complete"].as_bool().unwrap(),
            ),
        );
    }
    let t = truth(out);
    let (mut ok, mut total, mut silent) = (0, 0, 0);
    for (rank, steps) in t["steps"].as_object().unwrap() {
        let rank: u64 = rank.parse().unwrap();
        for (i, s) in steps.as_array().unwrap().iter().enumerate() {
            let Some(pair) = s.as_array() else { continue };
            total += 1;
            let want = (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap());
            match got.get(&(rank, i as u64)) {
                Some(g) if (g.0, g.1) == want => ok += 1,
                Some(g) if g.2 => silent += 1,
                _ => {}
            }
        }
    }
    (ok, total, silent, template)
}

/// Every shipped template's workload: (scenario, its template, extra args: 16 ranks).
const KINDS: &[(&str, &str, &[&str])] = &[
    ("megatron.toml", "megatron-1f1b", &["--ranks", "16"]),
    ("moe.toml", "megatron-1f1b-moe", &["--ranks", "16"]),
    ("distopt.toml", "megatron-1f1b-distopt", &[]),
    ("cp.toml", "megatron-1f1b-cp", &[]),
    ("fsdp.toml", "fsdp", &[]),
    ("ddp.toml", "ddp", &[]),
    ("decode.toml", "decode", &[]),
];

/// The acceptance (issue 5): 16 ranks x 200 steps of every shipped template's workload, real
/// processes through NCCL and the plugin, and the same simulated (`--synthetic`): boundaries
/// equal the truth for >= 99.9 % of (rank, step) pairs. Real FSDP moves 4 MiB per DP operation
/// and takes about 2 minutes here (the run's limit is raised from 120 s to 600 s); the whole
/// test takes about 6 minutes on 2 cores.
#[test]
fn steps_match_the_truth_for_every_shipped_template() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("steps-truth");
    let mut report = String::new();
    for (sc, template, args) in KINDS {
        for (label, extra) in [
            ("real", &["--timeout", "600"][..]),
            ("synthetic", &["--synthetic"][..]),
        ] {
            let out = dir.path().join(format!("{sc}-{label}"));
            let mut a: Vec<String> = vec!["--scenario".into(), scenario(sc)];
            a.extend(["--steps", "200"].iter().map(|s| s.to_string()));
            a.extend(args.iter().chain(extra).map(|s| s.to_string()));
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let run = testbed(&out, &a, &[]);
            run.assert_ok();
            let (ok, total, silent, got) = score(&out, &[]);
            report.push_str(&format!(
                "{sc:<14} {label:<10} 200 steps: {ok}/{total} (rank, step) boundaries, \
                 template {got}, run {:.1} s\n",
                run.wall.as_secs_f64()
            ));
            assert_eq!(&got, template, "{sc}");
            assert_eq!(total, 16 * 200, "{sc} {label}\n{report}");
            assert_eq!(silent, 0, "{sc} {label}\n{report}");
            assert!(
                ok as f64 >= 0.999 * total as f64,
                "{sc} {label}: {ok}/{total}\n{report}"
            );
            // Free the disk as we go (a real 200-step run writes up to 40 MB).
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    eprintln!("{report}");
}

/// Seeds of the event-loss runs: each loses a different 1 % of the events.
const LOSS_SEEDS: &[u64] = &[1, 2, 3];

#[test]
fn with_one_percent_of_events_lost_calibration_realigns_and_nothing_merges_silently() {
    let _g = one_job_at_a_time();
    let dir = OutDir::new("steps-loss");
    let mut report = String::new();
    for (sc, _, args) in KINDS {
        for seed in LOSS_SEEDS {
            let out = dir.path().join(format!("{sc}-{seed}"));
            let mut a = vec!["--scenario".to_string(), scenario(sc)];
            a.extend(args.iter().map(|s| s.to_string()));
            a.extend(
                [
                    "--steps",
                    "200",
                    "--synthetic",
                    "--fault",
                    "loss:pct=1",
                    "--seed",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            a.push(seed.to_string());
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            testbed(&out, &a, &[]).assert_ok();
            let (raw_ok, total, _, _) = score(&out, &[]);
            let (ok, _, silent, _) = score(&out, &["--calibrate", "preview"]);
            report.push_str(&format!(
                "{sc:<14} seed {seed}: raw {raw_ok}/{total}, calibrated {ok}/{total} ({:.2}%), \
                 silent merges {silent}\n",
                100.0 * ok as f64 / total as f64
            ));
            assert!(total >= 16 * 190, "{sc}: {total}");
            // No step is ever merged silently: a wrong boundary is marked incomplete.
            assert_eq!(silent, 0, "{sc} seed {seed}\n{report}");
            assert!(
                ok >= raw_ok,
                "{sc} seed {seed}: calibration made it worse\n{report}"
            );
            // Merged steps are cut where the communicators' sequence numbers change step
            // (measured 99.88-100 % over ten seeds of every workload; what remains is a step
            // merged before the rank's stride was learned, or the last step's anchor lost).
            assert!(
                ok as f64 >= 0.99 * total as f64,
                "{sc} seed {seed}: {ok}/{total}\n{report}"
            );
        }
    }
    eprintln!("{report}");
}
