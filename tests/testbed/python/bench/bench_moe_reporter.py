#!/usr/bin/env python3
"""The MoE reporter's cost per window (BENCHMARKS.md): `Diagnose.diagnose_ll_sync` on a diagnosis
step = host copy of the dispatch and combine stats, zeroing, and 2 rows through the plugin's
`comminsight_ep_stats_push` into a live ring, at N = 16, 64, 256.

Usage (after `cargo xtask build`):
  LD_LIBRARY_PATH=target/debug/lib NCCL_PROFILER_PLUGIN=comminsight \\
  COMMINSIGHT_LOG_DIR=$(mktemp -d) PYTHON=... python bench_moe_reporter.py [preload/python]

One process, one rank: the libnccl stand-in makes a 1-rank communicator so NCCL loads and
initialises the plugin (its ring exists); then, per N, 25 batches of 40 windows, the median
batch's time per window. numpy stats when numpy imports, else array('q') (the test bed's ranks).
"""

import ctypes
import os
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "preload/python")

from comminsight_moe import _tensors  # noqa: E402
from comminsight_moe.diagnose import Diagnose  # noqa: E402


class Group:
    def __init__(self, n):
        self.ranks = list(range(n))

    def size(self):
        return len(self.ranks)

    def rank(self):
        return 0


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def start_plugin():
    nccl = ctypes.CDLL("libnccl.so.2")
    uid, comm = UniqueId(), ctypes.c_void_p()
    assert nccl.ncclGetUniqueId(ctypes.byref(uid)) == 0
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                      ctypes.c_int]
    assert nccl.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    return nccl, comm


def bench(n, batches=25, per_batch=40):
    d = Diagnose(Group(n))
    disp, comb = d.get_stats_ll_stats_tensor()
    times = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(per_batch):
            for j in range(0, n, 3):
                disp[j] = 123456789 + j
                comb[j] = 987654321 + j
            d.diagnose_ll_sync(diagnose_step=1)
        times.append(time.perf_counter_ns() - t0)
        # The fill above is the kernels' work, not the reporter's: time it alone and subtract.
        t1 = time.perf_counter_ns()
        for _ in range(per_batch):
            for j in range(0, n, 3):
                disp[j] = 123456789 + j
                comb[j] = 987654321 + j
        times[-1] -= time.perf_counter_ns() - t1
        for t in (disp, comb):
            _tensors.take(d._kind, t)
    st = d.reporter_stats()
    assert st["rows_pushed"] == 2 * batches * per_batch, st
    return statistics.median(times) / per_batch / 1000.0, st


def main():
    nccl, comm = start_plugin()
    print("backend %s, python %s" % (_tensors.backend(), sys.version.split()[0]))
    for n in (16, 64, 256):
        us, st = bench(n)
        print("N=%-4d %7.1f us per window (2 rows, %d records each; %d records pushed, %d dropped)"
              % (n, us, (n + 4) // 5, st["records_pushed"], st["records_dropped"]))
    nccl.ncclCommDestroy(comm)


if __name__ == "__main__":
    main()
