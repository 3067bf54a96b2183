//! One sample line of the Prometheus text exposition format (version 0.0.4), as Prometheus
//! itself reads it:
//!
//! ```text
//! metric_name [ "{" label_name "=" '"' label_value '"' { "," label_name "=" '"' label_value '"' } [ "," ] "}" ] value [ timestamp ]
//! ```
//!
//! Blanks (spaces, tabs) may separate the tokens; a label value escapes `\\`, `\"` and `\n`;
//! `value` is a Go float (`NaN`, `+Inf`, `-Inf`, integers, decimals, exponents) and `timestamp`
//! an integer of milliseconds. A label name may appear once. Our own reader: the format is a
//! few lines of grammar, and the crate we used before is LGPL-3.0 (refused by `deny.toml`).

use std::collections::BTreeMap;

/// A sample's value: an integer exactly as written (DCGM's blanks are integers near `i64::MAX`,
/// which an `f64` cannot tell apart), or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
}

/// One parsed sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: BTreeMap<String, String>,
    pub value: Number,
    pub timestamp_ms: Option<i64>,
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn is_name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

struct Cursor<'a> {
    s: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.at).copied()
    }

    fn blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", c as char, self.at))
        }
    }

    /// A metric or label name (label names may not contain `:`; checked by the caller).
    fn name(&mut self) -> Result<&'a str, String> {
        let start = self.at;
        if !self.peek().is_some_and(is_name_start) {
            return Err(format!("expected a name at byte {start}"));
        }
        while self.peek().is_some_and(is_name_char) {
            self.at += 1;
        }
        Ok(&self.s[start..self.at])
    }

    /// A blank-free token (the value or the timestamp).
    fn token(&mut self) -> &'a str {
        let start = self.at;
        while self.peek().is_some_and(|c| c != b' ' && c != b'\t') {
            self.at += 1;
        }
        &self.s[start..self.at]
    }

    /// A quoted label value with its escapes resolved.
    fn quoted(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        let rest = &self.s[self.at..];
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.at += i + 1;
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, '"')) => out.push('"'),
                    Some((_, e)) => return Err(format!("unknown escape \\{e} in a label value")),
                    None => break,
                },
                c => out.push(c),
            }
        }
        Err("unterminated label value".into())
    }

    fn labels(&mut self) -> Result<BTreeMap<String, String>, String> {
        let mut labels = BTreeMap::new();
        self.expect(b'{')?;
        loop {
            self.blanks();
            if self.peek() == Some(b'}') {
                self.at += 1;
                return Ok(labels);
            }
            let name = self.name()?;
            if name.contains(':') {
                return Err(format!("label name {name:?} contains ':'"));
            }
            self.blanks();
            self.expect(b'=')?;
            self.blanks();
            let value = self.quoted()?;
            if labels.insert(name.to_string(), value).is_some() {
                return Err(format!("label {name:?} given twice"));
            }
            self.blanks();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {}
                _ => return Err(format!("expected ',' or '}}' at byte {}", self.at)),
            }
        }
    }
}

/// A Go `ParseFloat` number as Prometheus writes and reads it.
fn number(t: &str) -> Result<Number, String> {
    if let Ok(i) = t.parse::<i64>() {
        return Ok(Number::Int(i));
    }
    let f = match t {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        // Rust also takes "inf", "infinity" and "nan" in any case: Go's spellings only.
        _ if t
            .bytes()
            .any(|b| b.is_ascii_alphabetic() && !matches!(b, b'e' | b'E')) =>
        {
            return Err(format!("value {t:?} is not a number"))
        }
        _ => t
            .parse::<f64>()
            .map_err(|_| format!("value {t:?} is not a number"))?,
    };
    Ok(Number::Float(f))
}

/// Parse one sample line (no comment, no line break).
pub fn sample(line: &str) -> Result<Sample<'_>, String> {
    let mut c = Cursor { s: line, at: 0 };
    c.blanks();
    let name = c.name()?;
    c.blanks();
    let labels = if c.peek() == Some(b'{') {
        c.labels()?
    } else {
        BTreeMap::new()
    };
    c.blanks();
    let value = number(c.token())?;
    c.blanks();
    let ts = c.token();
    let timestamp_ms = if ts.is_empty() {
        None
    } else {
        Some(
            ts.parse::<i64>()
                .map_err(|_| format!("timestamp {ts:?} is not an integer"))?,
        )
    };
    c.blanks();
    if c.at != line.len() {
        return Err(format!("unexpected text at byte {}", c.at));
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar_as_prometheus_reads_it() {
        let s = sample(r#"m{a="x\"y\\z\n",b = "",} 12 1700000000000"#).unwrap();
        assert_eq!(s.name, "m");
        assert_eq!(s.labels["a"], "x\"y\\z\n");
        assert_eq!(s.labels["b"], "");
        assert_eq!(
            (s.value, s.timestamp_ms),
            (Number::Int(12), Some(1_700_000_000_000))
        );
        let s = sample("ns:metric_total\t-1.5e3").unwrap();
        assert_eq!(
            (s.name, s.value),
            ("ns:metric_total", Number::Float(-1500.0))
        );
        assert!(matches!(sample("m NaN").unwrap().value, Number::Float(f) if f.is_nan()));
        assert_eq!(
            sample("m +Inf").unwrap().value,
            Number::Float(f64::INFINITY)
        );
        assert_eq!(
            sample("m{} -Inf").unwrap().value,
            Number::Float(f64::NEG_INFINITY)
        );
        for bad in [
            "",
            "1m 2",
            "m",
            "m{a=\"1\" 2",
            "m{a=\"1\",a=\"2\"} 3",
            "m{a:b=\"1\"} 3",
            "m{a=1} 3",
            "m{a=\"\\q\"} 3",
            "m{a=\"open} 3",
            "m infinity",
            "m 1 2 3",
            "m 1 1.5",
            "m{a=\"1\"b=\"2\"} 3",
        ] {
            assert!(sample(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn non_ascii_label_values_and_cut_lines_never_panic() {
        assert_eq!(sample("m{a=\"é✓\"} 1").unwrap().labels["a"], "é✓");
        let line = "m{a=\"é✓\",b=\"2\"} 1 5";
        for cut in 0..=line.len() {
            if line.is_char_boundary(cut) {
                let _ = sample(&line[..cut]);
            }
        }
    }
}
