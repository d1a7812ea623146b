"""Send/recv bandwidth between every pair of ranks of one job, to find
the one slow link, NIC or GPU that drags every collective down.

Pairs are measured in rounds of a round-robin tournament (the circle method): in each
round every rank is in exactly one pair (with an odd world one rank sits out), so a job
of n ranks needs n-1 rounds (n with n odd) instead of n(n-1)/2 one-pair-at-a-time steps,
and pairs running side by side load the fabric as collectives do. Within a pair both
ranks send and receive at once (batch_isend_irecv), so each pair's figure is the
bandwidth per direction while both directions are busy.

Timing uses the engine every collective uses (ncclbench.engine.timing.measure): one untimed
exchange, a barrier, `iters` exchanges between two device marks. A pair's time is the
slower of its two ranks' (the exchange is over when both sides are done); its busbw is
bytes / time. Rank 0 prints the matrix and the pairs furthest below the median;
--fail-below X% makes the exit code 1 when any pair is more than X% below it.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import statistics
import sys
from dataclasses import dataclass

from ncclbench.engine import pathread
from ncclbench.errors import BenchError, CollectiveError, ExitCode, PlanError, first_line, ranks_list
from ncclbench.sizes import format_size

SHOWN_SLOWEST = 5  # pairs listed under the matrix when nothing is flagged


# ---------------------------------------------------------------------------
# Pure parts: schedule and verdict (unit-tested without processes)
# ---------------------------------------------------------------------------

def tournament_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of pairs (a, b), a < b, covering every pair of range(n) exactly once, each
    rank in at most one pair per round. Circle method: rank 0 stays put while the
    others rotate one seat per round; with n odd a phantom seat makes the rank facing
    it sit that round out."""
    if n < 2:
        return []
    seats = list(range(n)) + ([None] if n % 2 else [])
    m = len(seats)
    rounds = []
    for _ in range(m - 1):
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        seats = [seats[0], seats[-1], *seats[1:-1]]  # rotate everyone but seat 0
    return rounds


def peer_in_round(pairs: list[tuple[int, int]], rank: int) -> int | None:
    """This rank's partner in a round, or None when it sits the round out."""
    for a, b in pairs:
        if rank == a:
            return b
        if rank == b:
            return a
    return None


