"""The collective registry: one entry per collective, holding only what differs.

Counts follow nccl-tests 2.19.6 (`getCollByteCount` in each src/<coll>.cu): per-rank
chunks of the "scattered" collectives are rounded down to a multiple of 16 bytes, the
printed size is the larger of the send and receive buffers, and the printed count is
the per-rank (or per-peer) element count.

An entry also owns what differs between collectives on each backend: the backends it runs
on, the dtype/op gaps a backend has for it alone (the backends' own are in
backends/capabilities.py), where torch has no out-of-place call, what a one-rank call does,
and whether NCCL_ALGO/NCCL_PROTO choose anything for it (and among what)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ncclbench.backends.capabilities import BACKENDS, GAPS, NCCL, TORCH, Gap
from ncclbench.engine.checkdata import InputPattern


@dataclass(frozen=True)
class Layout:
    """Element counts of one rank's buffers for one message size."""

    send_count: int
    recv_count: int
    param_count: int            # the `count` column, and what bandwidth is computed from
    send_inplace_offset: int    # in-place: send buffer = recv + offset * rank
    recv_inplace_offset: int    # in-place: recv buffer = recv + offset * rank
    # alltoallv: elements [src][dst]; send/recv_count are then the busiest rank's totals
    counts: tuple[tuple[int, ...], ...] | None = None

    def printed_bytes(self, itemsize: int) -> int:
        return max(self.send_count, self.recv_count) * itemsize

    def sends(self, rank: int) -> tuple[int, ...]:
        return self.counts[rank]

    def receives(self, rank: int) -> tuple[int, ...]:
        return tuple(row[rank] for row in self.counts)

    def recv_span(self, rank: int) -> int:
        """Elements of `rank`'s receive buffer that the collective writes."""
        return sum(self.receives(rank)) if self.counts is not None else self.recv_count


def _whole(count: int, itemsize: int, nranks: int, traffic=None) -> Layout:
    return Layout(count, count, count, 0, 0)


