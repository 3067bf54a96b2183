//! The DCGM source: where a site already runs NVIDIA's dcgm-exporter (a DaemonSet, or a
//! service on `:9400`), `[gpu] dcgm_url` points the agent at its `/metrics` and the fields
//! sites rely on — the profiling fields NVML cannot read (`DCGM_FI_PROF_SM_ACTIVE`,
//! `DCGM_FI_PROF_NVLINK_TX_BYTES` / `_RX_BYTES`, `DCGM_FI_PROF_PCIE_*`), clocks, clock-event
//! reasons, power, energy, memory, ECC, retired pages, remapped rows, NVLink error totals and
//! the last XID — become `gpu` / `nvlink` / `xid` records with source DCGM, bound to ranks by
//! the `pci_bus_id` / `UUID` labels ([`convert`]).
//!
//! [`DcgmScraper`] fetches and parses on a thread of its own (a slow or dead exporter never
//! holds the ingest loop), every `[gpu] dcgm_interval_ms`, with `dcgm_timeout_ms` for the whole
//! request; the sampler converts what it fetched. A failing exporter is one warning line (and
//! one line when it answers again), counted in `/status`; nothing else stops.

pub mod convert;
pub mod exposition;
pub mod promtext;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use exposition::{Exposition, Series};

/// Largest body read (dcgm-exporter's is tens of KiB per GPU).
pub const MAX_BODY: usize = 16 << 20;
/// Scrapes queued between two ticks of the sampler at most (more are counted as lost).
const QUEUE: usize = 8;
/// How often the thread looks at the stop flag while it waits.
const NAP: Duration = Duration::from_millis(50);

/// One fetched and parsed body.
#[derive(Debug)]
pub struct Scrape {
    /// Monotonic and host (realtime, the recorder's) ns when the body arrived.
    pub mono_ns: u64,
    pub host_ns: u64,
    pub exposition: Exposition,
}

/// How the scrapes go, for `/status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrapeState {
    pub ok: u64,
    pub failed: u64,
    /// Why the latest scrape failed (empty: it did not).
    pub last_error: String,
    /// Scrapes dropped because the sampler did not take them.
    pub lost: u64,
}

/// The scraper. Dropping it stops the thread.
pub struct DcgmScraper {
    url: String,
    rx: Receiver<Scrape>,
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<ScrapeState>>,
    thread: Option<JoinHandle<()>>,
}

/// Realtime ns now, as the recorder stamps its records.
pub type Clock = Box<dyn Fn() -> (u64, u64) + Send>;

