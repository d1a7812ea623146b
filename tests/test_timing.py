"""The timing engine's loop structure, driven by a fake backend whose clock is the
number of ops issued (1 us each): how many ops each mark brackets, per mode."""

import pytest

from ncclbench.timing import ALIGN_OPS, TimingMode, TimingSettings, measure

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

    def capture(self, loop):
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


def test_graph_without_per_iter_uses_two_marks():
    t, b = run(TimingSettings(iters=4, mode=TimingMode.GRAPH, graph_replays=5))
    assert t.device_s == pytest.approx(1e-6) and t.per_iter_s == [] and b.made == 2


def test_blocking_waits_after_every_op_and_plain_eager_only_at_the_ends():
    _, b = run(TimingSettings(iters=4, agg=2, mode=TimingMode.BLOCKING))
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


def test_no_group_for_single_ops_nor_for_blocking():
    _, _, log = run_grouped(TimingSettings(iters=3, agg=1))
    assert log == []
    _, b, log = run_grouped(TimingSettings(iters=3, agg=2, mode=TimingMode.BLOCKING))
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
    from ncclbench.timing import per_iter_summary

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
