"""The fake ProcessGroupNCCL's view of NCCL: `libnccl.so.2` through ctypes.

Loaded the way a framework library linked against NCCL gets it: late (at `init_process_group`,
not at `import torch`), `dlopen("libnccl.so.2", RTLD_LOCAL)`, and every function resolved as the
dynamic linker resolves a PLT reference of a library that has libnccl as DT_NEEDED: the global
scope first (`ctypes.CDLL(None)`: the executable and LD_PRELOAD objects such as
libcomminsight-preload.so live there), then the libnccl handle. So an LD_PRELOAD shim
interposes on these calls exactly as it would on libtorch_cuda.so's.

Nothing here ever sets `ncclConfig_t.commName` (upstream PyTorch does not).
"""

import ctypes
import os

NCCL_API_MAGIC = 0xCAFEBEEF
INT_MIN = -2147483648
NCCL_SPLIT_NOCOLOR = -1
NCCL_IN_PROGRESS = 7


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
    """An NCCL call failed (real torch: `torch.distributed.DistBackendError`)."""


_vp, _sz, _i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_SIGNATURES = {
    "ncclGetVersion": [ctypes.POINTER(_i)],
    "ncclGetUniqueId": [ctypes.POINTER(ncclUniqueId)],
    "ncclCommInitRankConfig": [ctypes.POINTER(_vp), _i, ncclUniqueId, _i, ctypes.POINTER(ncclConfig_t)],
    "ncclCommSplit": [_vp, _i, _i, ctypes.POINTER(_vp), ctypes.POINTER(ncclConfig_t)],
    "ncclCommDestroy": [_vp],
    "ncclAllReduce": [_vp, _vp, _sz, _i, _i, _vp, _vp],
    "ncclBroadcast": [_vp, _vp, _sz, _i, _i, _vp, _vp],
    "ncclReduce": [_vp, _vp, _sz, _i, _i, _i, _vp, _vp],
    "ncclAllGather": [_vp, _vp, _sz, _i, _vp, _vp],
    "ncclReduceScatter": [_vp, _vp, _sz, _i, _i, _vp, _vp],
    "ncclAlltoAll": [_vp, _vp, _sz, _i, _vp, _vp],
    "ncclSend": [_vp, _sz, _i, _i, _vp, _vp],
    "ncclRecv": [_vp, _sz, _i, _i, _vp, _vp],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclTestbedSynchronize": [_vp],
    "ncclTestbedProfiledOps": [],
    "ncclTestbedCommHash": [_vp],
    "ncclTestbedProfilerAbi": [],
}
_RESTYPE = {"ncclTestbedProfiledOps": ctypes.c_uint64, "ncclTestbedCommHash": ctypes.c_uint64}


