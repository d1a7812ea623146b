"""The one pair exchange: both directions between this rank and one peer at once
(batch_isend_irecv), so a pair's figure is the bandwidth per direction while both
directions are busy; rounds of disjoint pairs measured side by side, each pair timed by the
engine every collective uses (ncclbench.engine.timing.measure).

Where a pair's time is capped, one sizing rule, by measured time, sets its bytes and
iterations (probe_pair, pair_effort). Used by `pairs`, preflight's pair sweeps and
localisation rounds (engine.pair_rounds), and, on two-rank groups of their own, `fleet`'s
node pairs (engine.fleet_exchange)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

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
    """Both directions between this rank and `peer` at once (on `group`; None: the default
    group). With `deadline` (time.monotonic()), no exchange starts past it and a host-side
    wait is bounded by it; on the GPU (`on_gpu`) the stream waits and the host goes on, a
    dead peer left to the group's timeout."""

    def __init__(self, peer: int, send, recv, group=None, deadline: float | None = None, on_gpu: bool = False):
        import torch.distributed as dist

        self.dist, self.peer, self.group = dist, peer, group
        self.send, self.recv = send, recv
        self.deadline, self.on_gpu = deadline, on_gpu

    def on(self, nbytes: int) -> "PairExchange":
        """The same exchange on the first `nbytes` of the buffers (itself at its full size)."""
        if nbytes >= self.send.numel():
            return self
        return PairExchange(self.peer, self.send[:nbytes], self.recv[:nbytes], self.group, self.deadline, self.on_gpu)

    def exchange(self, send, recv) -> None:
        dist = self.dist
        timeout = None
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise DeadlinePassed(f"no time left for the exchange with rank {self.peer}")
            timeout = None if self.on_gpu else timedelta(seconds=max(left, 0.001))
        ops = [dist.P2POp(dist.isend, send, self.peer, group=self.group),
               dist.P2POp(dist.irecv, recv, self.peer, group=self.group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait() if timeout is None else work.wait(timeout=timeout)

    def __call__(self, _op_index: int = 0) -> None:
        self.exchange(self.send, self.recv)


class DeadlinePassed(Exception):
    """The exchange did not finish before its deadline."""


def sized_exchanges(full: PairExchange | None, rank: int, global_rank: int, synchronize):
    """at(nbytes): `full` on its first `nbytes` (None where this rank is idle), through the
    pairs.exchange failpoint, where a planted slow exchange acts on every command's pairs
    (inside the timed region)."""
    from ncclbench.failpoints import failpoint

    def at(nbytes: int):
        return None if full is None else failpoint("pairs.exchange", full.on(nbytes), rank=rank,
                                                   global_rank=global_rank, synchronize=synchronize)
    return at


def pair_rate(nbytes: int, seconds_a: float, seconds_b: float) -> float:
    """GB/s per direction of a pair whose two sides took these seconds per exchange of
    `nbytes` each way: the slower side's (the exchange is over when both sides are done)."""
    slowest = max(seconds_a, seconds_b)
    return nbytes / slowest / 1e9 if slowest > 0 else float("inf")


def pair_busbw(times: list[dict], nbytes: int) -> dict:
    """{(a, b): GB/s per direction} (pair_rate) of the pairs measured, a < b, from each
    rank's {peer: seconds per exchange}."""
    return {(a, b): pair_rate(nbytes, seconds, times[b][a])
            for a, mine in enumerate(times) for b, seconds in mine.items() if a < b and a in times[b]}


def pattern_byte(rank: int) -> int:
    """Byte every element of `rank`'s send buffer holds, so a receiver can tell whose data
    (and whether all of it) arrived."""
    return rank % 251 + 1


MIN_PAIR_BYTES = 4096
MIN_CAPPED_ITERS = 2
OPS_AROUND = 5  # per measurement, besides the timed and warm-up ones: the timing engine's untimed op and its four aligning ops
PROBE_MIN_BYTES = 64 << 10  # the first probe: 1/64 of the bytes, at least this (at most all of them)
PROBE_SHARE = 0.25  # of a pair's cap: the most its second probe may take, at the first probe's rate


def probe_bytes(nbytes: int) -> int:
    """Bytes of a pair's first probe: small, so that a link far slower than the cap allows
    costs little to find out."""
    return min(nbytes, max(PROBE_MIN_BYTES, nbytes // 64))


def second_probe_bytes(probe_s: float, probed: int, nbytes: int, cap_s: float) -> int:
    """Bytes of a pair's second probe: the most, doubling from the first probe's size up to
    all `nbytes`, that one exchange moves in PROBE_SHARE of the cap at the first probe's
    rate (`probed` itself: no second probe). A small probe's time is mostly latency; sized
    by it alone, a healthy pair would lose iterations or bytes it has time for."""
    size = probed
    while size < nbytes and probe_s * min(nbytes, 2 * size) / probed <= PROBE_SHARE * cap_s:
        size = min(nbytes, 2 * size)
    return size


def pair_effort(probe_s: float, probed: int, nbytes: int, iters: int, warmups: int,
                cap_s: float | None) -> tuple[int, int]:
    """The one sizing rule of a pair measurement, by measured time: (bytes, timed
    iterations) of `nbytes` and `iters` so that `warmups` + iterations + OPS_AROUND
    exchanges fit `cap_s`, from a probe that took `probe_s` for `probed` bytes. Fewer
    iterations first, down to MIN_CAPPED_ITERS, then (a pair far slower than the cap allows)
    fewer bytes, halved down to MIN_PAIR_BYTES: bytes go last, since a pair moved to a size
    where latency sets its time reads slower than its link. Without a cap: unchanged."""
    if cap_s is None or probe_s <= 0:
        return nbytes, iters
    per = probe_s * nbytes / probed  # one full exchange at the probe's rate
    fit = int(cap_s / per) - OPS_AROUND - warmups
    least = min(iters, MIN_CAPPED_ITERS)
    if fit >= least:
        return nbytes, min(iters, fit)
    size = nbytes
    while size // 2 >= MIN_PAIR_BYTES and (least + OPS_AROUND + warmups) * per * size / nbytes > cap_s:
        size //= 2
    return size, least


def probe_pair(backend, at, nbytes: int, cap_s: float, trade) -> tuple[int, float, float]:
    """(bytes probed, seconds of one exchange of them on the slower side, the cap left for
    the measurement): the best of two exchanges of probe_bytes(nbytes) (noise only slows),
    then one of second_probe_bytes where that is larger. `at(bytes)` is the exchange on that
    many bytes (None: this rank is idle); each probe is lined up first by a small untimed
    exchange, so that neither side times its wait for a partner still busy elsewhere.
    `trade((seconds, cap))` gives the partner's pair; every rank calls it twice, idle or not,
    and both sides decide from the same numbers (the slower probe, the smaller cap, less
    what the probes took)."""
    q = probe_bytes(nbytes)
    mine = min(_timed_once(backend, at, q), _timed_once(backend, at, q))
    theirs = trade((mine, cap_s))
    first, cap = max(mine, theirs[0]), min(cap_s, theirs[1])
    size = second_probe_bytes(first, q, nbytes, cap) if at(q) is not None else q
    mine = _timed_once(backend, at, size) if size > q else 0.0
    theirs = trade((mine, cap))
    second = max(mine, theirs[0])
    left = max(0.0, cap - 2 * first - second)
    return (size, second, left) if size > q else (q, first, left)


def timed_best(backend, exchange, iters: int) -> float:
    """Seconds of the fastest of `iters` timed exchanges (what the pair reaches: noise on a
    shared host only slows an exchange; locate.stats), timed by the one timing engine."""
    from ncclbench.engine.timing import TimingSettings, measure

    timing = measure(backend, exchange, TimingSettings(iters=iters, per_iter=True))
    return best_time(timing.per_iter_s) if timing.per_iter_s else timing.device_s


def measure_rounds(backend, plan: ExchangePlan, rounds) -> tuple[dict[int, float], list[int]]:
    """This rank's seconds per exchange with each peer (its fastest exchange's), and the
    peers whose data arrived wrong. Every rank runs measure() once per round, idle or not: it
    holds a barrier. With `plan.pair_cap_s`, each pair is probed (probe_pair(), every rank
    learning every probe) and runs the effort pair_effort gives it, the same on both sides;
    a pair run on fewer bytes reports its time scaled to `plan.nbytes` (the same bytes per
    second)."""
    import torch.distributed as dist

    send = backend.alloc_bytes(plan.nbytes)[: plan.nbytes]
    recv = backend.alloc_bytes(plan.nbytes)[: plan.nbytes]
    send.fill_(pattern_byte(backend.rank))
    times: dict[int, float] = {}
    wrong: list[int] = []
    on_gpu = backend.name == "nccl"
    for pairs in rounds:
        peer = peer_in_round(pairs, backend.rank)
        full = None if peer is None else PairExchange(peer, send, recv, on_gpu=on_gpu)
        at = sized_exchanges(full, backend.rank, dist.get_rank(), backend.synchronize)
        nbytes, iters, warmups = plan.nbytes, plan.iters, plan.warmup_iters
        if plan.pair_cap_s is not None:
            def trade(mine, peer=peer):
                everyone = backend.all_gather_object(mine)
                return everyone[peer] if peer is not None else mine
            probed, seconds, cap = probe_pair(backend, at, plan.nbytes, plan.pair_cap_s, trade)
            warmups = 0  # the probes warmed the pair up
            nbytes, iters = pair_effort(seconds, probed, plan.nbytes, plan.iters, warmups, cap)
        if peer is None:
            timed_best(backend, lambda _i: None, iters)  # sit out, but keep the barriers in step
            continue
        exchange = at(nbytes)
        recv.zero_()
        for _ in range(warmups):
            exchange()
        times[peer] = timed_best(backend, exchange, iters) * plan.nbytes / nbytes
        backend.synchronize()
        if not bool((recv[:nbytes] == pattern_byte(peer)).all()):
            wrong.append(peer)
    return times, wrong


def _timed_once(backend, at, nbytes: int) -> float:
    """Seconds of one exchange of `nbytes` (host clock around it and the device; 0.0 when
    idle), after a small untimed one that lines the two sides up."""
    exchange = at(nbytes)
    if exchange is None:
        return 0.0
    at(min(MIN_PAIR_BYTES, nbytes))()
    backend.synchronize()
    start = time.perf_counter()
    exchange()
    backend.synchronize()
    return time.perf_counter() - start


def first_collective(backend) -> None:
    """A world-wide op before any pair: NCCL wants the first call on a communicator to
    involve every rank (torch's batch_isend_irecv note), and it sets up the comm now
    rather than inside the first pair's timing."""
    import torch

    t = torch.ones(1, device=backend.device)
    backend.dist.all_reduce(t)
    backend.synchronize()
