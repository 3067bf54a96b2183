//! The link token: `[master] token_file`, or one generated for a single host.
//!
//! Every call on the agent link carries a token; there is no unauthenticated mode, loopback
//! included, because any local user can connect to a loopback port. A multi-host job sets
//! `[master] token_file` on every host (the same secret, mode 0600). A single-host job needs no
//! setting: the master generates `<state_dir>/master.token` (32 random bytes, hex, mode 0600,
//! created exclusively) and an agent of the same host with the same `state_dir` (the same
//! daemon, as a job's only host is its own master) reads it.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use comminsight_wire::fsafe;

use super::{LinkError, MasterConfig};

/// Name of the generated token in the state directory.
pub const AUTO_TOKEN_FILE: &str = "master.token";

/// The shared token from `[master] token_file` (trimmed); `None` when no file is configured.
/// A file readable by every user, an unreadable file or an empty token is refused.
pub fn load_token(cfg: &MasterConfig) -> Result<Option<String>, LinkError> {
    let path = &cfg.token_file;
    if path.as_os_str().is_empty() {
        return Ok(None);
    }
    read_token(path).map(Some)
}

fn read_token(path: &Path) -> Result<String, LinkError> {
    let fail = |reason: String| LinkError::TokenFile {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o004 != 0 {
        return Err(LinkError::TokenWorldReadable {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(4096).read_to_string(&mut text))
        .map_err(|e| fail(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(fail("the file is empty".into()));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(fail(
            "the token is not printable ASCII without spaces".into(),
        ));
    }
    Ok(token.to_string())
}

/// Where the generated token of `state_dir` lives.
pub fn auto_token_path(state_dir: &Path) -> PathBuf {
    state_dir.join(AUTO_TOKEN_FILE)
}

/// The token the master checks: `[master] token_file`, else the generated one (created now
/// when missing).
pub fn server_token(cfg: &MasterConfig, state_dir: &Path) -> Result<String, LinkError> {
    if let Some(t) = load_token(cfg)? {
        return Ok(t);
    }
    let path = auto_token_path(state_dir);
    if let Err(e) = create_token(&path) {
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            return Err(LinkError::TokenFile {
                path,
                reason: format!("cannot create the generated token ({e}); set [master] token_file"),
            });
        }
    }
    read_owned_token(&path)
}

/// The token an agent sends: `[master] token_file`, else the generated one of this host's
/// master when it exists (`None`: calls go without a token and are refused, with a line naming
/// `[master] token_file`).
pub fn client_token(cfg: &MasterConfig, state_dir: &Path) -> Result<Option<String>, LinkError> {
    if let Some(t) = load_token(cfg)? {
        return Ok(Some(t));
    }
    let path = auto_token_path(state_dir);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_owned_token(&path).map(Some),
    }
}

/// A generated token: a regular file of this user's, never through a symbolic link, not
/// readable by group or others.
fn read_owned_token(path: &Path) -> Result<String, LinkError> {
    let fail = |reason: String| LinkError::TokenFile {
        path: path.to_path_buf(),
        reason,
    };
    let f = fsafe::open_below(path, 1, fsafe::Owner::Uid(fsafe::euid()))
        .map_err(|e| fail(format!("{e}; remove it and restart the agent")))?;
    let mode = f.metadata().map_err(|e| fail(e.to_string()))?.mode_bits();
    if mode & 0o077 != 0 {
        return Err(fail(format!(
            "mode {mode:o}: readable beyond its owner; remove it and restart the agent"
        )));
    }
    read_token(path)
}

trait ModeBits {
    fn mode_bits(&self) -> u32;
}

impl ModeBits for std::fs::Metadata {
    fn mode_bits(&self) -> u32 {
        self.permissions().mode() & 0o7777
    }
}

/// Create `path` exclusively (0600) holding 32 random bytes in hex.
fn create_token(path: &Path) -> std::io::Result<()> {
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let dir = fsafe::Dir::open(path.parent().unwrap_or(Path::new(".")))
        .map_err(crate::util::fs::to_io)?;
    let name = path.file_name().unwrap_or_default();
    let mut f = match dir.create_excl(name, 0o600) {
        Ok(f) => f,
        Err(fsafe::OpenError::Io { source, .. }) => return Err(source),
        Err(e) => return Err(crate::util::fs::to_io(e)),
    };
    f.write_all(format!("{hex}\n").as_bytes())?;
    f.sync_all()
}

/// What `run` checks of the link before it starts, and `config check` with it: the token file
/// (or the generated one's state) and the TLS files, for the serving side and the agent side.
pub fn preflight(m: &MasterConfig, state_dir: &Path) -> Result<(), LinkError> {
    if !m.listen.is_empty() {
        load_token(m)?;
        let auto = auto_token_path(state_dir);
        if m.token_file.as_os_str().is_empty() && auto.exists() {
            read_owned_token(&auto)?;
        }
        super::read_tls(&m.tls_cert, "tls_cert")?;
        super::read_tls(&m.tls_key, "tls_key")?;
        if m.tls_cert.as_os_str().is_empty() != m.tls_key.as_os_str().is_empty() {
            return Err(LinkError::Tls {
                reason: "only one of tls_cert and tls_key is set; set both (or neither)".into(),
            });
        }
    }
    if !m.address.is_empty() {
        client_token(m, state_dir)?;
        super::read_tls(&m.tls_ca, "tls_ca")?;
    }
    Ok(())
}
