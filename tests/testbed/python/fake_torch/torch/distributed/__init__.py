"""Fake `torch.distributed` (see `distributed_c10d` for what it mirrors of upstream PyTorch)."""

from . import distributed_c10d
from .distributed_c10d import (  # noqa: F401  (the public names torch.distributed re-exports)
    Backend,
    GroupMember,
    P2POp,
    ProcessGroup,
    ReduceOp,
    Work,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    destroy_process_group,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_initialized,
    is_nccl_available,
    isend,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    send,
    split_group,
)


def is_available():
    return True


from .device_mesh import DeviceMesh, init_device_mesh  # noqa: E402,F401
