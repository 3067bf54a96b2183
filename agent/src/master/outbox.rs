//! The agents' durable outbox to the master, under `<state_dir>/outbox/`:
//!
//! * `<seq>-<kind>.msg` (seq zero-padded to 20 digits): one encoded `PushRequest` each, written
//!   atomically by [`Outbox::push`], deleted once the master acknowledged it;
//! * `seq`: the sequence numbers reserved so far (persisted in blocks, so numbers only grow
//!   across restarts; a fresh outbox starts at the realtime in µs, so a wiped state directory
//!   does not reuse numbers the master has already stored).
//!
//! [`Outbox::run`] sends the files in seq order over one kept-alive channel, retrying with capped
//! exponential backoff while the master is unreachable. The outbox is bounded: beyond
//! `max_bytes` the oldest `steps` messages are dropped first, then the oldest `hang` ones
//! (counted in [`Outbox::dropped`], logged).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::{watch, Notify};

use super::client::LinkClient;
use super::proto::{name_problem, PushRequest, KINDS};
use super::{disk, realtime_ns, write_atomic, LinkError};

/// Sequence numbers reserved per write of the `seq` file.
const SEQ_BLOCK: u64 = 1024;
/// One "the master refused the token" line per this long.
const TOKEN_LOG_EVERY: Duration = Duration::from_secs(60);

/// The outbox's bound and retry pacing.
#[derive(Clone, Copy, Debug)]
pub struct OutboxLimits {
    /// Most bytes kept (`[master] outbox_max_mb`).
    pub max_bytes: u64,
    /// First retry delay after a failed send.
    pub backoff_min: Duration,
    /// Longest retry delay (the delay doubles up to it).
    pub backoff_max: Duration,
}

impl Default for OutboxLimits {
    fn default() -> Self {
        OutboxLimits {
            max_bytes: super::config::DEFAULT_OUTBOX_MAX_MB << 20,
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
        }
    }
}

struct Entry {
    kind: String,
    bytes: u64,
}

struct State {
    next_seq: u64,
    reserved: u64,
    files: BTreeMap<u64, Entry>,
    bytes: u64,
    inflight: Option<u64>,
}

/// The durable outbox; share it as `Arc<Outbox>`.
pub struct Outbox {
    dir: PathBuf,
    host: String,
    limits: OutboxLimits,
    state: Mutex<State>,
    wake: Notify,
    dropped: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox").field("dir", &self.dir).finish()
    }
}

