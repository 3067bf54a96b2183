//! The opcode interpreter: a stack machine over the arena, plain-data opcodes only.

use std::collections::HashMap;

use super::{text, Arena, Id, Node, PickleError, Value, MAX_INT_BYTES};

/// The pickle virtual machine, minus everything that imports or calls.
pub(super) struct Machine<'a> {
    input: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run (for errors).
    at: usize,
    pub(super) arena: Arena,
    stack: Vec<Id>,
    /// Stack lengths at each `MARK`.
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

/// What one opcode did.
enum Step {
    Go,
    Stop(Id),
}

/// The opcodes refused, with their names.
fn refused(op: u8) -> Option<&'static str> {
    Some(match op {
        b'c' => "GLOBAL",
        0x93 => "STACK_GLOBAL",
        b'R' => "REDUCE",
        b'b' => "BUILD",
        b'i' => "INST",
        b'o' => "OBJ",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => return None,
    })
}

/// At most this many characters of a wanted `module.name` are quoted in an error.
const QUOTE_MAX: usize = 80;

fn quote(s: &str) -> String {
    let mut q: String = s.chars().take(QUOTE_MAX).collect();
    if s.chars().nth(QUOTE_MAX).is_some() {
        q.push_str("...");
    }
    q.escape_debug().to_string()
}

