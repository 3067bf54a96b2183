"""CommInsight Python inject: tells the LD_PRELOAD shim (libcomminsight-preload.so) which process
group each NCCL communicator belongs to, so communicators get role names even on PyTorch versions
that pass none to NCCL.

`install()` (called by this package's `sitecustomize.py`) never imports torch. A meta-path finder
patches `torch.distributed.distributed_c10d` and `torch.distributed.device_mesh` right after they
are imported (or at once when they already are):

* every process group this process is a member of is announced to the preload
  (`comminsight_announce_group(NULL, group_desc, group_name, ranks, my_rank)`), from
  `_new_process_group_helper` (the choke point of `init_process_group` and `new_group`; empty
  ranks = the default group = every rank), `split_group`, or, on torch without the helper,
  `init_process_group` / `new_group` themselves; DeviceMesh creation supplies `mesh_<dim>` for
  groups torch left "undefined";
* while a group is being created, the thread's current group is that announcement (eager
  communicators are made inside the creation call);
* the public collectives and point-to-point calls set the current group around the call while
  the group has no communicator yet (lazy communicators are made by the first one); once it has
  one, a wrapper costs one dict lookup (nothing at all once every group is bound).

No-op when torch or torch.distributed is absent, or when the preload is not loaded
(`ctypes.CDLL(None).comminsight_preload_version` missing). Errors inside the inject never reach
the application: the original call always runs.
"""

import functools
import sys
import threading
import weakref

from . import _abi as _abi_mod

__all__ = ["install", "installed"]

C10D = "torch.distributed.distributed_c10d"
MESH = "torch.distributed.device_mesh"

#: Public calls that may create a lazy communicator, wrapped when present.
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "all_gather_object", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "gather",
    "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv", "barrier", "monitored_barrier",
)

_lock = threading.RLock()
_tls = threading.local()
_abi = None
_installed = False
_patched = set()
_groups = weakref.WeakKeyDictionary()  # ProcessGroup -> announcement id
_strong_groups = {}  # the same, for objects that take no weak reference
_pending = {}  # ProcessGroup -> announcement id, while it has no communicator yet
_default = []  # [the default ProcessGroup] once announced
_NOARG = object()


def installed():
    """Whether `install()` has taken effect in this process."""
    return _installed


def install(abi=None):
    """Enable the inject (idempotent). `abi` replaces the preload's ABI (tests only). Returns
    whether it is active: False when the preload is not loaded, or with `COMMINSIGHT_INJECT=0`
    or `COMMINSIGHT_DISABLE=1`."""
    global _abi, _installed
    with _lock:
        if _installed:
            return True
        if abi is None:
            import os

            if os.environ.get("COMMINSIGHT_INJECT", "1").strip() == "0" or \
                    os.environ.get("COMMINSIGHT_DISABLE", "0").strip() == "1":
                return False
            abi = _abi_mod.load()
            if abi is None:
                return False
        _abi = abi
        _installed = True
        for name in (C10D, MESH):
            mod = sys.modules.get(name)
            if mod is not None:
                _patch(name, mod)
        if not any(isinstance(f, _Finder) for f in sys.meta_path):
            sys.meta_path.insert(0, _Finder())
        return True


# ---------------------------------------------------------------- import hook