impl Outbox {
    /// Open (create) the outbox in `dir` for messages from `host`; messages left by an earlier
    /// run are kept and sent first.
    pub fn open(dir: &Path, host: &str, limits: OutboxLimits) -> Result<Arc<Outbox>, LinkError> {
        let fail = |e: std::io::Error| disk(dir, "the outbox", e);
        std::fs::create_dir_all(dir).map_err(fail)?;
        let mut files = BTreeMap::new();
        let mut bytes = 0;
        for e in std::fs::read_dir(dir).map_err(fail)?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let Some((seq, kind)) = parse_name(&name) else {
                continue;
            };
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            bytes += len;
            files.insert(seq, Entry { kind, bytes: len });
        }
        let seq_path = dir.join("seq");
        let reserved = match std::fs::read_to_string(&seq_path) {
            Ok(t) => t.trim().parse::<u64>().unwrap_or_else(|_| {
                // Numbers at or below ones the master stored would be taken for resends.
                tracing::warn!(
                    "{}: not a number; continuing from the realtime in µs",
                    seq_path.display()
                );
                (realtime_ns() / 1000).max(1)
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (realtime_ns() / 1000).max(1),
            Err(e) => return Err(disk(&seq_path, "the outbox", e)),
        };
        let next_seq = reserved.max(files.keys().next_back().map_or(1, |s| s + 1));
        Ok(Arc::new(Outbox {
            dir: dir.to_path_buf(),
            host: host.to_string(),
            limits,
            state: Mutex::new(State {
                next_seq,
                reserved: next_seq,
                files,
                bytes,
                inflight: None,
            }),
            wake: Notify::new(),
            dropped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }))
    }

    /// Queue `payload` of `kind` (`hang` or `steps`) for `job`, durably; returns its seq. The
    /// sender task picks it up at once. Blocks for a file write and sync (a few ms): call it from
    /// a thread or `spawn_blocking`, and batch step summaries (one message of many JSON lines). Beyond the bound older messages are dropped (see the
    /// module doc); a message larger than the whole bound is refused.
    pub fn push(&self, kind: &str, job: &str, payload: &[u8]) -> Result<u64, LinkError> {
        let bad = |reason: String| LinkError::BadMessage {
            kind: kind.into(),
            job: job.into(),
            reason,
        };
        if !KINDS.contains(&kind) {
            return Err(bad(format!("unknown kind (known: {})", KINDS.join(", "))));
        }
        if let Some(p) = name_problem(job) {
            return Err(bad(format!("the job name {p}")));
        }
        if let Some(p) = name_problem(&self.host) {
            return Err(bad(format!(
                "this host's name {:?} {p}; set [agent] host_name",
                self.host
            )));
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let seq = st.next_seq;
        let msg = PushRequest {
            kind: kind.into(),
            job: job.into(),
            host: self.host.clone(),
            seq,
            payload: payload.to_vec(),
        };
        let body = msg.encode_to_vec();
        let size = body.len() as u64;
        if size > self.limits.max_bytes {
            return Err(bad(format!(
                "{size} bytes is more than the whole outbox ({} bytes); raise [master] outbox_max_mb",
                self.limits.max_bytes
            )));
        }
        if seq >= st.reserved {
            let reserved = seq + SEQ_BLOCK;
            let path = self.dir.join("seq");
            write_atomic(&path, format!("{reserved}\n").as_bytes())
                .map_err(|e| disk(&path, "the outbox", e))?;
            st.reserved = reserved;
        }
        let dropped = self.make_room(&mut st, size);
        let path = self.path(seq, kind);
        write_atomic(&path, &body).map_err(|e| disk(&path, "the outbox", e))?;
        st.next_seq = seq + 1;
        st.bytes += size;
        st.files.insert(
            seq,
            Entry {
                kind: kind.into(),
                bytes: size,
            },
        );
        drop(st);
        if dropped > 0 {
            tracing::warn!(
                "outbox {}: full ([master] outbox_max_mb); dropped the {dropped} oldest message(s) ({} dropped since start)",
                self.dir.display(),
                self.dropped()
            );
        }
        self.wake.notify_one();
        Ok(seq)
    }

    /// Drop the oldest `steps`, then `hang` messages until `size` more bytes fit; how many.
    fn make_room(&self, st: &mut State, size: u64) -> u64 {
        let mut n = 0;
        while st.bytes + size > self.limits.max_bytes {
            let victim = ["steps", "hang"].iter().find_map(|k| {
                st.files
                    .iter()
                    .find(|(s, e)| e.kind == *k && Some(**s) != st.inflight)
                    .map(|(s, _)| *s)
            });
            let Some(seq) = victim else { break };
            let e = st.files.remove(&seq).expect("listed");
            let _ = std::fs::remove_file(self.path(seq, &e.kind));
            st.bytes -= e.bytes;
            n += 1;
        }
        self.dropped.fetch_add(n, Ordering::Relaxed);
        n
    }

    /// Messages waiting to be acknowledged.
    pub fn pending(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .files
            .len()
    }

    /// Bytes waiting to be acknowledged.
    pub fn pending_bytes(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }

    /// Messages dropped because the outbox was full (since this process started).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Messages the master refused for good (bad name, too large) or unreadable files; deleted.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    fn path(&self, seq: u64, kind: &str) -> PathBuf {
        self.dir.join(format!("{seq:020}-{kind}.msg"))
    }

    fn forget(&self, seq: u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = st.files.remove(&seq) {
            let _ = std::fs::remove_file(self.path(seq, &e.kind));
            st.bytes -= e.bytes;
        }
        st.inflight = None;
    }

    /// The oldest queued message `(seq, kind)`, marked in flight.
    fn take_next(&self) -> Option<(u64, String)> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let n = st.files.iter().next().map(|(s, e)| (*s, e.kind.clone()));
        st.inflight = n.as_ref().map(|(s, _)| *s);
        n
    }

