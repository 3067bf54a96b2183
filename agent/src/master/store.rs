//! The master's durable store of what agents pushed, under `<state_dir>/master/`:
//!
//! * `<job>/hang/<host>.json`: the latest hang snapshot of each host (replaced atomically);
//! * `<job>/steps/<host>.jsonl`: step summaries, appended;
//! * `<job>/<kind>/<host>.seq`: `"<seq> <len>"`, the highest stored sequence number of that
//!   sender (a resend at or below it is acknowledged, not stored again) and, for `steps`, the
//!   file's length after it (a crash between an append and this mark is cut back on the next
//!   append, so every message is stored exactly once).
//!
//! Everything is synced before `Push` is answered OK; a restarted master reloads from disk.

use std::collections::{BTreeMap, HashMap};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::SystemTime;

use super::proto::{name_problem, PushRequest, KINDS};
use super::{disk, sync_dir, write_atomic, LinkError};

/// Called after a message was newly stored, with the message (not for resends).
pub type OnPush = Box<dyn Fn(&PushRequest) + Send + Sync>;

#[derive(Clone, Copy, Default)]
struct Mark {
    seq: u64,
    len: u64,
}

/// The master's store; share it as `Arc<MasterStore>`.
pub struct MasterStore {
    dir: PathBuf,
    marks: Mutex<HashMap<(String, String, String), Mark>>,
    last_seen: Mutex<BTreeMap<String, SystemTime>>,
    on_push: RwLock<Option<OnPush>>,
}

impl std::fmt::Debug for MasterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterStore")
            .field("dir", &self.dir)
            .finish()
    }
}

