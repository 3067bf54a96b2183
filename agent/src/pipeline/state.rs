//! The agent's resumable state: every stream cursor's position and the engine's state at the
//! same instant, written atomically (tmp, fsync, rename). A restarted agent continues from it
//! without losing or double-counting records.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::Engine;
use crate::sources::CursorCheckpoint;
use crate::stream::StreamId;

/// Format version of `checkpoint.json`.
pub const STATE_VERSION: u32 = 1;

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: cannot read the agent checkpoint: {source}; check the permissions of [agent] state_dir")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: corrupt agent checkpoint ({message}); delete it to re-read every segment still on disk (the archive skips what it already has)")]
    Corrupt { path: PathBuf, message: String },
    #[error("{path}: cannot write the agent checkpoint: {source}; check free space and permissions of [agent] state_dir")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Everything a restarted agent needs to continue exactly where the checkpoint was taken.
#[derive(Debug, Serialize, Deserialize)]
pub struct AgentState {
    pub version: u32,
    pub cursors: Vec<(StreamId, CursorCheckpoint)>,
    /// The engine (named `processor` in the file since the first version).
    pub processor: Engine,
}

/// `<state_dir>/checkpoint.json`.
pub fn state_path(state_dir: &Path) -> PathBuf {
    state_dir.join("checkpoint.json")
}

/// Load the state, `Ok(None)` when there is none yet.
pub fn load(state_dir: &Path) -> Result<Option<AgentState>, StateError> {
    let path = state_path(state_dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(StateError::Read { path, source }),
    };
    let st: AgentState = serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if st.version != STATE_VERSION {
        return Err(StateError::Corrupt {
            path,
            message: format!("version {} (this agent writes {STATE_VERSION})", st.version),
        });
    }
    Ok(Some(st))
}

#[derive(Serialize)]
struct StateRef<'a> {
    version: u32,
    cursors: &'a [(StreamId, CursorCheckpoint)],
    processor: &'a Engine,
}

/// Write the state atomically.
pub fn save(
    state_dir: &Path,
    cursors: &[(StreamId, CursorCheckpoint)],
    processor: &Engine,
) -> Result<(), StateError> {
    let st = StateRef {
        version: STATE_VERSION,
        cursors,
        processor,
    };
    let path = state_path(state_dir);
    let werr = |source| StateError::Write {
        path: path.clone(),
        source,
    };
    crate::util::fs::write_atomic_stream(&path, &mut |w| {
        serde_json::to_writer(w, &st).map_err(std::io::Error::other)
    })
    .map_err(werr)
}

/// The state directory's lock file.
pub const LOCK_FILE: &str = "agent.lock";

/// Hold `<state_dir>/agent.lock` (an exclusive `flock`) for as long as the returned file lives;
/// a second daemon on the same state directory gets one line naming the holder and the fix.
/// The file is created 0600, opened without following a link, and must be a regular file owned
/// by this user (a file planted by someone else is refused, not trusted).
pub fn lock(state_dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::io::{Read, Seek};
    let path = state_dir.join(LOCK_FILE);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("{}: cannot open the state lock ({e}); set agent.state_dir to a directory the agent owns", path.display()))?;
    check_lock_file(&f, &path)?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = f.read_to_string(&mut holder);
            let who = match holder.trim().parse::<u32>() {
                Ok(pid) => format!("another comminsight-agent (pid {pid})"),
                Err(_) => "another comminsight-agent".to_string(),
            };
            anyhow::bail!(
                "{who} holds {}; stop it or set agent.state_dir to another directory",
                path.display()
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            anyhow::bail!("{}: cannot lock the state directory ({e}); set agent.state_dir to a directory on a local file system", path.display())
        }
    }
    f.set_len(0)?;
    f.rewind()?;
    write!(f, "{}", std::process::id())?;
    f.sync_all()?;
    Ok(f)
}

