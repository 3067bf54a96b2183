//! `[gpu] library` names code the root agent runs. It is loaded only when no one but root (or
//! the agent's own user) can have written it or can swap it: the file, after resolving every
//! symbolic link, is a regular file owned by root (or the agent's user) that group and others
//! cannot write, and so is each directory above it — or the directory is sticky (like `/tmp`),
//! where no one may rename or remove another user's entry. The resolved path is what is loaded,
//! so a job user's library never runs as root (SECURITY.md rule 9), and no check-then-load race
//! is open to them. The default, `libnvidia-ml.so.1` found by the dynamic loader in the system's
//! directories, is the loader's business.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What to do about a refused library.
const FIX: &str = "it is code the agent runs: install it, and the directories above it, owned by \
                   root and writable by root only, or leave [gpu] library empty for the driver's \
                   libnvidia-ml.so.1";

/// The path to load for `path` (every link resolved), or one line naming the path and the fix.
pub fn trusted_path(path: &Path) -> Result<PathBuf, String> {
    trusted_path_as(path, comminsight_wire::fsafe::euid())
}

/// [`trusted_path`] for an agent running as `euid`.
pub fn trusted_path_as(path: &Path, euid: u32) -> Result<PathBuf, String> {
    let shown = path.display();
    let real = std::fs::canonicalize(path).map_err(|e| {
        format!("cannot load {shown} ({e}): no NVIDIA driver here, or set [gpu] library")
    })?;
    let refuse = |what: String| format!("refused {shown} ([gpu] library): {what}; {FIX}");
    let meta = std::fs::metadata(&real)
        .map_err(|e| format!("cannot load {shown} ({e}): check [gpu] library"))?;
    if !meta.file_type().is_file() {
        return Err(refuse("not a regular file".into()));
    }
    // Who may have written `m` (the file, or a directory above it: `what`), if anyone else.
    let unsafe_owner = |what: &str, m: &std::fs::Metadata, sticky_ok: bool| -> Option<String> {
        if m.uid() != 0 && m.uid() != euid {
            return Some(format!("{what} is owned by uid {}, not root", m.uid()));
        }
        let sticky = sticky_ok && m.mode() & 0o1000 != 0;
        (m.mode() & 0o022 != 0 && !sticky).then(|| {
            format!(
                "{what} is writable by group or others (mode {:04o})",
                m.mode() & 0o7777
            )
        })
    };
    if let Some(why) = unsafe_owner("it", &meta, false) {
        return Err(refuse(why));
    }
    for dir in real.ancestors().skip(1) {
        let m = std::fs::metadata(dir)
            .map_err(|e| format!("cannot load {shown} ({}: {e})", dir.display()))?;
        if let Some(why) = unsafe_owner(&format!("its directory {}", dir.display()), &m, true) {
            return Err(refuse(why));
        }
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_library_someone_else_owns_or_may_write_or_swap_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("ci-nvml-trust-{}", std::process::id()));
        let lib_dir = dir.join("lib");
        std::fs::create_dir_all(&lib_dir).unwrap();
        mode(&dir, 0o755);
        mode(&lib_dir, 0o755);
        let lib = lib_dir.join("libnvidia-ml.so.1");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        mode(&lib, 0o755);
        let me = comminsight_wire::fsafe::euid();
        let owner = std::fs::metadata(&lib).unwrap().uid();
        // Ours (or root's), 0755 all the way up (the temporary directory is sticky): loaded by
        // its resolved path, also through a link.
        let real = std::fs::canonicalize(&lib).unwrap();
        assert_eq!(trusted_path_as(&lib, owner).unwrap(), real);
        let link = dir.join("link.so");
        std::os::unix::fs::symlink(&lib, &link).unwrap();
        assert_eq!(trusted_path_as(&link, owner).unwrap(), real);
        // A file neither root nor the agent's user owns (a job user's, as root runs CI; else an
        // agent of another user), then a directory above it.
        let foreign = |p: &Path| {
            if me == 0 {
                std::os::unix::fs::chown(p, Some(4242), None).unwrap();
                let e = trusted_path_as(&lib, 0).unwrap_err();
                std::os::unix::fs::chown(p, Some(0), None).unwrap();
                e
            } else {
                trusted_path_as(&lib, owner + 1).unwrap_err()
            }
        };
        let e = foreign(&lib);
        assert!(
            e.contains(&lib.display().to_string()) && e.contains("not root"),
            "{e}"
        );
        let e = foreign(&lib_dir);
        assert!(e.contains("its directory") && e.contains("not root"), "{e}");
        // Writable by the group: the file, then its directory (not sticky).
        mode(&lib, 0o775);
        let e = trusted_path_as(&lib, me).unwrap_err();
        assert!(
            e.contains("mode 0775") && e.contains("[gpu] library"),
            "{e}"
        );
        mode(&lib, 0o755);
        mode(&lib_dir, 0o777);
        let e = trusted_path_as(&lib, me).unwrap_err();
        assert!(
            e.contains("its directory") && e.contains("mode 0777"),
            "{e}"
        );
        mode(&lib_dir, 0o1777);
        assert!(
            trusted_path_as(&lib, me).is_ok(),
            "a sticky directory is fine"
        );
        mode(&lib_dir, 0o755);
        // Not a file; absent.
        let e = trusted_path_as(&lib_dir, me).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = trusted_path_as(&dir.join("absent.so"), me).unwrap_err();
        assert!(e.starts_with("cannot load"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
