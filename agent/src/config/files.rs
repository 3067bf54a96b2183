//! Which files make the configuration, and reading them safely: the main file (`--config`, else
//! `$COMMINSIGHT_CONFIG`, else [`DEFAULT_PATH`]), then the drop-ins `<its dir>/conf.d/*.toml` in
//! lexical order, each merged table by table over what came before ([`merge`]). Every file is
//! opened without blocking (a FIFO cannot hang the agent) and fstat-checked ([`read_checked`]).

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::{ConfigError, DEFAULT_PATH};

/// The variable naming the main file when `--config` is absent.
pub const CONFIG_ENV: &str = "COMMINSIGHT_CONFIG";
/// The drop-in directory beside the main file.
pub const DROP_IN_DIR: &str = "conf.d";
/// Largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

/// The main file and whether it was named (a named file must exist; the default may be absent).
pub fn main_file(path: Option<&Path>, env: &[(String, String)]) -> (PathBuf, bool) {
    if let Some(p) = path {
        return (p.to_path_buf(), true);
    }
    match env.iter().find(|(k, v)| k == CONFIG_ENV && !v.is_empty()) {
        Some((_, v)) => (PathBuf::from(v), true),
        None => (PathBuf::from(DEFAULT_PATH), false),
    }
}

/// `<dir of main>/conf.d/*.toml`, sorted by name (bytes); hidden files are skipped. No
/// directory: none.
pub fn drop_ins(main: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = main
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(DROP_IN_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(ConfigError::Read { path: dir, source }),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(|source| ConfigError::Read {
            path: dir.clone(),
            source,
        })?;
        let name = e.file_name();
        let n = name.to_string_lossy();
        if !n.starts_with('.') && n.ends_with(".toml") {
            out.push(e.path());
        }
    }
    out.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(out)
}

/// Read a configuration file: opened non-blocking and without a controlling terminal, then
/// checked on the open file: a regular file of at most [`MAX_CONFIG_BYTES`], owned by root or
/// this user, not writable by every user (the agent runs as root and trusts its settings).
pub fn read_checked(path: &Path) -> Result<String, ConfigError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let meta = f.metadata().map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let is_file = meta.file_type().is_file();
    let me = crate::util::fs::euid();
    if let Some(why) = refusal(is_file, meta.len(), meta.uid(), meta.mode(), me) {
        return Err(ConfigError::Refused {
            path: path.to_path_buf(),
            why,
        });
    }
    let mut text = String::new();
    f.take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text)
        .map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(text)
}

/// Why a configuration file with this type, size, owner and mode is not used (with the fix),
/// if it is not; `me`: the agent's effective uid.
fn refusal(is_file: bool, len: u64, uid: u32, mode: u32, me: u32) -> Option<String> {
    if !is_file {
        return Some("not a regular file; point the agent at a TOML file".into());
    }
    if len > MAX_CONFIG_BYTES {
        return Some(format!(
            "{len} bytes, more than a configuration file may have ({MAX_CONFIG_BYTES}); shorten it"
        ));
    }
    if uid != 0 && uid != me {
        return Some(format!(
            "owned by uid {uid}, not by root or the agent's user (uid {me}); chown it"
        ));
    }
    if mode & 0o002 != 0 {
        return Some("writable by every user; chmod o-w it".into());
    }
    None
}

/// Merge `over` into `base`: tables key by key (recursively), every other value (lists
/// included) replaced whole.
pub fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ci-cfgfiles-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn merge_is_table_wise_and_replaces_lists() {
        let mut base: toml::Table = "[a]\nx = 1\ny = [1, 2]\n[a.deep]\np = 1\nq = 2\n[b]\nz = 3\n"
            .parse()
            .unwrap();
        let over: toml::Table = "[a]\ny = [9]\n[a.deep]\nq = 7\n[c]\nw = 4\n"
            .parse()
            .unwrap();
        merge(&mut base, over);
        let want: toml::Table =
            "[a]\nx = 1\ny = [9]\n[a.deep]\np = 1\nq = 7\n[b]\nz = 3\n[c]\nw = 4\n"
                .parse()
                .unwrap();
        assert_eq!(base, want);
    }

    #[test]
    fn drop_ins_are_the_toml_files_in_lexical_order() {
        let d = tmp("order");
        let conf = d.join(DROP_IN_DIR);
        std::fs::create_dir_all(&conf).unwrap();
        for n in [
            "20-b.toml",
            "10-a.toml",
            "README",
            ".hidden.toml",
            "9-z.toml",
        ] {
            std::fs::write(conf.join(n), "").unwrap();
        }
        let names: Vec<String> = drop_ins(&d.join("agent.toml"))
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["10-a.toml", "20-b.toml", "9-z.toml"]);
        assert!(drop_ins(&d.join("nodir").join("agent.toml"))
            .unwrap()
            .is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_env_names_the_main_file_unless_the_option_does() {
        let env = vec![(CONFIG_ENV.to_string(), "/e/agent.toml".to_string())];
        assert_eq!(
            main_file(None, &env),
            (PathBuf::from("/e/agent.toml"), true)
        );
        assert_eq!(
            main_file(Some(Path::new("/o.toml")), &env),
            (PathBuf::from("/o.toml"), true)
        );
        assert_eq!(main_file(None, &[]), (PathBuf::from(DEFAULT_PATH), false));
    }

    #[test]
    fn unsafe_files_are_refused_with_the_fix() {
        let d = tmp("unsafe");
        let f = d.join("a.toml");
        std::fs::write(&f, "[log]\n").unwrap();
        assert_eq!(read_checked(&f).unwrap(), "[log]\n");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_checked(&f).unwrap_err().to_string();
        assert!(
            e.starts_with(&f.display().to_string()) && e.contains("chmod o-w"),
            "{e}"
        );
        // A FIFO neither blocks nor is read.
        let fifo = d.join("fifo.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_checked(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Owners: root or the agent's user.
        assert!(refusal(true, 10, 1234, 0o644, 0).is_some_and(|w| w.contains("chown")));
        assert!(refusal(true, 10, 1234, 0o644, 1000).is_some_and(|w| w.contains("uid 1234")));
        assert_eq!(refusal(true, 10, 0, 0o644, 1000), None);
        assert_eq!(refusal(true, 10, 1000, 0o640, 1000), None);
        assert!(refusal(true, MAX_CONFIG_BYTES + 1, 0, 0o644, 0).is_some());
        let _ = std::fs::remove_dir_all(&d);
    }
}
