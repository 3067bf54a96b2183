"""Unit tests of the CommInsight Python inject (preload/python) against the fake torch.

Each test runs a fresh interpreter (the inject patches modules process-wide) with a stand-in of
the preload's ABI and of NCCL (`fakes.py`), and checks what the inject announced and which
announcement was current when each communicator was made. Run: `python3 -m unittest discover -s
tests/testbed/python/tests` (the Rust test `tests/testbed/tests/inject.rs` does).
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_TORCH = os.path.normpath(os.path.join(HERE, "..", "fake_torch"))
PRELOAD_PY = os.environ.get("COMMINSIGHT_PRELOAD_PYTHON") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "..", "preload", "python"))

PRELUDE = """
import json, sys
sys.path[:0] = [%r, %r, %r]
from fakes import FakeAbi, FakeNccl, FakeStore
abi = FakeAbi()
import comminsight_inject
assert comminsight_inject.install(abi=abi)
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
nccl = FakeNccl(abi)
c10d._world.nccl = nccl
""" % (PRELOAD_PY, FAKE_TORCH, HERE)

OUT = """
def out(**kw):
    import json
    print("RESULT " + json.dumps(kw))
"""

# tp=2 x dp=4 x pp=2, Megatron order (tp fastest, then dp, then pp): 16 ranks.
MEGATRON_GROUPS = """
def rank_of(t, d, p):
    return t + 2 * (d + 4 * p)
GROUPS = {
    "DATA_PARALLEL_GROUP": [[rank_of(t, d, p) for d in range(4)] for p in range(2) for t in range(2)],
    "TENSOR_MODEL_PARALLEL_GROUP": [[rank_of(t, d, p) for t in range(2)] for p in range(2) for d in range(4)],
    "PIPELINE_MODEL_PARALLEL_GROUP": [[rank_of(t, d, p) for p in range(2)] for d in range(4) for t in range(2)],
}
def make_groups(me):
    mine = {}
    for desc, groups in GROUPS.items():
        for ranks in groups:
            pg = dist.new_group(ranks=ranks, group_desc=desc)
            if me in ranks:
                mine[desc] = pg
            else:
                assert pg is dist.GroupMember.NON_GROUP_MEMBER
    return mine
