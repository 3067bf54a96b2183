"""The preload shim's C ABI (libcomminsight-preload.so, in the process' global scope), via ctypes.

See the shim's README: `comminsight_preload_version`, `comminsight_announce_group`,
`comminsight_set_current_group`, `comminsight_group_comms`.
"""

import ctypes

EXPECTED_VERSION = 1
MAX_STRING_BYTES = 256


class PreloadAbi:
    """Calls into the preload; raises AttributeError at construction when it is not loaded."""

    def __init__(self, lib=None):
        lib = lib if lib is not None else ctypes.CDLL(None)
        version = lib.comminsight_preload_version
        version.argtypes, version.restype = [], ctypes.c_int
        self.version = version()
        announce = lib.comminsight_announce_group
        announce.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                             ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        announce.restype = ctypes.c_int
        current = lib.comminsight_set_current_group
        current.argtypes, current.restype = [ctypes.c_int], None
        comms = lib.comminsight_group_comms
        comms.argtypes, comms.restype = [ctypes.c_int], ctypes.c_int
        self._announce, self._current, self._comms = announce, current, comms

    def announce(self, role, desc, name, ranks, my_rank):
        """The announcement id (>= 0), or -1 when the preload rejected it (it logs why)."""
        arr = (ctypes.c_int * len(ranks))(*ranks)

        def enc(s):
            return None if s is None else str(s).encode("utf-8", "replace")

        return self._announce(enc(role), enc(desc), enc(name), arr, len(ranks), int(my_rank))

    def set_current_group(self, gid):
        self._current(int(gid))

    def group_comms(self, gid):
        return self._comms(int(gid))


def load():
    """The preload's ABI, or None when libcomminsight-preload.so is not loaded (or too old/new)."""
    try:
        abi = PreloadAbi()
    except (AttributeError, OSError):
        return None
    return abi if abi.version >= EXPECTED_VERSION else None
