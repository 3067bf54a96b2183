"""Rank process for the preload shim tests: drives the libnccl stand-in through ctypes.

Environment: PRE_SCENARIO (main | envrole | late), PRE_RANK, PRE_NRANKS, PRE_DIR (rendezvous).
Comm-creating functions are looked up in the global scope (CDLL(None)) first, where LD_PRELOAD puts
the shim, as an application linked against libnccl would bind them; the rest through libnccl.
Prints `COMM <label> <hash>` per communicator and `RESULT <label> <values>` per all-reduce; exits 1
with a message on any failed expectation.
"""
import ctypes
import os
import sys
import time

vp, i, u64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
RANK = int(os.environ["PRE_RANK"])
NRANKS = int(os.environ["PRE_NRANKS"])
DIR = os.environ["PRE_DIR"]
SCENARIO = os.environ["PRE_SCENARIO"]


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Config(ctypes.Structure):
    _fields_ = [("size", sz), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", i), ("cgaClusterSize", i), ("minCTAs", i), ("maxCTAs", i),
                ("netName", ctypes.c_char_p), ("splitShare", i), ("trafficClass", i),
                ("commName", ctypes.c_char_p), ("collnetEnable", i), ("CTAPolicy", i),
                ("shrinkShare", i), ("nvlsCTAs", i), ("nChannelsPerNetPeer", i),
                ("nvlinkCentricSched", i), ("graphUsageMode", i), ("numRmaCtx", i),
                ("maxP2pPeers", i), ("graphStreamOrdering", i)]


def new_config(name=None):
    c = Config()
    for f, _ in Config._fields_[3:]:
        if f not in ("netName", "commName"):
            setattr(c, f, -2147483648)
    c.size, c.magic, c.version = ctypes.sizeof(Config), 0xcafebeef, 23007
    c.commName = name
    return c


def fail(msg):
    print("FAIL rank %d: %s" % (RANK, msg), flush=True)
    sys.exit(1)


GLOBAL = ctypes.CDLL(None)
if SCENARIO == "late":
    # Loaded after start, out of the global scope (as PyTorch / ctypes do).
    NCCL = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_LOCAL)
else:
    NCCL = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_GLOBAL)

ARGS = {
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(vp), i, UniqueId, i],
    "ncclCommInitRankConfig": [ctypes.POINTER(vp), i, UniqueId, i, ctypes.POINTER(Config)],
    "ncclCommSplit": [vp, i, i, ctypes.POINTER(vp), ctypes.POINTER(Config)],
    "ncclCommShrink": [vp, ctypes.POINTER(i), i, ctypes.POINTER(vp), ctypes.POINTER(Config), i],
    "ncclCommDestroy": [vp],
    "ncclAllReduce": [vp, vp, sz, i, i, vp, vp],
    "ncclTestbedSynchronize": [vp],
    "ncclTestbedCommHash": [vp],
}
CREATING = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit", "ncclCommShrink",
            "ncclCommDestroy")


def fn(name):
    lib = NCCL
    if name in CREATING:
        try:
            lib = GLOBAL if getattr(GLOBAL, name) is not None else NCCL
        except AttributeError:
            lib = NCCL
    f = getattr(lib, name)
    f.argtypes = ARGS[name]
    f.restype = u64 if name == "ncclTestbedCommHash" else i
    return f


def shim(name):
    try:
        return getattr(GLOBAL, name)
    except AttributeError:
        return None


def check(what, res):
    if res != 0:
        fail("%s returned %d" % (what, res))


def uid(tag):
    """Rank 0 of each group writes the id; the others poll for it."""
    path = os.path.join(DIR, "id-" + tag)
    u = UniqueId()
    if tag_root(tag):
        check("ncclGetUniqueId", fn("ncclGetUniqueId")(ctypes.byref(u)))
        with open(path + ".tmp", "wb") as f:
            f.write(ctypes.string_at(ctypes.addressof(u), 128))
        os.replace(path + ".tmp", path)
        return u
    deadline = time.time() + 60
    while not os.path.exists(path):
        if time.time() > deadline:
            fail("no unique id " + tag)
        time.sleep(0.01)
    with open(path, "rb") as f:
        ctypes.memmove(ctypes.addressof(u), f.read(), 128)
    return u


ROOTS = {}


def tag_root(tag):
    return ROOTS.get(tag, 0) == RANK


COMMS = []


def init(label, nranks, rank, tag, config=None, plain=False):
    c = vp()
    u = uid(tag)
    if plain:
        check("ncclCommInitRank " + label, fn("ncclCommInitRank")(ctypes.byref(c), nranks, u, rank))
    else:
        check("ncclCommInitRankConfig " + label,
              fn("ncclCommInitRankConfig")(ctypes.byref(c), nranks, u, rank,
                                           ctypes.byref(config) if config is not None else None))
    return record(label, c)


def record(label, c):
    print("COMM %s %d" % (label, fn("ncclTestbedCommHash")(c)), flush=True)
    COMMS.append(c)
    return c


def split(label, parent, color, key, config=None):
    c = vp()
    check("ncclCommSplit " + label,
          fn("ncclCommSplit")(parent, color, key, ctypes.byref(c),
                              ctypes.byref(config) if config is not None else None))
    return record(label, c)


