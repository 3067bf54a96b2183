//! One template file: TOML -> serde structs (unknown keys rejected, spans kept) -> validated
//! [`Template`]s, every error naming the file and line.

use comminsight_wire::roles::Role;
use comminsight_wire::Func;
use serde::Deserialize;
use toml::Spanned;

use super::{OpMatch, Seq, SizeClass, Template, TemplateError, FORMAT_VERSION};
use crate::steps::phase::{Phase, PhaseRule};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    format: Option<Spanned<i64>>,
    #[serde(default)]
    template: Vec<Spanned<RawTemplate>>,
}

type RawAlts = Spanned<Vec<Spanned<Vec<Spanned<RawMatch>>>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTemplate {
    name: Option<Spanned<String>>,
    version: Option<Spanned<i64>>,
    priority: Option<Spanned<i64>>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    requires: Vec<Spanned<String>>,
    #[serde(default)]
    forbids: Vec<Spanned<String>>,
    open: Option<RawAlts>,
    anchor: Option<RawAlts>,
    close: Option<RawAlts>,
    #[serde(default)]
    phase: Vec<Spanned<RawPhase>>,
}

/// One `[[template.phase]]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    name: Option<Spanned<String>>,
    begin: Option<RawAlts>,
    at: Option<Spanned<i64>>,
    #[serde(default)]
    microbatch: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    role: Option<Spanned<String>>,
    func: Option<Spanned<String>>,
    size: Option<Spanned<String>>,
}

/// Role names a matcher accepts (`any` = every role).
const ROLE_WORDS: &str = "global, dp, tp, pp, ep, cp or any";
const SIZE_WORDS: &str = "tiny (<= 1 KiB), small (<= 64 KiB), medium (<= 4 MiB), large or any";

/// Line/file context of one file.
struct Ctx<'a> {
    file: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    /// 1-based line of byte `offset`.
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    fn line_of<T>(&self, s: &Spanned<T>) -> usize {
        self.line(s.span().start)
    }

    fn bad(&self, line: usize, key: &'static str, value: &str, expected: &str) -> TemplateError {
        TemplateError::BadValue {
            file: self.file.to_string(),
            line,
            key,
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }
}

/// Parse and validate one file (no cross-template checks).
pub(super) fn parse_file(file: &str, text: &str) -> Result<Vec<Template>, TemplateError> {
    let cx = Ctx { file, text };
    let raw: RawFile = toml::from_str(text).map_err(|e| TemplateError::Syntax {
        file: file.to_string(),
        line: e.span().map_or(1, |s| cx.line(s.start)),
        msg: e.message().trim().replace('\n', " "),
    })?;
    let file_version = match &raw.format {
        None => {
            return Err(TemplateError::Format {
                file: file.to_string(),
                line: 1,
                found: "missing".into(),
            })
        }
        Some(f) if *f.get_ref() == i64::from(FORMAT_VERSION) => FORMAT_VERSION,
        Some(f) => {
            return Err(TemplateError::Format {
                file: file.to_string(),
                line: cx.line_of(f),
                found: f.get_ref().to_string(),
            })
        }
    };
    if raw.template.is_empty() {
        return Err(TemplateError::NoTemplate {
            file: file.to_string(),
        });
    }
    raw.template
        .iter()
        .map(|t| template(&cx, t, file_version))
        .collect()
}

fn template(
    cx: &Ctx<'_>,
    st: &Spanned<RawTemplate>,
    file_version: u32,
) -> Result<Template, TemplateError> {
    let t = st.get_ref();
    let head = cx.line_of(st);
    let missing = |key: &'static str, template: &str| TemplateError::Missing {
        file: cx.file.to_string(),
        line: head,
        template: template.to_string(),
        key,
    };
    let name = t.name.as_ref().ok_or_else(|| missing("name", "?"))?;
    let line = cx.line_of(name);
    let name_s = name.get_ref();
    let name_ok = !name_s.is_empty()
        && name_s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(cx.bad(
            line,
            "name",
            name_s,
            "a non-empty name of letters, digits, `-`, `_` or `.`",
        ));
    }
    let version = t
        .version
        .as_ref()
        .ok_or_else(|| missing("version", name_s))?;
    let version = u32::try_from(*version.get_ref())
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| {
            cx.bad(
                cx.line_of(version),
                "version",
                &version.get_ref().to_string(),
                "an integer >= 1 (bump it whenever the template changes)",
            )
        })?;
    let priority = *t
        .priority
        .as_ref()
        .ok_or_else(|| missing("priority", name_s))?
        .get_ref();
    let requires = features(cx, &t.requires, "requires")?;
    let forbids = features(cx, &t.forbids, "forbids")?;
    let alts = |key: &'static str, a: &Option<RawAlts>| -> Result<Vec<Seq>, TemplateError> {
        let a = a.as_ref().ok_or_else(|| missing(key, name_s))?;
        // `close = []`: the workload has no closing signature (steps end at the next Open
        // after their Anchor); every other list needs an alternative.
        if key == "close" && a.get_ref().is_empty() {
            return Ok(Vec::new());
        }
        alternatives(cx, key, a)
    };
    Ok(Template {
        name: name_s.clone(),
        version,
        priority,
        description: t.description.clone(),
        requires,
        forbids,
        open: alts("open", &t.open)?,
        anchor: alts("anchor", &t.anchor)?,
        close: alts("close", &t.close)?,
        phases: phases(cx, &t.phase, name_s)?,
        file: cx.file.to_string(),
        file_version,
        line,
    })
}

