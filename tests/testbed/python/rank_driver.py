#!/usr/bin/env python3
"""CommInsight test-bed rank driver: one training rank, NCCL through ctypes.

Usage: rank_driver.py PLAN.json

The job runner (`comminsight-testbed run`) writes the plan: this rank's communicators and, per
step, the operations to issue (compute, collectives, grouped send/recv, injected faults). The
driver loads `libnccl.so.2` (the CPU stand-in, found through LD_LIBRARY_PATH), creates the world
communicator with ncclCommInitRank and one communicator per role (ncclCommInitRankConfig with a
unique id shared through files, or ncclCommSplit), runs the steps, checks every result numerically
and appends what it did to its truth file (JSON lines, flushed per step). Standard library only.

With `"frontend": "torch"` in the plan the same steps run through the fake `torch.distributed`
instead (`torch_driver.py`, next to this file).
With `"frontend": "hccl"` they run through HCCL (`hccl_driver.py`, the libhccl stand-in, recorded by
the LD_PRELOAD shim).
"""

import ctypes
import faulthandler
import json
import os
import signal
import struct
import sys
import threading
import time

NCCL_FLOAT32 = 7
NCCL_SUM = 0
INT_MIN = -2147483648
NCCL_API_MAGIC = 0xCAFEBEEF


