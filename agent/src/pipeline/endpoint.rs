//! The daemon's side of the HTTP endpoint ([`crate::http`]): health and readiness from [`Live`],
//! `/metrics` from the same [`crate::telemetry::Source`] the OTLP exporter collects from,
//! `/status` from [`Live::snapshot`].

use std::sync::Arc;

use tokio::sync::watch;

use super::status::Live;
use crate::http::{HttpConfig, Routes};
use crate::telemetry::Source;

/// What the daemon serves.
struct DaemonRoutes {
    live: Arc<Live>,
    source: Arc<Source>,
}

impl Routes for DaemonRoutes {
    fn alive(&self) -> bool {
        self.live.alive()
    }

    fn ready(&self) -> bool {
        self.live.ready()
    }

    fn metrics(&self) -> String {
        self.source.prometheus_text()
    }

    fn status(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.live.snapshot()).unwrap_or_default()
    }
}

/// Bind `[http] listen` and serve until `stop` (the endpoint answers `/readyz` 503 from now
/// until [`Live::set_ready`], and again once [`Live::set_stopping`] is called). A failure to
/// bind is logged and the daemon runs on without the endpoint: every component degrades alone.
pub async fn start(
    cfg: &HttpConfig,
    live: &Arc<Live>,
    source: Arc<Source>,
    stop: watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    if !cfg.enabled() {
        return None;
    }
    let listener = match crate::http::bind(&cfg.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("{e}; running without the HTTP endpoint");
            return None;
        }
    };
    let addr = listener
        .local_addr()
        .map_or_else(|_| cfg.listen.clone(), |a| a.to_string());
    tracing::info!("http endpoint on http://{addr}/ (/healthz /readyz /metrics /status)");
    live.set_http(addr);
    let routes = Arc::new(DaemonRoutes {
        live: live.clone(),
        source,
    });
    let max = usize::try_from(cfg.max_connections).unwrap_or(usize::MAX);
    Some(tokio::spawn(crate::http::serve(
        listener, routes, max, stop,
    )))
}
