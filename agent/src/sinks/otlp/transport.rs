//! OTLP over HTTP (protobuf bodies, reqwest) or gRPC (tonic, prost codec): one client per sink,
//! with the configured headers, gzip, and TLS from the system's roots or `ca_file` (rustls with
//! ring). A failed request is an [`ExportError`] whose text is one line with every cause.

use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use prost::Message;

use super::config::{OtlpCompression, OtlpConfig, OtlpProtocol};
use crate::sinks::SinkError;

const METRICS_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
const LOGS_PATH: &str = "/opentelemetry.proto.collector.logs.v1.LogsService/Export";

/// One failed export, as one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExportError(pub String);

/// An error and its causes joined on one line (`a: b: c`), repeated texts left out.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cur = err.source();
    }
    parts.join(": ").replace('\n', " ")
}

/// `name=value` as a header name and value, if both are valid.
pub fn parse_header(h: &str) -> Option<(http::HeaderName, http::HeaderValue)> {
    let (k, v) = h.split_once('=')?;
    let name = http::HeaderName::from_bytes(k.trim().as_bytes()).ok()?;
    let value = http::HeaderValue::from_str(v.trim()).ok()?;
    Some((name, value))
}

pub use crate::util::install_crypto_provider;

/// The CA file's PEM bytes, checked to hold at least one certificate.
fn read_ca(path: &str) -> Result<Vec<u8>, SinkError> {
    let bad = |reason: String| SinkError::CaFile {
        path: path.to_owned(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(pem)
}

/// An OTLP client.
pub(crate) enum Transport {
    Http {
        client: reqwest::Client,
        metrics_url: String,
        logs_url: String,
        gzip: bool,
    },
    Grpc {
        channel: tonic::transport::Channel,
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
        gzip: bool,
    },
}

fn headers(cfg: &OtlpConfig) -> Result<Vec<(http::HeaderName, http::HeaderValue)>, SinkError> {
    cfg.headers
        .iter()
        .map(|h| {
            parse_header(h).ok_or_else(|| SinkError::BadHeader {
                header: h.split_once('=').map_or(h.as_str(), |(k, _)| k).to_owned(),
            })
        })
        .collect()
}

impl Transport {
    /// A client for `cfg` (the URLs already resolved). gRPC must be built inside a tokio
    /// runtime (the channel connects lazily on it).
    pub(crate) fn new(
        cfg: &OtlpConfig,
        metrics_url: String,
        logs_url: String,
    ) -> Result<Transport, SinkError> {
        install_crypto_provider();
        let timeout = Duration::from_millis(cfg.timeout_ms.max(1));
        let gzip = cfg.compression == OtlpCompression::Gzip;
        let headers = headers(cfg)?;
        let ca = (!cfg.ca_file.is_empty())
            .then(|| read_ca(&cfg.ca_file))
            .transpose()?;
        if cfg.protocol == OtlpProtocol::Grpc {
            return Self::grpc(&metrics_url, timeout, headers, gzip, ca);
        }
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.append(k, v);
        }
        let mut b = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .default_headers(map)
            .user_agent(concat!("comminsight-agent/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca {
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| SinkError::CaFile {
                    path: cfg.ca_file.clone(),
                    reason: chain(&e),
                })?;
            b = b.tls_certs_only(certs);
        }
        let client = b.build().map_err(|e| SinkError::Exporter {
            signal: "metrics and logs",
            endpoint: metrics_url.clone(),
            reason: chain(&e),
        })?;
        Ok(Transport::Http {
            client,
            metrics_url,
            logs_url,
            gzip,
        })
    }

    fn grpc(
        url: &str,
        timeout: Duration,
        headers: Vec<(http::HeaderName, http::HeaderValue)>,
        gzip: bool,
        ca: Option<Vec<u8>>,
    ) -> Result<Transport, SinkError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
        let bad = |reason: String| SinkError::Exporter {
            signal: "metrics and logs",
            endpoint: url.to_owned(),
            reason,
        };
        let mut ep = Endpoint::from_shared(url.to_owned())
            .map_err(|e| bad(chain(&e)))?
            .timeout(timeout)
            .connect_timeout(timeout);
        if url.starts_with("https://") || ca.is_some() {
            let tls = match ca {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            ep = ep.tls_config(tls).map_err(|e| bad(chain(&e)))?;
        }
        Ok(Transport::Grpc {
            channel: ep.connect_lazy(),
            headers,
            gzip,
        })
    }

    /// Send one metrics request.
    pub(crate) async fn metrics(
        &self,
        req: ExportMetricsServiceRequest,
    ) -> Result<(), ExportError> {
        match self {
            Transport::Http {
                client,
                metrics_url,
                gzip,
                ..
            } => post(client, metrics_url, req.encode_to_vec(), *gzip).await,
            Transport::Grpc {
                channel,
                headers,
                gzip,
            } => {
                unary::<_, ExportMetricsServiceResponse>(channel, headers, *gzip, METRICS_PATH, req)
                    .await
            }
        }
    }

    /// Send one logs request.
    pub(crate) async fn logs(&self, req: ExportLogsServiceRequest) -> Result<(), ExportError> {
        match self {
            Transport::Http {
                client,
                logs_url,
                gzip,
                ..
            } => post(client, logs_url, req.encode_to_vec(), *gzip).await,
            Transport::Grpc {
                channel,
                headers,
                gzip,
            } => {
                unary::<_, ExportLogsServiceResponse>(channel, headers, *gzip, LOGS_PATH, req).await
            }
        }
    }
}

fn gzip_body(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(body.len() / 4),
        flate2::Compression::fast(),
    );
    // Writing into a Vec cannot fail.
    let _ = e.write_all(body);
    e.finish().unwrap_or_default()
}

