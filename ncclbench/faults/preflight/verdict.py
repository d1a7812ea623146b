"""Preflight's verdicts on its groups from measured numbers: pure functions and plain records,
no torch and no distributed code, so that every rank computes the same verdict from the same
gathered numbers and the rules can be unit-tested.

Relative judgement: a group is slow against the other groups of its dimension by the robust
rule of the localisation core (ncclbench.locate.stats.slow_outliers). Absolute judgement: a
floor in GB/s, a percentage of the link peak, or a baseline file. Which rank or link makes
a group slow is the localisation core's to say (faults.preflight.pairs, .within)."""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from ncclbench.errors import ExitCode, PlanError, PreflightError
from ncclbench.locate.finding import Finding
from ncclbench.locate.stats import slow_outliers

# ---- what was measured ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One measured row and placement of one group: its busbw and each member's own time."""

    dim: str
    group: tuple[int, ...]      # global ranks, in group rank order
    collective: str
    size: int
    placement: str
    busbw: float                # GB/s, times combined across the group's ranks
    rank_us: tuple[float, ...]  # each member's own time per op
    nwrong: int | None = None

    @property
    def key(self) -> tuple:
        return (self.collective, self.size, self.placement)


@dataclass
class DimFindings:
    """What the relative judgement found in one mesh dimension: {group: [evidence]}. (A rank's
    own time per op says nothing about who is slow: ranks in lock-step all take as long as
    the slowest; ranks are judged alone and in pairs instead: faults.preflight.within.)"""

    groups: dict = field(default_factory=dict)


def judge_relative(cells: list[Cell], band: float) -> DimFindings:
    """Groups of one dimension against each other (busbw), key by key; a group is slow when
    it is slow in more than half of its keys."""
    by_key: dict = {}
    for c in cells:
        by_key.setdefault(c.key, []).append(c)
    group_hits: dict = {}
    group_keys: dict = {}
    for key, cs in by_key.items():
        for c in cs:
            group_keys[c.group] = group_keys.get(c.group, 0) + 1
        for group, frac in slow_outliers({c.group: c.busbw for c in cs}, band).items():
            busbw = next(c.busbw for c in cs if c.group == group)
            group_hits.setdefault(group, []).append((key, busbw, frac))
    return DimFindings({g: hits for g, hits in group_hits.items() if 2 * len(hits) > group_keys[g]})


# ---- floors --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Floor:
    """The absolute bar: `gbps` (busbw in GB/s), `percent` (of the link peak the topology
    probe finds) or `baseline` (a results file; `tolerance` below its busbw)."""

    kind: str | None = None
    value: float = 0.0
    source: str | None = None
    tolerance: float = 0.1

    def describe(self) -> str:
        if self.kind == "gbps":
            return f"{self.value:g} GB/s"
        if self.kind == "percent":
            return f"{self.value:g}% of the link peak"
        if self.kind == "baseline":
            return f"baseline {self.source} - {100 * self.tolerance:g}%"
        return "none"


def parse_floor(spec, tolerance="10%") -> Floor:
    """None, a number of GB/s (300, '300'), a percentage ('80%') or a results file's path."""
    if spec is None:
        return Floor()
    text = str(spec).strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value) or value <= 0:
            raise PlanError(f"min_peak_busbw must be a positive number of GB/s, a percentage or a file (got {spec!r})")
        return Floor("gbps", value)
    if text.endswith("%"):
        try:
            value = float(text[:-1])
        except ValueError:
            raise PlanError(f"min_peak_busbw {spec!r}: not a percentage such as 80%") from None
        if not 0 < value <= 100:
            raise PlanError(f"min_peak_busbw {spec!r}: a percentage must be above 0 and at most 100")
        return Floor("percent", value)
    from ncclbench.results.compare import parse_threshold  # the threshold `compare` takes (pandas: baselines only)

    try:
        tol = parse_threshold(tolerance)
    except ValueError as exc:
        raise PlanError(f"baseline tolerance: {exc}") from None
    return Floor("baseline", 0.0, text, tol)


def read_baseline(path: str, datatype: str) -> dict:
    """{(collective, size, placement): busbw} of a results file (text, JSON or CSV) for the
    one datatype preflight runs, reduction sum where the collective has one; PlanError when
    it cannot be read."""
    from ncclbench.results.readers import ResultsFormatError, read_results

    try:
        frame = read_results(path)
    except ResultsFormatError as exc:
        raise PlanError(f"baseline {exc}") from None
    except OSError as exc:
        raise PlanError(f"cannot read baseline {path}: {exc.strerror or exc}") from None
    frame = frame[(frame["dtype"] == datatype) & frame["op"].isin(["sum", "none", ""])]
    out: dict = {}
    for row in frame.itertuples():
        key = (row.collective, int(row.size_bytes), row.placement)
        out[key] = max(out.get(key, 0.0), float(row.busbw_gbps))
    if not out:
        raise PlanError(f"baseline {path} has no {datatype} rows to compare with")
    return out


