//! Value checks after loading: ranges, addresses, URLs, names, and keys that depend on each other.

use std::net::IpAddr;
use std::path::Path;

use super::error::{ConfigError, Origins};
use super::keys::{quote_list, LOG_FORMATS};
use super::{
    AgentConfig, AgentSection, ArchiveConfig, ClockConfig, LogConfig, MasterConfig,
    ObjectStoreConfig, OtlpConfig, SourcesConfig, StepsConfig, StragglerConfig,
};

struct V<'a> {
    origins: &'a Origins,
}

impl V<'_> {
    fn err(&self, key: &str, value: &dyn std::fmt::Display, message: String) -> ConfigError {
        ConfigError::BadValue {
            origin: self.origins.describe(key, value),
            key: key.into(),
            message,
        }
    }

    fn at_least(&self, key: &str, value: u64, min: u64, unit: &str) -> Result<(), ConfigError> {
        if value >= min {
            return Ok(());
        }
        Err(self.err(
            key,
            &value,
            format!("must be at least {min}{unit}; set a larger value"),
        ))
    }

    fn retry(&self, section: &str, initial: u64, max: u64) -> Result<(), ConfigError> {
        let ik = format!("{section}.retry_initial_ms");
        self.at_least(&ik, initial, 1, " (milliseconds)")?;
        if max < initial {
            let mk = format!("{section}.retry_max_ms");
            return Err(self.err(
                &mk,
                &max,
                format!("must be at least `{ik}` ({initial}); raise it or lower `{ik}`"),
            ));
        }
        Ok(())
    }

    fn path_set(&self, key: &str, p: &Path) -> Result<(), ConfigError> {
        if p.as_os_str().is_empty() {
            return Err(self.err(key, &"\"\"", "must not be empty; give a directory".into()));
        }
        Ok(())
    }

    fn url(&self, key: &str, s: &str, example: &str) -> Result<(), ConfigError> {
        if let Err(why) = parse_url(s) {
            return Err(self.err(
                key,
                &format!("{s:?}"),
                format!("{why}; write an http:// or https:// URL such as {example}"),
            ));
        }
        Ok(())
    }

    fn host_port(&self, key: &str, s: &str, allow_port_0: bool) -> Result<(), ConfigError> {
        match parse_host_port(s) {
            Ok((_, 0)) if !allow_port_0 => Err(self.err(
                key,
                &format!("{s:?}"),
                "port 0 is not a destination; give the master's port (default 7117)".into(),
            )),
            Ok(_) => Ok(()),
            Err(why) => Err(self.err(
                key,
                &format!("{s:?}"),
                format!("{why}; write host:port, e.g. 127.0.0.1:7117 or [::1]:7117"),
            )),
        }
    }
}

/// Split `host:port` (IPv6 in brackets). The host may be a name or an address.
pub fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .ok_or_else(|| "an IPv6 address needs the form [addr]:port".to_string())?;
        h.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("`{h}` is not an IPv6 address"))?;
        (h, p)
    } else {
        s.rsplit_once(':')
            .ok_or_else(|| "missing `:port`".to_string())?
    };
    if host.is_empty() {
        return Err("missing host".into());
    }
    if !s.starts_with('[') && host.contains(':') {
        return Err("an IPv6 address must be written in brackets".into());
    }
    if host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(format!("`{host}` is not a host name"));
    }
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("`{port}` is not a port number (0..=65535)"))?;
    Ok((host.to_string(), port))
}

/// Check an http(s) URL: scheme, non-empty host, optional numeric port, optional path.
pub fn parse_url(s: &str) -> Result<(), String> {
    let rest = s
        .strip_prefix("http://")
        .or_else(|| s.strip_prefix("https://"))
        .ok_or_else(|| "the scheme must be http or https".to_string())?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err("missing host".into());
    }
    if authority.contains('@') || authority.contains(char::is_whitespace) {
        return Err("the host part holds `@` or spaces".into());
    }
    let has_port = if authority.starts_with('[') {
        authority.contains("]:")
    } else {
        authority.contains(':')
    };
    if has_port {
        parse_host_port(authority).map(|_| ())
    } else {
        Ok(())
    }
}

const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

