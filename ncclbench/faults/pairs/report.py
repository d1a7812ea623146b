"""Rank 0's report of a `ncclbench pairs` run: the matrix, the slowest pairs, the verdict in
the shape every fault-finding command shares (ncclbench.locate.finding), and the files."""

from __future__ import annotations

import csv
import json
import statistics

from ncclbench.engine import pathread
from ncclbench.errors import ExitCode
from ncclbench.sizes import format_size

SHOWN_SLOWEST = 5  # pairs listed under the matrix when nothing is flagged


def pair_matrix(busbw: dict, n: int) -> list[list[float | None]]:
    """The symmetric n x n matrix of {(a, b): GB/s}; None on the diagonal and where unmeasured."""
    matrix: list[list[float | None]] = [[None] * n for _ in range(n)]
    for (a, b), v in busbw.items():
        matrix[a][b] = matrix[b][a] = v
    return matrix


def below_median(busbw: dict) -> list[tuple[int, int, float, float]]:
    """Every pair as (a, b, busbw, % below the median pair), slowest first. The median, not
    the mean or the best, is the reference of this listing: one bad link must not move it."""
    if not busbw:
        return []
    median = statistics.median(busbw.values())
    out = [(a, b, v, 100.0 * (median - v) / median if median > 0 else 0.0) for (a, b), v in busbw.items()]
    return sorted(out, key=lambda item: (item[2], item[0], item[1]))


