//! Persisted cursor positions: `<state_dir>/sources/checkpoints.json`, written atomically.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{CursorCheckpoint, SourceError};
use crate::stream::StreamId;

/// File format version of the checkpoint file.
const FORMAT: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Entry {
    stream: StreamId,
    checkpoint: CursorCheckpoint,
}

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    streams: Vec<Entry>,
}

/// Every stream's [`CursorCheckpoint`], loaded from and saved to one file in the state directory.
#[derive(Debug, Default)]
pub struct Checkpoints {
    path: PathBuf,
    map: BTreeMap<StreamId, CursorCheckpoint>,
}

impl Checkpoints {
    /// The checkpoint file under a state directory.
    pub fn file_in(state_dir: &Path) -> PathBuf {
        state_dir.join("sources").join("checkpoints.json")
    }

    /// Load `<state_dir>/sources/checkpoints.json`; a missing file is an empty map.
    pub fn load(state_dir: &Path) -> Result<Checkpoints, SourceError> {
        let path = Self::file_in(state_dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoints {
                    path,
                    map: BTreeMap::new(),
                })
            }
            Err(e) => {
                return Err(SourceError::CheckpointCorrupt {
                    path,
                    message: e.to_string(),
                })
            }
        };
        let file: File =
            serde_json::from_slice(&bytes).map_err(|e| SourceError::CheckpointCorrupt {
                path: path.clone(),
                message: e.to_string(),
            })?;
        if file.format != FORMAT {
            return Err(SourceError::CheckpointCorrupt {
                path,
                message: format!("format {} (this agent reads {FORMAT})", file.format),
            });
        }
        let map = file
            .streams
            .into_iter()
            .map(|e| (e.stream, e.checkpoint))
            .collect();
        Ok(Checkpoints { path, map })
    }

    /// The file this map is saved to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stored checkpoint of a stream.
    pub fn get(&self, id: &StreamId) -> Option<&CursorCheckpoint> {
        self.map.get(id)
    }

    /// Record a stream's checkpoint (saved by the next [`Checkpoints::save`]).
    pub fn set(&mut self, id: StreamId, cp: CursorCheckpoint) {
        self.map.insert(id, cp);
    }

    /// Forget a stream (finished and archived).
    pub fn remove(&mut self, id: &StreamId) -> Option<CursorCheckpoint> {
        self.map.remove(id)
    }

    /// Every stored stream, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&StreamId, &CursorCheckpoint)> {
        self.map.iter()
    }

    /// Write the file atomically: a temporary file, fsync, rename, fsync of the directory.
    pub fn save(&self) -> Result<(), SourceError> {
        let err = |source| SourceError::CheckpointWrite {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(err)?;
        let file = File {
            format: FORMAT,
            streams: self
                .map
                .iter()
                .map(|(k, v)| Entry {
                    stream: k.clone(),
                    checkpoint: v.clone(),
                })
                .collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| err(e.into()))?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut f = std::fs::File::create(&tmp).map_err(err)?;
            f.write_all(&bytes).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(err)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}
