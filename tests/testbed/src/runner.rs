//! Real runs: one Python rank process per rank against the libnccl stand-in and the plugin.
//!
//! The runner writes `DIR/run/plan-<r>.json` and the rank driver, starts the ranks (in network
//! namespaces when a slow link is asked for), waits until all exit or `timeout` passes, then
//! ends the rest (SIGTERM so the plugin flushes at exit, SIGKILL ~2 s later) and merges
//! `DIR/truth.json`. Every child lives in a kill-on-drop guard and dies with the runner.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::fault::{parse_rate, Fault};
use crate::layout::{host_of, Dim, Layout, Role};
use crate::netns::{Netns, NetnsError};
use crate::plan::RankPlan;
use crate::scenario::{CommInit, Frontend, Scenario, TorchGroups};
use crate::truth::{self, RunFacts, Truth, TruthError};

/// The rank driver, embedded so the binary works from any directory.
pub const RANK_DRIVER: &str = include_str!("../python/rank_driver.py");
/// The torch frontend of the rank driver (`frontend = "torch"`).
pub const TORCH_DRIVER: &str = include_str!("../python/torch_driver.py");
/// The fake `torch` package (`python/fake_torch/`), written to `DIR/run/fake_torch/` for the
/// torch frontend: (path under `fake_torch/`, contents).
pub const FAKE_TORCH: &[(&str, &str)] = &[
    (
        "torch/__init__.py",
        include_str!("../python/fake_torch/torch/__init__.py"),
    ),
    (
        "torch/cuda.py",
        include_str!("../python/fake_torch/torch/cuda.py"),
    ),
    (
        "torch/distributed/__init__.py",
        include_str!("../python/fake_torch/torch/distributed/__init__.py"),
    ),
    (
        "torch/distributed/_nccl.py",
        include_str!("../python/fake_torch/torch/distributed/_nccl.py"),
    ),
    (
        "torch/distributed/distributed_c10d.py",
        include_str!("../python/fake_torch/torch/distributed/distributed_c10d.py"),
    ),
    (
        "torch/distributed/_store.py",
        include_str!("../python/fake_torch/torch/distributed/_store.py"),
    ),
    (
        "torch/distributed/device_mesh.py",
        include_str!("../python/fake_torch/torch/distributed/device_mesh.py"),
    ),
];
/// Where `cargo xtask build` stages the GPU stand-ins (`tests/gpu-standin`: libcudart.so.12,
/// libcuda.so.1, libnvidia-ml.so.1) under the lib dir.
pub const GPU_STANDIN_DIR: &str = "gpu-standin";
/// Grace between SIGTERM and SIGKILL.
pub const TERM_GRACE: Duration = Duration::from_secs(2);
/// After an unexpected rank failure (no fault explains it), the others get this long to finish.
pub const FAILURE_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);
/// The plugin's default ring directory (`COMMINSIGHT_SHM_DIR`).
pub const DEFAULT_SHM_DIR: &str = "/dev/shm/comminsight";

/// Everything a real run needs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub scenario: Scenario,
    pub layout: Layout,
    pub hosts: usize,
    pub steps: u32,
    pub seed: u64,
    pub faults: Vec<Fault>,
    pub out: PathBuf,
    pub timeout: Duration,
    pub lib_dir: PathBuf,
    /// `NCCL_PROFILER_PLUGIN=none`.
    pub no_plugin: bool,
    pub job: String,
    pub python: String,
    /// Run in network namespaces even without a slow link.
    pub netns: bool,
    /// Leave the shared-memory rings of killed ranks in place (default: removed after the run).
    pub keep_rings: bool,
}

