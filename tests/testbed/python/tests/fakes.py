"""Stand-ins for unit tests of the inject against the fake torch: the preload's ABI and NCCL.

`FakeAbi` mimics libcomminsight-preload.so's C ABI as the inject sees it; `FakeNccl` replaces the
fake torch's `NcclLib` and records, for every communicator it makes, the announcement that was
the thread's current group at that moment (what the real preload would name it from).
"""

import threading


class FakeAbi:
    version = 1

    def __init__(self):
        self.announced = []
        self.comms = {}
        self.events = []
        self._tls = threading.local()

    def current(self):
        return getattr(self._tls, "gid", -1)

    def announce(self, role, desc, name, ranks, my_rank):
        if my_rank not in ranks or len(set(ranks)) != len(ranks):
            return -1
        self.announced.append({"role": role, "desc": desc, "name": name, "ranks": list(ranks), "my_rank": my_rank})
        return len(self.announced) - 1

    def set_current_group(self, gid):
        self._tls.gid = gid if 0 <= gid < len(self.announced) else -1
        self.events.append(("current", self._tls.gid))

    def group_comms(self, gid):
        if not 0 <= gid < len(self.announced):
            return -1
        return self.comms.get(gid, 0)


class FakeStore:
    """A store whose keys all exist (one process plays one rank)."""

    def set(self, key, value):
        pass

    def get(self, key):
        return b"\x01" * 128


class FakeNccl:
    version_code = 23007

    def __init__(self, abi):
        self.abi = abi
        self.made = []  # {"how", "nranks", "rank", "current"}
        self.ops = []
        self._next = 0x1000

    def _new(self, how, nranks, rank):
        cur = self.abi.current()
        self.made.append({"how": how, "nranks": nranks, "rank": rank, "current": cur})
        if cur >= 0:
            self.abi.comms[cur] = self.abi.comms.get(cur, 0) + 1
        self._next += 0x10
        return self._next

    def check(self, what, res):
        assert res == 0, what

    def unique_id(self):
        return b"\x01" * 128

    def comm_init_rank_config(self, nranks, uid, rank):
        return self._new("init", nranks, rank)

    def comm_split(self, parent, color, key):
        if color == -1:
            self.made.append({"how": "nocolor", "nranks": 0, "rank": key, "current": self.abi.current()})
            return None
        return self._new("split", None, key)

    def comm_destroy(self, comm):
        pass

    def _op(self, name, comm):
        self.ops.append((name, comm, self.abi.current()))

    def all_reduce(self, send, recv, count, dtype, op, comm):
        self._op("all_reduce", comm)

    def broadcast(self, send, recv, count, dtype, root, comm):
        self._op("broadcast", comm)

    def reduce(self, send, recv, count, dtype, op, root, comm):
        self._op("reduce", comm)

    def all_gather(self, send, recv, count, dtype, comm):
        self._op("all_gather", comm)

    def reduce_scatter(self, send, recv, count, dtype, op, comm):
        self._op("reduce_scatter", comm)

    def all_to_all(self, send, recv, count, dtype, comm, nranks, elem_size):
        self._op("all_to_all", comm)

    def send(self, buf, count, dtype, peer, comm):
        self._op("send", comm)

    def recv(self, buf, count, dtype, peer, comm):
        self._op("recv", comm)

    def group_start(self):
        pass

    def group_end(self):
        pass

    def synchronize(self, comm):
        return 0

    def comm_hash(self, comm):
        return comm

    def profiled_ops(self):
        return len(self.ops)

    def profiler_abi(self):
        return 0
