//! The segment streams an import writes: one per rank process, at
//! `<OUT>/<job>/<host>/<pid>/seg-NNNNNN.cis`, the layout the plugin writes and every offline
//! command reads. Each stream starts with a `proc_start`; every `segment` record carries the
//! importer's `SOURCE_*` so a reader can tell converted data from a live recording.

use std::path::{Path, PathBuf};

use comminsight_wire::record::{Body, ProcStart, Record};
use comminsight_wire::segment::{SegmentConfig, SegmentWriter};

use crate::ImportError;

/// Who wrote a stream: the identity its `proc_start` states.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamIdent {
    pub job: String,
    pub host: String,
    pub pid: u32,
    /// Global rank, -1 when unknown.
    pub rank: i32,
    /// World size, -1 when unknown.
    pub world: i32,
}

impl StreamIdent {
    /// The stream's directory under `out`.
    pub fn dir(&self, out: &Path) -> PathBuf {
        out.join(component(&self.job))
            .join(component(&self.host))
            .join(self.pid.to_string())
    }

    /// The `proc_start` record of the stream, its clock pair at `time_ns` (imported times are
    /// already on the wall clock: monotonic = realtime, no correction).
    pub fn proc_start(&self, time_ns: u64) -> ProcStart {
        ProcStart {
            pid: self.pid,
            rank: self.rank,
            local_rank: -1,
            world_size: self.world,
            mono_ns: time_ns,
            real_ns: time_ns,
            abi_version: 0,
            host: self.host.as_str().into(),
            job: self.job.as_str().into(),
        }
    }
}

/// A name made safe as one path component: `/`, NUL and control characters become `_`, and a
/// name that is empty, `.` or `..` becomes `_`.
pub fn component(s: &str) -> String {
    let c: String = s
        .chars()
        .map(|c| if c == '/' || c.is_control() { '_' } else { c })
        .collect();
    if c.is_empty() || c == "." || c == ".." {
        "_".into()
    } else {
        c
    }
}

/// One stream being written. Records get consecutive `seq` numbers from 1.
pub struct StreamOut {
    writer: SegmentWriter,
    dir: PathBuf,
    seq: u64,
    /// `proc_start` and every `comm_init`, repeated at the head of each later segment.
    preamble: Vec<comminsight_wire::RawRecord>,
}

impl StreamOut {
    /// A stream for `ident` under `out`, its segments marked `source`; writes its `proc_start`
    /// (clock pair at `time_ns`). Nothing is created on disk before the first record.
    pub fn create(out: &Path, ident: &StreamIdent, source: u8, time_ns: u64) -> StreamOut {
        let dir = ident.dir(out);
        let cfg = SegmentConfig {
            dir: dir.clone(),
            retention_bytes: u64::MAX,
            ..SegmentConfig::default()
        };
        let mut writer = SegmentWriter::new(cfg, ident.pid);
        writer.set_source(source);
        let mut s = StreamOut {
            writer,
            dir,
            seq: 0,
            preamble: Vec::new(),
        };
        s.push_preamble(Body::ProcStart(ident.proc_start(time_ns)), 0);
        s
    }

    /// Append a record that later segments repeat (`comm_init`).
    pub fn push_preamble(&mut self, body: Body, flags: u16) {
        let raw = self.record(body, flags);
        self.preamble.push(raw);
        self.writer.set_preamble(self.preamble.clone());
        self.writer.write(&[raw]);
    }

    fn record(&mut self, body: Body, flags: u16) -> comminsight_wire::RawRecord {
        self.seq += 1;
        Record {
            seq: self.seq,
            flags,
            body,
        }
        .encode()
    }

    /// Append one record with header `flags`.
    pub fn push(&mut self, body: Body, flags: u16) {
        let raw = self.record(body, flags);
        self.writer.write(&[raw]);
    }

    /// Records written so far (the `proc_start` included).
    pub fn records(&self) -> u64 {
        self.seq
    }

    /// Seal the last segment; the error names the directory when any write failed.
    pub fn finish(mut self) -> Result<u64, ImportError> {
        self.writer.seal();
        if let Some(why) = self.writer.failure() {
            return Err(ImportError::Output {
                path: self.dir,
                what: why.to_string(),
            });
        }
        let st = self.writer.stats();
        if st.failed || st.records_lost > 0 {
            return Err(ImportError::Output {
                path: self.dir,
                what: format!(
                    "{} records lost after an I/O error (disk full?)",
                    st.records_lost
                ),
            });
        }
        Ok(self.seq)
    }
}