def judge_absolute(cells: list[Cell], floor: Floor, peaks: dict, baseline: dict | None) -> dict:
    """{group: [one line per failure]} against the floor; `peaks`: {group: link peak GB/s or
    None}. A group's best busbw per collective is held against a GB/s or % floor; against a
    baseline, the median ratio over its matched rows."""
    out: dict = {}
    groups: dict = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    for group, cs in groups.items():
        for coll in sorted({c.collective for c in cs}):
            mine = [c for c in cs if c.collective == coll]
            best = max(c.busbw for c in mine)
            line = None
            if floor.kind == "gbps" and best < floor.value:
                line = f"{coll} peak busbw {best:.3g} GB/s is below the floor {floor.value:g} GB/s"
            elif floor.kind == "percent" and peaks.get(group):
                bar = floor.value / 100 * peaks[group]
                if best < bar:
                    line = (f"{coll} peak busbw {best:.3g} GB/s is {100 * best / peaks[group]:.0f}% of the link "
                            f"peak {peaks[group]:.4g} GB/s (floor {floor.value:g}%)")
            elif floor.kind == "baseline" and baseline:
                line = _baseline_line(coll, mine, baseline, floor.tolerance)
            if line:
                out.setdefault(group, []).append(line)
    return out


def _baseline_line(coll: str, cells: list[Cell], baseline: dict, tolerance: float) -> str | None:
    ratios = [(c.busbw / baseline[c.key], c) for c in cells if baseline.get(c.key)]
    if not ratios:
        return None
    ratio = statistics.median(r for r, _ in ratios)
    if ratio >= 1.0 - tolerance:
        return None
    worst, cell = min(ratios, key=lambda item: item[0])
    return (f"{coll} busbw is {100 * (1 - ratio):.0f}% below the baseline (median of {len(ratios)} rows; "
            f"worst {cell.size} B {cell.placement}: {cell.busbw:.3g} vs {baseline[cell.key]:.3g} GB/s)")


def wrong_data(cells: list[Cell]) -> dict:
    """{group: [lines]} for rows whose check found wrong elements."""
    out: dict = {}
    for c in cells:
        if c.nwrong:
            out.setdefault(c.group, []).append(f"{c.collective} at {c.size} B {c.placement}: {c.nwrong} wrong elements")
    return out


