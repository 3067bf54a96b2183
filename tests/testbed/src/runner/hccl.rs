//! The HCCL frontend (`[workload] frontend = "hccl"`): the ranks run the plan through the libhccl
//! stand-in (`python/hccl_driver.py`) with `LD_PRELOAD=libcomminsight-preload.so` and no NCCL
//! profiler plugin configured (`NCCL_PROFILER_PLUGIN=none`): the shim's HCCL interposition is what
//! records. `--no-plugin` leaves the shim out too (nothing is recorded).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{io, RunConfig, RunError};
use crate::scenario::Frontend;

/// The HCCL frontend of the rank driver.
pub const HCCL_DRIVER: &str = include_str!("../../python/hccl_driver.py");
/// The shim, in the lib dir.
pub const PRELOAD_FILE: &str = "libcomminsight-preload.so";

/// Write `hccl_driver.py` next to `rank_driver.py` (its import finds it there); no PYTHONPATH.
pub fn write_driver(run_dir: &Path) -> Result<Option<PathBuf>, RunError> {
    let p = run_dir.join("hccl_driver.py");
    std::fs::write(&p, HCCL_DRIVER).map_err(io(&p))?;
    Ok(None)
}

/// `"frontend": "hccl"` in the driver's plan.
pub fn mark_plan(cfg: &RunConfig, v: &mut serde_json::Value) {
    if cfg.scenario.workload.frontend == Frontend::Hccl {
        v["frontend"] = "hccl".into();
    }
}

/// The profiler environment of a rank: NCCL frontends get the plugin (`comminsight`, unless set
/// or `--no-plugin`); the HCCL frontend gets the shim (`LD_PRELOAD`, first) and no NCCL plugin.
pub fn plugin_env(cfg: &RunConfig, cmd: &mut Command) {
    if cfg.scenario.workload.frontend == Frontend::Hccl {
        cmd.env("NCCL_PROFILER_PLUGIN", "none");
        if !cfg.no_plugin {
            let mut v = cfg.lib_dir.join(PRELOAD_FILE).into_os_string();
            if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
                v.push(":");
                v.push(old);
            }
            cmd.env("LD_PRELOAD", v);
        }
        return;
    }
    if cfg.no_plugin {
        cmd.env("NCCL_PROFILER_PLUGIN", "none");
    } else if std::env::var_os("NCCL_PROFILER_PLUGIN").is_none() {
        cmd.env("NCCL_PROFILER_PLUGIN", "comminsight");
    }
}
