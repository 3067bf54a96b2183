//! Scenario files (TOML): layout, workload, message sizes, compute times, faults.
//! Every key is documented in `tests/scenarios/README.md`; unknown keys are rejected.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fault::{Fault, FaultSpecError};
use crate::layout::{Layout, LayoutError, Order, MEGATRON_ORDER};

pub const DEFAULT_STEPS: u32 = 20;
pub const DEFAULT_MICROBATCHES: u32 = 4;
pub const DEFAULT_LAYERS: u32 = 1;
pub const DEFAULT_HOSTS: usize = 1;
pub const DEFAULT_SEED: u64 = 1;
pub const DEFAULT_TP_BYTES: u64 = 64 << 10;
pub const DEFAULT_CP_BYTES: u64 = 32 << 10;
pub const DEFAULT_PP_BYTES: u64 = 64 << 10;
pub const DEFAULT_EP_BYTES: u64 = 64 << 10;
pub const DEFAULT_DP_BYTES: u64 = 1 << 20;
pub const DEFAULT_GLOBAL_BYTES: u64 = 8;
pub const DEFAULT_FORWARD_MS: f64 = 1.0;
pub const DEFAULT_BACKWARD_MS: f64 = 2.0;
pub const DEFAULT_EXPERT_MS: f64 = 0.5;
pub const DEFAULT_OPTIMIZER_MS: f64 = 1.0;
pub const DEFAULT_BUCKETS: u32 = 4;

/// A whole scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Scenario name; the default job id. Default: the file stem.
    #[serde(default)]
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    pub layout: LayoutSpec,
    #[serde(default)]
    pub workload: Workload,
    #[serde(default)]
    pub messages: Messages,
    #[serde(default)]
    pub compute: Compute,
    /// `[moe]`: the MoE EP reporter ([`crate::moe`]).
    #[serde(default)]
    pub moe: crate::moe::MoeSpec,
    /// Fault SPECs (same syntax as `--fault`), applied in addition to the command line's.
    #[serde(default)]
    pub faults: Vec<String>,
}

/// `[layout]`: parallel sizes and hosts. world = tp * cp * dp * pp.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayoutSpec {
    #[serde(default = "one")]
    pub tp: usize,
    #[serde(default = "one")]
    pub cp: usize,
    #[serde(default = "one")]
    pub dp: usize,
    #[serde(default = "one")]
    pub pp: usize,
    /// Expert parallel size (divides dp); > 1 with `workload.moe_layers` > 0 adds EP all-to-alls.
    #[serde(default = "one")]
    pub ep: usize,
    /// Simulated hosts (ranks spread in equal blocks). Default 1.
    #[serde(default = "default_hosts")]
    pub hosts: usize,
    /// Rank order, fastest first (Megatron-core's `order`). Default `tp-cp-ep-dp-pp`.
    #[serde(default = "default_order")]
    pub order: String,
}

/// How the ranks drive NCCL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Frontend {
    /// NCCL through ctypes (`rank_driver.py`).
    #[default]
    Nccl,
    /// The same plan through the fake `torch.distributed` (`torch_driver.py`), which never names
    /// communicators.
    Torch,
    /// The same plan through HCCL (`hccl_driver.py`, the libhccl stand-in), recorded by the
    /// LD_PRELOAD shim (no NCCL profiler plugin).
    Hccl,
}

/// How the torch frontend makes its process groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TorchGroups {
    /// Megatron-core `parallel_state` style: every rank calls `new_group(ranks, group_desc=...)`
    /// for every group of every role.
    #[default]
    Megatron,
    /// `init_device_mesh(..., mesh_dim_names=...)`, one mesh dimension per role.
    Mesh,
}

/// Which framework's step the ranks run (`[workload] kind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Megatron-style training: 1F1B pipeline, TP / CP / EP inside layers, DP gradient sync.
    #[default]
    Megatron,
    /// FSDP / ZeRO-3: per-layer DP all-gather of parameters (forward and backward) and DP
    /// reduce-scatter of gradients (backward); optional TP inside layers.
    Fsdp,
    /// Plain DDP: backward interleaved with `buckets` DP all-reduces.
    Ddp,
    /// Inference decode loop: TP all-reduces per layer, PP send / recv per token batch, a TP
    /// all-gather of the sampled tokens per iteration.
    Decode,
}

/// How the DP gradient synchronisation is done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpSync {
    #[default]
    AllReduce,
    /// Distributed optimizer style: reduce-scatter then all-gather.
    ReduceScatterAllGather,
}

/// How group communicators are created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommInit {
    /// `ncclCommInitRankConfig` with a unique id shared through files.
    #[default]
    Config,
    /// `ncclCommSplit` of the world communicator.
    Split,
}