class _Finder:
    """Finds the targets through the other finders and wraps their loaders to patch after exec."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in (C10D, MESH) or fullname in _patched:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(fullname, path, target)
            except Exception:  # noqa: BLE001
                continue
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


class _PatchingLoader:
    def __init__(self, loader, fullname):
        self._loader, self._fullname = loader, fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(self._fullname, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def _patch(name, module):
    with _lock:
        if name in _patched:
            return
        _patched.add(name)
        try:
            (_patch_c10d if name == C10D else _patch_mesh)(module)
        except Exception as e:  # noqa: BLE001  (never break torch's import)
            _debug("patching %s" % name, e)


def _signature(fn):
    import inspect  # only once torch.distributed is imported: keeps interpreter startup lean

    return inspect.signature(fn)


def _debug(what, err):
    import os

    if os.environ.get("COMMINSIGHT_DEBUG") == "1":
        sys.stderr.write("comminsight_inject: %s: %s: %s\n" % (what, type(err).__name__, err))


def _replace(module, name, wrapper, original):
    """Set `module.name` and every re-export of the same original (torch.distributed.<name>)."""
    setattr(module, name, wrapper)
    pkg = sys.modules.get("torch.distributed")
    if pkg is not None and pkg is not module and getattr(pkg, name, None) is original:
        setattr(pkg, name, wrapper)


# ---------------------------------------------------------------- current group and bookkeeping


def _set_current(gid):
    prev = getattr(_tls, "gid", -1)
    _tls.gid = gid
    _abi.set_current_group(gid)
    return prev


def _restore_current(prev):
    _tls.gid = prev
    _abi.set_current_group(prev)


def _bind(result, gid, is_default):
    """Remember the group object created under announcement `gid`."""
    pg = result[0] if isinstance(result, tuple) and result else result
    if pg is None or isinstance(pg, int):  # GroupMember.NON_GROUP_MEMBER
        return
    try:
        _groups[pg] = gid
    except TypeError:
        _strong_groups[pg] = gid
    if is_default:
        _default[:] = [pg]
    try:
        if _abi.group_comms(gid) == 0:
            _pending[pg] = gid
    except TypeError:
        pass


def group_id(pg):
    """The announcement id of a process group, or None (introspection and tests)."""
    try:
        return _groups.get(pg, _strong_groups.get(pg))
    except TypeError:
        return _strong_groups.get(pg)


def _my_global_rank(c10d):
    return c10d._get_default_group().rank()


# ---------------------------------------------------------------- DeviceMesh context


def _mesh_slices(mesh, dim):
    shape, m = [], mesh
    while isinstance(m, (list, tuple)):
        shape.append(len(m))
        m = m[0] if len(m) else None
    flat = []

    def walk(x):
        if isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        else:
            flat.append(int(x))

    walk(mesh)
    stride = 1
    for s in shape[dim + 1:]:
        stride *= s
    out = []
    for start in range(len(flat)):
        if (start // stride) % shape[dim] == 0:
            out.append(sorted(flat[start + k * stride] for k in range(shape[dim])))
    return out


def _mesh_desc(ranks):
    """`mesh_<dim>` for a group that is a slice of the mesh being built on this thread."""
    ctx = getattr(_tls, "mesh", None)
    if not ctx:
        return None
    mesh, names = ctx[-1]
    want = sorted(ranks)
    ndim = 0
    m = mesh
    while isinstance(m, (list, tuple)):
        ndim += 1
        m = m[0] if len(m) else None
    for d in range(ndim):
        if want in _mesh_slices(mesh, d):
            return "mesh_%s" % names[d] if names else "mesh_dim_%d" % d
    return None


def _with_mesh(mesh, names, fn, args, kwargs):
    stack = getattr(_tls, "mesh", None)
    if stack is None:
        stack = _tls.mesh = []
    stack.append((mesh, tuple(names) if names else None))
    try:
        return fn(*args, **kwargs)
    finally:
        stack.pop()


def _nested(mesh):
    tolist = getattr(mesh, "tolist", None)
    return tolist() if callable(tolist) else mesh


def _patch_mesh(mod):
    init = getattr(mod, "init_device_mesh", None)
    if callable(init):
        sig = _signature(init)

        @functools.wraps(init)
        def init_device_mesh(*args, **kwargs):
            try:
                a = sig.bind_partial(*args, **kwargs).arguments
                shape = tuple(a["mesh_shape"])
                n = 1
                for s in shape:
                    n *= s
                mesh = list(range(n))
                for s in reversed(shape[1:]):
                    mesh = [mesh[i:i + s] for i in range(0, len(mesh), s)]
                ctx = (mesh, a.get("mesh_dim_names"))
            except Exception:  # noqa: BLE001
                return init(*args, **kwargs)
            return _with_mesh(ctx[0], ctx[1], init, args, kwargs)

        _replace(mod, "init_device_mesh", init_device_mesh, init)
    cls = getattr(mod, "DeviceMesh", None)
    orig = getattr(cls, "__init__", None) if cls is not None else None
    if orig is not None and orig is not object.__init__:
        sig = _signature(orig)

        @functools.wraps(orig)
        def __init__(*args, **kwargs):
            try:
                a = sig.bind_partial(*args, **kwargs).arguments
                ctx = (_nested(a["mesh"]), a.get("mesh_dim_names"))
            except Exception:  # noqa: BLE001
                return orig(*args, **kwargs)
            return _with_mesh(ctx[0], ctx[1], orig, args, kwargs)

        cls.__init__ = __init__


# ---------------------------------------------------------------- distributed_c10d


def _announce(desc, name, ranks, my_rank):
    if desc is None or desc == "undefined":
        desc = _mesh_desc(ranks) or "undefined"
    return _abi.announce(None, desc, name, [int(r) for r in ranks], int(my_rank))


def _created_under(gid, fn, args, kwargs, is_default):
    if gid < 0:
        return fn(*args, **kwargs)
    prev = _set_current(gid)
    try:
        result = fn(*args, **kwargs)
    finally:
        _restore_current(prev)
    try:
        _bind(result, gid, is_default)
    except Exception as e:  # noqa: BLE001
        _debug("binding a group", e)
    return result


def _wrap_helper(fn, c10d):
    sig = _signature(fn)

    @functools.wraps(fn)
    def _new_process_group_helper(*args, **kwargs):
        gid, is_default = -1, False
        try:
            a = sig.bind_partial(*args, **kwargs).arguments
            ranks = list(a.get("global_ranks_in_group") or [])
            is_default = not ranks
            desc = a.get("group_desc")
            if is_default:
                ranks = list(range(int(a["group_size"])))
                me = int(a["group_rank"])
                desc = desc or "default_pg"  # torch < 2.3 has no group_desc
            else:
                me = _my_global_rank(c10d)
            if me in ranks:
                gid = _announce(desc, a.get("group_name"), ranks, me)
        except Exception as e:  # noqa: BLE001
            _debug("announcing a group", e)
        return _created_under(gid, fn, args, kwargs, is_default)

    return _new_process_group_helper


def _split_name_fn(fn, c10d):
    """How `split_group` names its group: a function of the sorted member list (parent ranks).
    Recent torch hashes the members (`_process_group_name(ranks, use_hashed_name=True)`, which
    has no side effects); older torch took the next counter value."""
    import inspect

    try:
        hashed = "use_hashed_name=True" in inspect.getsource(fn)
    except (OSError, TypeError):
        hashed = False
    namer = getattr(c10d, "_process_group_name", None)
    if hashed and callable(namer):
        return lambda ranks: namer(ranks, use_hashed_name=True)
    world = getattr(c10d, "_world", None)
    return lambda ranks: str(getattr(world, "group_count", ""))


def _wrap_split_group(fn, c10d):
    sig = _signature(fn)
    name_of = _split_name_fn(fn, c10d)

    @functools.wraps(fn)
    def split_group(*args, **kwargs):
        gid = -1
        try:
            a = sig.bind_partial(*args, **kwargs).arguments
            me = _my_global_rank(c10d)
            parent = a.get("parent_pg")
            if parent is None or parent is _default_group(c10d):
                to_parent, to_global = me, (lambda r: r)
            else:  # split_ranks are ranks of the parent group
                to_parent = c10d.get_group_rank(parent, me)
                to_global = functools.partial(c10d.get_global_rank, parent)
            mine = next((sorted(s) for s in (a.get("split_ranks") or []) if to_parent in s), None)
            if mine is not None:
                # the name torch is about to give it, and the description before torch's
                # "<parent desc>:split:<n>" default (which would read as the parent's role)
                gid = _announce(a.get("group_desc"), name_of(mine), [to_global(r) for r in mine], me)
        except Exception as e:  # noqa: BLE001
            _debug("announcing a split group", e)
        return _created_under(gid, fn, args, kwargs, False)

    return split_group


def _default_group(c10d):
    try:
        return c10d._get_default_group()
    except Exception:  # noqa: BLE001
        return None


def _wrap_after(fn, c10d, is_default):
    """Fallback for torch without `_new_process_group_helper`: announce after creation."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        result = fn(*args, **kwargs)
        try:
            pg = c10d._get_default_group() if is_default else result
            if pg is not None and not isinstance(pg, int):
                ranks = c10d.get_process_group_ranks(pg)
                me = _my_global_rank(c10d)
                desc = getattr(pg, "group_desc", None) or ("default_pg" if is_default else None)
                gid = _announce(desc, getattr(pg, "group_name", ""), ranks, me)
                if gid >= 0:
                    _bind(pg, gid, is_default)
        except Exception as e:  # noqa: BLE001
            _debug("announcing a group", e)
        return result

    return wrapper


