"""The check runs what the timed loop runs: the loop's own bound callable (eager, -z),
or a CUDA graph captured from the same call and replayed (-G); and the runner's priming
makes a rank that received nothing count wrong. A stand-in backend on the CPU makes the
difference visible: its plain methods and its bound callables do different things, and
its "capture" records calls that only a replay carries out."""

import time

import pytest
import torch

from ncclbench.engine.checkdata import InputPattern, bit_view
from ncclbench.engine.collectives import REGISTRY
from ncclbench.dtypes import DTYPES
from ncclbench.engine.plan import Plan
from ncclbench.engine.buffers import Buffers
from ncclbench.engine.rankrunner import RankRunner

import test_fault_matrix as matrix


class StandIn:
    """Rank `rank` of `nranks` on the CPU, without communication. all_reduce's plain
    method writes zeros, which the check must count wrong, unless it is being captured:
    then it records the right call (a copy, the sum over one rank) for the replay. The
    bound callable makes the right call at once. Its plans say cupy: a backend whose every
    collective has an out-of-place call (no in-place stand-in)."""

    def __init__(self, rank=0, nranks=1):
        self.rank = self.group_rank = rank
        self.nranks = self.group_size = nranks
        self.device = torch.device("cpu")
        self.capturing = False
        self.recorded = []
        self.bound_calls = 0
        self.replayed = []  # ops in each graph replayed

    # what the runner and the timing engine use
    def alloc_bytes(self, nbytes):
        return torch.zeros(max(nbytes, 1), dtype=torch.uint8)

    def op_group(self, _name):
        return None, "stand-in"

    def markers(self, n):
        return [None] * n

    def mark(self, _marker):
        return time.perf_counter()

    def elapsed(self, start, end):
        return end - start

    def synchronize(self):
        pass

    def barrier(self):
        pass

    def all_reduce(self, send, recv, op):
        if self.capturing:
            self.recorded.append(lambda: recv.copy_(send))
        else:
            recv.zero_()

    def bind(self, coll, send, recv, op, root, layout):
        def call():
            self.bound_calls += 1
            recv.copy_(send)
        return call

    def capture(self, issue_ops, empty_ok=False):
        self.capturing = True
        try:
            issue_ops()
        finally:
            self.capturing = False
        ops, self.recorded = self.recorded, []

        def replay():
            self.replayed.append(len(ops))
            for op in ops:
                op()
        return replay


def measured_wrong(**plan):
    backend = StandIn()
    runner = RankRunner(Plan("all_reduce", min_bytes=4096, max_bytes=4096, iters=3, backend="cupy", **plan),
                        backend)
    buffers = Buffers(backend, *runner.plan.buffer_bytes(1))
    _layout, cells = runner.measure_size(buffers, DTYPES["float"], "sum", -1, 4096)
    return [cell[3] for cell in cells], backend


@pytest.mark.parametrize("plan", [{}, {"blocking": True}], ids=["eager", "blocking"])
def test_the_check_calls_the_timed_loops_bound_callable(plan):
    """The plain method writes zeros; only the bound callable the timed loop used is right."""
    wrong, backend = measured_wrong(**plan)
    assert wrong == [0, 0]
    assert backend.bound_calls > 0


def test_under_graphs_the_check_replays_a_capture_of_the_same_call():
    """-G: an eager call of the plain method writes zeros; the captured call is right and
    runs only when the graph is replayed, after the inputs were filled."""
    wrong, backend = measured_wrong(graph_replays=2)
    assert wrong == [0, 0]
    assert backend.bound_calls == 0
    # the timed graph holds -n 3 ops; the check's, replayed once per placement, the one op
    assert 3 in backend.replayed and backend.replayed.count(1) == 2


ISSUE_CASES = [("float", 128, 97), ("bfloat16", 32, 9), ("half", 32, 5), ("int8", 10, 3)]


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("dname,nranks,rank", ISSUE_CASES)
def test_a_rank_that_received_nothing_is_counted_wrong(name, dname, nranks, rank):
    """The runner's own check on a rank whose collective wrote nothing: every placement it
    checks counts wrong elements (the rank counts and ranks where same-looking inputs once
    passed), and its buffer holds exactly what the fault matrix assumes."""
    coll, dtype = REGISTRY[name], DTYPES[dname]
    if name == "hypercube" and nranks & (nranks - 1):
        pytest.skip("hypercube runs on power-of-two rank counts")
    root = 0 if coll.has_root else -1
    if not coll.checked_on(rank, root):
        root = rank  # reduce and gather: look at the root
    backend = StandIn(rank, nranks)
    runner = RankRunner(Plan(coll.name, dtypes=(dname,), backend="cupy"), backend)
    layout = matrix.layout_for(coll, dtype, nranks)
    send_t = torch.zeros(layout.send_count, dtype=dtype.torch_dtype())
    recv_t = torch.zeros(max(layout.send_count, layout.recv_count), dtype=dtype.torch_dtype())
    op = "sum" if coll.has_op else None
    for in_place in matrix.placements(coll):
        if matrix.nothing_needed(coll, rank, root, in_place):
            continue
        slots = runner._slots(layout, send_t, recv_t, in_place, 1)
        assert runner.check(slots, layout, dtype, op, root, 0, issue=lambda: None) > 0, in_place
        left = slots[0][1][:layout.recv_span(rank)]
        pattern = InputPattern(dtype, op, nranks, runner.seed_counter)
        assert torch.equal(bit_view(left, dtype),
                           bit_view(matrix.primed(coll, layout, pattern, rank, root, in_place, dtype), dtype))
