//! The steps of the non-Megatron workload kinds (`fsdp`, `ddp`, `decode`); their exact op
//! sequences are documented in `tests/scenarios/README.md`.

use super::{elems, Builder, CollFunc, Phase};
use crate::layout::Role;

impl Builder<'_> {
    /// FSDP / ZeRO-3: every microbatch gathers each layer's parameter shard before its forward
    /// and again before its backward, and reduce-scatters its gradients after its backward.
    pub(super) fn fsdp_step(&mut self) {
        let w = &self.s.workload;
        let (layers, mbs) = (w.layers, w.microbatches);
        // `[messages] dp` = all parameters; a layer's shard per rank.
        let shard = elems(self.s.messages.dp / layers as u64 / self.l.dp as u64);
        for _ in 0..mbs {
            for layer in 0..layers {
                self.coll(Role::Dp, CollFunc::AllGather, shard);
                self.layer(layer, false);
            }
            for layer in (0..layers).rev() {
                self.coll(Role::Dp, CollFunc::AllGather, shard);
                self.layer(layer, true);
                self.coll(Role::Dp, CollFunc::ReduceScatter, shard);
            }
        }
        self.compute(self.s.compute.optimizer_ms, Phase::Optimizer);
        self.coll(
            Role::Global,
            CollFunc::AllReduce,
            elems(self.s.messages.global),
        );
    }

    /// Plain DDP with gradient accumulation (`no_sync` on all but the last microbatch): the last
    /// backward is cut into `buckets` pieces, each followed by its bucket's DP all-reduce.
    pub(super) fn ddp_step(&mut self) {
        let w = &self.s.workload;
        let c = &self.s.compute;
        let (mbs, buckets) = (w.microbatches, w.buckets);
        let bucket = elems(self.s.messages.dp / buckets as u64);
        for mb in 0..mbs {
            self.compute(c.forward_ms, Phase::Forward);
            if mb + 1 < mbs {
                self.compute(c.backward_ms, Phase::Backward);
                continue;
            }
            for _ in 0..buckets {
                self.compute(c.backward_ms / buckets as f64, Phase::Backward);
                self.coll(Role::Dp, CollFunc::AllReduce, bucket);
            }
        }
        self.compute(c.optimizer_ms, Phase::Optimizer);
        self.coll(
            Role::Global,
            CollFunc::AllReduce,
            elems(self.s.messages.global),
        );
    }

    /// One decode iteration: each in-flight token batch comes from the previous stage, runs the
    /// stage's layers (two TP all-reduces each) and goes to the next stage; then every stage
    /// all-gathers the sampled tokens over TP.
    pub(super) fn decode_step(&mut self) {
        const RECV_PREV: &[(bool, bool)] = &[(false, false)];
        const SEND_NEXT: &[(bool, bool)] = &[(true, true)];
        for _ in 0..self.s.workload.microbatches {
            self.p2p(RECV_PREV);
            self.forward();
            self.p2p(SEND_NEXT);
        }
        let tp = self.l.tp as u64;
        self.coll(
            Role::Tp,
            CollFunc::AllGather,
            elems(self.s.messages.global / tp),
        );
    }
}
