//! Architecture rules for the agent library (issue 15), checked from the source text.
//!
//! The agent's modules grew into one knot: ten of the top-level modules depended on each other in
//! a cycle, a few files passed 600 lines and some functions 200. Issue 15 sets three rules for the
//! library code under `src/` (test code left out), and each test below fails when one is broken:
//!
//! * `module_graph_has_no_cycle`: the top-level modules (`config`, `steps`, `pipeline`, ...) form
//!   no dependency cycle, and neither do the direct children of any module (`straggler::classify`,
//!   `straggler::index`, ...). Module A depends on B when code in A names something inside B with
//!   a `crate::`, `super::` or `self::` path, `use` groups and `pub use` re-exports included. A
//!   path counts where it is written, even if it goes through a re-export.
//! * `no_source_file_over_600_lines`: no library file has more than 600 lines outside test code.
//! * `no_function_over_100_lines`: no `fn` outside test code spans more than 100 lines, from its
//!   `fn` keyword to its closing brace (closures count as part of their function).
//!
//! Test code is every item under `#[cfg(test)]` (or `#[test]`), including the files reached only
//! through `#[cfg(test)] mod tests;`. Comments, doc comments and string or char literals never
//! count as references. `main.rs` is the binary and is not checked.
//!
//! The checker uses `std` only: a small tokenizer (comments, raw strings, char literals versus
//! lifetimes, balanced delimiters) and a walk of the module tree from `src/lib.rs` that follows
//! `mod` declarations, `#[path]` attributes and inline `mod x { .. }` blocks. Its own unit tests
//! are the `self_check_*` tests at the end.
//!
//! For everything it measures (both graphs' edges, every strongly connected component, the largest
//! files and the longest functions), run:
//!
//! ```text
//! ARCH_REPORT=1 cargo test -p comminsight-agent --test architecture -- --nocapture
//! ```
//!
//! Built without cargo (`rustc --test tests/architecture.rs`), it reads `src/` under the current
//! directory, so run that binary from the agent crate's directory.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Most lines a library file may have outside test code.
const MAX_FILE_LINES: usize = 600;
/// Most lines a function may span, from `fn` to its closing brace.
const MAX_FN_LINES: usize = 100;

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    /// `r#name`; the text holds `name`. Never a keyword.
    RawIdent,
    Lifetime,
    /// String, byte string, raw string, char, byte or number; the text is the source text.
    Literal,
    /// `::` or a single punctuation character.
    Punct,
    Open,
    Close,
    /// An outer doc comment (`///` or `/** */`): an attribute of the next item, nothing else.
    Doc,
}

#[derive(Clone, Debug)]
struct Tok {
    kind: Kind,
    text: String,
    line: usize,
}

impl Tok {
    fn ident(&self, text: &str) -> bool {
        self.kind == Kind::Ident && self.text == text
    }

    fn punct(&self, text: &str) -> bool {
        self.kind == Kind::Punct && self.text == text
    }

    fn open(&self, text: &str) -> bool {
        self.kind == Kind::Open && self.text == text
    }

    fn is_name(&self) -> bool {
        matches!(self.kind, Kind::Ident | Kind::RawIdent)
    }
}

fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Splits Rust source into tokens, dropping whitespace, comments (keeping outer doc comments as
/// [`Kind::Doc`] markers) and the contents of literals.
fn lex(src: &str) -> Result<Vec<Tok>, String> {
    let c: Vec<char> = src.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let mut toks = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let start = line;
        // What the characters from `i` to `end` are, if they make a token.
        let (kind, end) = if ch == '\n' {
            line += 1;
            (None, i + 1)
        } else if ch.is_whitespace() {
            (None, i + 1)
        } else if ch == '/' && at(i + 1) == '/' {
            let doc = at(i + 2) == '/' && at(i + 3) != '/';
            let len = c[i..].iter().take_while(|&&x| x != '\n').count();
            (doc.then_some(Kind::Doc), i + len)
        } else if ch == '/' && at(i + 1) == '*' {
            let doc = at(i + 2) == '*' && at(i + 3) != '*' && at(i + 3) != '/';
            (
                doc.then_some(Kind::Doc),
                block_comment_end(&c, i, &mut line)?,
            )
        } else if let Some(end) = prefixed_literal(&c, i, &mut line)? {
            (Some(Kind::Literal), end)
        } else if ch == 'r' && at(i + 1) == '#' && is_ident_start(at(i + 2)) {
            (Some(Kind::RawIdent), ident_end(&c, i + 2))
        } else if is_ident_start(ch) {
            (Some(Kind::Ident), ident_end(&c, i))
        } else if ch == '"' {
            (Some(Kind::Literal), string_end(&c, i, &mut line)?)
        } else if ch == '\'' {
            match char_end(&c, i) {
                Some(end) => (Some(Kind::Literal), end),
                None if is_ident_start(at(i + 1)) => (Some(Kind::Lifetime), ident_end(&c, i + 1)),
                None => return Err(format!("line {start}: stray `'`")),
            }
        } else if ch.is_ascii_digit() {
            (Some(Kind::Literal), number_end(&c, i))
        } else if ch == ':' && at(i + 1) == ':' {
            (Some(Kind::Punct), i + 2)
        } else {
            let kind = match ch {
                '(' | '[' | '{' => Kind::Open,
                ')' | ']' | '}' => Kind::Close,
                _ => Kind::Punct,
            };
            (Some(kind), i + 1)
        };
        if let Some(kind) = kind {
            let text = match kind {
                Kind::Doc => String::new(),
                Kind::RawIdent => c[i + 2..end].iter().collect(),
                _ => c[i..end].iter().collect(),
            };
            toks.push(Tok {
                kind,
                text,
                line: start,
            });
        }
        i = end;
    }
    Ok(toks)
}

/// The end of the identifier (or lifetime name) that starts at `i`.
fn ident_end(c: &[char], i: usize) -> usize {
    i + c[i..].iter().take_while(|&&x| is_ident_char(x)).count()
}

/// The end of the (nested) block comment that starts at `i`.
fn block_comment_end(c: &[char], i: usize, line: &mut usize) -> Result<usize, String> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let start = *line;
    let mut depth = 0usize;
    let mut m = i;
    while m < c.len() {
        if c[m] == '/' && at(m + 1) == '*' {
            depth += 1;
            m += 2;
        } else if c[m] == '*' && at(m + 1) == '/' {
            depth -= 1;
            m += 2;
            if depth == 0 {
                return Ok(m);
            }
        } else {
            if c[m] == '\n' {
                *line += 1;
            }
            m += 1;
        }
    }
    Err(format!("line {start}: unterminated block comment"))
}

