//! The shim's state: announced process groups, the matching rules, interned names, the configs of
//! communicators it named, and the warning queue. Safe code only; [`crate::ffi`] holds the C side.
//!
//! Everything here is bounded: 4096 announcements, 4096 distinct names, 16384 remembered
//! communicators, 16 queued warnings (each distinct message once).

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::CString;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

use comminsight_wire::roles::{format_comm_name, role_from_hint, Role};

use crate::config::ConfigBuf;

/// Most announcements one process may make.
pub const MAX_ANNOUNCEMENTS: usize = 4096;
/// Most distinct communicator names interned (they live as long as the process).
pub const MAX_NAMES: usize = 4096;
/// Most communicators whose config the shim remembers (for `ncclCommSplit` with a NULL config).
pub const MAX_COMMS: usize = 16384;
/// Longest name the shim writes (the record's `comm_name` field).
pub const MAX_NAME_BYTES: usize = 71;
/// Longest `group_desc` / `group_name` accepted by an announcement.
pub const MAX_INPUT_BYTES: usize = 256;
/// Most ranks in one announced group.
pub const MAX_GROUP_RANKS: usize = 1 << 20;
/// Queued warnings (older ones stay; newer ones are dropped and counted).
pub const MAX_WARNINGS: usize = 16;
const MAX_SEEN_WARNINGS: usize = 256;

/// Why an announcement was rejected (one line each, naming the input and the fix).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AnnounceError {
    /// `role` is not one of the six names.
    UnknownRole(String),
    /// A string argument is NULL, not UTF-8 or longer than 256 bytes.
    BadString {
        /// `role`, `group_desc` or `group_name`.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `nranks < 1` or too many ranks.
    BadSize(i64),
    /// `my_rank` is not in `ranks`.
    NotMember {
        /// The rank given.
        my_rank: i32,
        /// The group's description.
        desc: String,
    },
    /// A rank appears twice in `ranks` (or is negative).
    BadRank {
        /// The offending rank.
        rank: i32,
        /// The group's description.
        desc: String,
    },
    /// 4096 announcements already.
    TableFull,
}

impl fmt::Display for AnnounceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnnounceError::UnknownRole(r) => write!(
                f,
                "comminsight_announce_group: unknown role {r:?}: use one of global, dp, tp, pp, ep, cp (or NULL to derive it from group_desc); group ignored"
            ),
            AnnounceError::BadString { field, why } => write!(
                f,
                "comminsight_announce_group: {field} is {why}: pass a UTF-8 string of at most {MAX_INPUT_BYTES} bytes; group ignored"
            ),
            AnnounceError::BadSize(n) => write!(
                f,
                "comminsight_announce_group: nranks {n} out of range: pass 1..={MAX_GROUP_RANKS} ranks; group ignored"
            ),
            AnnounceError::NotMember { my_rank, desc } => write!(
                f,
                "comminsight_announce_group: my_rank {my_rank} is not in the ranks of group {desc:?}: announce only groups this process belongs to; group ignored"
            ),
            AnnounceError::BadRank { rank, desc } => write!(
                f,
                "comminsight_announce_group: rank {rank} is negative or listed twice in group {desc:?}: pass each global rank once; group ignored"
            ),
            AnnounceError::TableFull => write!(
                f,
                "comminsight_announce_group: {MAX_ANNOUNCEMENTS} groups announced already: later groups stay unnamed"
            ),
        }
    }
}

impl std::error::Error for AnnounceError {}

/// One announced process group, as the matching needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    /// The `commName` its communicators get.
    pub name: String,
    /// Number of ranks.
    pub size: i32,
    /// This process's index in the group's rank list (its rank in the group).
    pub index: i32,
    /// Communicators named from it so far.
    pub comms: u32,
}

/// The name chosen for a communicator about to be created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The announcement it comes from (None: `COMMINSIGHT_COMM_ROLE`).
    pub ann: Option<usize>,
    /// The name.
    pub name: String,
}

/// Cut `s` to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut n = max;
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    &s[..n]
}

