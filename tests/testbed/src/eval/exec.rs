//! Running one case: the test bed (this executable's `run`), then the analysis, each with its
//! output in files beside the run directory and a time limit; scoring; clean-up.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::gen::Case;
use super::score::{parse_answer, score, Answer, Score};
use super::{CaseResult, Ctx};

/// Agent runs longer than this are ended and scored as errors.
const AGENT_LIMIT: Duration = Duration::from_secs(600);

/// The test bed's arguments for `case` writing to `dir`.
fn testbed_args(ctx: &Ctx, case: &Case, dir: &Path) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "run".into(),
        "--scenario".into(),
        ctx.scenario_dir
            .join(format!("{}.toml", case.scenario))
            .display()
            .to_string(),
        "--out".into(),
        dir.display().to_string(),
        "--ranks".into(),
        case.ranks.to_string(),
        "--hosts".into(),
        case.hosts.to_string(),
        "--steps".into(),
        case.steps.to_string(),
        "--seed".into(),
        case.seed.to_string(),
        "--job".into(),
        format!("eval-{}", case.index),
        "--timeout".into(),
        case.timeout_s.to_string(),
        "--json".into(),
    ];
    if ctx.synthetic {
        a.push("--synthetic".into());
    }
    for f in &case.faults {
        a.push("--fault".into());
        a.push(f.clone());
    }
    a
}

pub(crate) fn run_case(ctx: &Ctx, case: &Case) -> CaseResult {
    let t0 = Instant::now();
    let name = format!(
        "{:04}-{}-{}-{}",
        case.index,
        case.kind.name(),
        case.scenario,
        case.ranks
    );
    let dir = ctx.runs.join(&name);
    let args = testbed_args(ctx, case, &dir);
    let replay = format!(
        "COMMINSIGHT_OVERDUE_MS={} {} {} && {} hang {} --json",
        ctx.overdue_ms,
        ctx.exe.display(),
        args.join(" "),
        ctx.agent.display(),
        dir.display()
    );
    let mut r = CaseResult {
        case: case.clone(),
        truth_culprits: case.culprit_ranks.clone(),
        got: None,
        score: Score::default(),
        error: None,
        dir: Some(dir.clone()),
        replay,
        wall_s: 0.0,
    };
    match analyse(ctx, case, &dir, &args) {
        Ok((culprits, answer)) => {
            r.truth_culprits = culprits;
            r.score = score(case, &r.truth_culprits, &answer);
            r.got = Some(answer);
        }
        Err(e) => r.error = Some(e),
    }
    if r.ok() && !ctx.keep {
        for p in [
            dir.clone(),
            log_path(&dir, "testbed.log"),
            log_path(&dir, "agent.json"),
            log_path(&dir, "agent.err"),
        ] {
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        r.dir = None;
    }
    r.wall_s = t0.elapsed().as_secs_f64();
    r
}

/// `runs/<name>.<suffix>`, beside the run directory (the analysis reads the directory).
pub(crate) fn log_path(dir: &Path, suffix: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_os_string();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

/// Run the test bed then the analysis; the truth's culprits and the parsed answer.
fn analyse(
    ctx: &Ctx,
    case: &Case,
    dir: &Path,
    args: &[String],
) -> Result<(Vec<usize>, Answer), String> {
    let log = log_path(dir, "testbed.log");
    let mut tb = Command::new(&ctx.exe);
    tb.args(args)
        .env("COMMINSIGHT_OVERDUE_MS", ctx.overdue_ms.to_string());
    let limit = Duration::from_secs(case.timeout_s + 120);
    let code = run_to_file(&mut tb, &log, &log, limit)?;
    if code != Some(0) {
        return Err(format!(
            "test bed exited {code:?}: {}",
            tail(&std::fs::read_to_string(&log).unwrap_or_default(), 300)
        ));
    }
    let truth: serde_json::Value = std::fs::read_to_string(dir.join("truth.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("{}: no readable truth.json", dir.display()))?;
    let culprits: Vec<usize> = truth["culprit_ranks"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default();
    let (out, err) = (log_path(dir, "agent.json"), log_path(dir, "agent.err"));
    let mut ag = Command::new(&ctx.agent);
    ag.arg("hang").arg(dir).arg("--json");
    let code = run_to_file(&mut ag, &out, &err, AGENT_LIMIT)?;
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    if !matches!(code, Some(0 | 1)) {
        return Err(format!(
            "`hang --json` exited {code:?}: {}",
            tail(&std::fs::read_to_string(&err).unwrap_or_default(), 300)
        ));
    }
    let answer = parse_answer(&stdout)?;
    if (code == Some(1)) != (answer.verdict_count > 0) {
        return Err(format!(
            "`hang --json` exited {code:?} with {} verdict(s) (exit 1 iff verdicts)",
            answer.verdict_count
        ));
    }
    Ok((culprits, answer))
}

/// Run `cmd` with stdout / stderr to files; its exit code (None: killed by a signal), or an error
/// when it cannot start or outlives `limit` (then it is killed).
pub(crate) fn run_to_file(
    cmd: &mut Command,
    out: &Path,
    err: &Path,
    limit: Duration,
) -> Result<Option<i32>, String> {
    let o = File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let e = if out == err {
        o.try_clone()
    } else {
        File::create(err)
    }
    .map_err(|e| format!("{}: {e}", err.display()))?;
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(o)
        .stderr(e)
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Ok(st.code()),
            Ok(None) if t0.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{:?} ran longer than {} s; ended",
                    cmd.get_program(),
                    limit.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    }
}

/// The last `n` characters of `s`, lines joined by ` | `.
pub(crate) fn tail(s: &str, n: usize) -> String {
    let t: Vec<char> = s.trim_end().chars().collect();
    let start = t.len().saturating_sub(n);
    t[start..].iter().collect::<String>().replace('\n', " | ")
}
