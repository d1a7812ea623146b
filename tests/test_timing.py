"""The timing engine's loop structure, driven by a fake backend whose clock is the
number of ops issued (1 us each): how many ops each mark brackets, per mode; and what a
row's time and bandwidth columns are made of."""

import pytest

from ncclbench.engine.timing import ALIGN_OPS, TimingMode, TimingSettings, measure

UNTIMED = 1 + ALIGN_OPS  # the op before the barrier, then the aligning ops after it


class CountingBackend:
    """A 'device' that advances 1 us per op; marks read that clock."""

    def __init__(self):
        self.ops = 0
        self.made = 0

    def markers(self, n):
        self.made += n
        return [None] * n

    def mark(self, marker):
        return self.ops

    def elapsed(self, start, end):
        return (end - start) * 1e-6

    def synchronize(self):
        self.syncs = getattr(self, "syncs", 0) + 1

    def barrier(self):
        pass

    def capture(self, loop, empty_ok=False):
        return loop  # replaying the "graph" issues the captured ops again


def run(settings):
    b = CountingBackend()

    def op(_k):
        b.ops += 1
    return measure(b, op, settings), b


def test_eager_per_op_time_and_per_iteration_samples():
    t, b = run(TimingSettings(iters=5, agg=3, per_iter=True))
    assert t.device_s == pytest.approx(1e-6)
    assert t.per_iter_s == [pytest.approx(1e-6)] * 5  # 3 ops per iteration, divided by agg
    assert b.made == 6


def test_graph_replays_give_one_per_iteration_sample_each():
    t, b = run(TimingSettings(iters=4, agg=2, mode=TimingMode.GRAPH, graph_replays=3, per_iter=True))
    assert t.device_s == pytest.approx(1e-6)
    assert len(t.per_iter_s) == 3 and all(v == pytest.approx(1e-6) for v in t.per_iter_s)
    assert b.made == 4


def test_without_per_iter_every_row_still_keeps_its_noise_samples():
    """Without -I: one sample per replay (per iteration) up to NOISE_SAMPLES, then per block."""
    t, b = run(TimingSettings(iters=4, mode=TimingMode.GRAPH, graph_replays=5))
    assert t.device_s == pytest.approx(1e-6) and len(t.per_iter_s) == 5 and b.made == 6
    t, b = run(TimingSettings(iters=250, agg=2))
    # blocks of 3 iterations: 83 full blocks and one of 1; each sample is its block's time per op
    assert len(t.per_iter_s) == 84 and b.made == 85
    assert all(v == pytest.approx(1e-6) for v in t.per_iter_s) and t.device_s == pytest.approx(1e-6)


def test_blocking_waits_after_every_op_and_plain_eager_only_at_the_ends():
    _, b = run(TimingSettings(iters=4, agg=2, mode=TimingMode.BLOCKING, blocking=2))
    blocking_syncs = b.syncs
    t, b = run(TimingSettings(iters=4, agg=1))
    assert blocking_syncs - b.syncs == 8  # one per timed op
    assert t.device_s == pytest.approx(1e-6) and b.ops == UNTIMED + 4  # the untimed ops, four timed


class RecordingGroup:
    """A stand-in for the backend's NCCL group: logs where groups open and close."""

    def __init__(self, backend, log):
        self.backend, self.log = backend, log

    def __enter__(self):
        self.log.append(("start", self.backend.ops))

    def __exit__(self, *exc):
        self.log.append(("end", self.backend.ops))
        return False


def run_grouped(settings):
    b, log = CountingBackend(), []

    def op(_k):
        b.ops += 1
    return measure(b, op, settings, lambda: RecordingGroup(b, log)), b, log


def test_agg_ops_of_each_iteration_are_issued_inside_one_group():
    t, b, log = run_grouped(TimingSettings(iters=3, agg=4))
    # the untimed ops first, then one group per iteration around exactly its 4 ops
    u = UNTIMED
    assert log == [("start", u), ("end", u + 4), ("start", u + 4), ("end", u + 8), ("start", u + 8), ("end", u + 12)]
    assert t.device_s == pytest.approx(1e-6)


