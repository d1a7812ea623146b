"""`ncclbench.preflight()` and `ncclbench preflight`: before a training job's first step, do its
own process groups run at the speed they should, and if not, which host is the slow one?

For each group given (each mesh dimension on its own groups, all of a dimension's groups at
once, as the job runs them): a short plan (all_reduce, all_gather, reduce_scatter at three
sizes) through the engine of `measure()`, sized to the time budget by a calibration op.
Judged relative (each group against the other groups of its dimension, each rank's own time
against the other ranks', by the robust rule of ncclbench.api.verdict) and absolute (a floor in
GB/s, a percentage of the link peak the topology probe finds, or a baseline results file).
What is flagged is measured again and only kept when it is flagged both times. Then the
suspect ranks are paired with known-good partners (send/recv both ways, the engine of
`ncclbench pairs`), twice: a rank slow with good partners is a bad node (its host is to
drain); a group whose ranks are all fine with good partners has a bad link between them.

Every rank of the job calls it, with its own groups for the same dimension names; every rank
returns the same report. Cost: calibration, then about 60 % of the budget when it passes;
about the whole budget plus the pair rounds when something is flagged."""

from __future__ import annotations

import math
import os
import re
import socket
import time

from ncclbench.errors import BenchError, CollectiveError, PlanError, TimeoutExpired, first_line

DEFAULT_TIMEOUT_S = 600.0  # for agreeing on the inputs, before the timeout asked for is known to be valid

PREFLIGHT_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
GPU_MAX_BYTES = 256 << 20   # busbw has settled on NVLink and InfiniBand by here
CPU_MAX_BYTES = 1 << 20     # gloo: large enough to be bandwidth-bound, small enough to stay quick
MIN_BYTES = 64 << 10
PAIR_MAX_BYTES = 64 << 20
PAIR_ITERS = 20
MAIN_SHARE = 0.6            # of the budget for the first measurement (the rest: repeat and pairs)
ITERS_RANGE = (5, 50)
OPS_AROUND_TIMED = 8        # per size and placement: warm-up, untimed op, aligning ops, check
ENV_HINTS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME",
             "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_ALGO", "NCCL_PROTO")


def preflight(groups=None, *, min_peak_busbw=None, budget_s: float = 10.0, band="auto",
              collectives=PREFLIGHT_COLLECTIVES, baseline_tolerance="10%", datatype: str = "float",
              timeout: float | None = None, json_path: str | None = None):
    """Check the job's process groups (None: the default group; {"dp": g1, "tp": g2}: each
    rank's own group of each dimension; or a list of groups) and return a PreflightReport,
    the same on every rank. `min_peak_busbw`: GB/s, '80%' of the link peak, or a results file
    (baseline, `baseline_tolerance` below it). `band`: how far below its peers a group or
    rank may fall ('auto': DEFAULT_BAND of the groups' backend, from measured noise). `timeout`: seconds one step may take (default max(60, 3 x budget_s)).
    `json_path`: rank 0 writes the report there."""
    return Preflight(groups, min_peak_busbw, budget_s, band, collectives, baseline_tolerance, datatype,
                     timeout, json_path).run()


# How far below its peers a group, a rank alone or a pair may fall before it is called slow,
# chosen from the margins healthy runs showed (PreflightReport.margins; docs/api.md has the
# counts): NCCL on one NVSwitch host stayed within a few percent; 4 gloo ranks sharing two
# CPU cores fell up to 62% below their peers with nothing planted.
DEFAULT_BAND = {"nccl": 0.2, "gloo": 0.9}


def parse_band(value, backends=("nccl",)) -> float:
    """A fraction from '20%', '0.2', or 'auto'/None (DEFAULT_BAND of the widest-noise backend
    among `backends`)."""
    text = str(value).strip().lower()
    if value is None or text == "auto":
        return max(DEFAULT_BAND[b] for b in backends)
    try:
        band = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise PlanError(f"band {value!r}: use a percentage such as 20% or a fraction such as 0.2") from None
    if not 0 < band < 1:
        raise PlanError(f"band {value!r} must be between 0% and 100%")
    return band


