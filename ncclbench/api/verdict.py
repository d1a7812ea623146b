"""Preflight verdicts from measured numbers: pure functions and plain records, no torch and no
distributed code, so that every rank computes the same verdict from the same gathered numbers
and the rules can be unit-tested.

Relative judgement: a value is slow when it falls below the reference by more than a band.
The reference is the median of the better half of the values (one slow group in two, or
four slow ranks in eight, must not drag the reference down with them), and the band is the
larger of a minimum (`band`, 20 % by default) and 3 robust standard deviations of that better
half (1.4826 x its median absolute deviation): noise widens it, one slow sample does not.
Absolute judgement: a floor in GB/s, a percentage of the link peak, or a baseline file."""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field

from ncclbench.errors import ExitCode, PlanError, PreflightError

MAD_SIGMA = 1.4826   # a normal distribution's standard deviation per median absolute deviation
MAD_WIDTH = 3.0      # robust standard deviations a value may fall below the reference


# ---- robust statistics --------------------------------------------------------------------------
def reference(values: list[float]) -> tuple[float, float]:
    """(reference, robust spread) of higher-is-better values: the median of the better half
    and 1.4826 x that half's median absolute deviation from it. The spread is 0 below three
    values in that half: a deviation from one or two values is no estimate of the noise (one
    noisy sample would open the band to everything)."""
    ordered = sorted(values)
    upper = ordered[len(ordered) // 2:]
    ref = statistics.median(upper)
    if len(upper) < 3:
        return ref, 0.0
    return ref, MAD_SIGMA * statistics.median(abs(v - ref) for v in upper)


def worst_below(values: dict) -> float:
    """How far the lowest value falls below the reference, as a fraction (0 when none does):
    the margin a check had, reported beside its verdict."""
    if len(values) < 2:
        return 0.0
    ref, _ = reference(list(values.values()))
    return max(0.0, 1.0 - min(values.values()) / ref) if ref > 0 else 0.0


def slow_outliers(values: dict, band: float) -> dict:
    """{key: fraction below the reference} for the keys whose (higher-is-better) value is
    slow; nothing with fewer than two values (no peers to compare with)."""
    if len(values) < 2:
        return {}
    ref, spread = reference(list(values.values()))
    if ref <= 0:
        return {}
    cut = ref * (1.0 - max(band, MAD_WIDTH * spread / ref))
    return {key: 1.0 - v / ref for key, v in values.items() if v < cut}


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
    the slowest; ranks are judged alone and in pairs instead, see judge_solo and
    judge_group_pairs.)"""

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


# ---- localisation by pairs -------------------------------------------------------------------------
def repair_rounds(suspects: list[int], good: list[int], host: dict, same_host: dict) -> tuple[list, list]:
    """Rounds of pairs that put each suspect with a known-good partner (on its own host when
    `same_host[s]`, else on another host), each rank at most once per round; the good ranks
    left over in a round are paired among themselves, as references. Returns (rounds,
    suspects that have no good partner of their kind)."""
    def fits(s, g):
        return (host[g] == host[s]) == same_host.get(s, True)

    alone = [s for s in suspects if not any(fits(s, g) for g in good)]
    left = [s for s in suspects if s not in alone]
    rounds = []
    while left:
        free, pairs = list(good), []
        for s in list(left):
            partner = next((g for g in free if fits(s, g)), None)
            if partner is not None:
                pairs.append((min(s, partner), max(s, partner)))
                free.remove(partner)
                left.remove(s)
        while len(free) >= 2:
            a = free.pop(0)
            b = next((g for g in free if host[g] == host[a]), free[0])
            free.remove(b)
            pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
    return rounds, alone


def pair_busbw(times: list[dict], nbytes: int) -> dict:
    """{(a, b): GB/s per direction} of the pairs measured, from each rank's {peer: seconds}
    (a pair's time is its slower side's)."""
    out = {}
    for a, mine in enumerate(times):
        for b, seconds in mine.items():
            if a < b and a in times[b]:
                slowest = max(seconds, times[b][a])
                out[(a, b)] = nbytes / slowest / 1e9 if slowest > 0 else float("inf")
    return out


def judge_pairs(repeats: list[dict], suspects: list[int], host: dict, band: float, kind=None,
                kind_bands=None) -> tuple[dict, set]:
    """({suspect: evidence line} slow with a known-good partner in every repeat, {suspects
    fine with one in every repeat}). Pairs are compared within their kind (`kind(a, b)`;
    default: same host or across hosts); a kind with fewer than two pairs decides nothing.
    `kind_bands(kind)`: (band, link band) for that kind, or None for `band`. A suspect is
    cleared only by pairs within `band` itself: one between `band` and a wider kind band is
    neither slow nor fine (not localised), never cleared to blame a link instead."""
    slow_in: dict = {s: [] for s in suspects}
    fine_in: dict = {s: 0 for s in suspects}
    for busbw in repeats:
        kinds: dict = {}
        for (a, b), v in busbw.items():
            kinds.setdefault(kind(a, b) if kind else host[a] == host[b], {})[(a, b)] = v
        for k, values in kinds.items():
            bar = (kind_bands(k) or (band,))[0] if kind_bands and kind else band
            # the reference: pairs of known-good ranks where the round has any (a suspect's
            # pairs must not set the bar they are judged by), else the better half of all
            known = [v for (a, b), v in values.items() if a not in slow_in and b not in slow_in]
            ref = statistics.median(known) if known else (reference(list(values.values()))[0]
                                                          if len(values) >= 2 else None)
            flagged = {p: 1.0 - v / ref for p, v in values.items() if ref and v < ref * (1.0 - bar)}
            for (a, b), v in values.items():
                if ref is None:
                    continue
                for s in (a, b):
                    if s in slow_in and ((a, b) in flagged):
                        partner = b if s == a else a
                        slow_in[s].append(f"with rank {partner} ({host[partner]}): {v:.3g} GB/s, "
                                          f"{100 * flagged[(a, b)]:.0f}% below the reference {ref:.3g} GB/s")
                    elif s in fine_in and v >= ref * (1.0 - band):
                        fine_in[s] += 1
    n = len(repeats)
    bad = {s: lines[0] + (" (each time)" if n > 1 else "") for s, lines in slow_in.items() if len(lines) >= n and n}
    fine = {s for s, count in fine_in.items() if count >= n and s not in bad and n}
    return bad, fine


# ---- inside one group: each rank alone, and the pairs of its members ----------------------------------
def judge_solo(seconds: dict, band: float) -> dict:
    """{rank: fraction below the others} for the ranks whose own op, run alone (a one-rank
    group: no partner to wait for), is slow against the other ranks' (times per op)."""
    return slow_outliers({r: 1.0 / t for r, t in seconds.items() if t > 0}, band)


