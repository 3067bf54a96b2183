//! What the constructor does to the environment (decided here, applied by [`crate::ffi`]).
//!
//! * `COMMINSIGHT_DISABLE=1`: nothing at all (the shim only forwards).
//! * `NCCL_PROFILER_PLUGIN`, when unset and the plugin is installed: `comminsight` when the loader
//!   finds `libnccl-profiler-comminsight.so` on its path, else the absolute path of the plugin next
//!   to this library.
//! * `PYTHONPATH`: `<dir of this library>/python` prepended when it holds `sitecustomize.py`,
//!   unless `COMMINSIGHT_INJECT=0`.
//! * `COMMINSIGHT_COMM_ROLE`: parsed; an unknown value gives one warning and is ignored.

use std::path::Path;

use comminsight_wire::roles::Role;

/// The plugin's file name (what `NCCL_PROFILER_PLUGIN=comminsight` resolves to).
pub const PLUGIN_FILE: &str = "libnccl-profiler-comminsight.so";

/// Environment changes and settings decided at load.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EnvPlan {
    /// The shim only forwards (`COMMINSIGHT_DISABLE=1`).
    pub disabled: bool,
    /// New value of `NCCL_PROFILER_PLUGIN`, if it is to be set.
    pub profiler_plugin: Option<String>,
    /// New value of `PYTHONPATH`, if it is to change.
    pub pythonpath: Option<String>,
    /// `COMMINSIGHT_COMM_ROLE`, when set to a known role.
    pub env_role: Option<Role>,
    /// Warnings for NCCL's log.
    pub warnings: Vec<String>,
}

/// Decide the constructor's actions. `get` reads the environment, `self_dir` is the directory of
/// this library (None: unknown), `plugin_on_loader_path` tells whether `dlopen` finds the plugin by
/// its bare file name; `exists` tests a path.
pub fn plan(
    get: impl Fn(&str) -> Option<String>,
    self_dir: Option<&Path>,
    plugin_on_loader_path: impl FnOnce() -> bool,
    exists: impl Fn(&Path) -> bool,
) -> EnvPlan {
    if get("COMMINSIGHT_DISABLE").as_deref().map(str::trim) == Some("1") {
        return EnvPlan {
            disabled: true,
            ..EnvPlan::default()
        };
    }
    let mut p = EnvPlan::default();
    if get("NCCL_PROFILER_PLUGIN").is_none() {
        if plugin_on_loader_path() {
            p.profiler_plugin = Some("comminsight".into());
        } else if let Some(d) = self_dir {
            let f = d.join(PLUGIN_FILE);
            if exists(&f) {
                p.profiler_plugin = Some(f.to_string_lossy().into_owned());
            }
        }
    }
    if get("COMMINSIGHT_INJECT").as_deref().map(str::trim) != Some("0") {
        if let Some(d) = self_dir {
            let py = d.join("python");
            if exists(&py.join("sitecustomize.py")) {
                let py = py.to_string_lossy().into_owned();
                let old = get("PYTHONPATH").unwrap_or_default();
                if !old.split(':').any(|e| e == py) {
                    p.pythonpath = Some(if old.is_empty() {
                        py
                    } else {
                        format!("{py}:{old}")
                    });
                }
            }
        }
    }
    if let Some(v) = get("COMMINSIGHT_COMM_ROLE").filter(|v| !v.trim().is_empty()) {
        match v.parse::<Role>() {
            Ok(r) => p.env_role = Some(r),
            Err(e) => p.warnings.push(format!(
                "COMMINSIGHT_COMM_ROLE: {e}; the variable is ignored"
            )),
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::PathBuf;

    fn run(env: &[(&str, &str)], on_path: bool, files: &[&str]) -> EnvPlan {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let files: Vec<PathBuf> = files.iter().map(PathBuf::from).collect();
        plan(
            |k| env.get(k).cloned(),
            Some(Path::new("/opt/ci/lib")),
            || on_path,
            |p| files.iter().any(|f| f == p),
        )
    }

    #[test]
    fn profiler_plugin_rules() {
        assert_eq!(
            run(&[], true, &[]).profiler_plugin.as_deref(),
            Some("comminsight")
        );
        assert_eq!(
            run(&[], false, &["/opt/ci/lib/libnccl-profiler-comminsight.so"])
                .profiler_plugin
                .as_deref(),
            Some("/opt/ci/lib/libnccl-profiler-comminsight.so")
        );
        assert_eq!(run(&[], false, &[]).profiler_plugin, None);
        assert_eq!(
            run(&[("NCCL_PROFILER_PLUGIN", "other")], true, &[]).profiler_plugin,
            None
        );
    }

    #[test]
    fn pythonpath_rules() {
        let sc = "/opt/ci/lib/python/sitecustomize.py";
        assert_eq!(
            run(&[], false, &[sc]).pythonpath.as_deref(),
            Some("/opt/ci/lib/python")
        );
        assert_eq!(
            run(&[("PYTHONPATH", "/a:/b")], false, &[sc])
                .pythonpath
                .as_deref(),
            Some("/opt/ci/lib/python:/a:/b")
        );
        assert_eq!(
            run(&[("PYTHONPATH", "/opt/ci/lib/python")], false, &[sc]).pythonpath,
            None
        );
        assert_eq!(
            run(&[("COMMINSIGHT_INJECT", "0")], false, &[sc]).pythonpath,
            None
        );
        assert_eq!(run(&[], false, &[]).pythonpath, None);
    }

    #[test]
    fn role_and_disable() {
        assert_eq!(
            run(&[("COMMINSIGHT_COMM_ROLE", "TP")], false, &[]).env_role,
            Some(Role::Tp)
        );
        let p = run(&[("COMMINSIGHT_COMM_ROLE", "zz")], false, &[]);
        assert_eq!(p.env_role, None);
        assert_eq!(p.warnings.len(), 1);
        assert!(p.warnings[0].contains("COMMINSIGHT_COMM_ROLE") && p.warnings[0].contains("zz"));
        let d = run(
            &[
                ("COMMINSIGHT_DISABLE", "1"),
                ("COMMINSIGHT_COMM_ROLE", "zz"),
            ],
            true,
            &["/opt/ci/lib/python/sitecustomize.py"],
        );
        assert_eq!(
            d,
            EnvPlan {
                disabled: true,
                ..EnvPlan::default()
            }
        );
    }
}
