"""Fake `torch.distributed.device_mesh`: `init_device_mesh` and `DeviceMesh` over nested lists.

As upstream: the mesh is `arange(world).reshape(mesh_shape)` (row-major, last dimension
fastest); every rank creates every sub-group of every dimension (`new_group(ranks,
group_desc=f"mesh_{name}")`, or one `split_group` per dimension when the default group is bound
to a device); a 1-D mesh over the whole world reuses the default group.
"""

from . import distributed_c10d as c10d


def _reshape(flat, shape):
    if len(shape) == 1:
        return list(flat)
    step = len(flat) // shape[0]
    return [_reshape(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _shape(mesh):
    shape = []
    while isinstance(mesh, list):
        shape.append(len(mesh))
        mesh = mesh[0]
    return tuple(shape)


def _flatten(mesh):
    if not isinstance(mesh, list):
        return [mesh]
    return [x for m in mesh for x in _flatten(m)]


def _groups_along(mesh, dim):
    """Every 1-D slice of `mesh` along `dim` (rank lists), in row-major order of the rest."""
    shape = _shape(mesh)
    flat = _flatten(mesh)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    out = []
    for start in range(len(flat)):
        if (start // strides[dim]) % shape[dim] != 0:
            continue
        out.append([flat[start + k * strides[dim]] for k in range(shape[dim])])
    return out


class DeviceMesh:
    """A named n-D arrangement of the ranks with one process group per dimension."""

    def __init__(self, device_type, mesh, *, mesh_dim_names=None, backend_override=None, _init_backend=True):
        self.device_type = device_type
        self.mesh = mesh if isinstance(mesh, list) else list(mesh)
        self.mesh_dim_names = tuple(mesh_dim_names) if mesh_dim_names else None
        self._dim_groups = []
        if _init_backend:
            self._init_process_groups()

    @property
    def ndim(self):
        return len(_shape(self.mesh))

    def size(self, mesh_dim=None):
        shape = _shape(self.mesh)
        if mesh_dim is None:
            n = 1
            for s in shape:
                n *= s
            return n
        return shape[self._dim(mesh_dim)]

    def _dim(self, mesh_dim):
        if isinstance(mesh_dim, str):
            return self.mesh_dim_names.index(mesh_dim)
        return mesh_dim

    def _init_process_groups(self):
        default = c10d._get_default_group()
        world = default.size()
        me = default.rank()
        if self.ndim == 1 and self.size() == world:
            self._dim_groups.append(default)
            return
        for dim in range(self.ndim):
            desc = "mesh_%s" % self.mesh_dim_names[dim] if self.mesh_dim_names else "mesh_dim_%d" % dim
            groups = _groups_along(self.mesh, dim)
            mine = None
            if default.bound_device_id is not None:
                mine = c10d.split_group(parent_pg=default, split_ranks=groups, group_desc=desc)
            else:
                for ranks in groups:
                    pg = c10d.new_group(ranks=ranks, group_desc=desc)
                    if me in ranks:
                        mine = pg
            self._dim_groups.append(mine)

    def get_group(self, mesh_dim=None):
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError("Found the DeviceMesh have %d dimensions; specify mesh_dim" % self.ndim)
            mesh_dim = 0
        return self._dim_groups[self._dim(mesh_dim)]

    def get_all_groups(self):
        return list(self._dim_groups)

    def get_local_rank(self, mesh_dim=None):
        return c10d.get_rank(self.get_group(mesh_dim))


def init_device_mesh(device_type, mesh_shape, *, mesh_dim_names=None, backend_override=None):
    """A DeviceMesh of `mesh_shape` over ranks 0..prod(mesh_shape) in row-major order."""
    mesh_shape = tuple(mesh_shape)
    if mesh_dim_names is not None and len(mesh_dim_names) != len(mesh_shape):
        raise RuntimeError("mesh_shape and mesh_dim_names should have same length!")
    n = 1
    for s in mesh_shape:
        n *= s
    return DeviceMesh(device_type, _reshape(list(range(n)), mesh_shape), mesh_dim_names=mesh_dim_names)