def resolve_groups(groups) -> list[tuple[str, object]]:
    """[(dimension name, this rank's group)] from None, one group, a dict or a list."""
    import torch.distributed as dist

    if groups is None:
        return [("world", None)]
    if isinstance(groups, dict):
        items = [(str(k), v) for k, v in groups.items()]
    elif isinstance(groups, (list, tuple)):
        items = [(f"group{i}", g) for i, g in enumerate(groups)]
    else:
        items = [("group", groups)]
    if not items:
        raise PlanError("preflight needs at least one group")
    for name, g in items:
        if g is dist.GroupMember.NON_GROUP_MEMBER or (g is not None and not isinstance(g, dist.ProcessGroup)):
            raise PlanError(f"groups[{name!r}] must be a ProcessGroup this rank is in (for a DeviceMesh: "
                            f"mesh.get_group({name!r}))")
        if dist.get_rank(g) < 0:
            raise PlanError(f"rank {dist.get_rank()} is not a member of groups[{name!r}]")
    return items


def _agreement_timeout(timeout, budget_s) -> float:
    """The deadline for agreeing on the inputs, before they are checked: the one asked for
    (or the budget's default) where it reads as one, else DEFAULT_TIMEOUT_S. A rank that
    never calls preflight is then named within the caller's timeout, not 600 s later."""
    try:
        value = max(60.0, 3.0 * float(budget_s)) if timeout is None else float(timeout)
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_S
    return value if 0 <= value < 1e6 else DEFAULT_TIMEOUT_S


