//! A pickle reader that never executes anything: it interprets only the opcodes that build plain
//! data (numbers, strings, bytes, `None`, booleans, lists, tuples, dicts, sets) and rejects every
//! opcode that would import a name, call it or build an object (`GLOBAL`, `STACK_GLOBAL`,
//! `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`, `EXT1`-`EXT4`, `PERSID`,
//! `BINPERSID`, `NEXT_BUFFER`, `READONLY_BUFFER`) before acting on it. Protocols 0 to 5.
//!
//! Values are built in an arena first: the memo holds handles, so a list fetched from the memo
//! (`GET`) and appended to afterwards is seen with its final content wherever it was referenced,
//! as Python would see it. The tree handed out ([`Value`]) copies shared parts once per
//! reference; a self-referencing container (which JSON cannot hold either) is refused as too
//! deep.
//!
//! Bounded: every opcode creates at most one node and pushes at most one handle, so the arena,
//! the stack and the memo stay below the input's length; the tree is at most [`MAX_DEPTH`] deep
//! and its size (nodes plus string and byte payloads, shared parts counted once per copy) below
//! `16 * input + 1 Mi`; integers wider than [`MAX_INT_BYTES`] are refused. No input panics.

mod ops;
#[cfg(test)]
pub(crate) mod tests;
mod text;

/// Deepest nesting of containers a parsed value may have.
pub const MAX_DEPTH: usize = 200;

/// Widest integer read (`LONG1`/`LONG4` bytes; about 2 460 decimal digits).
pub const MAX_INT_BYTES: usize = 1024;

/// A plain Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer beyond `i64`, in decimal (`-` sign when negative).
    BigInt(String),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Key/value pairs in the order the pickle set them. A key set twice appears twice
    /// (Python keeps the last value; [`Value::get`] and [`Value::to_json`] do too).
    Dict(Vec<(Value, Value)>),
    /// `set` and `frozenset`, in pickle order.
    Set(Vec<Value>),
}

/// Why a pickle was refused. One line, naming the byte offset where it applies.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickleError {
    /// An opcode that would import, call or build an object: refused before acting on it.
    #[error("pickle opcode {opcode} at byte {offset} refused{what}: only plain data (numbers, strings, lists, tuples, dicts, sets) is read, nothing is imported or executed")]
    Refused {
        opcode: &'static str,
        offset: usize,
        /// ` (wanted module.name)` for `GLOBAL`, `STACK_GLOBAL` and `INST`, else empty.
        what: String,
    },
    /// A byte that is no pickle opcode.
    #[error(
        "byte 0x{byte:02x} at offset {offset} is not a pickle opcode (not a pickle, or corrupt)"
    )]
    UnknownOpcode { byte: u8, offset: usize },
    /// The input ends before the pickle does.
    #[error("pickle truncated at byte {offset}: {what}")]
    Truncated { offset: usize, what: String },
    /// Well-formed bytes that make no sense (stack underflow, bad memo key, bad text number...).
    #[error("invalid pickle at byte {offset}: {what}")]
    Invalid { offset: usize, what: String },
    /// A limit this reader sets (depth, size, integer width).
    #[error("pickle beyond a limit at byte {offset}: {what}")]
    Limit { offset: usize, what: String },
}

/// Parse a whole pickle (up to its `STOP`; bytes after it are ignored) into a [`Value`].
pub fn parse(bytes: &[u8]) -> Result<Value, PickleError> {
    let mut m = ops::Machine::new(bytes);
    let root = m.run()?;
    let budget = bytes.len().saturating_mul(16).saturating_add(1 << 20);
    m.arena.build(root, budget)
}

/// Handle of a node in the arena.
type Id = usize;

/// A value under construction: scalars whole, containers as handles of their items.
#[derive(Debug)]
enum Node {
    Scalar(Value),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
}

/// Every node a pickle created.
#[derive(Debug, Default)]
struct Arena {
    nodes: Vec<Node>,
}

impl Arena {
    fn push(&mut self, n: Node) -> Id {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// The tree under `root`, at most [`MAX_DEPTH`] deep and `budget` units large.
    fn build(&self, root: Id, budget: usize) -> Result<Value, PickleError> {
        let mut left = budget;
        self.build_at(root, 0, &mut left)
    }

    fn build_at(&self, id: Id, depth: usize, left: &mut usize) -> Result<Value, PickleError> {
        if depth > MAX_DEPTH {
            return Err(limit(format!(
                "containers nested deeper than {MAX_DEPTH} (or one that contains itself)"
            )));
        }
        let node = self
            .nodes
            .get(id)
            .ok_or_else(|| limit("dangling reference".into()))?;
        let cost = match node {
            Node::Scalar(Value::Str(s)) => s.len(),
            Node::Scalar(Value::Bytes(b)) => b.len(),
            Node::Scalar(Value::BigInt(s)) => s.len(),
            _ => 0,
        }
        .saturating_add(1);
        *left = left.checked_sub(cost).ok_or_else(|| {
            limit("the value is too large once shared parts are copied (a memo bomb?)".into())
        })?;
        let items = |v: &[Id], left: &mut usize| -> Result<Vec<Value>, PickleError> {
            v.iter()
                .map(|i| self.build_at(*i, depth + 1, left))
                .collect()
        };
        Ok(match node {
            Node::Scalar(v) => v.clone(),
            Node::List(v) => Value::List(items(v, left)?),
            Node::Tuple(v) => Value::Tuple(items(v, left)?),
            Node::Set(v) => Value::Set(items(v, left)?),
            Node::Dict(v) => {
                let mut out = Vec::with_capacity(v.len());
                for (k, x) in v {
                    let k = self.build_at(*k, depth + 1, left)?;
                    out.push((k, self.build_at(*x, depth + 1, left)?));
                }
                Value::Dict(out)
            }
        })
    }
}

/// A limit error found after parsing (no offset applies: 0).
fn limit(what: String) -> PickleError {
    PickleError::Limit { offset: 0, what }
}

impl Value {
    /// The value of `key` in a dict with string keys (the last one set when repeated).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(kv) => kv
                .iter()
                .rev()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The JSON form Python's `json.dump` would write: tuples and sets as arrays, dict keys as
    /// strings (a string as-is, anything else as its text), bytes as a lossy UTF-8 string,
    /// NaN and infinities as `null`, integers beyond `u64`/`i64` as floats (as `serde_json`
    /// reads such numbers).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::None => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::BigInt(s) => big_json(s),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Bytes(b) => J::String(String::from_utf8_lossy(b).into_owned()),
            Value::List(v) | Value::Tuple(v) | Value::Set(v) => {
                J::Array(v.iter().map(Value::to_json).collect())
            }
            Value::Dict(kv) => {
                let mut m = serde_json::Map::new();
                for (k, v) in kv {
                    m.insert(k.key_text(), v.to_json());
                }
                J::Object(m)
            }
        }
    }

    /// A dict key as JSON object key text.
    fn key_text(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::None => "null".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::BigInt(s) => s.clone(),
            Value::Float(f) => format!("{f:?}"),
            Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            other => other.to_json().to_string(),
        }
    }
}

/// A decimal integer beyond `i64` as JSON: a `u64` when it fits, else the nearest float.
fn big_json(s: &str) -> serde_json::Value {
    if let Ok(u) = s.parse::<u64>() {
        return serde_json::Value::from(u);
    }
    s.parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}
