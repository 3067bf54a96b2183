//! `AgentConfig::load`: file, environment overrides, validation and the one-line error messages.

use std::path::{Path, PathBuf};

use comminsight_agent::config::{
    self, keys, load_with_warnings, AgentConfig, ConfigError, OtlpProtocol,
};

/// A temp dir removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "comminsight-config-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("create dir");
        std::fs::write(&p, text).expect("write file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn load_text(text: &str, e: &[(&str, &str)]) -> Result<AgentConfig, ConfigError> {
    let d = TempDir::new("load");
    let f = d.write("agent.toml", text);
    AgentConfig::load(Some(&f), &env(e))
}

fn err_text(text: &str, e: &[(&str, &str)]) -> String {
    let err = load_text(text, e).expect_err("expected an error");
    let msg = err.to_string();
    assert!(!msg.contains('\n'), "error is not one line: {msg}");
    msg
}

#[test]
fn empty_file_and_explicit_missing_file() {
    assert_eq!(load_text("", &[]).unwrap(), AgentConfig::default());
    let d = TempDir::new("missing");
    let missing = d.0.join("nope.toml");
    let e = AgentConfig::load(Some(&missing), &[]).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    assert!(e.to_string().contains("nope.toml"), "{e}");
}

#[test]
fn default_path_absent_means_defaults_plus_env() {
    if Path::new(config::DEFAULT_PATH).exists() {
        // A real installation: its file is not ours to judge. The explicit-path tests cover loading.
        return;
    }
    let c = AgentConfig::load(None, &env(&[("COMMINSIGHT_CLOCK_SAMPLES", "3")])).unwrap();
    assert_eq!(c.clock.samples, 3);
    assert_eq!(c.otlp, AgentConfig::default().otlp);
}

#[test]
fn file_values_are_read() {
    let c = load_text(
        r#"
[agent]
host_name = "node7"
poll_interval_ms = 20
[sources]
segment_dirs = ["/a", "/b"]
[otlp]
enabled = true
protocol = "grpc"
endpoint = "http://collector:4317"
[archive.object_store]
enabled = true
bucket = "traces"
endpoint = "http://127.0.0.1:9000"
allow_http = true
"#,
        &[],
    )
    .unwrap();
    assert_eq!(c.agent.host_name, "node7");
    assert_eq!(c.agent.poll_interval_ms, 20);
    assert_eq!(
        c.sources.segment_dirs,
        vec![PathBuf::from("/a"), PathBuf::from("/b")]
    );
    assert_eq!(c.otlp.protocol, OtlpProtocol::Grpc);
    assert!(c.archive.object_store.enabled);
    assert_eq!(c.archive.object_store.bucket, "traces");
    assert_eq!(
        c.archive.zstd_level,
        AgentConfig::default().archive.zstd_level
    );
}

