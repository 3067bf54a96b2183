//! Collective schedules (pure): ring reduce-scatter/all-gather/all-reduce, chain broadcast/reduce,
//! pairwise all-to-all. The executor (`exec.rs`) moves the bytes and emits the profiler events.

use crate::task::Op;
use crate::types::Func;

/// Bytes per pipelined chain chunk and per network frame (a "step").
pub const CHUNK: usize = 128 << 10;

/// Where a send takes its bytes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The (copied) send buffer.
    Input,
    /// The working buffer.
    Work,
}

/// One schedule step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send `len` bytes at `off` of `buf` to `peer`.
    Send {
        peer: usize,
        buf: Buf,
        off: usize,
        len: usize,
    },
    /// Receive `len` bytes from `peer` into work at `off`, reducing or copying.
    Recv {
        peer: usize,
        off: usize,
        len: usize,
        reduce: bool,
    },
    /// Copy input[from..from+len] to work[to..].
    Local { from: usize, to: usize, len: usize },
}

/// A rank's whole plan for one collective.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Bytes of the send buffer read.
    pub in_len: usize,
    /// Working buffer size.
    pub work_len: usize,
    /// Copy the input into work at this offset before starting.
    pub input_at: Option<usize>,
    /// Steps in order.
    pub steps: Vec<Step>,
    /// Bytes of work copied to the receive buffer: (work offset, len); `None` = nothing written.
    pub out: Option<(usize, usize)>,
    /// Divide by nranks at the end (ncclAvg) — applies to `out`.
    pub avg: bool,
}

/// Splits `count` elements into `n` (offset, len) byte segments.
pub fn segments(count: usize, n: usize, es: usize) -> Vec<(usize, usize)> {
    let (base, rem) = (count / n, count % n);
    let mut off = 0;
    (0..n)
        .map(|i| {
            let len = (base + usize::from(i < rem)) * es;
            let s = (off, len);
            off += len;
            s
        })
        .collect()
}

fn md(a: isize, n: usize) -> usize {
    a.rem_euclid(n as isize) as usize
}

fn ring_rs(steps: &mut Vec<Step>, segs: &[(usize, usize)], r: usize, n: usize) {
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n.saturating_sub(1) {
        let si = md(r as isize - 1 - s as isize, n);
        let ri = md(r as isize - 2 - s as isize, n);
        steps.push(Step::Send {
            peer: next,
            buf: Buf::Work,
            off: segs[si].0,
            len: segs[si].1,
        });
        steps.push(Step::Recv {
            peer: prev,
            off: segs[ri].0,
            len: segs[ri].1,
            reduce: true,
        });
    }
}

fn ring_ag(steps: &mut Vec<Step>, segs: &[(usize, usize)], r: usize, n: usize) {
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n.saturating_sub(1) {
        let si = md(r as isize - s as isize, n);
        let ri = md(r as isize - s as isize - 1, n);
        steps.push(Step::Send {
            peer: next,
            buf: Buf::Work,
            off: segs[si].0,
            len: segs[si].1,
        });
        steps.push(Step::Recv {
            peer: prev,
            off: segs[ri].0,
            len: segs[ri].1,
            reduce: false,
        });
    }
}

fn chunks(len: usize) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = (0..len)
        .step_by(CHUNK)
        .map(|o| (o, CHUNK.min(len - o)))
        .collect();
    if v.is_empty() {
        v.push((0, 0));
    }
    v
}

