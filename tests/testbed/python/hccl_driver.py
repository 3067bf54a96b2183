"""CommInsight test-bed rank driver, HCCL frontend: the plan's steps through HCCL (Ascend).

Used by `rank_driver.py` when the plan says `"frontend": "hccl"`. The rank loads `libhccl.so`
(the CPU stand-in, `tests/hccl-standin`, found through LD_LIBRARY_PATH) globally, as a framework
linked against it does, and calls HCCL's functions with CANN's signatures through the global
scope (`ctypes.CDLL(None)`), where `LD_PRELOAD=libcomminsight-preload.so` puts the shim first:
HCCL has no profiler plugin, so the shim is what records the operations. Every communicator
(the world and one per role) is made with `HcclCommInitRootInfoConfig`, its root info shared
through a file, its `hcclCommName` = the layout group's name (`named_comms`; the world: none).
Collectives and results are `rank_driver.Rank`'s (through a small NCCL-to-HCCL adapter); HCCL
has no group calls, so a pipeline exchange with one peer is issued in an order that cannot
deadlock on one stream (the lower rank sends first). `ops` in the truth file counts the HCCL
operations this rank issued (each is one start event of the plugin, as NCCL's
`ncclTestbedProfiledOps`).
"""

import ctypes
import os
import threading
import time

import rank_driver as rd

HCCL_FP32 = 4
ROOT_INFO_BYTES = 4108
CONFIG_MAGIC = 0xF0F0F0F0
_DTYPES = {rd.NCCL_FLOAT32: HCCL_FP32}


class HcclRootInfo(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * ROOT_INFO_BYTES)]


class HcclCommConfig(ctypes.Structure):
    """`HcclCommConfig`: the 24-byte header, buffer size, determinism, the name, the UDI."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("reserved", ctypes.c_uint64), ("hcclBufferSize", ctypes.c_uint32),
                ("hcclDeterministic", ctypes.c_uint32), ("hcclCommName", ctypes.c_char * 128),
                ("hcclUdi", ctypes.c_char * 128)]


def fnv1a(data):
    """The comm hash the shim gives an HCCL communicator (FNV-1a 64 of the root info)."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _load():
    ctypes.CDLL("libhccl.so", mode=ctypes.RTLD_GLOBAL)
    g = ctypes.CDLL(None)
    vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    for name, args in {
        "HcclGetRootInfo": [ctypes.POINTER(HcclRootInfo)],
        "HcclCommInitRootInfoConfig": [u32, ctypes.POINTER(HcclRootInfo), u32,
                                       ctypes.POINTER(HcclCommConfig), ctypes.POINTER(vp)],
        "HcclCommDestroy": [vp],
        "HcclAllReduce": [vp, vp, u64, i, i, vp, vp],
        "HcclAllGather": [vp, vp, u64, i, vp, vp],
        "HcclReduceScatter": [vp, vp, u64, i, i, vp, vp],
        "HcclAlltoAll": [vp, u64, i, vp, u64, i, vp, vp],
        "HcclSend": [vp, u64, i, u32, vp, vp],
        "HcclRecv": [vp, u64, i, u32, vp, vp],
        "aclrtSynchronizeStream": [vp],
    }.items():
        f = getattr(g, name)
        f.argtypes = args
        f.restype = i
    g.HcclGetErrorString.argtypes = [i]
    g.HcclGetErrorString.restype = ctypes.c_char_p
    return g


class _AsNccl:
    """The NCCL calls `rank_driver.Rank.coll` makes, done with HCCL (each counted)."""

    has_alltoall = True

    def __init__(self, g):
        self.g = g
        self.ops = 0

    def ncclGetErrorString(self, res):
        return self.g.HcclGetErrorString(res)

    def ncclAllReduce(self, s, r, count, dt, op, comm, stream):
        self.ops += 1
        return self.g.HcclAllReduce(s, r, count, _DTYPES[dt], op, comm, stream)

    def ncclAllGather(self, s, r, count, dt, comm, stream):
        self.ops += 1
        return self.g.HcclAllGather(s, r, count, _DTYPES[dt], comm, stream)

    def ncclReduceScatter(self, s, r, count, dt, op, comm, stream):
        self.ops += 1
        return self.g.HcclReduceScatter(s, r, count, _DTYPES[dt], op, comm, stream)

    def ncclAlltoAll(self, s, r, count, dt, comm, stream):
        self.ops += 1
        t = _DTYPES[dt]
        return self.g.HcclAlltoAll(s, count, t, r, count, t, comm, stream)

    def ncclSend(self, buf, count, dt, peer, comm, stream):
        self.ops += 1
        return self.g.HcclSend(buf, count, _DTYPES[dt], peer, comm, stream)

    def ncclRecv(self, buf, count, dt, peer, comm, stream):
        self.ops += 1
        return self.g.HcclRecv(buf, count, _DTYPES[dt], peer, comm, stream)

    def ncclGroupStart(self):
        return 0

    def ncclGroupEnd(self):
        return 0


