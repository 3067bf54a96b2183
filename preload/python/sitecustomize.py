"""CommInsight: enable the Python inject (`comminsight_inject`) in every Python process started with
LD_PRELOAD=libcomminsight-preload.so (the preload puts this directory on PYTHONPATH), then run the
`sitecustomize` this one hides (the next one on sys.path), so a distribution's or a virtual
environment's own customisation still happens.

`COMMINSIGHT_INJECT=0` disables the inject (the chained sitecustomize still runs). Never breaks
interpreter startup: every error is swallowed; with `COMMINSIGHT_DEBUG=1` it is reported in one
line on stderr.
"""


def _debug(what, err):
    import os
    import sys

    if os.environ.get("COMMINSIGHT_DEBUG") == "1":
        sys.stderr.write("comminsight sitecustomize: %s: %s: %s\n" % (what, type(err).__name__, err))


def _install():
    import os

    if os.environ.get("COMMINSIGHT_INJECT", "1").strip() == "0":
        return
    import comminsight_inject

    comminsight_inject.install()


def _chain():
    """Execute the next `sitecustomize` on sys.path after this file's directory, if any."""
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    entries = list(sys.path)
    after = None
    for i, e in enumerate(entries):
        try:
            if os.path.realpath(os.path.abspath(e or os.getcwd())) == here:
                after = entries[i + 1:]
                break
        except (OSError, ValueError):
            continue
    if after is None:
        return
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", after)
    if spec is None or spec.loader is None:
        return
    origin = spec.origin and os.path.realpath(spec.origin)
    if origin == os.path.realpath(os.path.abspath(__file__)):
        return
    module = importlib.util.module_from_spec(spec)
    ours = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        # The chained module stays reachable; `import sitecustomize` keeps giving this one.
        sys.modules["_comminsight_chained_sitecustomize"] = module
        if ours is not None:
            sys.modules["sitecustomize"] = ours


try:
    _install()
except BaseException as e:  # noqa: BLE001  (startup must never break)
    try:
        _debug("inject", e)
    except BaseException:  # noqa: BLE001
        pass
try:
    _chain()
except BaseException as e:  # noqa: BLE001
    try:
        _debug("chaining to the next sitecustomize", e)
    except BaseException:  # noqa: BLE001
        pass
