"""One rank of the shim's HCCL test: HCCL through ctypes (the libhccl stand-in, loaded globally as
a framework that links it is), every interposed operation once or more, results checked.

Usage: hccl_child.py RANK NRANKS DIR LIBDIR. Prints `ok <json stats>` at the end."""

import ctypes
import json
import os
import struct
import sys
import time

rank, n, d, libdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ctypes.CDLL(os.path.join(libdir, "libhccl.so"), mode=ctypes.RTLD_GLOBAL)
g = ctypes.CDLL(None)
vp, u32, u64, i = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
FP32, SUM = 4, 0


class RootInfo(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 4108)]


class CommConfig(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("magic", u32), ("version", u32), ("reserved", u64),
                ("bufsize", u32), ("deterministic", u32), ("name", ctypes.c_char * 128),
                ("udi", ctypes.c_char * 128)]


def check(what, rc):
    if rc != 0:
        raise SystemExit("%s failed: %d" % (what, rc))


def floats(vals):
    return ctypes.create_string_buffer(struct.pack("<%df" % len(vals), *vals))


def got(buf, k):
    return list(struct.unpack("<%df" % k, buf.raw[:4 * k]))


root = RootInfo()
path = os.path.join(d, "root.bin")
if rank == 0:
    check("HcclGetRootInfo", g.HcclGetRootInfo(ctypes.byref(root)))
    with open(path + ".tmp", "wb") as f:
        f.write(bytes(root))
    os.rename(path + ".tmp", path)
else:
    while not os.path.exists(path):
        time.sleep(0.005)
    with open(path, "rb") as f:
        ctypes.memmove(ctypes.byref(root), f.read(), 4108)
comm = vp()
cfg = CommConfig(size=ctypes.sizeof(CommConfig), magic=0xF0F0F0F0, version=1)
cfg.name = os.environ.get("CHILD_COMM_NAME", "").encode()
check("HcclCommInitRootInfoConfig",
      g.HcclCommInitRootInfoConfig(u32(n), ctypes.byref(root), u32(rank), ctypes.byref(cfg),
                                   ctypes.byref(comm)))
k = 8
me = float(rank + 1)
total = sum(range(1, n + 1))
s, r = floats([me] * k), ctypes.create_string_buffer(4 * k * n)
for _ in range(3):
    check("HcclAllReduce", g.HcclAllReduce(s, r, u64(k), FP32, SUM, comm, None))
g.aclrtSynchronizeStream(None)
assert got(r, k) == [float(total)] * k, got(r, k)
check("HcclAllGather", g.HcclAllGather(s, r, u64(k), FP32, comm, None))
g.aclrtSynchronizeStream(None)
assert got(r, k * n) == sum(([float(p + 1)] * k for p in range(n)), []), got(r, k * n)
big = floats([me] * (k * n))
check("HcclReduceScatter", g.HcclReduceScatter(big, r, u64(k), FP32, SUM, comm, None))
b = floats([me] * k)
check("HcclBroadcast", g.HcclBroadcast(b, u64(k), FP32, u32(0), comm, None))
check("HcclReduce", g.HcclReduce(s, r, u64(k), FP32, SUM, u32(0), comm, None))
check("HcclAlltoAll", g.HcclAlltoAll(big, u64(k), FP32, r, u64(k), FP32, comm, None))
counts = (u64 * n)(*([k] * n))
displs = (u64 * n)(*[p * k for p in range(n)])
check("HcclAlltoAllV", g.HcclAlltoAllV(big, counts, displs, FP32, r, counts, displs, FP32, comm, None))
peer = (rank + 1) % n
src = (rank - 1) % n
if rank % 2 == 0:
    check("HcclSend", g.HcclSend(s, u64(k), FP32, u32(peer), comm, None))
    check("HcclRecv", g.HcclRecv(r, u64(k), FP32, u32(src), comm, None))
else:
    check("HcclRecv", g.HcclRecv(r, u64(k), FP32, u32(src), comm, None))
    check("HcclSend", g.HcclSend(s, u64(k), FP32, u32(peer), comm, None))
check("HcclBarrier", g.HcclBarrier(comm, None))
g.aclrtSynchronizeStream(None)
assert got(r, k) == [float(src + 1)] * k, got(r, k)
assert got(b, k) == [1.0] * k, got(b, k)
deadline = time.monotonic() + 5
st = (u64 * 7)()
while time.monotonic() < deadline:
    g.comminsight_preload_hccl_stats(st, 7) if hasattr(g, "comminsight_preload_hccl_stats") else None
    if os.environ.get("COMMINSIGHT_HCCL_EVENTS") == "0" or st[5] >= st[0]:
        break
    time.sleep(0.01)
# A second communicator from a rank table (the stand-in's format: the root info in hex).
table = os.path.join(d, "ranktable.json")
if rank == 0:
    root2 = RootInfo()
    check("HcclGetRootInfo", g.HcclGetRootInfo(ctypes.byref(root2)))
    with open(table + ".tmp", "w") as f:
        json.dump({"comminsight_root_info": bytes(root2)[:128].hex(), "rank_count": n}, f)
    os.rename(table + ".tmp", table)
else:
    while not os.path.exists(table):
        time.sleep(0.005)
comm2 = vp()
check("HcclCommInitClusterInfo",
      g.HcclCommInitClusterInfo(table.encode(), u32(rank), ctypes.byref(comm2)))
check("HcclAllReduce(cluster)", g.HcclAllReduce(s, r, u64(k), FP32, SUM, comm2, None))
g.aclrtSynchronizeStream(None)
assert got(r, k) == [float(total)] * k, got(r, k)
check("HcclCommDestroy(cluster)", g.HcclCommDestroy(comm2))
check("HcclCommDestroy", g.HcclCommDestroy(comm))
print("ok " + json.dumps(list(st)), flush=True)