# ---- the report -------------------------------------------------------------------------------------
@dataclass
class PreflightReport:
    """What preflight found, the same on every rank, in the shape every fault-finding command
    shares (ncclbench.locate.finding): `hosts`, one verdict per host (drain | suspect | ok,
    with the ranks and the evidence), for a scheduler; `links`, slow links as host pairs;
    `drain`, the hosts to take out. `failures`: one line each; `passed`: no failure."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    hosts: list[dict] = field(default_factory=list)
    links: list[dict] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)
    bad_ranks: list[int] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    timed_out: bool = False
    wrong_results: bool = False
    notes: list[str] = field(default_factory=list)
    plan: dict = field(default_factory=dict)
    cost_s: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)  # {check: the worst fraction below its reference, measured}

    @property
    def drain(self) -> list[str]:
        return [h["host"] for h in self.hosts if h["verdict"] == "drain"]

    @property
    def exit_code(self) -> int:
        if self.passed:
            return ExitCode.OK
        if self.timed_out:
            return ExitCode.TIMEOUT
        return ExitCode.WRONG_RESULTS if self.wrong_results else ExitCode.REGRESSION

    def raise_if_failed(self) -> None:
        """PreflightError with the first failure (and how many more), exit code as exit_code."""
        if not self.passed:
            more = f" (+{len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            raise PreflightError(f"preflight failed: {self.failures[0]}{more}", self.exit_code)

    def to_dict(self) -> dict:
        return dict(command="preflight", **asdict(self), drain=self.drain, exit_code=int(self.exit_code))

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    def lines(self) -> list[str]:
        """The report as text: one '#' line per fact, then the verdict."""
        out = [f"# ncclbench preflight: {len(self.groups)} group(s), plan {self.plan.get('summary', '')}"]
        for g in self.groups:
            best = ", ".join(f"{c} {v:.4g}" for c, v in g.get("best_busbw", {}).items())
            out.append(f"#  {g['name']:<28s} {g['verdict']:<6s} best busbw GB/s: {best or 'N/A'}")
            out.extend(f"#     {t}" for t in g.get("transport", []))
        if self.margins:
            worst = ", ".join(f"{k} {100 * v:.0f}%" for k, v in self.margins.items())
            sockets = self.plan.get("socket_band")
            wide = (f"; pairs across hosts over TCP sockets beyond {100 * sockets:.0f}%"
                    if sockets and sockets != self.plan.get("band") else "")
            out.append(f"# Worst fall below the reference: {worst} (slow beyond {100 * self.plan.get('band', 0):.0f}%{wide})")
        out.extend(f"# Note: {n}" for n in self.notes)
        out += Finding(self.hosts, self.links).lines()
        out.extend(f"# FAILED: {f}" for f in self.failures)
        cost = ", ".join(f"{k} {v:.1f} s" for k, v in self.cost_s.items())
        out.append(f"# Preflight {'passed' if self.passed else 'FAILED'} ({cost})")
        return out


# ---- what NCCL used, as far as it can be told ----------------------------------------------------------
NOT_READ = ("NCCL path: not read (NCCL's log is read where ncclbench could turn it on, or from the user's "
            "NCCL_DEBUG=INFO with NCCL_DEBUG_FILE); the lines above are the topology and the settings")


def nic_rate_gbps(rate: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 50.0 GB/s; None when unreadable."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", rate or "")
    return float(m.group(1)) / 8 if m else None


def transport_notes(backend: str, hosts: list[str], topo: dict, devices: list, env: dict,
                    best: float | None, unread: str | None = None) -> tuple[list[str], float | None]:
    """(lines on the links and settings the group's traffic met, for a group whose path NCCL's
    own log did not give, ending with why: NOT_READ, or `unread`, the ranks' reasons; the
    link peak in GB/s a % floor is taken of, or None). `topo`: {host: {"codes": GPU x GPU link codes in CUDA
    order, "nvlink_peak": GB/s, "nics": [{"name", "layer", "state", "rate_gbps"}]}}."""
    if backend == "gloo":
        return ["gloo: TCP through the hosts' network stack, not NCCL (no link peak)"], None
    if len(set(hosts)) == 1:
        notes, peak = _one_host_notes(topo.get(hosts[0]) or {}, devices, env, best)
    else:
        notes, peak = _many_host_notes(hosts, topo, env, best)
    return notes + [f"NCCL path: not read ({unread})" if unread else NOT_READ], peak


def _disabled(env: dict, name: str) -> bool:
    return str(env.get(name, "0")).strip() not in ("", "0")


def _one_host_notes(t: dict, devices: list, env: dict, best: float | None) -> tuple[list[str], float | None]:
    codes_matrix = t.get("codes") or []
    idx = [d for d in devices if d is not None]
    codes = [codes_matrix[a][b] for i, a in enumerate(idx) for b in idx[i + 1:]
             if a < len(codes_matrix) and b < len(codes_matrix[a]) and codes_matrix[a][b]]
    if len(idx) < 2:
        return ["one GPU: the collective crosses no link"], None
    if codes and all(c.startswith("NV") for c in codes):
        peak = t.get("nvlink_peak")
        notes = [f"one host, NVLink between the group's GPUs ({', '.join(sorted(set(codes)))})"
                 + (f", peak {peak:.4g} GB/s per GPU per direction" if peak else "")]
        if _disabled(env, "NCCL_P2P_DISABLE"):
            notes.append("NCCL_P2P_DISABLE is set: NCCL does not use NVLink P2P here (shared memory"
                         + (" is disabled too: the network" if _disabled(env, "NCCL_SHM_DISABLE") else "") + " instead)")
        elif best is not None and peak and best < 0.1 * peak:
            notes.append(f"busbw {best:.3g} GB/s is below 10% of the NVLink peak: looks like NVLink is not used "
                         "(a fallback to shared memory or sockets)")
        return notes, peak
    if codes:
        return [f"one host, PCIe between the group's GPUs ({', '.join(sorted(set(codes)))}): NCCL uses PCIe P2P "
                "or shared memory; link peak unknown"], None
    return ["one host; the link between the group's GPUs is unknown (no topology)"], None


def _many_host_notes(hosts: list[str], topo: dict, env: dict, best: float | None) -> tuple[list[str], float | None]:
    nics = [n for h in sorted(set(hosts)) for n in (topo.get(h) or {}).get("nics", [])
            if (n.get("state") or "").upper() == "ACTIVE"]
    rates = [n["rate_gbps"] for n in nics if n.get("rate_gbps")]
    peak = min(rates) if rates else None
    n_hosts = len(set(hosts))
    if _disabled(env, "NCCL_IB_DISABLE") or str(env.get("NCCL_NET", "")).lower() == "socket":
        return [f"{n_hosts} hosts; NCCL is told to use TCP sockets (NCCL_IB_DISABLE / NCCL_NET=Socket)"], None
    if not nics:
        return [f"{n_hosts} hosts; no active RDMA NIC found: NCCL goes through TCP sockets (NET/Socket)"], None
    layers = sorted({n.get("layer") or "?" for n in nics})
    notes = [f"{n_hosts} hosts; active RDMA NICs: {len(nics)} ({', '.join(layers)})"
             + (f", slowest port {peak:.4g} GB/s" if peak else "")]
    if best is not None and peak and best < 0.25 * peak:
        notes.append(f"busbw {best:.3g} GB/s is below a quarter of the NIC rate: looks like a TCP socket fallback "
                     "rather than InfiniBand/RoCE")
    return notes, peak
