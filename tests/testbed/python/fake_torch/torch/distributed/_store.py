"""Fake torch stores: a directory-backed `FileStore` (one file per key, shared by the ranks of a
job; upstream's FileStore is one file) and `PrefixStore`."""

import os
import time

_STORE_TIMEOUT_S = float(os.environ.get("COMMINSIGHT_FAKE_TORCH_STORE_TIMEOUT_S", "120"))


class FileStore:
    """A key-value store in a directory (one file per key), shared by the ranks of a job."""

    def __init__(self, path, world_size=-1):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _file(self, key):
        return os.path.join(self.path, key.replace("%", "%25").replace("/", "%2F"))

    def set(self, key, value):
        f = self._file(key)
        tmp = "%s.tmp.%d" % (f, os.getpid())
        with open(tmp, "wb") as fh:
            fh.write(value if isinstance(value, bytes) else str(value).encode())
        os.rename(tmp, f)

    def get(self, key):
        f = self._file(key)
        deadline = time.monotonic() + _STORE_TIMEOUT_S
        while not os.path.exists(f):
            if time.monotonic() > deadline:
                raise RuntimeError("store: timed out waiting for key %r in %s" % (key, self.path))
            time.sleep(0.002)
        with open(f, "rb") as fh:
            return fh.read()


class PrefixStore:
    def __init__(self, prefix, store):
        self.prefix, self.store = prefix, store

    def set(self, key, value):
        self.store.set(self.prefix + key, value)

    def get(self, key):
        return self.store.get(self.prefix + key)
