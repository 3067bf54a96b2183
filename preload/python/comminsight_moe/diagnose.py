"""`Diagnose`: DeepXTrace's reporter API (`deepxtrace.diagnose.Diagnose`) writing into CommInsight.

A DeepXTrace user switches by changing the import (`from comminsight_moe.diagnose import Diagnose`).
Unlike DeepXTrace there is no collective at a diagnosis point (no gather, no gloo group: nothing
can deadlock): each rank copies its own stats to the host, writes one row per phase into its
CommInsight stream (`ep_stats` records through the plugin's `comminsight_ep_stats_push`), and
zeroes its stats; the agent assembles the rows of all ranks into windows and runs DeepXTrace's
detector (`comminsight-agent moe`). See ../README.md for the keys, ids and counters.
"""

import hashlib
import os
import struct
import sys
import threading
import time
import traceback
import uuid

from . import _sink, _tensors
from ._matrix import diagnose_matrix as _diagnose_matrix

SOURCES = {"deepep": 1, "mc2": 2}
DISPATCH, COMBINE = 0, 1
FLAG_HIERARCHICAL = 2
DEFAULT_SYNC_STEP = 580
DEFAULT_INTERVAL_S = 20
MAX_PENDING_WINDOWS = 8
# The namespace of instance ids (uuid5): a fixed, arbitrary UUID.
INSTANCE_NAMESPACE = uuid.UUID("5d0c3a52-6b1f-4e8e-9a57-c0a1d1e5e0b1")

_constructed = {}  # member ranks -> Diagnose objects made by this process
_constructed_lock = threading.Lock()


def _env_flag_on(name, default="1"):
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "off")


def _env_num(name, default, kind=int):
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return default
    try:
        return kind(v)
    except ValueError:
        return default


def group_ranks(group):
    """The global ranks of `group`'s members in group-rank order (torch.distributed when it
    knows the group; else a `ranks` attribute; else 0..size-1)."""
    try:
        import torch.distributed as dist

        return [int(r) for r in dist.get_process_group_ranks(group)]
    except Exception:  # noqa: BLE001 - no torch, no dist, or not a torch group
        pass
    ranks = getattr(group, "ranks", None)
    if callable(ranks):
        ranks = ranks()
    if ranks is not None:
        return [int(r) for r in ranks]
    return list(range(int(group.size())))


