//! Template format, validation errors, matchers and the shipped set.

mod testbed;

use std::path::{Path, PathBuf};

use comminsight_wire::roles::Role;
use comminsight_wire::Func;

use super::*;
use crate::steps::StepOp;

const GOOD: &str = r#"format = 1

[[template]]
name = "t1"
version = 2
priority = 7
description = "one"
requires = ["dp", "ep.AllToAll"]
forbids = ["pp.Send"]
open = [[{ role = "tp", func = "AllReduce" }], [{ func = "Recv" }]]
anchor = [[{ role = "global", func = "AllReduce", size = "tiny" }]]
close = [[{ role = "dp" }, { role = "any", func = "any", size = "large" }]]
"#;

fn op(role: Option<Role>, func: Func, bytes: u64) -> StepOp {
    StepOp {
        comm_hash: 1,
        role,
        func,
        bytes,
        coll_sn: 0,
        coll_local_sn: 0,
        start_us: 0,
    }
}

fn err(text: &str) -> TemplateError {
    match TemplateSet::parse("t.toml", text) {
        Ok(v) => panic!("expected an error, parsed {} templates", v.len()),
        Err(e) => e,
    }
}

/// `text` with line `line` (1-based) replaced by `with`.
fn edit(text: &str, line: usize, with: &str) -> String {
    let mut v: Vec<&str> = text.lines().collect();
    v[line - 1] = with;
    v.join("\n") + "\n"
}