/// `[workload]`: step structure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// The framework whose step is run: `megatron`, `fsdp`, `ddp` or `decode`.
    #[serde(default)]
    pub kind: WorkloadKind,
    #[serde(default = "default_steps")]
    pub steps: u32,
    #[serde(default = "default_microbatches")]
    pub microbatches: u32,
    /// Transformer layers per pipeline stage (each: 2 TP all-reduces forward, 2 backward).
    #[serde(default = "default_layers")]
    pub layers: u32,
    /// Of those, layers with an MoE block (EP all-to-all dispatch + combine).
    #[serde(default)]
    pub moe_layers: u32,
    #[serde(default)]
    pub dp_sync: DpSync,
    /// With `kind = "ddp"`: gradient buckets (DP all-reduces) per step.
    #[serde(default = "default_buckets")]
    pub buckets: u32,
    #[serde(default)]
    pub comm_init: CommInit,
    /// Give communicators role-based names (`commName`); false leaves them unnamed.
    #[serde(default = "yes")]
    pub named_comms: bool,
    /// Check every collective's result numerically in the rank driver.
    #[serde(default = "yes")]
    pub verify: bool,
    /// `nccl` (ctypes driver) or `torch` (fake `torch.distributed`).
    #[serde(default)]
    pub frontend: Frontend,
    /// With `frontend = "torch"`: `megatron` or `mesh` group creation.
    #[serde(default)]
    pub torch_groups: TorchGroups,
    #[serde(default = "default_seed")]
    pub seed: u64,
}

/// `[messages]`: bytes per operation (float32 elements = bytes / 4, at least 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Messages {
    #[serde(default = "d_tp")]
    pub tp: u64,
    #[serde(default = "d_cp")]
    pub cp: u64,
    #[serde(default = "d_pp")]
    pub pp: u64,
    #[serde(default = "d_ep")]
    pub ep: u64,
    #[serde(default = "d_dp")]
    pub dp: u64,
    #[serde(default = "d_global")]
    pub global: u64,
}

/// `[compute]`: milliseconds of compute per microbatch per stage (split over layers), and per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compute {
    #[serde(default = "d_fwd")]
    pub forward_ms: f64,
    #[serde(default = "d_bwd")]
    pub backward_ms: f64,
    /// Per MoE layer and microbatch, between dispatch and combine (forward; twice that backward).
    #[serde(default = "d_expert")]
    pub expert_ms: f64,
    /// Once per step, after the gradient sync.
    #[serde(default = "d_opt")]
    pub optimizer_ms: f64,
}

impl Compute {
    /// Every time multiplied by `f`.
    pub fn scale(&mut self, f: f64) {
        self.forward_ms *= f;
        self.backward_ms *= f;
        self.expert_ms *= f;
        self.optimizer_ms *= f;
    }
}

fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn default_order() -> String {
    MEGATRON_ORDER.to_string()
}
fn default_hosts() -> usize {
    DEFAULT_HOSTS
}
fn default_steps() -> u32 {
    DEFAULT_STEPS
}
fn default_microbatches() -> u32 {
    DEFAULT_MICROBATCHES
}
fn default_layers() -> u32 {
    DEFAULT_LAYERS
}
fn default_buckets() -> u32 {
    DEFAULT_BUCKETS
}
fn default_seed() -> u64 {
    DEFAULT_SEED
}
fn d_tp() -> u64 {
    DEFAULT_TP_BYTES
}
fn d_cp() -> u64 {
    DEFAULT_CP_BYTES
}
fn d_pp() -> u64 {
    DEFAULT_PP_BYTES
}
fn d_ep() -> u64 {
    DEFAULT_EP_BYTES
}
fn d_dp() -> u64 {
    DEFAULT_DP_BYTES
}
fn d_global() -> u64 {
    DEFAULT_GLOBAL_BYTES
}
fn d_fwd() -> f64 {
    DEFAULT_FORWARD_MS
}
fn d_bwd() -> f64 {
    DEFAULT_BACKWARD_MS
}
fn d_expert() -> f64 {
    DEFAULT_EXPERT_MS
}
fn d_opt() -> f64 {
    DEFAULT_OPTIMIZER_MS
}

