"""The benchmark plan: every option, validated once, identical on every rank."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field

from ncclbench.engine.collectives import Collective, lookup
from ncclbench.dtypes import DTYPES
from ncclbench.errors import PlanError
from ncclbench.sizes import size_sweep
from ncclbench.engine.timing import Average, TimingMode, TimingSettings
from ncclbench.engine.traffic import Traffic


@dataclass(frozen=True)
class Plan:
    collective: str
    min_bytes: int = 32 << 20
    max_bytes: int = 32 << 20
    step_bytes: int = 1 << 20
    step_factor: float = 1.0
    dtypes: tuple[str, ...] = ("float",)
    ops: tuple[str, ...] = ("sum",)
    root: int = 0                  # -1: every root
    iters: int = 20
    warmup_iters: int = 1
    agg_iters: int = 1
    run_cycles: int = 1            # 0: until interrupted
    check: int = 1
    blocking: int = 0              # -z: nccl-tests' 0-3 (timing.py)
    average: int = 1
    timeout_s: float = 600.0
    report_timestamps: bool = False
    graph_replays: int = 0
    queue_ahead_s: float = 0.0     # graph replay: the device held this long before the aligning ops (timing.py)
    report_cputime: bool = False
    per_iter: bool = False
    per_iter_skip: int = 0
    unalign: int = 0               # -u: every buffer starts this many elements late
    local_register: int = 0        # -R: 0 none, 1 NCCL user buffers, 2 symmetric windows
    stream_null: bool = False      # -y: run on the legacy default stream
    memory_report: bool = False    # -M
    min_bw: float = 0.0            # NCCL_TESTS_MIN_BW / --min-bw: fail when avg busbw < 0.9 x this
    min_peak_bw: float = 0.0       # --min-peak-bw: fail when the peak busbw < this
    backend: str = "gloo"
    split: str | None = None
    traffic: Traffic | None = None  # alltoallv: generated spread or byte matrix
    traffic_summary: bool = False   # alltoallv: per-rank bytes and bandwidth after each row
    skipped: tuple[tuple[str, str], ...] = ()  # (dtype, op) pairs of `-d/-o all` the backend lacks
    args: tuple[str, ...] = field(default=(), compare=False)

    @property
    def coll(self) -> Collective:
        return lookup(self.collective)

    def sizes(self) -> list[int]:
        return size_sweep(self.min_bytes, self.max_bytes, self.step_bytes, self.step_factor)

    def layout(self, size: int, itemsize: int, nranks: int):
        """Element counts of the buffers for one message size (collectives.Layout)."""
        return self.coll.layout(size // itemsize, itemsize, nranks, self.traffic)

    @property
    def mode(self) -> TimingMode:
        if self.graph_replays > 0:
            return TimingMode.GRAPH
        if self.blocking:
            return TimingMode.BLOCKING
        return TimingMode.EAGER

    def timing_settings(self) -> TimingSettings:
        return TimingSettings(iters=self.iters, agg=self.agg_iters, mode=self.mode,
                              graph_replays=self.graph_replays, per_iter=self.per_iter, blocking=self.blocking,
                              queue_ahead_s=self.queue_ahead_s if self.graph_replays > 0 else 0.0)

    @property
    def averaging(self) -> Average:
        return Average(self.average)

    def op_list(self) -> list[str]:
        c = self.coll
        if c.has_op:
            return list(self.ops)
        return [c.printed_op if c.printed_op is not None else "sum"]

    def dtype_ops(self) -> list[tuple[str, str]]:
        """The (dtype, op) pairs to run, in nccl-tests' order, without the skipped ones."""
        return [(d, op) for d in self.dtypes for op in self.op_list() if (d, op) not in self.skipped]

    def root_list(self, nranks: int) -> list[int]:
        if not self.coll.has_root:
            return [-1]
        return list(range(nranks)) if self.root == -1 else [self.root]

    def expected_rows(self, nranks: int | None = None) -> int:
        """Rows the sweep prints (0 when it runs until interrupted). Roots count as 1 when
        `-r all` and the rank count is not known yet."""
        if self.run_cycles == 0:
            return 0
        roots = len(self.root_list(nranks)) if nranks else 1
        return self.run_cycles * len(self.sizes()) * len(self.dtype_ops()) * roots

    def groups(self, nranks: int) -> list[list[int]]:
        """World ranks of each parallel group (--split); one group of everyone without it.
        Groups must have one size: the rows combine every group's times."""
        if not self.split:
            return [list(range(nranks))]
        from ncclbench.engine.groups import split_groups

        groups = list(split_groups(nranks, self.split).values())
        if len({len(g) for g in groups}) > 1:
            raise PlanError(f"--split {self.split!r} on {nranks} ranks makes groups of sizes "
                            f"{', '.join(str(len(g)) for g in groups)}: ncclbench needs groups of one size")
        return groups

    def unsupported(self, dtype: str, op: str, nranks: int | None = None) -> str | None:
        """Why this plan's backend cannot run `dtype` with `op` (an op-column entry, ignored
        for collectives that reduce nothing) on groups of `nranks` ranks, or None."""
        reason = self.coll.unsupported(self.backend, dtype, op, nranks)
        # Asked only where torch is loaded already (a rank, before its buffers): the launcher
        # and the file tools must not import torch (seconds) for a question torch >= 2.4 answers yes.
        if reason is None and "torch" in sys.modules and DTYPES[dtype].torch_dtype() is None:
            reason = f"this torch has no {dtype} type"
        return reason

    def without_unsupported(self, nranks: int | None = None) -> "Plan":
        """`-d all` / `-o all`: the same plan minus the pairs the backend cannot run on groups
        of `nranks` (nccl-tests runs every type it was built with; here that is every type
        the backend has)."""
        from dataclasses import replace

        skipped = tuple((d, op) for d in self.dtypes for op in self.op_list() if self.unsupported(d, op, nranks))
        return replace(self, skipped=skipped)

    def check_runnable(self, ranks_per_test: int | None) -> None:
        """What can be refused before a single buffer exists: dtype/op pairs the backend
        lacks, and rank counts the collective cannot use. PlanError with one line."""
        coll = self.coll
        if not self.dtype_ops():  # `all` left nothing: say why the first pair cannot run
            raise PlanError(self.unsupported(*self.skipped[0], ranks_per_test))
        for d, op in self.dtype_ops():
            reason = self.unsupported(d, op, ranks_per_test)
            if reason:
                raise PlanError(reason)
        if self.graph_replays and self.backend == "gloo":
            raise PlanError("-G (CUDA graphs) needs GPUs: the gloo backend runs on the CPU")
        n = ranks_per_test
        if n is None:
            return
        if coll.has_root and self.root >= n:
            raise PlanError(f"root {self.root} does not exist with {n} ranks (use 0..{n - 1} or all)")
        reason = coll.rank_rule(n)
        if reason:
            raise PlanError(reason)
        t = self.traffic
        if t is not None and t.matrix is not None:
            if len(t.matrix) < n:
                raise PlanError(f"alltoallv matrix {t.source} is {len(t.matrix)}x{len(t.matrix)}: "
                                f"too small for {n} ranks")
            need = t.busiest_rank_bytes(n)
            if self.max_bytes < need:
                raise PlanError(f"alltoallv matrix {t.source} needs -e of at least {need} bytes "
                                f"(the busiest rank's total); got {self.max_bytes}")

    def fingerprint(self) -> dict:
        """What every rank must agree on before the first collective."""
        d = asdict(self)
        d.pop("args")
        return d

    def buffer_bytes(self, nranks: int, sizes: list[int] | None = None) -> tuple[int, int]:
        """(send, recv) bytes to allocate once for the whole sweep; recv also holds the
        in-place send region."""
        send = recv = 0
        pad = self.unalign * 8  # -u: room for the offset at the widest type
        for name in self.dtypes:
            item = DTYPES[name].itemsize
            for size in sizes if sizes is not None else self.sizes():
                lay = self.layout(size, item, nranks)
                send = max(send, lay.send_count * item)
                recv = max(recv, max(lay.send_count, lay.recv_count) * item)
        return send + pad, recv + pad

    def largest_fitting_size(self, nranks: int, budget_bytes: int) -> int | None:
        fitting = [s for s in self.sizes() if sum(self.buffer_bytes(nranks, [s])) <= budget_bytes]
        return max(fitting) if fitting else None