/// How a real run went.
#[derive(Debug)]
pub struct RunOutcome {
    pub truth: Truth,
    pub wall: Duration,
    pub timed_out: bool,
    /// A stop signal (SIGINT, SIGTERM, SIGHUP) ended the run early.
    pub interrupted: bool,
    /// Ranks that failed without a fault to explain it.
    pub unexpected: Vec<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot start rank {rank} ({python}): {source}")]
    Spawn {
        rank: usize,
        python: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Truth(#[from] TruthError),
    #[error(
        "link {a}->{b}: both ranks are on host{host}; use --hosts so they sit on different hosts"
    )]
    SameHost { a: usize, b: usize, host: usize },
    #[error("{0}")]
    Rate(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A rank process, killed (SIGKILL) and reaped when dropped.
struct RankProc {
    rank: usize,
    child: Child,
    exit: Option<ExitStatus>,
}

impl RankProc {
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }
}

impl Drop for RankProc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Prepare `DIR`: clear the previous run's `run/`, `ranks/`, `inspector_logs/` and `truth.json`.
pub fn prepare_out(out: &Path) -> Result<(), RunError> {
    for sub in ["run", "ranks", "inspector_logs"] {
        let p = out.join(sub);
        if p.exists() {
            std::fs::remove_dir_all(&p).map_err(io(&p))?;
        }
        std::fs::create_dir_all(&p).map_err(io(&p))?;
    }
    let t = out.join("truth.json");
    if t.exists() {
        std::fs::remove_file(&t).map_err(io(&t))?;
    }
    Ok(())
}

/// `host<h>` of every rank.
pub fn rank_hosts(world: usize, hosts: usize) -> Vec<String> {
    (0..world)
        .map(|r| format!("host{}", host_of(r, world, hosts)))
        .collect()
}

/// The JSON plan handed to the driver of `plan.rank`.
pub fn driver_plan(cfg: &RunConfig, plan: &RankPlan, run_dir: &Path) -> serde_json::Value {
    let comms: Vec<serde_json::Value> = cfg
        .layout
        .active_roles()
        .into_iter()
        .map(|role| {
            let g = cfg.layout.group_of(plan.rank, role);
            serde_json::json!({
                "role": role,
                "name": g.name,
                "ranks": g.ranks,
                "color": g.ranks[0],
            })
        })
        .collect();
    let mut v = serde_json::json!({
        "rank": plan.rank,
        "world": cfg.layout.world(),
        "run_dir": run_dir,
        "truth_file": run_dir.join(format!("rank-{}.json", plan.rank)),
        "named_comms": cfg.scenario.workload.named_comms,
        "verify": cfg.scenario.workload.verify,
        "comm_init": match cfg.scenario.workload.comm_init {
            CommInit::Config => "config",
            CommInit::Split => "split",
        },
        "comms": comms,
        "steps": plan.steps,
    });
    if let Some(m) = crate::moe::driver_json(
        &cfg.scenario.moe,
        &cfg.layout,
        plan.rank,
        &cfg.faults,
        &cfg.lib_dir,
    ) {
        v["moe"] = m;
    }
    if cfg.scenario.workload.frontend == Frontend::Torch {
        v["frontend"] = "torch".into();
        v["torch_groups"] = match cfg.scenario.workload.torch_groups {
            TorchGroups::Megatron => "megatron",
            TorchGroups::Mesh => "mesh",
        }
        .into();
        v["all_groups"] = torch_groups(&cfg.layout);
        v["mesh"] = torch_mesh(&cfg.layout);
    }
    hccl::mark_plan(cfg, &mut v);
    v
}

/// Every group of every active role but `global` (`{role: [[ranks], ...]}`): the torch frontend
/// makes them all on every rank, as Megatron-core does.
fn torch_groups(l: &Layout) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for g in l
        .all_groups()
        .into_iter()
        .filter(|g| g.role != Role::Global)
    {
        m.entry(g.role.name())
            .or_insert_with(|| serde_json::Value::Array(Vec::new()))
            .as_array_mut()
            .expect("array")
            .push(serde_json::json!(g.ranks));
    }
    serde_json::Value::Object(m)
}

/// The DeviceMesh of the layout: its dimensions of size > 1, slowest first (row-major, so
/// `arange(world).reshape(shape)` numbers the ranks as the layout's order does).
fn torch_mesh(l: &Layout) -> serde_json::Value {
    let dims: Vec<Dim> = l
        .order
        .dims
        .iter()
        .rev()
        .copied()
        .filter(|d| l.dim_size(*d) > 1)
        .collect();
    serde_json::json!({
        "shape": dims.iter().map(|d| l.dim_size(*d)).collect::<Vec<_>>(),
        "names": dims.iter().map(|d| d.name()).collect::<Vec<_>>(),
    })
}

