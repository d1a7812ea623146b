"""The one timing engine, shared by every collective and backend.

Per size and placement, as nccl-tests does: the device marks made, one untimed op, wait,
host barrier (plus ALIGN_OPS more untimed ops to line the ranks' streams up, and nothing
else before the start mark), then `iters` outer iterations of `agg` ops between two device
marks (CUDA events on the collective's stream, or the host clock for gloo), wait,
time / (iters * agg). With `graph_replays` the iters x agg loop is captured once and the
graph replayed that many times between the marks (after one untimed replay: a graph's
first launch also uploads it).
With `queue_ahead_s` (tune sets it for graph replay), the device is held busy that long
right after the host barrier, before the aligning ops: every rank's host then queues the
aligning ops, the start mark and the replays while its GPU still spins, the aligning ops
line the GPUs up, and the timed region holds device work only: no rank's host lateness
after the barrier (the gloo barrier releases ranks up to ~300 us apart) and no launch gap
of a replay. Without it (the default, as nccl-tests) the start mark follows the host.
Per-iteration marks (-I) bracket each outer iteration, or each graph replay with -G. Without
-I the loop is still marked every `block` iterations (1 up to NOISE_SAMPLES iterations), so
that every row carries the spread of its timed iterations (noise_summary) at the cost of one
device mark (a CUDA event record, ~1-2 us of host time; a clock read on gloo) per sample.
With `agg` > 1 each iteration's ops go in one group (`group()`, the backend's NCCL group),
as nccl-tests wraps them in ncclGroupStart/End.

-z (`blocking`), nccl-tests 2.19.6's four modes: 0 ops issued back to back; 1 wait for each
op, then a host barrier; 2 wait for each op, no barrier; 3 each outer iteration (its `agg`
ops, grouped) between its own pair of marks, then a wait, the stop mark, and a barrier
outside the marks, so the time excludes the barriers. Modes 1 and 2 time the whole loop,
waits (and barriers) included, and group nothing: a wait inside an open NCCL group would
find nothing launched yet."""

from __future__ import annotations

import contextlib
import enum
import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, ContextManager

from ncclbench.engine.position import HERE, TIMED
from ncclbench.errors import GraphCaptureError, PlanError, first_line
from ncclbench.failpoints import armed, failpoint, stamp


# Untimed ops between the host barrier and the start mark: one lines the GPUs up, the others
# keep a stall of the first ops after it out of the timed loop (docs/design/align-ops.md).
ALIGN_OPS = 4

# Samples of the timed loop kept per (size, placement) without -I: iterations are marked in
# blocks when there are more (each sample then the block's time per op).
NOISE_SAMPLES = 100


class TimingMode(str, enum.Enum):
    EAGER = "eager"        # ops launched one by one from the host
    GRAPH = "graph"        # CUDA graph replay (-G)
    BLOCKING = "blocking"  # -z 1, 2 or 3: waits (and barriers) inside the timed loop


@dataclass(frozen=True)
class TimingSettings:
    iters: int = 20
    agg: int = 1
    mode: TimingMode = TimingMode.EAGER
    graph_replays: int = 0
    per_iter: bool = False
    blocking: int = 0      # nccl-tests' -z value (1, 2 or 3 exactly when mode is BLOCKING)
    queue_ahead_s: float = 0.0  # graph mode: hold the device this long before the aligning ops
    moves_nothing: bool = False  # the op moves 0 B (e.g. all_gather of 8 B over 4 ranks): its graph is rightly empty

    def __post_init__(self):
        if (self.mode is TimingMode.BLOCKING) != (self.blocking in (1, 2, 3)):
            raise ValueError(f"-z {self.blocking} does not go with timing mode {self.mode.value}")


@dataclass
class Timing:
    """One rank's measurement of one (size, placement)."""

    device_s: float                 # per op
    host_s: float                   # host time per op spent issuing (launch cost, -C)
    per_iter_s: list[float] = field(default_factory=list)  # per outer iteration (or block of them), per op