/// The end of a literal with a prefix (`b"..."`, `c"..."`, `b'x'`, `r"..."`, `br#"..."#`,
/// `cr"..."`) starting at `i`, or `None` if there is none there.
fn prefixed_literal(c: &[char], i: usize, line: &mut usize) -> Result<Option<usize>, String> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    if i > 0 && is_ident_char(c[i - 1]) {
        return Ok(None);
    }
    let mut k = i;
    match at(k) {
        'b' | 'c' => {
            k += 1;
            if at(k) == '"' {
                return string_end(c, k, line).map(Some);
            }
            if at(i) == 'b' && at(k) == '\'' {
                return Ok(char_end(c, k));
            }
            if at(k) != 'r' {
                return Ok(None);
            }
            k += 1;
        }
        'r' => k += 1,
        _ => return Ok(None),
    }
    // A raw string: `r`, any number of `#`, `"`, the text, `"` and as many `#`.
    let mut hashes = 0;
    while at(k + hashes) == '#' {
        hashes += 1;
    }
    if at(k + hashes) != '"' {
        return Ok(None);
    }
    let start = *line;
    let mut m = k + hashes + 1;
    loop {
        if m >= c.len() {
            return Err(format!("line {start}: unterminated raw string"));
        }
        if c[m] == '"' && (1..=hashes).all(|h| at(m + h) == '#') {
            return Ok(Some(m + 1 + hashes));
        }
        if c[m] == '\n' {
            *line += 1;
        }
        m += 1;
    }
}

/// The end (one past the closing quote) of the string literal whose opening `"` is at `i`.
fn string_end(c: &[char], i: usize, line: &mut usize) -> Result<usize, String> {
    let start = *line;
    let mut m = i + 1;
    while m < c.len() {
        match c[m] {
            '\\' => {
                if c.get(m + 1) == Some(&'\n') {
                    *line += 1;
                }
                m += 2;
            }
            '"' => return Ok(m + 1),
            ch => {
                if ch == '\n' {
                    *line += 1;
                }
                m += 1;
            }
        }
    }
    Err(format!("line {start}: unterminated string"))
}

/// The end of the char literal whose `'` is at `i`, or `None` if it is a lifetime or label.
fn char_end(c: &[char], i: usize) -> Option<usize> {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    if at(i + 1) == '\\' {
        let mut m = i + 3;
        while m < c.len() && c[m] != '\'' && c[m] != '\n' {
            m += 1;
        }
        return (at(m) == '\'').then_some(m + 1);
    }
    (at(i + 1) != '\n' && at(i + 1) != '\0' && at(i + 2) == '\'').then_some(i + 3)
}

/// The end of the number literal starting at `i` (`1_000u64`, `0x1f`, `2.5e-3`, not `0..n`).
fn number_end(c: &[char], i: usize) -> usize {
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let hex = at(i) == '0' && matches!(at(i + 1), 'x' | 'X');
    let mut dot = false;
    let mut m = i + 1;
    loop {
        let d = at(m);
        // An exponent's sign, as in `2.5e-3` (not `0x1e-1` nor `1usize-1`).
        let exponent_sign = matches!(d, '+' | '-')
            && !hex
            && matches!(c[m - 1], 'e' | 'E')
            && c[i..m - 1]
                .iter()
                .all(|x| x.is_ascii_digit() || *x == '_' || *x == '.');
        if d == '.' && !dot && at(m + 1).is_ascii_digit() {
            dot = true;
        } else if !is_ident_char(d) && !exponent_sign {
            return m;
        }
        m += 1;
    }
}

/// For each delimiter token, the index of its partner; `usize::MAX` for other tokens.
fn match_delims(toks: &[Tok]) -> Result<Vec<usize>, String> {
    let mut pair = vec![usize::MAX; toks.len()];
    let mut stack: Vec<usize> = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Open => stack.push(i),
            Kind::Close => {
                let Some(o) = stack.pop() else {
                    return Err(format!("line {}: unmatched `{}`", t.line, t.text));
                };
                let want = match toks[o].text.as_str() {
                    "(" => ")",
                    "[" => "]",
                    _ => "}",
                };
                if t.text != want {
                    return Err(format!(
                        "line {}: `{}` closes `{}` of line {}",
                        t.line, t.text, toks[o].text, toks[o].line
                    ));
                }
                pair[o] = i;
                pair[i] = o;
            }
            _ => {}
        }
    }
    match stack.pop() {
        Some(o) => Err(format!(
            "line {}: unclosed `{}`",
            toks[o].line, toks[o].text
        )),
        None => Ok(pair),
    }
}

// ---------------------------------------------------------------------------------------------
// Test code: `#[cfg(test)]`, `#[test]`
// ---------------------------------------------------------------------------------------------