impl MasterStore {
    /// Open (create) the store in `dir`; what earlier runs stored is there.
    pub fn open(dir: &Path) -> Result<MasterStore, LinkError> {
        std::fs::create_dir_all(dir).map_err(|e| disk(dir, "the master's store", e))?;
        Ok(MasterStore {
            dir: dir.to_path_buf(),
            marks: Mutex::new(HashMap::new()),
            last_seen: Mutex::new(BTreeMap::new()),
            on_push: RwLock::new(None),
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Set the hook called after each newly stored message (replaces the previous one).
    pub fn set_on_push(&self, hook: OnPush) {
        *self.on_push.write().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// Note a call from `host` now.
    pub fn seen(&self, host: &str) {
        if host.is_empty() {
            return;
        }
        let mut m = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() < 65_536 || m.contains_key(host) {
            m.insert(host.to_string(), SystemTime::now());
        }
    }

    /// When each host last called (this master's run only).
    pub fn last_seen(&self) -> BTreeMap<String, SystemTime> {
        self.last_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Store `msg` durably. `Ok(true)`: stored; `Ok(false)`: a resend of a stored message.
    /// A bad kind, job, host or seq is [`LinkError::BadMessage`]; a disk error is
    /// [`LinkError::Disk`].
    pub fn store(&self, msg: &PushRequest) -> Result<bool, LinkError> {
        let bad = |reason: String| LinkError::BadMessage {
            kind: msg.kind.clone(),
            job: msg.job.clone(),
            reason,
        };
        if !KINDS.contains(&msg.kind.as_str()) {
            return Err(bad(format!("unknown kind (known: {})", KINDS.join(", "))));
        }
        if let Some(p) = name_problem(&msg.job) {
            return Err(bad(format!("the job name {p}")));
        }
        if let Some(p) = name_problem(&msg.host) {
            return Err(bad(format!("the host name {:?} {p}", msg.host)));
        }
        if msg.seq == 0 {
            return Err(bad("seq must be >= 1".into()));
        }
        {
            let mut marks = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            let key = (msg.job.clone(), msg.host.clone(), msg.kind.clone());
            let kind_dir = self.dir.join(&msg.job).join(&msg.kind);
            let seq_path = kind_dir.join(format!("{}.seq", msg.host));
            let mark = match marks.get(&key) {
                Some(m) => *m,
                None => read_mark(&seq_path),
            };
            if msg.seq <= mark.seq {
                marks.insert(key, mark);
                return Ok(false);
            }
            if !kind_dir.is_dir() {
                std::fs::create_dir_all(&kind_dir)
                    .map_err(|e| disk(&kind_dir, "the master's store", e))?;
                let _ = sync_dir(&self.dir);
                let _ = sync_dir(&self.dir.join(&msg.job));
            }
            let len = if msg.kind == "hang" {
                let path = kind_dir.join(format!("{}.json", msg.host));
                write_atomic(&path, &msg.payload).map_err(|e| disk(&path, "a hang snapshot", e))?;
                0
            } else {
                let path = kind_dir.join(format!("{}.jsonl", msg.host));
                append_at(&path, mark.len, &msg.payload)
                    .map_err(|e| disk(&path, "step summaries", e))?
            };
            let next = Mark { seq: msg.seq, len };
            write_atomic(&seq_path, format!("{} {}\n", next.seq, next.len).as_bytes())
                .map_err(|e| disk(&seq_path, "the master's store", e))?;
            marks.insert(key, next);
        }
        if let Some(hook) = &*self.on_push.read().unwrap_or_else(|p| p.into_inner()) {
            hook(msg);
        }
        Ok(true)
    }

    /// The jobs with anything stored, sorted.
    pub fn jobs(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| name_problem(n).is_none())
            .collect();
        out.sort();
        out
    }

    /// Every host that stored anything of `job` (any kind, this run or an earlier one), sorted.
    pub fn hosts(&self, job: &str) -> Vec<String> {
        if name_problem(job).is_some() {
            return Vec::new();
        }
        let mut out: Vec<String> = KINDS
            .iter()
            .flat_map(|k| {
                std::fs::read_dir(self.dir.join(job).join(k))
                    .into_iter()
                    .flatten()
            })
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter_map(|n| n.strip_suffix(".seq").map(str::to_string))
            .filter(|h| name_problem(h).is_none())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The latest hang snapshot of each host of `job`: `(host, payload)`, sorted by host.
    pub fn hang_snapshots(&self, job: &str) -> Vec<(String, Vec<u8>)> {
        self.per_host(job, "hang", ".json")
    }

    /// The step summaries (JSON lines) each host of `job` sent: `(host, bytes)`, sorted by host.
    pub fn steps(&self, job: &str) -> Vec<(String, Vec<u8>)> {
        let mut out = self.per_host(job, "steps", ".jsonl");
        for (host, bytes) in &mut out {
            let mark = read_mark(&self.dir.join(job).join("steps").join(format!("{host}.seq")));
            bytes.truncate(mark.len as usize);
        }
        out
    }

    fn per_host(&self, job: &str, kind: &str, ext: &str) -> Vec<(String, Vec<u8>)> {
        if name_problem(job).is_some() {
            return Vec::new();
        }
        let dir = self.dir.join(job).join(kind);
        let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let host = name.strip_suffix(ext)?.to_string();
                let bytes = std::fs::read(e.path()).ok()?;
                Some((host, bytes))
            })
            .collect();
        out.sort();
        out
    }
}

fn read_mark(path: &Path) -> Mark {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut it = text.split_whitespace().map(|w| w.parse::<u64>().ok());
    match (it.next().flatten(), it.next().flatten()) {
        (Some(seq), Some(len)) => Mark { seq, len },
        _ => Mark::default(),
    }
}

/// Cut `path` back to `len` (an unacknowledged append of a crashed run), append `payload` (and
/// a newline if it has none), sync; the new length.
fn append_at(path: &Path, len: u64, payload: &[u8]) -> std::io::Result<u64> {
    let fresh = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(path)?;
    let have = f.metadata()?.len();
    let start = if have < len {
        tracing::warn!(
            "{}: shorter ({have} bytes) than its mark ({len}); appending at its end",
            path.display()
        );
        have
    } else {
        len
    };
    f.set_len(start)?;
    f.seek(SeekFrom::Start(start))?;
    f.write_all(payload)?;
    let mut n = payload.len() as u64;
    if payload.last().is_some_and(|b| *b != b'\n') {
        f.write_all(b"\n")?;
        n += 1;
    }
    f.sync_data()?;
    if fresh {
        if let Some(d) = path.parent() {
            sync_dir(d)?;
        }
    }
    Ok(start + n)
}