/// A level name, or a tracing filter whose directives are `level`, `target=level` or span filters.
pub fn is_log_filter(s: &str) -> bool {
    if s.trim().is_empty() || tracing_subscriber::EnvFilter::builder().parse(s).is_err() {
        return false;
    }
    let target_ok = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-'))
    };
    s.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .all(|d| {
            if d.contains('[') {
                return true;
            }
            match d.split_once('=') {
                Some((t, l)) => target_ok(t) && LEVELS.contains(&l.to_ascii_lowercase().as_str()),
                None => LEVELS.contains(&d.to_ascii_lowercase().as_str()),
            }
        })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Unit suffix of the millisecond keys in messages.
const MS: &str = " (milliseconds)";

/// Validate a loaded configuration, section by section (the first problem is reported).
pub(crate) fn validate(c: &AgentConfig, origins: &Origins) -> Result<(), ConfigError> {
    let v = V { origins };
    validate_agent(&v, &c.agent)?;
    validate_sources(&v, &c.sources)?;
    validate_clock(&v, &c.clock)?;
    validate_master(&v, &c.master)?;
    validate_http(&v, &c.http)?;
    validate_archive(&v, &c.archive)?;
    validate_otlp(&v, &c.otlp)?;
    validate_steps(&v, &c.steps)?;
    validate_straggler(&v, &c.straggler)?;
    v.at_least(
        "probes.interval_ms",
        c.probes.interval_ms,
        100,
        " (milliseconds)",
    )?;
    v.at_least(
        "ports.interval_ms",
        c.ports.interval_ms,
        100,
        " (milliseconds)",
    )?;
    v.at_least("gpu.interval_ms", c.gpu.interval_ms, 10, " (milliseconds)")?;
    v.at_least(
        "gpu.fast_interval_ms",
        c.gpu.fast_interval_ms,
        10,
        " (milliseconds)",
    )?;
    if !c.gpu.dcgm_url.is_empty() {
        v.url(
            "gpu.dcgm_url",
            &c.gpu.dcgm_url,
            "http://127.0.0.1:9400/metrics",
        )?;
    }
    v.at_least("gpu.dcgm_interval_ms", c.gpu.dcgm_interval_ms, 100, MS)?;
    v.at_least("gpu.dcgm_timeout_ms", c.gpu.dcgm_timeout_ms, 10, MS)?;
    validate_moe(&v, &c.moe)?;
    validate_log(&v, &c.log)
}

/// `[moe]`.
fn validate_moe(v: &V, m: &crate::moe::MoeConfig) -> Result<(), ConfigError> {
    v.at_least(
        "moe.assemble_timeout_s",
        m.assemble_timeout_s,
        1,
        " (seconds)",
    )?;
    for (key, value) in [
        ("moe.aggregate_windows", m.aggregate_windows),
        ("moe.persistence_n", m.persistence_n),
    ] {
        if !(1..=100).contains(&value) {
            return Err(v.err(
                key,
                &value,
                "must be 1..=100; set a value in that range".into(),
            ));
        }
    }
    if m.persistence_m > m.persistence_n {
        return Err(v.err(
            "moe.persistence_m",
            &m.persistence_m,
            format!(
                "must not exceed moe.persistence_n ({}); lower it, or 0 to switch E2 off",
                m.persistence_n
            ),
        ));
    }
    Ok(())
}

/// `[agent]`.
fn validate_agent(v: &V, a: &AgentSection) -> Result<(), ConfigError> {
    v.path_set("agent.state_dir", &a.state_dir)?;
    if a.host_name.contains(['/', '\0']) || a.host_name.trim() != a.host_name {
        return Err(v.err(
            "agent.host_name",
            &format!("{:?}", a.host_name),
            "must not hold `/`, NUL or surrounding spaces (it names archive directories)".into(),
        ));
    }
    v.at_least("agent.poll_interval_ms", a.poll_interval_ms, 1, MS)?;
    v.at_least(
        "agent.checkpoint_interval_ms",
        a.checkpoint_interval_ms,
        1,
        MS,
    )?;
    v.at_least("agent.channel_records", a.channel_records as u64, 1, "")
}

/// `[sources]`.
fn validate_sources(v: &V, s: &SourcesConfig) -> Result<(), ConfigError> {
    if s.shm_enabled {
        v.path_set("sources.shm_dir", &s.shm_dir)?;
    }
    for d in &s.segment_dirs {
        v.path_set("sources.segment_dirs", d)?;
    }
    v.at_least("sources.scan_interval_ms", s.scan_interval_ms, 1, MS)?;
    v.at_least("sources.stale_after_s", s.stale_after_s, 1, " (seconds)")
}