def slow_pairs(busbw: dict, threshold: float) -> list[tuple[int, int, float, float]]:
    """Pairs more than `threshold` percent below the median pair (--fail-below), slowest first."""
    return [item for item in below_median(busbw) if item[3] > threshold]


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
    def __init__(self, plan, devices: list[dict], rounds, screening: dict, wrong_pairs, loc=None, localised_rounds=0):
        from ncclbench.locate.finding import build

        self.plan = plan
        self.devices = devices
        self.rounds = rounds
        self.busbw = screening
        self.matrix = pair_matrix(screening, len(devices))
        self.ranked = below_median(screening)
        self.flagged = slow_pairs(screening, plan.fail_below) if plan.fail_below is not None else []
        self.wrong_pairs = wrong_pairs
        self.loc = loc
        self.localised_rounds = localised_rounds
        self.path = None  # the path NCCL's log named (pathread.gather), rank 0's
        self.median = statistics.median(screening.values()) if screening else 0.0
        where = {d["rank"]: (d["host"], [d["rank"]]) for d in devices}
        bad, links, suspects = loc.verdict(self.who) if loc is not None else ({}, {}, {})
        records = {pair: {"evidence": line, "below_pct": loc.pair_below(*pair)} for pair, line in links.items()}
        self.finding = build(where, {r: [f"{self.who(r)} is slow with every partner: {line}"] for r, line in bad.items()},
                             {r: [line] for r, line in suspects.items()}, records)
        for a, b in wrong_pairs:
            self.finding.notes.append(f"wrong data between ranks {a} ({self.host(a)}) and {b} ({self.host(b)})")
        if loc is not None:
            self.finding.notes += loc.unjudged_notes()

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.host(rank)})"

    def exit_code(self) -> int:
        if self.wrong_pairs:
            return ExitCode.WRONG_RESULTS
        return ExitCode.REGRESSION if self.flagged or self.finding.localised else ExitCode.OK

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
            f"{'; one rank idle per round' if n % 2 else ''}), then {self.localised_rounds} localisation round(s)",
            "#", "# Using devices",
        ]
        for d in self.devices:
            lines.append(f"#  Rank {d['rank']:2d} Pid {d['pid']:6d} on {d['host']:>10s} "
                         f"device {d['device']:2d} [{d['device_hex']}] {d['device_info']}")
        lines += ["#"] + [f"# {line}" for line in pathread.header_lines(self.path, p.backend)]
        lines += ["#", "# busbw per direction (GB/s) at the best timed exchange, the round-robin's; "
                       "a pair's time is its slower rank's"]
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
        lines += self.finding.lines()
        lines += [f"# Note: {n}" for n in self.finding.notes]
        if self.loc is not None:
            m = self.loc.margins()
            lines.append(f"# Worst fall below the reference: ranks {100 * m['endpoints']:.0f}%, "
                         f"pairs {100 * m['pairs']:.0f}% (slow beyond {100 * self.loc.band:.0f}% for ranks, "
                         f"{100 * self.loc.link_band:.0f}% for a pair)")
        verdict = (f"{len(self.finding.drain)} host(s) to drain, {len(self.finding.links)} slow link(s)"
                   if self.finding.localised else "nothing localised")
        lines.append(f"# Pairs {'FAILED' if self.exit_code() else 'passed'}: {verdict}")
        return lines

    def pair_path(self, a: int, b: int) -> str | None:
        """The transports NCCL's log named between ranks a and b (either way), or None."""
        if self.path is None:
            return None
        kinds = [k for k, pairs in self.path.transports().items() if (a, b) in pairs or (b, a) in pairs]
        return " + ".join(kinds) or None

    # ---- files ----------------------------------------------------------------------
    def pair_records(self) -> list[dict]:
        """One flat row per pair of the round-robin (the CSV's)."""
        flagged = {(a, b) for a, b, _, _ in self.flagged}
        wrong = set(self.wrong_pairs)
        return [{"rank_a": a, "rank_b": b, "host_a": self.host(a), "host_b": self.host(b),
                 "size_bytes": self.plan.nbytes, "time_us": self.plan.nbytes / v / 1e3 if v else None,
                 "busbw_gbps": v, "below_median_pct": pct, "flagged": (a, b) in flagged,
                 "wrong_data": (a, b) in wrong, "path": self.pair_path(a, b)}
                for a, b, v, pct in sorted(self.ranked, key=lambda item: item[:2])]

    def judged_pairs(self) -> list[dict]:
        """Every pair at its best over the run (the Localiser's records, the shape every
        fault-finding command's `pairs` key has), with its round-robin row."""
        best = {tuple(r["ranks"]): r for r in self.loc.pair_records(self.host)} if self.loc is not None else {}
        return [{**row, **best.get((row["rank_a"], row["rank_b"]),
                                   {"ranks": [row["rank_a"], row["rank_b"]], "hosts": [row["host_a"], row["host_b"]],
                                    "rail": None, "reference_gbps": None, "below_pct": None, "slow": False,
                                    "tests": 0})}
                for row in self.pair_records()]

    def to_dict(self) -> dict:
        code = int(self.exit_code())
        return {"command": "pairs", "passed": code == 0, "exit_code": code, **self.finding.to_dict(),
                "margins": self.loc.margins() if self.loc is not None else {},
                "pairs": self.judged_pairs(), "size_bytes": self.plan.nbytes, "iters": self.plan.iters,
                "warmup_iters": self.plan.warmup_iters, "backend": self.plan.backend,
                "nranks": len(self.devices), "devices": self.devices,
                "rounds": [[list(p) for p in r] for r in self.rounds], "localisation_rounds": self.localised_rounds,
                "median_busbw_gbps": self.median, "fail_below_pct": self.plan.fail_below,
                "busbw_gbps": self.matrix, "nccl_path": self.path.to_dict() if self.path is not None else None}

    def write_files(self) -> None:
        if self.plan.json_path:
            with open(self.plan.json_path, "w") as f:
                json.dump(self.to_dict(), f, indent=1)
                f.write("\n")
        if self.plan.metrics_path:
            from ncclbench.results.metrics import write_report_files

            write_report_files("pairs", self.to_dict(), self.plan.backend, self.plan.metrics_path)
        if self.plan.csv_path:
            records = self.pair_records()
            with open(self.plan.csv_path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(records[0]) if records else ["rank_a"])
                writer.writeheader()
                writer.writerows(records)
