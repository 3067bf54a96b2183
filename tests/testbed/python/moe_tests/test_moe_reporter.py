"""The MoE reporter (`preload/python/comminsight_moe`) without torch: numpy stats, a recording
sink, the real plugin's entry point when COMMINSIGHT_LIB_DIR is set, and DeepXTrace's detector
against the spec's scenarios S1-S11 (../shared/research/deepxtrace-spec.md §5.6)."""

import contextlib
import ctypes
import io
import os
import sys
import time
import unittest

sys.path.insert(0, os.environ["COMMINSIGHT_PRELOAD_PYTHON"])

import numpy as np  # noqa: E402

from comminsight_moe import Diagnose, diagnose_matrix  # noqa: E402
from comminsight_moe import _sink, diagnose as dmod  # noqa: E402


def base(n):
    return np.array([[100 * (100 + ((3 * i + 5 * j) % 11)) for j in range(n)] for i in range(n)],
                    dtype=np.int64)


def r3(x):
    return round(x, 3)


def hier16():
    m = np.zeros((16, 16), dtype=np.int64)
    b = base(16)
    for i in range(16):
        for j in range(16):
            if i // 8 == j // 8:
                m[i, j] = b[i, j]
            elif i % 8 == j % 8:
                m[i, j] = 4 * b[i, j]
    return m


class DetectorScenarios(unittest.TestCase):
    def test_s1_base_only_flags_nothing(self):
        d = diagnose_matrix(base(16))
        self.assertEqual(d, {"abnormal_cols": [], "abnormal_rows": [], "abnormal_points": []})

    def test_s2_late_sender_is_a_column(self):
        m = base(16)
        for i in range(16):
            if i != 2:
                m[i, 2] += 10_000_000
        d = Diagnose.diagnose_matrix(m)
        self.assertEqual([c[0] for c in d["abnormal_cols"]], [2])
        self.assertEqual(r3(d["abnormal_cols"][0][2]), 15.736)
        self.assertEqual((d["abnormal_rows"], d["abnormal_points"]), ([], []))

    def test_s3_waiting_receiver_is_a_row(self):
        m = base(16)
        for j in range(16):
            if j != 5:
                m[5, j] += 500_000
        d = diagnose_matrix(m)
        self.assertEqual([[r[0], r3(r[2])] for r in d["abnormal_rows"]], [[5, 12.043]])
        self.assertEqual((d["abnormal_cols"], d["abnormal_points"]), ([], []))

    def test_s4_slow_path_is_a_point_and_s5_a_severe_one_a_row_and_a_column(self):
        m = base(16)
        m[3, 9] += 200_000
        d = diagnose_matrix(m)
        self.assertEqual([[p[0], p[1], r3(p[3])] for p in d["abnormal_points"]], [[3, 9, 18.704]])
        self.assertEqual((d["abnormal_cols"], d["abnormal_rows"]), ([], []))
        m = base(16)
        m[3, 9] += 2_000_000
        d = diagnose_matrix(m)
        self.assertEqual([[c[0], r3(c[2])] for c in d["abnormal_cols"]], [[9, 7.399]])
        self.assertEqual([[r[0], r3(r[2])] for r in d["abnormal_rows"]], [[3, 7.401]])
        self.assertEqual(d["abnormal_points"], [])
        d = diagnose_matrix(m, suppress_points_in_strong_rowscols=False)
        self.assertEqual([p[:2] for p in d["abnormal_points"]], [[3, 9]])

    def test_s6_three_of_eight_late_saturate_and_two_do_not(self):
        m = base(8)
        for i in range(8):
            for j in (1, 2, 3):
                if i != j:
                    m[i, j] += 10_000_000
        d = diagnose_matrix(m)
        self.assertEqual(d["abnormal_cols"], [])
        z = np.asarray(m, dtype=float).mean(axis=0) / (np.asarray(m, dtype=float).mean() + 1e-8)
        self.assertEqual(r3(z.max()), 2.661)
        m = base(8)
        for i in range(8):
            for j in (1, 2):
                if i != j:
                    m[i, j] += 10_000_000
        d = diagnose_matrix(m)
        self.assertEqual([[c[0], r3(c[2])] for c in d["abnormal_cols"]], [[1, 3.986], [2, 3.986]])

    def test_s7_hierarchical_zeros_make_false_points_unless_excluded(self):
        m = hier16()
        d = diagnose_matrix(m)
        pts = [(p[0], p[1]) for p in d["abnormal_points"]]
        self.assertEqual(pts, [(i, (i + 8) % 16) for i in range(16)])
        zs = [p[3] for p in d["abnormal_points"]]
        self.assertEqual((round(min(zs), 2), round(max(zs), 2)), (5.08, 5.59))
        self.assertEqual(diagnose_matrix(m, excluding_zeros=1)["abnormal_points"], [])

    def test_s8_hierarchical_late_sender_under_both_zero_settings(self):
        m = hier16()
        for i in list(range(1, 8)) + [8]:
            m[i, 0] += 10_000_000
        for ez in (0, 1):
            d = diagnose_matrix(m, excluding_zeros=ez)
            self.assertEqual([[c[0], r3(c[2])] for c in d["abnormal_cols"]], [[0, 15.631]])
            self.assertEqual((d["abnormal_rows"], d["abnormal_points"]), ([], []))

    def test_s9_three_ranks_cannot_flag_a_column_and_s10_zeros_give_nothing(self):
        m = base(3)
        m[1, 0] += 10_000_000
        m[2, 0] += 10_000_000
        self.assertEqual(diagnose_matrix(m)["abnormal_cols"], [])
        for ez in (0, 1):
            d = diagnose_matrix(np.zeros((16, 16), dtype=np.int64), excluding_zeros=ez)
            self.assertEqual(d, {"abnormal_cols": [], "abnormal_rows": [], "abnormal_points": []})


