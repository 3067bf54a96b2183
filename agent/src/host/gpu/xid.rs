//! [`XidWatcher`]: NVML's critical-XID events, on a thread of their own (NVML's event wait
//! blocks): one event set with every device registered for `nvmlEventTypeXidCriticalError`;
//! each event becomes an `xid` record, its PCI address from the device that raised it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use comminsight_wire::gpu::{gpu_source, pci, GpuXid};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

/// Events queued at most between two reads (more are counted as lost).
const QUEUE: usize = 1024;
/// How long one wait lasts before the stop flag is looked at (ms).
const WAIT_MS: u32 = 200;

/// The watcher. Dropping it stops the thread.
pub struct XidWatcher {
    rx: Receiver<GpuXid>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    lost: Arc<AtomicU64>,
}

/// Realtime ns now, as the recorder stamps its records (monotonic + its fixed offset).
pub type Clock = Box<dyn Fn() -> u64 + Send>;

/// An event set with every device that accepts XID events registered, and how many did (a
/// failed registration frees the set in NVML: it is made again without that device).
fn build_set(nvml: &Nvml) -> Result<(EventSet<'_>, usize), String> {
    let n = nvml.device_count().map_err(|e| e.to_string())?;
    let mut skip = BTreeSet::new();
    'again: loop {
        let mut set = nvml
            .create_event_set()
            .map_err(|e| format!("nvmlEventSetCreate: {e}"))?;
        let mut registered = 0;
        for i in 0..n {
            if skip.contains(&i) {
                continue;
            }
            let Ok(d) = nvml.device_by_index(i) else {
                skip.insert(i);
                continue;
            };
            match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => {
                    set = s;
                    registered += 1;
                }
                Err(_) => {
                    skip.insert(i);
                    continue 'again;
                }
            }
        }
        if registered == 0 {
            return Err("no GPU accepts XID event registration".into());
        }
        return Ok((set, registered));
    }
}

impl XidWatcher {
    /// Start the thread and register the devices; why not, in one line.
    pub fn start(nvml: Arc<Nvml>, now: Clock) -> Result<XidWatcher, String> {
        let (tx, rx) = sync_channel(QUEUE);
        let (ready_tx, ready_rx) = sync_channel::<Result<usize, String>>(1);
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicU64::new(0));
        let (stop2, lost2) = (Arc::clone(&stop), Arc::clone(&lost));
        let thread = std::thread::Builder::new()
            .name("comminsight-xid".into())
            .spawn(move || {
                let set = match build_set(&nvml) {
                    Ok((set, n)) => {
                        let _ = ready_tx.send(Ok(n));
                        set
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                wait_loop(&set, &stop2, &lost2, &tx, &now);
            })
            .map_err(|e| format!("cannot start the XID thread: {e}"))?;
        let mut w = XidWatcher {
            rx,
            stop,
            thread: Some(thread),
            lost,
        };
        match ready_rx.recv() {
            Ok(Ok(_)) => Ok(w),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                w.thread.take();
                Err("the XID thread ended at start".into())
            }
        }
    }

    /// The events since the last call.
    pub fn take(&self) -> Vec<GpuXid> {
        self.rx.try_iter().collect()
    }

    /// Events lost to a full queue.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

/// Wait for events until `stop`; each goes to `tx` (a full queue counts it in `lost`).
fn wait_loop(
    set: &EventSet<'_>,
    stop: &AtomicBool,
    lost: &AtomicU64,
    tx: &SyncSender<GpuXid>,
    now: &Clock,
) {
    let mut warned = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(ev) => {
                let xid = match ev.event_data {
                    Some(XidError::Value(v)) => v,
                    _ => 0,
                };
                let rec = GpuXid {
                    time_ns: now(),
                    xid,
                    pci: ev
                        .device
                        .pci_info()
                        .ok()
                        .and_then(|p| pci::parse(&p.bus_id))
                        .unwrap_or(0),
                    index: ev.device.index().map_or(255, |i| i.min(255) as u8),
                    source: gpu_source::NVML,
                };
                if let Err(TrySendError::Full(_)) = tx.try_send(rec) {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                if !warned {
                    tracing::warn!("NVML XID events: wait failed: {e}; retrying");
                    warned = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(u64::from(WAIT_MS)));
            }
        }
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
