//! `[gpu] library` names code the root agent runs. It is loaded only when `fstat` of the opened
//! file says it is a regular file owned by root (or by the agent's own user) that nobody else
//! may write, and it is loaded through that open descriptor (`/proc/self/fd/N`), so the file
//! checked is the file loaded: a library a job user owns, or can rewrite, or swaps in after the
//! check, never runs as root (SECURITY.md rule 9). The default, `libnvidia-ml.so.1` found by the
//! dynamic loader in the system's directories, is the loader's business.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// An opened, checked library file: [`TrustedLibrary::load_path`] names this very file while the
/// value lives.
#[derive(Debug)]
pub struct TrustedLibrary {
    _file: File,
    load_path: PathBuf,
}

impl TrustedLibrary {
    /// What to hand `dlopen`.
    pub fn load_path(&self) -> &Path {
        &self.load_path
    }
}

/// Open `path` and check its owner and mode; one line naming the path and the fix when not.
pub fn open_trusted(path: &Path) -> Result<TrustedLibrary, String> {
    open_trusted_as(path, comminsight_wire::fsafe::euid())
}

/// [`open_trusted`] for an agent running as `euid`.
pub fn open_trusted_as(path: &Path, euid: u32) -> Result<TrustedLibrary, String> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| format!("cannot open {shown} ([gpu] library): {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat {shown} ([gpu] library): {e}"))?;
    let fix = "it is code the agent runs: install it owned by root and writable by root only, \
               or leave [gpu] library empty for the driver's libnvidia-ml.so.1";
    if !meta.file_type().is_file() {
        return Err(format!(
            "refused {shown} ([gpu] library): not a regular file; {fix}"
        ));
    }
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(format!(
            "refused {shown} ([gpu] library): owned by uid {}, not root; {fix}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "refused {shown} ([gpu] library): writable by group or others (mode {:04o}); {fix}",
            meta.mode() & 0o7777
        ));
    }
    let load_path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    Ok(TrustedLibrary {
        _file: file,
        load_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_library_someone_else_owns_or_may_write_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("ci-nvml-trust-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libnvidia-ml.so.1");
        std::fs::write(&lib, b"\x7fELF").unwrap();
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
        let me = comminsight_wire::fsafe::euid();
        let owner = std::fs::metadata(&lib).unwrap().uid();
        // Ours (or root's), 0755: loaded through its descriptor.
        let t = open_trusted_as(&lib, owner).unwrap();
        assert!(t.load_path().starts_with("/proc/self/fd/"));
        assert_eq!(
            std::fs::read(t.load_path()).unwrap(),
            b"\x7fELF",
            "the descriptor is the file"
        );
        // A file neither root nor the agent's user owns (a job user's, as root runs CI; else an
        // agent of another user).
        let e = if me == 0 {
            std::os::unix::fs::chown(&lib, Some(4242), None).unwrap();
            let e = open_trusted_as(&lib, 0).unwrap_err();
            std::os::unix::fs::chown(&lib, Some(0), None).unwrap();
            e
        } else {
            open_trusted_as(&lib, owner + 1).unwrap_err()
        };
        assert!(
            e.contains(&lib.display().to_string()) && e.contains("not root"),
            "{e}"
        );
        // Writable by the group.
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o775)).unwrap();
        let e = open_trusted_as(&lib, me).unwrap_err();
        assert!(
            e.contains("mode 0775") && e.contains("[gpu] library"),
            "{e}"
        );
        // Not a file.
        let e = open_trusted_as(&dir, me).unwrap_err();
        assert!(e.contains("not a regular file"), "{e}");
        let e = open_trusted_as(&dir.join("absent.so"), me).unwrap_err();
        assert!(e.starts_with("cannot open"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
