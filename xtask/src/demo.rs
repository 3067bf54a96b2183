//! `cargo xtask demo [--out DIR]`: the main job on the CPU test bed, diagnosed end to end.
//!
//! Two 8-rank Megatron-like jobs (tp=2 × pp=2 × dp=2 on 2 simulated hosts) run one after the
//! other, followed live by the agent daemon (standalone: it is its own master): `train-slow`
//! with rank 5 40 ms slow in every step, `train-hang` with rank 2 hung in compute from step 14. Afterwards everything is rebuilt from the daemon's archive
//! with the offline commands — `hang`, `straggler`, `report`, `trace` — and a one-screen summary
//! names the culprits with the paths of the HTML report and the Perfetto trace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::{build, count_files, deps, run, target_dir};

/// The injected faults (and what the diagnosis must find).
const SLOW_JOB: &str = "train-slow";
const SLOW_RANK: i64 = 5;
const HANG_JOB: &str = "train-hang";
const HUNG_RANK: i64 = 2;
const HANG_STEP: u32 = 14;

pub fn demo(root: &Path, args: &[String]) -> Result<()> {
    deps::ensure()?;
    let out = match args {
        [flag, dir, ..] if flag == "--out" => PathBuf::from(dir),
        _ => target_dir(root).join("demo"),
    };
    let lib = build(root)?;
    let bin = target_dir(root).join("debug");
    let agent_bin = bin.join("comminsight-agent");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let out = std::path::absolute(&out).context("demo output directory")?;
    let job = out.join("job");
    let logs = |j: &str| job.join(j).join("inspector_logs");
    let state = out.join("agent").join("state");
    let archive = out.join("agent").join("archive");
    let shm = PathBuf::from(format!("/dev/shm/comminsight-demo-{}", std::process::id()));
    for j in [SLOW_JOB, HANG_JOB] {
        std::fs::create_dir_all(logs(j))
            .with_context(|| format!("creating {}", logs(j).display()))?;
    }
    let config = out.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "# The demo's agent: every other key keeps its default (agent/config.example.toml).\n\
             [agent]\nstate_dir = \"{}\"\npoll_interval_ms = 50\ncheckpoint_interval_ms = 1000\n\n\
             [sources]\nshm_dir = \"{}\"\nsegment_dirs = [\"{}\", \"{}\"]\nscan_interval_ms = 250\n\n\
             [master]\nlisten = \"\"\n\n[archive]\ndir = \"{}\"\n\n\
             # Small jobs: choose the step template once the roles agree at 3000 and 6000 operations,\n\
             # and analyse the last steps 2 s after they are seen.\n\
             [steps]\nsettle_ops = 3000\n\n[straggler]\nsettle_s = 2\n",
            state.display(),
            shm.display(),
            logs(SLOW_JOB).display(),
            logs(HANG_JOB).display(),
            archive.display()
        ),
    )
    .context("writing the demo's agent.toml")?;
    let agent_log = out.join("agent.log");
    eprintln!(
        "xtask: starting the agent daemon (comminsight-agent run --config {}; log: {})",
        config.display(),
        agent_log.display()
    );
    let mut agent = Command::new(&agent_bin)
        .args(["run", "--config"])
        .arg(&config)
        .stderr(std::fs::File::create(&agent_log).context("creating agent.log")?)
        .spawn()
        .context("starting comminsight-agent run")?;
    let testbed = |job_id: &str, steps: &str, fault: String, extra: &[&str]| {
        run(Command::new(bin.join("comminsight-testbed"))
            .current_dir(root)
            .args(["run", "--scenario", "tests/scenarios/megatron.toml"])
            .args([
                "--ranks", "8", "--hosts", "2", "--steps", steps, "--job", job_id,
            ])
            .args(extra)
            .arg("--fault")
            .arg(fault)
            .arg("--out")
            .arg(job.join(job_id))
            .env("COMMINSIGHT_LIB_DIR", &lib)
            .env("COMMINSIGHT_SHM_DIR", &shm)
            .env("COMMINSIGHT_OVERDUE_MS", "2000"))
    };
    eprintln!(
        "xtask: job {SLOW_JOB}: 8 ranks on 2 simulated hosts, rank {SLOW_RANK} is 40 ms slow in every step"
    );
    let slow_result = testbed(SLOW_JOB, "30", format!("slow:rank={SLOW_RANK},ms=40"), &[]);
    eprintln!(
        "xtask: job {HANG_JOB}: the same job, rank {HUNG_RANK} hangs in compute at step {HANG_STEP} \
         (the run ends after 12 s)"
    );
    let hang_result = testbed(
        HANG_JOB,
        "20",
        format!("hang:rank={HUNG_RANK},step={HANG_STEP}"),
        &["--timeout", "12"],
    );
    // Let the agent archive the jobs' last segments and finish its live analyses (the hang's
    // evidence, the last steps' straggler index), then stop it as systemd would.
    let sealed = count_files(&job, ".cis");
    let live_straggler = state.join(format!("results/straggler/{SLOW_JOB}.json"));
    let t0 = Instant::now();
    while (count_files(&archive.join("raw"), ".cis.zst") < sealed
        || count_files(&archive.join("hang"), ".snapshot.json") == 0
        || !live_straggler.exists())
        && t0.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &agent.id().to_string()])
        .status();
    let agent_status = agent.wait().context("waiting for the agent")?;
    let _ = std::fs::remove_dir_all(&shm);
    slow_result?;
    hang_result?;
    if !agent_status.success() {
        bail!(
            "the agent exited with {agent_status}; see {}",
            agent_log.display()
        );
    }
    println!(
        "\n== What the plugin recorded (comminsight-agent dump --summary {}) ==",
        job.display()
    );
    run(Command::new(&agent_bin)
        .args(["dump", "--summary"])
        .arg(&job))?;
    println!(
        "\n== What the agent archived and measured: {} of {sealed} segments archived; \
         replayed from the archive (comminsight-agent replay {} --out {} --config agent.toml) ==",
        count_files(&archive.join("raw"), ".cis.zst"),
        archive.display(),
        out.join("replay").display()
    );
    // Every offline command takes the daemon's configuration: the same settings, the same results.
    let cfg = ["--config", config.to_str().context("a UTF-8 path")?];
    run(Command::new(&agent_bin)
        .arg("replay")
        .arg(&archive)
        .arg("--out")
        .arg(out.join("replay"))
        .args(cfg))?;
    for file in ["metrics.json", "roles.json"] {
        let online = std::fs::read(state.join("results").join(file)).unwrap_or_default();
        let offline = std::fs::read(out.join("replay").join(file)).unwrap_or_default();
        if online.is_empty() || online != offline {
            bail!(
                "the daemon's results ({}) differ from the replay of its archive ({})",
                state.join("results").join(file).display(),
                out.join("replay").join(file).display()
            );
        }
    }
    println!(
        "\nThe daemon's live results ({}: metrics.json, roles.json) and the offline replay of its archive are identical.",
        state.join("results").display(),
    );
    println!(
        "\n== Communicator roles and the parallel grid (comminsight-agent roles {}) ==",
        archive.display()
    );
    run(Command::new(&agent_bin)
        .arg("roles")
        .arg(&archive)
        .args(cfg))?;

    println!(
        "\n== Who stopped the job (comminsight-agent hang {}) ==",
        archive.display()
    );
    finding(Command::new(&agent_bin).arg("hang").arg(&archive).args(cfg))?;
    println!(
        "\n== Who slowed it down (comminsight-agent straggler {}) ==",
        archive.display()
    );
    finding(
        Command::new(&agent_bin)
            .arg("straggler")
            .arg(&archive)
            .args(cfg),
    )?;
    let hang = json(
        Command::new(&agent_bin)
            .args(["hang", "--json", "--job", HANG_JOB])
            .arg(&archive)
            .args(cfg),
    )?;
    let straggler = json(
        Command::new(&agent_bin)
            .args(["straggler", "--json", "--job", SLOW_JOB])
            .arg(&archive)
            .args(cfg),
    )?;
    // One report per job: report-<job>.html.
    run(Command::new(&agent_bin)
        .arg("report")
        .arg(&archive)
        .arg("-o")
        .arg(out.join("report.html"))
        .args(cfg))?;
    let report = out.join(format!("report-{SLOW_JOB}.html"));
    // The interesting steps: around the top straggler's worst step.
    let (a, b) = peak_steps(&straggler);
    let trace = out.join(format!("steps-{a}-{b}.pftrace"));
    run(Command::new(&agent_bin)
        .arg("trace")
        .arg(&archive)
        .args(["--job", SLOW_JOB, "--steps", &format!("{a}..{b}"), "-o"])
        .arg(&trace)
        .args(cfg))?;
    let live: Value = std::fs::read(&live_straggler)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    summary(&hang, &straggler, &live, &report, &trace, &archive)
}

