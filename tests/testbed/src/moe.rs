//! `[moe]`: the MoE expert-parallel wait counters of issue 21 in the test bed. With a `reporter`,
//! each rank runs CommInsight's Python reporter (`comminsight_moe.diagnose.Diagnose`, staged in
//! `lib/python/`) and, after every `ep` all-to-all, fills its stats the way DeepEP's low-latency
//! kernels or Ascend MC2's `performance_info` do, from the per-peer arrival times the libnccl
//! stand-in measured where the bytes arrived (`ncclTestbedLastRecvTimes`); the `ep` all-to-alls
//! of a step alternate dispatch, combine. `tests/scenarios/README.md` documents the keys.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fault::Fault;
use crate::layout::{Layout, Role};
use crate::scenario::{Frontend, Scenario};

/// Which kernels the rank plays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reporter {
    /// No reporter.
    #[default]
    None,
    /// DeepEP low-latency dispatch / combine: u64 SM cycles at a nominal 1.98 GHz, summed over
    /// `local_experts` samples per peer.
    Deepep,
    /// Ascend MC2: µs in the low 32 bits, one sample per peer.
    Mc2,
}

/// `[moe]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeSpec {
    /// `"none"`, `"deepep"` or `"mc2"`.
    #[serde(default)]
    pub reporter: Reporter,
    /// MC2's hierarchical 2 x 8 layout (8 EP ranks a server): row i keeps only the peers on its
    /// server and the same-index card of each other server (carrying that server's last arrival).
    #[serde(default)]
    pub hierarchical: bool,
    /// Training steps per window (`diagnose_ll_sync(diagnose_step=...)` once a step).
    #[serde(default = "default_diagnose_step")]
    pub diagnose_step: u32,
    /// DeepEP: experts per rank (samples summed per peer and call).
    #[serde(default = "default_local_experts")]
    pub local_experts: u32,
    /// Steps at the start whose counters are zeroed, not reported (the ranks' start-up skew;
    /// DeepXTrace's async mode has its warm-up time for the same reason).
    #[serde(default = "default_warmup_steps")]
    pub warmup_steps: u32,
}

fn default_diagnose_step() -> u32 {
    5
}

fn default_local_experts() -> u32 {
    2
}

fn default_warmup_steps() -> u32 {
    2
}

impl Default for MoeSpec {
    fn default() -> Self {
        MoeSpec {
            reporter: Reporter::None,
            hierarchical: false,
            diagnose_step: default_diagnose_step(),
            local_experts: default_local_experts(),
            warmup_steps: default_warmup_steps(),
        }
    }
}

/// Check `[moe]` against the layout and workload.
pub fn check(s: &Scenario, l: &Layout) -> Result<(), String> {
    let m = &s.moe;
    if m.reporter == Reporter::None {
        return Ok(());
    }
    if l.ep < 2 || s.workload.moe_layers == 0 {
        return Err(format!(
            "[moe] reporter needs EP all-to-alls: [layout] ep >= 2 and [workload] moe_layers >= 1 (ep={}, moe_layers={})",
            l.ep, s.workload.moe_layers
        ));
    }
    if s.workload.frontend != Frontend::Nccl {
        return Err("[moe] reporter needs [workload] frontend = \"nccl\"".into());
    }
    if m.diagnose_step == 0 || m.local_experts == 0 {
        return Err("[moe] diagnose_step and local_experts must be >= 1".into());
    }
    if m.hierarchical && (m.reporter != Reporter::Mc2 || !matches!(l.ep, 16 | 32 | 64)) {
        return Err(format!(
            "[moe] hierarchical needs reporter = \"mc2\" and [layout] ep of 16, 32 or 64 (ep={})",
            l.ep
        ));
    }
    Ok(())
}

/// The plan's `moe` object for `rank` (None without a reporter): the reporter settings, where
/// the Python package is, and the step its `mute` fault silences it from.
pub fn driver_json(
    m: &MoeSpec,
    l: &Layout,
    rank: usize,
    faults: &[Fault],
    lib_dir: &Path,
) -> Option<serde_json::Value> {
    if m.reporter == Reporter::None || l.size(Role::Ep) < 2 {
        return None;
    }
    let mute = faults.iter().find_map(|f| match f {
        Fault::Mute { rank: r, step } if *r == rank => Some(*step),
        _ => None,
    });
    Some(serde_json::json!({
        "reporter": m.reporter,
        "hierarchical": m.hierarchical,
        "diagnose_step": m.diagnose_step,
        "local_experts": m.local_experts,
        "warmup_steps": m.warmup_steps,
        "python_path": lib_dir.join("python"),
        "mute_step": mute,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(extra: &str) -> Scenario {
        let text = format!("[layout]\ndp = 16\nep = 16\n[workload]\nmoe_layers = 1\n{extra}");
        Scenario::parse(&text, Path::new("x.toml"), "x").unwrap()
    }

    #[test]
    fn the_reporter_needs_ep_all_to_alls_and_hierarchical_needs_mc2_on_16_to_64() {
        let s = scenario("[moe]\nreporter = \"mc2\"\nhierarchical = true\n");
        assert_eq!(check(&s, &s.layout()), Ok(()));
        let s = scenario("[moe]\nreporter = \"deepep\"\nhierarchical = true\n");
        assert!(check(&s, &s.layout()).unwrap_err().contains("hierarchical"));
        let s = scenario("[moe]\nreporter = \"deepep\"\n");
        let l = Layout::new(1, 1, 16, 1, 1);
        assert!(check(&s, &l).unwrap_err().contains("ep >= 2"));
        let bad = "[layout]\ndp = 2\n[moe]\nreporter = \"mc2\"\ncolour = 1\n";
        let e = Scenario::parse(bad, Path::new("x.toml"), "x").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn the_plan_carries_the_reporter_and_its_mute_step_to_its_rank_only() {
        let s = scenario("[moe]\nreporter = \"deepep\"\ndiagnose_step = 3\n");
        let l = s.layout();
        let faults = vec!["mute:rank=7,step=4".parse().unwrap()];
        let v = driver_json(&s.moe, &l, 7, &faults, Path::new("/lib")).unwrap();
        assert_eq!(v["reporter"], "deepep");
        assert_eq!(
            (v["diagnose_step"].as_u64(), v["mute_step"].as_u64()),
            (Some(3), Some(4))
        );
        assert_eq!(v["python_path"], "/lib/python");
        let other = driver_json(&s.moe, &l, 6, &faults, Path::new("/lib")).unwrap();
        assert!(other["mute_step"].is_null());
        assert!(driver_json(&MoeSpec::default(), &l, 7, &faults, Path::new("/lib")).is_none());
    }
}
