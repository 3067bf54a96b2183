//! A JSON value read leniently: scalars kept, anything else (or a wrong type) read as absent,
//! so that one odd field never fails a whole trace.

use std::fmt;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// Any JSON value, kept only when it is a scalar.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Loose {
    #[default]
    None,
    Int(i128),
    Float(f64),
    Str(String),
    /// An array of integers (`"Process Group Ranks"` in some writers).
    Ints(Vec<i64>),
}

impl Loose {
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Loose::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A non-negative integer (an integral float or a decimal string too).
    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Loose::Int(i) => u64::try_from(*i).ok(),
            Loose::Float(f) if f.is_finite() && *f >= 0.0 && *f < 1.8e19 => Some(*f as u64),
            Loose::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Loose::Int(i) => i64::try_from(*i).ok(),
            Loose::Float(f) if f.is_finite() && f.abs() < 9.2e18 => Some(*f as i64),
            Loose::Str(s) => s.trim().parse().ok(),
            _ => None,
        }
    }

    /// Microseconds as integer nanoseconds (exact for integral µs and for fractions to 1 ns).
    pub(crate) fn us_to_ns(&self) -> Option<i128> {
        match self {
            Loose::Int(i) => i.checked_mul(1000),
            Loose::Float(f) if f.is_finite() && f.abs() < 1e17 => {
                let t = f.trunc();
                Some(t as i128 * 1000 + ((f - t) * 1000.0).round() as i128)
            }
            Loose::Str(s) => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|f| Loose::Float(f).us_to_ns()),
            _ => None,
        }
    }

    /// A name: a string, or a number written as its decimal form.
    pub(crate) fn to_name(&self) -> Option<String> {
        match self {
            Loose::Str(s) => Some(s.clone()),
            Loose::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }
}

struct LooseVisitor;

impl<'de> Visitor<'de> for LooseVisitor {
    type Value = Loose;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Loose, E> {
        Ok(Loose::None)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Loose, E> {
        Ok(Loose::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Loose, E> {
        Ok(Loose::Int(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Loose, E> {
        Ok(Loose::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Loose, E> {
        Ok(Loose::Str(v.chars().take(4096).collect()))
    }
    fn visit_unit<E>(self) -> Result<Loose, E> {
        Ok(Loose::None)
    }
    fn visit_none<E>(self) -> Result<Loose, E> {
        Ok(Loose::None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Loose, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Loose, A::Error> {
        let mut v = Vec::new();
        let mut ints = true;
        while let Some(x) = seq.next_element::<Loose>()? {
            match x.as_i64() {
                Some(i) if ints && v.len() < super::MAX_PG_RANKS => v.push(i),
                _ => ints = false,
            }
        }
        Ok(if ints { Loose::Ints(v) } else { Loose::None })
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Loose, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Loose::None)
    }
}

impl<'de> Deserialize<'de> for Loose {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Loose, D::Error> {
        d.deserialize_any(LooseVisitor)
    }
}
