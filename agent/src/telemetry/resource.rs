//! The OTLP resource of this agent: `service.name` (`comminsight-agent`, or `OTEL_SERVICE_NAME`),
//! `service.version`, `service.instance.id` (the agent's host name: stable across restarts and
//! distinct per agent, which keeps Prometheus' and Mimir's `instance` apart), `host.name`,
//! `host.id` (`/etc/machine-id` when readable), then `OTEL_RESOURCE_ATTRIBUTES`
//! (`key=value,...`, values percent-decoded) over those, as the OpenTelemetry SDKs do.

/// `OTEL_RESOURCE_ATTRIBUTES` is malformed.
#[derive(Debug, thiserror::Error)]
#[error("OTEL_RESOURCE_ATTRIBUTES: entry {entry:?} {reason}; write key=value pairs separated by commas, values percent-encoded")]
pub struct ResourceError {
    /// The offending entry.
    pub entry: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Default `service.name`.
pub const SERVICE_NAME: &str = "comminsight-agent";

/// The resource attributes, in a stable order, keys unique. `env` looks up environment
/// variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`); `machine_id` is the content of
/// `/etc/machine-id` when known.
pub fn attributes(
    host: &str,
    machine_id: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ResourceError> {
    let mut out: Vec<(String, String)> = vec![
        ("service.name".into(), SERVICE_NAME.into()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
        ("service.instance.id".into(), host.into()),
        ("host.name".into(), host.into()),
    ];
    if let Some(id) = machine_id.map(str::trim).filter(|s| !s.is_empty()) {
        out.push(("host.id".into(), id.into()));
    }
    if let Some(list) = env("OTEL_RESOURCE_ATTRIBUTES") {
        for (k, v) in parse_list(&list)? {
            set(&mut out, k, v);
        }
    }
    if let Some(name) = env("OTEL_SERVICE_NAME").filter(|s| !s.trim().is_empty()) {
        set(&mut out, "service.name".into(), name.trim().into());
    }
    Ok(out)
}

/// The resource of this process: [`attributes`] with the real environment and machine id.
pub fn detect(host: &str) -> Result<Vec<(String, String)>, ResourceError> {
    let machine_id = std::fs::read_to_string("/etc/machine-id").ok();
    attributes(host, machine_id.as_deref(), &|k| std::env::var(k).ok())
}

fn set(out: &mut Vec<(String, String)>, k: String, v: String) {
    match out.iter_mut().find(|(key, _)| *key == k) {
        Some(e) => e.1 = v,
        None => out.push((k, v)),
    }
}

/// `key=value,key2=value2` (whitespace around entries ignored, values percent-decoded).
fn parse_list(list: &str) -> Result<Vec<(String, String)>, ResourceError> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let err = |reason| ResourceError {
            entry: entry.to_owned(),
            reason,
        };
        let (k, v) = entry.split_once('=').ok_or_else(|| err("has no '='"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(err("has an empty key"));
        }
        let v = percent_decode(v.trim()).ok_or_else(|| err("has a bad %-escape"))?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(a: &'a [(String, String)], k: &str) -> Option<&'a str> {
        a.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn full_resource_with_environment_overrides() {
        let env = |k: &str| match k {
            "OTEL_RESOURCE_ATTRIBUTES" => Some(
                "deployment.environment.name=prod, k8s.cluster.name=a%2Cb,service.name=x".into(),
            ),
            "OTEL_SERVICE_NAME" => Some("ci-agent".into()),
            _ => None,
        };
        let a = attributes("node-7", Some("abc123\n"), &env).unwrap();
        assert_eq!(get(&a, "service.name"), Some("ci-agent"));
        assert_eq!(get(&a, "service.instance.id"), Some("node-7"));
        assert_eq!(get(&a, "host.name"), Some("node-7"));
        assert_eq!(get(&a, "host.id"), Some("abc123"));
        assert_eq!(get(&a, "k8s.cluster.name"), Some("a,b"));
        assert_eq!(get(&a, "deployment.environment.name"), Some("prod"));
        assert!(get(&a, "service.version").is_some());
        let keys: std::collections::BTreeSet<_> = a.iter().map(|(k, _)| k).collect();
        assert_eq!(keys.len(), a.len(), "keys unique");
    }

    #[test]
    fn malformed_attributes_are_one_clear_line() {
        let env = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES").then(|| "a=1,oops".to_string());
        let e = attributes("h", None, &env).unwrap_err().to_string();
        assert!(
            e.starts_with("OTEL_RESOURCE_ATTRIBUTES: entry \"oops\" has no '='"),
            "{e}"
        );
        let env = |k: &str| (k == "OTEL_RESOURCE_ATTRIBUTES").then(|| "a=%zz".to_string());
        assert!(attributes("h", None, &env).is_err());
        let none = |_: &str| None;
        let a = attributes("h", None, &none).unwrap();
        assert_eq!(get(&a, "service.name"), Some(SERVICE_NAME));
        assert_eq!(get(&a, "host.id"), None);
    }
}
