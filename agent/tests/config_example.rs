//! `agent/config.example.toml` is generated from the defaults and documents every key.

use comminsight_agent::config::{self, example, keys, AgentConfig};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config.example.toml");

#[test]
fn config_example_up_to_date() {
    let want = config::example_toml();
    if std::env::var_os("COMMINSIGHT_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(EXAMPLE, &want).expect("write agent/config.example.toml");
    }
    let have = std::fs::read_to_string(EXAMPLE).unwrap_or_default();
    assert!(
        have == want,
        "agent/config.example.toml differs from the generated text: run \
         `cargo run -p comminsight-agent -- config example > agent/config.example.toml` or \
         `COMMINSIGHT_BLESS=1 cargo test -p comminsight-agent --test config_example`"
    );
}

#[test]
fn every_default_key_has_a_doc_line() {
    let (missing, extra) = example::undocumented_keys();
    assert!(
        missing.is_empty(),
        "keys without a line in config::keys::KEYS: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "KEYS lines without a field in AgentConfig: {extra:?}"
    );
    for k in keys::KEYS {
        assert!(!k.doc.trim().is_empty(), "{} has an empty doc line", k.path);
    }
}

#[test]
fn example_parses_back_to_the_defaults() {
    let text = config::example_toml();
    let parsed: AgentConfig = toml::from_str(&text).expect("example parses");
    assert_eq!(parsed, AgentConfig::default());
    // Through the loader too (its own type and validation checks).
    let dir = std::env::temp_dir().join(format!("comminsight-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("agent.toml");
    std::fs::write(&f, &text).unwrap();
    let loaded = AgentConfig::load(Some(&f), &[]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(loaded.unwrap(), AgentConfig::default());
    for k in keys::KEYS {
        assert!(
            text.contains(&format!("# env: {}\n", k.env_name())),
            "{}",
            k.path
        );
        assert!(text.contains(k.doc), "{}", k.path);
    }
}

#[test]
fn default_values_match_their_kinds() {
    let defaults = example::defaults_value();
    for k in keys::KEYS {
        let v = example::lookup(&defaults, k.path).expect(k.path);
        let ok = match k.kind {
            keys::ValueKind::Bool => v.is_bool(),
            keys::ValueKind::Int { min, max } => {
                v.as_integer().is_some_and(|i| (min..=max).contains(&i))
            }
            keys::ValueKind::Float { min, max } => {
                v.as_float().is_some_and(|f| (min..=max).contains(&f))
            }
            keys::ValueKind::Str | keys::ValueKind::Path => v.is_str(),
            keys::ValueKind::OneOf(names) => v.as_str().is_some_and(|s| names.contains(&s)),
            keys::ValueKind::PathList | keys::ValueKind::StrList => v.is_array(),
        };
        assert!(
            ok,
            "{}: default {v} does not match its kind {:?}",
            k.path, k.kind
        );
    }
}