@pytest.mark.parametrize("blocking", [1, 2])
def test_no_group_for_single_ops_nor_for_waits_after_each_op(blocking):
    _, _, log = run_grouped(TimingSettings(iters=3, agg=1))
    assert log == []
    _, b, log = run_grouped(TimingSettings(iters=3, agg=2, mode=TimingMode.BLOCKING, blocking=blocking))
    assert log == [] and b.ops == UNTIMED + 6


def test_graph_captures_the_groups_and_replays_once_untimed_before_timing():
    t, b, log = run_grouped(TimingSettings(iters=2, agg=3, mode=TimingMode.GRAPH, graph_replays=4))
    # the fake "graph" is the loop itself (capturing issues nothing): each replay runs its
    # 2 groups of 3 ops; one untimed warm replay, then the 4 timed ones
    assert [k for k, _ in log].count("start") == 2 * (1 + 4)
    # the first untimed op and the aligning ops before the capture; capturing issues nothing
    u = UNTIMED
    assert log[:4] == [("start", u), ("end", u + 3), ("start", u + 3), ("end", u + 6)]
    # ops: untimed + 6 in the warm replay + the aligning ops again + 4 x 6 timed
    assert b.ops == u + 6 + ALIGN_OPS + 24
    assert t.device_s == pytest.approx(1e-6)


class OrderBackend(CountingBackend):
    """Logs the order of what the engine does around the start mark."""

    def __init__(self):
        super().__init__()
        self.log = []

    def markers(self, n):
        self.log.append("markers")
        return super().markers(n)

    def barrier(self):
        self.log.append("barrier")

    def mark(self, marker):
        self.log.append("mark")
        return super().mark(marker)


@pytest.mark.parametrize("settings", [TimingSettings(iters=3, per_iter=True),
                                      TimingSettings(iters=3, mode=TimingMode.GRAPH, graph_replays=2, per_iter=True),
                                      TimingSettings(iters=3)])
def test_nothing_but_the_aligning_ops_between_the_last_barrier_and_the_start_mark(settings):
    """Making the marks (up to iters + 1 events with -I, ~0.1-0.5 ms of host time) after the
    ranks were lined up let them drift apart again: iteration 0 then read 50-200 us on 2 GPUs.
    And with one aligning op, the first or second timed op after it often stalled ~110 us."""
    b = OrderBackend()

    def op(_k):
        b.log.append("op")
        b.ops += 1
    measure(b, op, settings)
    last_barrier = len(b.log) - 1 - b.log[::-1].index("barrier")
    assert ALIGN_OPS >= 3
    assert b.log[last_barrier + 1:last_barrier + 2 + ALIGN_OPS] == ["op"] * ALIGN_OPS + ["mark"]
    assert b.log.index("markers") < last_barrier


def test_per_iteration_statistics_reproduce_the_reference_json():
    """Fed the per-process iteration times of a real nccl-tests -I -K 2 run, the summary
    gives that run's own min/max/avg/p50/p95/p99/stdev/cv for every cell (p50 is
    sorted[n / 2] there, not a nearest-rank median: the two differ on 48 samples)."""
    import json

    from conftest import REFERENCE
    from ncclbench.engine.timing import per_iter_summary

    doc = json.loads((REFERENCE / "h200-2gpu-nvswitch" / "all_reduce_np2_periter.json").read_text())
    checked = 0
    for result in doc["results"]:
        for key in ("out_of_place_per_iter", "in_place_per_iter"):
            ref = result[key]
            per_rank = [[t / 1e6 for t in times] for times in ref["per_process_max_times_us"]]
            ours = per_iter_summary(per_rank, ref["skipped_iterations"])
            for stat in ("min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us", "cv_pct"):
                assert ours[stat] == pytest.approx(ref[stat], abs=2e-6), (result["size"], key, stat)
            assert ours["times_us"] == pytest.approx(ref["times_us"], abs=2e-6)
            checked += 1
    assert checked == 2 * len(doc["results"]) >= 8