def pair_busbw(times: list[dict[int, float]], nbytes: int) -> list[list[float | None]]:
    """Symmetric matrix of GB/s per direction from each rank's {peer: seconds per exchange};
    a pair's time is the slower side's. None on the diagonal."""
    n = len(times)
    matrix: list[list[float | None]] = [[None] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            seconds = max(times[a][b], times[b][a])
            matrix[a][b] = matrix[b][a] = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
    return matrix


def pair_values(matrix) -> list[tuple[int, int, float]]:
    """(a, b, busbw) for every pair a < b of a symmetric matrix."""
    n = len(matrix)
    return [(a, b, matrix[a][b]) for a in range(n) for b in range(a + 1, n)]


def below_median(matrix) -> list[tuple[int, int, float, float]]:
    """Every pair as (a, b, busbw, % below the median pair), slowest first. The median,
    not the mean or the best, is the reference: one bad link must not move it."""
    values = pair_values(matrix)
    if not values:
        return []
    median = statistics.median(v for _, _, v in values)
    out = [(a, b, v, 100.0 * (median - v) / median if median > 0 else 0.0) for a, b, v in values]
    return sorted(out, key=lambda item: (item[2], item[0], item[1]))


def slow_pairs(matrix, threshold: float) -> list[tuple[int, int, float, float]]:
    """Pairs more than `threshold` percent below the median pair, slowest first, as
    (a, b, busbw, % below median)."""
    return [item for item in below_median(matrix) if item[3] > threshold]


def parse_percent(text: str) -> float:
    """'20%' or '20' -> 20.0; a percentage strictly between 0 and 100."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise PlanError(f"--fail-below must be a percentage such as 20% (got {text!r})") from None
    if not 0 < value < 100:
        raise PlanError(f"--fail-below must be between 0% and 100% (got {text!r})")
    return value


# ---------------------------------------------------------------------------
# One rank's measurement
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PairsPlan:
    nbytes: int
    iters: int
    warmup_iters: int
    backend: str
    timeout_s: float
    fail_below: float | None
    json_path: str | None
    csv_path: str | None
    pair_cap_s: float | None = None  # seconds one pair may take per round (preflight); None: no cap
    metrics_path: str | None = None  # --metrics: Prometheus text of the pairs

    def fingerprint(self) -> tuple:
        """What every rank must agree on, or the rounds would not line up."""
        return (self.nbytes, self.iters, self.warmup_iters, self.backend)


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


def measure_rounds(backend, plan: PairsPlan, rounds) -> tuple[dict[int, float], list[int]]:
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
        times[peer] = _timed(backend, exchange, iters, capped) * plan.nbytes / nbytes
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
    return min(timing.per_iter_s) if best and timing.per_iter_s else timing.device_s


def first_collective(backend) -> None:
    """A world-wide op before any pair: NCCL wants the first call on a communicator to
    involve every rank (torch's batch_isend_irecv note), and it sets up the comm now
    rather than inside the first pair's timing."""
    import torch

    t = torch.ones(1, device=backend.device)
    backend.dist.all_reduce(t)
    backend.synchronize()


def agree(backend, plan: PairsPlan) -> None:
    everyone = backend.all_gather_object(plan.fingerprint())
    differ = [r for r, fp in enumerate(everyone) if fp != everyone[0]]
    if differ:
        raise PlanError(f"rank(s) {ranks_list(differ)} run pairs with other options than rank 0; "
                        "every rank must get the same options")


def device_line(backend) -> dict:
    info = backend.device_info()
    return {"rank": backend.rank, "pid": os.getpid(), "host": socket.gethostname(),
            "device": info["device"], "device_hex": info["device_hex"], "device_info": info["device_info"]}


def run_rank(plan: PairsPlan, info) -> int:
    """One rank's whole job. Every rank ends with the same verdict (each computes it from
    the same gathered numbers); rank 0 prints and writes the files."""
    from ncclbench.launch import launcher as launch
    from ncclbench.backends import create_backend

    launch.prepare_environ(info)
    backend = create_backend(plan.backend, info, plan.timeout_s)
    try:
        agree(backend, plan)
        devices = backend.all_gather_object(device_line(backend))
        rounds = tournament_rounds(backend.nranks)
        try:
            first_collective(backend)
            mine = measure_rounds(backend, plan, rounds)
            path = pathread.gather(backend) if plan.backend != "gloo" else None  # each rank's NCCL log, to rank 0
        except BenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed exchange ends the run in one line
            raise CollectiveError(f"pair exchange failed: {first_line(exc)}") from exc
        everyone = backend.all_gather_object(mine)
    finally:
        backend.close()
    result = PairsResult(plan, devices, rounds, [t for t, _ in everyone],
                         sorted({(min(r, p), max(r, p)) for r, (_, w) in enumerate(everyone) for p in w}))
    result.path = path
    if info.rank == 0:
        sys.stdout.write("\n".join(result.report_lines(backend.timing_name())) + "\n")
        sys.stdout.flush()
        result.write_files()
    return result.exit_code()


# ---------------------------------------------------------------------------
# Rank 0's report
# ---------------------------------------------------------------------------

def format_gbps(value: float) -> str:
    """At most 8 characters, about 4 significant digits, so matrix columns stay apart
    from NVLink rates (hundreds of GB/s) down to gloo on a laptop (1e-05)."""
    if value >= 1000:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.4g}"
    if value >= 0.001:
        return f"{value:.4f}"
    return f"{value:.2e}"


class PairsResult:
    def __init__(self, plan: PairsPlan, devices: list[dict], rounds, times, wrong_pairs):
        self.plan = plan
        self.devices = devices
        self.rounds = rounds
        self.matrix = pair_busbw(times, plan.nbytes)
        self.ranked = below_median(self.matrix)
        self.flagged = slow_pairs(self.matrix, plan.fail_below) if plan.fail_below is not None else []
        self.wrong_pairs = wrong_pairs
        self.path = None  # the path NCCL's log named (pathread.gather), rank 0's
        values = [v for _, _, v in pair_values(self.matrix)]
        self.median = statistics.median(values) if values else 0.0

    def exit_code(self) -> int:
        if self.wrong_pairs:
            return ExitCode.WRONG_RESULTS
        return ExitCode.REGRESSION if self.flagged else ExitCode.OK

    def host(self, rank: int) -> str:
        return self.devices[rank]["host"]

    def report_lines(self, timing: str) -> list[str]:
        p, n = self.plan, len(self.devices)
        hosts = sorted({d["host"] for d in self.devices})
        per_round = max((len(r) for r in self.rounds), default=0)
        lines = [
            f"# ncclbench pairs: {n} ranks on {len(hosts)} node{'s' if len(hosts) != 1 else ''} ({', '.join(hosts)}), "
            f"backend {p.backend} ({timing})",
            f"# {format_size(p.nbytes)} each way per exchange, both directions at once; "
            f"warmup iters: {p.warmup_iters} iters: {p.iters}",
            f"# {len(self.rounds)} rounds of {per_round} pair{'s' if per_round != 1 else ''} side by side (round-robin"
            f"{'; one rank idle per round' if n % 2 else ''})",
            "#", "# Using devices",
        ]
        for d in self.devices:
            lines.append(f"#  Rank {d['rank']:2d} Pid {d['pid']:6d} on {d['host']:>10s} "
                         f"device {d['device']:2d} [{d['device_hex']}] {d['device_info']}")
        lines += ["#"] + [f"# {line}" for line in pathread.header_lines(self.path, p.backend)]
        lines += ["#", "# busbw per direction (GB/s); a pair's time is its slower rank's"]
        lines += self.matrix_lines()
        lines += ["#", f"# Median pair busbw: {self.median:.4g} GB/s"]
        lines += self.verdict_lines()
        return lines

    def matrix_lines(self) -> list[str]:
        n = len(self.devices)
        width = max([10] + [len(self.host(r)) for r in range(n)])
        lines = [f"# {'rank':>4s} {'host':<{width}s}" + "".join(f"{c:>9d}" for c in range(n))]
        for r in range(n):
            cells = "".join(f"{'-' if v is None else format_gbps(v):>9s}" for v in self.matrix[r])
            lines.append(f"  {r:4d} {self.host(r):<{width}s}{cells}")
        return lines

    def verdict_lines(self) -> list[str]:
        lines = []
        for a, b in self.wrong_pairs:
            lines.append(f"# WRONG DATA between ranks {a} ({self.host(a)}) and {b} ({self.host(b)})")
        if self.plan.fail_below is not None:
            if self.flagged:
                lines.append(f"# {len(self.flagged)} pair(s) more than {self.plan.fail_below:g}% below the median:")
            else:
                lines.append(f"# No pair more than {self.plan.fail_below:g}% below the median: OK")
        # without flagged pairs: the few slowest, as long as they are below the median
        shown = self.flagged or [item for item in self.ranked[:SHOWN_SLOWEST] if item[3] > 0]
        if not self.flagged:
            lines.append("# Slowest pairs:" if shown else "# No pair below the median")
        for a, b, v, pct in shown:
            side = "below" if pct >= 0 else "above"
            via = self.pair_path(a, b)
            lines.append(f"#   {a:3d} <-> {b:<3d} {format_gbps(v):>9s} GB/s  {abs(pct):6.1f}% {side} median  "
                         f"({self.host(a)} - {self.host(b)}{', via ' + via if via else ''})")
        return lines

    def pair_path(self, a: int, b: int) -> str | None:
        """The transports NCCL's log named between ranks a and b (either way), or None."""
        if self.path is None:
            return None
        kinds = [k for k, pairs in self.path.transports().items() if (a, b) in pairs or (b, a) in pairs]
        return " + ".join(kinds) or None

    # ---- files ----------------------------------------------------------------------
    def pair_records(self) -> list[dict]:
        flagged = {(a, b) for a, b, _, _ in self.flagged}
        wrong = set(self.wrong_pairs)
        return [{"rank_a": a, "rank_b": b, "host_a": self.host(a), "host_b": self.host(b),
                 "size_bytes": self.plan.nbytes, "time_us": self.plan.nbytes / v / 1e3 if v else None,
                 "busbw_gbps": v, "below_median_pct": pct, "flagged": (a, b) in flagged,
                 "wrong_data": (a, b) in wrong, "path": self.pair_path(a, b)}
                for a, b, v, pct in sorted(self.ranked, key=lambda item: item[:2])]

    def write_files(self) -> None:
        if self.plan.json_path:
            doc = {"size_bytes": self.plan.nbytes, "iters": self.plan.iters,
                   "warmup_iters": self.plan.warmup_iters, "backend": self.plan.backend,
                   "nranks": len(self.devices), "devices": self.devices,
                   "rounds": [[list(p) for p in r] for r in self.rounds],
                   "median_busbw_gbps": self.median, "fail_below_pct": self.plan.fail_below,
                   "busbw_gbps": self.matrix, "pairs": self.pair_records(),
                   "nccl_path": self.path.to_dict() if self.path is not None else None}
            with open(self.plan.json_path, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
        if self.plan.metrics_path:
            from ncclbench.results.metrics import write_report_files

            records = self.pair_records()
            links = [{"ranks": [r["rank_a"], r["rank_b"]], "hosts": [r["host_a"], r["host_b"]],
                      "below_pct": r["below_median_pct"], "path": r["path"]} for r in records if r["flagged"]]
            write_report_files("pairs", {"command": "pairs", "pairs": records, "links": links,
                                         "exit_code": int(self.exit_code()),
                                         "nccl_path": self.path.to_dict() if self.path is not None else None},
                               self.plan.backend, self.plan.metrics_path)
        if self.plan.csv_path:
            records = self.pair_records()
            with open(self.plan.csv_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["rank_a"])
                writer.writeheader()
                writer.writerows(records)