/// `[clock]`.
fn validate_clock(v: &V, k: &ClockConfig) -> Result<(), ConfigError> {
    v.at_least("clock.sync_interval_s", k.sync_interval_s, 1, " (seconds)")?;
    if !(1..=1000).contains(&k.samples) {
        return Err(v.err("clock.samples", &k.samples, "must be in 1..=1000".into()));
    }
    v.at_least("clock.max_rtt_ms", k.max_rtt_ms, 1, MS)
}

/// `[master]`.
fn validate_master(v: &V, m: &MasterConfig) -> Result<(), ConfigError> {
    if !m.listen.is_empty() {
        v.host_port("master.listen", &m.listen, true)?;
        let (host, _) = parse_host_port(&m.listen).unwrap_or_default();
        if !is_loopback(&host) && m.token_file.as_os_str().is_empty() {
            return Err(v.err(
                "master.listen",
                &format!("{:?}", m.listen),
                "is not a loopback address and `master.token_file` is empty: set `master.token_file` (a file holding the shared token) or listen on 127.0.0.1".into(),
            ));
        }
    }
    if !m.address.is_empty() {
        v.host_port("master.address", &m.address, false)?;
        let (host, _) = parse_host_port(&m.address).unwrap_or_default();
        if !is_loopback(&host) && m.token_file.as_os_str().is_empty() {
            return Err(v.err(
                "master.address",
                &format!("{:?}", m.address),
                "is another host and `master.token_file` is empty: set `master.token_file` to the job's shared token (the same file as on the master)".into(),
            ));
        }
    }
    if !(1..=1024).contains(&m.max_message_mb) {
        return Err(v.err(
            "master.max_message_mb",
            &m.max_message_mb,
            "must be in 1..=1024 (MiB)".into(),
        ));
    }
    v.at_least("master.outbox_max_mb", m.outbox_max_mb, 1, " (MiB)")
}

/// `[http]`: an IP address and a port (the endpoint binds it as written; no name lookup).
fn validate_http(v: &V, h: &crate::http::HttpConfig) -> Result<(), ConfigError> {
    if h.enabled() && h.listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(v.err(
            "http.listen",
            &format!("{:?}", h.listen),
            "is not an IP address and port; write e.g. \"127.0.0.1:9464\" or \"[::1]:9464\", or \"\" for no endpoint".into(),
        ));
    }
    if !(1..=1024).contains(&h.max_connections) {
        return Err(v.err(
            "http.max_connections",
            &h.max_connections,
            "must be in 1..=1024".into(),
        ));
    }
    Ok(())
}

/// `[archive]`, then `[archive.object_store]`.
fn validate_archive(v: &V, ar: &ArchiveConfig) -> Result<(), ConfigError> {
    if ar.enabled {
        v.path_set("archive.dir", &ar.dir)?;
    }
    if !(-7..=19).contains(&ar.zstd_level) || ar.zstd_level == 0 {
        return Err(v.err(
            "archive.zstd_level",
            &ar.zstd_level,
            "must be in -7..=-1 (zstd's fast levels) or 1..=19 (19 smallest); 1 is the default"
                .into(),
        ));
    }
    v.at_least("archive.retention_bytes", ar.retention_bytes, 1, " (bytes)")?;
    validate_object_store(v, &ar.object_store)
}

/// `[archive.object_store]`.
fn validate_object_store(v: &V, os: &ObjectStoreConfig) -> Result<(), ConfigError> {
    if os.enabled {
        let bucket = os.bucket.trim();
        if bucket.is_empty() || bucket.contains('/') {
            return Err(v.err(
                "archive.object_store.bucket",
                &format!("{:?}", os.bucket),
                "must name a bucket (no `/`) when `archive.object_store.enabled` is true; set it or disable the upload".into(),
            ));
        }
    }
    if !os.endpoint.is_empty() {
        v.url(
            "archive.object_store.endpoint",
            &os.endpoint,
            "http://127.0.0.1:9000",
        )?;
        if os.endpoint.starts_with("http://") && !os.allow_http {
            return Err(v.err(
                "archive.object_store.endpoint",
                &format!("{:?}", os.endpoint),
                "is plain http but `archive.object_store.allow_http` is false; use https or set allow_http = true".into(),
            ));
        }
    }
    v.retry("archive.object_store", os.retry_initial_ms, os.retry_max_ms)
}