/// The plan of rank `r` of `n` for collective `op`.
pub fn plan(op: &Op, r: usize, n: usize) -> Plan {
    let es = op.dt.size();
    let b = op.count * es;
    let root = op.root.max(0) as usize % n.max(1);
    let mut steps = Vec::new();
    match op.func {
        Func::AllReduce => {
            let segs = segments(op.count, n, es);
            ring_rs(&mut steps, &segs, r, n);
            ring_ag(&mut steps, &segs, r, n);
            let avg = op.op == crate::types::RedOp::Avg;
            Plan {
                in_len: b,
                work_len: b,
                input_at: Some(0),
                steps,
                out: Some((0, b)),
                avg,
            }
        }
        Func::ReduceScatter => {
            let segs: Vec<_> = (0..n).map(|i| (i * b, b)).collect();
            ring_rs(&mut steps, &segs, r, n);
            let avg = op.op == crate::types::RedOp::Avg;
            Plan {
                in_len: n * b,
                work_len: n * b,
                input_at: Some(0),
                steps,
                out: Some(segs[r]),
                avg,
            }
        }
        Func::AllGather => {
            let segs: Vec<_> = (0..n).map(|i| (i * b, b)).collect();
            ring_ag(&mut steps, &segs, r, n);
            Plan {
                in_len: b,
                work_len: n * b,
                input_at: Some(r * b),
                steps,
                out: Some((0, n * b)),
                avg: false,
            }
        }
        Func::Broadcast => {
            let pos = md(r as isize - root as isize, n);
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            for (off, len) in chunks(b) {
                if pos > 0 {
                    steps.push(Step::Recv {
                        peer: prev,
                        off,
                        len,
                        reduce: false,
                    });
                }
                if pos + 1 < n {
                    steps.push(Step::Send {
                        peer: next,
                        buf: Buf::Work,
                        off,
                        len,
                    });
                }
            }
            let input_at = (r == root).then_some(0);
            Plan {
                in_len: if r == root { b } else { 0 },
                work_len: b,
                input_at,
                steps,
                out: Some((0, b)),
                avg: false,
            }
        }
        Func::Reduce => {
            let pos = md(r as isize - root as isize - 1, n);
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            for (off, len) in chunks(b) {
                if pos > 0 {
                    steps.push(Step::Recv {
                        peer: prev,
                        off,
                        len,
                        reduce: true,
                    });
                }
                if pos + 1 < n {
                    steps.push(Step::Send {
                        peer: next,
                        buf: Buf::Work,
                        off,
                        len,
                    });
                }
            }
            let out = (r == root).then_some((0, b));
            let avg = op.op == crate::types::RedOp::Avg;
            Plan {
                in_len: b,
                work_len: b,
                input_at: Some(0),
                steps,
                out,
                avg,
            }
        }
        Func::AlltoAll => {
            steps.push(Step::Local {
                from: r * b,
                to: r * b,
                len: b,
            });
            // Every send is posted before the first receive (DeepEP's dispatch / combine and
            // NCCL's grouped send/recv do not wait for one peer before sending to the next), so
            // a late peer delays only its own data.
            for s in 1..n {
                let to = (r + s) % n;
                steps.push(Step::Send {
                    peer: to,
                    buf: Buf::Input,
                    off: to * b,
                    len: b,
                });
            }
            for s in 1..n {
                let from = (r + n - s) % n;
                steps.push(Step::Recv {
                    peer: from,
                    off: from * b,
                    len: b,
                    reduce: false,
                });
            }
            Plan {
                in_len: n * b,
                work_len: n * b,
                input_at: None,
                steps,
                out: Some((0, n * b)),
                avg: false,
            }
        }
        Func::Send | Func::Recv => Plan {
            in_len: 0,
            work_len: 0,
            input_at: None,
            steps,
            out: None,
            avg: false,
        },
    }
}

/// Frames a message of `len` bytes travels in.
pub fn frames(len: usize) -> usize {
    len.div_ceil(CHUNK).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, RedOp};

    fn op(func: Func, count: usize) -> Op {
        Op {
            func,
            send: 0,
            recv: 0,
            count,
            dt: DataType::Float32,
            op: RedOp::Sum,
            root: 0,
        }
    }

    #[test]
    fn segments_cover_everything() {
        let s = segments(10, 4, 4);
        assert_eq!(s, vec![(0, 12), (12, 12), (24, 8), (32, 8)]);
    }

    #[test]
    fn ring_allreduce_sends_each_link_2n_minus_2_times() {
        let p = plan(&op(Func::AllReduce, 100), 3, 8);
        let sends = p
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Send { peer: 4, .. }))
            .count();
        assert_eq!(sends, 14);
    }

    #[test]
    fn broadcast_root_only_sends_and_last_only_receives() {
        let p0 = plan(&op(Func::Broadcast, 10), 0, 4);
        assert!(p0.steps.iter().all(|s| matches!(s, Step::Send { .. })));
        let p3 = plan(&op(Func::Broadcast, 10), 3, 4);
        assert!(p3.steps.iter().all(|s| matches!(s, Step::Recv { .. })));
    }

    #[test]
    fn single_rank_plans_have_no_network_steps() {
        for f in [
            Func::AllReduce,
            Func::AllGather,
            Func::ReduceScatter,
            Func::Broadcast,
            Func::Reduce,
        ] {
            assert!(plan(&op(f, 5), 0, 1).steps.is_empty(), "{f:?}");
        }
    }
}
