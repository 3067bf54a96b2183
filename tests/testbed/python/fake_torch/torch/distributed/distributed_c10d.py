"""Fake `torch.distributed.distributed_c10d`: upstream call signatures over a ProcessGroupNCCL-like
backend (`_nccl.NcclLib`, the libnccl stand-in through ctypes).

Mirrors upstream PyTorch where CommInsight looks (signatures checked against
pytorch/pytorch `torch/distributed/distributed_c10d.py`):
* group names as torch makes them: "0" for the default group, then a counter every `new_group`
  call increments on every rank (members or not); `group_desc` "default_pg" / "undefined";
* every group goes through `_new_process_group_helper(group_size, group_rank,
  global_ranks_in_group, backend, store, group_name, backend_options, timeout, pg_tag, device_id,
  group_desc)` (empty `global_ranks_in_group` = the default group); `split_group` builds its groups
  itself, as upstream does;
* communicators: lazy (created by the group's first collective, `ncclCommInitRankConfig` with a
  unique id that group rank 0 publishes through the store under `<group_name>/<n>`), or eager when
  the default group is bound to a device (`init_process_group(device_id=...)`): the default comm is
  made at once and `new_group` / `split_group` split it (`ncclCommSplit`; non-members call it with
  NCCL_SPLIT_NOCOLOR, as torch does);
* `commName` is never set.
Simplifications: flat tensors; no store-based barrier in `new_group`; send/recv use the group's
communicator (upstream may make a separate 2-rank p2p communicator); `init_method` must be
`file://<dir>` (a directory of key files) unless `store` is given.
"""

import binascii
import os
import warnings
from datetime import timedelta

from . import _nccl
from ._store import FileStore, PrefixStore

__all__ = [
    "Backend", "GroupMember", "P2POp", "ProcessGroup", "ReduceOp", "Work", "all_gather",
    "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single", "barrier",
    "batch_isend_irecv", "broadcast", "destroy_process_group", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "group", "init_process_group",
    "irecv", "is_available", "is_initialized", "is_nccl_available", "isend", "new_group", "recv",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "send", "split_group",
]

default_pg_timeout = timedelta(minutes=10)


class Backend(str):
    NCCL = "nccl"
    GLOO = "gloo"

    def __new__(cls, name):
        return str.__new__(cls, name.lower())


class ReduceOp:
    SUM = 0
    PRODUCT = 1
    MAX = 2
    MIN = 3
    AVG = 4


class _WorldMeta(type):
    @property
    def WORLD(cls):
        return _world.default_pg


class GroupMember(metaclass=_WorldMeta):
    NON_GROUP_MEMBER = -100


class group(metaclass=_WorldMeta):
    pass