/// Run a diagnosis command whose exit status 1 means "found something" (the demo wants that).
fn finding(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let st = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    match st.code() {
        Some(0 | 1) => Ok(()),
        _ => bail!("{cmd:?} failed with {st}"),
    }
}

/// Its `--json` output (exit status 0 or 1).
fn json(cmd: &mut Command) -> Result<Value> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !matches!(out.status.code(), Some(0 | 1)) {
        bail!(
            "{cmd:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("{cmd:?}: not JSON"))
}

/// The top straggler's worst step, with one step either side.
fn peak_steps(straggler: &Value) -> (u64, u64) {
    let top = straggler["ranks"][0]["rank"].as_i64();
    let peak = straggler["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| {
            let r = s["ranks"]
                .as_array()?
                .iter()
                .find(|r| r["rank"].as_i64() == top)?;
            // A step the hang cut short is not one to look at for the straggler.
            if r["coverage_complete"] != true {
                return None;
            }
            Some((s["step"].as_u64()?, r["index"].as_f64()?))
        })
        .max_by(|x, y| x.1.total_cmp(&y.1))
        .map_or(1, |p| p.0);
    (peak.saturating_sub(1), peak + 1)
}

fn summary(
    hang: &Value,
    straggler: &Value,
    live: &Value,
    report: &Path,
    trace: &Path,
    archive: &Path,
) -> Result<()> {
    println!("\n== Diagnosis ==");
    let v = &hang["verdicts"][0];
    let sources: Vec<i64> = v["source_ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_i64)
        .collect();
    // The source's Python stack (captured live by the daemon): the GIL holder's innermost frame.
    let frame = v["evidence"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["rank"].as_i64() == sources.first().copied())
        .and_then(|s| {
            let threads = s["stacks"]["threads"].as_array()?;
            let t = threads
                .iter()
                .find(|t| t["owns_gil"] == true)
                .or(threads.first())?;
            let frames = t["frames"].as_array()?;
            let show = |f: &Value| {
                format!(
                    "{} ({}:{})",
                    f["name"].as_str().unwrap_or("?"),
                    f["file"].as_str().unwrap_or("?"),
                    f["line"]
                )
            };
            let inner = show(frames.first()?);
            // Native frames first (innermost), then the Python code that called them.
            Some(match frames.iter().find(|f| f["native"] != true) {
                Some(py) if frames[0]["native"] == true => {
                    format!("{inner} called from {}", show(py))
                }
                _ => inner,
            })
        })
        // The daemon takes stacks only of its own host's ranks; the test bed's hosts are
        // simulated names, not this machine's.
        .unwrap_or_else(|| "(none: stacks are taken of the agent's own host only)".into());
    println!(
        "hang       {} of job {}: source rank(s) {:?} (injected: {HUNG_RANK}); first non-progressing: {} seq {} on {} comm {}; source's innermost frame: {frame}",
        v["kind"].as_str().unwrap_or("none"),
        v["job"].as_str().unwrap_or("?"),
        sources,
        v["func"].as_str().unwrap_or("?"),
        v["seq"],
        v["comm"]["role"].as_str().unwrap_or("?"),
        v["comm"]["name"].as_str().unwrap_or("?"),
    );
    let top = &straggler["ranks"][0];
    println!(
        "straggler  rank {} (injected: {SLOW_RANK}) on {}: root index {:.1} (threshold {}), over it in {} of {} steps, own excess {:.1} % of the step, fixing it saves {:.1} %; seed index {:.1}; {}: {}",
        top["rank"],
        top["host"].as_str().unwrap_or("?"),
        top["root_index"].as_f64().unwrap_or(0.0),
        straggler["root_threshold"],
        top["root_steps_over"],
        top["complete_steps"],
        top["root_delay"].as_f64().unwrap_or(0.0),
        top["saves_pct"].as_f64().unwrap_or(0.0),
        top["index"].as_f64().unwrap_or(0.0),
        top["class"].as_str().unwrap_or("?"),
        top["class_reason"].as_str().unwrap_or(""),
    );
    println!(
        "live       the daemon's own analysis (results/straggler/{SLOW_JOB}.json, last {} steps) names rank {} first",
        live["steps"].as_array().map_or(0, Vec::len),
        live["ranks"][0]["rank"]
    );
    println!(
        "report     {} (and report-{HANG_JOB}.html beside it)",
        report.display()
    );
    println!(
        "trace      {} (open it in ui.perfetto.dev)",
        trace.display()
    );
    println!("archive    {}", archive.display());
    let found_hang = sources.first() == Some(&HUNG_RANK);
    let found_slow = top["rank"].as_i64() == Some(SLOW_RANK);
    if !found_hang || !found_slow {
        bail!(
            "the diagnosis missed an injected fault (hang: {found_hang}, straggler: {found_slow})"
        );
    }
    Ok(())
}
