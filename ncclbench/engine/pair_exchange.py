"""The one pair exchange: both directions between this rank and one peer at once
(batch_isend_irecv), so a pair's figure is the bandwidth per direction while both
directions are busy; rounds of disjoint pairs measured side by side, each pair timed by the
engine every collective uses (ncclbench.engine.timing.measure).

Used by `pairs`, preflight's pair sweeps and localisation rounds (engine.pair_rounds), and,
on two-rank groups of their own, `fleet`'s node pairs (engine.fleet_exchange)."""

from __future__ import annotations

from dataclasses import dataclass

from ncclbench.locate.schedule import peer_in_round
from ncclbench.locate.stats import best_time


@dataclass(frozen=True)
class ExchangePlan:
    """What one pass of rounds exchanges: bytes each way, timed and warm-up exchanges per
    pair, and the seconds one pair may take per round (None: no cap)."""

    nbytes: int
    iters: int
    warmup_iters: int
    pair_cap_s: float | None = None


class PairExchange:
    """Both directions between this rank and one peer, on fixed buffers."""

    def __init__(self, backend, peer: int, send, recv):
        import torch.distributed as dist

        self.dist = dist
        self.backend = backend
        self.peer = peer
        self.send, self.recv = send, recv

    def __call__(self, _op_index: int = 0) -> None:
        dist = self.dist
        ops = [dist.P2POp(dist.isend, self.send, self.peer), dist.P2POp(dist.irecv, self.recv, self.peer)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()


def pair_busbw(times: list[dict], nbytes: int) -> dict:
    """{(a, b): GB/s per direction} of the pairs measured, a < b, from each rank's {peer:
    seconds per exchange}: a pair's time is its slower side's (the exchange is over when
    both sides are done)."""
    out = {}
    for a, mine in enumerate(times):
        for b, seconds in mine.items():
            if a < b and a in times[b]:
                slowest = max(seconds, times[b][a])
                out[(a, b)] = nbytes / slowest / 1e9 if slowest > 0 else float("inf")
    return out


def pattern_byte(rank: int) -> int:
    """Byte every element of `rank`'s send buffer holds, so a receiver can tell whose data
    (and whether all of it) arrived."""
    return rank % 251 + 1


MIN_PAIR_BYTES = 4096
MIN_CAPPED_ITERS = 2
OPS_AROUND = 5  # per pair and round, besides the timed ones: the timing engine's untimed op and its four aligning ops


def pair_effort(probe_s: float, nbytes: int, iters: int, cap_s: float | None) -> tuple[int, int]:
    """(bytes, timed iterations) for a pair whose first exchange of `nbytes` took `probe_s`,
    so that its round fits `cap_s`: fewer iterations first, then (a pair far slower than
    the cap allows) fewer bytes, halved down to MIN_PAIR_BYTES. Without a cap: unchanged."""
    if cap_s is None or probe_s <= 0:
        return nbytes, iters
    per = probe_s
    fit = int(cap_s / per) - OPS_AROUND
    if fit >= MIN_CAPPED_ITERS:
        return nbytes, min(iters, fit)
    size = nbytes
    while size // 2 >= MIN_PAIR_BYTES and (MIN_CAPPED_ITERS + OPS_AROUND) * per * size / nbytes > cap_s:
        size //= 2
    return size, MIN_CAPPED_ITERS


def measure_rounds(backend, plan: ExchangePlan, rounds) -> tuple[dict[int, float], list[int]]:
    """This rank's seconds per exchange with each peer, and the peers whose data arrived
    wrong. Every rank runs measure() once per round, idle or not: it holds a barrier. With
    `plan.pair_cap_s`, each pair lines up with a small untimed exchange, then its first
    exchange is timed, every rank learns every probe, and each pair runs the effort
    pair_effort gives its longer probe (the same on both sides); a pair run
    on fewer bytes reports its time scaled to `plan.nbytes` (the same bytes per second),
    and each pair's time is its fastest iteration's."""
    import torch.distributed as dist

    from ncclbench.failpoints import failpoint

    send = backend.alloc_bytes(plan.nbytes)[: plan.nbytes]
    recv = backend.alloc_bytes(plan.nbytes)[: plan.nbytes]
    send.fill_(pattern_byte(backend.rank))
    times: dict[int, float] = {}
    wrong: list[int] = []
    for pairs in rounds:
        peer = peer_in_round(pairs, backend.rank)
        exchange = None
        if peer is not None:
            recv.zero_()
            # a failpoint here can slow this rank's exchanges (a slow node, inside the timed region)
            exchange = failpoint("pairs.exchange", PairExchange(backend, peer, send, recv), rank=backend.rank,
                                 global_rank=dist.get_rank(), synchronize=backend.synchronize)
        nbytes, iters, warmups = plan.nbytes, plan.iters, plan.warmup_iters
        capped = plan.pair_cap_s is not None
        if capped:
            if exchange is not None:
                # untimed, small: the two sides leave it together, so the probe does not time
                # one side's wait for a partner still in its previous round (that wait cut a
                # healthy pair after a slow rank's pair to 1/16 of the bytes, latency-bound,
                # and its time scaled back up read 30x slow: a false slow link); a partner's
                # own delay per exchange (a slow rank) still lands in the probe
                _sliced(backend, exchange, peer, send, recv, min(MIN_PAIR_BYTES, plan.nbytes), plan.nbytes)()
            probe = _timed_once(backend, exchange)
            everyone = backend.all_gather_object(probe)
            warmups = 0  # the probe was the warm-up
            if peer is not None:
                nbytes, iters = pair_effort(max(probe, everyone[peer]), plan.nbytes, plan.iters, plan.pair_cap_s)
        if peer is None:
            _timed(backend, lambda _i: None, iters, capped)  # sit out, but keep the barriers in step
            continue
        exchange = _sliced(backend, exchange, peer, send, recv, nbytes, plan.nbytes)
        for _ in range(warmups):
            exchange()
        # at its best, as every pair is judged (locate.stats): noise only slows an exchange
        times[peer] = _timed(backend, exchange, iters, best=True) * plan.nbytes / nbytes
        backend.synchronize()
        if not bool((recv[:nbytes] == pattern_byte(peer)).all()):
            wrong.append(peer)
    return times, wrong


def _sliced(backend, exchange, peer: int, send, recv, nbytes: int, full: int):
    """The exchange on the first `nbytes` of the buffers (itself at `full`), through the
    same failpoint."""
    if nbytes >= full:
        return exchange
    import torch.distributed as dist

    from ncclbench.failpoints import failpoint

    return failpoint("pairs.exchange", PairExchange(backend, peer, send[:nbytes], recv[:nbytes]),
                     rank=backend.rank, global_rank=dist.get_rank(), synchronize=backend.synchronize)


def _timed_once(backend, exchange) -> float:
    """Seconds of one exchange, host clock around it and the device (0.0 when idle)."""
    import time

    if exchange is None:
        return 0.0
    backend.synchronize()
    start = time.perf_counter()
    exchange()
    backend.synchronize()
    return time.perf_counter() - start


def _timed(backend, exchange, iters: int, best: bool = False) -> float:
    """Seconds per exchange: the mean over `iters`, or with `best` the fastest iteration
    (what the pair reaches: noise on a shared host only ever slows an iteration)."""
    from ncclbench.engine.timing import TimingSettings, measure

    timing = measure(backend, exchange, TimingSettings(iters=iters, per_iter=best))
    return best_time(timing.per_iter_s) if best and timing.per_iter_s else timing.device_s


def first_collective(backend) -> None:
    """A world-wide op before any pair: NCCL wants the first call on a communicator to
    involve every rank (torch's batch_isend_irecv note), and it sets up the comm now
    rather than inside the first pair's timing."""
    import torch

    t = torch.ones(1, device=backend.device)
    backend.dist.all_reduce(t)
    backend.synchronize()