/// `[otlp]`.
fn validate_otlp(v: &V, o: &OtlpConfig) -> Result<(), ConfigError> {
    if o.enabled || !o.endpoint.is_empty() {
        let derived_needed = o.metrics_endpoint.is_empty() || o.logs_endpoint.is_empty();
        if o.endpoint.is_empty() && derived_needed {
            return Err(v.err(
                "otlp.endpoint",
                &"\"\"",
                "must be set when otlp is enabled (or set both metrics_endpoint and logs_endpoint)"
                    .into(),
            ));
        }
        if !o.endpoint.is_empty() {
            v.url("otlp.endpoint", &o.endpoint, "http://127.0.0.1:4318")?;
        }
    }
    if !o.metrics_endpoint.is_empty() {
        v.url(
            "otlp.metrics_endpoint",
            &o.metrics_endpoint,
            "http://127.0.0.1:8428/opentelemetry/v1/metrics",
        )?;
    }
    if !o.logs_endpoint.is_empty() {
        v.url(
            "otlp.logs_endpoint",
            &o.logs_endpoint,
            "http://127.0.0.1:4318/v1/logs",
        )?;
    }
    for h in &o.headers {
        if crate::sinks::otlp::transport::parse_header(h).is_none() {
            // The value may be a secret: only the name part is shown.
            let name = h.split_once('=').map_or(h.as_str(), |(k, _)| k);
            return Err(v.err(
                "otlp.headers",
                &format!("{name:?}=..."),
                "is not \"name=value\" with a valid HTTP header name and value; write e.g. \"authorization=Bearer TOKEN\"".into(),
            ));
        }
    }
    v.at_least("otlp.export_interval_ms", o.export_interval_ms, 1, MS)?;
    v.at_least("otlp.timeout_ms", o.timeout_ms, 1, MS)?;
    v.at_least("otlp.max_series", o.max_series as u64, 1, "")?;
    v.at_least("otlp.max_backlog", o.max_backlog as u64, 1, "")?;
    v.retry("otlp", o.retry_initial_ms, o.retry_max_ms)
}

/// `[steps]` (the templates are loaded once to check them).
fn validate_steps(v: &V, st: &StepsConfig) -> Result<(), ConfigError> {
    v.at_least("steps.safe_window_ms", st.safe_window_ms, 1, MS)?;
    v.at_least("steps.settle_ops", st.settle_ops, 1, "")?;
    v.at_least("steps.max_held_ops", st.max_held_ops, 1, "")?;
    v.at_least("steps.breaker_minutes", st.breaker_minutes, 1, " (minutes)")?;
    v.at_least("steps.stream_end_s", st.stream_end_s, 1, " (seconds)")?;
    if st.enabled {
        if let Err(e) = st.templates() {
            return Err(v.err(
                "steps.templates_dir",
                &st.templates_dir.display(),
                format!(
                    "{e}; fix the file or leave templates_dir empty for the built-in templates"
                ),
            ));
        }
    }
    Ok(())
}

/// `[straggler]`.
fn validate_straggler(v: &V, sg: &StragglerConfig) -> Result<(), ConfigError> {
    if !(0.0..=100.0).contains(&sg.threshold) {
        return Err(v.err(
            "straggler.threshold",
            &sg.threshold,
            "must be in 0..=100 (percent of the step time)".into(),
        ));
    }
    v.at_least("straggler.window_steps", sg.window_steps, 1, "")?;
    if !(1..=sg.window_steps).contains(&sg.min_steps_over) {
        return Err(v.err(
            "straggler.min_steps_over",
            &sg.min_steps_over,
            format!(
                "must be in 1..={} (straggler.window_steps)",
                sg.window_steps
            ),
        ));
    }
    v.at_least("straggler.report_steps", sg.report_steps, 1, "")?;
    v.at_least("straggler.settle_s", sg.settle_s, 1, " (seconds)")
}

/// `[log]`.
fn validate_log(v: &V, l: &LogConfig) -> Result<(), ConfigError> {
    if !is_log_filter(&l.level) {
        return Err(v.err(
            "log.level",
            &format!("{:?}", l.level),
            "expected error, warn, info, debug, trace or a tracing filter such as \"info,comminsight_agent=debug\"".into(),
        ));
    }
    if !LOG_FORMATS.contains(&l.format.as_str()) {
        return Err(v.err(
            "log.format",
            &format!("{:?}", l.format),
            format!("expected one of {}", quote_list(LOG_FORMATS)),
        ));
    }
    Ok(())
}