impl DcgmScraper {
    /// Start scraping `url` every `interval`, each request bounded by `timeout`; `now` gives
    /// (monotonic, host) ns.
    pub fn start(
        url: &str,
        interval: Duration,
        timeout: Duration,
        now: Clock,
    ) -> Result<DcgmScraper, String> {
        let (client, runtime) =
            client_and_runtime(timeout).map_err(|e| format!("dcgm-exporter {url}: {e}"))?;
        let (tx, rx) = sync_channel(QUEUE);
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Mutex::new(ScrapeState::default()));
        let job = Loop {
            url: url.to_string(),
            interval,
            client,
            runtime,
            tx,
            stop: Arc::clone(&stop),
            state: Arc::clone(&state),
            now,
        };
        let thread = std::thread::Builder::new()
            .name("comminsight-dcgm".into())
            .spawn(move || job.run())
            .map_err(|e| format!("cannot start the DCGM thread: {e}"))?;
        Ok(DcgmScraper {
            url: url.to_string(),
            rx,
            stop,
            state,
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The scrapes since the last call.
    pub fn take(&self) -> Vec<Scrape> {
        self.rx.try_iter().collect()
    }

    pub fn state(&self) -> ScrapeState {
        self.state.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for DcgmScraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's side.
struct Loop {
    url: String,
    interval: Duration,
    client: reqwest::Client,
    runtime: tokio::runtime::Runtime,
    tx: SyncSender<Scrape>,
    stop: Arc<AtomicBool>,
    state: Arc<Mutex<ScrapeState>>,
    now: Clock,
}

impl Loop {
    fn run(self) {
        let mut failing = false;
        while !self.stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let got = self.runtime.block_on(fetch(&self.client, &self.url));
            let mut st = match self.state.lock() {
                Ok(s) => s,
                Err(_) => return,
            };
            match got {
                Ok(body) => {
                    st.ok += 1;
                    st.last_error.clear();
                    if failing {
                        tracing::info!("dcgm-exporter {} answers again", self.url);
                        failing = false;
                    }
                    let (mono_ns, host_ns) = (self.now)();
                    let scrape = Scrape {
                        mono_ns,
                        host_ns,
                        exposition: exposition::parse(&body, &convert::FIELDS),
                    };
                    if let Err(TrySendError::Full(_)) = self.tx.try_send(scrape) {
                        st.lost += 1;
                    }
                }
                Err(e) => {
                    st.failed += 1;
                    if !failing {
                        tracing::warn!(
                            "dcgm-exporter {e}; retrying every {} ms ([gpu] dcgm_url)",
                            self.interval.as_millis()
                        );
                        failing = true;
                    }
                    st.last_error = e;
                }
            }
            drop(st);
            while started.elapsed() < self.interval && !self.stop.load(Ordering::Relaxed) {
                std::thread::sleep(NAP.min(self.interval.saturating_sub(started.elapsed())));
            }
        }
    }
}

/// One scrape of `url` now, for `doctor`: how many GPUs and kept fields it has, or why not (on
/// a thread of its own, so a caller inside a runtime is fine).
pub fn probe(url: &str, timeout: Duration) -> Result<String, String> {
    let url = url.to_string();
    let t = std::thread::spawn(move || {
        let (client, rt) = client_and_runtime(timeout).map_err(|e| format!("{url}: {e}"))?;
        let body = rt.block_on(fetch(&client, &url))?;
        let e = exposition::parse(&body, &convert::FIELDS);
        let kept: Vec<&Series> = e.series.iter().collect();
        let gpus: std::collections::BTreeSet<&str> = kept
            .iter()
            .filter_map(|s| s.labels.get("gpu").map(String::as_str))
            .collect();
        let fields: std::collections::BTreeSet<&str> =
            kept.iter().map(|s| s.name.as_str()).collect();
        if kept.is_empty() {
            return Err(format!(
                "{url}: no DCGM field the agent reads ({} of its lines not understood)",
                e.skipped
            ));
        }
        Ok(format!(
            "{url}: {} GPUs, {} of the {} fields the agent reads{}",
            gpus.len(),
            fields.len(),
            convert::N_FIELDS,
            if e.skipped > 0 {
                format!(", {} lines not understood", e.skipped)
            } else {
                String::new()
            }
        ))
    });
    t.join()
        .unwrap_or_else(|_| Err("the DCGM probe thread failed".into()))
}

/// An HTTP client whose requests end after `timeout`, and the one-thread runtime it runs on.
fn client_and_runtime(
    timeout: Duration,
) -> Result<(reqwest::Client, tokio::runtime::Runtime), String> {
    crate::util::install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    Ok((client, runtime))
}

/// `GET url`: the body, or why not in one line naming the URL.
async fn fetch(client: &reqwest::Client, url: &str) -> Result<String, String> {
    let mut r = client
        .get(url)
        .header("Accept", "text/plain")
        .send()
        .await
        .map_err(|e| format!("{url}: {}", error_chain(&e)))?;
    if !r.status().is_success() {
        return Err(format!("{url}: HTTP {}", r.status()));
    }
    let mut body = Vec::new();
    while let Some(c) = r
        .chunk()
        .await
        .map_err(|e| format!("{url}: {}", error_chain(&e)))?
    {
        if body.len() + c.len() > MAX_BODY {
            return Err(format!("{url}: body over {MAX_BODY} bytes"));
        }
        body.extend_from_slice(&c);
    }
    String::from_utf8(body).map_err(|_| format!("{url}: the body is not UTF-8 text"))
}

/// `e` and its sources, `: `-joined (reqwest's own message is only the outer layer).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