def measure(backend, run_op: Callable[[int], None], settings: TimingSettings,
            group: Callable[[], ContextManager] | None = None) -> Timing:
    """Time `run_op(op_index)` on `backend`, with Python's garbage collector paused (as
    timeit does): a collection inside a host-bound loop of 10 us ops shows as a spike.
    `group()` opens a group around each iteration's `agg` ops (None: ops one by one)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        timing = _measure(backend, run_op, settings, group)
    finally:
        if collecting:
            gc.enable()
    slow = failpoint("timing.device_time_factor", 1.0)
    if slow != 1.0:
        timing = Timing(timing.device_s * slow, timing.host_s, [v * slow for v in timing.per_iter_s])
    return timing


def _measure(backend, run_op: Callable[[int], None], settings: TimingSettings, group) -> Timing:
    agg = settings.agg
    steps = max(settings.graph_replays, 1) if settings.mode is TimingMode.GRAPH else settings.iters
    paired = settings.blocking == 3
    # The marks are made before the ranks line up: making them (creating and first-recording
    # up to steps + 1 events, 0.1-0.5 ms with -I) between the aligning ops and the start mark
    # let the ranks drift apart again, and one rank's first timed op waited for the others.
    block = 1 if settings.per_iter else -(-steps // NOISE_SAMPLES)
    pool = backend.markers(2 * steps if paired else -(-steps // block) + 1)
    HERE.at("its first (untimed) op")
    run_op(0)
    backend.synchronize()
    _line_up(backend, run_op)

    if agg == 1 and settings.mode is TimingMode.EAGER:
        step = run_op  # the common case without a wrapper call per op (eager host cost)
    elif settings.blocking in (1, 2):
        with_barrier = settings.blocking == 1

        def step(it):
            for a in range(agg):
                run_op(it * agg + a)
                backend.synchronize()
                if with_barrier:
                    backend.barrier()
    else:
        open_group = group if group is not None and agg > 1 else contextlib.nullcontext

        def step(it):
            with open_group():
                for a in range(agg):
                    run_op(it * agg + a)

    if settings.mode is TimingMode.GRAPH:
        def loop():
            for it in range(settings.iters):
                step(it)

        replay = capture(backend, loop, settings.moves_nothing)
        replay()  # untimed: the first launch of a graph includes its upload to the device
        backend.synchronize()
        _line_up(backend, run_op, settings.queue_ahead_s)
        # -I with graphs: one sample per replay (each replays the iters x agg ops)
        return _marked_loop(backend, pool, steps, lambda _k: replay(), settings.iters * agg, block)
    if paired:
        return _paired_loop(backend, pool, steps, step, agg)
    return _marked_loop(backend, pool, steps, step, agg, block)


def capture(backend, issue_ops, empty_ok: bool = False):
    """backend.capture(issue_ops), a failure raised as GraphCaptureError (its text kept).
    `empty_ok`: the ops move nothing, so an empty graph is what they make."""
    try:
        failpoint("timing.capture", rank=getattr(backend, "rank", None))
        return backend.capture(issue_ops, empty_ok)
    except (KeyboardInterrupt, SystemExit, PlanError):
        raise
    except Exception as exc:  # noqa: BLE001 - CUDA's or NCCL's refusal to capture, whatever its type
        raise GraphCaptureError(f"CUDA graph capture failed: {type(exc).__name__}: {first_line(exc, 200)}") from exc


def _line_up(backend, run_op, hold_s: float = 0.0) -> None:
    """Host barrier, then ALIGN_OPS untimed ops: the start mark then follows ops that both
    lined the GPUs up (the slowest rank's lag is not timed) and got past the stall seen
    in the first ops after the barrier. `hold_s`: the device held busy first, so that what
    follows is queued before the device reaches it (queue_ahead_s above)."""
    HERE.at("lining up before the timed loop (barrier, untimed ops)")
    backend.barrier()
    if hold_s > 0:
        backend.hold(hold_s)
    for _ in range(ALIGN_OPS):
        run_op(0)


class LoopProgress:
    """The timed loop's own marks as the host issues them, for a hang's census (engine.hang):
    how far each rank's device got, read on the watchdog's thread without waiting (a mark the
    device has passed, asked through the backend: a CUDA event query on a GPU). The loop adds
    nothing for it: its marks are the ones the times come from (one per iteration up to
    NOISE_SAMPLES iterations, then one per block; one per replay with -G), and the loop
    stores the list once before it starts."""

    __slots__ = ("marks", "block", "steps", "placement", "reached")

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.marks, self.block, self.steps, self.placement, self.reached = None, 1, 0, None, None

    def begin(self, marks: list, block: int, steps: int, placement: str | None, reached) -> None:
        self.marks, self.block, self.steps, self.placement, self.reached = marks, block, steps, placement, reached

    def reading(self) -> dict | None:
        """{placement, steps, block, issued, passed}: marks issued by the host and passed by
        the device, in order (mark 0 starts the loop, mark j ends iteration min(j*block,
        steps)); None outside a timed loop or where the backend cannot tell."""
        marks, reached = self.marks, self.reached
        if marks is None or reached is None:
            return None
        issued = len(marks)  # appended by the main thread meanwhile: read once
        passed = 0
        try:
            for mark in marks[:issued]:
                done = reached(mark)
                if done is None:
                    return None
                if not done:
                    break
                passed += 1
        except Exception:  # noqa: BLE001 - a broken context: no reading
            return None
        return {"placement": self.placement, "steps": self.steps, "block": self.block, "issued": issued,
                "passed": passed}

    def sample(self, interval_s: float = 0.3) -> dict | None:
        """reading() twice, `interval_s` apart, the second with `moved`: whether the device
        passed a mark meanwhile (a device that runs slowly moves; a stopped one does not)."""
        first = self.reading()
        if first is None:
            return None
        time.sleep(interval_s)
        second = self.reading()
        if second is None or second["issued"] < first["issued"]:
            return None  # the loop ended meanwhile: nothing stopped in it
        return dict(second, moved=second["passed"] > first["passed"])


PROGRESS = LoopProgress()


def _marked_loop(backend, pool, steps: int, step: Callable[[int], None], ops_per_step: int,
                 block: int) -> Timing:
    """`step(k)` for k < steps between two device marks from `pool`, and one more after
    every `block` steps; times per op, and a sample per op of each block (each step with -I)."""
    here = HERE
    here.at(TIMED)
    here.iterations = steps
    stall = armed("timing.loop", rank=getattr(backend, "rank", None))
    if stall is not None and stall.at <= 1:  # a planted GPU stall (failpoints gpu_stall) before the start mark
        stamp(stall)
        backend.hold(stall.seconds)
    elif stall is not None:  # after an iteration: the plain loop stays as it is
        step = _stalled(backend, step, stall)
    host0 = time.perf_counter()
    marks = [backend.mark(pool[0])]
    PROGRESS.begin(marks, block, steps, here.placement, getattr(backend, "reached", None))
    for k in range(steps):
        here.iteration = k  # a slot store: read only by the -T watchdog's thread
        step(k)
        if (k + 1) % block == 0 or k + 1 == steps:
            marks.append(backend.mark(pool[len(marks)]))
    host1 = time.perf_counter()
    here.at(f"waiting for its device after issuing the {steps} timed iterations")
    backend.synchronize()
    PROGRESS.clear()
    total_ops = steps * ops_per_step
    sizes = [block] * (steps // block) + ([steps % block] if steps % block else [])
    samples = [backend.elapsed(a, b) / (n * ops_per_step) for a, b, n in zip(marks, marks[1:], sizes)]
    return Timing(backend.elapsed(marks[0], marks[-1]) / total_ops, (host1 - host0) / total_ops, samples)


def _stalled(backend, step: Callable[[int], None], plant) -> Callable[[int], None]:
    """`step` with the device held busy `plant.seconds` (backend.hold) after the ops of
    timed iteration `plant.at` - 1, before the mark that ends it: the host goes on issuing,
    the device finishes that iteration's ops and reaches the next only when the hold ends."""
    after = plant.at - 2  # the step (from 0) whose ops the hold follows

    def step_then_stall(k):
        step(k)
        if k == after:
            stamp(plant)
            backend.hold(plant.seconds)
    return step_then_stall


def _paired_loop(backend, pool, steps: int, step: Callable[[int], None], ops_per_step: int) -> Timing:
    """-z 3: each `step(k)` between its own start and stop marks (the stop after waiting for
    the step), then a barrier outside the marks. The time is the sum of the marked spans;
    the host time, nccl-tests' collOnlySec: issue and wait of each step, barriers left out."""
    spans, host_s = [], 0.0
    HERE.at(TIMED)
    HERE.iterations = steps
    for k in range(steps):
        HERE.iteration = k
        t0 = time.perf_counter()
        start = backend.mark(pool[2 * k])
        step(k)
        backend.synchronize()
        stop = backend.mark(pool[2 * k + 1])
        host_s += time.perf_counter() - t0
        spans.append((start, stop))
        backend.barrier()
    backend.synchronize()
    samples = [backend.elapsed(a, b) / ops_per_step for a, b in spans]
    return Timing(sum(samples) / steps, host_s / (steps * ops_per_step), samples)


class Average(enum.IntEnum):
    """-a: how per-rank times combine (nccl-tests' values)."""

    RANK0 = 0
    MEAN = 1
    MIN = 2
    MAX = 3


def combine(per_rank_seconds: list[float], how: Average) -> float:
    if how is Average.RANK0:
        return per_rank_seconds[0]
    if how is Average.MIN:
        return min(per_rank_seconds)
    if how is Average.MAX:
        return max(per_rank_seconds)
    return sum(per_rank_seconds) / len(per_rank_seconds)


def per_iter_summary(per_rank_iters: list[list[float]], skip: int) -> dict | None:
    """nccl-tests' -I statistics: per iteration the max over ranks, then the summary over
    iterations after the first `skip`. Times in microseconds; p95/p99 by nearest rank, p50
    the upper middle element (nccl-tests takes sorted[n / 2])."""
    if not per_rank_iters or not per_rank_iters[0]:
        return None
    times_us = [max(vals) * 1e6 for vals in zip(*per_rank_iters)]
    kept = times_us[skip:] or times_us
    ordered = sorted(kept)

    def nearest_rank(percent: int) -> float:
        k = max(1, -(-percent * len(ordered) // 100))  # ceil(percent/100 * n) in integers
        return ordered[min(k, len(ordered)) - 1]

    mean = statistics.fmean(kept)
    stdev = statistics.pstdev(kept) if len(kept) > 1 else 0.0
    return {
        "skipped_iterations": min(skip, len(times_us)),
        "min_us": ordered[0],
        "max_us": ordered[-1],
        "avg_us": mean,
        "p50_us": ordered[len(ordered) // 2],
        "p95_us": nearest_rank(95),
        "p99_us": nearest_rank(99),
        "stdev_us": stdev,
        "cv_pct": 100.0 * stdev / mean if mean else 0.0,
        "times_us": times_us,
        "per_process_max_times_us": [[v * 1e6 for v in vals] for vals in per_rank_iters],
    }