class Work:
    """A finished-on-enqueue handle (NCCL orders the stream; `wait` does not block the host)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _World:
    def __init__(self):
        self.default_pg = None
        self.pg_map = {}
        self.pg_names = {}
        self.pg_group_ranks = {}
        self.group_count = 0
        self.nccl = None


_world = _World()


# ---------------------------------------------------------------- the ProcessGroupNCCL-like backend


class ProcessGroup:
    """A process group and its (lazily created) NCCL communicator."""

    def __init__(self, store, rank, size, global_ranks, group_name, group_desc, split_from=None):
        self._store = store
        self._rank, self._size = rank, size
        self._global_ranks = list(global_ranks)
        self._group_name, self._group_desc = group_name, group_desc
        self._comm = None
        self._comm_counter = 0
        self._splits = 0
        self._split_from = split_from
        self.bound_device_id = None

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def name(self):
        return "NCCL"

    @property
    def group_name(self):
        return self._group_name

    @property
    def group_desc(self):
        return self._group_desc

    def __repr__(self):
        return "ProcessGroup(name=%r, desc=%r, rank=%d, size=%d)" % (
            self._group_name, self._group_desc, self._rank, self._size)

    def _lib(self):
        return _world.nccl

    def _init_comm(self):
        lib = self._lib()
        parent = self._split_from
        if parent is not None and parent._comm is not None:
            color = _split_color(self._global_ranks)
            parent._splits += 1
            self._comm = lib.comm_split(parent._comm, color, self._rank)
            return
        key = str(self._comm_counter)
        self._comm_counter += 1
        if self._rank == 0:
            uid = lib.unique_id()
            self._store.set(key, uid)
        else:
            uid = self._store.get(key)
        self._comm = lib.comm_init_rank_config(self._size, uid, self._rank)

    def _get_comm(self):
        if self._comm is None:
            self._init_comm()
        return self._comm

    def eager_connect_single_device(self, device):
        self._get_comm()

    def perform_nocolor_split(self, device):
        """Take part in a parent split this process is not a member of."""
        self._splits += 1
        self._lib().comm_split(self._get_comm(), _nccl.NCCL_SPLIT_NOCOLOR, self._rank)

    def _destroy(self):
        if self._comm is not None:
            self._lib().comm_destroy(self._comm)
            self._comm = None


def _split_color(ranks):
    """A non-negative color from the member ranks (like torch's genNcclSplitColor)."""
    return binascii.crc32(",".join(map(str, ranks)).encode()) & 0x7FFFFFFF


# ---------------------------------------------------------------- groups


def is_available():
    return True


def is_nccl_available():
    return True


def is_initialized():
    return _world.default_pg is not None


def _get_default_group():
    if _world.default_pg is None:
        raise ValueError("Default process group has not been initialized, please make sure to call init_process_group.")
    return _world.default_pg


def _rank_not_in_group(group):
    return group is GroupMember.NON_GROUP_MEMBER or (group is None and _world.default_pg is None)


def _process_group_name(ranks, use_hashed_name):
    if use_hashed_name:
        import hashlib

        name = hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()
        while name in _world.pg_names.values():
            name = hashlib.sha1((name + "_").encode()).hexdigest()
        return name
    name = str(_world.group_count)
    _world.group_count += 1
    return name


def _store_from(init_method, store):
    if store is not None:
        return store
    if init_method and init_method.startswith("file://"):
        return FileStore(init_method[len("file://"):])
    raise ValueError("fake torch: init_method must be file://<dir> (or pass store=)")


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """Initialise the default group (group name "0" unless given, description "default_pg")."""
    if _world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if world_size == -1:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if rank == -1:
        rank = int(os.environ.get("RANK", "0"))
    store = _store_from(init_method, store)
    if _world.nccl is None:
        _world.nccl = _nccl.NcclLib()
    group_name = group_name or _process_group_name([], use_hashed_name=False)
    pg, _ = _new_process_group_helper(world_size, rank, [], backend or "nccl", store, group_name,
                                      backend_options=pg_options, timeout=timeout,
                                      device_id=device_id, group_desc="default_pg")
    _world.default_pg = pg
    _world.default_store = store


def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store,
                              group_name, backend_options=None, timeout=None, pg_tag=None,
                              device_id=None, group_desc=None):
    """Create a process group (the choke point every group goes through, as in torch)."""
    if group_name in _world.pg_names.values():
        raise ValueError("The specified group name %s has already been created, please use a different group name" % group_name)
    group_desc = "undefined" if group_desc is None else group_desc
    is_default_group = len(global_ranks_in_group) == 0
    split_from = None
    if not is_default_group and _world.default_pg is not None and _world.default_pg.bound_device_id is not None:
        split_from = _world.default_pg
    if not is_default_group:
        global_rank = _get_default_group().rank()
        if global_rank not in global_ranks_in_group:
            if split_from is not None:
                split_from.perform_nocolor_split(split_from.bound_device_id)
            return GroupMember.NON_GROUP_MEMBER, None
    ranks = list(global_ranks_in_group) if not is_default_group else list(range(group_size))
    prefix_store = PrefixStore("%s/" % group_name, store)
    pg = ProcessGroup(prefix_store, group_rank, group_size, ranks, group_name, group_desc, split_from)
    if device_id is not None:
        pg.bound_device_id = device_id
        pg.eager_connect_single_device(device_id)
    _world.pg_map[pg] = (backend, prefix_store)
    _world.pg_names[pg] = group_name
    _world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}
    return pg, prefix_store


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None):
    """Every rank calls this for every group (members or not), as with torch."""
    return _new_group_with_tag(ranks, timeout, backend, pg_options, None, use_local_synchronization,
                               group_desc, device_id)