class NcclLib:
    """NCCL's C API as the backend uses it (handles are ints; buffers are data_ptr()s)."""

    def __init__(self, soname="libnccl.so.2"):
        self._handle = ctypes.CDLL(soname, mode=os.RTLD_LOCAL)
        self._global = ctypes.CDLL(None)
        self._keep = []
        for name, args in _SIGNATURES.items():
            f = self._resolve(name)
            if f is None:
                continue
            f.argtypes = args
            f.restype = _RESTYPE.get(name, _i)
            setattr(self, "_" + name, f)
        err = self._resolve("ncclGetErrorString")
        err.argtypes, err.restype = [_i], ctypes.c_char_p
        self._err = err
        v = ctypes.c_int(0)
        self.check("ncclGetVersion", self._ncclGetVersion(ctypes.byref(v)))
        self.version_code = v.value

    def _resolve(self, name):
        """Global scope first (LD_PRELOAD interposers), then libnccl itself."""
        for lib in (self._global, self._handle):
            try:
                return getattr(lib, name)
            except AttributeError:
                continue
        return None

    def check(self, what, res):
        if res != 0:
            msg = self._err(res)
            raise NcclError("%s failed: %d (%s)" % (what, res, msg.decode() if msg else "?"))

    def _config(self):
        """NCCL_CONFIG_INITIALIZER; commName stays NULL."""
        cfg = ncclConfig_t()
        cfg.size = ctypes.sizeof(ncclConfig_t)
        cfg.magic = NCCL_API_MAGIC
        cfg.version = self.version_code
        for fname, ftype in ncclConfig_t._fields_[3:]:
            if ftype is ctypes.c_int:
                setattr(cfg, fname, INT_MIN)
        self._keep.append(cfg)  # NCCL may keep pointers into it until the comm is ready
        return cfg

    def unique_id(self):
        uid = ncclUniqueId()
        self.check("ncclGetUniqueId", self._ncclGetUniqueId(ctypes.byref(uid)))
        return bytes(uid)

    def comm_init_rank_config(self, nranks, uid, rank):
        comm = ctypes.c_void_p()
        u = ncclUniqueId()
        ctypes.memmove(ctypes.byref(u), uid, min(len(uid), 128))
        cfg = self._config()
        self.check("ncclCommInitRankConfig",
                   self._ncclCommInitRankConfig(ctypes.byref(comm), nranks, u, rank, ctypes.byref(cfg)))
        return comm.value

    def comm_split(self, parent, color, key):
        """The child comm, or None for NCCL_SPLIT_NOCOLOR."""
        comm = ctypes.c_void_p()
        cfg = self._config()
        self.check("ncclCommSplit", self._ncclCommSplit(parent, color, key, ctypes.byref(comm), ctypes.byref(cfg)))
        return comm.value

    def comm_destroy(self, comm):
        self.check("ncclCommDestroy", self._ncclCommDestroy(comm))

    def all_reduce(self, send, recv, count, dtype, op, comm):
        self.check("ncclAllReduce", self._ncclAllReduce(send, recv, count, dtype, op, comm, None))

    def broadcast(self, send, recv, count, dtype, root, comm):
        self.check("ncclBroadcast", self._ncclBroadcast(send, recv, count, dtype, root, comm, None))

    def reduce(self, send, recv, count, dtype, op, root, comm):
        self.check("ncclReduce", self._ncclReduce(send, recv, count, dtype, op, root, comm, None))

    def all_gather(self, send, recv, count, dtype, comm):
        self.check("ncclAllGather", self._ncclAllGather(send, recv, count, dtype, comm, None))

    def reduce_scatter(self, send, recv, count, dtype, op, comm):
        self.check("ncclReduceScatter", self._ncclReduceScatter(send, recv, count, dtype, op, comm, None))

    def all_to_all(self, send, recv, count, dtype, comm, nranks, elem_size):
        """ncclAlltoAll when this NCCL has it (2.28+), else grouped send/recv as torch does."""
        f = getattr(self, "_ncclAlltoAll", None)
        if f is not None:
            self.check("ncclAlltoAll", f(send, recv, count, dtype, comm, None))
            return
        self.group_start()
        for p in range(nranks):
            off = p * count * elem_size
            self.send(send + off, count, dtype, p, comm)
            self.recv(recv + off, count, dtype, p, comm)
        self.group_end()

    def send(self, buf, count, dtype, peer, comm):
        self.check("ncclSend", self._ncclSend(buf, count, dtype, peer, comm, None))

    def recv(self, buf, count, dtype, peer, comm):
        self.check("ncclRecv", self._ncclRecv(buf, count, dtype, peer, comm, None))

    def group_start(self):
        self.check("ncclGroupStart", self._ncclGroupStart())

    def group_end(self):
        self.check("ncclGroupEnd", self._ncclGroupEnd())

    # test-bed extensions (docs/contracts.md): what CUDA gives a real application
    def synchronize(self, comm):
        return self._ncclTestbedSynchronize(comm)

    def comm_hash(self, comm):
        return self._ncclTestbedCommHash(comm)

    def profiled_ops(self):
        return self._ncclTestbedProfiledOps()

    def profiler_abi(self):
        return self._ncclTestbedProfilerAbi()
