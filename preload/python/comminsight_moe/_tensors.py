"""The stats vectors the kernels accumulate into: torch int64 tensors when torch is importable
(on `device`, default CUDA when available), else numpy int64 arrays, else `array('q')`."""

import array


def backend(prefer_torch=True):
    if prefer_torch:
        try:
            import torch  # noqa: F401

            return "torch"
        except ImportError:
            pass
    try:
        import numpy  # noqa: F401

        return "numpy"
    except ImportError:
        return "array"


def zeros(kind, n, device=None):
    if kind == "torch":
        import torch

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.zeros((n,), dtype=torch.int64, device=device)
    if kind == "numpy":
        import numpy

        return numpy.zeros((n,), dtype=numpy.int64)
    return array.array("q", [0] * n)


def capturing(kind):
    """Whether the current CUDA stream is capturing a graph (torch only)."""
    if kind != "torch":
        return False
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def take(kind, t):
    """The host copy of `t` as non-negative ints (int64 bits read as u64), then `t` zeroed."""
    if kind == "torch":
        vals = t.cpu().tolist()
        t.zero_()
    elif kind == "numpy":
        vals = t.tolist()
        t.fill(0)
    else:
        vals = list(t)
        for k in range(len(t)):
            t[k] = 0
    return [v & 0xFFFF_FFFF_FFFF_FFFF for v in vals]