def ep_group_id(ranks):
    """A u64 every member derives alike: the first 8 bytes (little-endian) of
    sha256("comminsight-ep:" + comma-joined member global ranks)."""
    text = "comminsight-ep:" + ",".join(str(r) for r in ranks)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def instance_id(ranks, ordinal, variant="ll"):
    """uuid5 of the member ranks, the job (`COMMINSIGHT_JOB_ID` / `TORCHELASTIC_RUN_ID`), the
    elastic restart count, this process' count of reporters on the same members (`ordinal`) and
    the mode: the same on every member without a collective, as long as all ranks construct
    their reporters in the same order (DeepXTrace's constructor is collective, so they do)."""
    job = os.environ.get("COMMINSIGHT_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or ""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    name = "%s|%s|%s|%d|%s" % (",".join(str(r) for r in ranks), job, restart, ordinal, variant)
    return uuid.uuid5(INSTANCE_NAMESPACE, name)


class _Window:
    """One mode's (LL or normal) stats and window bookkeeping."""

    def __init__(self, kind, n, device, instance):
        self.stats = (_tensors.zeros(kind, n, device), _tensors.zeros(kind, n, device))
        self.instance = instance
        self.seq = 0
        self.calls = 0  # diagnose_*_sync calls so far
        self.in_window = 0  # of them, since the last window was written
        self.t_start = time.time_ns()


class Diagnose:
    """DeepXTrace's `Diagnose` (same constructor, methods and `DEEPEP_DIAGNOSE_*` variables), plus
    keywords of ours: `source` (`"deepep"`: DeepEP low-latency kernels, u64 SM cycles; `"mc2"`:
    Ascend MC2 `performance_info`, µs in the low 32 bits), `hierarchical` (MC2's 2 x 8 layered
    layout), `scale_ns_per_unit` (optional, e.g. 1e9 / SM clock), `device` (where the stats
    tensors live), `rank` / `ranks` (the EP rank and the members' global ranks, when `group` is
    not a torch.distributed group), `sink` (tests)."""

    def __init__(self, group, interval=DEFAULT_INTERVAL_S, enable_ll_diagnose=True,
                 enable_normal_diagnose=False, enable_async=False, *, source="deepep",
                 hierarchical=False, scale_ns_per_unit=None, device=None, rank=None, ranks=None,
                 sink=None):
        assert group is not None and group.size() != 0 and interval > 0
        if source not in SOURCES:
            raise ValueError("source must be one of %s" % sorted(SOURCES))
        self.group = group
        self.ep_size = int(group.size())
        self.rank = int(group.rank() if rank is None else rank)
        self.ranks = list(ranks) if ranks is not None else group_ranks(group)
        enabled = _env_flag_on("DEEPEP_DIAGNOSE_ENABLE")
        self.enable_ll = enable_ll_diagnose and enabled
        self.enable_normal = enable_normal_diagnose and enabled
        self.enable_async = enable_async
        self.interval = _env_num("DEEPEP_DIAGNOSE_INTERVAL", interval)
        self.warm_time = _env_num("DEEPEP_DIAGNOSE_WARMING_TIME", self.interval)
        self.step_round = _env_num("DEEPEP_DIAGNOSE_SYNC_STEP", DEFAULT_SYNC_STEP)
        self.thresholds = (_env_num("DEEPEP_DIAGNOSE_THRESHOLD_COL", 3.0, float),
                           _env_num("DEEPEP_DIAGNOSE_THRESHOLD_ROW", 3.0, float),
                           _env_num("DEEPEP_DIAGNOSE_THRESHOLD_POINT", 5.0, float))
        self.excluding_zeros = _env_num("DEEPEP_DIAGNOSE_EXCLUDING_ZEROS", 0)
        self.source = SOURCES[source]
        self.flags = FLAG_HIERARCHICAL if (hierarchical and source == "mc2") else 0
        self.scale_bits = 0
        if scale_ns_per_unit:
            self.scale_bits = struct.unpack("<I", struct.pack("<f", float(scale_ns_per_unit)))[0]
        self.group_id = ep_group_id(self.ranks)
        with _constructed_lock:
            key = tuple(self.ranks)
            ordinal = _constructed.get(key, 0)
            _constructed[key] = ordinal + 1
        self.instance_id = str(instance_id(self.ranks, ordinal))
        kind = _tensors.backend()
        self._kind = kind
        self._ll = _Window(kind, self.ep_size, device, instance_id(self.ranks, ordinal).bytes)
        self._normal = _Window(kind, self.ep_size, device,
                               instance_id(self.ranks, ordinal, "normal").bytes)
        self._sink = sink
        self._pending = []  # (head fields, values) waiting for the plugin
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.counters = {"windows": 0, "rows_pushed": 0, "records_pushed": 0,
                         "rows_retried": 0, "rows_dropped": 0, "records_dropped": 0,
                         "no_sink": 0, "skipped_capturing": 0, "errors": 0}
        self._reported = set()

    # -- DeepXTrace's API

    def get_instance_id(self):
        return self.instance_id

    def get_stats_ll_stats_tensor(self):
        """(dispatch, combine): 1-D int64 [N] vectors for DeepEP's `*_wait_recv_cost_stats` or
        MC2's `performance_info`."""
        return self._ll.stats

    def get_stats_normal_stats_tensor(self):
        return self._normal.stats

    def diagnose_ll_sync(self, diagnose_step=0):
        """Count a call; every `diagnose_step` (else `DEEPEP_DIAGNOSE_SYNC_STEP`) calls, write this
        rank's rows and zero the stats. None on other calls, [] on a diagnosis step (the analysis
        runs in the agent). Never raises."""
        assert not self.enable_async, "diagnose_ll_sync is not for async mode"
        return self._sync(self._ll, self.enable_ll, diagnose_step)

    def diagnose_normal_sync(self, diagnose_step=0):
        assert not self.enable_async, "diagnose_normal_sync is not for async mode"
        return self._sync(self._normal, self.enable_normal, diagnose_step)

    def start_async_diagnose(self):
        """A daemon thread writing each mode's rows at every `interval` boundary of the wall
        clock (window_seq = floor(t / interval), the same on every rank), after `warm_time`."""
        if not self.enable_async or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._async_loop, name="comminsight-moe",
                                        daemon=True)
        self._thread.start()

    def stop_async_diagnose(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, self.interval))
            self._thread = None

    @staticmethod
    def diagnose_matrix(mat, thres_col=3.0, thres_row=3.0, thres_point=5.0,
                        suppress_points_in_strong_rowscols=True, excluding_zeros=0):
        return _diagnose_matrix(mat, thres_col, thres_row, thres_point,
                                suppress_points_in_strong_rowscols, excluding_zeros)

    # -- ours

    def reporter_stats(self):
        """This reporter's counters (windows written, rows / records pushed, retried, dropped)."""
        with self._lock:
            return dict(self.counters, pending=len(self._pending))

    def flush(self):
        """Retry rows the plugin could not take yet (it was not running)."""
        self._guard(lambda: self._push_pending())

    # -- internals

    def _sync(self, w, enabled, diagnose_step):
        if not enabled:
            return None
        w.calls += 1
        w.in_window += 1
        step_round = diagnose_step or self.step_round
        if step_round <= 0 or w.calls % step_round != 0:
            return None
        self._guard(lambda: self._close(w, w.seq))
        w.seq += 1
        return []

    def _close(self, w, seq):
        """Copy and zero w's stats; queue and push its two rows as window `seq`. While a CUDA
        graph is being captured nothing is touched (a copy would break the capture): the next
        window then covers this one too."""
        if _tensors.capturing(self._kind):
            with self._lock:
                self.counters["skipped_capturing"] += 1
            return
        t_end = time.time_ns()
        steps, w.in_window = w.in_window, 0
        rows = []
        for phase, t in ((DISPATCH, w.stats[0]), (COMBINE, w.stats[1])):
            vals = _tensors.take(self._kind, t)
            if self.source == SOURCES["mc2"]:
                vals = [v & 0xFFFF_FFFF for v in vals]
            rows.append((self._head(w, seq, phase, steps, w.t_start, t_end), vals))
        w.t_start = t_end
        with self._lock:
            self.counters["windows"] += 1
            self._pending.extend(rows)
            over = len(self._pending) - 2 * MAX_PENDING_WINDOWS
            if over > 0:
                del self._pending[:over]
                self.counters["rows_dropped"] += over
        self._push_pending()

    def _head(self, w, seq, phase, steps, t_start, t_end):
        h = _sink.CiEpRow()
        h.size, h.version = _sink.ctypes.sizeof(_sink.CiEpRow), _sink.ABI_VERSION
        h.ep_group_id = self.group_id
        h.instance[:] = list(w.instance)
        h.window_seq, h.t_start_ns, h.t_end_ns = seq, t_start, max(t_end, t_start)
        h.steps = min(int(steps), 0xFFFF_FFFF)
        h.scale_bits = self.scale_bits
        h.rank, h.phase, h.source, h.ep_flags = self.rank, phase, self.source, self.flags
        return h

    def _push_pending(self):
        with self._lock:
            if self._sink is None:
                self._sink = _sink.find()
            if self._sink is None:
                self.counters["no_sink"] += 1
                self._report("no CommInsight plugin or preload in this process: rows kept "
                             "(at most %d windows)" % MAX_PENDING_WINDOWS)
                return
            while self._pending:
                head, vals = self._pending[0]
                r = self._sink.push(head, vals)
                if r == _sink.NOT_RUNNING:
                    self.counters["rows_retried"] += 1
                    return
                self._pending.pop(0)
                want = (len(vals) + 4) // 5
                if r < 0:
                    self.counters["rows_dropped"] += 1
                    self._report("the plugin refused a row (code %d)" % r)
                    continue
                self.counters["rows_pushed"] += 1
                self.counters["records_pushed"] += r
                if r < want:
                    self.counters["records_dropped"] += want - r

    def _async_loop(self):
        period = max(1, int(round(self.interval * 1e9)))
        warm_until = time.time_ns() + int(self.warm_time * 1e9)
        while not self._stop.is_set():
            now = time.time_ns()
            seq = now // period  # the window now running; it ends at (seq + 1) * period
            if self._stop.wait(((seq + 1) * period - now) / 1e9 + 0.001):
                return
            warm = seq * period < warm_until
            for w, on in ((self._ll, self.enable_ll), (self._normal, self.enable_normal)):
                if not on:
                    continue
                if warm:
                    self._guard(lambda w=w: self._discard(w))
                else:
                    self._guard(lambda w=w, s=seq: self._close(w, s))

    def _discard(self, w):
        for t in w.stats:
            _tensors.take(self._kind, t)
        w.t_start = time.time_ns()

    def _guard(self, f):
        try:
            f()
        except Exception as e:  # noqa: BLE001 - never into the training loop
            with self._lock:
                self.counters["errors"] += 1
            self._report("error: %s: %s" % (type(e).__name__, e))
            if os.environ.get("COMMINSIGHT_DEBUG") == "1":
                traceback.print_exc(file=sys.stderr)

    def _report(self, what):
        """One stderr line per kind of trouble (all of them with COMMINSIGHT_DEBUG=1)."""
        key = what.split(":")[0]
        if key in self._reported and os.environ.get("COMMINSIGHT_DEBUG") != "1":
            return
        self._reported.add(key)
        try:
            sys.stderr.write("comminsight_moe: rank %d: %s\n" % (self.rank, what))
        except Exception:  # noqa: BLE001
            pass
