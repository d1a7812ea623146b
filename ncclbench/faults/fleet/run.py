"""A rank's whole run of `ncclbench fleet` (run_fleet_rank), and rank 0's side of it: the
rounds, who measures what in each, and the judgement between them
(ncclbench.locate). Rank 0 is also a rank like the others: it does its own task
of each round before it collects everyone's."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

from ncclbench.engine.pair_exchange import pair_rate
from ncclbench.faults.fleet.worker import SLACK_S, Control, FleetPlan, Worker, build_layout, my_facts, say, task_limit_s
from ncclbench.locate.alone import judge_alone, judge_inventory
from ncclbench.locate.localiser import Localiser, PairTest, localisation_round
from ncclbench.locate.stats import CONFIRM


def run_fleet_rank(plan: FleetPlan, info) -> int:
    """One rank's whole run; its exit code (the same on every rank that lives to the end)."""
    return run_fleet(plan, info)[0]


def run_fleet(plan: FleetPlan, info) -> tuple[int, dict | None]:
    """One rank's whole run: (its exit code, the report as a dict where it has one: rank 0's,
    every rank's with plan.share_report). Joins the job's default process group where the
    caller made one (its store carries the rounds), else makes one on gloo."""
    import torch.distributed as dist

    from ncclbench.launch import launcher as launch

    launch.prepare_environ(info)
    if plan.backend != "gloo":
        import os

        from ncclbench.topology import nccldebug

        nccldebug.arm()  # NCCL's log on (unless the user set it): each pair's path is read from it
        # A pair whose partner is lost times out (-T) in torch's watchdog: abort that pair's
        # communicator and keep the process (2: CleanUpOnly), never tear the healthy rank
        # down (1, 3) with it. Read by each communicator as it is made.
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
        # and abort it soon: no flight-recorder dump first (its wait, 4 x this, comes before the
        # abort), no heartbeat monitor that kills every rank minutes after one timeout
        for key, value in (("TORCH_NCCL_DUMP_ON_TIMEOUT", "0"), ("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "1000"),
                           ("TORCH_NCCL_ENABLE_MONITORING", "0")):
            os.environ.setdefault(key, value)
    facts = my_facts(plan, info)
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=info.rank, world_size=info.world_size,
                                timeout=timedelta(seconds=plan.timeout_s + 30))
    from ncclbench.engine.watchdog import default_store

    ctl = Control(own_client(default_store(), 3 * plan.timeout_s + 120), info.rank, info.world_size,
                  3 * plan.timeout_s + 120)
    started = time.monotonic()
    ctl.post("facts", facts)
    if info.rank == 0:
        coordinator = Coordinator(plan, ctl, started)
        code, worker = coordinator.run(), coordinator.worker
        report = coordinator.report_doc
    else:
        worker = Worker(plan, ctl, facts)
        code = worker.run()
        report = worker.report
    sys.stdout.flush()
    if worker.stuck:  # its task thread may sit in a wait that never ends: no clean-up can finish
        from ncclbench.engine.watchdog import hard_exit

        hard_exit(code)
    return code, report


def causes_of(facts: dict) -> dict:
    """{host: [hardware or setting cause]} from every rank's health reading (topology.health)."""
    from ncclbench.topology import health

    readings = {r: f["health"] for r, f in facts.items() if f.get("health")}
    return health.causes_by_host(readings, {r: f["host"] for r, f in facts.items()})


def own_client(store, timeout_s: float):
    """A client of its own to the rendezvous store's server, for the rounds: torch's store
    client does one operation at a time, and the task thread's group set-ups wait in the
    shared one (up to -T), which would hold a stuck rank's answers back. `store` itself
    where its server cannot be reached so (not a TCPStore)."""
    import torch.distributed as dist

    inner = store
    while inner is not None and hasattr(inner, "underlying_store"):
        inner = inner.underlying_store
    try:
        return dist.TCPStore(inner.host, inner.port, is_master=False, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)
    except Exception:  # noqa: BLE001 - another kind of store: share it
        return store