def _group_locator(fn):
    """A function (args, kwargs) -> the `group` argument (or _NOARG), found once by signature."""
    if fn.__name__ == "batch_isend_irecv":
        def first_op_group(args, kwargs):
            ops = kwargs.get("p2p_op_list", args[0] if args else None)
            return getattr(ops[0], "group", None) if ops else _NOARG

        return first_op_group
    try:
        params = list(_signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    idx = None
    for i, p in enumerate(params):
        if p.name == "group":
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                idx = i
            break
    if idx is None:
        return lambda args, kwargs: kwargs.get("group", None)

    def locate(args, kwargs):
        g = kwargs.get("group", _NOARG)
        if g is _NOARG:
            g = args[idx] if len(args) > idx else None
        return g

    return locate


def _wrap_collective(fn):
    locate = _group_locator(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not _pending:
            return fn(*args, **kwargs)
        try:
            g = locate(args, kwargs)
            if g is None or g is _NOARG:
                g = _default[0] if _default else None
            gid = _pending.get(g)
        except Exception:  # noqa: BLE001  (unhashable group argument)
            gid = None
        if gid is None:
            return fn(*args, **kwargs)
        prev = _set_current(gid)
        try:
            return fn(*args, **kwargs)
        finally:
            _restore_current(prev)
            try:
                if _abi.group_comms(gid) > 0:
                    _pending.pop(g, None)
            except Exception:  # noqa: BLE001
                pass

    return wrapper


def _patch_c10d(c10d):
    helper = getattr(c10d, "_new_process_group_helper", None)
    if callable(helper):
        c10d._new_process_group_helper = _wrap_helper(helper, c10d)
    else:
        for name, is_default in (("init_process_group", True), ("new_group", False)):
            fn = getattr(c10d, name, None)
            if callable(fn):
                _replace(c10d, name, _wrap_after(fn, c10d, is_default), fn)
    split = getattr(c10d, "split_group", None)
    if callable(split):
        _replace(c10d, "split_group", _wrap_split_group(split, c10d), split)
    for name in COLLECTIVES:
        fn = getattr(c10d, name, None)
        if callable(fn) and not hasattr(fn, "_comminsight"):
            w = _wrap_collective(fn)
            w._comminsight = True
            _replace(c10d, name, w, fn)