def _new_group_with_tag(ranks=None, timeout=None, backend=None, backend_options=None, pg_tag=None,
                        use_local_synchronization=False, group_desc=None, device_id=None):
    default_pg = _get_default_group()
    if device_id is None:
        device_id = default_pg.bound_device_id
    global_rank, world = default_pg.rank(), default_pg.size()
    if ranks:
        ranks = sorted(ranks)
        if len(ranks) > world or any(r < 0 or r >= world for r in ranks):
            raise ValueError("new_group: ranks %r do not fit a world of %d" % (ranks, world))
        group_rank = ranks.index(global_rank) if global_rank in ranks else -1
    else:
        ranks = list(range(world))
        group_rank = global_rank
    group_name = _process_group_name(ranks, use_hashed_name=use_local_synchronization)
    pg, _ = _new_process_group_helper(len(ranks), group_rank, ranks, backend or "nccl",
                                      _world.default_store, group_name, backend_options=backend_options,
                                      timeout=timeout, pg_tag=pg_tag, device_id=device_id,
                                      group_desc=group_desc)
    return pg


def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None, group_desc=None):
    """Split `parent_pg` (default: the default group, which must be bound to a device) into
    `split_ranks` (lists of ranks of the parent group); returns this rank's group, or None."""
    parent = parent_pg or _get_default_group()
    if parent.bound_device_id is None:
        raise RuntimeError("No device associated with the parent pg, not safe to split any process groups")
    me = parent.rank()
    mine = next((sorted(s) for s in split_ranks if me in s), None)
    if group_desc is None:  # as upstream, before the split
        group_desc = "%s:split:%d" % (parent.group_desc, parent._splits)
    if mine is None:
        parent.perform_nocolor_split(parent.bound_device_id)
        return None
    # as upstream: hashed names (unique without a counter)
    group_name = _process_group_name(mine, use_hashed_name=True)
    global_ranks = [parent._global_ranks[r] for r in mine]
    prefix_store = PrefixStore("%s/" % group_name, _world.default_store)
    pg = ProcessGroup(prefix_store, mine.index(me), len(mine), global_ranks, group_name, group_desc,
                      split_from=parent)
    pg.bound_device_id = parent.bound_device_id
    pg.eager_connect_single_device(pg.bound_device_id)
    _world.pg_map[pg] = ("nccl", prefix_store)
    _world.pg_names[pg] = group_name
    _world.pg_group_ranks[pg] = {g: i for i, g in enumerate(global_ranks)}
    return pg


def _group_or_default(group):
    return _get_default_group() if group is None else group


def get_rank(group=None):
    if _rank_not_in_group(group):
        return -1
    return _group_or_default(group).rank()


def get_world_size(group=None):
    if _rank_not_in_group(group):
        return -1
    return _group_or_default(group).size()


def get_process_group_ranks(group):
    return list(_group_or_default(group)._global_ranks)


def get_group_rank(group, global_rank):
    return _world.pg_group_ranks[_group_or_default(group)][global_rank]


def get_global_rank(group, group_rank):
    return _group_or_default(group)._global_ranks[group_rank]


def destroy_process_group(group=None):
    if group is None:
        for pg in list(_world.pg_map):
            if pg is not _world.default_pg:
                pg._destroy()
        if _world.default_pg is not None:
            _world.default_pg._destroy()
        nccl = _world.nccl
        _world.__init__()
        _world.nccl = nccl
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    group._destroy()
    _world.pg_map.pop(group, None)
    _world.pg_names.pop(group, None)
    _world.pg_group_ranks.pop(group, None)


# ---------------------------------------------------------------- collectives and p2p


def _target(group):
    """(pg, comm) for an op on `group`, or None when this rank is not a member."""
    if _rank_not_in_group(group):
        warnings.warn("Running an op on a group this rank is not part of")
        return None
    pg = _group_or_default(group)
    return pg, pg._get_comm()


