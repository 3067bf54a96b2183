"""CommInsight test-bed rank driver, torch frontend: the plan's steps through `torch.distributed`.

Used by `rank_driver.py` when the plan says `"frontend": "torch"`. The ranks use the fake torch
(`fake_torch/`, put on PYTHONPATH by the job runner): a ProcessGroupNCCL-like backend over the
libnccl stand-in that never names communicators, as upstream PyTorch. Groups are made the
Megatron-core way (every rank calls `new_group(ranks, group_desc=...)` for every group of every
role; the world is the default group) or the DeviceMesh way (`init_device_mesh`). Communicators
are lazy (`comm_init = "config"`: made by each group's first collective) or eager (`"split"`:
`init_process_group(device_id=...)`, then every `new_group` splits the default communicator).

Plan execution, faults, result checks and the truth file are `rank_driver.Rank`'s; a
communicator's `comm` truth line is written once it exists (lazily created ones after the
collective that made them), with the layout group's name, role, hash and ranks.
"""

import os

import rank_driver as rd
import torch
import torch.distributed as dist
from torch.distributed import _nccl
from torch.distributed import distributed_c10d as c10d

#: Megatron-core parallel_state group descriptions, in the order it creates the groups.
MEGATRON_DESCS = [
    ("dp", "DATA_PARALLEL_GROUP"),
    ("cp", "CONTEXT_PARALLEL_GROUP"),
    ("tp", "TENSOR_MODEL_PARALLEL_GROUP"),
    ("pp", "PIPELINE_MODEL_PARALLEL_GROUP"),
    ("ep", "EXPERT_MODEL_PARALLEL_GROUP"),
]