/// Write the torch frontend (driver and fake torch package) into `run_dir`; returns the directory
/// to put first on the ranks' PYTHONPATH.
fn write_torch_frontend(run_dir: &Path) -> Result<PathBuf, RunError> {
    let driver = run_dir.join("torch_driver.py");
    std::fs::write(&driver, TORCH_DRIVER).map_err(io(&driver))?;
    let root = run_dir.join("fake_torch");
    for (rel, text) in FAKE_TORCH {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    Ok(root)
}

/// The hosts of link fault ranks `a` -> `b`; they must differ.
fn link_hosts(cfg: &RunConfig, a: usize, b: usize) -> Result<(usize, usize), RunError> {
    let world = cfg.layout.world();
    let (ha, hb) = (host_of(a, world, cfg.hosts), host_of(b, world, cfg.hosts));
    if ha == hb {
        return Err(RunError::SameHost { a, b, host: ha });
    }
    Ok((ha, hb))
}

/// The droplink faults as `(from host, to host, pct)`.
fn droplinks(cfg: &RunConfig) -> Result<Vec<(usize, usize, f64)>, RunError> {
    let mut out = Vec::new();
    for f in &cfg.faults {
        if let Fault::Droplink { a, b, pct } = f {
            let (ha, hb) = link_hosts(cfg, *a, *b)?;
            out.push((ha, hb, *pct));
        }
    }
    Ok(out)
}

fn slowlinks(cfg: &RunConfig) -> Result<Vec<(usize, usize, String, u64)>, RunError> {
    let mut out = Vec::new();
    for f in &cfg.faults {
        if let Fault::Slowlink { a, b, rate } = f {
            let (ha, hb) = link_hosts(cfg, *a, *b)?;
            out.push((
                ha,
                hb,
                rate.clone(),
                parse_rate(rate).map_err(RunError::Rate)?,
            ));
        }
    }
    Ok(out)
}

/// Faults that make other ranks wait forever (the run is expected to time out).
fn blocking_faults(faults: &[Fault]) -> bool {
    faults.iter().any(|f| {
        matches!(
            f,
            Fault::Hang { .. } | Fault::Pyhang { .. } | Fault::Kill { .. } | Fault::Mismatch { .. }
        )
    })
}

fn spawn_rank(
    cfg: &RunConfig,
    rank: usize,
    plan_path: &Path,
    driver: &Path,
    pythonpath: Option<&Path>,
    netns: Option<&Netns>,
) -> Result<RankProc, RunError> {
    let world = cfg.layout.world();
    let host = host_of(rank, world, cfg.hosts);
    let mut cmd = match netns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &n.host_ns(host), &cfg.python]);
            c.env("COMMINSIGHT_TESTBED_BIND_ADDR", n.addr(host));
            c
        }
        None => Command::new(&cfg.python),
    };
    cmd.arg(driver).arg(plan_path);
    let log_path = cfg.out.join("ranks").join(format!("rank-{rank}.log"));
    let log = File::create(&log_path).map_err(io(&log_path))?;
    let log2 = log.try_clone().map_err(io(&log_path))?;
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    let mut ld = cfg.lib_dir.clone().into_os_string();
    // The CUDA stand-in (`cargo xtask build` stages it): each rank selects its device through
    // it as a training script does, so the plugin records which GPU each rank runs on.
    let gpu = cfg.lib_dir.join(GPU_STANDIN_DIR);
    if gpu.is_dir() {
        ld.push(":");
        ld.push(&gpu);
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        ld.push(":");
        ld.push(old);
    }
    cmd.env("LD_LIBRARY_PATH", ld);
    if let Some(first) = pythonpath {
        // Prepend: the preload may have put the inject on PYTHONPATH already.
        let mut pp = first.as_os_str().to_os_string();
        if let Some(old) = std::env::var_os("PYTHONPATH").filter(|o| !o.is_empty()) {
            pp.push(":");
            pp.push(old);
        }
        cmd.env("PYTHONPATH", pp);
    }
    hccl::plugin_env(cfg, &mut cmd);
    let hostname = format!("host{host}");
    cmd.env("COMMINSIGHT_LOG_DIR", cfg.out.join("inspector_logs"))
        .env("COMMINSIGHT_JOB_ID", &cfg.job)
        .env("COMMINSIGHT_HOSTNAME", &hostname)
        .env("COMMINSIGHT_TESTBED_HOST", &hostname)
        .env("RANK", rank.to_string())
        .env(
            "LOCAL_RANK",
            (rank % (world / cfg.hosts).max(1)).to_string(),
        )
        .env("WORLD_SIZE", world.to_string())
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for f in &cfg.faults {
        if let Fault::Loss { pct } = f {
            cmd.env("COMMINSIGHT_TESTBED_LOSS_PCT", pct.to_string())
                .env("COMMINSIGHT_TESTBED_SEED", cfg.seed.to_string());
        }
    }
    crate::sys::kill_with_parent(&mut cmd);
    let child = cmd.spawn().map_err(|source| RunError::Spawn {
        rank,
        python: cfg.python.clone(),
        source,
    })?;
    Ok(RankProc {
        rank,
        child,
        exit: None,
    })
}