"""


def run_child(body, env=None, prelude=True, groups=False):
    code = OUT + (PRELUDE if prelude else "") + (MEGATRON_GROUPS if groups else "") + textwrap.dedent(body)
    e = dict(os.environ)
    for k in ("PYTHONPATH", "COMMINSIGHT_INJECT", "COMMINSIGHT_DISABLE", "COMMINSIGHT_DEBUG", "PYTHONSTARTUP"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=60)
    if p.returncode != 0:
        raise AssertionError("child failed (%d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), p
    return None, p


class MegatronGroups(unittest.TestCase):
    def test_lazy_groups_are_announced_and_bound_by_their_first_collective(self):
        r, _ = run_child(groups=True, body="""
            dist.init_process_group("nccl", store=FakeStore(), world_size=16, rank=5)
            mine = make_groups(5)
            announced_before_ops = list(abi.announced)
            made_before_ops = list(nccl.made)
            order = ["DATA_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP", "PIPELINE_MODEL_PARALLEL_GROUP"]
            ids = {d: comminsight_inject.group_id(mine[d]) for d in order}
            t = torch.empty(4)
            for d in order:
                dist.all_reduce(t, group=mine[d])
            dist.all_reduce(t)  # the default group, group=None
            events_after_bind = len(abi.events)
            for d in order:
                dist.all_reduce(t, group=mine[d])
            dist.barrier()
            out(announced=announced_before_ops, made_before=made_before_ops, made=nccl.made, ids=ids,
                extra_events=len(abi.events) - events_after_bind, ops=nccl.ops, pending=len(comminsight_inject._pending),
                names={d: mine[d].group_name for d in order})
        """)
        a = r["announced"]
        self.assertEqual(a[0], {"role": None, "desc": "default_pg", "name": "0", "ranks": list(range(16)), "my_rank": 5})
        # rank 5 = tp1, dp2, pp0
        want = [("DATA_PARALLEL_GROUP", [1, 3, 5, 7]), ("TENSOR_MODEL_PARALLEL_GROUP", [4, 5]),
                ("PIPELINE_MODEL_PARALLEL_GROUP", [5, 13])]
        self.assertEqual([(x["desc"], x["ranks"]) for x in a[1:]], want)
        self.assertTrue(all(x["my_rank"] == 5 and x["role"] is None for x in a))
        # torch's names: a counter every new_group call bumps on every rank, members or not
        self.assertEqual(r["names"], {"DATA_PARALLEL_GROUP": "2", "TENSOR_MODEL_PARALLEL_GROUP": "7",
                                      "PIPELINE_MODEL_PARALLEL_GROUP": "18"})
        self.assertEqual([x["name"] for x in a[1:]], ["2", "7", "18"])
        self.assertEqual(r["made_before"], [], "lazy: no communicator before the first collective")
        ids = r["ids"]
        self.assertEqual([m["current"] for m in r["made"]],
                         [ids["DATA_PARALLEL_GROUP"], ids["TENSOR_MODEL_PARALLEL_GROUP"],
                          ids["PIPELINE_MODEL_PARALLEL_GROUP"], 0])
        self.assertEqual([m["nranks"] for m in r["made"]], [4, 2, 2, 16])
        self.assertEqual(r["extra_events"], 0, "bound groups cost no ABI call")
        self.assertEqual(r["pending"], 0)
        self.assertTrue(all(op[2] == -1 for op in r["ops"][4:]), "current group cleared after each call")

    def test_eager_split_makes_comms_inside_creation_and_nocolor_for_non_members(self):
        r, _ = run_child(groups=True, body="""
            dist.init_process_group("nccl", store=FakeStore(), world_size=16, rank=10,
                                    device_id=torch.device("cuda", 2))
            made_at_init = list(nccl.made)
            mine = make_groups(10)
            ids = {d: comminsight_inject.group_id(pg) for d, pg in mine.items()}
            events = len(abi.events)
            t = torch.empty(4)
            for pg in mine.values():
                dist.all_reduce(t, group=pg)
            out(made_at_init=made_at_init, made=nccl.made, ids=ids, events_after=len(abi.events) - events,
                announced=abi.announced, pending=len(comminsight_inject._pending))
        """)
        self.assertEqual(r["made_at_init"], [{"how": "init", "nranks": 16, "rank": 10, "current": 0}])
        made = r["made"][1:]
        splits = [m for m in made if m["how"] == "split"]
        nocolor = [m for m in made if m["how"] == "nocolor"]
        self.assertEqual(len(splits), 3)
        self.assertEqual(len(nocolor), 4 + 8 + 8 - 3)
        self.assertTrue(all(m["current"] == -1 for m in nocolor), "non-members: nothing announced")
        self.assertEqual(sorted(m["current"] for m in splits), sorted(r["ids"].values()))
        self.assertEqual(len(r["announced"]), 4)
        self.assertEqual(r["events_after"], 0, "eager comms are bound at creation")
        self.assertEqual(r["pending"], 0)


class P2pAndOthers(unittest.TestCase):
    def test_batch_isend_irecv_binds_the_group_of_its_first_op_and_send_recv_bind_theirs(self):
        r, _ = run_child(groups=True, body="""
            dist.init_process_group("nccl", store=FakeStore(), world_size=16, rank=5)
            mine = make_groups(5)
            pp = mine["PIPELINE_MODEL_PARALLEL_GROUP"]
            tp = mine["TENSOR_MODEL_PARALLEL_GROUP"]
            a, b = torch.empty(8), torch.empty(8)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, 13, group=pp),
                                           dist.P2POp(dist.irecv, b, 13, group=pp)])
            for q in reqs:
                q.wait()
            dist.send(a, 4, tp)
            c = torch.empty(2)
            dist.all_gather([torch.empty(2), torch.empty(2)], c, group=tp)
            dist.reduce_scatter(c, [torch.empty(2), torch.empty(2)], group=tp)
            dist.all_to_all([torch.empty(1), torch.empty(1)], [torch.empty(1), torch.empty(1)], group=tp)
            dist.broadcast(c, src=4, group=tp)
            dist.reduce(c, dst=4, group=tp)
            dist.barrier(group=tp)
            out(ops=[o[0] for o in nccl.ops], made=nccl.made, pp=comminsight_inject.group_id(pp), tp=comminsight_inject.group_id(tp),
                pending=sorted(comminsight_inject._pending.values()))
        """)
        self.assertEqual([m["current"] for m in r["made"]], [r["pp"], r["tp"]])
        self.assertEqual(r["ops"], ["send", "recv", "send", "all_gather", "reduce_scatter", "all_to_all",
                                    "broadcast", "reduce", "all_reduce"])
        self.assertNotIn(r["pp"], r["pending"])
        self.assertNotIn(r["tp"], r["pending"])


class DeviceMeshGroups(unittest.TestCase):
    def test_mesh_dims_are_announced_with_their_names(self):
        for eager in (False, True):
            with self.subTest(eager=eager):
                r, _ = run_child("""
                    kw = {"device_id": torch.device("cuda", 0)} if %s else {}
                    dist.init_process_group("nccl", store=FakeStore(), world_size=16, rank=6, **kw)
                    mesh = dist.init_device_mesh("cuda", (2, 4, 2), mesh_dim_names=("pp", "dp", "tp"))
                    groups = {n: mesh.get_group(n) for n in ("pp", "dp", "tp")}
                    t = torch.empty(2)
                    for n, g in groups.items():
                        dist.all_reduce(t, group=g)
                    out(announced=abi.announced[1:], names={n: g.group_name for n, g in groups.items()},
                        ids={n: comminsight_inject.group_id(g) for n, g in groups.items()},
                        made=[m for m in nccl.made if m["how"] != "nocolor"][1 if %s else 0:])
                """ % (eager, eager))
                a = r["announced"]
                # rank 6 = pp0, dp3, tp0 in a (pp, dp, tp) row-major mesh
                self.assertEqual([(x["desc"], x["ranks"]) for x in a],
                                 [("mesh_pp", [6, 14]), ("mesh_dp", [0, 2, 4, 6]), ("mesh_tp", [6, 7])])
                self.assertEqual([x["name"] for x in a], [r["names"][n] for n in ("pp", "dp", "tp")])
                self.assertEqual([m["current"] for m in r["made"]], [r["ids"][n] for n in ("pp", "dp", "tp")])

    def test_split_group_of_a_subgroup_announces_global_ranks_and_the_hashed_name(self):
        r, _ = run_child("""
            dist.init_process_group("nccl", store=FakeStore(), world_size=8, rank=5,
                                    device_id=torch.device("cuda", 0))
            parent = dist.new_group([4, 5, 6, 7], group_desc="DATA_PARALLEL_GROUP")
            g = dist.split_group(parent_pg=parent, split_ranks=[[0, 1], [2, 3]])
            out(announced=abi.announced[-1], name=g.group_name, torch_desc=g.group_desc,
                ranks=dist.get_process_group_ranks(g), id=comminsight_inject.group_id(g),
                current=nccl.made[-1]["current"])
        """)
        a = r["announced"]
        self.assertEqual(r["ranks"], [4, 5])
        self.assertEqual((a["desc"], a["ranks"], a["my_rank"], a["name"]), ("undefined", [4, 5], 5, r["name"]))
        self.assertEqual(len(r["name"]), 40, "recent torch hashes split group names")
        self.assertTrue(r["torch_desc"].startswith("DATA_PARALLEL_GROUP:split:"), r["torch_desc"])
        self.assertEqual(r["current"], r["id"])

    def test_undefined_descriptions_inside_a_mesh_become_mesh_dims(self):
        # Older torch made mesh groups with new_group(ranks) and no description.
        r, _ = run_child("""
            import torch.distributed.device_mesh as dm
            orig = c10d.new_group
            def new_group_without_desc(ranks=None, timeout=None, backend=None, pg_options=None,
                                       use_local_synchronization=False, group_desc=None, device_id=None):
                return orig(ranks=ranks)
            dm.c10d = type("C", (), {"new_group": staticmethod(new_group_without_desc),
                                      "_get_default_group": staticmethod(c10d._get_default_group),
                                      "split_group": staticmethod(c10d.split_group),
                                      "get_rank": staticmethod(c10d.get_rank)})
            dist.init_process_group("nccl", store=FakeStore(), world_size=8, rank=3)
            dist.init_device_mesh("cuda", (4, 2), mesh_dim_names=("dp", "tp"))
            dist.new_group([0, 1, 2, 3])
            out(announced=abi.announced[1:])
        """)
        self.assertEqual([(x["desc"], x["ranks"]) for x in r["announced"]],
                         [("mesh_dp", [1, 3, 5, 7]), ("mesh_tp", [2, 3]), ("undefined", [0, 1, 2, 3])])


class InstallBehaviour(unittest.TestCase):
    def test_patching_after_import_and_wrappers_keep_names_and_signatures(self):
        r, _ = run_child("""
            import inspect, sys
            sys.path[:0] = [%r, %r, %r]
            import torch.distributed as dist
            from torch.distributed import distributed_c10d as c10d
            orig = dist.all_reduce
            from fakes import FakeAbi
            import comminsight_inject
            ok = comminsight_inject.install(abi=FakeAbi())
            again = comminsight_inject.install(abi=FakeAbi())
            out(ok=ok, again=again, same=dist.all_reduce is c10d.all_reduce,
                wrapped=dist.all_reduce.__wrapped__ is orig, name=dist.all_reduce.__name__,
                sig=str(inspect.signature(dist.all_reduce)) == str(inspect.signature(orig)),
                helper=hasattr(c10d._new_process_group_helper, "__wrapped__"),
                finders=sum(isinstance(f, comminsight_inject._Finder) for f in sys.meta_path))
        """ % (PRELOAD_PY, FAKE_TORCH, HERE), prelude=False)
        self.assertEqual(r, {"ok": True, "again": True, "same": True, "wrapped": True, "name": "all_reduce",
                             "sig": True, "helper": True, "finders": 1})

    def test_no_preload_means_no_op(self):
        r, _ = run_child("""
            import sys
            sys.path[:0] = [%r, %r]
            import comminsight_inject
            ok = comminsight_inject.install()
            import torch.distributed as dist
            out(ok=ok, patched=hasattr(dist.all_reduce, "__wrapped__"),
                finders=sum(type(f).__name__ == "_Finder" for f in sys.meta_path))
        """ % (PRELOAD_PY, FAKE_TORCH), prelude=False)
        self.assertEqual(r, {"ok": False, "patched": False, "finders": 0})

    def test_inject_0_and_disable_1_turn_install_off(self):
        for env in ({"COMMINSIGHT_INJECT": "0"}, {"COMMINSIGHT_DISABLE": "1"}):
            r, _ = run_child("""
                import sys
                sys.path[:0] = [%r]
                import comminsight_inject
                out(ok=comminsight_inject.install(), finders=len([f for f in sys.meta_path if type(f).__name__ == "_Finder"]))
            """ % PRELOAD_PY, env=env, prelude=False)
            self.assertEqual(r, {"ok": False, "finders": 0}, env)

    def test_no_torch_means_no_op(self):
        r, _ = run_child("""
            import sys
            sys.path[:0] = [%r, %r]
            from fakes import FakeAbi
            import comminsight_inject
            abi = FakeAbi()
            ok = comminsight_inject.install(abi=abi)
            try:
                import torch
                has_torch = True
            except ImportError:
                has_torch = False
            import json, collections
            out(ok=ok, has_torch=has_torch, calls=len(abi.events) + len(abi.announced))
        """ % (PRELOAD_PY, HERE), prelude=False)
        self.assertEqual(r, {"ok": True, "has_torch": False, "calls": 0})

    def test_a_rejected_announcement_leaves_torch_untouched(self):
        r, _ = run_child("""
            abi.announce = lambda *a: -1
            dist.init_process_group("nccl", store=FakeStore(), world_size=2, rank=1)
            g = dist.new_group([0, 1])
            dist.all_reduce(torch.empty(1), group=g)
            out(made=nccl.made, id=comminsight_inject.group_id(g), events=abi.events)
        """)
        self.assertEqual([m["current"] for m in r["made"]], [-1])
        self.assertIsNone(r["id"])
        self.assertEqual(r["events"], [])


class SiteCustomize(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="cit-sitecustomize-")
        self.other = os.path.join(self.tmp.name, "other")
        os.makedirs(self.other)
        with open(os.path.join(self.other, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'ran'\n")

    def tearDown(self):
        self.tmp.cleanup()

    def start(self, extra_env, path=None):
        code = ("import os, sys; print('RESULT ' + __import__('json').dumps({'chained': os.environ.get('CHAINED_SITECUSTOMIZE'),"
                " 'inject': 'comminsight_inject' in sys.modules,"
                " 'ours': getattr(sys.modules.get('sitecustomize'), '__file__', '').startswith(%r)}))" % PRELOAD_PY)
        env = {"PYTHONPATH": path or os.pathsep.join([PRELOAD_PY, self.other])}
        env.update(extra_env)
        return run_child(code, env=env, prelude=False)

    def test_chains_to_the_next_sitecustomize(self):
        r, p = self.start({})
        self.assertEqual(r, {"chained": "ran", "inject": True, "ours": True})
        self.assertEqual(p.stderr, "")

    def test_inject_0_disables_the_inject_but_still_chains(self):
        r, _ = self.start({"COMMINSIGHT_INJECT": "0"})
        self.assertEqual(r, {"chained": "ran", "inject": False, "ours": True})

    def test_a_broken_inject_never_breaks_startup(self):
        broken = os.path.join(self.tmp.name, "broken", "comminsight_inject")
        os.makedirs(broken)
        with open(os.path.join(broken, "__init__.py"), "w") as f:
            f.write("raise RuntimeError('boom')\n")
        shadow = os.path.join(self.tmp.name, "shadow")
        os.makedirs(shadow)
        with open(os.path.join(PRELOAD_PY, "sitecustomize.py")) as src, \
                open(os.path.join(shadow, "sitecustomize.py"), "w") as dst:
            dst.write(src.read())
        path = os.pathsep.join([shadow, os.path.dirname(broken), self.other])
        r, p = self.start({}, path=path)
        self.assertEqual(r["chained"], "ran")
        self.assertEqual(p.stderr, "")
        r, p = self.start({"COMMINSIGHT_DEBUG": "1"}, path=path)
        self.assertEqual(r["chained"], "ran")
        self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
        self.assertIn("boom", p.stderr)


if __name__ == "__main__":
    unittest.main()