impl<'a> Machine<'a> {
    pub(super) fn new(input: &'a [u8]) -> Machine<'a> {
        Machine {
            input,
            pos: 0,
            at: 0,
            arena: Arena::default(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    /// Run to `STOP`; the handle of the value it returns.
    pub(super) fn run(&mut self) -> Result<Id, PickleError> {
        loop {
            self.at = self.pos;
            let op = self.take(1, "an opcode")?.first().copied().unwrap_or(0);
            if let Some(name) = refused(op) {
                return Err(self.refuse(op, name));
            }
            if let Step::Stop(id) = self.step(op)? {
                return Ok(id);
            }
        }
    }

    /// The error for a refused opcode, with the name it wanted where it says.
    fn refuse(&self, op: u8, name: &'static str) -> PickleError {
        let what = match op {
            b'c' | b'i' => {
                let rest = self.input.get(self.pos..).unwrap_or_default();
                let mut lines = rest.split(|b| *b == b'\n');
                let m = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
                let n = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
                format!(" (wanted {})", quote(&format!("{m}.{n}")))
            }
            0x93 => {
                let s = |i: usize| -> String {
                    let id = self
                        .stack
                        .len()
                        .checked_sub(i)
                        .and_then(|j| self.stack.get(j));
                    match id.and_then(|id| self.arena.nodes.get(*id)) {
                        Some(Node::Scalar(Value::Str(s))) => s.clone(),
                        _ => "?".into(),
                    }
                };
                format!(" (wanted {})", quote(&format!("{}.{}", s(2), s(1))))
            }
            _ => String::new(),
        };
        PickleError::Refused {
            opcode: name,
            offset: self.at,
            what,
        }
    }

    pub(super) fn invalid(&self, what: impl Into<String>) -> PickleError {
        PickleError::Invalid {
            offset: self.at,
            what: what.into(),
        }
    }

    pub(super) fn limit(&self, what: impl Into<String>) -> PickleError {
        PickleError::Limit {
            offset: self.at,
            what: what.into(),
        }
    }

    /// The next `n` bytes.
    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], PickleError> {
        let left = self.input.len().saturating_sub(self.pos);
        let end = self.pos.checked_add(n).filter(|_| n <= left);
        match end.and_then(|e| self.input.get(self.pos..e)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => Err(PickleError::Truncated {
                offset: self.at,
                what: format!("{what} needs {n} bytes, {left} remain"),
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], PickleError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.array::<1>("a 1-byte argument")?[0])
    }

    fn u32le(&mut self) -> Result<u32, PickleError> {
        Ok(u32::from_le_bytes(self.array("a 4-byte argument")?))
    }

    fn u64le(&mut self) -> Result<u64, PickleError> {
        Ok(u64::from_le_bytes(self.array("an 8-byte argument")?))
    }

    /// A length argument as usize (checked against the input by [`Machine::take`]).
    fn len_of(&self, n: u64) -> usize {
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    /// The bytes up to the next newline (the newline consumed, not returned).
    pub(super) fn line(&mut self) -> Result<&'a [u8], PickleError> {
        let rest = self.input.get(self.pos..).unwrap_or_default();
        match rest.iter().position(|b| *b == b'\n') {
            Some(i) => {
                let l = rest.get(..i).unwrap_or_default();
                self.pos += i + 1;
                Ok(l)
            }
            None => Err(PickleError::Truncated {
                offset: self.at,
                what: "a text argument has no end of line".into(),
            }),
        }
    }

    fn push(&mut self, v: Value) {
        let id = self.arena.push(Node::Scalar(v));
        self.stack.push(id);
    }

    fn push_node(&mut self, n: Node) {
        let id = self.arena.push(n);
        self.stack.push(id);
    }

    fn pop(&mut self) -> Result<Id, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(self.invalid("stack underflow"));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.invalid("stack underflow"))
    }

    fn top(&self) -> Result<Id, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        match self.stack.last() {
            Some(id) if self.stack.len() > floor => Ok(*id),
            _ => Err(self.invalid("stack underflow")),
        }
    }

    /// Everything above the last `MARK`, the mark dropped.
    fn pop_mark(&mut self) -> Result<Vec<Id>, PickleError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.invalid("no MARK before an opcode that needs one"))?;
        let m = m.min(self.stack.len());
        Ok(self.stack.split_off(m))
    }

    /// The last `n` stack items.
    fn pop_n(&mut self, n: usize) -> Result<Vec<Id>, PickleError> {
        let floor = self.marks.last().copied().unwrap_or(0);
        let m = self
            .stack
            .len()
            .checked_sub(n)
            .filter(|m| *m >= floor)
            .ok_or_else(|| self.invalid("stack underflow"))?;
        Ok(self.stack.split_off(m))
    }

    fn node_mut(&mut self, id: Id) -> Result<&mut Node, PickleError> {
        let e = self.invalid("dangling stack entry");
        self.arena.nodes.get_mut(id).ok_or(e)
    }

    fn memo_put(&mut self, key: u64) -> Result<(), PickleError> {
        let top = self.top()?;
        if self.memo.len() >= self.input.len() && !self.memo.contains_key(&key) {
            return Err(self.limit("more memo entries than input bytes"));
        }
        self.memo.insert(key, top);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), PickleError> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.invalid(format!("memo key {key} was never set")))?;
        self.stack.push(id);
        Ok(())
    }

    /// Append `items` to the list (or set, for `ADDITEMS`) at the top of the stack.
    fn extend(&mut self, items: Vec<Id>, set: bool) -> Result<(), PickleError> {
        let target = self.top()?;
        match (self.node_mut(target)?, set) {
            (Node::List(v), false) | (Node::Set(v), true) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(self.invalid(if set {
                "ADDITEMS on something that is not a set"
            } else {
                "APPEND(S) on something that is not a list"
            })),
        }
    }

    /// Set `items` (key, value, key, value...) in the dict at the top of the stack.
    fn set_items(&mut self, items: Vec<Id>) -> Result<(), PickleError> {
        if !items.len().is_multiple_of(2) {
            return Err(self.invalid("SETITEMS with an odd number of items"));
        }
        let target = self.top()?;
        let pairs: Vec<(Id, Id)> = items.chunks_exact(2).map(|c| (c[0], c[1])).collect();
        match self.node_mut(target)? {
            Node::Dict(v) => {
                v.extend(pairs);
                Ok(())
            }
            _ => Err(self.invalid("SETITEM(S) on something that is not a dict")),
        }
    }

    /// Run one opcode.
    fn step(&mut self, op: u8) -> Result<Step, PickleError> {
        match op {
            0x80 => {
                let p = self.u8()?;
                if p > 5 {
                    return Err(
                        self.invalid(format!("pickle protocol {p} (this reader knows 0 to 5)"))
                    );
                }
            }
            0x95 => {
                self.u64le()?;
            }
            b'.' => return self.pop().map(Step::Stop),
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                // Python pops the mark when nothing is above it.
                let floor = self.marks.last().copied();
                if floor.is_some_and(|f| f >= self.stack.len()) {
                    self.pop_mark()?;
                } else {
                    self.pop()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let t = self.top()?;
                self.stack.push(t);
            }
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(self.array("BININT")?);
                self.push(Value::Int(i64::from(v)));
            }
            b'K' => {
                let v = self.u8()?;
                self.push(Value::Int(i64::from(v)));
            }
            b'M' => {
                let v = u16::from_le_bytes(self.array("BININT2")?);
                self.push(Value::Int(i64::from(v)));
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    u64::from(self.u8()?)
                } else {
                    u64::from(self.u32le()?)
                };
                let n = self.len_of(n);
                if n > MAX_INT_BYTES {
                    return Err(self.limit(format!(
                        "an integer of {n} bytes (at most {MAX_INT_BYTES} are read)"
                    )));
                }
                let b = self.take(n, "LONG")?;
                self.push(text::long_le(b));
            }
            b'G' => {
                let v = f64::from_be_bytes(self.array("BINFLOAT")?);
                self.push(Value::Float(v));
            }
            b'I' | b'L' | b'F' => {
                let l = self.line()?;
                let v = text::number(op, l)
                    .ok_or_else(|| self.invalid("a text number that does not parse"))?;
                self.push(v);
            }
            b'S' => {
                let l = self.line()?;
                let b = text::quoted(l)
                    .ok_or_else(|| self.invalid("a STRING argument that is not quoted"))?;
                self.push(text::str_or_bytes(b));
            }
            b'V' => {
                let l = self.line()?;
                self.push(Value::Str(text::raw_unicode_escape(l)));
            }
            b'T' | b'U' | b'B' | b'C' | b'X' | 0x8c | 0x8d | 0x8e | 0x96 => self.sized(op)?,
            _ => return self.container(op),
        }
        Ok(Step::Go)
    }

    /// The string and bytes opcodes with a binary length.
    fn sized(&mut self, op: u8) -> Result<(), PickleError> {
        let n = match op {
            b'U' | b'C' | 0x8c => u64::from(self.u8()?),
            b'T' | b'B' | b'X' => u64::from(self.u32le()?),
            _ => self.u64le()?,
        };
        let n = self.len_of(n);
        let b = self.take(n, "a string or bytes argument")?;
        let v = match op {
            b'T' | b'U' => text::str_or_bytes(b.to_vec()),
            b'X' | 0x8c | 0x8d => Value::Str(
                std::str::from_utf8(b)
                    .map_err(|_| self.invalid("a unicode string that is not UTF-8"))?
                    .to_string(),
            ),
            _ => Value::Bytes(b.to_vec()),
        };
        self.push(v);
        Ok(())
    }

    /// Containers and the memo.
    fn container(&mut self, op: u8) -> Result<Step, PickleError> {
        match op {
            b']' => self.push_node(Node::List(Vec::new())),
            b')' => self.push_node(Node::Tuple(Vec::new())),
            b'}' => self.push_node(Node::Dict(Vec::new())),
            0x8f => self.push_node(Node::Set(Vec::new())),
            b'l' => {
                let v = self.pop_mark()?;
                self.push_node(Node::List(v));
            }
            b't' => {
                let v = self.pop_mark()?;
                self.push_node(Node::Tuple(v));
            }
            0x91 => {
                let v = self.pop_mark()?;
                self.push_node(Node::Set(v));
            }
            0x85..=0x87 => {
                let v = self.pop_n(usize::from(op - 0x84))?;
                self.push_node(Node::Tuple(v));
            }
            b'd' => {
                let v = self.pop_mark()?;
                if !v.len().is_multiple_of(2) {
                    return Err(self.invalid("DICT with an odd number of items"));
                }
                self.push_node(Node::Dict(
                    v.chunks_exact(2).map(|c| (c[0], c[1])).collect(),
                ));
            }
            b'a' => {
                let v = self.pop()?;
                self.extend(vec![v], false)?;
            }
            b'e' => {
                let v = self.pop_mark()?;
                self.extend(v, false)?;
            }
            0x90 => {
                let v = self.pop_mark()?;
                self.extend(v, true)?;
            }
            b's' => {
                let v = self.pop_n(2)?;
                self.set_items(v)?;
            }
            b'u' => {
                let v = self.pop_mark()?;
                self.set_items(v)?;
            }
            _ => return self.memo_op(op),
        }
        Ok(Step::Go)
    }

    fn memo_op(&mut self, op: u8) -> Result<Step, PickleError> {
        match op {
            b'p' | b'g' => {
                let l = self.line()?;
                let k = std::str::from_utf8(l)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .ok_or_else(|| self.invalid("a memo key that is not a number"))?;
                if op == b'p' {
                    self.memo_put(k)?
                } else {
                    self.memo_get(k)?
                }
            }
            b'q' => {
                let k = self.u8()?;
                self.memo_put(u64::from(k))?;
            }
            b'r' => {
                let k = self.u32le()?;
                self.memo_put(u64::from(k))?;
            }
            0x94 => {
                let k = self.memo.len() as u64;
                self.memo_put(k)?;
            }
            b'h' => {
                let k = self.u8()?;
                self.memo_get(u64::from(k))?;
            }
            b'j' => {
                let k = self.u32le()?;
                self.memo_get(u64::from(k))?;
            }
            b => {
                return Err(PickleError::UnknownOpcode {
                    byte: b,
                    offset: self.at,
                })
            }
        }
        Ok(Step::Go)
    }
}