class Preflight:
    def __init__(self, groups, floor, budget_s, band, collectives, tolerance, datatype, timeout, json_path,
                 exit_on_timeout: bool = False):
        self.args = dict(groups=groups, floor=floor, budget_s=budget_s, band=band, collectives=collectives,
                         tolerance=tolerance, datatype=datatype, timeout=timeout)
        self.timeout_s = _agreement_timeout(timeout, budget_s)  # until the inputs are checked
        self.json_path, self.exit_on_timeout = json_path, exit_on_timeout
        self.cost: dict[str, float] = {}
        self.host: dict[int, str] = {}
        self.notes: list[str] = []
        self.pair_wrong: set = set()  # pairs whose exchanged data arrived wrong
        self.solo_group = None        # this rank's one-rank group (ncclbench.api.within)
        self.margins: dict = {}       # {check: worst fraction below its reference}

    # ---- the phases ----
    def run(self):
        from ncclbench.api.measure import GroupCall

        self.world = GroupCall(None, "the job's default group", exit_on_timeout=self.exit_on_timeout)
        if self.json_path:
            self.world.before_exit = lambda message: self._timed_out(message).to_json(self.json_path)
        self._clock = time.monotonic()
        try:
            self.setup = self.world.agree(self._check_inputs, "preflight: checking the inputs", self.timeout_s)
            self.timeout_s = self.setup["timeout"]
            self._gather_facts()
            self._phase("set-up")
            report = self._measure_and_judge()
        except TimeoutExpired as exc:
            report = self._timed_out(str(exc))
        report.cost_s = dict(self.cost)
        report.margins = dict(self.margins)
        if self.json_path and self.world.dist.get_rank() == 0:
            report.to_json(self.json_path)
        return report

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self.cost[name] = self.cost.get(name, 0.0) + now - self._clock
        self._clock = now

    def _check_inputs(self) -> dict:
        from ncclbench.backends.torch_dist import group_backend_name
        from ncclbench.engine.collectives import lookup
        from ncclbench.dtypes import resolve_dtypes
        from ncclbench.api.verdict import parse_floor, read_baseline

        a = self.args
        try:
            budget = float(a["budget_s"])
            timeout = max(60.0, 3.0 * budget) if a["timeout"] is None else float(a["timeout"])
        except (TypeError, ValueError):
            raise PlanError(f"budget_s and timeout must be numbers of seconds (got {a['budget_s']!r}, "
                            f"{a['timeout']!r})") from None
        if not 0 < budget < 1e6 or not 0 <= timeout < 1e6:
            raise PlanError(f"budget_s must be above 0 and timeout at least 0 seconds (got {budget:g}, {timeout:g})")
        try:
            datatype = resolve_dtypes(a["datatype"])[0].name
        except ValueError as exc:
            raise PlanError(f"preflight: {first_line(exc)}") from None
        names = [a["collectives"]] if isinstance(a["collectives"], str) else list(a["collectives"])
        collectives = []
        for name in names:
            try:
                collectives.append(lookup(str(name)).name)
            except KeyError:
                raise PlanError(f"preflight: unknown collective {name!r} (use {', '.join(PREFLIGHT_COLLECTIVES)}, "
                                "or any ncclbench collective)") from None
        floor = parse_floor(a["floor"], a["tolerance"])
        baseline = read_baseline(floor.source, datatype) if floor.kind == "baseline" else None
        dims = resolve_groups(a["groups"])
        backends = {name: group_backend_name(self.world.dist, g) for name, g in dims}
        band = parse_band(a["band"], sorted(set(backends.values())))
        return dict(dims=dims, backends=backends, floor=floor, baseline=baseline, band=band,
                    collectives=collectives, datatype=datatype, budget=budget, timeout=timeout)

    def _gather_facts(self) -> None:
        """Who is where: every rank's host, device, groups and settings; the topology of each
        host (probed once per host, GPU groups only)."""
        s, dist = self.setup, self.world.dist
        backends = s["backends"]
        fingerprint = (tuple(name for name, _ in s["dims"]), s["floor"], s["band"], tuple(s["collectives"]),
                       s["datatype"], s["budget"], self.timeout_s)
        mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "fingerprint": fingerprint,
                "dims": {name: tuple(dist.get_process_group_ranks(g or dist.GroupMember.WORLD)) for name, g in s["dims"]},
                "backends": backends, "device": _current_device(backends), "free": _free_memory(backends),
                "env": {k: os.environ[k] for k in ENV_HINTS if k in os.environ}}
        facts = self.world.exchange(mine, "preflight: gathering the ranks", self.timeout_s)
        differ = [f["rank"] for f in facts if f["fingerprint"] != facts[0]["fingerprint"]]
        if differ:
            raise PlanError(f"rank(s) {','.join(map(str, differ))} called preflight with other groups or settings "
                            "than rank 0; every rank must pass the same dimension names and options")
        self.facts = facts
        self.host = {f["rank"]: f["host"] for f in facts}
        self.instances = {name: sorted({f["dims"][name] for f in facts}) for name, _ in s["dims"]}
        self.backends = {name: ("nccl" if any(f["backends"][name] == "nccl" for f in facts) else "gloo")
                         for name, _ in s["dims"]}
        first_on_host = min(r for r, h in self.host.items() if h == self.host[dist.get_rank()]) == dist.get_rank()
        probe = first_on_host and "nccl" in self.backends.values()
        topo = self.world.exchange(_topology_facts() if probe else None, "preflight: topology", self.timeout_s)
        self.topo = {self.host[r]: t for r, t in enumerate(topo) if t is not None}

    def _measure_and_judge(self):
        from ncclbench.api.verdict import judge_absolute, judge_relative, wrong_data

        s = self.setup
        plans = self.plans = {name: self._size_plan(name) for name, _ in s["dims"]}
        self._phase("calibration")
        runs = {name: self._measure_dim(name, plans[name]) for name, _ in s["dims"]}
        self._phase("measurement")
        peaks = self._link_peaks(runs)
        judged = dict(runs)
        for d in [d for d in runs if all(len(g) == 1 for g in self.instances[d])]:
            self.notes.append(f"{d}: one-rank groups cross no link (busbw is 0 by definition): measured, not judged")
            judged[d] = []
        for d in [d for d in runs if len(self.instances[d]) == 1 and len(self.instances[d][0]) > 1]:
            self.notes.append(one_group_note(d, len(self.instances[d][0])))
        rel = {d: judge_relative(cells, s["band"]) for d, cells in judged.items()}
        absolute = {d: judge_absolute(cells, s["floor"], peaks, s["baseline"]) for d, cells in judged.items()}
        wrong = {d: wrong_data(cells) for d, cells in runs.items()}
        again = [d for d in runs if rel[d].groups or absolute[d]]
        if again:  # one slow sample is not a verdict: measure again, keep what is flagged both times
            for d in again:
                cells = self._measure_dim(d, plans[d])
                rel[d] = _both(rel[d], judge_relative(cells, s["band"]))
                second = judge_absolute(cells, s["floor"], peaks, s["baseline"])
                absolute[d] = {g: lines for g, lines in absolute[d].items() if g in second}
                wrong[d].update(wrong_data(cells))
            self._phase("repeat")
        inside = self._inside_groups()
        return self._verdict(plans, runs, peaks, rel, absolute, wrong, inside)

    def _inside_groups(self) -> tuple[dict, dict]:
        """({rank: evidence} slow alone or with most partners in its group, {(a, b): evidence}
        slow links inside a group): what a group tells without a peer group or a floor."""
        from ncclbench.api import within

        plans = self.plans.values()
        alone = within.judge_alone(self, max(p["max_bytes"] for p in plans), max(p["iters"] for p in plans))
        paired, links = within.judge_inside_pairs(self, min(PAIR_MAX_BYTES, max(p["cap_bytes"] for p in plans)))
        self._phase("ranks alone and in pairs")
        for r, line in paired.items():
            alone[r] = f"{alone[r]}; {line}" if r in alone else line
        return alone, links

    def pair_kind(self, a: int, b: int) -> tuple:
        """What a pair is compared with: pairs on one host or across hosts, of the same GPU
        link type where the host's topology says (NVLink and PCIe pairs differ), and alike
        in how NCCL spreads the exchange over its channels. NCCL places point-to-point
        traffic by the distance between the two ranks in the communicator; at half the
        communicator's size, sending and receiving share the same channels: on 4 H200s on
        one NVSwitch ranks 0-2 and 1-3 exchanged at 157 GB/s per direction against 238 for
        the other pairs, every time."""
        n = len(self.host)
        shared_channels = 2 * ((b - a) % n) == n
        same = self.host[a] == self.host[b]
        codes = (self.topo.get(self.host[a]) or {}).get("codes") if same else None
        da, db = self.facts[a]["device"], self.facts[b]["device"]
        link = codes[da][db] if codes and da is not None and db is not None and max(da, db) < len(codes) else None
        return same, link, shared_channels

    # ---- sizing and measuring ----
    def _size_plan(self, dim: str) -> dict:
        """Sizes and iterations for `dim` that fit its share of the budget, from one
        calibration call (two sizes) on every group of the dimension; the same on every rank."""
        s = self.setup
        cap = GPU_MAX_BYTES if self.backends[dim] == "nccl" else CPU_MAX_BYTES
        free = [f["free"] for f in self.facts if f["free"]]
        if free:  # the job may hold most of the memory already: buffers stay within a sixth of what is free
            cap = min(cap, max(MIN_BYTES, _pow2_floor((min(free) - (2 << 30)) // 6)))
        if s["baseline"]:  # sizes the baseline has, so that rows match
            sizes = sorted({k[1] for k in s["baseline"] if k[0] == "all_reduce" and k[1] <= cap})
            cap = sizes[-1] if sizes else cap
        rows = self._measure(dim, "all_reduce", f"{max(1, cap >> 4)}:{cap}:x16", iters=2, warmup_iters=1, check=0)
        mine = [_row_time_us(r) for r in rows] if rows.has_rows else None
        everyone = [t for t in self.world.exchange(mine, f"preflight: calibrating {dim}", self.timeout_s) if t]
        small, big = (max(t[0] for t in everyone), max(t[-1] for t in everyone)) if everyone else (1e3, 1e3)
        slope = max(0.0, (big - small) / (cap - max(1, cap >> 4))) if cap > 16 else 0.0
        share = MAIN_SHARE * s["budget"] / len(s["dims"])
        size = cap
        while True:
            sweep = [size >> 4, size >> 2, size]
            per_iter = 2 * len(s["collectives"]) * sum(max(0.0, small - slope * (cap >> 4)) + slope * x
                                                       for x in sweep) / 1e6
            fixed = 0.02 * len(s["collectives"]) * len(sweep) + OPS_AROUND_TIMED * per_iter
            iters = int((share - fixed) / per_iter) if per_iter > 0 else ITERS_RANGE[1]
            if iters >= ITERS_RANGE[0] or size >> 2 < MIN_BYTES:
                break
            size >>= 2
        iters = max(ITERS_RANGE[0], min(ITERS_RANGE[1], iters))
        return {"sizes": f"{size >> 4}:{size}:x4", "iters": iters, "max_bytes": size, "cap_bytes": cap,
                "estimate_s": round(fixed + iters * per_iter, 3)}

    def _measure(self, dim: str, collective: str, sizes: str, **options):
        from ncclbench.api.measure import _measure

        group = dict(self.setup["dims"])[dim]
        options = dict(options, datatype=self.setup["datatype"], timeout=self.timeout_s)
        return _measure(collective, sizes, group, options, label=self._label(dim, group),
                        parent=self.world, exit_on_timeout=self.exit_on_timeout)

    def _measure_dim(self, dim: str, plan: dict) -> list:
        """Every collective of the plan on this rank's group of `dim`; every group's cells."""
        from ncclbench.api.verdict import Cell

        mine = []
        for coll in self.setup["collectives"]:
            rows = self._measure(dim, coll, plan["sizes"], iters=plan["iters"], warmup_iters=2, check=1,
                                 per_iter_timing=1)
            if rows.has_rows:
                mine += [Cell(dim, tuple(rows.ranks), row.collective, row.size, placement, _median_busbw(cell),
                              tuple(cell.rank_us), cell.nwrong)
                         for row in rows for placement, cell in row.placements()
                         if getattr(cell, "measured", True) and math.isfinite(cell.busbw)]  # N/A cells say nothing
        everyone = self.world.exchange(mine, f"preflight: gathering the {dim} numbers", self.timeout_s)
        return [c for part in everyone for c in part]

    def _label(self, dim: str, group) -> str:
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(group or dist.GroupMember.WORLD))
        return f"{dim} group {self._name(dim, ranks)}"

    def _name(self, dim: str, ranks: tuple) -> str:
        index = self.instances[dim].index(ranks) if ranks in self.instances.get(dim, []) else 0
        return f"{dim}[{index}] (ranks {_ranks_text(ranks)})"

    def _link_peaks(self, runs: dict) -> dict:
        """{group: link peak GB/s or None}, and the transport lines of each group."""
        from ncclbench.api.verdict import transport_notes

        self.transport, peaks = {}, {}
        for dim, cells in runs.items():
            for g in self.instances[dim]:
                best = max((c.busbw for c in cells if c.group == g), default=None)
                hosts = [self.host[r] for r in g]
                devices = [self.facts[r]["device"] for r in g]
                env = self.facts[g[0]]["env"]
                self.transport[g], peaks[g] = transport_notes(self.backends[dim], hosts, self.topo, devices, env, best)
        return peaks

    # ---- localisation and the report ----
    def _verdict(self, plans, runs, peaks, rel, absolute, wrong, inside):
        from ncclbench.api.verdict import PreflightReport

        convicted, inner_links = inside
        slow = self._slow_groups(rel, absolute)
        # a slow group with a rank already found slow is explained by it: its partners are
        # not suspects; the rest are, the rank in a slow group of every dimension first
        unexplained = {k: v for k, v in slow.items() if not set(k[1]) & set(convicted)}
        culprit = self._mesh_culprit(unexplained, {}, set())
        members = {r for (_d, g) in unexplained for r in g}
        bad, fine = self._localise(sorted(culprit or members), unexplained) if members else ({}, set())
        if culprit and set(culprit) <= fine and members - fine:  # cleared: then the others
            more_bad, more_fine = self._localise(sorted(members - fine), unexplained)
            bad.update(more_bad)
            fine |= more_fine
        self._phase("pairs")
        bad.update(self._mesh_culprit(unexplained, bad, fine))
        bad.update(convicted)
        failures, host_evidence, links = self._explain(slow, bad, fine, wrong, inner_links)
        report = PreflightReport(passed=not failures, failures=failures, bad_ranks=sorted(bad),
                                 bad_links=links, wrong_results=any(wrong.values()) or bool(self.pair_wrong),
                                 notes=self.notes)
        report.hosts = self._host_verdicts(host_evidence, bad)
        report.groups = self._group_records(runs, peaks, slow, wrong, set(bad) | {r for p in links for r in p})
        summary = "; ".join(f"{d}: {p['sizes']} B x {p['iters']} iters" for d, p in plans.items())
        report.plan = {"collectives": list(self.setup["collectives"]), "datatype": self.setup["datatype"],
                       "per_dimension": plans, "floor": self.setup["floor"].describe(),
                       "band": self.setup["band"], "summary": summary}
        return report

    def _slow_groups(self, rel, absolute) -> dict:
        """{(dim, group): [evidence]}: slower than their peers, or below the floor (unless every
        group of the dimension is: that is the fabric or a setting, not a host)."""
        slow: dict = {}
        for d, found in rel.items():
            for g, hits in found.groups.items():
                # the largest size's evidence: where busbw means the most
                (coll, size, placement), busbw, frac = max(hits, key=lambda h: (h[0][1], h[2]))
                slow.setdefault((d, g), []).append(
                    f"{coll} {size} B {placement}: {busbw:.3g} GB/s, {100 * frac:.0f}% below the other {d} groups")
        for d, failing in absolute.items():
            everyone = len(failing) == len(self.instances[d]) and len(self.instances[d]) > 1
            for g, lines in failing.items():
                slow.setdefault((d, g), []).extend(lines)
            if everyone:
                self.notes.append(f"every {d} group is below the floor {self.setup['floor'].describe()}: "
                                  "a setting or the fabric, not one host")
        return slow

    def _localise(self, suspects: list[int], slow: dict) -> tuple[dict, set]:
        """Suspects with known-good partners (twice): ({bad rank: evidence}, {ranks cleared})."""
        from ncclbench.api.verdict import judge_pairs, repair_rounds

        good = [r for r in sorted(self.host) if r not in suspects]
        same_host = {r: any(len({self.host[m] for m in g}) == 1 for (_d, g) in slow if r in g) for r in suspects}
        rounds, alone = repair_rounds(suspects, good, self.host, same_host)
        if alone:
            self.notes.append(f"rank(s) {_ranks_text(alone)}: no known-good partner of the same kind "
                              "(same host or not) to tell the node from the link")
        if not rounds:
            return {}, set()
        nbytes = min(PAIR_MAX_BYTES, max(p["cap_bytes"] for p in self.plans.values()))
        repeats = [self._pairs(rounds, nbytes) for _ in range(2)]
        return judge_pairs(repeats, suspects, self.host, self.setup["band"], self.pair_kind)

    def _mesh_culprit(self, slow: dict, bad: dict, fine: set) -> dict:
        """{rank: evidence} for the one rank that is in a slow group of every dimension with
        slow groups (two or more): a slow node slows each group it is in, its peers are slow
        in one dimension only. Used when the pair rounds neither accused nor cleared it (on
        a noisy host they may not settle either way)."""
        dims = sorted({d for d, _ in slow})
        if len(dims) < 2:
            return {}
        common = set(self.host)
        for d in dims:
            common &= {r for (dd, g) in slow if dd == d for r in g}
        if len(common) != 1 or bad:
            return {}
        r = next(iter(common))
        if r in fine:
            return {}
        groups = ", ".join(self._name(d, g) for (d, g) in slow if r in g)
        return {r: f"is the only rank in a slow group of every dimension ({groups}); the pair rounds did not settle it"}

    def _pairs(self, rounds: list, nbytes: int) -> dict:
        """One pass of the rounds with the engine of `ncclbench pairs` on the default group;
        {(a, b): GB/s per direction}."""
        from ncclbench.testing import faults
        from ncclbench.api.measure import GroupCall, _own_stream
        from ncclbench.backends.torch_dist import TorchBackend
        from ncclbench.engine.pairs import PairsPlan, measure_rounds
        from ncclbench.api.verdict import pair_busbw
        from ncclbench.engine.watchdog import SizeWatchdog

        call = GroupCall(None, "the preflight pair exchanges", parent=self.world, exit_on_timeout=self.exit_on_timeout)
        backend = TorchBackend.adopt(None)
        limit = self.timeout_s * len(rounds)
        plan = PairsPlan(nbytes, PAIR_ITERS, 2, backend.name, limit, None, None, None)
        board = call.board("e")
        board.reach(1)
        dog = SizeWatchdog(limit, lambda what: call.timed_out(what, board.behind(1), limit, call.rank))
        dog.arm(f"{len(rounds)} round(s) of pair exchanges")
        try:
            with call.op_timeout(limit), _own_stream(backend, False):
                times, wrong = measure_rounds(backend, plan, rounds, faults.op_delay(call.global_ranks[call.rank]))
        except BenchError:
            call.raise_if_timed_out()
            raise
        except Exception as exc:  # noqa: BLE001 - one line
            call.raise_if_timed_out()
            raise CollectiveError(f"preflight pair exchange failed: {type(exc).__name__}: {first_line(exc)}") from exc
        finally:
            dog.stop()
            backend.close()
        call.raise_if_timed_out()
        everyone = self.world.exchange((times, wrong), "preflight: gathering the pair times", self.timeout_s)
        call.forget()
        self.pair_wrong |= {(min(r, p), max(r, p)) for r, (_t, peers) in enumerate(everyone) for p in peers}
        return pair_busbw([t for t, _w in everyone], nbytes)

    def _explain(self, slow, bad, fine, wrong, inner_links) -> tuple[list, dict, list]:
        """Failure lines (worst news first), {host: [evidence]}, bad links."""
        failures, evidence, links = [], {}, []

        def note(rank, line):
            lines = evidence.setdefault(self.host[rank], [])
            if line not in lines:
                lines.append(line)

        for d, by_group in wrong.items():
            for g, lines in by_group.items():
                failures.append(f"{self._name(d, g)} on {_hosts_text(g, self.host)}: wrong results: {lines[0]}")
                for r in g:
                    note(r, f"{self._name(d, g)}: {lines[0]}")
        for (d, g), lines in slow.items():
            culprits = [r for r in g if r in bad]
            head = f"{self._name(d, g)} on {_hosts_text(g, self.host)}: {lines[0]}"
            if culprits:
                who = ", ".join(f"rank {r} ({self.host[r]}) {_short_reason(bad[r])}" for r in culprits)
                failures.append(f"{head}; {who}: drain {', '.join(sorted({self.host[r] for r in culprits}))}")
                for r in culprits:
                    note(r, f"{self._name(d, g)}: {lines[0]}")
            elif all(r in fine for r in g):
                failures.append(f"{head}; its ranks are fine with known-good partners: a link between them is slow")
                if len(g) == 2:
                    links.append(list(g))
                for r in g:
                    note(r, f"link inside {self._name(d, g)}: {lines[0]}")
            else:
                failures.append(f"{head}; not localised to one rank")
                for r in g:
                    note(r, f"{self._name(d, g)} (not localised): {lines[0]}")
        explained = {r for (_d, g) in slow for r in g if r in bad}
        for r, line in sorted(bad.items()):
            note(r, f"rank {r} {line}")
            if r not in explained:
                failures.append(f"rank {r} ({self.host[r]}) {line}: drain {self.host[r]}")
        for (a, b), line in sorted(inner_links.items()):
            failures.append(f"the link between rank {a} ({self.host[a]}) and rank {b} ({self.host[b]}) is slow {line}; "
                            "neither rank is slow alone or with its other partners")
            links.append([a, b])
            for r in (a, b):
                note(r, f"link with rank {b if r == a else a}: {line}")
        for a, b in sorted(self.pair_wrong):
            failures.insert(0, f"wrong data between rank {a} ({self.host[a]}) and rank {b} ({self.host[b]}) "
                               "in the pair exchanges")
            note(a, failures[0])
            note(b, failures[0])
        return failures, evidence, links

    def _host_verdicts(self, evidence: dict, bad: dict) -> list[dict]:
        drain = {self.host[r] for r in bad}
        out = []
        for host in sorted(set(self.host.values())):
            ranks = sorted(r for r, h in self.host.items() if h == host)
            verdict = "drain" if host in drain else ("suspect" if host in evidence else "ok")
            out.append({"host": host, "verdict": verdict, "ranks": ranks, "evidence": evidence.get(host, [])})
        return out

    def _group_records(self, runs, peaks, slow, wrong, found: set) -> list[dict]:
        """One record per group; `found`: ranks found slow (or at a slow link) inside groups."""
        out = []
        for dim, cells in runs.items():
            for g in self.instances[dim]:
                mine = [c for c in cells if c.group == g]
                best = {coll: max(c.busbw for c in mine if c.collective == coll)
                        for coll in self.setup["collectives"] if any(c.collective == coll for c in mine)}
                verdict = "wrong" if g in wrong.get(dim, {}) else ("slow" if (dim, g) in slow or set(g) & found else "ok")
                out.append({"name": self._name(dim, g), "dim": dim, "ranks": list(g),
                            "hosts": sorted({self.host[r] for r in g}), "backend": self.backends[dim],
                            "best_busbw": best, "link_peak_gbps": peaks.get(g), "verdict": verdict,
                            "transport": self.transport.get(g, [])})
        return out

    def _timed_out(self, message: str):
        """Every rank's report after a timeout: the late ranks' hosts to drain, from the
        message the first rank to give up left in the store."""
        from ncclbench.api.verdict import PreflightReport

        m = re.search(r"rank\(s\) ([\d,]+) never reached it", message)
        late = [int(x) for x in m.group(1).split(",")] if m else []
        where = [f"rank {r} ({self.host.get(r, 'host unknown')})" for r in late]
        hosts = []
        for host in sorted({self.host.get(r) for r in late if self.host.get(r)}):
            ranks = [r for r in late if self.host.get(r) == host]
            hosts.append({"host": host, "verdict": "drain", "ranks": ranks,
                          "evidence": [f"rank(s) {_ranks_text(ranks)} never arrived: {message}"]})
        line = message + (f" ({', '.join(where)})" if where else "")
        self._phase("until the timeout")
        return PreflightReport(passed=False, failures=[line], hosts=hosts, timed_out=True, notes=self.notes)


def one_group_note(dim: str, size: int) -> str:
    """The note on a dimension of one group: how its ranks are judged (pairs are swept only
    inside groups of PAIR_SWEEP_RANKS)."""
    from ncclbench.api.within import PAIR_SWEEP_RANKS

    low, high = PAIR_SWEEP_RANKS
    how = ("alone and in pairs inside it" if low <= size <= high else
           f"alone only (pairs are swept inside groups of {low} to {high} ranks; a slow link here is not found)")
    return (f"{dim}: one group, no peer group to compare it with: its ranks are judged {how}; the group as a whole "
            "only against a floor (--min-peak-busbw)")


def _both(first, second):
    """The findings flagged in both measurements (the second run's evidence)."""
    from ncclbench.api.verdict import DimFindings

    return DimFindings(groups={g: h for g, h in second.groups.items() if g in first.groups})


def _short_reason(evidence: str) -> str:
    """The kind of evidence a rank was found slow by, for a group's failure line."""
    if evidence.startswith("alone"):
        return "is slow alone"
    if evidence.startswith("in "):
        return "is slow with most of its partners in its group"
    if evidence.startswith("with rank"):
        return "is slow with known-good partners"
    return "is in a slow group of every dimension"


def _row_time_us(row) -> float:
    """A row's time per op for calibration: out-of-place, or in-place where out-of-place is
    N/A (torch's in-place-only collectives on one rank)."""
    for cell in (row.out_of_place, row.in_place):
        if math.isfinite(cell.time_us):
            return cell.time_us
    return 1e3


def _median_busbw(cell) -> float:
    """busbw at the median iteration's time (-I: the slowest rank's, per iteration) rather than
    the mean: one iteration held up by something else on the host does not make a group slow."""
    p50 = (cell.per_iter or {}).get("p50_us")
    return cell.busbw * cell.time_us / p50 if p50 and cell.time_us else cell.busbw


def _pow2_floor(n: int) -> int:
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 1


def _ranks_text(ranks) -> str:
    return ",".join(str(r) for r in ranks)


def _hosts_text(ranks, host: dict) -> str:
    return ",".join(sorted({host[r] for r in ranks}))


def _current_device(backends: dict):
    if "nccl" not in backends.values():
        return None
    import torch

    return torch.cuda.current_device()


def _free_memory(backends: dict):
    if "nccl" not in backends.values():
        return None
    import torch

    return torch.cuda.mem_get_info()[0]


def _topology_facts() -> dict | None:
    """This host's GPU links, NVLink peak and RDMA NICs, for the transport lines."""
    from ncclbench.topology import probe as topo
    from ncclbench.topology.model import link_peak_gbps
    from ncclbench.api.verdict import nic_rate_gbps

    try:
        t = topo.probe(include_nics=True)
    except Exception:  # noqa: BLE001 - context only: without it the transport lines say less
        return None
    nics = [{"name": n.name, "layer": p.link_layer, "state": p.state, "rate_gbps": nic_rate_gbps(p.rate)}
            for n in t.nics for p in n.ports]
    return {"codes": t.link_matrix if t.gpu_order == "cuda" else None, "nvlink_peak": link_peak_gbps(t),
            "nics": nics}


# ---- the command -------------------------------------------------------------------------------
def parse_mesh(spec: str, world: int) -> list[tuple[str, list[list[int]]]]:
    """'dp=2,tp=4' -> [(name, every group of that dimension as global ranks)], ranks laid
    out row-major as torch's init_device_mesh((2, 4)) does (the last dimension contiguous)."""
    dims = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, _, size = part.partition("=")
        if not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise PlanError(f"--mesh {spec!r}: expected NAME=SIZE[,NAME=SIZE...] such as dp=2,tp=4")
        dims.append((name.strip(), int(size)))
    if not dims or len({n for n, _ in dims}) != len(dims):
        raise PlanError(f"--mesh {spec!r}: give each dimension once, e.g. dp=2,tp=4")
    total = 1
    for _, size in dims:
        total *= size
    if total != world:
        raise PlanError(f"--mesh {spec!r} has {total} ranks but the job has {world}")
    out = []
    for k, (name, size) in enumerate(dims):
        stride = 1
        for _, inner in dims[k + 1:]:
            stride *= inner
        starts = [r for r in range(world) if (r // stride) % size == 0]
        out.append((name, [[start + i * stride for i in range(size)] for start in starts]))
    return out


def make_groups(mesh: str | None, host_of: list[str]) -> dict:
    """This rank's group of each dimension (every rank creates every group, in one order, as
    torch requires); without --mesh: the default group, and the ranks of each host when the
    job spans several."""
    import torch.distributed as dist

    world, me = dist.get_world_size(), dist.get_rank()
    if mesh:
        layout = parse_mesh(mesh, world)
    else:
        hosts = sorted(set(host_of), key=host_of.index)
        layout = [("world", [list(range(world))])]
        if len(hosts) > 1:
            layout.append(("node", [[r for r in range(world) if host_of[r] == h] for h in hosts]))
    mine = {}
    for name, groups in layout:
        for ranks in groups:
            g = None if len(ranks) == world else dist.new_group(ranks)
            if me in ranks:
                mine[name] = g
    return mine