fn alternatives(cx: &Ctx<'_>, key: &'static str, a: &RawAlts) -> Result<Vec<Seq>, TemplateError> {
    let empty = |line: usize, what: &'static str, need: &'static str| TemplateError::Empty {
        file: cx.file.to_string(),
        line,
        key,
        what,
        need,
    };
    if a.get_ref().is_empty() {
        return Err(empty(
            cx.line_of(a),
            "alternative list",
            "sequence, e.g. [[{ role = \"dp\", func = \"AllReduce\" }]]",
        ));
    }
    a.get_ref()
        .iter()
        .map(|seq| {
            if seq.get_ref().is_empty() {
                return Err(empty(
                    cx.line_of(seq),
                    "sequence",
                    "matcher, e.g. { role = \"dp\", func = \"AllReduce\" }",
                ));
            }
            seq.get_ref().iter().map(|m| matcher(cx, key, m)).collect()
        })
        .collect()
}

fn matcher(
    cx: &Ctx<'_>,
    key: &'static str,
    sm: &Spanned<RawMatch>,
) -> Result<OpMatch, TemplateError> {
    let m = sm.get_ref();
    if m.role.is_none() && m.func.is_none() {
        return Err(TemplateError::EmptyMatcher {
            file: cx.file.to_string(),
            line: cx.line_of(sm),
            key,
        });
    }
    let role = match &m.role {
        None => None,
        Some(r) if r.get_ref() == "any" => None,
        Some(r) => Some(
            role(r.get_ref())
                .ok_or_else(|| cx.bad(cx.line_of(r), "role", r.get_ref(), ROLE_WORDS))?,
        ),
    };
    let func = match &m.func {
        None => None,
        Some(f) if f.get_ref() == "any" => None,
        Some(f) => Some(
            func(f.get_ref())
                .ok_or_else(|| cx.bad(cx.line_of(f), "func", f.get_ref(), &func_words()))?,
        ),
    };
    let size = match &m.size {
        None => None,
        Some(s) if s.get_ref() == "any" => None,
        Some(s) => Some(
            SizeClass::ALL
                .into_iter()
                .find(|c| c.as_str() == s.get_ref())
                .ok_or_else(|| cx.bad(cx.line_of(s), "size", s.get_ref(), SIZE_WORDS))?,
        ),
    };
    Ok(OpMatch { role, func, size })
}

const PHASE_WORDS: &str =
    "forward, backward, grad_sync or optimizer, each at most once per template";

/// `[[template.phase]]` rules: a known phase name, once each; `begin` alternatives as `open`;
/// `at` inside every alternative.
fn phases(
    cx: &Ctx<'_>,
    v: &[Spanned<RawPhase>],
    template: &str,
) -> Result<Vec<PhaseRule>, TemplateError> {
    let mut out: Vec<PhaseRule> = Vec::new();
    for sp in v {
        let p = sp.get_ref();
        let missing = |key: &'static str| TemplateError::Missing {
            file: cx.file.to_string(),
            line: cx.line_of(sp),
            template: template.to_string(),
            key,
        };
        let name = p.name.as_ref().ok_or_else(|| missing("phase.name"))?;
        let phase = Phase::parse(name.get_ref())
            .filter(|ph| !out.iter().any(|r| r.phase == *ph))
            .ok_or_else(|| cx.bad(cx.line_of(name), "phase.name", name.get_ref(), PHASE_WORDS))?;
        let begin = p.begin.as_ref().ok_or_else(|| missing("phase.begin"))?;
        let begin = alternatives(cx, "phase.begin", begin)?;
        let shortest = begin.iter().map(Vec::len).min().unwrap_or(1);
        let at = match &p.at {
            None => 0,
            Some(a) => usize::try_from(*a.get_ref())
                .ok()
                .filter(|x| *x < shortest)
                .ok_or_else(|| {
                    cx.bad(
                        cx.line_of(a),
                        "phase.at",
                        &a.get_ref().to_string(),
                        &format!(
                            "an index into every `begin` sequence: 0..{} (the phase's first operation)",
                            shortest - 1
                        ),
                    )
                })?,
        };
        out.push(PhaseRule {
            phase,
            begin,
            at,
            microbatch: p.microbatch,
        });
    }
    Ok(out)
}

/// A role by its exact lowercase name.
fn role(s: &str) -> Option<Role> {
    Role::ALL.into_iter().find(|r| r.as_str() == s)
}

/// A function by NCCL's spelling ([`Func::name`]); `AllToAll` is accepted for `AlltoAll`.
fn func(s: &str) -> Option<Func> {
    let s = if s == "AllToAll" { "AlltoAll" } else { s };
    Func::parse(s).filter(|f| f.0 != 0)
}

fn func_words() -> String {
    format!("NCCL's spelling: {} or any", Func::NAMES[1..].join(", "))
}

/// Validated features in canonical spelling (`ep.AllToAll` -> `ep.AlltoAll`).
fn features(
    cx: &Ctx<'_>,
    v: &[Spanned<String>],
    key: &'static str,
) -> Result<Vec<String>, TemplateError> {
    v.iter()
        .map(|f| {
            let s = f.get_ref();
            let canon = match s.split_once('.') {
                None => role(s).map(|r| r.as_str().to_string()),
                Some((r, fun)) => role(r)
                    .zip(func(fun))
                    .map(|(r, fun)| format!("{}.{}", r.as_str(), fun.name())),
            };
            canon.ok_or_else(|| {
                cx.bad(
                    cx.line_of(f),
                    key,
                    s,
                    "a role (global, dp, tp, pp, ep, cp) or <role>.<Func> such as dp.ReduceScatter",
                )
            })
        })
        .collect()
}
