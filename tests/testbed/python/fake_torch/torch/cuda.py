"""Fake `torch.cuda`: one device per rank, and `synchronize()` over the NCCL stand-in."""

import os
import threading


def is_available():
    return True


def device_count():
    return int(os.environ.get("COMMINSIGHT_FAKE_DEVICES", "8"))


_current = [int(os.environ.get("LOCAL_RANK", "0"))]


def set_device(dev):
    _current[0] = dev if isinstance(dev, int) else (dev.index or 0)


def current_device():
    return _current[0]


def synchronize(device=None):
    """Wait until every NCCL operation enqueued by this process has finished (the stand-in's
    `ncclTestbedSynchronize`, like `cudaDeviceSynchronize`), in a helper thread so signals still
    reach Python while waiting."""
    from .distributed import distributed_c10d as c10d

    lib, comm = c10d._testbed_any_comm()
    if lib is None:
        return
    done = threading.Event()
    res = [0]

    def work():
        res[0] = lib.synchronize(comm)
        done.set()

    threading.Thread(target=work, name="cuda-synchronize", daemon=True).start()
    while not done.wait(0.05):
        pass
    lib.check("ncclTestbedSynchronize", res[0])