fn describe(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        None => "timeout".into(),
        Some(s) => match (s.code(), s.signal()) {
            (Some(0), _) => "done".into(),
            (Some(143), _) => "terminated".into(),
            (Some(c), _) => format!("exit {c}"),
            (None, Some(9)) => "killed".into(),
            (None, Some(sig)) => format!("signal {sig}"),
            _ => "unknown".into(),
        },
    }
}

/// Run `plans` for real and write `DIR/truth.json`.
pub fn run(cfg: &RunConfig, plans: &[RankPlan]) -> Result<RunOutcome, RunError> {
    let t0 = Instant::now();
    prepare_out(&cfg.out)?;
    let run_dir = std::fs::canonicalize(cfg.out.join("run")).map_err(io(&cfg.out))?;
    let driver = run_dir.join("rank_driver.py");
    std::fs::write(&driver, RANK_DRIVER).map_err(io(&driver))?;
    let pythonpath = match cfg.scenario.workload.frontend {
        Frontend::Torch => Some(write_torch_frontend(&run_dir)?),
        Frontend::Hccl => hccl::write_driver(&run_dir)?,
        Frontend::Nccl => None,
    };
    let links = slowlinks(cfg)?;
    let drops = droplinks(cfg)?;
    crate::sys::install_stop_handler();
    let mut netns = if cfg.netns || !links.is_empty() || !drops.is_empty() {
        let mut n = Netns::create(cfg.hosts)?;
        for (a, b, rate, bps) in &links {
            n.shape(*a, *b, rate, *bps)?;
        }
        for (a, b, pct) in &drops {
            n.drop_packets(*a, *b, *pct)?;
        }
        Some(n)
    } else {
        None
    };
    let mut procs = Vec::new();
    for plan in plans {
        let p = run_dir.join(format!("plan-{}.json", plan.rank));
        let text = serde_json::to_string(&driver_plan(cfg, plan, &run_dir)).expect("plan json");
        std::fs::write(&p, text).map_err(io(&p))?;
        procs.push(spawn_rank(
            cfg,
            plan.rank,
            &p,
            &driver,
            pythonpath.as_deref(),
            netns.as_ref(),
        )?);
    }
    let expected_failures = blocking_faults(&cfg.faults);
    let deadline = t0 + cfg.timeout;
    let mut unexpected = Vec::new();
    let mut fail_deadline: Option<Instant> = None;
    let mut timed_out = false;
    let mut interrupted = false;
    loop {
        let mut running = 0;
        for p in procs.iter_mut() {
            match p.poll() {
                None => running += 1,
                Some(s) if !s.success() && !unexpected.contains(&p.rank) => {
                    if !expected_failures {
                        eprintln!(
                            "comminsight-testbed: rank {} failed ({}), see {}",
                            p.rank,
                            describe(Some(s)),
                            cfg.out
                                .join("ranks")
                                .join(format!("rank-{}.log", p.rank))
                                .display()
                        );
                        unexpected.push(p.rank);
                        fail_deadline.get_or_insert(Instant::now() + FAILURE_GRACE);
                    }
                }
                Some(_) => {}
            }
        }
        if running == 0 {
            break;
        }
        let now = Instant::now();
        if crate::sys::stop_requested() {
            eprintln!("comminsight-testbed: interrupted; ending {running} rank(s)");
            interrupted = true;
            end_all(&mut procs);
            break;
        }
        if now >= deadline || fail_deadline.is_some_and(|d| now >= d) {
            timed_out = now >= deadline;
            eprintln!(
                "comminsight-testbed: {running} rank(s) still running after {:.1} s; ending them",
                t0.elapsed().as_secs_f64()
            );
            end_all(&mut procs);
            break;
        }
        std::thread::sleep(POLL);
    }
    if let Some(n) = netns.as_mut() {
        n.teardown();
    }
    let facts = RunFacts {
        job: cfg.job.clone(),
        scenario: cfg.scenario.name.clone(),
        seed: cfg.seed,
        hosts: cfg.hosts,
        synthetic: false,
        layout: cfg.layout,
        faults: cfg.faults.clone(),
        rank_hosts: rank_hosts(cfg.layout.world(), cfg.hosts),
    };
    let mut truth = truth::merge(&run_dir, &facts, &cfg.layout.all_groups());
    for p in procs.iter_mut() {
        let info = truth.rank_info.entry(p.rank).or_default();
        let exit = describe(p.exit);
        if info.status.is_empty() || !info.status.starts_with("error") {
            info.status = exit;
        }
        if info.pid.is_none() {
            info.pid = Some(p.child.id());
        }
    }
    if !cfg.keep_rings {
        remove_leaked_rings(cfg, &procs);
    }
    truth.write(&cfg.out.join("truth.json"))?;
    unexpected.sort_unstable();
    Ok(RunOutcome {
        truth,
        wall: t0.elapsed(),
        timed_out,
        interrupted,
        unexpected,
    })
}