class Group:
    def __init__(self, rank, ranks):
        self._rank, self.ranks = rank, ranks

    def size(self):
        return len(self.ranks)

    def rank(self):
        return self._rank


class Sink:
    """Records pushes; `code` forces a return value."""

    def __init__(self, code=None):
        self.rows, self.code = [], code

    def push(self, head, values):
        if self.code is not None:
            return self.code
        self.rows.append((head.window_seq, head.phase, head.rank, head.steps, head.source,
                          head.ep_flags, bytes(head.instance), head.ep_group_id,
                          (head.t_start_ns, head.t_end_ns), list(values)))
        return (len(values) + 4) // 5


class Reporter(unittest.TestCase):
    def setUp(self):
        for k in list(os.environ):
            if k.startswith("DEEPEP_DIAGNOSE_"):
                del os.environ[k]

    def test_sync_mode_writes_both_phases_every_step_round_and_zeroes(self):
        sink = Sink()
        d = Diagnose(Group(3, list(range(10, 26))), sink=sink)
        disp, comb = d.get_stats_ll_stats_tensor()
        self.assertEqual((disp.dtype, disp.shape), (np.int64, (16,)))
        for call in range(1, 7):
            disp[call % 16] += 1000 * call
            comb[:] += 7
            r = d.diagnose_ll_sync(diagnose_step=3)
            self.assertEqual(r, [] if call % 3 == 0 else None)
        self.assertEqual(len(sink.rows), 4)
        (s0, p0, rk, steps, src, fl, inst, gid, (t0, t1), v0) = sink.rows[0]
        self.assertEqual((s0, p0, rk, steps, src, fl), (0, 0, 3, 3, 1, 0))
        self.assertEqual(v0[1:4], [1000, 2000, 3000])
        self.assertEqual(sink.rows[1][1], 1)
        self.assertEqual(sink.rows[1][-1], [21] * 16)
        self.assertEqual([r[0] for r in sink.rows], [0, 0, 1, 1])
        self.assertEqual(sink.rows[2][-1][4:7], [4000, 5000, 6000])
        self.assertLessEqual(t0, t1)
        self.assertEqual(sink.rows[2][8][0], t1)  # windows are contiguous
        self.assertEqual(int(disp.sum()) + int(comb.sum()), 0)
        self.assertEqual(inst, d.__dict__["_ll"].instance)
        self.assertEqual(gid, dmod.ep_group_id(list(range(10, 26))))
        self.assertEqual(d.reporter_stats()["rows_pushed"], 4)

    def test_ids_are_the_same_on_every_member_and_differ_between_groups(self):
        a = dmod.instance_id([0, 2, 4, 6], 0)
        self.assertEqual(a, dmod.instance_id([0, 2, 4, 6], 0))
        self.assertNotEqual(a, dmod.instance_id([0, 2, 4, 6], 1))
        self.assertNotEqual(a, dmod.instance_id([1, 3, 5, 7], 0))
        self.assertNotEqual(a, dmod.instance_id([0, 2, 4, 6], 0, "normal"))
        self.assertEqual(dmod.ep_group_id([0, 1]), dmod.ep_group_id([0, 1]))
        self.assertNotEqual(dmod.ep_group_id([0, 1]), dmod.ep_group_id([1, 0]))
        x = Diagnose(Group(0, [40, 41]), sink=Sink())
        y = Diagnose(Group(0, [40, 41]), sink=Sink())
        self.assertEqual(x.get_instance_id(), str(dmod.instance_id([40, 41], 0)))
        self.assertEqual(y.get_instance_id(), str(dmod.instance_id([40, 41], 1)))

    def test_env_step_and_enable_and_mc2_low_words(self):
        os.environ["DEEPEP_DIAGNOSE_SYNC_STEP"] = "2"
        sink = Sink()
        d = Diagnose(Group(1, [0, 1, 2, 3, 4, 5, 6, 7, 8]), source="mc2", hierarchical=True,
                     sink=sink)
        disp, comb = d.get_stats_ll_stats_tensor()
        disp[0] = -5  # S11: 0x...FFFF_FFFB in the low word: 4,294,967,291 µs, not -5
        comb[8] = (7 << 32) | 12
        d.diagnose_ll_sync()
        self.assertEqual(sink.rows, [])
        d.diagnose_ll_sync()
        self.assertEqual(sink.rows[0][-1][0], 4294967291)
        self.assertEqual(sink.rows[1][-1][8], 12)
        self.assertEqual((sink.rows[0][4], sink.rows[0][5]), (2, 2))
        os.environ["DEEPEP_DIAGNOSE_ENABLE"] = "Off"
        off = Diagnose(Group(0, [0, 1]), sink=sink)
        self.assertIsNone(off.diagnose_ll_sync(diagnose_step=1))

    def test_rows_wait_for_a_plugin_that_is_not_running_yet_bounded(self):
        sink = Sink(code=_sink.NOT_RUNNING)
        d = Diagnose(Group(0, [0, 1, 2]), sink=sink)
        for _ in range(dmod.MAX_PENDING_WINDOWS + 3):
            d.get_stats_ll_stats_tensor()[0][1] += 5
            d.diagnose_ll_sync(diagnose_step=1)
        st = d.reporter_stats()
        self.assertEqual(st["pending"], 2 * dmod.MAX_PENDING_WINDOWS)
        self.assertEqual(st["rows_dropped"], 6)
        sink.code = None
        d.flush()
        self.assertEqual(d.reporter_stats()["pending"], 0)
        self.assertEqual(len(sink.rows), 2 * dmod.MAX_PENDING_WINDOWS)
        self.assertEqual(sink.rows[0][0], 3)  # the oldest 3 windows were dropped

    def test_a_window_during_graph_capture_is_left_to_the_next(self):
        sink = Sink()
        d = Diagnose(Group(0, [0, 1]), sink=sink)
        disp, _ = d.get_stats_ll_stats_tensor()
        real = dmod._tensors.capturing
        try:
            dmod._tensors.capturing = lambda kind: True
            disp[1] += 5
            self.assertEqual(d.diagnose_ll_sync(diagnose_step=2), None)
            self.assertEqual(d.diagnose_ll_sync(diagnose_step=2), [])
        finally:
            dmod._tensors.capturing = real
        self.assertEqual((sink.rows, int(disp[1])), ([], 5))
        disp[1] += 1
        d.diagnose_ll_sync(diagnose_step=2)
        d.diagnose_ll_sync(diagnose_step=2)
        self.assertEqual([(r[0], r[3], r[-1]) for r in sink.rows[:1]], [(1, 4, [0, 6])])
        self.assertEqual(d.reporter_stats()["skipped_capturing"], 1)

    def test_a_failing_sink_never_raises_and_is_reported_once(self):
        class Boom:
            def push(self, head, values):
                raise RuntimeError("boom")

        d = Diagnose(Group(0, [0, 1]), sink=Boom())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            for _ in range(3):
                self.assertEqual(d.diagnose_ll_sync(diagnose_step=1), [])
        self.assertEqual(d.reporter_stats()["errors"], 3)
        self.assertEqual(err.getvalue().count("boom"), 1)

    def test_async_mode_writes_wall_clock_aligned_windows(self):
        sink = Sink()
        os.environ["DEEPEP_DIAGNOSE_WARMING_TIME"] = "0"
        d = Diagnose(Group(0, [0, 1]), interval=0.2, enable_async=True, sink=sink)
        d.start_async_diagnose()
        # The window running at the start is partial: discarded. Count in the next one.
        now = time.time_ns()
        time.sleep(((now // 200_000_000 + 1) * 200_000_000 - now) / 1e9 + 0.02)
        d.get_stats_ll_stats_tensor()[1][1] += 9
        deadline = time.time() + 5
        while len(sink.rows) < 4 and time.time() < deadline:
            time.sleep(0.02)
        d.stop_async_diagnose()
        self.assertGreaterEqual(len(sink.rows), 4)
        seqs = [r[0] for r in sink.rows]
        for seq, (_, _, _, _, _, _, _, _, (t0, t1), _) in zip(seqs, sink.rows):
            self.assertEqual(seq, t1 // 200_000_000 - 1)
            self.assertEqual(t0 // 200_000_000, seq)
        self.assertEqual(sum(sum(r[-1]) for r in sink.rows), 9)

    def test_the_plugin_path_is_found_in_proc_maps(self):
        text = ("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n"
                "7f20-7f30 r-xp 00000000 08:01 43 /opt/ci lib/libnccl-profiler-comminsight.so\n")
        self.assertEqual(_sink.plugin_path_in_maps(text), "/opt/ci lib/libnccl-profiler-comminsight.so")
        self.assertIsNone(_sink.plugin_path_in_maps("7f00-7f10 r-xp 0 0 0 [heap]\n"))


@unittest.skipUnless(os.environ.get("COMMINSIGHT_LIB_DIR"), "COMMINSIGHT_LIB_DIR not set")
class RealPlugin(unittest.TestCase):
    def test_the_plugin_entry_point_says_not_running_before_nccl_inits_it(self):
        path = os.path.join(os.environ["COMMINSIGHT_LIB_DIR"], "libnccl-profiler-comminsight.so")
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL)  # what NCCL does
        self.assertEqual(_sink.plugin_path_in_maps(open("/proc/self/maps").read()),
                         os.path.realpath(path))
        sink = _sink.find()
        self.assertIsNotNone(sink)
        self.assertEqual(os.path.realpath(sink.where), os.path.realpath(path))
        d = Diagnose(Group(0, [0, 1]))
        d.diagnose_ll_sync(diagnose_step=1)
        st = d.reporter_stats()
        self.assertEqual((st["rows_retried"], st["pending"], st["rows_pushed"]), (1, 2, 0))
        self.assertEqual(_sink.CSink(lib.comminsight_ep_stats_push, path).push(
            _sink.CiEpRow(), [1]), _sink.NOT_RUNNING)


if __name__ == "__main__":
    unittest.main()
