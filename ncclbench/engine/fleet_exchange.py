"""One rank's measurements for `ncclbench fleet`: a pair exchange with one peer and a
node's local collectives, each timed by the one timing engine and bounded by a deadline.

A pair runs on a two-rank process group of its own, created by its two members only
(use_local_synchronization: no step of the whole world per pair). On gloo a timed-out wait
closes every connection of its group: a group per pair keeps a dead or hung partner from
breaking this rank's later pairs. On NCCL the group is a two-rank communicator, which
torch's point-to-point calls create per peer anyway.

The engine's host barrier is, for a pair, a one-byte exchange with the peer (the world is
never waited for): FleetPairBackend wraps the pair group's backend to say so."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

from ncclbench.engine.collectives import ALL_GATHER, ALL_REDUCE
from ncclbench.engine.pair_exchange import pattern_byte
from ncclbench.failpoints import failpoint

NODE_COLLECTIVES = (ALL_REDUCE, ALL_GATHER)  # a node's ranks alone: measure_node times these


class DeadlinePassed(Exception):
    """The exchange did not finish before its deadline."""


class PairLink:
    """Both directions between this rank and `peer` on a two-rank group, every wait bounded
    by `deadline` (time.monotonic())."""

    def __init__(self, dist, group, peer: int, send, recv, deadline: float, on_gpu: bool = False):
        self.dist, self.group, self.peer = dist, group, peer
        self.send, self.recv, self.deadline = send, recv, deadline
        self.on_gpu = on_gpu

    def exchange(self, send, recv) -> None:
        dist = self.dist
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"no time left for the exchange with rank {self.peer}")
        ops = [dist.P2POp(dist.isend, send, self.peer, group=self.group),
               dist.P2POp(dist.irecv, recv, self.peer, group=self.group)]
        for work in dist.batch_isend_irecv(ops):
            if self.on_gpu:
                # the stream waits, the host goes on, as in every other timed loop (a host
                # wait per exchange slowed the store's rank: docs/design/localisation.md);
                # a dead peer is left to the group's timeout (-T)
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=max(left, 0.001)))

    def __call__(self, _op_index: int = 0) -> None:
        self.exchange(self.send, self.recv)


class FleetPairBackend:
    """The pair group's backend for the timing engine, whose barrier is a one-byte exchange
    with the peer."""

    def __init__(self, backend, link: PairLink):
        self._backend, self._link = backend, link
        self._token = backend.alloc_bytes(1)[:1]
        self._echo = backend.alloc_bytes(1)[:1]

    def barrier(self) -> None:
        self._link.exchange(self._token, self._echo)
        self._backend.synchronize()

    def __getattr__(self, name):
        return getattr(self._backend, name)


def groups_made() -> int:
    """How many process groups this process has made. torch names a group made by its members
    only (use_local_synchronization) from its ranks and this count, so two ranks agree on a
    group's name only when they have made as many groups before it: every rank of a fleet run
    makes exactly one group per step (its node's, its pair's, or a spare one-rank group)."""
    from torch.distributed import distributed_c10d

    return len(distributed_c10d._world.pg_names)


def align_groups(dist, target: int) -> None:
    """Spare one-rank groups until this process has made `target` groups: a group whose
    set-up failed (a dead partner) was never counted, and the next pair would get a name
    its partner does not use."""
    while groups_made() < target:
        spare_group(dist)


def spare_group(dist) -> None:
    dist.new_group([dist.get_rank()], backend="gloo", use_local_synchronization=True)


def pair_group(dist, me: int, peer: int, backend: str, timeout_s: float):
    """The two-rank group of (me, peer); both call it, nobody else."""
    ranks = sorted((me, peer))
    return dist.new_group(ranks, timeout=timedelta(seconds=timeout_s), backend=backend,
                          use_local_synchronization=True)


def measure_pair(dist, backend_name: str, peer: int, nbytes: int, iters: int, warmup: int,
                 timeout_s: float, buffers: dict, target_s: float | None = None) -> dict:
    """One pair measurement with `peer`: {"s": seconds of the best timed exchange, "median_s":
    of the median one, "bytes": exchanged each way per exchange, "probe_s": the probe's}.
    With `target_s`, a short probe first sets the size so that the whole measurement takes
    about target_s (at most `nbytes`): a slow link gets fewer bytes, not more time. Raises on
    a failed exchange, on wrong data, and past `timeout_s` (group set-up included)."""
    from ncclbench.backends.torch_dist import TorchBackend
    from ncclbench.engine.timing import TimingSettings, measure

    begun = time.monotonic()
    deadline = begun + timeout_s
    me = dist.get_rank()
    group = pair_group(dist, me, peer, backend_name, timeout_s)
    failpoint("fleet.pair", rank=me)
    backend = TorchBackend.adopt(group)
    if "send" not in buffers:
        buffers["send"] = backend.alloc_bytes(nbytes)[:nbytes]
        buffers["recv"] = backend.alloc_bytes(nbytes)[:nbytes]
        buffers["send"].fill_(pattern_byte(me))
    link = PairLink(dist, group, peer, buffers["send"], buffers["recv"], deadline, on_gpu=backend.name == "nccl")
    paired = FleetPairBackend(backend, link)
    paired.barrier()  # connects the pair: the probe times the exchange, not the connection
    size, probe_s = nbytes, None
    if target_s is not None:
        size, probe_s = probe_size(backend, link, paired, nbytes, warmup + iters, target_s - (time.monotonic() - begun))
    send, recv = buffers["send"][:size], buffers["recv"][:size]
    recv.zero_()
    link.send, link.recv = send, recv
    for _ in range(warmup):
        link()
    timing = measure(paired, link, TimingSettings(iters=iters, per_iter=True))
    backend.synchronize()
    if not bool((recv == pattern_byte(peer)).all()):
        raise RuntimeError(f"wrong data from rank {peer}")
    samples = timing.per_iter_s or [timing.device_s]
    return {"s": min(samples), "median_s": statistics.median(samples), "bytes": size, "probe_s": probe_s}


PROBE_MIN = 64 << 10   # bytes: the probe's size is nbytes / 64, at least this (at most nbytes)
SIZE_STEP = 4096       # sizes chosen by time are multiples of this


def probe_size(backend, link: PairLink, paired, nbytes: int, exchanges: int, left_s: float) -> tuple[int, float]:
    """(bytes per exchange so that `exchanges` of them take about `left_s`, the probe's
    seconds): two timed exchanges of a probe size, the faster one judged (noise only slows).
    The two sides trade their probe times and time left and both use the slower probe and
    the shorter time left, so both pick the same size."""
    q = min(nbytes, max(PROBE_MIN, nbytes // 64))
    send, recv = link.send[:q], link.recv[:q]
    best = float("inf")
    for _ in range(2):
        paired.barrier()
        t0 = time.perf_counter()
        link.exchange(send, recv)
        backend.synchronize()
        best = min(best, time.perf_counter() - t0)
    torch = backend.torch
    mine = torch.tensor([best, left_s], dtype=torch.float64, device=backend.device)
    theirs = torch.zeros_like(mine)
    link.exchange(mine, theirs)
    backend.synchronize()
    other = theirs.tolist()
    probe_s, left = max(best, other[0]), min(left_s, other[1])
    want = q / probe_s * max(left, 0.0) / max(1, exchanges)
    size = int(min(nbytes, want)) // SIZE_STEP * SIZE_STEP
    return max(size, min(nbytes, SIZE_STEP)), probe_s


def measure_node(dist, backend_name: str, ranks: list[int], nbytes: int, iters: int, timeout_s: float) -> dict:
    """{collective: [seconds of each timed iteration on this rank]} of all_reduce and
    all_gather on this node's ranks alone (a group of them, created by them only); the
    node's time is ncclbench.locate.stats.aligned_best_time of its ranks' lists."""
    from ncclbench.backends.torch_dist import TorchBackend
    from ncclbench.engine.timing import TimingSettings, measure

    group = dist.new_group(sorted(ranks), timeout=timedelta(seconds=timeout_s), backend=backend_name,
                           use_local_synchronization=True)
    backend = TorchBackend.adopt(group)
    torch = backend.torch
    n = len(ranks)
    count = max(1, nbytes // 4 // n) * n
    data = torch.full((count,), float(dist.get_rank() % 7 + 1), device=backend.device)
    chunk = data[: count // n].clone()
    gathered = torch.empty(count, device=backend.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ops = {ALL_REDUCE.name: lambda _i: dist.all_reduce(data, op=dist.ReduceOp.MAX, group=group),
           ALL_GATHER.name: lambda _i: gather(gathered, chunk, group=group)}
    out = {}
    me = dist.get_rank()
    for name, op in ops.items():
        op = failpoint("fleet.node_op", op, rank=me, global_rank=me, synchronize=backend.synchronize)
        timing = measure(backend, op, TimingSettings(iters=iters, per_iter=True))
        out[name] = [float(f"{t:.6g}") for t in timing.per_iter_s or [timing.device_s]]  # short on the store
    return out