#[test]
fn env_overrides_file() {
    let c = load_text(
        "[otlp]\nexport_interval_ms = 5000\n",
        &[
            ("COMMINSIGHT_OTLP_EXPORT_INTERVAL_MS", "250"),
            ("COMMINSIGHT_SOURCES_SEGMENT_DIRS", "/x, /y,,"),
            ("COMMINSIGHT_ARCHIVE_OBJECT_STORE_BUCKET", "b1"),
            ("COMMINSIGHT_ARCHIVE_OBJECT_STORE_ENABLED", "true"),
            ("COMMINSIGHT_SOURCES_SHM_ENABLED", "0"),
            ("COMMINSIGHT_OTLP_PROTOCOL", "grpc"),
            ("COMMINSIGHT_LOG_FORMAT", "json"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(c.otlp.export_interval_ms, 250);
    assert_eq!(
        c.sources.segment_dirs,
        vec![PathBuf::from("/x"), PathBuf::from("/y")]
    );
    assert_eq!(c.archive.object_store.bucket, "b1");
    assert!(c.archive.object_store.enabled);
    assert!(!c.sources.shm_enabled);
    assert_eq!(c.otlp.protocol, OtlpProtocol::Grpc);
    assert_eq!(c.log.format, "json");
}

#[test]
fn every_key_has_a_working_env_variable() {
    let d = TempDir::new("everykey");
    let f = d.write("agent.toml", "");
    // A template directory must hold valid templates (checked on load).
    let tpl = d.write(
        "templates/megatron.toml",
        include_str!("../../templates/megatron.toml"),
    );
    let tpl_dir = tpl.parent().unwrap().to_str().unwrap().to_string();
    for k in keys::KEYS {
        // A valid non-default value of the key's type, set through its variable.
        let raw = match k.kind {
            keys::ValueKind::Bool => "false",
            // m of n: m must not exceed n (5 by default).
            keys::ValueKind::Int { .. }
                if k.path == "straggler.min_steps_over" || k.path == "moe.persistence_m" =>
            {
                "2"
            }
            // Sampling intervals are at least 100 ms, the GPU ones and timeouts at least 10.
            keys::ValueKind::Int { .. }
                if k.path.ends_with("interval_ms") || k.path == "gpu.dcgm_timeout_ms" =>
            {
                "700"
            }
            keys::ValueKind::Int { .. } => "7",
            keys::ValueKind::Float { .. } => "7.5",
            keys::ValueKind::Path if k.path == "steps.templates_dir" => tpl_dir.as_str(),
            keys::ValueKind::Path | keys::ValueKind::PathList => "/tmp/x",
            keys::ValueKind::StrList if k.path == "otlp.headers" => "x-scope=a",
            keys::ValueKind::StrList => "host0",
            keys::ValueKind::OneOf(names) => names[names.len() - 1],
            keys::ValueKind::Str => match k.path {
                "log.level" => "debug",
                "master.listen" | "master.address" | "http.listen" => "127.0.0.1:9",
                p if p.contains("endpoint") || p.ends_with("_url") => "http://10.0.0.1:1",
                _ => "s3",
            },
        };
        let mut e = env(&[(&k.env_name(), raw)]);
        if k.path == "archive.object_store.endpoint" {
            e.extend(env(&[("COMMINSIGHT_ARCHIVE_OBJECT_STORE_ALLOW_HTTP", "1")]));
        }
        if k.path.ends_with("retry_initial_ms") {
            e.extend(env(&[(&k.env_name().replace("INITIAL", "MAX"), "7")]));
        }
        if k.path.ends_with("retry_max_ms") {
            e.extend(env(&[(&k.env_name().replace("MAX", "INITIAL"), "7")]));
        }
        let c = AgentConfig::load(Some(&f), &e)
            .unwrap_or_else(|err| panic!("{}={raw}: {err}", k.env_name()));
        let got = toml::Value::try_from(&c).unwrap();
        let mut v = &got;
        for p in k.path.split('.') {
            v = &v[p];
        }
        let shown = match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Array(a) => a[0].as_str().unwrap().to_string(),
            other => other.to_string(),
        };
        assert_eq!(shown, raw, "{} did not set {}", k.env_name(), k.path);
    }
}

#[test]
fn unknown_file_key_names_it_and_suggests() {
    let m = err_text("[otlp]\nendpiont = \"http://x:1\"\n", &[]);
    assert!(
        m.contains("agent.toml: unknown key `otlp.endpiont` (did you mean `otlp.endpoint`?)"),
        "{m}"
    );
    assert!(m.contains("config.example.toml"), "{m}");
    let m = err_text("[otpl]\nenabled = true\n", &[]);
    assert!(
        m.contains("unknown key `otpl` (did you mean `otlp`?)"),
        "{m}"
    );
    let m = err_text("[archive.object_store]\nbuckets = \"b\"\n", &[]);
    assert!(
        m.contains("`archive.object_store.buckets` (did you mean `archive.object_store.bucket`?)"),
        "{m}"
    );
    let m = err_text("[agent]\nzzzzzzzzz = 1\n", &[]);
    assert!(m.contains("unknown key `agent.zzzzzzzzz`;"), "{m}");
}

#[test]
fn wrong_types_in_the_file() {
    let m = err_text("[otlp]\nexport_interval_ms = \"10s\"\n", &[]);
    assert!(
        m.contains(
            "`otlp.export_interval_ms` = \"10s\": expected a non-negative integer (milliseconds)"
        ),
        "{m}"
    );
    let m = err_text("[otlp]\nprotocol = \"grpcs\"\n", &[]);
    assert!(
        m.contains("expected one of \"http/protobuf\", \"grpc\""),
        "{m}"
    );
    let m = err_text("otlp = 3\n", &[]);
    assert!(m.contains("is a table"), "{m}");
    let m = err_text("[sources]\nsegment_dirs = \"/a\"\n", &[]);
    assert!(m.contains("expected a list of paths"), "{m}");
    let m = err_text("[agent]\npoll_interval_ms = -5\n", &[]);
    assert!(m.contains("poll_interval_ms"), "{m}");
    let m = err_text("[straggler]\nthreshold = 101\n", &[]);
    assert!(m.contains("expected a number in 0..=100"), "{m}");
    let m = err_text("", &[("COMMINSIGHT_STRAGGLER_THRESHOLD", "high")]);
    assert!(m.contains("COMMINSIGHT_STRAGGLER_THRESHOLD=high"), "{m}");
    // An integer is a number too.
    let c = load_text("[straggler]\nthreshold = 12\n", &[]).unwrap();
    assert_eq!(c.straggler.threshold, 12.0);
}

#[test]
fn gap_factor_takes_integers_and_fractions() {
    // Integers load as they did when the key was an integer (file and environment).
    let c = load_text("[hang]\ngap_factor = 2\n", &[]).unwrap();
    assert_eq!(c.hang.gap_factor, 2.0);
    let c = load_text("", &[("COMMINSIGHT_HANG_GAP_FACTOR", "3")]).unwrap();
    assert_eq!(c.hang.gap_factor, 3.0);
    let c = load_text("[hang]\ngap_factor = 0\n", &[]).unwrap();
    assert_eq!(c.hang.settings().gap_factor, 0.0);
    // The analysis takes a fraction: so does the key now.
    let c = load_text("[hang]\ngap_factor = 1.5\n", &[]).unwrap();
    assert_eq!(c.hang.settings().gap_factor, 1.5);
    let c = load_text(
        "[hang]\ngap_factor = 1.5\n",
        &[("COMMINSIGHT_HANG_GAP_FACTOR", "2.5")],
    )
    .unwrap();
    assert_eq!(c.hang.gap_factor, 2.5);
    // Negative, not a number, infinite: refused, naming the key.
    let m = err_text("[hang]\ngap_factor = -1\n", &[]);
    assert!(
        m.contains("`hang.gap_factor` = -1: expected a number in 0..="),
        "{m}"
    );
    let m = err_text("[hang]\ngap_factor = nan\n", &[]);
    assert!(
        m.contains("`hang.gap_factor` = nan: expected a number"),
        "{m}"
    );
    let m = err_text("", &[("COMMINSIGHT_HANG_GAP_FACTOR", "-1")]);
    assert!(
        m.starts_with("COMMINSIGHT_HANG_GAP_FACTOR=-1: expected a number in 0..="),
        "{m}"
    );
    let m = err_text("", &[("COMMINSIGHT_HANG_GAP_FACTOR", "inf")]);
    assert!(m.starts_with("COMMINSIGHT_HANG_GAP_FACTOR=inf: "), "{m}");
}

#[test]
fn syntax_error_has_line_and_column() {
    let m = err_text("[agent]\nhost_name = \"a\"\npoll_interval_ms = = 3\n", &[]);
    assert!(m.contains("agent.toml:3:"), "{m}");
    assert!(m.contains("invalid TOML"), "{m}");
}

#[test]
fn bad_env_values_name_the_variable() {
    let m = err_text("", &[("COMMINSIGHT_OTLP_EXPORT_INTERVAL_MS", "abc")]);
    assert!(m.starts_with("COMMINSIGHT_OTLP_EXPORT_INTERVAL_MS=abc: expected a non-negative integer (milliseconds)"), "{m}");
    let m = err_text("", &[("COMMINSIGHT_OTLP_ENABLED", "maybe")]);
    assert!(
        m.starts_with("COMMINSIGHT_OTLP_ENABLED=maybe: expected `true` or `false`"),
        "{m}"
    );
    let m = err_text("", &[("COMMINSIGHT_CLOCK_SAMPLES", "0")]);
    assert!(
        m.starts_with("COMMINSIGHT_CLOCK_SAMPLES=0 (`clock.samples`): must be in 1..=1000"),
        "{m}"
    );
}

#[test]
fn validation_errors_name_key_and_fix() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "[otlp]\nexport_interval_ms = 0\n",
            "otlp.export_interval_ms",
            "must be at least 1",
        ),
        (
            "[archive]\nzstd_level = 22\n",
            "archive.zstd_level",
            "1..=19",
        ),
        (
            "[straggler]\nwindow_steps = 4\nmin_steps_over = 5\n",
            "straggler.min_steps_over",
            "must be in 1..=4",
        ),
        (
            "[otlp]\nenabled = true\nendpoint = \"ftp://h:1\"\n",
            "otlp.endpoint",
            "scheme must be http or https",
        ),
        (
            "[otlp]\nendpoint = \"http://h:port\"\n",
            "otlp.endpoint",
            "not a port number",
        ),
        (
            "[otlp]\nmetrics_endpoint = \"http:///v1\"\n",
            "otlp.metrics_endpoint",
            "missing host",
        ),
        (
            "[archive.object_store]\nenabled = true\n",
            "archive.object_store.bucket",
            "must name a bucket",
        ),
        (
            "[archive.object_store]\nendpoint = \"http://127.0.0.1:9000\"\n",
            "archive.object_store.endpoint",
            "allow_http",
        ),
        (
            "[otlp]\nretry_initial_ms = 5000\nretry_max_ms = 10\n",
            "otlp.retry_max_ms",
            "must be at least `otlp.retry_initial_ms`",
        ),
        (
            "[master]\naddress = \"nohost\"\n",
            "master.address",
            "missing `:port`",
        ),
        (
            "[master]\naddress = \"10.0.0.1:0\"\n",
            "master.address",
            "port 0",
        ),
        (
            "[master]\nlisten = \"::1:7117\"\n",
            "master.listen",
            "brackets",
        ),
        (
            "[master]\nlisten = \"0.0.0.0:7117\"\n",
            "master.listen",
            "token_file",
        ),
        (
            "[master]\nlisten = \"\"\naddress = \"10.0.0.1:7117\"\n",
            "master.address",
            "token_file",
        ),
        (
            "[log]\nlevel = \"verbose!!\"\n",
            "log.level",
            "tracing filter",
        ),
        (
            "[log]\nformat = \"xml\"\n",
            "log.format",
            "\"text\", \"json\"",
        ),
        ("[agent]\nhost_name = \"a/b\"\n", "agent.host_name", "`/`"),
        (
            "[agent]\nstate_dir = \"\"\n",
            "agent.state_dir",
            "must not be empty",
        ),
        ("[otlp]\nmax_series = 0\n", "otlp.max_series", "at least 1"),
    ];
    for (text, key, fix) in cases {
        let d = TempDir::new("validate");
        let f = d.write("agent.toml", text);
        let e = AgentConfig::load(Some(&f), &[]).expect_err(text);
        let m = e.to_string();
        assert_eq!(e.key(), Some(*key), "{text}: {m}");
        assert!(
            m.starts_with(&format!("{}: `{key}` = ", f.display())),
            "{m}"
        );
        assert!(m.contains(fix), "{text}: {m}");
        assert!(!m.contains('\n'), "{m}");
    }
    // Accepted forms of the same keys.
    load_text(
        "[master]\nlisten = \"[::1]:0\"\naddress = \"master.example:7117\"\ntoken_file = \"/etc/comminsight/token\"\n[log]\nlevel = \"info,comminsight_agent=debug\"\n",
        &[],
    )
    .unwrap();
    load_text(
        "[master]\nlisten = \"0.0.0.0:7117\"\ntoken_file = \"/etc/comminsight/token\"\n",
        &[],
    )
    .unwrap();
}

