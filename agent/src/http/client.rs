//! One `GET` to the endpoint (HTTP/1.1, `Connection: close`), blocking, with timeouts: what
//! `comminsight-agent status` uses to read `/status`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Connect, send and read timeouts.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response read.
pub const MAX_RESPONSE_BYTES: u64 = 64 << 20;

/// A response: status code, `Content-Type` (empty when absent) and body.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub code: u16,
    /// The `Content-Type` header.
    pub content_type: String,
    /// The body.
    pub body: Vec<u8>,
}

/// Why the request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection, or the exchange broke off.
    #[error("http://{addr}{path}: {source}")]
    Io {
        /// The address asked.
        addr: String,
        /// The path asked.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The reply is not HTTP.
    #[error("http://{addr}{path}: not an HTTP reply ({what})")]
    Malformed {
        /// The address asked.
        addr: String,
        /// The path asked.
        path: String,
        /// What was wrong.
        what: String,
    },
}

/// `GET path` from `addr` (`host:port`).
pub fn get(addr: &str, path: &str) -> Result<Reply, ClientError> {
    let io = |source| ClientError::Io {
        addr: addr.to_string(),
        path: path.to_string(),
        source,
    };
    let target: SocketAddr = addr
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| io(std::io::Error::other("the address resolves to nothing")))?;
    let mut s = TcpStream::connect_timeout(&target, TIMEOUT).map_err(io)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE_BYTES)
        .read_to_end(&mut raw)
        .map_err(io)?;
    parse(&raw).map_err(|what| ClientError::Malformed {
        addr: addr.to_string(),
        path: path.to_string(),
        what,
    })
}

/// Split a whole `Connection: close` response (chunked bodies are decoded).
fn parse(raw: &[u8]) -> Result<Reply, String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of the header")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "a header is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|_| status.starts_with("HTTP/1."))
        .ok_or_else(|| format!("status line {status:?}"))?;
    let mut content_type = String::new();
    let mut chunked = false;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "content-type" {
            content_type = v.to_string();
        } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        }
    }
    let body = &raw[end + 4..];
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(Reply {
        code,
        content_type,
        body,
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok())
            .ok_or("a bad chunk size")?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            return Err("a truncated chunk".into());
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_replies() {
        let r = parse(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{}").unwrap();
        assert_eq!(
            (r.code, r.content_type.as_str(), &r.body[..]),
            (200, "application/json", &b"{}"[..])
        );
        let r = parse(b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap();
        assert_eq!((r.code, &r.body[..]), (503, &b"abcde"[..]));
        assert!(parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
    }

    #[test]
    fn no_listener_is_an_error_naming_the_url() {
        // Bind then drop: the port is very likely free for the next instant.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = get(&format!("127.0.0.1:{port}"), "/status")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("http://127.0.0.1:{port}/status: ")),
            "{e}"
        );
    }
}