def group_pair_rounds(groups: list[tuple[int, ...]]) -> list[list[tuple[int, int]]]:
    """Rounds that cover every pair inside each group (global ranks), the groups' own
    round-robin rounds run side by side: round k of every group at once."""
    from ncclbench.engine.pairs import tournament_rounds

    per_group = [[[(g[a], g[b]) for a, b in pairs] for pairs in tournament_rounds(len(g))] for g in groups]
    depth = max((len(r) for r in per_group), default=0)
    return [sorted(p for rounds in per_group if k < len(rounds) for p in rounds[k]) for k in range(depth)]


def best_of(repeats: list[dict]) -> dict:
    """{key: the highest value over the repeats that have it}: what a pair reaches at best.
    Noise on a shared host or fabric is one-sided (contention only slows), a fault is not."""
    out: dict = {}
    for values in repeats:
        for key, v in values.items():
            out[key] = max(out.get(key, v), v)
    return out


def judge_group_pairs(repeats: list[dict], groups: list[tuple[int, ...]], kind, band: float,
                      margins: dict | None = None, link_band: float | None = None,
                      kind_bands=None) -> tuple[dict, dict]:
    """({rank: evidence} slow ranks, {(a, b): evidence} slow links) inside each group, from
    pair sweeps ({(a, b): GB/s}) judged at their best: each pair by its best sweep, each
    rank by its best pair. Pairs are compared only with the group's pairs of the same
    `kind(a, b)` (one host or across hosts, link type, ...), in a kind of three pairs or
    more. A rank (with two pairs or more in the kind) is slow when even its best pair falls
    below the band under the median of the kind's pairs without it (a slow NIC or rank
    slows every pair it is in; a healthy rank has at least one fast partner; its own pairs
    never set its bar, and a slow rank's pairs pull the bar of the others down, not up). A pair is a slow
    link when its best sweep falls below the band under its kind's pairs and no slow rank
    explains it (`link_band`, default `band`: one pair is noisier than a rank's best of
    several). `margins` (optional) gets {"ranks": {rank: fraction below}, "pairs": {pair:
    fraction below}, "judged": {pairs in a kind large enough}} for everything judged: how close
    each came to being flagged (the pairs of a slow rank are not in "pairs"). `kind_bands(kind)`:
    (band, link band) for the pairs of that kind, or None for `band` and `link_band`."""
    best = best_of(repeats)
    bad: dict = {}
    links: dict = {}
    below: dict = {"ranks": {}, "pairs": {}, "judged": set()}
    for g in groups:
        kinds: dict = {}
        for (a, b), v in best.items():
            if a in g and b in g:
                kinds.setdefault(kind(a, b), {})[(a, b)] = v
        for k, values in ((k, v) for k, v in kinds.items() if len(v) >= 3):
            below["judged"] |= set(values)
            bands = (kind_bands(k) if kind_bands else None) or (band, band if link_band is None else link_band)
            _judge_kind(values, bands, bad, links, below)
    if margins is not None:
        margins.update(below)
    bad = {r: f"{line}, at best over {len(repeats)} sweep(s)" for r, line in bad.items()}
    return bad, {p: line for p, line in links.items() if not set(p) & set(bad)}