class ncclConfig_t(ctypes.Structure):
    """NCCL 2.30 ncclConfig_t (tests/nccl-standin/README.md), size 96."""

    _fields_ = [
        ("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int), ("commName", ctypes.c_char_p), ("collnetEnable", ctypes.c_int),
        ("CTAPolicy", ctypes.c_int), ("shrinkShare", ctypes.c_int), ("nvlsCTAs", ctypes.c_int),
        ("nChannelsPerNetPeer", ctypes.c_int), ("nvlinkCentricSched", ctypes.c_int),
        ("graphUsageMode", ctypes.c_int), ("numRmaCtx", ctypes.c_int), ("maxP2pPeers", ctypes.c_int),
        ("graphStreamOrdering", ctypes.c_int),
    ]


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class NcclError(RuntimeError):
    pass


class VerifyError(RuntimeError):
    pass


_keep = []  # objects NCCL holds pointers to (comm names)


def _load():
    lib = ctypes.CDLL("libnccl.so.2")
    vp, sz, i, u64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64
    sigs = {
        "ncclGetVersion": [ctypes.POINTER(i)],
        "ncclGetUniqueId": [ctypes.POINTER(ncclUniqueId)],
        "ncclCommInitRank": [ctypes.POINTER(vp), i, ncclUniqueId, i],
        "ncclCommInitRankConfig": [ctypes.POINTER(vp), i, ncclUniqueId, i, ctypes.POINTER(ncclConfig_t)],
        "ncclCommSplit": [vp, i, i, ctypes.POINTER(vp), ctypes.POINTER(ncclConfig_t)],
        "ncclCommDestroy": [vp],
        "ncclAllReduce": [vp, vp, sz, i, i, vp, vp],
        "ncclAllGather": [vp, vp, sz, i, vp, vp],
        "ncclReduceScatter": [vp, vp, sz, i, i, vp, vp],
        "ncclSend": [vp, sz, i, i, vp, vp],
        "ncclRecv": [vp, sz, i, i, vp, vp],
        "ncclGroupStart": [],
        "ncclGroupEnd": [],
        "ncclTestbedSynchronize": [vp],
        "ncclTestbedProfiledOps": [],
        "ncclTestbedCommHash": [vp],
        "ncclTestbedProfilerAbi": [],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = i
    lib.ncclTestbedProfiledOps.restype = u64
    lib.ncclTestbedCommHash.restype = u64
    lib.ncclGetErrorString.argtypes = [i]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    try:
        lib.ncclAlltoAll.argtypes = [vp, vp, sz, i, vp, vp]
        lib.ncclAlltoAll.restype = i
        lib.has_alltoall = True
    except AttributeError:
        lib.has_alltoall = False
    return lib


def check(lib, what, res):
    if res != 0:
        msg = lib.ncclGetErrorString(res)
        raise NcclError("%s failed: %d (%s)" % (what, res, msg.decode() if msg else "?"))


# ---------------------------------------------------------------- data patterns (exact in float32)

_patterns = {}


def pattern(values, n, offset=0):
    """`n` float32 little-endian values repeating `values` (a tuple), starting at `offset`."""
    key = (values, n, offset)
    p = _patterns.get(key)
    if p is None:
        period = struct.pack("<%df" % len(values), *values)
        reps = (n + offset) // len(values) + 1
        p = (period * reps)[offset * 4:(offset + n) * 4]
        if len(_patterns) > 4096:
            _patterns.clear()
        _patterns[key] = p
    return p


def base(rank):
    return float(rank % 7 + 1)


def seq5(b, scale=1.0, add=0.0):
    return tuple(b + add + scale * j for j in range(5))


# ---------------------------------------------------------------- faults

def _hang_in_native_compute(libc):
    """Injected `hang`: blocks in native code (pause) forever; SIGTERM ends it."""
    while True:
        libc.pause()


def _stuck_in_data_loader():
    """Injected `pyhang`: a pure-Python function that never returns."""
    n = 0
    while True:
        n += 1
        if n % 200000 == 0:
            time.sleep(0.002)


# ---------------------------------------------------------------- MoE EP wait counters

class _EpGroup:
    """What `Diagnose` needs of a process group: size, rank, member global ranks."""

    def __init__(self, me, ranks):
        self._me, self.ranks = me, list(ranks)

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self._me


class EpCounters:
    """Plays the per-peer wait counters of DeepEP's low-latency kernels (`deepep`: u64 SM cycles,
    `local_experts` samples per peer summed) or Ascend MC2's `performance_info` (`mc2`: µs in the
    low 32 bits, one sample per peer; `hierarchical`: the layered 2 x 8 layout) from the stand-in's
    measured arrival times (`ncclTestbedLastRecvTimes`), into CommInsight's reporter
    (`comminsight_moe`, `[moe]` in tests/scenarios/README.md)."""

    NOMINAL_SM_GHZ = 1.98  # a fixed nominal SM clock turning ns into DeepEP cycles

    def __init__(self, rank, moe):
        sys.path.insert(0, moe["python_path"])
        from comminsight_moe.diagnose import Diagnose

        self.comm, members = rank.comms["ep"]
        self.me, self.n = members.index(rank.rank), len(members)
        self.source, self.hier = moe["reporter"], bool(moe["hierarchical"])
        self.step_round, self.experts = moe["diagnose_step"], moe["local_experts"]
        self.mute_step = moe.get("mute_step")
        self.warmup = moe["warmup_steps"]
        self.diag = Diagnose(_EpGroup(self.me, members), source=self.source,
                             hierarchical=self.hier)
        self.stats = self.diag.get_stats_ll_stats_tensor()
        self.calls = 0
        fn = rank.nccl.ncclTestbedLastRecvTimes
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
        fn.restype = ctypes.c_int
        self.last_recv = fn

    def waits_ns(self):
        out = (ctypes.c_uint64 * self.n)()
        k = self.last_recv(self.comm, out, self.n)
        return list(out) if k == self.n else None

    def row(self, w):
        """This rank's values for one call from the per-peer waits `w` (ns)."""
        if self.source == "deepep":
            return [int(round(x * self.NOMINAL_SM_GHZ)) * self.experts for x in w]
        us = [x // 1000 for x in w]
        if not self.hier:
            return us
        i, out = self.me, [0] * self.n
        for j in range(self.n):
            if j // 8 == i // 8:
                out[j] = us[j]
            elif j % 8 == i % 8:
                server = range(j // 8 * 8, j // 8 * 8 + 8)
                out[j] = max(us[k] for k in server)  # relayed: that server's last arrival
        return out

    def after_all_to_all(self, rank):
        """After this rank's `ep` all-to-all: wait for it (the kernel ends), then accumulate."""
        rank.synchronize()
        w = self.waits_ns()
        t = self.stats[self.calls % 2]  # dispatch, combine, dispatch, ...
        self.calls += 1
        if w is None:
            return
        for j, v in enumerate(self.row(w)):
            t[j] = (t[j] + v) & 0xFFFF_FFFF if self.source == "mc2" else t[j] + v

    def end_step(self, step):
        self.calls = 0
        if step < self.warmup:
            for t in self.stats:  # start-up skew: not counted, as DeepXTrace's warm-up time
                for j in range(len(t)):
                    t[j] = 0
            return
        if self.mute_step is not None and step >= self.mute_step:
            return
        self.diag.diagnose_ll_sync(diagnose_step=self.step_round)


# ---------------------------------------------------------------- the rank

class Rank:
    def __init__(self, plan):
        self.plan = plan
        self.rank = plan["rank"]
        self.world = plan["world"]
        self.run_dir = plan["run_dir"]
        self.verify = plan.get("verify", True)
        self.nccl = _load()
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.usleep.argtypes = [ctypes.c_uint]
        self.comms = {}  # role -> (comm handle, member ranks)
        self.ep = None  # EpCounters with a [moe] reporter
        self.truth = open(plan["truth_file"], "a", buffering=1)
        v = ctypes.c_int(0)
        check(self.nccl, "ncclGetVersion", self.nccl.ncclGetVersion(ctypes.byref(v)))
        self.version_code = v.value

    def log(self, **event):
        self.truth.write(json.dumps(event, separators=(",", ":")) + "\n")
        self.truth.flush()

    # -- communicators

    def _uid(self, key, leader):
        path = os.path.join(self.run_dir, "uid-%s.bin" % key.replace(":", "_").replace("/", "_"))
        if leader:
            uid = ncclUniqueId()
            check(self.nccl, "ncclGetUniqueId", self.nccl.ncclGetUniqueId(ctypes.byref(uid)))
            tmp = "%s.tmp.%d" % (path, os.getpid())
            with open(tmp, "wb") as f:
                f.write(bytes(uid))
            os.rename(tmp, path)
            return uid
        deadline = time.monotonic() + self.plan.get("rendezvous_timeout_s", 60)
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise NcclError("timed out waiting for unique id %s" % path)
            time.sleep(0.005)
        with open(path, "rb") as f:
            data = f.read()
        uid = ncclUniqueId()
        ctypes.memmove(ctypes.byref(uid), data, min(len(data), 128))
        return uid

    def _config(self, name):
        cfg = ncclConfig_t()
        cfg.size = ctypes.sizeof(ncclConfig_t)
        cfg.magic = NCCL_API_MAGIC
        cfg.version = self.version_code
        for fname, ftype in ncclConfig_t._fields_[3:]:
            if ftype is ctypes.c_int:
                setattr(cfg, fname, INT_MIN)
        if name and self.plan.get("named_comms", True):
            b = name.encode()
            _keep.append(b)
            cfg.commName = b
        return cfg

    def init_comms(self):
        world = ctypes.c_void_p()
        uid = self._uid("world", self.rank == 0)
        check(self.nccl, "ncclCommInitRank(world)",
              self.nccl.ncclCommInitRank(ctypes.byref(world), self.world, uid, self.rank))
        for c in self.plan["comms"]:
            role, name, ranks = c["role"], c["name"], c["ranks"]
            if role == "global":
                comm = world
            elif self.plan.get("comm_init") == "split":
                comm = ctypes.c_void_p()
                cfg = self._config(name)
                check(self.nccl, "ncclCommSplit(%s)" % name,
                      self.nccl.ncclCommSplit(world, c["color"], ranks.index(self.rank),
                                              ctypes.byref(comm), ctypes.byref(cfg)))
            else:
                comm = ctypes.c_void_p()
                uid = self._uid(name, ranks[0] == self.rank)
                cfg = self._config(name)
                check(self.nccl, "ncclCommInitRankConfig(%s)" % name,
                      self.nccl.ncclCommInitRankConfig(ctypes.byref(comm), len(ranks), uid,
                                                       ranks.index(self.rank), ctypes.byref(cfg)))
            self.comms[role] = (comm, ranks)
            h = self.nccl.ncclTestbedCommHash(comm)
            self.log(event="comm", role=role, name=(name if role != "global" else ""),
                     hash="0x%016x" % h, ranks=ranks)
        self.world_comm = world

    # -- operations

    def compute(self, us):
        while us > 0:
            chunk = min(us, 500000)
            self.libc.usleep(chunk)
            us -= chunk

    def coll(self, op, keep, checks):
        comm, members = self.comms[op["comm"]]
        func, count = op["func"], op["count"]
        n = len(members)
        me = members.index(self.rank)
        b = base(self.rank)
        total = sum(base(m) for m in members)
        nccl = self.nccl
        if func == "all_reduce":
            send = ctypes.create_string_buffer(pattern(seq5(b), count), count * 4)
            recv = ctypes.create_string_buffer(count * 4)
            check(nccl, "ncclAllReduce", nccl.ncclAllReduce(send, recv, count, NCCL_FLOAT32, NCCL_SUM, comm, None))
            want = lambda: pattern(seq5(total, n), count)
        elif func == "all_gather":
            send = ctypes.create_string_buffer(pattern(seq5(b), count), count * 4)
            recv = ctypes.create_string_buffer(count * 4 * n)
            check(nccl, "ncclAllGather", nccl.ncclAllGather(send, recv, count, NCCL_FLOAT32, comm, None))
            want = lambda: b"".join(pattern(seq5(base(m)), count) for m in members)
        elif func == "reduce_scatter":
            send = ctypes.create_string_buffer(pattern(seq5(b), count * n), count * n * 4)
            recv = ctypes.create_string_buffer(count * 4)
            check(nccl, "ncclReduceScatter",
                  nccl.ncclReduceScatter(send, recv, count, NCCL_FLOAT32, NCCL_SUM, comm, None))
            want = lambda: pattern(seq5(total, n), count, (me * count) % 5)
        elif func == "all_to_all":
            data = b"".join(pattern(seq5(b, add=8.0 * p), count) for p in range(n))
            send = ctypes.create_string_buffer(data, count * n * 4)
            recv = ctypes.create_string_buffer(count * n * 4)
            if nccl.has_alltoall:
                check(nccl, "ncclAlltoAll", nccl.ncclAlltoAll(send, recv, count, NCCL_FLOAT32, comm, None))
            else:
                check(nccl, "ncclGroupStart", nccl.ncclGroupStart())
                for p in range(n):
                    off = p * count * 4
                    check(nccl, "ncclSend", nccl.ncclSend(ctypes.addressof(send) + off, count, NCCL_FLOAT32, p, comm, None))
                    check(nccl, "ncclRecv", nccl.ncclRecv(ctypes.addressof(recv) + off, count, NCCL_FLOAT32, p, comm, None))
                check(nccl, "ncclGroupEnd", nccl.ncclGroupEnd())
            want = lambda: b"".join(pattern(seq5(base(m), add=8.0 * me), count) for m in members)
            if self.ep is not None and op["comm"] == "ep":
                self.ep.after_all_to_all(self)
        else:
            raise ValueError("unknown collective %r" % func)
        keep.append((send, recv))
        if self.verify and not op.get("mismatch"):
            checks.append(("%s on %s" % (func, op["comm"]), recv, want))

    def p2p(self, op, keep, checks):
        comm, members = self.comms[op["comm"]]
        nccl = self.nccl
        grouped = len(op["parts"]) > 1
        if grouped:
            check(nccl, "ncclGroupStart", nccl.ncclGroupStart())
        for part in op["parts"]:
            peer, count = part["peer"], part["count"]
            cpeer = members.index(peer)
            if part["send"]:
                buf = ctypes.create_string_buffer(pattern(seq5(base(self.rank)), count), count * 4)
                check(nccl, "ncclSend", nccl.ncclSend(buf, count, NCCL_FLOAT32, cpeer, comm, None))
            else:
                buf = ctypes.create_string_buffer(count * 4)
                check(nccl, "ncclRecv", nccl.ncclRecv(buf, count, NCCL_FLOAT32, cpeer, comm, None))
                if self.verify:
                    checks.append(("recv from %d" % peer, buf,
                                   (lambda c=count, p=peer: pattern(seq5(base(p)), c))))
            keep.append(buf)
        if grouped:
            check(nccl, "ncclGroupEnd", nccl.ncclGroupEnd())

    def synchronize(self):
        """ncclTestbedSynchronize in a helper thread so SIGTERM can still reach Python."""
        done = threading.Event()
        res = [0]

        def work():
            res[0] = self.nccl.ncclTestbedSynchronize(self.world_comm)
            done.set()

        threading.Thread(target=work, name="nccl-synchronize", daemon=True).start()
        while not done.wait(0.05):
            pass
        check(self.nccl, "ncclTestbedSynchronize", res[0])

    def profiled_ops(self):
        return self.nccl.ncclTestbedProfiledOps()

    def profiler_abi(self):
        return self.nccl.ncclTestbedProfilerAbi()

    def teardown(self):
        for role, (comm, _) in self.comms.items():
            if role != "global":
                check(self.nccl, "ncclCommDestroy", self.nccl.ncclCommDestroy(comm))
        check(self.nccl, "ncclCommDestroy(world)", self.nccl.ncclCommDestroy(self.world_comm))

    def run_step(self, step, ops):
        before = self.profiled_ops()
        self.log(event="step_start", step=step, ops=before, t_ns=time.time_ns())
        keep, checks = [], []
        for op in ops:
            kind = op["op"]
            if kind == "compute":
                self.compute(op["us"])
            elif kind == "coll":
                self.coll(op, keep, checks)
            elif kind == "p2p":
                self.p2p(op, keep, checks)
            elif kind == "hang":
                self.log(event="fault", kind="hang", step=step)
                _hang_in_native_compute(self.libc)
            elif kind == "pyhang":
                self.log(event="fault", kind="pyhang", step=step)
                _stuck_in_data_loader()
            elif kind == "kill":
                self.log(event="fault", kind="kill", step=step)
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                raise ValueError("unknown op %r" % kind)
        self.synchronize()
        if self.ep is not None:
            self.ep.end_step(step)
        after = self.profiled_ops()
        for what, buf, want in checks:
            if buf.raw != want():
                raise VerifyError("rank %d step %d: wrong result of %s" % (self.rank, step, what))
        self.log(event="step_end", step=step, ops=after, t_ns=time.time_ns())

    def run(self):
        self.log(event="start", rank=self.rank, pid=os.getpid(), version_code=self.version_code,
                 profiler_abi=self.profiler_abi(), t_ns=time.time_ns())
        self.init_comms()
        if self.plan.get("moe"):
            self.ep = EpCounters(self, self.plan["moe"])
        self.log(event="ready", t_ns=time.time_ns())
        first = self.plan.get("first_step", 0)
        for i, ops in enumerate(self.plan["steps"]):
            self.run_step(first + i, ops)
        self.teardown()
        self.log(event="done", t_ns=time.time_ns())


def _on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def select_device():
    """What a training script does first (`torch.cuda.set_device(LOCAL_RANK)`): through the CUDA
    runtime, here the test bed's stand-in (`tests/gpu-standin`, on LD_LIBRARY_PATH when staged),
    loaded globally as PyTorch loads libcudart. No runtime: nothing (the plugin then records no
    device)."""
    try:
        rt = ctypes.CDLL("libcudart.so.12", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return
    n = ctypes.c_int(0)
    if rt.cudaGetDeviceCount(ctypes.byref(n)) != 0 or n.value <= 0:
        return
    dev = int(os.environ.get("LOCAL_RANK", "0")) % n.value
    err = rt.cudaSetDevice(dev)
    if err != 0:
        print("cudaSetDevice(%d) failed: %d" % (dev, err), file=sys.stderr, flush=True)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_sigterm)
    # `kill -USR1 <pid>` dumps every thread's Python stack into the rank's log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    select_device()
    cls, errors = Rank, (NcclError, VerifyError)
    if plan.get("frontend") == "torch":
        from torch_driver import TorchRank

        cls, errors = TorchRank, errors + TorchRank.ERRORS
    elif plan.get("frontend") == "hccl":
        from hccl_driver import HcclRank

        cls = HcclRank
    rank = cls(plan)
    try:
        rank.run()
    except errors as e:
        rank.log(event="error", message=str(e))
        print("rank %d: %s" % (plan["rank"], e), file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