class TorchRank(rd.Rank):
    ERRORS = (_nccl.NcclError,)

    def __init__(self, plan):  # noqa: D401  (does not call Rank.__init__: no direct NCCL)
        self.plan = plan
        self.rank = plan["rank"]
        self.world = plan["world"]
        self.run_dir = plan["run_dir"]
        self.verify = plan.get("verify", True)
        self.libc = rd.ctypes.CDLL(None, use_errno=True)
        self.libc.usleep.argtypes = [rd.ctypes.c_uint]
        self.truth = open(plan["truth_file"], "a", buffering=1)
        self.comms = {}
        self.ep = None  # no [moe] reporter with the torch frontend (it needs frontend = "nccl")
        kw = {}
        if plan.get("comm_init") == "split":
            kw["device_id"] = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", init_method="file://" + os.path.join(self.run_dir, "torch-store"),
                                world_size=self.world, rank=self.rank, **kw)
        self.lib = c10d._testbed_nccl()
        self.version_code = self.lib.version_code

    def profiled_ops(self):
        return self.lib.profiled_ops()

    def profiler_abi(self):
        return self.lib.profiler_abi()

    # -- groups

    def init_comms(self):
        layout = {c["role"]: c for c in self.plan["comms"]}
        self.groups = {"global": None}
        if self.plan.get("torch_groups") == "mesh":
            mesh = self.plan["mesh"]
            if mesh["names"]:
                dm = dist.init_device_mesh("cuda", tuple(mesh["shape"]), mesh_dim_names=tuple(mesh["names"]))
                for name in mesh["names"]:
                    self.groups[name] = dm.get_group(name)
        else:
            for role, desc in MEGATRON_DESCS:
                for ranks in self.plan["all_groups"].get(role, []):
                    pg = dist.new_group(ranks=ranks, group_desc=desc)
                    if self.rank in ranks:
                        self.groups[role] = pg
        for role, c in layout.items():
            pg = self.groups.get(role, "missing")
            got = list(range(self.world)) if pg is None else (
                dist.get_process_group_ranks(pg) if pg != "missing" else None)
            if got != c["ranks"]:
                raise rd.NcclError("torch frontend: %s group of rank %d is %r, the layout says %r"
                                   % (role, self.rank, got, c["ranks"]))
            self.comms[role] = (pg, c["ranks"])
        self.unlogged = set(layout)
        self.log_new_comms()

    def log_new_comms(self):
        for role in sorted(self.unlogged):
            pg, ranks = self.comms[role]
            h = c10d._testbed_comm(pg)
            if h:
                name = next(c["name"] for c in self.plan["comms"] if c["role"] == role)
                self.log(event="comm", role=role, name=(name if role != "global" else ""),
                         hash="0x%016x" % self.lib.comm_hash(h), ranks=ranks)
                self.unlogged.discard(role)

    def teardown(self):
        dist.destroy_process_group()

    # -- operations

    def coll(self, op, keep, checks):
        pg, members = self.comms[op["comm"]]
        func, count = op["func"], op["count"]
        n = len(members)
        me = members.index(self.rank)
        b = rd.base(self.rank)
        total = sum(rd.base(m) for m in members)
        pattern, seq5 = rd.pattern, rd.seq5
        if func == "all_reduce":
            t = torch.frombuffer(pattern(seq5(b), count))
            dist.all_reduce(t, group=pg)
            want = lambda: pattern(seq5(total, n), count)  # noqa: E731
        elif func == "all_gather":
            inp = torch.frombuffer(pattern(seq5(b), count))
            t = torch.empty(count * n)
            dist.all_gather_into_tensor(t, inp, group=pg)
            keep.append(inp)
            want = lambda: b"".join(pattern(seq5(rd.base(m)), count) for m in members)  # noqa: E731
        elif func == "reduce_scatter":
            inp = torch.frombuffer(pattern(seq5(b), count * n))
            t = torch.empty(count)
            dist.reduce_scatter_tensor(t, inp, group=pg)
            keep.append(inp)
            want = lambda: pattern(seq5(total, n), count, (me * count) % 5)  # noqa: E731
        elif func == "all_to_all":
            inp = torch.frombuffer(b"".join(pattern(seq5(b, add=8.0 * p), count) for p in range(n)))
            t = torch.empty(count * n)
            dist.all_to_all_single(t, inp, group=pg)
            keep.append(inp)
            want = lambda: b"".join(pattern(seq5(rd.base(m), add=8.0 * me), count) for m in members)  # noqa: E731
        else:
            raise ValueError("unknown collective %r" % func)
        keep.append(t)
        if self.unlogged:
            self.log_new_comms()
        if self.verify and not op.get("mismatch"):
            checks.append(("%s on %s" % (func, op["comm"]), _Bytes(t), want))

    def p2p(self, op, keep, checks):
        pg, _ = self.comms[op["comm"]]
        parts = op["parts"]
        tensors = []
        for part in parts:
            count = part["count"]
            if part["send"]:
                t = torch.frombuffer(rd.pattern(rd.seq5(rd.base(self.rank)), count))
            else:
                t = torch.empty(count)
                if self.verify:
                    checks.append(("recv from %d" % part["peer"], _Bytes(t),
                                   (lambda c=count, p=part["peer"]: rd.pattern(rd.seq5(rd.base(p)), c))))
            tensors.append(t)
        keep.extend(tensors)
        if len(parts) == 1:
            part = parts[0]
            if part["send"]:
                dist.send(tensors[0], dst=part["peer"], group=pg)
            else:
                dist.recv(tensors[0], src=part["peer"], group=pg)
        else:
            ops = [dist.P2POp(dist.isend if part["send"] else dist.irecv, t, part["peer"], group=pg)
                   for part, t in zip(parts, tensors)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        if self.unlogged:
            self.log_new_comms()

    def synchronize(self):
        torch.cuda.synchronize()


class _Bytes:
    """The `.raw` view `Rank.run_step` compares (a tensor's contents after the step)."""

    def __init__(self, t):
        self.t = t

    @property
    def raw(self):
        return self.t.tobytes()