# ---- -z, nccl-tests 2.19.6's four modes ------------------------------------------------------
class CallLog(CountingBackend):
    """Logs every call the engine makes; a barrier costs BARRIER_US on the 'device' clock, as
    waiting for the slowest rank does on a real one."""

    BARRIER_US = 100

    def __init__(self):
        super().__init__()
        self.log = []

    def mark(self, marker):
        self.log.append("mark")
        return self.ops

    def synchronize(self):
        self.log.append("sync")

    def barrier(self):
        self.log.append("barrier")
        self.ops += self.BARRIER_US


def run_logged(settings):
    b = CallLog()

    def op(_k):
        b.log.append("op")
        b.ops += 1

    def group():
        return RecordingGroup(b, b.log)
    timing = measure(b, op, settings, group)
    first_mark = b.log.index("mark")
    return timing, b, b.log[first_mark:]


def test_z0_issues_the_ops_back_to_back_between_two_marks():
    t, _, timed = run_logged(TimingSettings(iters=3))
    assert timed == ["mark"] + ["op", "mark"] * 3 + ["sync"]  # a mark after each iteration: the row's noise
    assert t.device_s == pytest.approx(1e-6)


def test_z1_waits_and_holds_a_barrier_after_every_op_and_times_them():
    t, _, timed = run_logged(TimingSettings(iters=2, agg=2, mode=TimingMode.BLOCKING, blocking=1))
    assert timed == ["mark"] + (["op", "sync", "barrier"] * 2 + ["mark"]) * 2 + ["sync"]
    # the barriers' wait is inside the timed loop, as nccl-tests says of -z 1
    assert t.device_s == pytest.approx((1 + CallLog.BARRIER_US) * 1e-6)


def test_z2_waits_after_every_op_without_barrier():
    t, _, timed = run_logged(TimingSettings(iters=2, agg=2, mode=TimingMode.BLOCKING, blocking=2))
    assert timed == ["mark"] + (["op", "sync"] * 2 + ["mark"]) * 2 + ["sync"]
    assert t.device_s == pytest.approx(1e-6)


def test_z3_marks_each_grouped_iteration_and_leaves_its_barrier_untimed():
    t, b, timed = run_logged(TimingSettings(iters=3, agg=2, mode=TimingMode.BLOCKING, blocking=3, per_iter=True))
    one = ["mark", ("start", None), "op", "op", ("end", None), "sync", "mark", "barrier"]
    assert [e if isinstance(e, str) else (e[0], None) for e in timed] == one * 3 + ["sync"]
    assert b.made == 6  # a start and a stop mark per iteration
    assert t.device_s == pytest.approx(1e-6)  # the barriers (100 us each) are not in the time
    assert t.per_iter_s == [pytest.approx(1e-6)] * 3


def test_z3_without_per_iteration_columns_still_times_each_iteration_apart():
    t, b, _ = run_logged(TimingSettings(iters=4, mode=TimingMode.BLOCKING, blocking=3))
    assert b.made == 8 and t.per_iter_s == [pytest.approx(1e-6)] * 4 and t.device_s == pytest.approx(1e-6)


@pytest.mark.parametrize("mode,blocking", [(TimingMode.BLOCKING, 0), (TimingMode.EAGER, 2), (TimingMode.GRAPH, 3),
                                           (TimingMode.BLOCKING, 4)])
def test_a_blocking_value_must_match_the_mode(mode, blocking):
    with pytest.raises(ValueError):
        TimingSettings(mode=mode, blocking=blocking)