class HcclRank(rd.Rank):
    ERRORS = ()

    def __init__(self, plan):  # noqa: D401  (does not call Rank.__init__: no NCCL)
        self.plan = plan
        self.rank = plan["rank"]
        self.world = plan["world"]
        self.run_dir = plan["run_dir"]
        self.verify = plan.get("verify", True)
        self.hccl = _load()
        self.nccl = _AsNccl(self.hccl)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.usleep.argtypes = [ctypes.c_uint]
        self.comms = {}
        self.truth = open(plan["truth_file"], "a", buffering=1)
        self.version_code = 0
        self.ep = None  # no [moe] reporter with HCCL (it needs frontend = "nccl")

    def _root(self, key, leader):
        path = os.path.join(self.run_dir, "root-%s.bin" % key.replace(":", "_").replace("/", "_"))
        root = HcclRootInfo()
        if leader:
            rd.check(self.nccl, "HcclGetRootInfo", self.hccl.HcclGetRootInfo(ctypes.byref(root)))
            tmp = "%s.tmp.%d" % (path, os.getpid())
            with open(tmp, "wb") as f:
                f.write(bytes(root))
            os.rename(tmp, path)
            return root
        deadline = time.monotonic() + self.plan.get("rendezvous_timeout_s", 60)
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise rd.NcclError("timed out waiting for root info %s" % path)
            time.sleep(0.005)
        with open(path, "rb") as f:
            ctypes.memmove(ctypes.byref(root), f.read(), ROOT_INFO_BYTES)
        return root

    def _init(self, key, ranks, name):
        root = self._root(key, ranks[0] == self.rank)
        cfg = HcclCommConfig(size=ctypes.sizeof(HcclCommConfig), magic=CONFIG_MAGIC, version=1)
        if name and self.plan.get("named_comms", True):
            cfg.hcclCommName = name.encode()[:127]
        comm = ctypes.c_void_p()
        rd.check(self.nccl, "HcclCommInitRootInfoConfig(%s)" % (name or "world"),
                 self.hccl.HcclCommInitRootInfoConfig(len(ranks), ctypes.byref(root),
                                                      ranks.index(self.rank), ctypes.byref(cfg),
                                                      ctypes.byref(comm)))
        return comm, fnv1a(bytes(root))

    def init_comms(self):
        world, wh = self._init("world", list(range(self.world)), "")
        for c in self.plan["comms"]:
            role, name, ranks = c["role"], c["name"], c["ranks"]
            comm, h = (world, wh) if role == "global" else self._init(name, ranks, name)
            self.comms[role] = (comm, ranks)
            self.log(event="comm", role=role, name=(name if role != "global" else ""),
                     hash="0x%016x" % h, ranks=ranks)
        self.world_comm = world

    def p2p(self, op, keep, checks):
        # No group calls in HCCL: with one peer, the lower rank sends first (no deadlock on one
        # in-order stream); parts keep the plan's order otherwise.
        parts = sorted(op["parts"], key=lambda p: p["send"] != (self.rank < p["peer"]))
        super().p2p(dict(op, parts=parts), keep, checks)

    def synchronize(self):
        """aclrtSynchronizeStream in a helper thread so SIGTERM can still reach Python."""
        done = threading.Event()
        res = [0]

        def work():
            res[0] = self.hccl.aclrtSynchronizeStream(None)
            done.set()

        threading.Thread(target=work, name="hccl-synchronize", daemon=True).start()
        while not done.wait(0.05):
            pass
        if res[0] != 0:
            raise rd.NcclError("aclrtSynchronizeStream failed: %d" % res[0])

    def profiled_ops(self):
        return self.nccl.ops

    def profiler_abi(self):
        return 0

    def teardown(self):
        for role, (comm, _) in self.comms.items():
            if role != "global":
                rd.check(self.nccl, "HcclCommDestroy", self.hccl.HcclCommDestroy(comm))
        rd.check(self.nccl, "HcclCommDestroy(world)", self.hccl.HcclCommDestroy(self.world_comm))