impl Default for Workload {
    fn default() -> Self {
        toml::from_str("").expect("all workload keys have defaults")
    }
}
impl Default for Messages {
    fn default() -> Self {
        toml::from_str("").expect("all message keys have defaults")
    }
}
impl Default for Compute {
    fn default() -> Self {
        toml::from_str("").expect("all compute keys have defaults")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid scenario {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("scenario {path}: {source}")]
    Layout { path: PathBuf, source: LayoutError },
    #[error("scenario {path}: {source}")]
    Fault {
        path: PathBuf,
        source: FaultSpecError,
    },
    #[error("scenario {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// toml's message, with the offending line (`line 3: frontend = "x"`) so the key is named.
fn parse_message(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return msg;
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
    if line.is_empty() {
        msg
    } else {
        format!("line {line_no}: `{line}`: {msg}")
    }
}

impl Scenario {
    /// Read and validate a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        Scenario::parse(&text, path, &stem)
    }

    /// Parse scenario text; `path` only labels errors, `stem` is the default name.
    pub fn parse(text: &str, path: &Path, stem: &str) -> Result<Scenario, ScenarioError> {
        let mut s: Scenario = toml::from_str(text).map_err(|e| ScenarioError::Parse {
            path: path.to_path_buf(),
            message: parse_message(text, &e),
        })?;
        if s.name.is_empty() {
            s.name = stem.to_string();
        }
        s.layout
            .order
            .parse::<Order>()
            .map_err(|e| ScenarioError::Invalid {
                path: path.to_path_buf(),
                message: format!("[layout] order: {e}"),
            })?;
        s.layout()
            .validate()
            .map_err(|source| ScenarioError::Layout {
                path: path.to_path_buf(),
                source,
            })?;
        let invalid = |message: String| ScenarioError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        if s.workload.microbatches == 0 || s.workload.layers == 0 {
            return Err(invalid("microbatches and layers must be >= 1".into()));
        }
        if s.workload.moe_layers > s.workload.layers {
            return Err(invalid("moe_layers must be <= layers".into()));
        }
        check_workload(&s.workload, &s.layout()).map_err(&invalid)?;
        if s.workload.torch_groups == TorchGroups::Mesh && s.layout.ep > 1 {
            return Err(invalid(
                "[workload] torch_groups = \"mesh\" needs [layout] ep = 1 (no EP mesh dimension inside dp); use torch_groups = \"megatron\"".into(),
            ));
        }
        for ms in [
            s.compute.forward_ms,
            s.compute.backward_ms,
            s.compute.expert_ms,
            s.compute.optimizer_ms,
        ] {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(invalid("compute times must be >= 0".into()));
            }
        }
        s.parsed_faults().map_err(|source| ScenarioError::Fault {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(s)
    }

    /// The layout (an order that does not parse, which [`Scenario::parse`] rejects, reads as
    /// Megatron's).
    pub fn layout(&self) -> Layout {
        let l = &self.layout;
        Layout::new(l.tp, l.cp, l.dp, l.pp, l.ep).with_order(l.order.parse().unwrap_or_default())
    }

    pub fn parsed_faults(&self) -> Result<Vec<Fault>, FaultSpecError> {
        self.faults.iter().map(|s| s.parse()).collect()
    }
}

/// Check that the workload `kind` fits the layout `l` (also after `--ranks` rescaled it): a
/// one-line message naming the keys and the fix.
pub fn check_workload(w: &Workload, l: &Layout) -> Result<(), String> {
    let kind = match w.kind {
        WorkloadKind::Megatron => return Ok(()),
        WorkloadKind::Fsdp => "fsdp",
        WorkloadKind::Ddp => "ddp",
        WorkloadKind::Decode => "decode",
    };
    let need = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!(
                "[workload] kind = \"{kind}\" needs {what} (layout tp={} cp={} dp={} pp={} ep={}); change [layout] or use kind = \"megatron\"",
                l.tp, l.cp, l.dp, l.pp, l.ep
            ))
        }
    };
    need(w.moe_layers == 0, "[workload] moe_layers = 0")?;
    need(l.cp == 1 && l.ep == 1, "[layout] cp = 1 and ep = 1")?;
    match w.kind {
        WorkloadKind::Fsdp => {
            need(l.pp == 1, "[layout] pp = 1 (no pipeline)")?;
            need(
                l.dp >= 2,
                "[layout] dp >= 2 (parameters are sharded over dp)",
            )?;
        }
        WorkloadKind::Ddp => {
            need(
                l.tp == 1 && l.pp == 1,
                "[layout] tp = 1 and pp = 1 (dp only)",
            )?;
            need(
                l.dp >= 2,
                "[layout] dp >= 2 (gradients are all-reduced over dp)",
            )?;
            need(w.buckets >= 1, "[workload] buckets >= 1")?;
        }
        WorkloadKind::Decode => {
            need(
                l.dp == 1,
                "[layout] dp = 1 (no data parallel sync; run replicas as separate jobs)",
            )?;
            need(
                l.tp >= 2,
                "[layout] tp >= 2 (each iteration ends with a TP all-gather of the sampled tokens)",
            )?;
        }
        WorkloadKind::Megatron => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        Scenario::parse(text, Path::new("t.toml"), "t")
    }

    #[test]
    fn minimal_scenario_gets_documented_defaults() {
        let s = parse("[layout]\ntp = 2\n").unwrap();
        assert_eq!(s.name, "t");
        assert_eq!(s.layout().world(), 2);
        assert_eq!(s.workload.steps, DEFAULT_STEPS);
        assert_eq!(s.messages.dp, DEFAULT_DP_BYTES);
        assert_eq!(s.compute.forward_ms, DEFAULT_FORWARD_MS);
        assert!(s.workload.named_comms && s.workload.verify);
        assert_eq!(s.workload.comm_init, CommInit::Config);
    }

    #[test]
    fn compute_scale_multiplies_every_compute_time() {
        let mut s =
            parse("[layout]\ntp = 2\n[compute]\nforward_ms = 1.5\nexpert_ms = 0.5\n").unwrap();
        let before = s.compute.clone();
        s.compute.scale(4.0);
        assert_eq!(s.compute.forward_ms, 4.0 * before.forward_ms);
        assert_eq!(s.compute.backward_ms, 4.0 * before.backward_ms);
        assert_eq!(s.compute.expert_ms, 4.0 * before.expert_ms);
        assert_eq!(s.compute.optimizer_ms, 4.0 * before.optimizer_ms);
    }

    #[test]
    fn unknown_keys_are_rejected_by_name() {
        let e = parse("[layout]\ntp = 2\ntpp = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `tpp`"), "{e}");
        let e = parse("[layout]\n[workload]\nstepz = 1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`stepz`"), "{e}");
        let e = parse("bogus = 1\n[layout]\n").unwrap_err().to_string();
        assert!(e.contains("`bogus`"), "{e}");
    }

    #[test]
    fn bad_layouts_and_faults_are_explained() {
        let e = parse("[layout]\ndp = 3\nep = 2\n").unwrap_err().to_string();
        assert!(e.contains("ep=2 must divide dp=3"), "{e}");
        let e = parse("faults = [\"hang:rank=1\"]\n[layout]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad fault spec `hang:rank=1`"), "{e}");
        let e = parse("[layout]\n[workload]\nlayers = 1\nmoe_layers = 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("moe_layers"), "{e}");
    }

    #[test]
    fn orders_and_frontends_are_checked_by_key() {
        let s = parse("[layout]\ntp = 2\norder = \"tp-cp-ep-pp-dp\"\n").unwrap();
        assert_eq!(s.layout().order.to_string(), "tp-cp-ep-pp-dp");
        assert_eq!(parse("[layout]\n").unwrap().layout().order, Order::MEGATRON);
        let e = parse("[layout]\norder = \"tp-dp-pp\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[layout] order") && e.contains("tp-dp-pp"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = parse("[layout]\n[workload]\nfrontend = \"jax\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("frontend = \"jax\"") && e.contains("`torch`"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        let e = parse("[layout]\n[workload]\ntorch_groups = \"fsdp\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("torch_groups") && e.contains("`mesh`"), "{e}");
        let s =
            parse("[layout]\n[workload]\nfrontend = \"torch\"\ntorch_groups = \"mesh\"\n").unwrap();
        assert_eq!(s.workload.frontend, Frontend::Torch);
        assert_eq!(s.workload.torch_groups, TorchGroups::Mesh);
        assert!(
            s.workload.named_comms,
            "allowed; the torch frontend ignores it"
        );
        let e = parse("[layout]\ndp = 4\nep = 2\n[workload]\ntorch_groups = \"mesh\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("torch_groups") && e.contains("ep = 1"), "{e}");
    }

    /// Every key of a full scenario: tables as `[name]`, values as `` `name` `` (as the README writes them).
    fn keys(v: &toml::Value, out: &mut Vec<String>) {
        if let toml::Value::Table(t) = v {
            for (k, v) in t {
                if v.is_table() {
                    out.push(format!("[{k}]"));
                } else {
                    out.push(format!("`{k}`"));
                }
                keys(v, out);
            }
        }
    }

    #[test]
    fn readme_documents_every_key() {
        let s = parse("[layout]\n").unwrap();
        let mut all = Vec::new();
        keys(&toml::Value::try_from(&s).unwrap(), &mut all);
        assert!(all.len() > 25, "{all:?}");
        let readme = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/README.md"),
        )
        .unwrap();
        for k in all {
            assert!(
                readme.contains(&k),
                "tests/scenarios/README.md does not document {k}"
            );
        }
    }

    #[test]
    fn shipped_scenarios_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "toml") {
                Scenario::load(&p).unwrap();
                n += 1;
            }
        }
        assert!(n >= 2, "megatron.toml and moe.toml at least");
    }
}