# ---- -C: the time column changes, the bandwidth does not --------------------------------------
def _row(report_cputime: bool, per_rank):
    from types import SimpleNamespace

    from ncclbench.dtypes import DTYPES
    from ncclbench.engine.plan import Plan
    from ncclbench.engine.rankrunner import RankRunner

    plan = Plan("all_reduce", min_bytes=1 << 20, max_bytes=1 << 20, report_cputime=report_cputime)
    runner = RankRunner(plan, SimpleNamespace(group_rank=0, group_size=2))
    layout = plan.layout(1 << 20, 4, 2)
    return runner.to_row(per_rank, layout, DTYPES["float"], "sum", -1)


def test_cputime_swaps_the_time_column_only():
    """Two ranks whose ops took 700 us on the device while the host issued them in 15 us
    (nccl-tests: getBw gets deltaSec, the printed time is cputimeSec under -C)."""
    per_rank = [[(700e-6, 15e-6, [], 0), (710e-6, 14e-6, [], 0)],
                [(720e-6, 17e-6, [], 0), (730e-6, 16e-6, [], 0)]]
    device, host = _row(False, per_rank), _row(True, per_rank)
    for d, h in zip((device.out_of_place, device.in_place), (host.out_of_place, host.in_place)):
        assert (h.algbw, h.busbw) == (d.algbw, d.busbw)
        assert h.device_us == d.device_us == d.time_us
    assert device.out_of_place.time_us == pytest.approx(710.0)
    assert host.out_of_place.time_us == pytest.approx(16.0)
    assert device.out_of_place.algbw == pytest.approx((1 << 20) / 710e-6 / 1e9)



class HoldingBackend(CountingBackend):
    """Logs the order of barrier, hold, ops and marks."""

    def __init__(self):
        super().__init__()
        self.log = []

    def barrier(self):
        self.log.append("barrier")

    def hold(self, seconds):
        self.log.append(f"hold {seconds}")

    def mark(self, marker):
        self.log.append("mark")
        return self.ops


def test_graph_replay_queued_behind_a_held_device_times_device_work_only():
    """queue_ahead_s: the device is held right after the last barrier, before the aligning
    ops, so the start mark and the replays are queued while it spins; without it, no hold."""
    for ahead, held in ((0.002, ["hold 0.002"]), (0.0, [])):
        b = HoldingBackend()

        def op(_k, b=b):
            b.ops += 1
            b.log.append("op")
        t = measure(b, op, TimingSettings(iters=2, mode=TimingMode.GRAPH, graph_replays=3, queue_ahead_s=ahead))
        last = len(b.log) - 1 - b.log[::-1].index("barrier")
        assert b.log[last:last + 1 + len(held) + ALIGN_OPS + 1] == ["barrier", *held, *["op"] * ALIGN_OPS, "mark"]
        assert t.device_s == pytest.approx(1e-6)
    eager = HoldingBackend()
    measure(eager, lambda _k: None, TimingSettings(iters=2, queue_ahead_s=0.002))
    assert not any(e.startswith("hold") for e in eager.log)   # eager timing never holds


def test_a_failed_capture_is_a_graph_capture_error_naming_the_cause():
    from ncclbench.errors import GraphCaptureError

    class Refusing(CountingBackend):
        rank = 0

        def capture(self, loop, empty_ok=False):
            raise RuntimeError("operation not permitted when stream is capturing")

    with pytest.raises(GraphCaptureError, match="CUDA graph capture failed: RuntimeError: operation not permitted"):
        measure(Refusing(), lambda _k: None, TimingSettings(iters=2, mode=TimingMode.GRAPH, graph_replays=1))


def test_an_op_of_0_bytes_asks_for_an_empty_graph_and_others_do_not():
    """all_gather of 8 B over 2 ranks moves 0 B (as in nccl-tests): torch warned "The CUDA
    Graph is empty" for every capture of it (640 lines in one tune run across 2 hosts)."""
    asked = []

    class Recording(CountingBackend):
        def capture(self, loop, empty_ok=False):
            asked.append(empty_ok)
            return loop

    for nothing in (True, False):
        measure(Recording(), lambda _k: None,
                TimingSettings(iters=2, mode=TimingMode.GRAPH, graph_replays=1, moves_nothing=nothing))
    assert asked == [True, False]
