"""A fake `torch` for the CommInsight CPU test bed: just enough for `torch.distributed`.

Not PyTorch. It exists so the test bed can run training ranks that talk to NCCL the way PyTorch
does (a ProcessGroupNCCL-like backend, upstream call signatures) without installing torch, and so
the CommInsight Python inject (`preload/python/comminsight_inject`) can be tested against the same
import paths and functions it patches in real torch.

Tensors are flat float32 (or int32/uint8) host buffers (`ctypes`), which the libnccl stand-in
reads and writes directly; `torch.cuda` is a stub whose `synchronize()` waits for the stand-in's
enqueued work (`ncclTestbedSynchronize`).
"""

import ctypes

__version__ = "2.9.0+fake.commInsight"


class dtype:
    """A tensor element type."""

    def __init__(self, name, size, ctype, nccl):
        self.name, self.itemsize, self._ctype, self._nccl = name, size, ctype, nccl

    def __repr__(self):
        return "torch." + self.name


float32 = dtype("float32", 4, ctypes.c_float, 7)
float = float32
int32 = dtype("int32", 4, ctypes.c_int32, 2)
uint8 = dtype("uint8", 1, ctypes.c_uint8, 1)


class device:
    """`torch.device("cuda", 3)` or `torch.device("cuda:3")`."""

    def __init__(self, type, index=None):
        if isinstance(type, device):
            type, index = type.type, type.index
        if ":" in type:
            type, idx = type.split(":", 1)
            index = int(idx)
        self.type, self.index = type, index

    def __repr__(self):
        return "device(type=%r%s)" % (self.type, "" if self.index is None else ", index=%d" % self.index)

    def __eq__(self, other):
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))


class Tensor:
    """A flat host buffer of `numel` elements of `dtype` (ctypes-backed, stable address)."""

    def __init__(self, numel, dtype=float32, data=None):
        self._numel = int(numel)
        self.dtype = dtype
        self._buf = ctypes.create_string_buffer(max(self._numel * dtype.itemsize, 1))
        if data is not None:
            ctypes.memmove(self._buf, bytes(data), min(len(data), self.nbytes))
        self.device = device("cuda", 0)

    def data_ptr(self):
        return ctypes.addressof(self._buf)

    def numel(self):
        return self._numel

    def element_size(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self._numel * self.dtype.itemsize

    def size(self, dim=None):
        return self._numel if dim is not None else (self._numel,)

    @property
    def shape(self):
        return (self._numel,)

    def __len__(self):
        return self._numel

    def tobytes(self):
        """The raw contents (fake-only; real torch: `t.cpu().numpy().tobytes()`)."""
        return self._buf.raw[: self.nbytes]

    def copy_(self, src):
        ctypes.memmove(self._buf, src._buf, min(self.nbytes, src.nbytes))
        return self

    def __repr__(self):
        return "tensor(<%d x %s>)" % (self._numel, self.dtype.name)


def empty(*size, dtype=float32, device=None):
    """An uninitialised (zeroed) flat tensor of prod(size) elements."""
    n = 1
    for s in (size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size):
        n *= int(s)
    return Tensor(n, dtype)


zeros = empty


def frombuffer(buffer, dtype=float32):
    """A tensor holding a copy of `buffer`'s bytes."""
    data = bytes(buffer)
    return Tensor(len(data) // dtype.itemsize, dtype, data)


def is_tensor(obj):
    return isinstance(obj, Tensor)


from . import cuda  # noqa: E402  (real torch exposes torch.cuda after `import torch`)