class Coordinator:
    def __init__(self, plan: FleetPlan, ctl: Control, started: float):
        self.plan, self.ctl, self.started = plan, ctl, started
        self.worker = Worker(plan, ctl, None)
        self.step_no = 0
        self.dead: dict = {}          # node -> what it stopped answering in, or where its rank got stuck
        self.lost: dict = {}          # node -> why it is not judged further (stuck behind a dead partner)
        self.hung: dict = {}          # (node a, node b) -> why: a pair whose both ends got stuck
        self.shaken: dict = {}        # node -> how an exchange of it failed with a partner that was lost or stuck
        self.retested_alone: dict = {}  # node -> how many times it was measured alone again
        self.costs: dict = {}
        self.rounds: list = []        # (label, [(a, b, kind)])
        self.paths: dict = {}         # (node a, node b) -> the path NCCL's log named for their exchange
        self.report_doc: dict | None = None  # the report, as written to --json

    # ---- one step: everyone's tasks, this rank's own, everyone's results ----
    def step(self, tasks: dict, what: str) -> dict:
        label = f"s{self.step_no}"
        self.step_no += 1
        self.ctl.assign(label, {r: tasks.get(r, {}) for r in self.alive})
        begun = time.monotonic()
        self.ctl.post(label, self.worker.bounded(tasks.get(0, {}), self.step_no - 1))
        results, missing = self.ctl.collect(label, self.alive, begun + 2 * self.plan.timeout_s + SLACK_S)
        for r in missing:
            node = self.layout.node_of[r]
            self.dead.setdefault(node, f"rank {r} stopped answering during {what} (no result within "
                                       f"{2 * self.plan.timeout_s + SLACK_S:.0f} s)")
        self.alive = [r for r in self.alive if r not in missing]
        self._judge(tasks, results, missing)
        return results

    def _judge(self, tasks: dict, results: dict, missing: list) -> None:
        """What a round's stuck and failed ranks say, beside the ranks that stopped answering."""
        shaken_before = dict(self.shaken)
        self._judge_stuck(tasks, results, missing, shaken_before)
        self._judge_shaken(tasks, results, missing, shaken_before)

    def _judge_shaken(self, tasks: dict, results: dict, missing: list, shaken_before: dict) -> None:
        """A rank whose exchange failed because its partner stopped answering or got stuck
        mid-round is shaken: torch aborted that communicator under it, and what NCCL or the
        GPU are left with is not vouched for (docs/design/fleet-exchange.md). It stays in the
        pairs; a round in which every exchange of it passes on both sides clears it; when one
        fails again, it is not judged further and that exchange is not held against its
        partner (the test leaves the localisation with the node). Stuck ranks: _judge_stuck."""
        node_of, name = self.layout.node_of, self.layout.names
        shaken_now: dict = {}
        passed: dict = {}  # node -> whether every exchange of it this round passed on both sides
        for r, result in sorted(results.items()):
            peer, node = tasks.get(r, {}).get("peer"), node_of[r]
            if peer is None:
                continue
            failed = result.get("error") or result.get("stuck")
            passed[node] = passed.get(node, True) and not failed and "pair" in results.get(peer, {})
            if not failed:
                continue
            if peer in missing or ("stuck" in results.get(peer, {}) and "stuck" not in result):
                how = "stopped answering" if peer in missing else "got stuck"
                shaken_now.setdefault(node, f"its exchange with rank {peer} ({name[node_of[peer]]}), which {how}, "
                                            f"failed: {failed}")
                continue
            for n in (node, node_of[peer]):
                if n in shaken_before and n not in self.out_of_pairs:
                    self.lost[n] = f"not judged further: {shaken_before[n]}; a later exchange of it failed too"
        # decided on the whole round, whatever order its rails come in: a rail shaken wins
        # over another that passed
        for node, ok in passed.items():
            if ok and node not in shaken_now:
                self.shaken.pop(node, None)
        for node, why in shaken_now.items():
            self.shaken.setdefault(node, why)

    def _judge_stuck(self, tasks: dict, results: dict, missing: list, shaken: dict) -> None:
        """A rank newly stuck in its task: to blame when its partner answered (the exchange
        waited on it); not judged further when the partner stopped answering or its node
        was already out (it waited on the partner); when both ends of a pair are stuck,
        neither can be blamed and the pair is named as a hung link, which fails the run.
        A rank stuck in an exchange of a shaken node (see _judge_shaken), its own or its
        partner's, is not judged further either. Decided on what was known when the round
        ended, whatever order the ranks come in. Either way the node takes part in no more
        pairs."""
        node_of, name = self.layout.node_of, self.layout.names
        out_before = self.out_of_pairs - {node_of[r] for r in missing}
        for r, result in sorted(results.items()):
            node = node_of[r]
            if "stuck" not in result or node in self.dead or node in self.lost:
                continue
            peer = tasks.get(r, {}).get("peer")
            if peer is None:
                self.dead[node] = f"rank {r} {result['stuck']}"
            elif peer in missing:
                self.lost[node] = (f"not judged further: rank {r} {result['stuck']}, waiting for rank {peer} "
                                   f"({name[node_of[peer]]}, which stopped answering)")
            elif node_of[peer] in out_before:
                self.lost[node] = (f"not judged further: rank {r} {result['stuck']}, waiting for rank {peer} "
                                   f"({name[node_of[peer]]}, out of the run already)")
            elif node in shaken or node_of[peer] in shaken:
                whose = node if node in shaken else node_of[peer]
                self.lost[node] = (f"not judged further: rank {r} {result['stuck']}, waiting for rank {peer}; "
                                   f"{name[whose]}: {shaken[whose]}")
            elif "stuck" in results.get(peer, {}):
                self.lost[node] = f"not judged further: rank {r} {result['stuck']} (rank {peer} stuck too)"
                pair = tuple(sorted((node, node_of[peer])))
                self.hung.setdefault(pair, f"the exchange of rank {min(r, peer)} and rank {max(r, peer)} hung: "
                                           f"neither ended within {task_limit_s(self.plan.timeout_s):g} s")
            else:
                self.dead[node] = f"rank {r} {result['stuck']} (rank {peer} of {name[node_of[peer]]} answered)"

    @property
    def out_of_pairs(self) -> set:
        return set(self.dead) | set(self.lost)

    def _phase(self, name: str, since: float) -> float:
        now = time.monotonic()
        self.costs[name] = round(self.costs.get(name, 0.0) + now - since, 3)
        return now

    # ---- the run ----
    def run(self) -> int:
        from ncclbench.faults.fleet.report import FleetReport

        p = self.plan
        facts, _missing = self.ctl.collect("facts", list(range(self.ctl.world)), time.monotonic() + p.timeout_s + SLACK_S)
        self.layout = build_layout(facts)
        self.alive = sorted(facts)
        if len(self.layout.names) < 2:
            return self._nothing_to_judge()
        clock = self._phase("start-up", self.started)
        say(f"{len(self.layout.names)} nodes, {self.ctl.world} ranks; each node alone")
        inventory = judge_inventory(self.layout.gpus, self.layout.models, p.gpus_per_node)
        alone, busbw, errors = self.nodes_alone(inventory)
        clock = self._phase("nodes alone", clock)
        out = set(inventory) | set(alone) | set(errors) | self.out_of_pairs
        active = [n for n in range(len(self.layout.names)) if n not in out]
        loc, schedule = self.pairs(active)
        self._phase("pairs", clock)
        report = FleetReport.build(p, self.layout, inventory, alone, errors, busbw, self.dead, loc, schedule,
                                   self.rounds, self.costs, lost=self.lost, hung=self.hung)
        report.add_paths({(self.layout.names[a], self.layout.names[b]): v for (a, b), v in self.paths.items()})
        report.finding.add_causes(causes_of(facts))
        report.add_retests({self.layout.names[n]: k for n, k in self.retested_alone.items()},
                           {self.layout.names[n] for n in set(alone) | set(errors) | self.out_of_pairs})
        report.emit()
        code = report.exit_code
        self.report_doc = report.to_dict()
        if self.plan.share_report:
            self.ctl.publish("report", self.report_doc)
        label = f"s{self.step_no}"
        self.ctl.assign(label, {r: {"end": code, "report": self.plan.share_report} for r in self.alive if r != 0})
        self.ctl.post(label, {})
        self.ctl.collect(label, self.alive, time.monotonic() + self.plan.timeout_s)  # then the store may go
        return code

    def _nothing_to_judge(self) -> int:
        """One node: nothing to compare it with. Said, exit 2, every rank told to end."""
        from ncclbench.errors import ExitCode, error_line

        why = (f"fleet compares nodes with each other and found one ({self.layout.names[0]}): nothing was judged "
               "(run it across 2 or more nodes; --sim-node-size splits one host's ranks into nodes)")
        print(error_line(why), file=sys.stderr, flush=True)
        code = int(ExitCode.USAGE)
        label = f"s{self.step_no}"
        self.ctl.assign(label, {r: {"end": code} for r in self.alive if r != 0})
        self.ctl.post(label, {})
        self.ctl.collect(label, self.alive, time.monotonic() + self.plan.timeout_s)
        return code

    def nodes_alone(self, inventory: dict) -> tuple[dict, dict, dict]:
        """({node: slow reason}, {node: {collective: busbw}}, {node: error}) of each node's ranks alone."""
        from ncclbench.engine.fleet_exchange import NODE_COLLECTIVES
        from ncclbench.locate.stats import aligned_best_time

        lay = self.layout
        judged = [n for n, ranks in enumerate(lay.ranks) if n not in inventory and len(ranks) >= 2]
        busbw, errors = {}, {}
        for attempt in range(1 + CONFIRM):
            # A node slow alone is measured again (CONFIRM times at most) and judged at its
            # best: a busy host CPU or a neighbour's burst slows one reading, a slow node
            # every one of them.
            label = "the node-alone tests" if attempt == 0 else f"node-alone re-test {attempt}"
            results = self.step({r: {"node": lay.ranks[n]} for n in judged for r in lay.ranks[n]}, label)
            for n in judged:
                if n in self.out_of_pairs or n in errors:
                    continue
                mine = [results[r] for r in lay.ranks[n] if r in results]
                failed = [x["error"] for x in mine if "error" in x]
                if failed:
                    errors[n] = f"node-local collectives failed: {failed[0]}"
                    busbw.pop(n, None)
                    continue
                best = busbw.setdefault(n, {})
                for coll in NODE_COLLECTIVES:
                    seconds = aligned_best_time([x["node"][coll.name] for x in mine])
                    algbw = self.plan.node_bytes / seconds / 1e9 if seconds > 0 else 0.0
                    best[coll.name] = max(best.get(coll.name, 0.0), algbw * coll.bus_factor(len(lay.ranks[n])))
            slow = judge_alone(busbw, self.plan.band)
            judged = [n for n in slow if n not in self.out_of_pairs]
            if not judged or attempt == CONFIRM:
                break
            for n in judged:
                self.retested_alone[n] = self.retested_alone.get(n, 0) + 1
        return slow, busbw, errors

    def pairs(self, active: list[int]) -> tuple[Localiser, str]:
        from ncclbench.locate.schedule import screening_rounds

        p = self.plan
        loc = Localiser(active, p.band, p.floor, link_band=p.link_band, min_pairs=1)  # one pair: the floor judges it
        name, rounds = screening_rounds(len(active), p.all_pairs_rounds, p.screen_rounds, p.seed)
        clock = PairClock(p.budget_s, len(rounds) + p.max_localise)
        if rounds:
            say(f"pairs: about {p.budget_s:g} s stated ({len(rounds)} screening rounds, at most {p.max_localise} "
                f"localisation rounds; each measurement sized by a probe to its share of the time, at most "
                f"{p.nbytes} B per exchange)")
        for k, pairs in enumerate(rounds):
            out = self.out_of_pairs  # a node lost in an earlier round is paired no more: its partner rests
            node_pairs = [(active[a], active[b], "screen") for a, b in pairs if not {active[a], active[b]} & out]
            say(f"round {k + 1} of {len(rounds)} (screening, {name}): {len(node_pairs)} node pairs")
            self.pair_round(loc, node_pairs, clock)
        loc.dead |= self.out_of_pairs
        if p.socket_band and pairs_over_sockets(self.paths):
            say(f"pairs ran over TCP sockets (NCCL's NET/Socket): judged at a {100 * p.socket_band:.0f}% band")
            loc.set_reference(p.socket_band, max(p.socket_link_band or 0.0, p.socket_band))
        else:
            loc.set_reference()
        for k in range(p.max_localise):
            loc.dead |= self.out_of_pairs
            node_pairs = localisation_round(loc, p.seed + k)
            if not any(kind != "spare" for _a, _b, kind in node_pairs):
                break
            asked = sum(1 for _a, _b, kind in node_pairs if kind != "spare")
            say(f"localisation round {k + 1} (at most {p.max_localise}): {asked} node pairs to settle, "
                f"{len(node_pairs) - asked} spare")
            self.pair_round(loc, node_pairs, clock)
        loc.dead |= self.out_of_pairs
        return loc, name

    def pair_round(self, loc: Localiser, node_pairs: list, clock: "PairClock") -> None:
        """One round of node pairs, rail by rail, each measurement aimed at the round's share
        of the time; the tests recorded in `loc`."""
        lay, k = self.layout, len(self.rounds)
        target = clock.target()
        tasks = {}
        for a, b, _kind in node_pairs:
            for ra, rb in zip(lay.ranks[a], lay.ranks[b]):
                tasks[ra], tasks[rb] = {"peer": rb, "target_s": target}, {"peer": ra, "target_s": target}
        results = self.step(tasks, f"pair round {k + 1}")
        clock.done(target)
        self.rounds.append(node_pairs)
        tests = []
        for a, b, kind in node_pairs:
            rails, sizes, error = [], [], None
            for ra, rb in zip(lay.ranks[a], lay.ranks[b]):
                pa, pb = (results.get(r, {}).get("pair") for r in (ra, rb))
                self.paths.setdefault((a, b), (pa or {}).get("path") or (pb or {}).get("path"))
                sizes.append(pa["bytes"] if pa else None)
                if pa and pb and pa["s"] and pb["s"]:
                    rails.append(pair_rate(pa["bytes"], pa["s"], pb["s"]))
                else:
                    rails.append(None)
                    error = error or next((results[r]["error"] for r in (ra, rb) if "error" in results.get(r, {})),
                                          "no result")
            tests.append(PairTest(k, a, b, tuple(rails), kind, error, tuple(sizes)))
        loc.record(tests)


