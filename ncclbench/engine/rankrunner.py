"""One rank's part of a plan: agree on it, check it fits, warm up, measure and check
one size, and (rank 0) turn every rank's numbers into a row."""

from __future__ import annotations

import os
import socket
from dataclasses import replace

from ncclbench.dtypes import DTYPES
from ncclbench.engine import onerank
from ncclbench.engine.buffers import Slots, count_wrong, fill_input, memory_text
from ncclbench.engine.checkdata import InputPattern, poison
from ncclbench.engine.collectives import CheckContext
from ncclbench.engine.position import HERE
from ncclbench.engine.runfacts import now
from ncclbench.engine.timing import TimingMode, capture, combine, measure, per_iter_summary
from ncclbench.errors import PlanError, ranks_list
from ncclbench.failpoints import failpoint
from ncclbench.results import noise
from ncclbench.results.records import DeviceRecord, PlacementResult, ResultRow


class RankRunner:
    def __init__(self, plan, backend):
        self.plan = plan
        self.backend = backend
        self.coll = plan.coll
        self.rank = backend.group_rank
        self.nranks = backend.group_size
        self.seed_counter = 0
        self.op_group, self.group_note = self._group_ops()

    def _group_ops(self):
        """(factory of one NCCL group around each iteration's ops, or None; a header note or
        None). With -m > 1 ops are grouped where the backend can, as nccl-tests does; the
        note says when they are not."""
        if self.plan.agg_iters < 2:
            return None, None
        if self.plan.blocking in (1, 2):
            return None, (f"-z {self.plan.blocking} -m {self.plan.agg_iters}: each op is waited for on its own, "
                          "not grouped (nccl-tests groups them, and its wait inside the open group finds nothing "
                          "launched yet)")
        group, reason = self.backend.op_group(self.coll.name)
        if group is None:
            return None, f"-m {self.plan.agg_iters}: ops issued one by one, not in one NCCL group per iteration ({reason})"
        return group, None

    # ---- before the sweep ---------------------------------------------------------------
    def agree_on_plan(self):
        """Stop with the names of the ranks that differ, instead of hanging in a mismatched collective."""
        import torch

        mine = dict(self.plan.fingerprint(), torch=torch.__version__,
                    library=self.backend.library_version()[0])
        mine = failpoint("engine.plan_fingerprint", mine, rank=self.backend.rank)
        everyone = self.backend.all_gather_object(mine)
        reference = everyone[0]
        differ = [r for r, fp in enumerate(everyone) if fp != reference]
        if differ:
            keys = sorted({k for r in differ for k in everyone[r] if everyone[r].get(k) != reference.get(k)})
            raise PlanError(f"rank(s) {ranks_list(differ)} run a different plan than rank 0 "
                            f"(differs in: {', '.join(keys)}); every rank must get the same options")

    def validate(self):
        p = self.plan
        p.check_runnable(self.nranks)  # with the group size the backend actually formed
        send, recv = p.buffer_bytes(self.nranks)
        free = failpoint("engine.free_memory", self.backend.free_memory(), rank=self.backend.rank)
        if free is not None and send + recv + (2 << 30) > free:
            fit = p.largest_fitting_size(self.nranks, free - (2 << 30))
            hint = f"largest size that fits: -e {fit}" if fit else "not even the smallest size fits"
            raise PlanError(f"buffers need {memory_text(send + recv)} but the GPU has "
                            f"{memory_text(free)} free ({hint})")

    def device_record(self) -> DeviceRecord:
        info = self.backend.device_info()
        return DeviceRecord(rank=self.backend.rank, group=self.backend.group_index, pid=os.getpid(),
                            hostname=socket.gethostname(),
                            device=info["device"], device_hex=info["device_hex"], device_info=info["device_info"])

    # ---- the sweep ----------------------------------------------------------------------------
    def combinations(self):
        for dname, op in self.plan.dtype_ops():
            for root in self.plan.root_list(self.nranks):
                yield DTYPES[dname], op, root

    def warm_up(self, buffers, dtype, op, root, sizes):
        send_t, recv_t = buffers.typed(dtype)
        for size in sizes:
            layout = self.plan.layout(size, dtype.itemsize, self.nranks)
            slots = self._slots(layout, send_t, recv_t, False, 1)
            for _ in range(self.plan.warmup_iters):
                send, recv = slots[0]
                self.coll.call(self.backend, send, recv, op, root, layout)
        self.backend.synchronize()

    def connect(self, buffers) -> None:
        """One untimed op of the first combination at the largest size, so that NCCL connects
        the ranks (since 2.22 it does so at a communicator's first use of an algorithm) and
        its log names the path before the report begins."""
        first = next(iter(self.combinations()), None)
        sizes = self.plan.sizes()
        if first is None or not sizes or self.nranks < 2:
            return
        dtype, op, root = first
        send_t, recv_t = buffers.typed(dtype)
        layout = self.plan.layout(max(sizes), dtype.itemsize, self.nranks)
        send, recv = self._slots(layout, send_t, recv_t, False, 1)[0]
        self.coll.call(self.backend, send, recv, op, root, layout)
        self.backend.synchronize()

    def _slots(self, layout, send_t, recv_t, in_place, nslots):
        out_of_place_missing = self.plan.backend in self.coll.in_place_only
        return Slots(layout, send_t, recv_t, in_place, out_of_place_missing and not in_place, self.rank, nslots)

    def measure_size(self, buffers, dtype, op, root, size):
        """This rank's (timing, wrong) for both placements of one size."""
        send_t, recv_t = buffers.typed(dtype)
        layout = self.plan.layout(size, dtype.itemsize, self.nranks)
        settings = self.plan.timing_settings()
        if layout.printed_bytes(dtype.itemsize) == 0:
            settings = replace(settings, moves_nothing=True)
        out = []
        for in_place in (False, True):
            HERE.placement = "in-place" if in_place else "out-of-place"
            slots = self._slots(layout, send_t, recv_t, in_place, settings.iters * settings.agg)

            if settings.mode is TimingMode.GRAPH:
                # capture must see the current (capture) stream: no pre-bound calls
                def run_op(k, slots=slots):
                    send, recv = slots[k]
                    self.coll.call(self.backend, send, recv, op, root, layout)
            else:
                calls = slots.bind(self.backend, self.coll, op, root, layout)
                ncalls = len(calls)

                def run_op(k, calls=calls, ncalls=ncalls):
                    calls[k % ncalls]()

            timing = measure(self.backend, run_op, settings, self.op_group)
            wrong = None
            checkable = self.plan.check and (self.coll.in_place_checked or not in_place)
            if checkable:  # -c N: N checks, each with fresh inputs; their wrong counts add up
                issue = self._check_issue(run_op, slots, layout, settings, size)
                wrong = sum(self.check(slots, layout, dtype, op, root, size, issue) for _ in range(self.plan.check))
            out.append((timing.device_s, timing.host_s, timing.per_iter_s, wrong))
        return layout, out

    def _check_issue(self, run_op, slots, layout, settings, size):
        """The check's one op, issued the way the timed loop issued its ops: the timed
        loop's own bound callable for slot 0 (eager, -z), or, under -G, a CUDA graph
        captured from the same call and replayed, as nccl-tests does (common.cu: the
        check's op is captured and the graph launched). The graph is captured before the
        inputs are filled: capturing also runs the op once outside the graph."""
        if settings.mode is not TimingMode.GRAPH:
            return lambda: run_op(0)

        def one_op():
            run_op(0)
            # a failpoint here can plant a wrong element written by the graph itself
            failpoint("engine.check_in_graph", rank=self.backend.rank, size=size,
                      view=slots[0][1][:layout.recv_span(self.rank)])

        return capture(self.backend, one_op, settings.moves_nothing)

    def check(self, slots, layout, dtype, op, root, size, issue) -> int:
        """Fresh inputs, one op through `issue()`, count wrong elements in this rank's
        output (untimed)."""
        self.seed_counter += 1
        HERE.at("checking the results")
        pattern = InputPattern(dtype, op if self.coll.has_op else None, self.nranks, seed=self.seed_counter)
        send, recv = slots[0]
        device = self.backend.device
        poison(recv, dtype)  # an element nothing wrote cannot pass
        if self.coll.input_on(self.rank, root):
            fill_input(send, pattern, self.rank, dtype, device)
        else:  # not an input (broadcast, scatter off the root): in place, the output starts as poison
            poison(send, dtype)
        self.backend.synchronize()
        issue()
        self.backend.synchronize()
        if not self.coll.checked_on(self.rank, root):
            return 0
        recv = recv[:layout.recv_span(self.rank)]
        failpoint("engine.check_output", rank=self.backend.rank, size=size, view=recv)
        ctx = CheckContext(pattern, self.rank, self.nranks, root, layout.param_count, layout.counts)
        return count_wrong(recv, self.coll, ctx, dtype, pattern.op, device)

    def to_row(self, per_rank, layout, dtype, op, root) -> ResultRow:
        """Rank 0: combine every rank's numbers for one size into a printed row."""
        plan = self.plan
        cells = []
        for placement in range(2):
            device_s = [r[placement][0] for r in per_rank]
            host_s = [r[placement][1] for r in per_rank]
            wrongs = [r[placement][3] for r in per_rank]
            # Bandwidth always from the timed duration of the ops; -C swaps only the time
            # column, as nccl-tests does (getBw gets deltaSec, the column cputimeSec).
            seconds = combine(device_s, plan.averaging)
            shown = combine(host_s, plan.averaging) if plan.report_cputime else seconds
            algbw, busbw = self.coll.bandwidths(layout, dtype.itemsize, self.nranks, seconds)
            nwrong = None if any(w is None for w in wrongs) else sum(wrongs)
            per_iter = None
            if plan.per_iter:
                per_iter = per_iter_summary([r[placement][2] for r in per_rank], plan.per_iter_skip)
            cells.append(PlacementResult(shown * 1e6, algbw, busbw, nwrong,
                                         host_us=sum(host_s) / len(host_s) * 1e6, per_iter=per_iter,
                                         noise=noise.across_ranks([r[placement][2] for r in per_rank]),
                                         device_us=seconds * 1e6,
                                         rank_us=tuple(t * 1e6 for t in device_s)))  # kept for preflight
        cells = onerank.honest_cells(cells, self.coll, self.plan.backend, self.nranks)
        notes = ()
        if plan.traffic_summary and layout.counts is not None:
            notes = traffic_summary_lines(plan, layout, dtype.itemsize, self.nranks, cells[0].device_us)
        return ResultRow(self.coll.name, layout.printed_bytes(dtype.itemsize), layout.param_count,
                         dtype.name, self.coll.printed_op if self.coll.printed_op is not None else op,
                         root, cells[0], cells[1],
                         timestamp=now(), notes=notes)


def traffic_summary_lines(plan, layout, itemsize: int, nranks: int, time_us: float) -> tuple[str, ...]:
    """alltoallv per-rank bytes and bandwidth at the out-of-place time (nccl-tests'
    NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY lines)."""
    t = plan.traffic
    if t.generated:
        head = (f"# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=generated nranks={nranks} "
                f"total_bytes={layout.param_count * nranks * itemsize} spread={t.spread:.3f} time_usec={time_us:.2f}")
    else:
        head = (f"# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=matrix nranks={nranks} matrix_dim={len(t.matrix)} "
                f"scale={t.scale:.3f} time_usec={time_us:.2f}")
    lines = [head]
    factor = plan.coll.bus_factor(nranks)
    for rank in range(nranks):
        sent, got = sum(layout.sends(rank)) * itemsize, sum(layout.receives(rank)) * itemsize
        alg = max(sent, got) / 1e3 / time_us if time_us > 0 else 0.0
        lines.append(f"#   rank={rank} send_bytes={sent} recv_bytes={got} alg_bw={alg:.2f} bus_bw={alg * factor:.2f}")
    return tuple(lines)