/// The open lock file is a regular file owned by this user.
fn check_lock_file(f: &std::fs::File, path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = f
        .metadata()
        .map_err(|e| anyhow::anyhow!("{}: cannot stat the state lock ({e})", path.display()))?;
    let me = crate::util::fs::euid();
    if !meta.file_type().is_file() || meta.uid() != me {
        anyhow::bail!(
            "{}: not a regular file owned by uid {me} (uid {}); remove it, or set agent.state_dir to a directory the agent owns",
            path.display(),
            meta.uid()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Builtins;
    use comminsight_wire::record::{Body, CommInit, OpRecord, ProcStart, Record, Stats};

    fn raw(seq: u64, body: Body) -> comminsight_wire::RawRecord {
        let mut r = Record::new(body).encode();
        r.set_seq(seq);
        r
    }

    #[test]
    fn the_state_lock_is_exclusive_private_and_refuses_links() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("ci-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let held = lock(&dir).unwrap();
        let meta = std::fs::metadata(dir.join(LOCK_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // flock is per open file: a second open in this process is refused like another daemon.
        let e = lock(&dir).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "another comminsight-agent (pid {}) holds {}; stop it or set agent.state_dir to another directory",
                std::process::id(),
                dir.join(LOCK_FILE).display()
            )
        );
        drop(held);
        lock(&dir).expect("free again once the holder closed it");
        // A link planted in place of the lock file is not followed.
        let other = dir.join("elsewhere");
        std::fs::write(&other, b"").unwrap();
        std::fs::remove_file(dir.join(LOCK_FILE)).unwrap();
        std::os::unix::fs::symlink(&other, dir.join(LOCK_FILE)).unwrap();
        let e = lock(&dir).unwrap_err().to_string();
        assert!(e.contains("agent.lock") && e.contains("state_dir"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_round_trips_and_continues_identically() {
        let dir = std::env::temp_dir().join(format!("ci-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let id = StreamId::new("j", "h", "1");
        let ops: Vec<_> = (0..10u64)
            .map(|i| {
                raw(
                    3 + i,
                    Body::Coll(OpRecord {
                        comm_hash: 9,
                        coll_sn: i,
                        bytes: 1 << 20,
                        count: 1 << 18,
                        start_ns: 1_000_000 + i * 1000,
                        end_ns: 1_000_500 + i * 1000,
                        ..Default::default()
                    }),
                )
            })
            .collect();
        let head = vec![
            raw(
                0,
                Body::ProcStart(ProcStart {
                    mono_ns: 5,
                    real_ns: 10,
                    ..Default::default()
                }),
            ),
            raw(
                1,
                Body::CommInit(CommInit {
                    comm_hash: 9,
                    nranks: 4,
                    comm_name: "tp".into(),
                    ..Default::default()
                }),
            ),
            raw(
                2,
                Body::Stats(Stats {
                    mono_ns: 50,
                    real_ns: 56,
                    ..Default::default()
                }),
            ),
        ];
        let apply = |e: &mut Engine, recs: &[comminsight_wire::RawRecord]| {
            e.apply(&id, recs, None, &mut [], &mut Vec::new());
        };
        // One engine sees everything; another is checkpointed halfway and restored.
        let mut whole = Engine::new(Builtins::daemon(100));
        apply(&mut whole, &head);
        apply(&mut whole, &ops);
        let mut first = Engine::new(Builtins::daemon(100));
        apply(&mut first, &head);
        apply(&mut first, &ops[..4]);
        let cursors = vec![(id.clone(), CursorCheckpoint::default())];
        save(&dir, &cursors, &first).unwrap();
        let mut restored = load(&dir).unwrap().expect("a state");
        assert_eq!(restored.cursors.len(), 1);
        apply(&mut restored.processor, &ops[4..]);
        assert_eq!(restored.processor.snapshot(), whole.snapshot());
        assert_eq!(
            restored.processor.alignment(&id, None),
            whole.alignment(&id, None)
        );
        // A corrupt file is a clear error naming it and the fix.
        std::fs::write(state_path(&dir), b"{not json").unwrap();
        let e = load(&dir).unwrap_err().to_string();
        assert!(
            e.contains("checkpoint.json") && e.contains("delete it"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
