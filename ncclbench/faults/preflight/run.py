"""`ncclbench.preflight()` and `ncclbench preflight`: before a training job's first step, do its
own process groups run at the speed they should, and if not, which host is the slow one?

For each group given (each mesh dimension on its own groups, all of a dimension's groups at
once, as the job runs them): a short plan (all_reduce, all_gather, reduce_scatter at three
sizes) through the engine of `measure()`, sized to the time budget by a calibration op.
Judged relative (each group against the other groups of its dimension, each rank's own time
against the other ranks', by the robust rule of ncclbench.faults.preflight.verdict) and absolute (a floor in
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
import socket
import time
from functools import partial

from ncclbench.api.measure import ranks_text
from ncclbench.faults.preflight.inputs import ONE_RANK, PREFLIGHT_COLLECTIVES, agreement_timeout, check_inputs
from ncclbench.faults.preflight.report import explain, finding, group_records, timed_out_report
from ncclbench.faults.preflight.within import shares_of
from ncclbench.locate.kinds import pair_kind
from ncclbench.faults.preflight.groups import (best_cells, group_name, mesh_culprit, slow_groups,
                                               sockets_between_hosts)
from ncclbench.engine.collectives import ALL_REDUCE
from ncclbench.errors import PlanError, TimeoutExpired

GPU_MAX_BYTES = 256 << 20   # busbw has settled on NVLink and InfiniBand by here
CPU_MAX_BYTES = 1 << 20     # gloo: large enough to be bandwidth-bound, small enough to stay quick
MIN_BYTES = 64 << 10
MIN_PAIR_BYTES = 4 << 10
PAIR_MAX_BYTES = 64 << 20
CALIBRATION_SHARE = 0.1     # of the budget: all_reduce at growing sizes until the next would not fit
MAIN_SHARE = 0.5            # of the budget for the first measurement
REPEAT_SHARE = 0.25         # for measuring a flagged dimension again (half the iterations)
PAIR_SHARE = 0.25           # for the pair sweeps inside groups, and again for the known-good partners
PROBE_STEP = 16             # calibration sizes grow 16-fold: 64K, 1M, 16M, 256M
PROBE_ITERS = 2
PROBE_OPS = PROBE_ITERS + 5  # per probe: an untimed op, four aligning ops, the timed ones
ITERS_RANGE = (5, 50)
OPS_AROUND_TIMED = 8        # per size and placement: warm-up, untimed op, aligning ops, check
ENV_HINTS = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET", "NCCL_SOCKET_IFNAME",
             "NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL", "NCCL_ALGO", "NCCL_PROTO")


def preflight(groups=None, *, min_peak_busbw=None, budget_s: float = 10.0, band="auto",
              collectives=PREFLIGHT_COLLECTIVES, baseline_tolerance="10%", datatype: str = "float",
              timeout: float | None = None, json_path: str | None = None, metrics_path: str | None = None,
              drain_path: str | None = None, drain_format: str = "scontrol"):
    """Check the job's process groups (None: the default group; {"dp": g1, "tp": g2}: each
    rank's own group of each dimension; or a list of groups) and return a PreflightReport,
    the same on every rank. `min_peak_busbw`: GB/s, '80%' of the link peak, or a results file
    (baseline, `baseline_tolerance` below it). `band`: how far below its peers a group or
    rank may fall ('auto': the bands of ncclbench.locate.bands by transport). `timeout`: seconds one step may take (default max(60, 3 x budget_s)).
    `json_path`: rank 0 writes the report there; `metrics_path`: its Prometheus metrics;
    `drain_path`: the hosts to drain in `drain_format` (scontrol, kubectl, hosts)."""
    return Preflight(groups, min_peak_busbw, budget_s, band, collectives, baseline_tolerance, datatype,
                     timeout, json_path, metrics_path=metrics_path, drain_path=drain_path,
                     drain_format=drain_format).run()


class Preflight:
    def __init__(self, groups, floor, budget_s, band, collectives, tolerance, datatype, timeout, json_path,
                 exit_on_timeout: bool = False, metrics_path=None, drain_path=None, drain_format="scontrol"):
        self.args = dict(groups=groups, floor=floor, budget_s=budget_s, band=band, collectives=collectives,
                         tolerance=tolerance, datatype=datatype, timeout=timeout)
        self.timeout_s = agreement_timeout(timeout, budget_s)  # until the inputs are checked
        self.json_path, self.exit_on_timeout = json_path, exit_on_timeout
        from ncclbench.results.drain import checked_format

        self.outputs = {"metrics_path": metrics_path, "drain_path": drain_path,
                        "drain_format": checked_format(drain_format)}
        self.cost: dict[str, float] = {}
        self.host: dict[int, str] = {}
        self.shares: dict = {}        # {rank: its host and GPU} (within.shares_of)
        self.notes: list[str] = []
        self.pair_wrong: set = set()  # pairs whose exchanged data arrived wrong
        self.pair_records: list = []  # every pair tested, at its best (the report's `pairs`)
        self.unsettled: dict = {}     # {rank: evidence} low in pairs, not settled
        self.solo_group = None        # this rank's one-rank group (alone_times)
        self.margins: dict = {}       # {check: worst fraction below its reference}
        self.paths: dict = {}         # {group: the path NCCL's log named (pathview.Path.to_dict)}

    # ---- the phases ----
    def run(self):
        from ncclbench.api.measure import GroupCall

        self.world = GroupCall(None, "the job's default group", exit_on_timeout=self.exit_on_timeout)
        if self.json_path or self.outputs["metrics_path"] or self.outputs["drain_path"]:
            self.world.before_exit = lambda message: self._write(self._timed_out(message))
        self._clock = time.monotonic()
        if self.world.dist.get_world_size() < 2:
            raise PlanError(ONE_RANK)
        try:
            check = partial(check_inputs, self.args, self.world.dist)
            self.setup = self.world.agree(check, "preflight: checking the inputs", self.timeout_s)
            self.timeout_s = self.setup["timeout"]
            self._gather_facts()
            self._phase("set-up")
            report = self._measure_and_judge()
        except TimeoutExpired as exc:
            report = self._timed_out(str(exc))
        report.cost_s = dict(self.cost)
        report.margins = dict(self.margins)
        if self.world.dist.get_rank() == 0:
            self._write(report)
        return report

    def _write(self, report) -> None:
        """Rank 0's files: the JSON, --metrics, --drain-file (also before a timeout ends the process)."""
        from ncclbench.results.metrics import write_report_files

        if self.json_path:
            report.to_json(self.json_path)
        backend = ",".join(sorted(set(getattr(self, "backends", {}).values())))
        write_report_files("preflight", report.to_dict(), backend, **self.outputs)

    def _phase(self, name: str) -> None:
        now = time.monotonic()
        self.cost[name] = self.cost.get(name, 0.0) + now - self._clock
        self._clock = now

    def _gather_facts(self) -> None:
        """Who is where: every rank's host, device, groups and settings; the topology of each
        host (probed once per host, GPU groups only)."""
        s, dist = self.setup, self.world.dist
        backends = s["backends"]
        fingerprint = (tuple(name for name, _ in s["dims"]), s["floor"], s["band"], tuple(s["collectives"]),
                       s["datatype"], s["budget"], self.timeout_s)
        mine = {"rank": dist.get_rank(), "host": socket.gethostname(), "fingerprint": fingerprint,
                "dims": {name: tuple(dist.get_process_group_ranks(g or dist.GroupMember.WORLD)) for name, g in s["dims"]},
                "backends": backends, "device": _current_device(backends), "gpu": _gpu_uuid(backends),
                "free": _free_memory(backends),
                "env": {k: os.environ[k] for k in ENV_HINTS if k in os.environ},
                "health": _health(backends)}
        facts = self.world.exchange(mine, "preflight: gathering the ranks", self.timeout_s)
        differ = [f["rank"] for f in facts if f["fingerprint"] != facts[0]["fingerprint"]]
        if differ:
            raise PlanError(f"rank(s) {ranks_text(differ)} called preflight with other groups or settings "
                            "than rank 0; every rank must pass the same dimension names and options")
        self.facts = facts
        self.host = {f["rank"]: f["host"] for f in facts}
        self.shares = shares_of(self.host, {f["rank"]: f.get("gpu") for f in facts})
        self.instances = {name: sorted({f["dims"][name] for f in facts}) for name, _ in s["dims"]}
        self.backends = {name: ("nccl" if any(f["backends"][name] == "nccl" for f in facts) else "gloo")
                         for name, _ in s["dims"]}
        first_on_host = min(r for r, h in self.host.items() if h == self.host[dist.get_rank()]) == dist.get_rank()
        probe = first_on_host and "nccl" in self.backends.values()
        topo = self.world.exchange(_topology_facts() if probe else None, "preflight: topology", self.timeout_s)
        self.topo = {self.host[r]: t for r, t in enumerate(topo) if t is not None}
        from ncclbench.backends.torch_dist import group_backend_name

        nccl = group_backend_name(dist, None) == "nccl"  # the pairs run on the default group
        self.pair_kind = partial(pair_kind, self.host, self.topo, self.facts, nccl=nccl)

    def _measure_and_judge(self):
        from ncclbench.faults.preflight import within
        from ncclbench.faults.preflight.verdict import judge_absolute, judge_relative, wrong_data

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
            self.notes.append(within.one_group_note(d, len(self.instances[d][0])))
        rel = {d: judge_relative(cells, s["band"]) for d, cells in judged.items()}
        absolute = {d: judge_absolute(cells, s["floor"], peaks, s["baseline"]) for d, cells in judged.items()}
        wrong = {d: wrong_data(cells) for d, cells in runs.items()}
        again = [d for d in runs if rel[d].groups or absolute[d]]
        if again:  # one slow sample is not a verdict: measure again, judge each group at its best
            for d in again:
                cells = self._measure_dim(d, dict(plans[d], iters=max(ITERS_RANGE[0], plans[d]["iters"] // 2)))
                rel[d] = judge_relative(best_cells(judged[d], cells) if judged[d] else [], s["band"])
                second = judge_absolute(cells, s["floor"], peaks, s["baseline"])
                absolute[d] = {g: lines for g, lines in absolute[d].items() if g in second}
                wrong[d].update(wrong_data(cells))
            self._phase("repeat")
        inside = self._inside_groups()
        return self._verdict(plans, runs, peaks, rel, absolute, wrong, inside)

    def _inside_groups(self) -> tuple[dict, dict]:
        """({rank: evidence} slow alone or with most partners in its group, {(a, b): evidence}
        slow links inside a group): what a group tells without a peer group or a floor."""
        from ncclbench.faults.preflight import within

        plans = self.plans.values()
        solo_bytes = max(p["max_bytes"] for p in plans)
        if "nccl" in self.backends.values():  # a GPU's op alone must outlast its host's call (~20 us)
            solo_bytes = max(solo_bytes, within.SOLO_MIN_BYTES_GPU)
        alone, self.margins["alone"] = within.judge_ranks_alone(self, solo_bytes, max(p["iters"] for p in plans))
        inside = within.judge_inside_pairs(self, PAIR_SHARE * self.setup["budget"])
        self._phase("ranks alone and in pairs")
        self.margins.update(inside.margins)
        self.notes += inside.notes
        self.pair_records += inside.records
        for r, line in inside.bad.items():
            alone[r] = f"{alone[r]}; {line}" if r in alone else line
        self.unsettled = {r: line for r, line in inside.unsettled.items() if r not in alone}
        return alone, inside.links

    # ---- sizing and measuring ----
    def pair_bytes(self) -> int:
        """Bytes per pair exchange where time allows (engine.pair_exchange.pair_effort lowers them
        for a pair that is slow)."""
        return min(PAIR_MAX_BYTES, max(p["cap_bytes"] for p in self.plans.values()))

    def _size_plan(self, dim: str) -> dict:
        """Sizes and iterations for `dim` that fit its share of the budget, chosen by measured
        time, not bytes: all_reduce at growing sizes on every group of the dimension, the
        next size only while it is predicted to fit the calibration's share; the same on
        every rank. A slow NIC or rank thus gets small sizes, not a wait of minutes."""
        s = self.setup
        cap = GPU_MAX_BYTES if self.backends[dim] == "nccl" else CPU_MAX_BYTES
        free = [f["free"] for f in self.facts if f["free"]]
        if free:  # the job may hold most of the memory already: buffers stay within a sixth of what is free
            cap = min(cap, max(MIN_BYTES, _pow2_floor((min(free) - (2 << 30)) // 6)))
        if s["baseline"]:  # sizes the baseline has, so that rows match
            sizes = sorted({k[1] for k in s["baseline"] if k[0] == ALL_REDUCE.name and k[1] <= cap})
            cap = sizes[-1] if sizes else cap
        probed, overhead = self._calibrate(dim, cap, CALIBRATION_SHARE * s["budget"] / len(s["dims"]))
        return fit_plan(probed, MAIN_SHARE * s["budget"] / len(s["dims"]), len(s["collectives"]), cap, overhead)

    def _calibrate(self, dim: str, cap: int, share: float) -> tuple[list[tuple[int, float]], float]:
        """([(bytes, slowest group's seconds per all_reduce)] at sizes growing PROBE_STEP-fold
        from MIN_BYTES (or `cap` if smaller), while the next step's predicted ops fit `share`;
        the seconds one measure() call costs besides its ops, the least seen). Whether to go on
        is decided on what every rank sent, so every rank decides alike: a rank that came in
        later has spent less of its own clock, and had it stopped on its own while another went
        on, each would wait for the other in a different group."""
        start, size, probed, overhead = time.monotonic(), min(MIN_BYTES, cap), [], []
        while True:
            began = time.monotonic()
            rows = self._measure(dim, ALL_REDUCE.name, str(size), iters=PROBE_ITERS, warmup_iters=0, check=0)
            mine = _row_time_us(rows[0]) / 1e6 if rows.has_rows and len(rows) else None
            wall = time.monotonic() - began
            everyone = self.world.exchange((mine, wall, time.monotonic() - start), f"preflight: calibrating {dim}",
                                           self.timeout_s)
            t_op = max((t for t, _w, _s in everyone if t), default=1e-3)
            probed.append((size, t_op))
            overhead.append(max(0.0, max(w for _t, w, _s in everyone) - PROBE_OPS * t_op))
            left = share - max(spent for _t, _w, spent in everyone)
            nxt = min(cap, size * PROBE_STEP)
            if nxt <= size or PROBE_OPS * t_op * nxt / size > left:
                return probed, min(overhead)
            size = nxt

    def _measure(self, dim: str, collective: str, sizes: str, **options):
        from ncclbench.api.measure import _measure

        group = dict(self.setup["dims"])[dim]
        options = dict(options, datatype=self.setup["datatype"], timeout=self.timeout_s)
        return _measure(collective, sizes, group, options, label=self._label(dim, group),
                        parent=self.world, exit_on_timeout=self.exit_on_timeout)

    def _measure_dim(self, dim: str, plan: dict) -> list:
        """Every collective of the plan on this rank's group of `dim`; every group's cells."""
        from ncclbench.faults.preflight.verdict import Cell

        mine, path = [], {}
        for coll in self.setup["collectives"]:
            rows = self._measure(dim, coll, plan["sizes"], iters=plan["iters"], warmup_iters=2, check=1,
                                 per_iter_timing=1)
            if rows.has_rows:
                mine += [Cell(dim, tuple(rows.ranks), row.collective, row.size, placement, _median_busbw(cell),
                              tuple(cell.rank_us), cell.nwrong)
                         for row in rows for placement, cell in row.placements()
                         if getattr(cell, "measured", True) and math.isfinite(cell.busbw)]  # N/A cells say nothing
            if rows.info is not None and rows.info.nccl_path:  # the group's rank 0: the path NCCL's log named
                path = {tuple(rows.ranks): rows.info.nccl_path}
        everyone = self.world.exchange((mine, path), f"preflight: gathering the {dim} numbers", self.timeout_s)
        self.paths.update({g: p for _, part in everyone for g, p in part.items()})
        return [c for part, _ in everyone for c in part]

    def _label(self, dim: str, group) -> str:
        import torch.distributed as dist

        ranks = tuple(dist.get_process_group_ranks(group or dist.GroupMember.WORLD))
        return f"{dim} group {group_name(self.instances, dim, ranks)}"

    def _link_peaks(self, runs: dict) -> dict:
        """{group: link peak GB/s or None}, and the transport lines of each group."""
        from ncclbench.faults.preflight.verdict import transport_notes
        from ncclbench.engine.pathread import path_notes
        from ncclbench.topology.pathview import Path

        self.transport, peaks = {}, {}
        for dim, cells in runs.items():
            for g in self.instances[dim]:
                best = max((c.busbw for c in cells if c.group == g), default=None)
                hosts = [self.host[r] for r in g]
                devices = [self.facts[r]["device"] for r in g]
                env = self.facts[g[0]]["env"]
                here = self.topo.get(hosts[0]) or {}
                facts = {"ib_devices": sorted({n["name"] for n in here.get("nics", []) if n.get("name")})}
                read = path_notes(self.paths.get(g), here.get("nvlink_peak"), best, facts, env)
                if read is None:  # what NCCL's log did not give: the topology and the settings
                    why = Path.from_dict(self.paths.get(g))
                    read = transport_notes(self.backends[dim], hosts, self.topo, devices, env, best,
                                           why.unread_text() if why is not None else None)
                self.transport[g], peaks[g] = read
        return peaks

    # ---- localisation and the report ----
    def _verdict(self, plans, runs, peaks, rel, absolute, wrong, inside):
        from ncclbench.faults.preflight.verdict import PreflightReport

        convicted, inner_links = inside[0], dict(inside[1])
        slow, notes = slow_groups(rel, absolute, self.instances, self.setup["floor"])
        self.notes += notes
        # a slow group with a rank already found slow is explained by it: its partners are
        # not suspects; the rest are, the rank in a slow group of every dimension first
        unexplained = {k: v for k, v in slow.items() if not set(k[1]) & set(convicted)}
        culprit = mesh_culprit(unexplained, {}, set(), self.host, self.instances)
        members = {r for (_d, g) in unexplained for r in g}
        bad, fine, cross = self._localise(sorted(culprit or members), unexplained) if members else ({}, set(), {})
        if culprit and set(culprit) <= fine and members - fine:  # cleared: then the others
            more_bad, more_fine, more_cross = self._localise(sorted(members - fine), unexplained)
            bad.update(more_bad)
            fine |= more_fine
            cross.update(more_cross)
        for pair, line in cross.items():
            inner_links.setdefault(pair, f"with known-good partners: {line}")
        self._phase("pairs")
        bad.update(mesh_culprit(unexplained, bad, fine, self.host, self.instances))
        bad.update(convicted)
        self._slow_nics(runs, slow, bad)
        failures, host_evidence, links = explain(slow, bad, fine, wrong, inner_links, self.host, self.instances,
                                                self.pair_wrong)
        found = finding(host_evidence, bad, self.unsettled, links, inner_links, self.host)
        found.add_causes(self._causes())
        report = PreflightReport(passed=not failures, failures=failures, bad_ranks=sorted(bad),
                                 hosts=found.hosts, links=found.links,
                                 wrong_results=any(wrong.values()) or bool(self.pair_wrong), notes=self.notes,
                                 pairs=self.pair_records)
        report.groups = group_records(runs, peaks, slow, wrong, set(bad) | {r for p in links for r in p}, self.host,
                                      self.instances, self.setup["collectives"], self.backends, self.transport,
                                      self.paths)
        summary = "; ".join(f"{d}: {p['sizes']} B x {p['iters']} iters" for d, p in plans.items())
        report.plan = {"collectives": list(self.setup["collectives"]), "datatype": self.setup["datatype"],
                       "per_dimension": plans, "floor": self.setup["floor"].describe(),
                       "band": self.setup["band"], "link_band": self.setup["link_band"],
                       "alone_band": self.setup.get("alone_band", self.setup["band"]),
                       "socket_band": self.setup["socket_band"] if sockets_between_hosts(self.paths) else None,
                       "summary": summary}
        return report

    def _slow_nics(self, runs: dict, slow: dict, bad: dict) -> None:
        """A host whose NIC runs at under half the others' where the traffic crossing hosts ran
        at the slower rate (groups.slow_nic_hosts): its group slow, the host's
        first rank in that group the culprit."""
        from ncclbench.faults.preflight.groups import slow_nic_hosts

        best = {g: max(c.busbw for c in cells if c.group == g)
                for cells in runs.values() for g in {c.group for c in cells}}
        named = set()  # one culprit per host, from the largest group that showed it
        for g, hosts in sorted(slow_nic_hosts(self.paths, best).items(), key=lambda kv: -len(kv[0])):
            dim = next(d for d, groups in self.instances.items() if g in groups)
            mine = {}
            for h, line in sorted(hosts.items()):  # NCCL's log names a host up to its first dot
                ranks = [r for r in g if self.host[r].split(".")[0] == h]
                if ranks and h not in named:
                    mine[h] = line
                    named.add(h)
                    bad.setdefault(ranks[0], line)
            if mine:
                slow.setdefault((dim, g), []).append(
                    f"best busbw {best[g]:.3g} GB/s between hosts, bound by the NIC of {', '.join(sorted(mine))}")

    def _localise(self, suspects: list[int], slow: dict) -> tuple[dict, set, dict]:
        """Suspects with known-good partners, judged by the localisation core: ({bad rank:
        evidence}, {suspects cleared: high with their partners}, {(a, b): evidence} slow links)."""
        from ncclbench.faults.preflight.pairs import localise
        from ncclbench.locate.schedule import known_good_rounds

        good = [r for r in sorted(self.host) if r not in suspects]
        same_host = {r: any(len({self.host[m] for m in g}) == 1 for (_d, g) in slow if r in g) for r in suspects}
        rounds, alone = known_good_rounds(suspects, good, self.host, same_host)
        if alone:
            self.notes.append(f"rank(s) {ranks_text(alone)}: no known-good partner of the same kind "
                              "(same host or not) to tell the node from the link")
        if not rounds:
            return {}, set(), {}
        loc = localise(self, rounds, PAIR_SHARE * self.setup["budget"])
        self.pair_records += loc.pair_records(self.host.get)
        bad, links, _unsettled = loc.verdict(self.who)
        high = loc.high()
        return ({r: f"with known-good partners: {line}" for r, line in bad.items()},
                {r for r in suspects if r in high}, links)

    def _causes(self) -> dict:
        """{host: [hardware or setting cause]} from every rank's health reading (topology.health)."""
        from ncclbench.topology import health

        readings = {f["rank"]: f["health"] for f in self.facts if f.get("health")}
        return health.causes_by_host(readings, self.host)

    def who(self, rank: int) -> str:
        return f"rank {rank} ({self.host[rank]})"

    def kind_bands(self, kind: tuple) -> tuple[float, float] | None:
        """(band, link band) for pairs across hosts where NCCL ran between hosts over its
        Socket network (the socket row of ncclbench.locate.bands, never below the run's
        bands); None (the run's bands) for every other kind."""
        same_host = kind[0]
        if same_host or not sockets_between_hosts(self.paths):
            return None
        s = self.setup
        return s["socket_band"], s.get("socket_link_band", max(s["link_band"], s["socket_band"]))

    def pair_bytes_for(self, cap_s: float) -> int:
        """Bytes per exchange for a pass whose pairs may take `cap_s` each per round: what the
        cap moves at the slowest rate the calibration saw, at most pair_bytes() (a pair that
        slow runs fewer bytes, engine.pair_exchange.pair_effort; smaller for all would hide a
        slow NIC behind latency)."""
        rate = min((b / t for p in self.plans.values() for b, t in [p["probed_s"][-1]] if t > 0), default=1e12)
        return min(self.pair_bytes(), max(MIN_PAIR_BYTES, _pow2_floor(int(cap_s * rate))))

    def measure_pairs(self, rounds: list, nbytes: int, cap_s: float) -> dict:
        """One pass of the rounds with the one pair exchange on the default group, `nbytes`
        each way, each pair's round capped at `cap_s` seconds (a pair far slower is measured
        with fewer iterations or bytes rather than making every rank wait);
        {(a, b): GB/s per direction}."""
        from ncclbench.api.measure import GroupCall, _own_stream
        from ncclbench.engine.pair_exchange import pair_busbw
        from ncclbench.engine.pair_rounds import guarded_rounds

        call = GroupCall(None, "the preflight pair exchanges", parent=self.world, exit_on_timeout=self.exit_on_timeout)
        times, wrong = guarded_rounds(call, rounds, nbytes, self.timeout_s * len(rounds), _own_stream, cap_s)
        everyone = self.world.exchange((times, wrong), "preflight: gathering the pair times", self.timeout_s)
        call.forget()
        self.pair_wrong |= {(min(r, p), max(r, p)) for r, (_t, peers) in enumerate(everyone) for p in peers}
        return pair_busbw([t for t, _w in everyone], nbytes)

    def alone_times(self, nbytes: int, iters: int, only=None) -> dict:
        """{global rank: seconds per op} of every rank's op alone (its fastest iteration); with
        `only`, of those ranks alone, the others waiting (idle) meanwhile."""
        import torch.distributed as dist

        from ncclbench.api.measure import _measure
        from ncclbench.faults.preflight import within

        me = dist.get_rank()
        if only is not None and me not in only:
            everyone = self.world.exchange(None, "preflight: gathering the ranks' own times", self.timeout_s)
            return {r: t / 1e6 for r, t in enumerate(everyone) if t}
        group = self.solo_group
        if group is None:  # only this rank creates its group (no whole-world step per group)
            group = self.solo_group = dist.new_group([me], use_local_synchronization=True)
        options = dict(iters=iters, warmup_iters=2, check=0, per_iter_timing=1, datatype=self.setup["datatype"],
                       timeout=self.timeout_s)
        rows = _measure(within.SOLO_COLLECTIVE.name, str(nbytes), group, options, label=f"rank {me} alone",
                        parent=self.world, exit_on_timeout=self.exit_on_timeout)
        cell = rows[0].out_of_place if rows.has_rows and len(rows) else None
        mine = None
        if cell is not None and math.isfinite(cell.time_us):
            mine = (cell.per_iter or {}).get("min_us") or cell.time_us  # its best iteration (locate.stats.best_time)
        everyone = self.world.exchange(mine, "preflight: gathering the ranks' own times", self.timeout_s)
        return {r: t / 1e6 for r, t in enumerate(everyone) if t}

    def _timed_out(self, message: str):
        """Every rank's report after a timeout (see preflight_report.timed_out_report)."""
        self._phase("until the timeout")
        return timed_out_report(message, self.host, self.notes)


def fit_plan(probed: list[tuple[int, float]], share: float, ncoll: int, cap: int, overhead: float = 0.02) -> dict:
    """The plan of one dimension from its calibration (`probed`: [(bytes, seconds per op)],
    growing): three sizes a factor 4 apart up to the largest probed, and iterations that
    fit `share` seconds, by a line through the two largest probes (latency + bytes / rate;
    with one probe, every smaller size as slow as it);
    the size is lowered where even ITERS_RANGE[0] iterations would not fit, and past
    MIN_BYTES only one size is kept. `overhead`: seconds a measure() call costs besides its
    ops (measured by the calibration), counted once per collective and size."""
    # one probe: smaller sizes are taken to cost as much (latency-bound), never less
    (s0, t0), (s1, t1) = (probed[-2], probed[-1]) if len(probed) > 1 else (probed[-1], probed[-1])
    slope = max(0.0, (t1 - t0) / (s1 - s0)) if s1 > s0 else 0.0
    base = max(0.0, t1 - slope * s1)

    def per_op(x):
        return base + slope * x

    size, fixed, per_iter, iters, sweep = s1, 0.0, 0.0, ITERS_RANGE[1], []
    while True:
        sweep = [size >> 4, size >> 2, size] if size >> 4 >= 1 else [size]
        per_iter = 2 * ncoll * sum(per_op(x) for x in sweep)
        fixed = overhead * ncoll * len(sweep) + OPS_AROUND_TIMED * per_iter
        iters = int((share - fixed) / per_iter) if per_iter > 0 else ITERS_RANGE[1]
        if iters >= ITERS_RANGE[0] or size >> 2 < MIN_BYTES:
            break
        size >>= 2
    if iters < ITERS_RANGE[0]:  # still too slow at the smallest size: one size only
        sweep = [size]
        per_iter = 2 * ncoll * per_op(size)
        fixed = overhead * ncoll + OPS_AROUND_TIMED * per_iter
        iters = int((share - fixed) / per_iter) if per_iter > 0 else ITERS_RANGE[1]
    iters = max(ITERS_RANGE[0], min(ITERS_RANGE[1], iters))
    sizes = f"{sweep[0]}:{size}:x4"
    return {"sizes": sizes, "iters": iters, "max_bytes": size, "cap_bytes": cap,
            "probed_s": [list(x) for x in probed], "overhead_s": round(overhead, 4), "estimate_s": round(fixed + iters * per_iter, 3)}


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


def _current_device(backends: dict):
    if "nccl" not in backends.values():
        return None
    import torch

    return torch.cuda.current_device()


def _gpu_uuid(backends: dict) -> str | None:
    """The physical GPU this rank runs on (the same UUID for ranks sharing it under MPS)."""
    if "nccl" not in backends.values():
        return None
    import torch

    return str(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", "")) or None


def _health(backends: dict) -> dict:
    """This rank's GPU and settings as topology.health reads them (no GPU: the settings only)."""
    from ncclbench.topology import health

    if "nccl" not in backends.values():
        return health.read_local(0, nvml=None, host=socket.gethostname())
    import torch

    return health.read_local(torch.cuda.current_device(), host=socket.gethostname())


def _free_memory(backends: dict):
    if "nccl" not in backends.values():
        return None
    import torch

    return torch.cuda.mem_get_info()[0]


def _topology_facts() -> dict | None:
    """This host's GPU links, NVLink peak and RDMA NICs, for the transport lines."""
    from ncclbench.topology import probe as topo
    from ncclbench.topology.model import link_peak_gbps
    from ncclbench.faults.preflight.verdict import nic_rate_gbps

    try:
        t = topo.probe(include_nics=True)
    except Exception:  # noqa: BLE001 - context only: without it the transport lines say less
        return None
    nics = [{"name": n.name, "layer": p.link_layer, "state": p.state, "rate_gbps": nic_rate_gbps(p.rate)}
            for n in t.nics for p in n.ports]
    return {"codes": t.link_matrix if t.gpu_order == "cuda" else None, "nvlink_peak": link_peak_gbps(t),
            "nics": nics}