class PairClock:
    """The pair phase against its stated time: each round's measurements aim at an equal
    share of the time left over the rounds that may still come, less what a round costs
    beyond its measurements (group set-up, the store), read from the rounds so far."""

    FIRST_OVERHEAD = 0.25   # of a share, before any round was timed
    LEAST = 0.05            # of a share: the shortest a measurement is aimed at

    def __init__(self, budget_s: float, rounds: int):
        self.budget_s, self.rounds_left = budget_s, max(1, rounds)
        self.begun = time.monotonic()
        self.overhead: float | None = None
        self.round_begun = self.begun
        # never less than this, even with the time spent (a lost node's round costs -T): a
        # measurement starved to a few KiB times latency, not the link, and reads as slow
        self.least_s = self.LEAST * budget_s / self.rounds_left

    def target(self) -> float:
        self.round_begun = time.monotonic()
        share = max(0.0, self.budget_s - (self.round_begun - self.begun)) / self.rounds_left
        overhead = self.FIRST_OVERHEAD * share if self.overhead is None else self.overhead
        return max(self.LEAST * share, share - overhead, self.least_s)

    def done(self, target: float) -> None:
        self.overhead = max(0.0, time.monotonic() - self.round_begun - target)
        self.rounds_left = max(1, self.rounds_left - 1)


def pairs_over_sockets(paths: dict) -> bool:
    """Whether NCCL ran every node pair whose path its log named over its Socket network
    ({(a, b): label such as "NET/Socket/Shared"}), and named one."""
    from ncclbench.locate.bands import over_sockets as sockets

    return sockets(label.split("/")[1] if label.startswith("NET/") else label for label in paths.values() if label)