/// The name for a group: `format_comm_name(role, desc, group_name)` with a role,
/// `"<desc>:<group_name>"` without; at most 71 bytes, `desc` shortened first.
pub fn group_comm_name(role: Option<Role>, desc: &str, group_name: &str) -> String {
    let make = |d: &str| match role {
        Some(r) => format_comm_name(r, d, group_name),
        None => format!("{d}:{group_name}"),
    };
    let full = make(desc);
    if full.len() <= MAX_NAME_BYTES {
        return full;
    }
    let over = full.len() - MAX_NAME_BYTES;
    let shorter = make(cut(desc, desc.len().saturating_sub(over)));
    cut(&shorter, MAX_NAME_BYTES).to_string()
}

/// Announced groups, names and remembered configs (one per process, behind [`registry`]).
#[derive(Debug, Default)]
pub struct Registry {
    anns: Vec<Announcement>,
    /// `COMMINSIGHT_COMM_ROLE`.
    pub env_role: Option<Role>,
    names: HashMap<String, &'static std::ffi::CStr>,
    /// Names not interned because the table was full.
    pub names_dropped: u64,
    comms: HashMap<usize, ConfigBuf>,
}

impl Registry {
    /// Register a group (see the C ABI `comminsight_announce_group`). Returns its id.
    pub fn announce(
        &mut self,
        role: Option<&str>,
        desc: &str,
        group_name: &str,
        ranks: &[i32],
        my_rank: i32,
    ) -> Result<i32, AnnounceError> {
        let role = match role.map(str::trim) {
            None | Some("") => role_from_hint(desc),
            Some(r) => Some(
                r.parse::<Role>()
                    .map_err(|_| AnnounceError::UnknownRole(r.to_string()))?,
            ),
        };
        if ranks.is_empty() || ranks.len() > MAX_GROUP_RANKS {
            return Err(AnnounceError::BadSize(ranks.len() as i64));
        }
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        let bad = sorted
            .first()
            .filter(|&&r| r < 0)
            .or_else(|| sorted.windows(2).find(|w| w[0] == w[1]).map(|w| &w[0]));
        if let Some(&rank) = bad {
            return Err(AnnounceError::BadRank {
                rank,
                desc: desc.to_string(),
            });
        }
        let index =
            ranks
                .iter()
                .position(|&r| r == my_rank)
                .ok_or_else(|| AnnounceError::NotMember {
                    my_rank,
                    desc: desc.to_string(),
                })?;
        if self.anns.len() >= MAX_ANNOUNCEMENTS {
            return Err(AnnounceError::TableFull);
        }
        self.anns.push(Announcement {
            name: group_comm_name(role, desc, group_name),
            size: ranks.len() as i32,
            index: index as i32,
            comms: 0,
        });
        Ok((self.anns.len() - 1) as i32)
    }

    /// The announcement `id`, if any.
    pub fn get(&self, id: i32) -> Option<&Announcement> {
        usize::try_from(id).ok().and_then(|i| self.anns.get(i))
    }

    /// The name for a communicator about to be created by this thread.
    ///
    /// `current`: the thread's current group (-1 none); `geometry`: `(nranks, rank)` when the call
    /// tells them (not for `ncclCommSplit`). Rules: the current group if it fits (nranks <= its
    /// size, rank < nranks); else the one unused announcement with size == nranks and index ==
    /// rank; else `COMMINSIGHT_COMM_ROLE`; else none.
    pub fn choose(&self, current: i32, geometry: Option<(i32, i32)>) -> Option<Choice> {
        if let Some(a) = self.get(current) {
            let fits = geometry.is_none_or(|(n, r)| n <= a.size && (0..n).contains(&r));
            if fits {
                return Some(Choice {
                    ann: Some(current as usize),
                    name: a.name.clone(),
                });
            }
        }
        if let Some((n, r)) = geometry {
            let mut hits = self
                .anns
                .iter()
                .enumerate()
                .filter(|(_, a)| a.comms == 0 && a.size == n && a.index == r);
            if let (Some((i, a)), None) = (hits.next(), hits.next()) {
                return Some(Choice {
                    ann: Some(i),
                    name: a.name.clone(),
                });
            }
        }
        self.env_role.map(|r| Choice {
            ann: None,
            name: r.as_str().to_string(),
        })
    }

