"""Where a reporter's rows go: `comminsight_ep_stats_push` of the CommInsight NCCL profiler plugin
(plugin/README.md, "EP wait rows"), or of the preload shim when it exports the same entry point.

NCCL dlopens the plugin with RTLD_LOCAL, so its symbols are not in the global scope: the plugin is
found by its path in /proc/self/maps (or `COMMINSIGHT_PLUGIN_PATH`, or `NCCL_PROFILER_PLUGIN`
when that is a path) and opened with RTLD_NOLOAD (never loaded by us: a plugin NCCL has not loaded
yet has no ring). Without the plugin, the process' global scope (`ctypes.CDLL(None)`: the preload,
`libcomminsight-preload.so`) is tried.
"""

import ctypes
import os

ABI_VERSION = 1
PLUGIN_NAMES = ("libnccl-profiler-comminsight.so", "libnccl_profiler_comminsight.so")

NOT_RUNNING = -1
BAD_ARGS = -2
INTERNAL = -3


class CiEpRow(ctypes.Structure):
    """`struct ci_ep_row`, version 1 (72 bytes)."""

    _fields_ = [
        ("size", ctypes.c_uint32), ("version", ctypes.c_uint32),
        ("ep_group_id", ctypes.c_uint64), ("instance", ctypes.c_uint8 * 16),
        ("window_seq", ctypes.c_uint64), ("t_start_ns", ctypes.c_uint64),
        ("t_end_ns", ctypes.c_uint64), ("steps", ctypes.c_uint32),
        ("scale_bits", ctypes.c_uint32), ("rank", ctypes.c_uint16), ("phase", ctypes.c_uint8),
        ("source", ctypes.c_uint8), ("ep_flags", ctypes.c_uint8), ("reserved", ctypes.c_uint8 * 3),
    ]


assert ctypes.sizeof(CiEpRow) == 72


def plugin_path_in_maps(text):
    """The path of the loaded plugin in a /proc/<pid>/maps text, or None."""
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if os.path.basename(path) in PLUGIN_NAMES:
                return path
    return None


def _candidates():
    for var in ("COMMINSIGHT_PLUGIN_PATH", "NCCL_PROFILER_PLUGIN"):
        v = os.environ.get(var, "")
        if os.sep in v:
            yield v
    try:
        with open("/proc/self/maps") as f:
            p = plugin_path_in_maps(f.read())
    except OSError:
        p = None
    if p:
        yield p


def _bind(lib):
    push = lib.comminsight_ep_stats_push
    push.argtypes = [ctypes.POINTER(CiEpRow), ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
    push.restype = ctypes.c_int
    version = lib.comminsight_ep_abi_version
    version.argtypes, version.restype = [], ctypes.c_int
    if version() != ABI_VERSION:
        raise AttributeError("comminsight_ep_abi_version %d, want %d" % (version(), ABI_VERSION))
    return push


class CSink:
    """Pushes rows through a loaded entry point; `where` says which library."""

    def __init__(self, push, where):
        self._push, self.where = push, where

    def push(self, head, values):
        """Records that went in (>= 0) or a negative code (NOT_RUNNING, BAD_ARGS, INTERNAL)."""
        n = len(values)
        arr = (ctypes.c_uint64 * n)(*values)
        return self._push(ctypes.byref(head), arr, n)


def find():
    """A CSink on the loaded plugin, else on the preload's global symbol, else None."""
    mode = getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LOCAL", 0)
    for path in _candidates():
        try:
            return CSink(_bind(ctypes.CDLL(path, mode=mode)), path)
        except (OSError, AttributeError):
            continue
    try:
        return CSink(_bind(ctypes.CDLL(None)), "global scope")
    except (OSError, AttributeError):
        return None