/// The plugin unlinks its ring at exit; a SIGKILLed rank cannot. Remove the rings of this run's
/// ranks that are still there (`<COMMINSIGHT_SHM_DIR>/<uid>/<job>.<host>.<pid>.ring` and
/// `.ctl`, in the ranks' per-user ring directory: the ranks run as our effective uid).
fn remove_leaked_rings(cfg: &RunConfig, procs: &[RankProc]) {
    let dir = std::env::var_os("COMMINSIGHT_SHM_DIR")
        .map_or_else(|| PathBuf::from(DEFAULT_SHM_DIR), PathBuf::from)
        .join(crate::sys::euid().to_string());
    let world = cfg.layout.world();
    for p in procs {
        let host = host_of(p.rank, world, cfg.hosts);
        let ring = dir.join(format!("{}.host{host}.{}.ring", cfg.job, p.child.id()));
        let _ = std::fs::remove_file(ring.with_extension("ring.ctl"));
        let _ = std::fs::remove_file(ring);
    }
}

/// SIGTERM every live rank, give them `TERM_GRACE` to flush and exit, then SIGKILL the rest.
fn end_all(procs: &mut [RankProc]) {
    for p in procs.iter_mut() {
        if p.poll().is_none() {
            crate::sys::signal(p.child.id(), libc::SIGTERM);
        }
    }
    let until = Instant::now() + TERM_GRACE;
    while Instant::now() < until && procs.iter_mut().any(|p| p.poll().is_none()) {
        std::thread::sleep(POLL);
    }
    for p in procs.iter_mut() {
        if p.poll().is_some() {
            continue;
        }
        let _ = p.child.kill();
        p.exit = p.child.wait().ok();
        p.exit.get_or_insert_with(|| {
            use std::os::unix::process::ExitStatusExt;
            ExitStatus::from_raw(9)
        });
    }
}

#[cfg(test)]
mod tests;

mod hccl;
