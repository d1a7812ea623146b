"""One rank's measurements for `ncclbench fleet`: the one pair exchange and its sizing
rule (engine.pair_exchange) with one peer, and a node's local collectives, each timed by
the one timing engine and bounded by a deadline.

A pair runs on a two-rank process group of its own, created by its two members only
(use_local_synchronization: no step of the whole world per pair). On gloo a timed-out wait
closes every connection of its group: a group per pair keeps a dead or hung partner from
breaking this rank's later pairs. On NCCL the group is a two-rank communicator, which
torch's point-to-point calls create per peer anyway.

The engine's host barrier is, for a pair, a one-byte exchange with the peer (the world is
never waited for): FleetPairBackend wraps the pair group's backend to say so."""

from __future__ import annotations

import time
from datetime import timedelta

from ncclbench.engine.collectives import ALL_GATHER, ALL_REDUCE
from ncclbench.engine.pair_exchange import (PairExchange, pair_effort, pattern_byte, probe_pair, sized_exchanges,
                                            timed_best)
from ncclbench.failpoints import failpoint

NODE_COLLECTIVES = (ALL_REDUCE, ALL_GATHER)  # a node's ranks alone: measure_node times these


class FleetPairBackend:
    """The pair group's backend for the timing engine, whose barrier is a one-byte exchange
    with the peer."""

    def __init__(self, backend, link):
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
    """One pair measurement with `peer` by the one pair exchange (engine.pair_exchange):
    {"s": seconds of the best timed exchange, "bytes": exchanged each way per exchange}.
    With `target_s`, a probe sets bytes and iterations by pair_effort so that the whole
    measurement takes about target_s (what is left of it after the group's set-up). Raises
    on a failed exchange, on wrong data, and past `timeout_s` (group set-up included)."""
    from ncclbench.backends.torch_dist import TorchBackend

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
    link = PairExchange(peer, buffers["send"], buffers["recv"], group, deadline, on_gpu=backend.name == "nccl")
    paired = FleetPairBackend(backend, link)
    paired.barrier()  # connects the pair: the probe times the exchange, not the connection
    size = nbytes
    at = sized_exchanges(link, me, me, backend.synchronize)
    if target_s is not None:
        probed, seconds, left = probe_pair(backend, at, nbytes, target_s - (time.monotonic() - begun),
                                           lambda mine: _trade(backend, link, mine))
        size, iters = pair_effort(seconds, probed, nbytes, iters, warmup, left)
    exchange, recv = at(size), link.on(size).recv
    recv.zero_()
    for _ in range(warmup):
        exchange()
    best = timed_best(paired, exchange, iters)
    backend.synchronize()
    if not bool((recv == pattern_byte(peer)).all()):
        raise RuntimeError(f"wrong data from rank {peer}")
    return {"s": best, "bytes": size}


def _trade(backend, link: PairExchange, mine: tuple) -> tuple:
    """The partner's numbers for this rank's (both sides call it at once)."""
    torch = backend.torch
    out = torch.tensor(list(mine), dtype=torch.float64, device=backend.device)
    theirs = torch.zeros_like(out)
    link.exchange(out, theirs)
    backend.synchronize()
    return tuple(theirs.tolist())


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
