//! Arguments in text form (protocol 0) and integers in binary form.

use super::Value;

/// Longest text integer read (Python's own default limit on digits is 4 300).
const MAX_DIGITS: usize = 4300;

/// `INT` (`I01`/`I00` are booleans), `LONG` (a trailing `L` allowed) or `FLOAT`, as text.
pub(super) fn number(op: u8, line: &[u8]) -> Option<Value> {
    let s = std::str::from_utf8(line).ok()?.trim();
    if op == b'F' {
        return s.parse::<f64>().ok().map(Value::Float);
    }
    if op == b'I' && s == "01" {
        return Some(Value::Bool(true));
    }
    if op == b'I' && s == "00" {
        return Some(Value::Bool(false));
    }
    let s = if op == b'L' {
        s.strip_suffix('L').unwrap_or(s)
    } else {
        s
    };
    if let Ok(i) = s.parse::<i64>() {
        return Some(Value::Int(i));
    }
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let d = digits.trim_start_matches('0');
    let d = if d.is_empty() { "0" } else { d };
    Some(Value::BigInt(if neg {
        format!("-{d}")
    } else {
        d.to_string()
    }))
}

/// A string that is valid UTF-8, else bytes (Python 2 `str` pickled by protocols 0-2).
pub(super) fn str_or_bytes(b: Vec<u8>) -> Value {
    match String::from_utf8(b) {
        Ok(s) => Value::Str(s),
        Err(e) => Value::Bytes(e.into_bytes()),
    }
}

/// The content of a `STRING` argument: quoted with `'` or `"`, Python escapes decoded.
pub(super) fn quoted(line: &[u8]) -> Option<Vec<u8>> {
    let q = *line.first()?;
    if line.len() < 2 || (q != b'\'' && q != b'"') || line.last() != Some(&q) {
        return None;
    }
    let inner = line.get(1..line.len() - 1)?;
    let mut out = Vec::with_capacity(inner.len());
    let mut i = 0;
    while let Some(&c) = inner.get(i) {
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = inner.get(i) else {
            out.push(b'\\');
            break;
        };
        i += 1;
        match e {
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'v' => out.push(11),
            b'\n' => {}
            b'x' => {
                let h = inner
                    .get(i..i + 2)
                    .and_then(|h| std::str::from_utf8(h).ok());
                let v = h.and_then(|h| u8::from_str_radix(h, 16).ok())?;
                out.push(v);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match inner.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push((v & 0xff) as u8);
            }
            b'\\' | b'\'' | b'"' => out.push(e),
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Some(out)
}

/// A `UNICODE` argument: raw-unicode-escape (`\uXXXX`, `\UXXXXXXXX`; other bytes Latin-1).
pub(super) fn raw_unicode_escape(line: &[u8]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while let Some(&c) = line.get(i) {
        if c == b'\\' {
            let width = match line.get(i + 1) {
                Some(b'u') => 4,
                Some(b'U') => 8,
                _ => 0,
            };
            let ch = line
                .get(i + 2..i + 2 + width)
                .filter(|_| width > 0)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .and_then(char::from_u32);
            if let Some(ch) = ch {
                out.push(ch);
                i += 2 + width;
                continue;
            }
        }
        out.push(char::from(c));
        i += 1;
    }
    out
}

/// A little-endian two's-complement integer (`LONG1`/`LONG4`): `Int` when it fits, else
/// `BigInt` in decimal. The caller bounds the width.
pub(super) fn long_le(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Int(0);
    }
    let neg = b.last().is_some_and(|x| x & 0x80 != 0);
    if b.len() <= 8 {
        let fill = if neg { 0xff } else { 0 };
        let mut a = [fill; 8];
        a.get_mut(..b.len())
            .into_iter()
            .for_each(|d| d.copy_from_slice(b));
        return Value::Int(i64::from_le_bytes(a));
    }
    // Magnitude: negate two's complement when negative.
    let mut mag: Vec<u8> = b.to_vec();
    if neg {
        let mut carry = true;
        for x in mag.iter_mut() {
            *x = !*x;
            if carry {
                let (v, c) = x.overflowing_add(1);
                *x = v;
                carry = c;
            }
        }
    }
    let digits = decimal(&mag);
    Value::BigInt(if neg { format!("-{digits}") } else { digits })
}

/// A little-endian unsigned magnitude in decimal.
fn decimal(le: &[u8]) -> String {
    // Base 2^32 limbs, most significant first, divided by 10^9 repeatedly.
    let mut limbs: Vec<u32> = le
        .chunks(4)
        .rev()
        .map(|c| {
            let mut a = [0u8; 4];
            a.get_mut(..c.len())
                .into_iter()
                .for_each(|d| d.copy_from_slice(c));
            u32::from_le_bytes(a)
        })
        .collect();
    let mut parts: Vec<u32> = Vec::new();
    while limbs.iter().any(|l| *l != 0) {
        let mut rem: u64 = 0;
        for l in limbs.iter_mut() {
            let cur = (rem << 32) | u64::from(*l);
            *l = (cur / 1_000_000_000) as u32;
            rem = cur % 1_000_000_000;
        }
        parts.push(rem as u32);
        while limbs.first() == Some(&0) {
            limbs.remove(0);
        }
    }
    let mut s = parts
        .pop()
        .map_or_else(|| "0".to_string(), |p| p.to_string());
    while let Some(p) = parts.pop() {
        s.push_str(&format!("{p:09}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_longs_fit_or_go_decimal() {
        assert_eq!(long_le(&[]), Value::Int(0));
        assert_eq!(long_le(&[0xff]), Value::Int(-1));
        assert_eq!(long_le(&[0x00, 0x80]), Value::Int(-32768));
        // 2^64 = 00..00 01 00
        let mut b = vec![0u8; 8];
        b.extend([1, 0]);
        assert_eq!(long_le(&b), Value::BigInt("18446744073709551616".into()));
        // -(2^64)
        let mut b = vec![0u8; 8];
        b.extend([0xff, 0xff]);
        assert_eq!(long_le(&b), Value::BigInt("-18446744073709551616".into()));
    }

    #[test]
    fn text_forms() {
        assert_eq!(number(b'I', b"01"), Some(Value::Bool(true)));
        assert_eq!(number(b'L', b"-12L"), Some(Value::Int(-12)));
        assert_eq!(
            number(b'I', b"99999999999999999999"),
            Some(Value::BigInt("99999999999999999999".into()))
        );
        assert_eq!(number(b'F', b"1.5"), Some(Value::Float(1.5)));
        assert_eq!(number(b'I', b"x"), None);
        assert_eq!(quoted(b"'a\\n\\x41\\101'"), Some(b"a\nAA".to_vec()));
        assert_eq!(quoted(b"'a"), None);
        assert_eq!(
            raw_unicode_escape(b"a\\u00e9\\U0001F600"),
            "a\u{e9}\u{1F600}"
        );
    }
}