def allreduce(label, comm):
    n = 8
    send = (ctypes.c_float * n)(*[(RANK + 1) * 0.5 + k * 0.25 for k in range(n)])
    recv = (ctypes.c_float * n)()
    check("ncclAllReduce", fn("ncclAllReduce")(send, recv, n, 7, 0, comm, None))
    check("ncclTestbedSynchronize", fn("ncclTestbedSynchronize")(comm))
    print("RESULT %s %s" % (label, " ".join(repr(v) for v in recv)), flush=True)


def announce(role, desc, name, ranks):
    f = shim("comminsight_announce_group")
    if f is None:
        return -1
    f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(i), i, i]
    arr = (i * len(ranks))(*ranks)
    return f(role, desc, name, arr, len(ranks), RANK)


def set_current(gid):
    f = shim("comminsight_set_current_group")
    if f is not None:
        f.argtypes = [i]
        f(gid)


def group_comms(gid):
    f = shim("comminsight_group_comms")
    if f is None:
        return None
    f.argtypes = [i]
    return f(gid)


def main_scenario():
    have_shim = shim("comminsight_announce_group") is not None
    # 0. Nothing announced: an unnamed comm stays unnamed.
    init("plain", NRANKS, RANK, "plain", plain=True)
    # 1. The world, announced as the default group, with a caller config that must stay unchanged.
    g = announce(None, b"default_pg", b"0", list(range(NRANKS)))
    set_current(g)
    cfg = new_config()
    before = bytes(cfg)
    world = init("world", NRANKS, RANK, "world", config=cfg)
    if bytes(cfg) != before:
        fail("the caller's config struct changed")
    set_current(-1)
    # 2. A TP split (NULL config) while the TP group is current: the child's own name.
    tp_ranks = [RANK // 2 * 2, RANK // 2 * 2 + 1]
    tp = announce(None, b"TENSOR_MODEL_PARALLEL_GROUP", str(1 + RANK // 2).encode(), tp_ranks)
    set_current(tp)
    split("tp", world, RANK // 2, RANK)
    set_current(-1)
    # 3. A split with no current group: must not inherit "global:...".
    split("nogroup", world, RANK % 2, RANK)
    # 4. A caller-named comm stays as named, even with a current group.
    set_current(tp)
    init("named", NRANKS, RANK, "named", config=new_config(b"mine:custom"))
    set_current(-1)
    # 5. ncclCommInitRank matched by size: the only unused size-2 announcement (DP).
    dp_ranks = [RANK % 2, RANK % 2 + 2]
    dp = announce(b"dp", b"DATA_PARALLEL_GROUP", b"5", dp_ranks)
    ROOTS["dp%d" % (RANK % 2)] = RANK % 2
    init("dp", 2, RANK // 2, "dp%d" % (RANK % 2), plain=True)
    # 6. Rejected announcements: one warning each (twice announced), nothing changes.
    bad = [announce(b"xp", b"EXPERTS", b"9", [RANK]) for _ in range(2)]
    bad.append(announce(None, b"TENSOR_MODEL_PARALLEL_GROUP", b"10", [(RANK + 1) % NRANKS]))
    if have_shim and bad != [-1, -1, -1]:
        fail("bad announcements accepted: %r" % bad)
    init("after_bad", NRANKS, RANK, "after_bad", plain=True)
    # 7. Results.
    allreduce("world", world)
    if have_shim:
        got = [group_comms(x) for x in (g, tp, dp)] + [group_comms(999)]
        if got != [1, 1, 1, -1]:
            fail("comminsight_group_comms: %r" % got)
    for c in reversed(COMMS):
        check("ncclCommDestroy", fn("ncclCommDestroy")(c))


def envrole_scenario():
    init("plain", NRANKS, RANK, "plain", plain=True)
    for c in COMMS:
        check("ncclCommDestroy", fn("ncclCommDestroy")(c))


def late_scenario():
    tp = announce(b"tp", b"TENSOR_MODEL_PARALLEL_GROUP", b"1", list(range(NRANKS)))
    if tp < 0:
        fail("announcement rejected")
    set_current(tp)
    c = init("late", NRANKS, RANK, "late", config=new_config())
    set_current(-1)
    allreduce("late", c)
    check("ncclCommDestroy", fn("ncclCommDestroy")(c))


def shrink_scenario():
    """The last rank leaves; the others shrink the announced world twice (given config, NULL)."""
    g = announce(None, b"default_pg", b"0", list(range(NRANKS)))
    set_current(g)
    world = init("world", NRANKS, RANK, "world", config=new_config())
    set_current(-1)
    if RANK == NRANKS - 1:
        check("ncclCommDestroy", fn("ncclCommDestroy")(world))
        return
    ex = (i * 1)(NRANKS - 1)
    for label, cfg in (("shrunk_cfg", new_config()), ("shrunk_null", None)):
        c = vp()
        check("ncclCommShrink " + label,
              fn("ncclCommShrink")(world, ex, 1, ctypes.byref(c),
                                   ctypes.byref(cfg) if cfg is not None else None, 0))
        record(label, c)
        allreduce(label, c)
    for c in reversed(COMMS):
        check("ncclCommDestroy", fn("ncclCommDestroy")(c))


{"main": main_scenario, "envrole": envrole_scenario, "late": late_scenario,
 "shrink": shrink_scenario}[SCENARIO]()
print("DONE", flush=True)