    /// The address of a NUL-terminated copy of `name` that lives as long as the process (the same
    /// one for equal names). None when 4096 names exist already (counted) or `name` has a NUL.
    pub fn intern(&mut self, name: &str) -> Option<usize> {
        if let Some(c) = self.names.get(name) {
            return Some(c.as_ptr() as usize);
        }
        if self.names.len() >= MAX_NAMES {
            self.names_dropped += 1;
            return None;
        }
        let c: &'static std::ffi::CStr = Box::leak(CString::new(name).ok()?.into_boxed_c_str());
        self.names.insert(name.to_string(), c);
        Some(c.as_ptr() as usize)
    }

    /// A communicator was named from announcement `ann`.
    pub fn count_named(&mut self, ann: Option<usize>) {
        if let Some(a) = ann.and_then(|i| self.anns.get_mut(i)) {
            a.comms = a.comms.saturating_add(1);
        }
    }

    /// How many communicators were named from `id` (-1: unknown id).
    pub fn group_comms(&self, id: i32) -> i32 {
        self.get(id)
            .map_or(-1, |a| a.comms.min(i32::MAX as u32) as i32)
    }

    /// Remember the config the shim passed for `comm` (bounded; beyond it, nothing is kept).
    pub fn remember(&mut self, comm: usize, cfg: ConfigBuf) {
        if comm != 0 && (self.comms.len() < MAX_COMMS || self.comms.contains_key(&comm)) {
            self.comms.insert(comm, cfg);
        }
    }

    /// The config the shim passed when it created `comm`, if it did.
    pub fn config_of(&self, comm: usize) -> Option<&ConfigBuf> {
        self.comms.get(&comm)
    }

    /// `comm` is being destroyed.
    pub fn forget(&mut self, comm: usize) {
        self.comms.remove(&comm);
    }
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

/// The process's registry (locked; only comm-creating calls and the announcement ABI take it).
pub fn registry() -> MutexGuard<'static, Option<Registry>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run `f` on the process's registry.
pub fn with_registry<T>(f: impl FnOnce(&mut Registry) -> T) -> T {
    let mut g = registry();
    f(g.get_or_insert_with(Registry::default))
}

thread_local! {
    static CURRENT: Cell<i32> = const { Cell::new(-1) };
}

/// This thread's current group (-1: none).
pub fn current_group() -> i32 {
    CURRENT.with(Cell::get)
}

/// Set this thread's current group (-1 or an unknown id clears it).
pub fn set_current_group(id: i32) {
    let known = id >= 0 && with_registry(|r| r.get(id).is_some());
    CURRENT.with(|c| c.set(if known { id } else { -1 }));
}

/// Warnings for NCCL's log, each distinct message once.
#[derive(Debug, Default)]
pub struct Warnings {
    queue: VecDeque<String>,
    seen: HashSet<String>,
    /// Messages not queued because the queue was full.
    pub dropped: u64,
}

impl Warnings {
    /// Queue `msg` unless it was queued before. Returns whether it was queued.
    pub fn push(&mut self, msg: String) -> bool {
        if self.seen.contains(&msg) {
            return false;
        }
        if self.queue.len() >= MAX_WARNINGS || self.seen.len() >= MAX_SEEN_WARNINGS {
            self.dropped += 1;
            return false;
        }
        self.seen.insert(msg.clone());
        self.queue.push_back(msg);
        true
    }

    /// The oldest queued warning.
    pub fn pop(&mut self) -> Option<String> {
        self.queue.pop_front()
    }

    /// Whether any warning is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

static WARNINGS: Mutex<Option<Warnings>> = Mutex::new(None);

/// Run `f` on the process's warning queue.
pub fn with_warnings<T>(f: impl FnOnce(&mut Warnings) -> T) -> T {
    let mut g = WARNINGS.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Warnings::default))
}

/// Queue a warning for NCCL's log (logged once by the plugin's `init`; see `ffi`).
pub fn warn(msg: impl Into<String>) {
    with_warnings(|w| w.push(msg.into()));
}

#[cfg(test)]
mod tests;