async fn post(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    gzip: bool,
) -> Result<(), ExportError> {
    let mut req = client
        .post(url)
        .header(http::header::CONTENT_TYPE, "application/x-protobuf");
    let body = if gzip {
        req = req.header(http::header::CONTENT_ENCODING, "gzip");
        gzip_body(&body)
    } else {
        body
    };
    let resp = req
        .body(body)
        .send()
        .await
        .map_err(|e| ExportError(chain(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let text = resp.text().await.unwrap_or_default();
    let text: String = text.chars().take(200).collect();
    Err(ExportError(format!(
        "HTTP {status} from {url}: {}",
        text.replace('\n', " ")
    )))
}

async fn unary<Req, Resp>(
    channel: &tonic::transport::Channel,
    headers: &[(http::HeaderName, http::HeaderValue)],
    gzip: bool,
    path: &'static str,
    req: Req,
) -> Result<(), ExportError>
where
    Req: Message + Send + Sync + 'static,
    Resp: Message + Default + Send + Sync + 'static,
{
    use tonic::codec::CompressionEncoding;
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    if gzip {
        grpc = grpc.send_compressed(CompressionEncoding::Gzip);
    }
    grpc.ready().await.map_err(|e| ExportError(chain(&e)))?;
    let mut request = tonic::Request::new(req);
    for (k, v) in headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.as_str().as_bytes());
        let value = tonic::metadata::MetadataValue::try_from(v.as_bytes());
        if let (Ok(key), Ok(value)) = (key, value) {
            request.metadata_mut().append(key, value);
        }
    }
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    grpc.unary(request, http::uri::PathAndQuery::from_static(path), codec)
        .await
        .map(|_| ())
        .map_err(|s| {
            let mut line = format!("gRPC {:?}: {}", s.code(), s.message());
            if let Some(src) = std::error::Error::source(&s) {
                line.push_str(": ");
                line.push_str(&chain(src));
            }
            ExportError(line.replace('\n', " "))
        })
}