/// Splits a token list at its top-level commas.
fn split_commas(toks: &[Tok]) -> Vec<&[Tok]> {
    let mut parts = Vec::new();
    let (mut depth, mut from) = (0usize, 0);
    for (i, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            Kind::Punct if depth == 0 && t.text == "," => {
                parts.push(&toks[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    if from < toks.len() {
        parts.push(&toks[from..]);
    }
    parts
}

/// Whether a `cfg` predicate holds only when `test` is set.
fn cfg_implies_test(pred: &[Tok]) -> bool {
    match pred {
        [t] => t.ident("test"),
        [f, o, inner @ .., c] if o.open("(") && c.kind == Kind::Close => {
            let parts = split_commas(inner);
            if f.ident("all") {
                parts.iter().any(|p| cfg_implies_test(p))
            } else if f.ident("any") {
                !parts.is_empty() && parts.iter().all(|p| cfg_implies_test(p))
            } else {
                false
            }
        }
        _ => false,
    }
}

/// Whether the attribute with these tokens (inside `#[...]`) makes its item test-only:
/// `cfg(test)`, `cfg(all(test, ..))`, `test`, `tokio::test`, ...
fn attr_is_test(attr: &[Tok]) -> bool {
    match attr {
        [f, o, inner @ .., c] if f.ident("cfg") && o.open("(") && c.kind == Kind::Close => {
            cfg_implies_test(inner)
        }
        _ => {
            let path_len = attr
                .iter()
                .take_while(|t| t.is_name() || t.punct("::"))
                .count();
            let rest = &attr[path_len..];
            path_len > 0
                && attr[path_len - 1].ident("test")
                && (rest.is_empty() || rest[0].open("("))
        }
    }
}

/// Whether an outer attribute `#[` starts at `i`.
fn outer_attr_at(toks: &[Tok], i: usize) -> bool {
    toks[i].punct("#") && toks.get(i + 1).is_some_and(|t| t.open("["))
}

/// Whether an inner attribute `#![` starts at `i`.
fn inner_attr_at(toks: &[Tok], i: usize) -> bool {
    toks[i].punct("#")
        && toks.get(i + 1).is_some_and(|t| t.punct("!"))
        && toks.get(i + 2).is_some_and(|t| t.open("["))
}

/// Scans from `k` to the end of an item or element: a `;` at this level, or (if `block`) the
/// `}` of a brace group at this level, or (if `comma`) a `,`; stops before a closing delimiter.
fn scan_item(toks: &[Tok], pair: &[usize], k: usize, block: bool, comma: bool) -> usize {
    let mut m = k;
    while m < toks.len() {
        let t = &toks[m];
        match t.kind {
            Kind::Open if block && t.text == "{" => return pair[m],
            Kind::Open => m = pair[m] + 1,
            Kind::Close => return m.saturating_sub(1).max(k),
            Kind::Punct if t.text == ";" || (comma && t.text == ",") => return m,
            _ => m += 1,
        }
    }
    toks.len() - 1
}

/// The last token of the item (or field, variant, statement) that starts at `k`, after its
/// attributes.
fn item_end(toks: &[Tok], pair: &[usize], mut k: usize) -> usize {
    let n = toks.len();
    if k >= n {
        return n - 1;
    }
    if toks[k].ident("pub") {
        k += 1;
        if toks.get(k).is_some_and(|t| t.open("(")) {
            k = pair[k] + 1;
        }
    }
    loop {
        let Some(t) = toks.get(k) else { return n - 1 };
        let next_is = |words: &[&str]| {
            toks.get(k + 1)
                .is_some_and(|x| words.iter().any(|w| x.ident(w)))
        };
        let qualifier = ["unsafe", "async", "default", "auto", "safe"]
            .iter()
            .any(|w| t.ident(w))
            || (t.ident("const") && next_is(&["fn", "unsafe", "async", "extern"]))
            || (t.ident("extern") && !next_is(&["crate"]))
            || t.kind == Kind::Literal;
        if !qualifier {
            break;
        }
        k += 1;
    }
    let t = &toks[k];
    let semi = ["use", "static", "const", "type", "let", "extern"];
    let block = [
        "fn",
        "mod",
        "impl",
        "struct",
        "enum",
        "union",
        "trait",
        "macro_rules",
    ];
    if t.open("{") {
        pair[k]
    } else if semi.iter().any(|w| t.ident(w)) {
        scan_item(toks, pair, k, false, false)
    } else if block.iter().any(|w| t.ident(w)) || is_macro_call(toks, k) {
        scan_item(toks, pair, k, true, false)
    } else {
        scan_item(toks, pair, k, false, true)
    }
}

/// Whether a macro invocation (`name!`, `a::b!`) starts at `k`.
fn is_macro_call(toks: &[Tok], k: usize) -> bool {
    let mut m = k;
    while toks.get(m).is_some_and(|t| t.is_name() || t.punct("::")) {
        m += 1;
    }
    m > k && toks.get(m).is_some_and(|t| t.punct("!"))
}

/// The token ranges (inclusive) of test-only code, and whether the whole file is test-only.
fn test_ranges(toks: &[Tok], pair: &[usize]) -> (Vec<(usize, usize)>, bool) {
    let mut ranges = Vec::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let t = &toks[i];
        if t.kind == Kind::Open {
            stack.push(i);
            i += 1;
        } else if t.kind == Kind::Close {
            stack.pop();
            i += 1;
        } else if inner_attr_at(toks, i) {
            let end = pair[i + 2];
            if attr_is_test(&toks[i + 3..end]) {
                match stack.last() {
                    None => return (vec![(0, toks.len() - 1)], true),
                    Some(&o) => {
                        ranges.push((o, pair[o]));
                        i = pair[o];
                        continue;
                    }
                }
            }
            i = end + 1;
        } else if t.kind == Kind::Doc || outer_attr_at(toks, i) {
            let start = i;
            let mut test = false;
            while i < toks.len() {
                if toks[i].kind == Kind::Doc {
                    i += 1;
                } else if outer_attr_at(toks, i) {
                    let end = pair[i + 1];
                    test |= attr_is_test(&toks[i + 2..end]);
                    i = end + 1;
                } else {
                    break;
                }
            }
            if test {
                let end = item_end(toks, pair, i);
                ranges.push((start, end));
                i = end + 1;
            }
        } else {
            i += 1;
        }
    }
    (ranges, false)
}

// ---------------------------------------------------------------------------------------------
// Module tree
// ---------------------------------------------------------------------------------------------

/// A `mod` declaration outside test code.
#[derive(Debug)]
struct ModDecl {
    name: String,
    line: usize,
    /// For `mod x { .. }`: the token indices of its braces.
    body: Option<(usize, usize)>,
    path_attr: Option<String>,
    /// The inline module (index into the same list) that holds this declaration.
    parent: Option<usize>,
}

/// The string value of a literal's source text (`"a/b.rs"`, `r#"a.rs"#`).
fn unquote(lit: &str) -> String {
    let s = lit.trim_start_matches('r').trim_matches('#');
    let s = s.strip_prefix('"').unwrap_or(s);
    let s = s.strip_suffix('"').unwrap_or(s);
    s.replace("\\\\", "\\")
}

/// The `#[path = "..."]` value among the attributes before the `mod` keyword at `i`.
fn path_attr_before(toks: &[Tok], pair: &[usize], i: usize) -> Option<String> {
    let mut j = i;
    if j > 0 && toks[j - 1].ident("pub") {
        j -= 1;
    } else if j > 0 && toks[j - 1].kind == Kind::Close && toks[j - 1].text == ")" {
        let o = pair[j - 1];
        if o > 0 && toks[o - 1].ident("pub") {
            j = o - 1;
        }
    }
    while j > 0 {
        let p = &toks[j - 1];
        if p.kind == Kind::Doc {
            j -= 1;
            continue;
        }
        if p.kind == Kind::Close && p.text == "]" {
            let o = pair[j - 1];
            if o > 0 && toks[o - 1].punct("#") {
                if let [name, eq, lit] = &toks[o + 1..j - 1] {
                    if name.ident("path") && eq.punct("=") && lit.kind == Kind::Literal {
                        return Some(unquote(&lit.text));
                    }
                }
                j = o - 1;
                continue;
            }
        }
        break;
    }
    None
}

/// The module declarations of one file, outside test code, in source order.
fn scan_mods(toks: &[Tok], pair: &[usize], test: &[bool]) -> Vec<ModDecl> {
    let mut decls: Vec<ModDecl> = Vec::new();
    let mut open: Vec<(usize, usize)> = Vec::new(); // (decl index, closing brace)
    for i in 0..toks.len() {
        while open.last().is_some_and(|&(_, close)| close < i) {
            open.pop();
        }
        if test[i] || !toks[i].ident("mod") {
            continue;
        }
        let (Some(name), Some(after)) = (toks.get(i + 1), toks.get(i + 2)) else {
            continue;
        };
        if !name.is_name() || !(after.punct(";") || after.open("{")) {
            continue;
        }
        let body = after.open("{").then(|| (i + 2, pair[i + 2]));
        decls.push(ModDecl {
            name: name.text.clone(),
            line: toks[i].line,
            body,
            path_attr: path_attr_before(toks, pair, i),
            parent: open.last().map(|&(d, _)| d),
        });
        if let Some((_, close)) = body {
            open.push((decls.len() - 1, close));
        }
    }
    decls
}

/// Joins relative paths with `/`, resolving `.` and `..`.
fn join(dir: &str, name: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in dir.split('/').chain(name.split('/')) {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(p),
        }
    }
    parts.join("/")
}

fn parent_dir(rel: &str) -> &str {
    rel.rfind('/').map_or("", |k| &rel[..k])
}

/// The directory that holds the files of the child modules declared in file `rel`.
fn children_dir(rel: &str) -> String {
    let file = rel.rsplit('/').next().unwrap_or(rel);
    if file == "mod.rs" || file == "lib.rs" || file == "main.rs" {
        parent_dir(rel).to_string()
    } else {
        rel.strip_suffix(".rs").unwrap_or(rel).to_string()
    }
}

#[derive(Debug)]
struct Module {
    name: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
}

#[derive(Debug)]
struct SrcFile {
    /// Path relative to `src/`.
    rel: String,
    toks: Vec<Tok>,
    pair: Vec<usize>,
    test: Vec<bool>,
    /// The module that each token belongs to.
    module: Vec<usize>,
    lines: usize,
    test_lines: usize,
    /// `#![cfg(test)]` at the top: the file is not library code.
    test_only: bool,
}

impl SrcFile {
    fn code_lines(&self) -> usize {
        self.lines - self.test_lines
    }
}

/// A path written in module `src` that names something in module `dst`.
#[derive(Debug)]
struct Ref {
    src: usize,
    dst: usize,
    file: usize,
    line: usize,
}

#[derive(Debug)]
struct FnLen {
    file: usize,
    line: usize,
    name: String,
    lines: usize,
}

/// One edge of a module graph: how many references make it, and where they are (file index and
/// line, sorted and deduplicated).
#[derive(Debug, Clone)]
struct Edge {
    count: usize,
    at: Vec<(usize, usize)>,
}

/// A strongly connected component of the graph of `folder`'s direct children.
#[derive(Debug)]
struct Cycle {
    folder: usize,
    nodes: Vec<usize>,
    edges: Vec<(usize, usize)>,
}

#[derive(Debug)]
struct Analysis {
    /// Prepended to each file's path in messages (`agent/src/`).
    prefix: String,
    files: Vec<SrcFile>,
    modules: Vec<Module>,
    refs: Vec<Ref>,
    fns: Vec<FnLen>,
    /// For each module with children: the edges between them (`folder -> (from, to) -> edge`).
    graphs: BTreeMap<usize, BTreeMap<(usize, usize), Edge>>,
    /// Files under `src/` that the library's module tree does not reach.
    unreached: Vec<String>,
}

impl Analysis {
    /// Reads the library from `lib.rs` with `read` (paths relative to `src/`).
    fn build(read: &dyn Fn(&str) -> Option<String>, prefix: &str) -> Result<Analysis, String> {
        let mut a = Analysis {
            prefix: prefix.to_string(),
            files: Vec::new(),
            modules: vec![Module {
                name: "crate".to_string(),
                parent: None,
                children: BTreeMap::new(),
            }],
            refs: Vec::new(),
            fns: Vec::new(),
            graphs: BTreeMap::new(),
            unreached: Vec::new(),
        };
        let mut queue = VecDeque::from([("lib.rs".to_string(), 0usize)]);
        while let Some((rel, module)) = queue.pop_front() {
            let src = read(&rel).ok_or_else(|| format!("cannot read {prefix}{rel}"))?;
            a.load_file(rel, &src, module, read, &mut queue)?;
        }
        for f in 0..a.files.len() {
            a.scan_refs(f);
            a.scan_fns(f);
        }
        a.build_graphs();
        Ok(a)
    }

    /// Tokenizes one module file, registers the modules it declares and queues their files.
    fn load_file(
        &mut self,
        rel: String,
        src: &str,
        module: usize,
        read: &dyn Fn(&str) -> Option<String>,
        queue: &mut VecDeque<(String, usize)>,
    ) -> Result<(), String> {
        let where_ = |e: String| format!("{}{rel}: {e}", self.prefix);
        let toks = lex(src).map_err(where_)?;
        let pair = match_delims(&toks).map_err(where_)?;
        let (ranges, test_only) = if toks.is_empty() {
            (Vec::new(), false)
        } else {
            test_ranges(&toks, &pair)
        };
        let mut test = vec![false; toks.len()];
        let mut test_line = BTreeSet::new();
        for &(s, e) in &ranges {
            test[s..=e].iter_mut().for_each(|t| *t = true);
            test_line.extend(toks[s].line..=toks[e].line);
        }
        let lines = src.lines().count();
        let mut module_of = vec![module; toks.len()];
        if test_only {
            let parent = self.modules[module].parent;
            if let Some(p) = parent {
                let name = self.modules[module].name.clone();
                self.modules[p].children.remove(&name);
            }
        } else {
            let decls = scan_mods(&toks, &pair, &test);
            let mut decl_module = Vec::with_capacity(decls.len());
            let mut decl_dir: Vec<String> = Vec::with_capacity(decls.len());
            for d in &decls {
                let (parent, dir) = match d.parent {
                    Some(p) => (decl_module[p], decl_dir[p].clone()),
                    None => (module, children_dir(&rel)),
                };
                let id = self.modules.len();
                if self.modules[parent].children.contains_key(&d.name) {
                    return Err(format!(
                        "{}{rel}:{}: module `{}` declared twice",
                        self.prefix, d.line, d.name
                    ));
                }
                self.modules.push(Module {
                    name: d.name.clone(),
                    parent: Some(parent),
                    children: BTreeMap::new(),
                });
                self.modules[parent].children.insert(d.name.clone(), id);
                if let Some((open, close)) = d.body {
                    module_of[open..=close].iter_mut().for_each(|m| *m = id);
                } else {
                    let candidates = match &d.path_attr {
                        Some(p) if d.parent.is_some() => vec![join(&dir, p)],
                        Some(p) => vec![join(parent_dir(&rel), p)],
                        None => vec![
                            join(&dir, &format!("{}.rs", d.name)),
                            join(&dir, &format!("{}/mod.rs", d.name)),
                        ],
                    };
                    let found = candidates.iter().find(|c| read(c).is_some());
                    let Some(found) = found else {
                        return Err(format!(
                            "{}{rel}:{}: no file for `mod {};` (looked for {})",
                            self.prefix,
                            d.line,
                            d.name,
                            candidates.join(", ")
                        ));
                    };
                    queue.push_back((found.clone(), id));
                }
                decl_module.push(id);
                decl_dir.push(join(&dir, &d.name));
            }
        }
        self.files.push(SrcFile {
            rel,
            toks,
            pair,
            test,
            module: module_of,
            lines,
            test_lines: if test_only { lines } else { test_line.len() },
            test_only,
        });
        Ok(())
    }

    fn parent(&self, m: usize) -> Option<usize> {
        self.modules[m].parent
    }

    /// The modules from the crate root down to `m`, both included.
    fn ancestry(&self, m: usize) -> Vec<usize> {
        let mut path = vec![m];
        let mut at = m;
        while let Some(p) = self.parent(at) {
            path.push(p);
            at = p;
        }
        path.reverse();
        path
    }

    /// `a::b::c` for module `c` (`crate` for the root).
    fn path(&self, m: usize) -> String {
        let names: Vec<&str> = self.ancestry(m)[1..]
            .iter()
            .map(|&x| self.modules[x].name.as_str())
            .collect();
        if names.is_empty() {
            "crate".to_string()
        } else {
            names.join("::")
        }
    }

    fn at(&self, file: usize, line: usize) -> String {
        format!("{}{}:{line}", self.prefix, self.files[file].rel)
    }

    /// Collects the module references of file `f`: every `crate::`, `super::` and `self::` path
    /// outside test code (and `$crate::`, or `comminsight_agent::`, taken as `crate::`).
    fn scan_refs(&mut self, f: usize) {
        let mut refs = Vec::new();
        let file = &self.files[f];
        let toks = &file.toks;
        let mut i = 0;
        while i < toks.len() {
            let t = &toks[i];
            let anchor = ["crate", "super", "self", "comminsight_agent"]
                .iter()
                .any(|w| t.ident(w));
            let starts = anchor
                && !file.test[i]
                && toks.get(i + 1).is_some_and(|x| x.punct("::"))
                && (i == 0 || !toks[i - 1].punct("::"));
            if !starts {
                i += 1;
                continue;
            }
            let src = file.module[i];
            let mut out = Vec::new();
            let end = self.resolve(toks, &file.pair, i, src, t.line, &mut out);
            refs.extend(out.into_iter().map(|(dst, line)| Ref {
                src,
                dst,
                file: f,
                line,
            }));
            i = end.max(i + 1);
        }
        self.refs.extend(refs);
    }

    /// Follows the path (or `use` tree) whose first segment is at `j`, relative to module `m`,
    /// pushing the deepest module that each branch names; returns the index after the path.
    fn resolve(
        &self,
        toks: &[Tok],
        pair: &[usize],
        mut j: usize,
        mut m: usize,
        mut line: usize,
        out: &mut Vec<(usize, usize)>,
    ) -> usize {
        loop {
            let Some(t) = toks.get(j) else {
                out.push((m, line));
                return j;
            };
            if t.ident("crate") || t.ident("comminsight_agent") {
                m = 0;
                line = t.line;
            } else if t.ident("super") {
                let Some(p) = self.parent(m) else {
                    return j + 1;
                };
                m = p;
                line = t.line;
            } else if t.ident("self") {
                line = t.line;
            } else if t.is_name() {
                match self.modules[m].children.get(&t.text) {
                    Some(&c) => {
                        m = c;
                        line = t.line;
                    }
                    None => {
                        out.push((m, line));
                        return j + 1;
                    }
                }
            } else if t.open("{") {
                let end = pair[j];
                let mut k = j + 1;
                while k < end {
                    k = self.resolve(toks, pair, k, m, line, out);
                    while k < end && !toks[k].punct(",") {
                        k = if toks[k].kind == Kind::Open {
                            pair[k] + 1
                        } else {
                            k + 1
                        };
                    }
                    k += 1;
                }
                return end + 1;
            } else {
                // `*`, `<` (generic arguments) or anything else ends the path.
                out.push((m, line));
                return j;
            }
            j += 1;
            if toks.get(j).is_some_and(|x| x.punct("::")) {
                j += 1;
            } else {
                out.push((m, line));
                return j;
            }
        }
    }

    /// Measures every `fn` with a body outside test code in file `f`.
    fn scan_fns(&mut self, f: usize) {
        let file = &self.files[f];
        let toks = &file.toks;
        for i in 0..toks.len() {
            if file.test[i] || !toks[i].ident("fn") {
                continue;
            }
            let Some(name) = toks.get(i + 1).filter(|t| t.is_name()) else {
                continue;
            };
            let mut m = i + 2;
            let close = loop {
                match toks.get(m) {
                    Some(t) if t.open("{") => break Some(file.pair[m]),
                    Some(t) if t.kind == Kind::Open => m = file.pair[m] + 1,
                    Some(t) if t.kind == Kind::Close || t.punct(";") => break None,
                    Some(_) => m += 1,
                    None => break None,
                }
            };
            if let Some(close) = close {
                self.fns.push(FnLen {
                    file: f,
                    line: toks[i].line,
                    name: name.text.clone(),
                    lines: toks[close].line - toks[i].line + 1,
                });
            }
        }
    }

    /// Turns each reference into an edge between two siblings: the children of the deepest
    /// module that holds both ends, on the way to each end.
    fn build_graphs(&mut self) {
        let mut graphs: BTreeMap<usize, BTreeMap<(usize, usize), Edge>> = BTreeMap::new();
        for r in &self.refs {
            let (a, b) = (self.ancestry(r.src), self.ancestry(r.dst));
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            if common < a.len() && common < b.len() {
                let edge = graphs
                    .entry(a[common - 1])
                    .or_default()
                    .entry((a[common], b[common]))
                    .or_insert(Edge {
                        count: 0,
                        at: Vec::new(),
                    });
                edge.count += 1;
                edge.at.push((r.file, r.line));
            }
        }
        for edges in graphs.values_mut() {
            for e in edges.values_mut() {
                e.at.sort_by(|x, y| (&self.files[x.0].rel, x.1).cmp(&(&self.files[y.0].rel, y.1)));
                e.at.dedup();
            }
        }
        self.graphs = graphs;
    }

    /// The strongly connected components with more than one module, in every graph.
    fn cycles(&self) -> Vec<Cycle> {
        let mut cycles = Vec::new();
        for (&folder, edges) in &self.graphs {
            let nodes: Vec<usize> = self.modules[folder].children.values().copied().collect();
            for scc in tarjan(&nodes, edges) {
                if scc.len() < 2 {
                    continue;
                }
                let inside: BTreeSet<usize> = scc.iter().copied().collect();
                let cycle_edges = edges
                    .keys()
                    .filter(|(x, y)| inside.contains(x) && inside.contains(y))
                    .copied()
                    .collect();
                let mut nodes = scc;
                nodes.sort_by_key(|&n| self.modules[n].name.clone());
                cycles.push(Cycle {
                    folder,
                    nodes,
                    edges: cycle_edges,
                });
            }
        }
        cycles
    }

    /// The library files, test-only files left out.
    fn code_files(&self) -> impl Iterator<Item = &SrcFile> {
        self.files.iter().filter(|f| !f.test_only)
    }
}

/// Tarjan's strongly connected components of the graph (`nodes`, `edges`).
fn tarjan(nodes: &[usize], edges: &BTreeMap<(usize, usize), Edge>) -> Vec<Vec<usize>> {
    struct State {
        adj: BTreeMap<usize, Vec<usize>>,
        index: BTreeMap<usize, usize>,
        low: BTreeMap<usize, usize>,
        on_stack: BTreeSet<usize>,
        stack: Vec<usize>,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.adj.get(&v).cloned().unwrap_or_default() {
            if !s.index.contains_key(&w) {
                visit(s, w);
                let low = s.low[&v].min(s.low[&w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[&v].min(s.index[&w]);
                s.low.insert(v, low);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(scc);
        }
    }
    let mut adj: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(x, y) in edges.keys() {
        if x != y {
            adj.entry(x).or_default().push(y);
        }
    }
    let mut s = State {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for &v in nodes {
        if !s.index.contains_key(&v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest path `from -> .. -> to` using only edges inside `scc`, both ends included.
fn shortest_path(edges: &[(usize, usize)], from: usize, to: usize) -> Vec<usize> {
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            break;
        }
        for &(x, y) in edges {
            if x == v && seen.insert(y) {
                prev.insert(y, x);
                queue.push_back(y);
            }
        }
    }
    let mut path = vec![to];
    let mut at = to;
    while at != from {
        match prev.get(&at) {
            Some(&p) => {
                path.push(p);
                at = p;
            }
            None => break,
        }
    }
    path.reverse();
    path
}

// ---------------------------------------------------------------------------------------------
// Messages and report
// ---------------------------------------------------------------------------------------------

impl Analysis {
    fn folder_label(&self, folder: usize) -> String {
        if folder == 0 {
            "the top-level modules".to_string()
        } else {
            format!("the children of `{}`", self.path(folder))
        }
    }

    fn refs_label(count: usize) -> String {
        if count == 1 {
            "1 ref".to_string()
        } else {
            format!("{count} refs")
        }
    }

    /// One cycle: its modules, then each edge with its first reference and a cycle it closes.
    fn describe_cycle(&self, c: &Cycle, all_refs: bool) -> String {
        let name = |m: usize| self.modules[m].name.clone();
        let edges = &self.graphs[&c.folder];
        let mut s = String::new();
        let names: Vec<String> = c.nodes.iter().map(|&n| name(n)).collect();
        let _ = writeln!(
            s,
            "cycle among {} ({} modules, {} edges): {}",
            self.folder_label(c.folder),
            c.nodes.len(),
            c.edges.len(),
            names.join(", ")
        );
        let width = c
            .edges
            .iter()
            .map(|&(x, y)| name(x).len() + name(y).len() + 4)
            .max()
            .unwrap_or(0);
        for &(x, y) in &c.edges {
            let e = &edges[&(x, y)];
            let back = shortest_path(&c.edges, y, x);
            let mut closes = vec![name(x)];
            closes.extend(back.iter().map(|&n| name(n)));
            let (file, line) = e.at[0];
            let _ = writeln!(
                s,
                "  {:width$}  {:>8}, first at {}   (closes {})",
                format!("{} -> {}", name(x), name(y)),
                Self::refs_label(e.count),
                self.at(file, line),
                closes.join(" -> ")
            );
            if all_refs {
                const SHOWN: usize = 12;
                for &(file, line) in e.at.iter().skip(1).take(SHOWN) {
                    let _ = writeln!(s, "  {:width$}            also {}", "", self.at(file, line));
                }
                if e.at.len() > SHOWN + 1 {
                    let more = e.at.len() - SHOWN - 1;
                    let _ = writeln!(s, "  {:width$}            ... and {more} more lines", "");
                }
            }
        }
        s
    }

    fn cycle_failure(&self) -> Option<String> {
        let cycles = self.cycles();
        if cycles.is_empty() {
            return None;
        }
        let mut s = format!(
            "the agent library's module graph has {} dependency cycle(s); issue 15 wants every \
             dependency to point one way.\nFor each cycle, pick the edge that points the wrong \
             way (a lower layer naming a higher one) and remove it: move the item it names into \
             the lower module or a shared one (e.g. a `util` module), or pass it in as a \
             parameter or trait. Each edge shows its first reference, outside comments and test \
             code; `ARCH_REPORT=1` lists them all.\n\n",
            cycles.len()
        );
        for c in &cycles {
            s.push_str(&self.describe_cycle(c, false));
            s.push('\n');
        }
        Some(s)
    }

    fn file_failure(&self) -> Option<String> {
        let mut big: Vec<&SrcFile> = self
            .code_files()
            .filter(|f| f.code_lines() > MAX_FILE_LINES)
            .collect();
        if big.is_empty() {
            return None;
        }
        big.sort_by(|a, b| b.code_lines().cmp(&a.code_lines()).then(a.rel.cmp(&b.rel)));
        let mut s = format!(
            "{} library file(s) have more than {MAX_FILE_LINES} lines outside test code (issue \
             15). Split each into submodules of at most {MAX_FILE_LINES} lines (for a file \
             `x.rs`, a folder `x/` with one file per concern); lines inside `#[cfg(test)]` items \
             do not count:\n",
            big.len()
        );
        for f in big {
            let _ = writeln!(
                s,
                "  {}{}: {} lines ({} in all, {} in tests)",
                self.prefix,
                f.rel,
                f.code_lines(),
                f.lines,
                f.test_lines
            );
        }
        Some(s)
    }

    fn longest_fns(&self) -> Vec<&FnLen> {
        let mut fns: Vec<&FnLen> = self.fns.iter().collect();
        fns.sort_by(|a, b| {
            b.lines
                .cmp(&a.lines)
                .then_with(|| self.files[a.file].rel.cmp(&self.files[b.file].rel))
                .then(a.line.cmp(&b.line))
        });
        fns
    }

    fn fn_failure(&self) -> Option<String> {
        let long: Vec<&FnLen> = self
            .longest_fns()
            .into_iter()
            .filter(|f| f.lines > MAX_FN_LINES)
            .collect();
        if long.is_empty() {
            return None;
        }
        let mut s = format!(
            "{} function(s) outside test code span more than {MAX_FN_LINES} lines (issue 15), \
             counted from the `fn` line to the closing brace. Extract named steps into helper \
             functions (or a small struct with methods) until each is at most {MAX_FN_LINES} \
             lines:\n",
            long.len()
        );
        for f in long {
            let _ = writeln!(
                s,
                "  {} {} ({} lines)",
                self.at(f.file, f.line),
                f.name,
                f.lines
            );
        }
        Some(s)
    }

    /// Everything measured, for planning (`ARCH_REPORT=1`).
    fn report(&self) -> String {
        let mut s = String::new();
        let code_lines: usize = self.code_files().map(SrcFile::code_lines).sum();
        let _ = writeln!(
            s,
            "==== architecture report: {} ({} library files, {} non-test lines, {} modules, {} \
             module references, {} functions) ====",
            self.prefix,
            self.code_files().count(),
            code_lines,
            self.modules.len(),
            self.refs.len(),
            self.fns.len()
        );
        let cycles = self.cycles();
        for (&folder, edges) in &self.graphs {
            let title = if folder == 0 {
                "top-level module graph (a)".to_string()
            } else {
                format!("folder graph (b) inside `{}`", self.path(folder))
            };
            let _ = writeln!(
                s,
                "\n-- {title}: {} modules, {} edges, {} references",
                self.modules[folder].children.len(),
                edges.len(),
                edges.values().map(|e| e.count).sum::<usize>()
            );
            for (&(x, y), e) in edges {
                let (file, line) = e.at[0];
                let _ = writeln!(
                    s,
                    "  {} -> {}: {}, first at {}",
                    self.modules[x].name,
                    self.modules[y].name,
                    Self::refs_label(e.count),
                    self.at(file, line)
                );
            }
        }
        let (top, folders): (Vec<&Cycle>, Vec<&Cycle>) = cycles.iter().partition(|c| c.folder == 0);
        for (title, list) in [("top-level", top), ("folder-level", folders)] {
            let _ = writeln!(
                s,
                "\n-- {title} strongly connected components: {}",
                list.len()
            );
            for c in list {
                s.push_str(&self.describe_cycle(c, true));
            }
        }
        self.report_sizes(&mut s);
        s
    }

    /// The report's part on sizes: the largest files, the longest functions, the files left out.
    fn report_sizes(&self, s: &mut String) {
        let mut files: Vec<&SrcFile> = self.code_files().collect();
        files.sort_by(|a, b| b.code_lines().cmp(&a.code_lines()).then(a.rel.cmp(&b.rel)));
        let over = files
            .iter()
            .filter(|f| f.code_lines() > MAX_FILE_LINES)
            .count();
        let _ = writeln!(
            s,
            "\n-- 20 largest files (non-test lines; {over} over {MAX_FILE_LINES}):"
        );
        for f in files.iter().take(20) {
            let _ = writeln!(
                s,
                "  {:5}  {}{}  ({} in all, {} in tests)",
                f.code_lines(),
                self.prefix,
                f.rel,
                f.lines,
                f.test_lines
            );
        }
        let fns = self.longest_fns();
        let over = fns.iter().filter(|f| f.lines > MAX_FN_LINES).count();
        let _ = writeln!(
            s,
            "\n-- 25 longest functions ({over} over {MAX_FN_LINES} lines):"
        );
        for f in fns.iter().take(25) {
            let _ = writeln!(s, "  {:5}  {} {}", f.lines, self.at(f.file, f.line), f.name);
        }
        let test_only: Vec<&str> = self
            .files
            .iter()
            .filter(|f| f.test_only)
            .map(|f| f.rel.as_str())
            .collect();
        if !test_only.is_empty() {
            let _ = writeln!(
                s,
                "\n-- files marked `#![cfg(test)]`: {}",
                test_only.join(", ")
            );
        }
        let _ = writeln!(
            s,
            "\n-- files under {} outside the library's module tree (the binary, test-only \
             modules, orphans): {}",
            self.prefix,
            self.unreached.len()
        );
        for f in &self.unreached {
            let _ = writeln!(s, "  {}{f}", self.prefix);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The agent's sources
// ---------------------------------------------------------------------------------------------

/// The agent crate's directory: cargo's manifest directory, or the current directory when built
/// without cargo.
fn crate_dir() -> PathBuf {
    match option_env!("CARGO_MANIFEST_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_dir().expect("the current directory"),
    }
}

/// Every `.rs` file under `dir`, relative to `root`, with `/` separators.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            if let Ok(rel) = path.strip_prefix(root) {
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
    }
}

/// The analysis of the agent library, built once per test run (and reported if `ARCH_REPORT=1`).
fn agent() -> &'static Analysis {
    static ANALYSIS: OnceLock<Result<Analysis, String>> = OnceLock::new();
    let result = ANALYSIS.get_or_init(|| {
        let dir = crate_dir();
        let src = dir.join("src");
        if !src.join("lib.rs").is_file() {
            return Err(format!(
                "no {}: build with cargo, or run the test binary from the agent crate's directory",
                src.join("lib.rs").display()
            ));
        }
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
        let prefix = match name {
            Some(n) => format!("{n}/src/"),
            None => "src/".to_string(),
        };
        let read = |rel: &str| std::fs::read_to_string(src.join(rel)).ok();
        let mut a = Analysis::build(&read, &prefix)?;
        let mut all = Vec::new();
        rust_files(&src, &src, &mut all);
        let reached: BTreeSet<&str> = a.code_files().map(|f| f.rel.as_str()).collect();
        let mut unreached: Vec<String> = all
            .into_iter()
            .filter(|f| !reached.contains(f.as_str()))
            .collect();
        unreached.sort();
        a.unreached = unreached;
        if std::env::var("ARCH_REPORT").is_ok_and(|v| v == "1") {
            // Straight to stderr, so the report shows even when the test harness captures output.
            let _ = std::io::stderr().lock().write_all(a.report().as_bytes());
        }
        Ok(a)
    });
    match result {
        Ok(a) => a,
        Err(e) => panic!("the architecture check cannot read the agent's sources: {e}"),
    }
}

#[test]
fn module_graph_has_no_cycle() {
    if let Some(msg) = agent().cycle_failure() {
        panic!("{msg}");
    }
}

#[test]
fn no_source_file_over_600_lines() {
    if let Some(msg) = agent().file_failure() {
        panic!("{msg}");
    }
}

#[test]
fn no_function_over_100_lines() {
    if let Some(msg) = agent().fn_failure() {
        panic!("{msg}");
    }
}

// ---------------------------------------------------------------------------------------------
// Self-checks of the checker, on inline sources
// ---------------------------------------------------------------------------------------------

/// Analyses an in-memory crate given as `(path under src/, source)` pairs.
fn analyse(files: &[(&str, &str)]) -> Analysis {
    let map: BTreeMap<&str, &str> = files.iter().copied().collect();
    let read = |rel: &str| map.get(rel).map(|s| s.to_string());
    Analysis::build(&read, "src/").expect("the snippet parses")
}

/// The edges of the graph of `folder`'s children (`""` for the crate root) as `from->to`.
fn edges(a: &Analysis, folder: &str) -> Vec<String> {
    let folder = if folder.is_empty() { "crate" } else { folder };
    let Some(id) = (0..a.modules.len()).find(|&m| a.path(m) == folder) else {
        return Vec::new();
    };
    a.graphs.get(&id).map_or_else(Vec::new, |g| {
        g.keys()
            .map(|&(x, y)| format!("{}->{}", a.modules[x].name, a.modules[y].name))
            .collect()
    })
}

fn find_fn<'a>(a: &'a Analysis, name: &str) -> Option<&'a FnLen> {
    a.fns.iter().find(|f| f.name == name)
}

#[test]
fn self_check_comments_and_literals_make_no_edge() {
    let a = analyse(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
        (
            "a.rs",
            "//! See [`crate::b::X`].\n\
             /// Uses [`crate::b::X`] and [`crate::pipeline::process::Processor`].\n\
             pub fn f() -> &'static str {\n\
             \x20   /* crate::b /* nested crate::c */ crate::b */\n\
             \x20   let _q = '\"'; let _l: &'static str = \"crate::b::X\";\n\
             \x20   let _r = r##\"crate::b \"# crate::c\"##; let _s = br##\"crate::c\"##;\n\
             \x20   let _c = 'c'; let _e = '\\''; let _u = '\\u{1F600}';\n\
             \x20   r\"crate::c\"\n\
             }\n",
        ),
        ("b.rs", "pub struct X;\n"),
        ("c.rs", "pub fn g<'a>(x: &'a str) -> &'a str { x }\n"),
        ("d.rs", "use crate::c::g;\n"),
    ]);
    assert_eq!(edges(&a, ""), ["d->c"]);
}

#[test]
fn self_check_test_code_makes_no_edge_and_no_lines() {
    let a = analyse(&[
        ("lib.rs", "pub mod x;\npub mod y;\npub mod z;\n"),
        (
            "x.rs",
            "pub fn f() {}\n\
             #[cfg(test)]\n\
             mod tests {\n\
             \x20   use crate::y;\n\
             \x20   fn long() {\n\n\n\n\n}\n\
             }\n\
             #[cfg(all(test, unix))]\n\
             use crate::z::A;\n\
             #[cfg(any(test, feature = \"x\"))]\n\
             use crate::z::B;\n\
             #[test]\n\
             fn t() { crate::y::g(); }\n",
        ),
        ("y.rs", "#[cfg(test)]\nmod tests;\npub fn g() {}\n"),
        ("y/tests.rs", "use crate::x::f;\nfn huge() {\n\n\n}\n"),
        ("z.rs", "pub struct A;\npub struct B;\n"),
    ]);
    // Only the `any(test, ..)` import is not test-only.
    assert_eq!(edges(&a, ""), ["x->z"]);
    assert!(a.files.iter().all(|f| f.rel != "y/tests.rs"));
    assert!(find_fn(&a, "long").is_none() && find_fn(&a, "huge").is_none());
    assert!(find_fn(&a, "t").is_none());
    let x = a.files.iter().find(|f| f.rel == "x.rs").expect("x.rs");
    // Lines 2-11 (the tests module), 12-13 (`all(test, ..)`) and 16-17 (`#[test]`) are tests.
    assert_eq!((x.lines, x.code_lines()), (17, 3));
}

#[test]
fn self_check_paths_groups_and_levels() {
    let a = analyse(&[
        ("lib.rs", "pub mod p;\npub mod q;\npub mod r;\n"),
        ("p/mod.rs", "pub mod one;\npub mod two;\npub struct Top;\n"),
        (
            "p/one.rs",
            "use super::two::Thing;\n\
             use crate::{\n    q::{self, deep::D},\n    r,\n};\n\
             pub fn f() -> crate::p::Top { crate::p::Top }\n",
        ),
        (
            "p/two.rs",
            "pub struct Thing;\npub use self::inner::X;\nmod inner { pub struct X; }\n",
        ),
        ("q.rs", "pub mod deep;\n"),
        (
            "q/deep.rs",
            "pub struct D;\npub fn h() { let _ = super::super::p::two::Thing; }\n",
        ),
        (
            "r.rs",
            "pub fn g() { <crate::p::Top as Default>::default(); }\n\
             macro_rules! m { () => { $crate::p::Top } }\n\
             pub fn h() { comminsight_agent::q::deep::D; }\n",
        ),
    ]);
    assert_eq!(edges(&a, ""), ["p->q", "p->r", "q->p", "r->p", "r->q"]);
    // `crate::p::Top` names only the parent: no edge among p's children.
    assert_eq!(edges(&a, "p"), ["one->two"]);
    let cycles = a.cycles();
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].nodes.len(), 3);
    let msg = a.cycle_failure().expect("a cycle");
    assert!(
        msg.contains("q -> p") && msg.contains("src/q/deep.rs:2"),
        "{msg}"
    );
    assert!(
        msg.contains("p -> q") && msg.contains("src/p/one.rs:3"),
        "{msg}"
    );
}

#[test]
fn self_check_folder_cycle_path_attr_and_inline_modules() {
    let a = analyse(&[
        ("lib.rs", "pub mod s;\n"),
        (
            "s/mod.rs",
            "mod classify;\n#[path = \"idx.rs\"]\npub(crate) mod index;\n\
             pub mod nest {\n    pub mod a { pub fn f() { super::b::g() } }\n    \
             pub mod b { pub fn g() { crate::s::nest::a::f() } }\n}\n",
        ),
        ("s/classify.rs", "use super::index::Shape;\n"),
        (
            "s/idx.rs",
            "pub struct Shape;\npub fn k() { crate::s::classify::run(); }\n",
        ),
    ]);
    assert_eq!(edges(&a, "s"), ["classify->index", "index->classify"]);
    assert_eq!(edges(&a, "s::nest"), ["a->b", "b->a"]);
    let cycles = a.cycles();
    assert_eq!(cycles.len(), 2, "{cycles:?}");
}

#[test]
fn self_check_function_and_file_lengths() {
    let src = "pub struct S;\n\
               impl S {\n\
               \x20   pub fn three(&self) -> [u8; 2] {\n\
               \x20       [1, 2]\n\
               \x20   }\n\
               \x20   fn one() {}\n\
               }\n\
               pub trait T {\n\
               \x20   fn decl(&self);\n\
               \x20   fn provided(&self) where Self: Sized {\n\
               \x20       fn nested() {\n\
               \x20           let _ = |x: u8| { x };\n\
               \x20       }\n\
               \x20       let _s = \"}\";\n\
               \x20   }\n\
               }\n\
               pub type F = fn(u8) -> u8;\n\
               pub const fn r#fn() -> u8 { b'}' }\n";
    let a = analyse(&[("lib.rs", src)]);
    let len = |n: &str| find_fn(&a, n).map(|f| f.lines);
    assert_eq!(len("three"), Some(3));
    assert_eq!(len("one"), Some(1));
    assert_eq!(len("decl"), None);
    assert_eq!(len("provided"), Some(6));
    assert_eq!(len("nested"), Some(3));
    assert_eq!(len("fn"), Some(1));
    assert_eq!(find_fn(&a, "provided").map(|f| f.line), Some(10));
    assert_eq!(a.fns.len(), 5);
    assert_eq!(a.files[0].code_lines(), 18);
}

#[test]
fn self_check_lexer() {
    let toks = lex("a::b 'x' 'y b\"q\" c\"q\" br#\"a\"b\"# r#type 1..2 1.5e-3 0x1f /** d */ x")
        .expect("lexes");
    let kinds: Vec<(Kind, &str)> = toks.iter().map(|t| (t.kind, t.text.as_str())).collect();
    assert_eq!(
        kinds,
        [
            (Kind::Ident, "a"),
            (Kind::Punct, "::"),
            (Kind::Ident, "b"),
            (Kind::Literal, "'x'"),
            (Kind::Lifetime, "'y"),
            (Kind::Literal, "b\"q\""),
            (Kind::Literal, "c\"q\""),
            (Kind::Literal, "br#\"a\"b\"#"),
            (Kind::RawIdent, "type"),
            (Kind::Literal, "1"),
            (Kind::Punct, "."),
            (Kind::Punct, "."),
            (Kind::Literal, "2"),
            (Kind::Literal, "1.5e-3"),
            (Kind::Literal, "0x1f"),
            (Kind::Doc, ""),
            (Kind::Ident, "x"),
        ]
    );
    let multi = lex("\"a\nb\" r\"\n\" /*\n*/ x").expect("lexes");
    assert_eq!(multi.last().map(|t| t.line), Some(4));
    assert!(match_delims(&lex("fn f() { (] }").expect("lexes")).is_err());
}

#[test]
fn self_check_own_source() {
    // This file is full of quotes, braces and `crate::` inside strings: it must lex, and it keeps
    // the rules it checks.
    let a = analyse(&[("lib.rs", include_str!("architecture.rs"))]);
    let long: Vec<String> = a
        .fns
        .iter()
        .filter(|f| f.lines > MAX_FN_LINES)
        .map(|f| format!("{}:{} ({} lines)", f.name, f.line, f.lines))
        .collect();
    assert!(long.is_empty(), "{long:?}");
    assert!(a.refs.iter().all(|r| r.src == 0 && r.dst == 0));
}