def _done(async_op):
    return Work() if async_op else None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    t = _target(group)
    if t is None:
        return None
    _world.nccl.all_reduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), tensor.dtype._nccl, op, t[1])
    return _done(async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    t = _target(group)
    if t is None:
        return None
    root = group_src if group_src is not None else get_group_rank(t[0], src)
    _world.nccl.broadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), tensor.dtype._nccl, root, t[1])
    return _done(async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    t = _target(group)
    if t is None:
        return None
    root = group_dst if group_dst is not None else get_group_rank(t[0], dst)
    _world.nccl.reduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), tensor.dtype._nccl, op, root, t[1])
    return _done(async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    t = _target(group)
    if t is None:
        return None
    _world.nccl.all_gather(input_tensor.data_ptr(), output_tensor.data_ptr(), input_tensor.numel(),
                           input_tensor.dtype._nccl, t[1])
    return _done(async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    from .. import empty

    out = empty(tensor.numel() * len(tensor_list), dtype=tensor.dtype)
    w = all_gather_into_tensor(out, tensor, group=group)
    if _target_member(group):
        _scatter_copy(out, tensor_list)
    return w if async_op else None


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    t = _target(group)
    if t is None:
        return None
    _world.nccl.reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(), output.dtype._nccl, op, t[1])
    return _done(async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    inp = _concat(input_list)
    return reduce_scatter_tensor(output, inp, op=op, group=group, async_op=async_op)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op=False):
    if output_split_sizes or input_split_sizes:
        raise NotImplementedError("fake torch: all_to_all_single supports equal splits only")
    t = _target(group)
    if t is None:
        return None
    n = t[0].size()
    _world.nccl.all_to_all(input.data_ptr(), output.data_ptr(), input.numel() // n, input.dtype._nccl,
                           t[1], n, input.element_size())
    return _done(async_op)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    from .. import empty

    inp = _concat(input_tensor_list)
    out = empty(inp.numel(), dtype=inp.dtype)
    w = all_to_all_single(out, inp, group=group)
    if _target_member(group):
        _scatter_copy(out, output_tensor_list)
    return w if async_op else None


def _target_member(group):
    return not _rank_not_in_group(group)


def _concat(tensors):
    from .. import frombuffer

    return frombuffer(b"".join(t.tobytes() for t in tensors), dtype=tensors[0].dtype)


def _scatter_copy(src, tensors):
    """Copy `src` into `tensors` once the op that wrote it finished (the list forms wait)."""
    import ctypes

    from .. import cuda

    cuda.synchronize()
    off = 0
    for t in tensors:
        ctypes.memmove(t.data_ptr(), src.data_ptr() + off, t.nbytes)
        off += t.nbytes


def _p2p(tensor, peer, group, group_peer, send):
    t = _target(group)
    if t is None:
        return None
    gp = group_peer if group_peer is not None else get_group_rank(t[0], peer)
    f = _world.nccl.send if send else _world.nccl.recv
    f(tensor.data_ptr(), tensor.numel(), tensor.dtype._nccl, gp, t[1])
    return Work()


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    _p2p(tensor, dst, group, group_dst, True)


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    _p2p(tensor, src, group, group_src, False)
    return src


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    return _p2p(tensor, dst, group, group_dst, True)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    return _p2p(tensor, src, group, group_src, False)


class P2POp:
    """One point-to-point op for `batch_isend_irecv` (`op` is `isend` or `irecv`)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or ``torch.distributed.irecv``.")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer


def batch_isend_irecv(p2p_op_list):
    """The ops in one NCCL group (ncclGroupStart/End), as torch's coalescing manager does."""
    if not p2p_op_list:
        raise ValueError("batch_isend_irecv: empty op list")
    group = p2p_op_list[0].group
    if any(p.group is not group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    if _target(group) is None:
        return []
    _world.nccl.group_start()
    try:
        reqs = [p.op(p.tensor, p.peer, p.group, p.tag, group_dst=p.group_peer) if p.op is isend
                else p.op(p.tensor, p.peer, p.group, p.tag, group_src=p.group_peer) for p in p2p_op_list]
    finally:
        _world.nccl.group_end()
    return reqs


def barrier(group=None, async_op=False, device_ids=None):
    """An all-reduce of one element, as ProcessGroupNCCL does."""
    from .. import empty

    return all_reduce(empty(1), group=group, async_op=async_op)


# ---------------------------------------------------------------- test-bed hooks (not in torch)


def _testbed_nccl():
    """The loaded NCCL (None before init_process_group)."""
    return _world.nccl


def _testbed_comm(group=None):
    """The NCCL communicator handle of `group` (None while not created yet)."""
    if _rank_not_in_group(group):
        return None
    return _group_or_default(group)._comm


def _testbed_any_comm():
    """(lib, comm) with any live communicator, or (None, None)."""
    for pg in [_world.default_pg] + list(_world.pg_map):
        if pg is not None and pg._comm is not None:
            return _world.nccl, pg._comm
    return None, None
