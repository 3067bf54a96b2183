//! The master link's messages over arbitrary bytes: each protobuf message of
//! `comminsight_agent::master::proto` (`TimeRequest`, `TimeReply`, `PushRequest`, `PushReply`)
//! decodes or refuses without panicking, and what decodes re-encodes to itself. A decoded push
//! goes where the master's `Push` handler sends it, without a network: `MasterStore::store`
//! (kind, job and host names that become paths, seq; a private store under a temp directory,
//! emptied now and then) and, once stored, the push hook's consumers of the payload: a `hang`
//! snapshot is read back from the store, parsed, merged and analysed; `steps` lines go to the
//! live straggler analysis and the EP (MoE) windows. Nothing may panic, a refusal renders its
//! reason, and a stored hang snapshot reads back byte for byte.
#![no_main]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use comminsight_agent::hang::analyze::{analyze, HangSettings};
use comminsight_agent::hang::merge::merge;
use comminsight_agent::hang::model::JobSnapshot;
use comminsight_agent::master::proto::{PushReply, PushRequest, TimeReply, TimeRequest};
use comminsight_agent::master::MasterStore;
use comminsight_agent::moe::MoeConfig;
use comminsight_agent::sinks::moe::MoeOutput;
use comminsight_agent::straggler::config::StragglerConfig;
use comminsight_agent::straggler::live::{LiveSettings, LiveStraggler};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(data: &[u8]) -> Option<M> {
    let m = M::decode(data).ok()?;
    let again = M::decode(m.encode_to_vec().as_slice()).expect("re-encoded message decodes");
    assert_eq!(again, m);
    Some(m)
}

/// The store, in a fresh directory every 256 messages (bounded disk use).
fn store() -> std::sync::MutexGuard<'static, (PathBuf, MasterStore)> {
    static STORE: OnceLock<Mutex<(PathBuf, MasterStore)>> = OnceLock::new();
    static N: AtomicU32 = AtomicU32::new(0);
    let base = || {
        let shm = PathBuf::from("/dev/shm");
        let tmp = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        tmp.join(format!("ci-fuzz-master-{}", std::process::id()))
    };
    let m = STORE.get_or_init(|| {
        let d = base();
        let _ = std::fs::remove_dir_all(&d);
        Mutex::new((d.clone(), MasterStore::open(&d).expect("store")))
    });
    let mut g = m.lock().unwrap();
    if N.fetch_add(1, Ordering::Relaxed) % 256 == 255 {
        let d = g.0.clone();
        let _ = std::fs::remove_dir_all(&d);
        g.1 = MasterStore::open(&d).expect("store");
    }
    g
}

fuzz_target!(|data: &[u8]| {
    let _ = round_trip::<TimeRequest>(data);
    let _ = round_trip::<TimeReply>(data);
    let _ = round_trip::<PushReply>(data);
    let Some(msg) = round_trip::<PushRequest>(data) else {
        return;
    };
    let g = store();
    let store = &g.1;
    let stored = match store.store(&msg) {
        Ok(s) => s,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    if !stored {
        return;
    }
    let job = msg.job.as_str();
    if msg.kind == "hang" {
        let snaps = store.hang_snapshots(job);
        assert!(
            snaps
                .iter()
                .any(|(h, b)| *h == msg.host && *b == msg.payload),
            "the stored snapshot reads back"
        );
        if let Ok(snap) = serde_json::from_slice::<JobSnapshot>(&msg.payload) {
            let merged = merge(&[snap.clone(), snap]);
            let _ = analyze(&merged, &HangSettings::default(), &["other".to_string()]);
        }
    } else {
        let _ = store.steps(job);
        let now = Instant::now();
        let live = LiveStraggler::new(LiveSettings::from(&StragglerConfig::default()));
        let _ = live.on_lines(job, &msg.payload, now);
        let _ = live.tick(now + Duration::from_secs(3600));
        let _ = live.take_reports();
        let moe = MoeOutput::new(&MoeConfig::default(), Vec::new(), "fuzz", None);
        moe.on_lines_at(job, &msg.payload, 1_000_000_000);
        moe.tick_at(u64::MAX / 2);
        let _ = moe.values();
    }
});