def _chunk(count: int, itemsize: int, nranks: int) -> int:
    per_rank = count // nranks
    align = max(16 // itemsize, 1)
    return per_rank - per_rank % align


def _gathered(count, itemsize, nranks, traffic=None):      # small send, n chunks received
    base = _chunk(count, itemsize, nranks)
    return Layout(base, base * nranks, base, base, 0)


def _scattered(count, itemsize, nranks, traffic=None):     # n chunks sent, small receive
    base = _chunk(count, itemsize, nranks)
    return Layout(base * nranks, base, base, 0, base)


def _exchanged(count, itemsize, nranks, traffic=None):     # n chunks each way
    base = _chunk(count, itemsize, nranks)
    return Layout(base * nranks, base * nranks, base, 0, 0)


def _everyone(rank, root):
    return True


def _root_only(rank, root):
    return rank == root


@dataclass(frozen=True)
class CheckContext:
    """What an `expected` function needs to know about the rank it checks."""

    pattern: InputPattern
    rank: int
    nranks: int
    root: int
    chunk: int  # Layout.param_count
    counts: tuple[tuple[int, ...], ...] | None = None  # Layout.counts (alltoallv)


_ALL_PROTOCOLS = ("ll", "ll128", "simple")
_SIMPLE = ("simple",)


@dataclass(frozen=True, eq=False)
class NcclTuning:
    """How NCCL_ALGO and NCCL_PROTO choose for a collective, as NCCL's tuning model has it
    (src/graph/tuning.cc, ncclTopoTuneModel, read on 2.24 to 2.30): NVLS, NVLS_TREE, CollNet
    and PAT take the Simple protocol only. tune/plan.py adds what depends on the machine."""

    plugin: str                 # the tuner plugin's config name: allreduce
    log: str                    # NCCL's function name in its debug lines: AllReduce
    func: int                   # ncclFunc_t, the plugin's order of collectives
    algorithms: dict            # algorithm -> the protocols NCCL runs it with
    ops_without: dict = field(default_factory=dict)  # algorithm -> reductions it has no kernel for


def _no_rank_rule(nranks: int) -> str | None:
    return None


@dataclass(frozen=True)
class Collective:
    name: str                       # nccl-tests name (all_reduce): JSON, CSV, `*_perf` alias
    command: str                    # CLI subcommand (allreduce)
    layout: Callable[..., Layout]   # (count, itemsize, nranks, traffic=None)
    bus_factor: Callable[[int], float]
    moved: Callable[[Layout, int], int]  # (layout, nranks) -> elements algbw counts
    has_op: bool
    has_root: bool
    printed_op: str | None          # fixed text of the redop column, None = the op's name
    in_place_checked: bool          # False: nccl-tests prints N/A for in-place #wrong
    checked_on: Callable[[int, int], bool]          # (rank, root) -> does this rank's output mean anything
    expected: Callable[[CheckContext, object], object]  # (ctx, recv indices) -> int64/float64 values
    # (backend, send, recv, op, root, layout) -> what the backend method returns: the one method
    # of backends/protocol.py that runs this collective (CuPy's bind calls it on bound forms)
    call: Callable
    # (rank, root) -> is this rank's send buffer an input? The check fills the others with
    # poison, so that a rank the data never reached cannot pass on its own copy of it.
    input_on: Callable[[int, int], bool] = _everyone
    backends: tuple[str, ...] = BACKENDS
    gaps: tuple[Gap, ...] = ()      # what a backend cannot run for this collective alone
    in_place_only: frozenset[str] = frozenset()  # backends without an out-of-place call: in-place stands in
    # backends whose one-rank in-place call returns without moving data (NCCL's ncclLaunchOneRank
    # path, save premul-sum scaling: engine/onerank.py)
    one_rank_noop: frozenset[str] = frozenset()
    tuning: NcclTuning | None = None  # None: NCCL_ALGO/NCCL_PROTO select nothing (point-to-point)
    rank_rule: Callable[[int], str | None] = _no_rank_rule  # (ranks per communicator) -> why not, or None

    def unsupported(self, backend: str, dtype: str, op: str | None, nranks: int | None = None) -> str | None:
        """Why `backend` cannot run this collective on `dtype` with reduction `op` (ignored
        for collectives that reduce nothing) in communicators of `nranks` ranks (None: not
        known yet), or None."""
        if backend in BACKENDS and backend not in self.backends:  # an unknown name is create_backend's to refuse
            return f"backend {backend} does not run {self.name}"
        op = op if self.has_op else None
        for gap in GAPS + self.gaps:
            reason = gap.refuses(backend, dtype, op, nranks)
            if reason:
                return reason
        return None

    def algbw_bytes(self, layout: Layout, itemsize: int, nranks: int) -> int:
        return self.moved(layout, nranks) * itemsize

    def bandwidths(self, layout: Layout, itemsize: int, nranks: int, seconds: float) -> tuple[float, float]:
        """(algbw, busbw) in GB/s (1e9 bytes/s), as nccl-tests' getBw."""
        if seconds <= 0:
            return 0.0, 0.0
        algbw = self.algbw_bytes(layout, itemsize, nranks) / 1e9 / seconds
        return algbw, algbw * self.bus_factor(nranks)


def _from_each_rank(ctx, idx, offset):
    """recv[i] holds element `offset + i % chunk` of rank i // chunk."""
    src = idx // ctx.chunk
    return ctx.pattern.values(src, idx - src * ctx.chunk + offset)


_ring_factor = lambda n: 2 * (n - 1) / n  # noqa: E731
_per_rank = lambda lay, n: lay.param_count * n  # noqa: E731 - data of every rank counted
_single = lambda lay, n: lay.param_count  # noqa: E731
_scatter_factor = lambda n: (n - 1) / n  # noqa: E731
_one = lambda n: 1.0  # noqa: E731

_EVERY_BACKEND = frozenset(BACKENDS)

REGISTRY: dict[str, Collective] = {}


def register(c: Collective) -> Collective:
    REGISTRY[c.name] = c
    return c


ALL_REDUCE = register(Collective(
    "all_reduce", "allreduce",
    layout=_whole, bus_factor=_ring_factor, moved=_single,
    has_op=True, has_root=False, printed_op=None,
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: ctx.pattern.reduce(idx),
    call=lambda b, s, r, op, root, lay: b.all_reduce(s, r, op),
    in_place_only=TORCH, one_rank_noop=_EVERY_BACKEND,
    tuning=NcclTuning("allreduce", "AllReduce", 4, {
        "tree": _ALL_PROTOCOLS, "ring": _ALL_PROTOCOLS, "collnet_direct": _SIMPLE, "collnet_chain": _SIMPLE,
        "nvls": _SIMPLE, "nvls_tree": _SIMPLE}),
))
ALL_GATHER = register(Collective(
    "all_gather", "allgather",
    layout=_gathered, bus_factor=_scatter_factor, moved=_per_rank,
    has_op=False, has_root=False, printed_op="none",
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: _from_each_rank(ctx, idx, 0),
    call=lambda b, s, r, op, root, lay: b.all_gather(s, r),
    one_rank_noop=NCCL,
    tuning=NcclTuning("allgather", "AllGather", 2, {
        "ring": _ALL_PROTOCOLS, "pat": _SIMPLE, "nvls": _SIMPLE, "collnet_direct": _SIMPLE}),
))
REDUCE_SCATTER = register(Collective(
    "reduce_scatter", "reducescatter",
    layout=_scattered, bus_factor=_scatter_factor, moved=_per_rank,
    has_op=True, has_root=False, printed_op=None,
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: ctx.pattern.reduce(idx + ctx.rank * ctx.chunk),
    call=lambda b, s, r, op, root, lay: b.reduce_scatter(s, r, op),
    one_rank_noop=NCCL,
    tuning=NcclTuning("reducescatter", "ReduceScatter", 3, {
        "ring": _ALL_PROTOCOLS, "pat": _SIMPLE, "nvls": _SIMPLE, "collnet_direct": _SIMPLE},
        ops_without={"pat": ("avg", "mulsum")}),
    # benchmarks/torch_premul_probe.py: reduce_scatter_tensor returned 3.0 for 3.0 x 2 and
    # x 0.5 on one rank (torch 2.11); all_reduce and reduce applied the factor
    gaps=(Gap(frozenset({"nccl"}), "torch's reduce_scatter_tensor ignores the premul-sum factor in a one-rank "
              "group (measured, torch 2.11); use --backend cupy or 2 or more ranks",
              ops=frozenset({"mulsum"}), one_rank=True),),
))
ALLTOALL = register(Collective(
    "alltoall", "alltoall",
    layout=_exchanged, bus_factor=_scatter_factor, moved=_per_rank,
    has_op=False, has_root=False, printed_op="none",
    in_place_checked=False, checked_on=_everyone,
    expected=lambda ctx, idx: _from_each_rank(ctx, idx, ctx.rank * ctx.chunk),
    call=lambda b, s, r, op, root, lay: b.alltoall(s, r),
))
BROADCAST = register(Collective(
    "broadcast", "broadcast",
    layout=_whole, bus_factor=_one, moved=_single,
    has_op=False, has_root=True, printed_op="none",
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: ctx.pattern.values(ctx.root, idx),
    call=lambda b, s, r, op, root, lay: b.broadcast(s, r, root),
    input_on=_root_only,
    in_place_only=TORCH, one_rank_noop=_EVERY_BACKEND,
    tuning=NcclTuning("broadcast", "Broadcast", 0, {"ring": _ALL_PROTOCOLS}),
))
REDUCE = register(Collective(
    "reduce", "reduce",
    layout=_whole, bus_factor=_one, moved=_single,
    has_op=True, has_root=True, printed_op=None,
    in_place_checked=True, checked_on=_root_only,
    expected=lambda ctx, idx: ctx.pattern.reduce(idx),
    call=lambda b, s, r, op, root, lay: b.reduce(s, r, op, root),
    in_place_only=TORCH, one_rank_noop=_EVERY_BACKEND,
    tuning=NcclTuning("reduce", "Reduce", 1, {"ring": _ALL_PROTOCOLS}),
))
GATHER = register(Collective(
    "gather", "gather",
    layout=_gathered, bus_factor=_scatter_factor, moved=_per_rank,
    has_op=False, has_root=True, printed_op="none",
    in_place_checked=True, checked_on=_root_only,
    expected=lambda ctx, idx: _from_each_rank(ctx, idx, 0),
    call=lambda b, s, r, op, root, lay: b.gather(s, r, root),
))
SCATTER = register(Collective(
    "scatter", "scatter",
    layout=_scattered, bus_factor=_scatter_factor, moved=_per_rank,
    has_op=False, has_root=True, printed_op="none",
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: ctx.pattern.values(ctx.root, idx + ctx.rank * ctx.chunk),
    call=lambda b, s, r, op, root, lay: b.scatter(s, r, root),
    input_on=_root_only,
))
# nccl-tests' sendrecv prints the op column ("sum") although nothing is reduced.
SENDRECV = register(Collective(
    "sendrecv", "sendrecv",
    layout=_whole, bus_factor=_one, moved=_single,
    has_op=False, has_root=False, printed_op=None,
    in_place_checked=False, checked_on=_everyone,
    expected=lambda ctx, idx: ctx.pattern.values((ctx.rank - 1) % ctx.nranks, idx),
    call=lambda b, s, r, op, root, lay: b.sendrecv(s, r),
    rank_rule=lambda n: "sendrecv needs at least 2 ranks (-g 2 or more)" if n < 2 else None,
))


# all_gather as log2(n) pairwise exchanges (nccl-tests' hypercube_perf): each step swaps
# the block gathered so far with the partner rank ^ step. Power-of-two rank counts only.
# nccl-tests counts only the (n-1) chunks received, with bus factor 1.
HYPERCUBE = register(Collective(
    "hypercube", "hypercube",
    layout=_gathered, bus_factor=_one, moved=lambda lay, n: lay.param_count * (n - 1),
    has_op=False, has_root=False, printed_op="",
    in_place_checked=True, checked_on=_everyone,
    expected=lambda ctx, idx: _from_each_rank(ctx, idx, 0),
    call=lambda b, s, r, op, root, lay: b.hypercube(s, r),
    rank_rule=lambda n: f"hypercube needs a power-of-two number of ranks (got {n})" if n & (n - 1) else None,
))


# alltoallv (nccl-tests' alltoallv_perf): uneven per-peer amounts from a Traffic (generated
# spread or byte matrix, see traffic.py), packed back to back in rank order on both sides.
# The count column is the even per-peer count (0 in matrix mode); size and algbw use the
# busiest rank's larger total; nccl-tests does not check in-place (it is timed only).
def _variable(count, itemsize, nranks, traffic=None):
    from ncclbench.engine.traffic import Traffic, busiest_totals

    traffic = traffic or Traffic()
    base = _chunk(count, itemsize, nranks) if traffic.generated else 0
    counts = traffic.counts(nranks, base * nranks * itemsize, itemsize)
    send, recv = busiest_totals(counts)
    return Layout(send, recv, base, 0, 0, counts=counts)


def _from_each_sender(ctx, idx):
    """recv holds, for each source in rank order, the part of its send stream meant for us."""
    import torch

    ours = torch.tensor([row[ctx.rank] for row in ctx.counts], dtype=torch.int64, device=idx.device)
    ends = ours.cumsum(0)
    src = torch.searchsorted(ends, idx, right=True).clamp(max=ctx.nranks - 1)
    # where our part starts in each source's stream
    skipped = torch.tensor([sum(row[:ctx.rank]) for row in ctx.counts], dtype=torch.int64, device=idx.device)
    return ctx.pattern.values(src, idx - (ends - ours)[src] + skipped[src])


ALLTOALLV = register(Collective(
    "alltoallv", "alltoallv",
    layout=_variable, bus_factor=_scatter_factor, moved=lambda lay, n: max(lay.send_count, lay.recv_count),
    has_op=False, has_root=False, printed_op="none",
    in_place_checked=False, checked_on=_everyone,
    expected=_from_each_sender,
    call=lambda b, s, r, op, root, lay: b.alltoallv(s, r, lay),
))


def lookup(name: str) -> Collective:
    """Find a collective by CLI name, nccl-tests name, or `<name>_perf` binary name."""
    key = name.strip().lower().replace("-", "_")
    for suffix in ("_perf_mpi", "_perf"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    for c in REGISTRY.values():
        if key in (c.name, c.command):
            return c
    raise KeyError(name)