    /// Send the queued messages in seq order through `client` until `shutdown` turns true.
    pub async fn run(self: Arc<Self>, client: LinkClient, mut shutdown: watch::Receiver<bool>) {
        let addr = client.address().to_string();
        let (min, max) = (self.limits.backoff_min, self.limits.backoff_max);
        let mut backoff =
            crate::util::backoff::Backoff::new(min.as_millis() as u64, max.as_millis() as u64);
        let mut failing = false;
        let mut token_logged: Option<Instant> = None;
        loop {
            if *shutdown.borrow() {
                return;
            }
            let Some((seq, kind)) = self.take_next() else {
                tokio::select! {
                    _ = self.wake.notified() => {}
                    _ = shutdown.wait_for(|v| *v) => return,
                }
                continue;
            };
            let path = self.path(seq, &kind);
            let msg = match std::fs::read(&path).map(|b| PushRequest::decode(b.as_slice())) {
                Ok(Ok(m)) => m,
                Ok(Err(e)) => {
                    tracing::error!("outbox {}: not a message ({e}); deleted", path.display());
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    self.forget(seq);
                    continue;
                }
                Err(e) => {
                    tracing::error!("outbox {}: unreadable ({e}); skipped", path.display());
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    self.forget(seq);
                    continue;
                }
            };
            // Shutdown does not wait for a slow master: an unacknowledged message stays queued
            // (a resend is acknowledged without being stored twice).
            let sent = tokio::select! {
                r = client.push(msg) => r,
                _ = shutdown.wait_for(|v| *v) => return,
            };
            match sent {
                Ok(()) => {
                    self.forget(seq);
                    if failing {
                        tracing::info!(
                            "outbox: sending to the master at {addr} works again ({} message(s) pending)",
                            self.pending()
                        );
                    }
                    failing = false;
                    backoff.succeed();
                    continue;
                }
                Err(e) if e.is_auth() => {
                    if token_logged.is_none_or(|t| t.elapsed() >= TOKEN_LOG_EVERY) {
                        tracing::warn!(
                            "outbox: the master refused the token ({e}); keeping {} message(s)",
                            self.pending()
                        );
                        token_logged = Some(Instant::now());
                    }
                    failing = true;
                }
                Err(e @ LinkError::Refused { .. }) => {
                    tracing::error!(
                        "outbox: the master refused message {seq} ({kind}) for good ({e}); deleted"
                    );
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    self.forget(seq);
                    continue;
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            "outbox: cannot send to the master ({e}); keeping {} message(s), retrying every {}..{} s",
                            self.pending(),
                            self.limits.backoff_min.as_secs_f64(),
                            self.limits.backoff_max.as_secs_f64()
                        );
                    }
                    failing = true;
                }
            }
            self.state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .inflight = None;
            // The shared policy: doubling with jitter, so agents cut off by the same master
            // outage do not all come back at the same instant.
            let (delay, _) = backoff.fail();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
        }
    }
}

/// `<seq>-<kind>.msg` -> (seq, kind).
fn parse_name(name: &str) -> Option<(u64, String)> {
    let stem = name.strip_suffix(".msg")?;
    let (seq, kind) = stem.split_once('-')?;
    if !KINDS.contains(&kind) {
        return None;
    }
    Some((seq.parse().ok()?, kind.to_string()))
}