#[test]
fn unknown_comminsight_variables_warn_plugin_variables_do_not() {
    let d = TempDir::new("warn");
    let f = d.write("agent.toml", "");
    let l = load_with_warnings(
        Some(&f),
        &env(&[
            ("COMMINSIGHT_OTLP_ENDPIONT", "http://x:1"),
            ("COMMINSIGHT_LOG_DIR", "/var/log/comminsight"),
            ("COMMINSIGHT_SHM_DIR", "/dev/shm/x"),
            ("COMMINSIGHT_JOB_ID", "7"),
            ("COMMINSIGHT_TESTBED_SEED", "1"),
            ("OTHER_VAR", "1"),
        ]),
    )
    .unwrap();
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0].contains("COMMINSIGHT_OTLP_ENDPIONT"),
        "{:?}",
        l.warnings
    );
    assert!(
        l.warnings[0].contains("did you mean COMMINSIGHT_OTLP_ENDPOINT?"),
        "{:?}",
        l.warnings
    );
    assert_eq!(l.config, AgentConfig::default());
}

#[test]
fn plugin_variables_of_the_contract_are_known() {
    let contracts =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/contracts.md"))
            .expect("docs/contracts.md");
    let mut seen = 0;
    for line in contracts.lines() {
        let Some(rest) = line.strip_prefix("| `COMMINSIGHT_") else {
            continue;
        };
        let name = format!("COMMINSIGHT_{}", rest.split('`').next().unwrap());
        seen += 1;
        assert!(
            keys::is_foreign_var(&name),
            "{name} is a plugin variable in docs/contracts.md: add it to config::keys::FOREIGN_VARS"
        );
        assert!(
            keys::KEYS.iter().all(|k| k.env_name() != name),
            "{name} is both a plugin variable and an agent key"
        );
    }
    assert!(
        seen >= 10,
        "found only {seen} plugin variables in docs/contracts.md"
    );
}

#[test]
fn check_reads_only_the_file() {
    let d = TempDir::new("check");
    let f = d.write("agent.toml", "[clock]\nsamples = 4\n");
    assert_eq!(config::check(&f).unwrap().clock.samples, 4);
    let bad = d.write("bad.toml", "[clock]\nsamples = 0\n");
    let m = config::check(&bad).unwrap_err().to_string();
    assert!(m.contains("bad.toml: `clock.samples` = 0"), "{m}");
}
