//! The master's side of the link.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::{realtime_ns, token_eq, Reply, Request, LINK_VERSION, MAX_LINE};

/// The master's clock (realtime ns); injectable for tests.
pub type ServerClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Connections served at once; further ones are closed at once.
pub const MAX_CLIENTS: usize = 1024;
/// A connection with no complete line for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Answer link requests on `listener` until `shutdown` turns true (or its sender is dropped).
pub async fn serve(listener: TcpListener, token: Option<String>, shutdown: watch::Receiver<bool>) {
    serve_with_clock(listener, token, shutdown, Arc::new(realtime_ns)).await
}

/// [`serve`] with the master's clock given.
pub async fn serve_with_clock(
    listener: TcpListener,
    token: Option<String>,
    mut shutdown: watch::Receiver<bool>,
    clock: ServerClock,
) {
    let token: Option<Arc<str>> = token.map(Into::into);
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((sock, peer)) => {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "agent link: too many connections; closing one");
                        continue;
                    };
                    let (token, clock, shutdown) = (token.clone(), clock.clone(), shutdown.clone());
                    tokio::spawn(async move {
                        if let Err(reason) = connection(sock, token, clock, shutdown).await {
                            tracing::debug!(%peer, %reason, "agent link: connection closed");
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "agent link: accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn connection(
    sock: TcpStream,
    token: Option<Arc<str>>,
    clock: ServerClock,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    let _ = sock.set_nodelay(true);
    let (rd, mut wr) = sock.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        let mut limited = (&mut rd).take(MAX_LINE as u64);
        let read = limited.read_until(b'\n', &mut line);
        let n = tokio::select! {
            r = tokio::time::timeout(IDLE_TIMEOUT, read) => match r {
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("idle".into()),
            },
            _ = shutdown.changed() => return Ok(()),
        };
        let t2 = clock();
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            let msg = if n >= MAX_LINE {
                format!("line longer than {MAX_LINE} bytes")
            } else {
                "incomplete line".into()
            };
            return refuse(&mut rd, &mut wr, msg).await;
        }
        let req: Request = match serde_json::from_slice(&line) {
            Ok(r) => r,
            Err(e) => return refuse(&mut rd, &mut wr, format!("not a link message ({e})")).await,
        };
        if req.v != LINK_VERSION {
            let msg = format!(
                "link version {} is not supported (this master speaks {LINK_VERSION}); run the same agent version on both hosts",
                req.v
            );
            return refuse(&mut rd, &mut wr, msg).await;
        }
        if let Some(expected) = &token {
            let given = req.token.as_deref().unwrap_or("");
            if !token_eq(given.as_bytes(), expected.as_bytes()) {
                let msg = "wrong or missing token; use the same [master] token_file on both hosts";
                return refuse(&mut rd, &mut wr, msg.into()).await;
            }
        }
        if req.kind != "time" {
            let msg = format!("unknown message type {:?}", req.kind);
            return refuse(&mut rd, &mut wr, msg).await;
        }
        let mut reply = Reply {
            v: LINK_VERSION,
            kind: "time".into(),
            t1: req.t1,
            t2,
            ..Default::default()
        };
        reply.t3 = clock();
        let mut out = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
        out.push(b'\n');
        wr.write_all(&out).await.map_err(|e| e.to_string())?;
    }
}

/// Send one error line and end the connection. Pending input is drained for a moment so the
/// peer reads the error instead of a reset.
async fn refuse(
    rd: &mut BufReader<tokio::net::tcp::OwnedReadHalf>,
    wr: &mut tokio::net::tcp::OwnedWriteHalf,
    message: String,
) -> Result<(), String> {
    let reply = Reply {
        v: LINK_VERSION,
        error: Some(message.clone()),
        ..Default::default()
    };
    let mut out = serde_json::to_vec(&reply).map_err(|e| e.to_string())?;
    out.push(b'\n');
    let _ = wr.write_all(&out).await;
    let _ = wr.shutdown().await;
    let (mut rest, mut sink) = (rd.take(1 << 20), tokio::io::sink());
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::io::copy(&mut rest, &mut sink),
    )
    .await;
    Err(message)
}