/// The error is at `t.toml:line` and its one-line message says so and contains `needle`.
fn assert_at(e: &TemplateError, line: usize, needle: &str) {
    let msg = e.to_string();
    assert_eq!((e.file(), e.line()), ("t.toml", line), "{msg}");
    assert!(msg.starts_with(&format!("t.toml:{line}: ")), "{msg}");
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn a_good_file_parses_into_the_contract_types() {
    let v = TemplateSet::parse("t.toml", GOOD).unwrap();
    assert_eq!(v.len(), 1);
    let t = &v[0];
    assert_eq!((t.name.as_str(), t.version, t.priority), ("t1", 2, 7));
    assert_eq!((t.file.as_str(), t.file_version, t.line), ("t.toml", 1, 4));
    assert_eq!(t.requires, ["dp", "ep.AlltoAll"], "canonical spelling");
    assert_eq!(t.forbids, ["pp.Send"]);
    let m = |role, func, size| OpMatch { role, func, size };
    assert_eq!(
        t.open,
        vec![
            vec![m(Some(Role::Tp), Some(Func::ALL_REDUCE), None)],
            vec![m(None, Some(Func::RECV), None)]
        ]
    );
    assert_eq!(
        t.anchor,
        vec![vec![m(
            Some(Role::Global),
            Some(Func::ALL_REDUCE),
            Some(SizeClass::Tiny)
        )]]
    );
    assert_eq!(
        t.close,
        vec![vec![
            m(Some(Role::Dp), None, None),
            m(None, None, Some(SizeClass::Large))
        ]]
    );
    assert_eq!(t.close[0][1].to_string(), "*:*:large");
}

#[test]
fn size_classes_split_at_their_borders() {
    use SizeClass::*;
    for (bytes, class) in [
        (0, Tiny),
        (1024, Tiny),
        (1025, Small),
        (65_536, Small),
        (65_537, Medium),
        (4 << 20, Medium),
        ((4 << 20) + 1, Large),
        (u64::MAX, Large),
    ] {
        assert_eq!(SizeClass::of(bytes), class, "{bytes} bytes");
    }
    let tiny = OpMatch {
        role: None,
        func: Some(Func::ALL_REDUCE),
        size: Some(Tiny),
    };
    assert!(tiny.matches(&op(None, Func::ALL_REDUCE, 1024)));
    assert!(!tiny.matches(&op(None, Func::ALL_REDUCE, 1025)));
    let medium = OpMatch {
        size: Some(Medium),
        ..tiny.clone()
    };
    assert!(!medium.matches(&op(None, Func::ALL_REDUCE, 65_536)));
    assert!(medium.matches(&op(None, Func::ALL_REDUCE, 65_537)));
    assert!(medium.matches(&op(None, Func::ALL_REDUCE, 4 << 20)));
    assert!(!medium.matches(&op(None, Func::ALL_REDUCE, (4 << 20) + 1)));
}

#[test]
fn matchers_compare_role_and_function() {
    let dp_ar = OpMatch {
        role: Some(Role::Dp),
        func: Some(Func::ALL_REDUCE),
        size: None,
    };
    assert!(dp_ar.matches(&op(Some(Role::Dp), Func::ALL_REDUCE, 1 << 30)));
    assert!(!dp_ar.matches(&op(Some(Role::Tp), Func::ALL_REDUCE, 8)));
    assert!(!dp_ar.matches(&op(Some(Role::Dp), Func::ALL_GATHER, 8)));
    assert!(
        !dp_ar.matches(&op(None, Func::ALL_REDUCE, 8)),
        "unknown role"
    );
    let any_recv = OpMatch {
        role: None,
        func: Some(Func::RECV),
        size: None,
    };
    assert!(any_recv.matches(&op(None, Func::RECV, 8)));
    assert!(any_recv.matches(&op(Some(Role::Pp), Func::RECV, 8)));
    assert!(!any_recv.matches(&op(Some(Role::Pp), Func::SEND, 8)));
}

#[test]
fn unknown_keys_are_errors_at_their_line() {
    assert_at(&err(&edit(GOOD, 6, "colour = 1")), 6, "colour");
    assert_at(&err(&format!("flavour = 1\n{GOOD}")), 1, "flavour");
    let e = err(&edit(
        GOOD,
        12,
        r#"close = [[{ role = "dp", fun = "AllReduce" }]]"#,
    ));
    assert_at(&e, 12, "fun");
}

#[test]
fn missing_and_wrong_format_are_errors() {
    assert_at(&err(&edit(GOOD, 1, "")), 1, "format = 1");
    assert_at(&err(&edit(GOOD, 1, "format = 2")), 1, "`format` is 2");
    assert_at(&err("format = 1\n"), 1, "no `[[template]]`");
    assert_at(&err("format = 1\nx = [\n"), 3, "TOML");
}

#[test]
fn missing_required_keys_name_the_template_line() {
    for (line, key) in [(4, "name"), (5, "version"), (6, "priority")] {
        let e = err(&edit(GOOD, line, ""));
        assert_at(&e, 3, &format!("no `{key}`"));
    }
    assert_at(&err(&edit(GOOD, 12, "")), 3, "no `close`");
}

#[test]
fn bad_values_name_key_line_and_vocabulary() {
    assert_at(
        &err(&edit(GOOD, 5, "version = 0")),
        5,
        "bad `version` value `0`",
    );
    assert_at(
        &err(&edit(GOOD, 6, r#"priority = "high""#)),
        6,
        "invalid type",
    );
    assert_at(&err(&edit(GOOD, 4, r#"name = "a b""#)), 4, "bad `name`");
    assert_at(
        &err(&edit(GOOD, 8, r#"requires = ["dp", "xp"]"#)),
        8,
        "bad `requires` value `xp`",
    );
    assert_at(
        &err(&edit(GOOD, 9, r#"forbids = ["dp.Foo"]"#)),
        9,
        "bad `forbids` value `dp.Foo`",
    );
    assert_at(
        &err(&edit(GOOD, 9, r#"forbids = ["any"]"#)),
        9,
        "`forbids` value `any`",
    );
    let e = err(&edit(GOOD, 10, r#"open = [[{ role = "xp" }]]"#));
    assert_at(&e, 10, "bad `role` value `xp`; use global, dp");
    let e = err(&edit(GOOD, 10, r#"open = [[{ func = "AllReduced" }]]"#));
    assert_at(
        &e,
        10,
        "bad `func` value `AllReduced`; use NCCL's spelling: Broadcast",
    );
    let e = err(&edit(GOOD, 10, r#"open = [[{ func = "Unknown" }]]"#));
    assert_at(&e, 10, "bad `func` value `Unknown`");
    let e = err(&edit(
        GOOD,
        10,
        r#"open = [[{ role = "dp", size = "huge" }]]"#,
    ));
    assert_at(&e, 10, "bad `size` value `huge`; use tiny");
}

#[test]
fn empty_sequences_and_matchers_are_errors() {
    assert_at(
        &err(&edit(GOOD, 10, "open = []")),
        10,
        "`open` has an empty alternative list",
    );
    let e = err(&edit(GOOD, 11, r#"anchor = [[{ role = "dp" }], []]"#));
    assert_at(&e, 11, "`anchor` has an empty sequence");
    let multi = edit(GOOD, 12, "close = [\n  [],\n]");
    assert_at(&err(&multi), 13, "`close` has an empty sequence");
    let e = err(&edit(GOOD, 12, r#"close = [[{ size = "tiny" }]]"#));
    assert_at(&e, 12, "neither `role` nor `func`");
    // `close = []` is the one empty list allowed: a workload without a closing signature.
    let open_ended = TemplateSet::parse("t.toml", &edit(GOOD, 12, "close = []")).unwrap();
    assert!(open_ended[0].close.is_empty());
}

#[test]
fn duplicates_inside_a_file_are_errors() {
    let two = format!(
        "{GOOD}\n[[template]]\nname = \"t1\"\nversion = 1\npriority = 8\n{}",
        &GOOD[GOOD.find("open").unwrap()..]
    );
    let e = err(&two);
    assert_at(&e, 15, "duplicate template name `t1` (also t.toml:4)");
    let two = two.replace("name = \"t1\"\nversion = 1", "name = \"t2\"\nversion = 1");
    assert!(TemplateSet::parse("t.toml", &two).is_ok());
    let e = err(&two.replace("priority = 8", "priority = 7"));
    assert_at(&e, 15, "`t2` has priority 7, as has `t1` (t.toml:4)");
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "comminsight-templates-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn load_dir_checks_across_files() {
    let d = TempDir::new();
    d.write("a.toml", GOOD);
    d.write("b.toml", &GOOD.replace("\"t1\"", "\"t2\""));
    d.write("notes.md", "not a template");
    let e = TemplateSet::load_dir(&d.0).unwrap_err();
    let msg = e.to_string();
    assert_eq!((e.file(), e.line()), ("b.toml", 4), "{msg}");
    assert!(
        msg.starts_with("b.toml:4: template `t2` has priority 7, as has `t1` (a.toml:4)"),
        "{msg}"
    );
    d.write("b.toml", &GOOD.replace("priority = 7", "priority = 9"));
    let e = TemplateSet::load_dir(&d.0).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("b.toml:4: duplicate template name `t1` (also a.toml:4)"),
        "{e}"
    );
    d.write(
        "b.toml",
        &GOOD
            .replace("priority = 7", "priority = 9")
            .replace("\"t1\"", "\"t2\""),
    );
    let set = TemplateSet::load_dir(&d.0).unwrap();
    let names: Vec<_> = set
        .templates
        .iter()
        .map(|t| (t.name.as_str(), t.file.as_str()))
        .collect();
    assert_eq!(
        names,
        [("t2", "b.toml"), ("t1", "a.toml")],
        "highest priority first"
    );
    d.write("c.toml", &edit(GOOD, 11, "anchor = []"));
    let e = TemplateSet::load_dir(&d.0).unwrap_err();
    assert_eq!((e.file(), e.line()), ("c.toml", 11), "{e}");
}

#[test]
fn load_dir_of_nothing_is_an_error() {
    let d = TempDir::new();
    let e = TemplateSet::load_dir(&d.0).unwrap_err();
    assert!(matches!(e, TemplateError::EmptyDir { .. }), "{e}");
    assert!(e.to_string().contains("no `*.toml` template file"), "{e}");
    let e = TemplateSet::load_dir(&d.0.join("absent")).unwrap_err();
    assert!(matches!(e, TemplateError::Io { .. }), "{e}");
    assert!(e.to_string().contains("absent"), "{e}");
}

fn templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../templates")
}

#[test]
fn every_shipped_file_parses_and_is_built_in() {
    let mut files: Vec<String> = std::fs::read_dir(templates_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    files.sort();
    let mut built_in: Vec<String> = BUILTIN_FILES.iter().map(|(n, _)| n.to_string()).collect();
    built_in.sort();
    assert_eq!(files, built_in, "every templates/*.toml is embedded");
    for (name, text) in BUILTIN_FILES {
        let v = TemplateSet::parse(name, text).unwrap_or_else(|e| panic!("{e}"));
        assert!(!v.is_empty(), "{name}");
        for t in &v {
            assert_eq!(t.file_version, FORMAT_VERSION);
            assert!(!t.description.is_empty(), "{}", t.name);
        }
    }
    let from_disk = TemplateSet::load_dir(&templates_dir()).unwrap();
    assert_eq!(from_disk.templates, TemplateSet::builtin().templates);
}

#[test]
fn builtin_names_and_priorities_are_unique_and_sorted() {
    let set = TemplateSet::builtin();
    let mut names: Vec<&str> = set.templates.iter().map(|t| t.name.as_str()).collect();
    let prios: Vec<i64> = set.templates.iter().map(|t| t.priority).collect();
    assert!(prios.windows(2).all(|w| w[0] > w[1]), "{prios:?}");
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), set.templates.len());
    for want in [
        "megatron-1f1b",
        "megatron-1f1b-distopt",
        "megatron-1f1b-moe",
        "megatron-1f1b-cp",
        "fsdp",
        "ddp",
        "decode",
    ] {
        assert!(set.get(want).is_some(), "{want} shipped");
    }
    // from_templates finds a duplicate priority among built-ins too.
    let mut v = set.templates.clone();
    v[1].priority = v[0].priority;
    let e = TemplateSet::from_templates(v).unwrap_err();
    assert!(matches!(e, TemplateError::DuplicatePriority { .. }), "{e}");
}

#[test]
fn select_takes_the_highest_satisfied_template() {
    let set = TemplateSet::builtin();
    assert!(set.select(&Features::default()).is_none());
    let pick = |f: &[&str]| {
        set.select(&Features::of(f.iter().copied()))
            .map(|t| t.name.clone())
    };
    let dense = [
        "global",
        "dp",
        "tp",
        "pp",
        "global.AllReduce",
        "dp.AllReduce",
        "tp.AllReduce",
    ];
    assert_eq!(pick(&dense).as_deref(), Some("megatron-1f1b"));
    let mut moe = dense.to_vec();
    moe.extend(["ep", "ep.AlltoAll"]);
    assert_eq!(pick(&moe).as_deref(), Some("megatron-1f1b-moe"));
    moe.push("cp");
    assert_eq!(
        pick(&moe).as_deref(),
        Some("megatron-1f1b-cp"),
        "cp outranks moe"
    );
    let ddp = ["global", "dp", "global.AllReduce", "dp.AllReduce"];
    assert_eq!(pick(&ddp).as_deref(), Some("ddp"));
    let decode = [
        "global",
        "tp",
        "pp",
        "tp.AllReduce",
        "tp.AllGather",
        "pp.Send",
        "pp.Recv",
    ];
    assert_eq!(pick(&decode).as_deref(), Some("decode"));
    assert_eq!(
        pick(&["dp", "dp.AllReduce"]),
        None,
        "no anchor, no template"
    );
}

/// GOOD with two phase rules (lines 13..22).
fn with_phases() -> String {
    format!(
        r#"{GOOD}
[[template.phase]]
name = "forward"
microbatch = true
begin = [[{{ role = "tp", func = "AllReduce" }}]]

[[template.phase]]
name = "optimizer"
begin = [[{{ role = "dp" }}, {{ role = "global", func = "AllReduce" }}]]
at = 1
"#
    )
}

#[test]
fn phase_rules_parse_into_the_contract_types() {
    use crate::steps::phase::{Phase, PhaseRule};
    let v = TemplateSet::parse("t.toml", &with_phases()).unwrap();
    let m = |role, func| OpMatch {
        role,
        func,
        size: None,
    };
    assert_eq!(
        v[0].phases,
        vec![
            PhaseRule {
                phase: Phase::Forward,
                begin: vec![vec![m(Some(Role::Tp), Some(Func::ALL_REDUCE))]],
                at: 0,
                microbatch: true,
            },
            PhaseRule {
                phase: Phase::Optimizer,
                begin: vec![vec![
                    m(Some(Role::Dp), None),
                    m(Some(Role::Global), Some(Func::ALL_REDUCE))
                ]],
                at: 1,
                microbatch: false,
            },
        ]
    );
    // Without `[[template.phase]]`: no rules.
    assert!(TemplateSet::parse("t.toml", GOOD).unwrap()[0]
        .phases
        .is_empty());
    for p in Phase::ALL {
        assert_eq!(Phase::parse(p.as_str()), Some(p));
    }
}

#[test]
fn bad_phase_rules_name_file_and_line() {
    let good = with_phases();
    assert_at(
        &err(&edit(&good, 15, r#"name = "warmup""#)),
        15,
        "bad `phase.name` value `warmup`; use forward, backward, grad_sync or optimizer",
    );
    assert_at(
        &err(&edit(&good, 20, r#"name = "forward""#)),
        20,
        "bad `phase.name` value `forward`",
    );
    assert_at(&err(&edit(&good, 16, "colour = 1")), 16, "colour");
    assert_at(&err(&edit(&good, 15, "")), 14, "has no `phase.name`");
    assert_at(&err(&edit(&good, 17, "")), 14, "has no `phase.begin`");
    assert_at(
        &err(&edit(&good, 17, "begin = []")),
        17,
        "`phase.begin` has an empty alternative list",
    );
    assert_at(
        &err(&edit(&good, 17, r#"begin = [[{ role = "xp" }]]"#)),
        17,
        "bad `role` value `xp`",
    );
    assert_at(
        &err(&edit(&good, 22, "at = 2")),
        22,
        "bad `phase.at` value `2`; use an index into every `begin` sequence: 0..1",
    );
    assert_at(
        &err(&edit(&good, 22, "at = -1")),
        22,
        "`phase.at` value `-1`",
    );
    assert_at(
        &err(&edit(&good, 16, r#"microbatch = "yes""#)),
        16,
        "invalid type",
    );
}