def _judge_kind(values: dict, bands: tuple, bad: dict, links: dict, below: dict) -> None:
    """One kind of pairs of one group ({pair: best GB/s}): its slow ranks and slow links
    (`bands`: for ranks, for links)."""
    band, link_band = bands
    ranks = sorted({r for p in values for r in p})
    mine = {r: {p: v for p, v in values.items() if r in p} for r in ranks}
    for r in (r for r in ranks if len(mine[r]) >= 2):
        others = [v for p, v in values.items() if r not in p]
        ref = statistics.median(others) if others else 0.0
        if ref <= 0:
            continue
        best = max(mine[r].values())
        frac = max(0.0, 1.0 - best / ref)
        below["ranks"][r] = max(below["ranks"].get(r, 0.0), frac)
        if frac > band:
            worst = min(mine[r], key=mine[r].get)
            bad[r] = (f"slow with all {len(mine[r])} of its partners in its group: its best pair {best:.3g} GB/s "
                      f"is {100 * frac:.0f}% below {ref:.3g} GB/s, the median of the pairs without it "
                      f"(worst: with rank {worst[0] if worst[1] == r else worst[1]}, {mine[r][worst]:.3g} GB/s)")
    clean = {p: v for p, v in values.items() if not set(p) & set(bad)}
    pref, _ = reference(list(clean.values())) if len(clean) >= 2 else (0.0, 0.0)
    for p, v in clean.items():
        below["pairs"][p] = max(0.0, 1.0 - v / pref) if pref > 0 else 0.0
    for p, frac in (slow_outliers(clean, link_band) if len(clean) >= 3 else {}).items():
        links[p] = (f"{clean[p]:.3g} GB/s at best, {100 * frac:.0f}% below the group's reference {pref:.3g} GB/s")


# ---- the report -------------------------------------------------------------------------------------
@dataclass
class PreflightReport:
    """What preflight found, the same on every rank. `hosts`: one verdict per host
    (drain | suspect | ok, with the ranks and the evidence), for a scheduler; `drain`: the
    hosts to take out. `failures`: one line each; `passed`: no failure."""

    passed: bool
    failures: list[str] = field(default_factory=list)
    hosts: list[dict] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)
    bad_ranks: list[int] = field(default_factory=list)
    bad_links: list[list[int]] = field(default_factory=list)
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
        return dict(asdict(self), drain=self.drain, exit_code=int(self.exit_code))

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
        for h in self.hosts:
            if h["verdict"] != "ok":
                out.append(f"# {h['verdict'].upper()} {h['host']} (ranks {','.join(map(str, h['ranks']))})")
                out.extend(f"#     {e}" for e in h["evidence"])
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
