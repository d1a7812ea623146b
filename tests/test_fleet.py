"""`ncclbench fleet`: the schedules and verdict rules alone (at 1,024 and 8,192 nodes), and the
command on simulated nodes that are real network hosts (tests/netsim.py) with planted faults:
a slow NIC, a slow link, a node short of ranks, a node killed mid-run."""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

import pytest

from conftest import ROOT, cli_command, run_cli
from ncclbench.locate.alone import judge_alone, judge_inventory
from ncclbench.locate.localiser import Localiser, PairTest, planted_fabric, simulate
from ncclbench.locate.schedule import check_round, circle_round, screening_rounds, tournament_rounds

sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402


# ---- schedules ---------------------------------------------------------------------------------
def test_one_circle_round_equals_the_tournament_table():
    for n in (2, 3, 8, 17):
        assert [circle_round(n, k) for k in range(len(tournament_rounds(n)))] == tournament_rounds(n)


@pytest.mark.parametrize("n", [1024, 8192])
def test_large_fleets_get_a_few_disjoint_rounds_with_every_node_busy(n):
    name, rounds = screening_rounds(n)
    assert name == "shuffled round-robin" and len(rounds) == 4
    seen = set()
    for pairs in rounds:
        check_round(pairs, n)
        assert len({x for p in pairs for x in p}) == n  # every node busy
        seen |= {frozenset(p) for p in pairs}
    assert len(seen) == 4 * n // 2  # no pair twice


def test_small_fleets_get_all_pairs():
    name, rounds = screening_rounds(6)
    assert name == "all pairs" and len({frozenset(p) for r in rounds for p in r}) == 15


# ---- verdict rules ----------------------------------------------------------------------------
def _faulty(n, bad, links, noise=0.05, seed=1):
    rng = random.Random(seed)

    def measure(_k, a, b):
        slow = a in bad or b in bad or (min(a, b), max(a, b)) in links
        return [(40 if slow else 100) * rng.gauss(1, noise) for _ in range(8)]
    return measure


@pytest.mark.parametrize("n", [1024, 8192])
def test_localisation_names_bad_nodes_and_links_in_few_rounds(n):
    rng = random.Random(n)
    _, rounds = screening_rounds(n)
    bad = set(rng.sample(range(n), 3))
    links = set(rng.sample([p for r in rounds for p in r if not set(p) & bad], 2))
    loc, _name, screened, extra = simulate(n, 8, _faulty(n, bad, links), 0.2, 4, 6)
    found, found_links, suspects = loc.verdict(str)
    assert set(found) == bad and set(found_links) == links and not suspects
    assert len(screened) + extra <= 6  # rounds: a handful, against n(n-1)/2 pairs


def test_one_sided_contention_drains_nothing_healthy_and_finds_every_planted_fault():
    """1,024 nodes, 8 rails, 10% of pair tests slowed 1.3-3x by other traffic (one-sided),
    3 bad nodes and 2 bad links planted, 5 trials: exactly the planted faults, in at most
    4 screening + 6 localisation rounds. The screening rounds alone (what a rule without
    re-tests would judge on) show healthy pairs as slow as the planted ones."""
    n = 1024
    for seed in range(5):
        rng = random.Random(1000 + seed)
        _, rounds = screening_rounds(n)
        bad = set(rng.sample(range(n), 3))
        links = set(rng.sample([p for r in rounds for p in r if not set(p) & bad], 2))
        measure = planted_fabric(n, 8, bad, links, noise=0.05, contended=0.1, seed=seed)
        loc, _name, screened, extra = simulate(n, 8, measure, 0.2, 4, 6)
        found, found_links, suspects = loc.verdict(str)
        assert (set(found), set(found_links), suspects) == (bad, links, {}), (seed, loc.judge().contended)
        assert len(screened) + extra <= 10
        screening = [t for t in loc.tests if t.kind == "screen"]
        assert sum(loc.ref.slow(t) for t in screening) > 100  # healthy pairs looked slow once


@pytest.mark.parametrize("n", [16, 1024])
def test_a_healthy_fleet_drains_nothing(n):
    for seed in range(3):
        loc, *_ = simulate(n, 8, _faulty(n, set(), set(), noise=0.08, seed=seed), 0.2, 4, 6)
        assert loc.verdict(str) == ({}, {}, {})


def test_a_link_is_not_a_node():
    loc, *_ = simulate(6, 1, _faulty(6, set(), {(1, 3)}), 0.2, 4, 6)
    found, links, _ = loc.verdict(str)
    assert found == {} and list(links) == [(1, 3)]


def test_inventory_names_short_and_odd_nodes():
    assert judge_inventory({0: 8, 1: 7, 2: 8}, {0: "H100", 1: "H100", 2: "H100"}, None) == {1: "has 7 GPUs of 8 expected"}
    assert "A100" in judge_inventory({0: 8, 1: 8, 2: 8}, {0: "H100", 1: "A100", 2: "H100"}, None)[1]
    assert judge_inventory({0: 4, 1: 4}, {}, 8) == {0: "has 4 GPUs of 8 expected", 1: "has 4 GPUs of 8 expected"}
    slow = judge_alone({0: {"all_reduce": 100}, 1: {"all_reduce": 98}, 2: {"all_reduce": 40}, 3: {"all_reduce": 101}}, 0.2)
    assert list(slow) == [2]


def test_a_failed_exchange_is_slow_and_a_dead_node_is_not_evidence():
    loc = Localiser([0, 1, 2, 3], 0.2)
    loc.record([PairTest(0, 0, 1, (None,), error="boom"), PairTest(0, 2, 3, (100.0,)),
                PairTest(1, 0, 2, (100.0,)), PairTest(1, 1, 3, (99.0,))])
    loc.set_reference()
    assert loc.ref.slow(loc.tests[0])
    loc.dead.add(1)
    assert loc.verdict(str) == ({}, {}, {})


def test_repeats_follow_how_low_a_best_is():
    """A node far below every healthy reading is settled in 2 tests; one as low as a tenth of
    the healthy readings needs more; a tenth at 2,048 pairs at stake more still."""
    from ncclbench.locate.stats import repeats_needed

    assert repeats_needed(0, 5000, 1024) == 2
    assert repeats_needed(500, 5000, 1024) == 7
    assert repeats_needed(500, 5000, 20480) == 8
    assert repeats_needed(0, 13, 6) == 4  # few readings: the estimate stays cautious


def test_pair_clock_shares_the_budget_and_learns_the_overhead(monkeypatch):
    """30 s over 10 rounds: 3 s a round, a quarter kept for set-up until a round was timed;
    then the measured overhead is kept, and the shares shrink with the time spent, never
    below 5% of the nominal share (a starved exchange times latency, not the link)."""
    from ncclbench.faults.fleet import run as fleet_run

    now = [100.0]
    monkeypatch.setattr(fleet_run.time, "monotonic", lambda: now[0])
    clock = fleet_run.PairClock(30.0, 10)
    first = clock.target()
    assert first == pytest.approx(2.25)
    now[0] += first + 0.5  # the round took its target plus 0.5 s of set-up
    clock.done(first)
    second = clock.target()
    assert second == pytest.approx((30.0 - 2.75) / 9 - 0.5)
    now[0] += 40.0  # past the budget: no time left, but a measurement keeps 5% of its nominal share
    clock.done(second)
    assert clock.target() == pytest.approx(0.05 * 30.0 / 10)


# ---- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["-b", "12Q"], ["-b", "0"], ["--band", "150%"], ["--json", ""],
                                  ["--rounds", "0"], ["--json", "/no/such/dir/x.json"], ["-g", "0"]])
def test_bad_input_is_one_line(args):
    r = run_cli(["fleet", "--backend", "gloo", *args], timeout=60)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


# ---- simulated nodes ---------------------------------------------------------------------------
REASON = netsim.why_not()
sim = pytest.mark.skipif(REASON is not None, reason=REASON or "")
FLEET = ["fleet", "--backend", "gloo", "-T", "20"]


def _run(fleet: netsim.SimFleet, tmp_path, nproc=None, kill=None, extra=(), base=FLEET, env=None):
    out = tmp_path / "fleet.json"
    drain = tmp_path / "drain.txt"
    procs = [fleet.start(i, cli_command() + base + list(extra) + ["--json", str(out), "--drain-file", str(drain)],
                         (nproc or {}).get(i, 1), port=29555, env=env(i) if env else None) for i in range(fleet.n)]
    if kill is not None:
        for line in procs[0].stderr:  # the coordinator's progress: kill once the pairs began
            if "round 2 of" in line:
                fleet.kill_node(kill)
                break
    stdout, stderr = procs[0].communicate(timeout=300)
    for p in procs[1:]:
        p.wait(timeout=120)
    report = json.loads(out.read_text())
    return procs[0].returncode, stdout, report, drain.read_text() if drain.exists() else ""


def reason(report: dict, host: str) -> str:
    """A host's evidence in one line, as its drain reason reads."""
    return "; ".join(next(h["evidence"] for h in report["hosts"] if h["host"] == host))


def cap_nic(fleet: netsim.SimFleet, i: int, gbps: float) -> None:
    """Node i's NIC capped at `gbps` GB/s."""
    fleet.slow_nic(i, f"{int(gbps * 8e6)}kbit")


def node_best(report: dict, host: str) -> float:
    """The most a node reached with any partner in any test (GB/s)."""
    return max(t["busbw_gbps"] or 0.0 for t in report["tests"] if host in (t["host_a"], t["host_b"]))


def healthy_reach(reports: list[dict]) -> float:
    """What healthy nodes reach at best: the median over runs and nodes of their bests."""
    import statistics

    return statistics.median(node_best(r, n["host"]) for r in reports for n in r["hosts"])


@pytest.fixture(scope="module")
def healthy_runs(tmp_path_factory):
    """Two healthy runs of 6 nodes: (exit codes, reports); their speed sets the faults below."""
    out = []
    for k in range(2):
        with netsim.SimFleet(6) as fleet:
            code, stdout, report, _ = _run(fleet, tmp_path_factory.mktemp(f"healthy{k}"))
        out.append((code, report, stdout))
    return out


@sim
@pytest.mark.slow
def test_simulated_healthy_fleet_passes_repeatedly(healthy_runs):
    for code, report, stdout in healthy_runs:
        assert (code, report["drain"], report["links"]) == (0, [], []), stdout


def others_reach(report: dict, host: str) -> float:
    """What the nodes other than `host` reached at best in one run: the median of their bests."""
    return statistics.median(node_best(report, n["host"]) for n in report["hosts"] if n["host"] != host)


@sim
@pytest.mark.slow
def test_simulated_nic_4x_slow_drains_that_node_alone(healthy_runs, tmp_path):
    """Node 3's NIC capped at a quarter of what healthy nodes reached at best (gloo over veth on
    shared cores is CPU-bound: healthy pairs spread 5x and more, so a fixed rate would be no
    fault on one machine and a gross one on another). Judged by its best against the others'
    best, with the 60% gloo band (it was 90%).

    The machine's speed can move between runs by more than the band: once in CI the healthy
    nodes of the capped run reached less than 2.5x the cap set from the healthy runs, and node
    3 passed. So a run is judged only where the fault showed in that run (node 3's best at most
    a third of the others'); otherwise the cap is set again from that run's healthy nodes, up
    to 3 runs. A run where it showed must drain node 3 alone."""
    reach = healthy_reach([r for _c, r, _s in healthy_runs])
    seen = []
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        with netsim.SimFleet(6) as fleet:
            cap_nic(fleet, 3, reach / 4)
            code, stdout, report, _ = _run(fleet, tmp_path / str(attempt))
        mine, others = node_best(report, "simnode3"), others_reach(report, "simnode3")
        seen.append((round(reach / 4, 3), round(mine, 3), round(others, 3), code))
        if mine <= others / 3:
            break
        reach = others  # the fault did not show in this run: set the cap from this run's speed
    else:
        pytest.fail(f"a NIC capped 4x below the healthy nodes never ran 3x below them in 3 runs "
                    f"(cap, node 3's best, the others' median best, exit code): {seen}")
    assert code == 1, (seen, stdout)
    assert report["drain"] == ["simnode3"] and not report["links"], (seen, stdout)
    assert report["plan"]["band"] == 0.6


@sim
@pytest.mark.slow
def test_simulated_nic_10x_slow_keeps_the_stated_time(healthy_runs, tmp_path):
    """Node 3's NIC 10x below what healthy nodes reach, 16 MiB per exchange at most and a
    budget of 8 s: sized by bytes, node 3's measurements alone would take about 10x the
    healthy ones in every round it is in; sized by time, the pair rounds stay within 2x the
    budget and node 3's pairs exchange fewer bytes, in every round it is in."""
    reach = healthy_reach([r for _c, r, _s in healthy_runs])
    budget = 8.0
    with netsim.SimFleet(6) as fleet:
        cap_nic(fleet, 3, reach / 10)
        code, stdout, report, _ = _run(fleet, tmp_path, extra=["-b", "16M", "--budget", str(budget)])
    assert report["drain"] == ["simnode3"], stdout
    assert report["cost_s"]["pairs"] <= 2 * budget, report["cost_s"]
    # within each round (one share of the time for all its pairs), node 3's pair against the
    # others: rounds differ in their share, so sizes are compared round by round
    ratios = []
    for k in sorted({t["round"] for t in report["tests"]}):
        mine = [t for t in report["tests"] if t["round"] == k]
        slow = [t["bytes"] for t in mine if "simnode3" in (t["host_a"], t["host_b"])]
        fast = [t["bytes"] for t in mine if "simnode3" not in (t["host_a"], t["host_b"])]
        if slow and fast:
            ratios.append(statistics.median(fast) / max(slow))
    # not 10x: on a loaded 2-core machine the healthy pairs' probes are dominated by the
    # per-exchange cost of gloo ranks sharing the CPUs (1.5-2.7x seen after the file's other
    # tests, more when run alone). Not every round either: rounds whose healthy pairs' probe
    # was caught by other work read 0.65-1.3 (CI once read 3.3, 1.3, 0.97, 5.6, 1.3: a median
    # of 1.3). Sized by bytes, every ratio would be exactly 1: two rounds clearly above it
    # tell sizing by time from sizing by bytes whatever the load.
    assert sum(r >= 1.4 for r in ratios) >= 2, ratios
    assert sum(r > 1 for r in ratios) > len(ratios) / 2, ratios


@sim
@pytest.mark.slow
def test_simulated_slow_nic_drains_that_node_alone(tmp_path):
    with netsim.SimFleet(6) as fleet:
        fleet.slow_nic(2, "40mbit")
        code, stdout, report, drain = _run(fleet, tmp_path)
    assert code == 1, stdout
    assert report["drain"] == ["simnode2"] and not report["links"]
    assert drain.startswith("scontrol update NodeName=simnode2 State=DRAIN Reason=")


@sim
@pytest.mark.slow
def test_simulated_slow_link_names_both_nodes_and_drains_neither(tmp_path):
    with netsim.SimFleet(6) as fleet:
        fleet.slow_link(1, 3, "40mbit")
        code, stdout, report, _ = _run(fleet, tmp_path)
    assert code == 1, stdout
    assert report["drain"] == [] and [link["hosts"] for link in report["links"]] == [["simnode1", "simnode3"]]


@sim
@pytest.mark.slow
def test_simulated_node_short_of_ranks_is_named(tmp_path):
    with netsim.SimFleet(4) as fleet:
        code, stdout, report, _ = _run(fleet, tmp_path, nproc={0: 2, 2: 2, 3: 2})
    assert code == 1, stdout
    assert report["drain"] == ["simnode1"] and reason(report, "simnode1") == "has 1 GPU of 2 expected"


@sim
@pytest.mark.slow
def test_simulated_node_killed_mid_run_is_named_and_the_run_ends(tmp_path):
    start = time.monotonic()
    with netsim.SimFleet(6) as fleet:
        code, stdout, report, _ = _run(fleet, tmp_path, kill=3, extra=["-n", "200"])
    assert code == 1, stdout
    assert report["drain"] == ["simnode3"], report["drain"]
    assert "stopped answering" in reason(report, report["drain"][0])
    assert time.monotonic() - start < 200


@sim
@pytest.mark.slow
def test_simulated_rank_stuck_in_its_exchange_is_named_and_the_run_ends(tmp_path):
    """Node 2's rank never comes back from its first pair (pair_stall: its task thread
    sleeps for an hour, as a host blocked behind a GPU whose exchange never ends): it says
    so once its task limit (2 x -T + 5 s) passes, its partner answered (its wait timed out),
    so node 2 is drained as stuck, the others are judged, and every process ends."""
    start = time.monotonic()
    with netsim.SimFleet(4) as fleet:
        code, stdout, report, _ = _run(fleet, tmp_path, extra=["-T", "8"],
                                       env=lambda i: dict(os.environ, NCCLBENCH_FAULT="pair_stall:rank=2"))
    took = time.monotonic() - start
    assert code == 1, stdout
    assert report["drain"] == ["simnode2"], report["drain"]
    assert "stuck in the exchange with rank" in reason(report, report["drain"][0]), report["drain"]
    assert "answered" in reason(report, report["drain"][0])
    assert report["links"] == [], report["links"]  # the time the stuck round cost starves no later pair
    assert took < 150, took


class _Layout:
    names = ["n0", "n1", "n2", "n3"]
    node_of = {0: 0, 1: 1, 2: 2, 3: 3}


class _TwoRails:
    names = ["A", "B"]
    node_of = {0: 0, 1: 0, 2: 1, 3: 1}


def _judging(layout=None, dead=None, shaken=None, hung=None, backend="gloo", timeout_s=20.0):
    """A Coordinator with only what its round judgement (Coordinator._judge) reads."""
    from ncclbench.faults.fleet import worker as fl
    from ncclbench.faults.fleet.run import Coordinator

    c = Coordinator.__new__(Coordinator)
    c.layout, c.lost = layout or _Layout(), {}
    c.dead, c.shaken, c.hung = dict(dead or {}), dict(shaken or {}), {} if hung is None else hung
    c.plan = fl.FleetPlan(backend=backend, nbytes=1, node_bytes=1, iters=1, warmup=0, timeout_s=timeout_s, band=0.6)
    return c


def _stuck_verdicts(results: dict, missing: list, tasks: dict, layout=None, hung=None) -> tuple[dict, dict]:
    c = _judging(layout, hung=hung)
    for r in missing:
        c.dead[c.layout.node_of[r]] = "stopped answering"
    c._judge(tasks, results, missing)
    return c.dead, c.lost


def test_after_its_partner_is_lost_a_rank_s_next_failure_blames_no_one():
    """Seen on 4 H100s as 4 one-GPU hosts, host 3 killed at round 2: rank 1 (its partner then)
    failed its next exchange, with rank 0, at once, and rank 0 got stuck waiting for it;
    rank 0 was drained. Now neither node 0 nor node 1 is judged further; only node 3 is dead."""
    c = _judging(backend="nccl", timeout_s=30.0)
    ok = {"pair": {}}
    # round 2: (0, 2) healthy, (1, 3): rank 3 killed, rank 1's exchange fails
    c.dead[3] = "rank 3 stopped answering"
    c._judge({0: {"peer": 2}, 2: {"peer": 0}, 1: {"peer": 3}, 3: {"peer": 1}},
             {0: ok, 2: ok, 1: {"error": "DistBackendError: NCCL error: remote process exited"}}, [3])
    assert list(c.dead) == [3] and not c.lost and list(c.shaken) == [1] and "rank 3 (n3)" in c.shaken[1]
    # round 3: (0, 1): rank 0 stuck, rank 1 failed at once
    stuck = {"stuck": "stuck in the exchange with rank 1 (step 3) for more than 65 s"}
    c._judge({0: {"peer": 1}, 1: {"peer": 0}}, {0: stuck, 1: {"error": "DistBackendError: NCCL error"}}, [])
    assert list(c.dead) == [3] and sorted(c.lost) == [0, 1], (c.dead, c.lost)
    assert "n1: its exchange with rank 3" in c.lost[0] and c.lost[1].startswith("not judged further: its exchange")
    # a shaken rank's failed exchange with a healthy partner drops the shaken node, not the partner
    c2 = _judging(dead={3: "gone"}, shaken={1: "its exchange ... failed"}, backend="nccl", timeout_s=30.0)
    c2._judge({0: {"peer": 1}, 1: {"peer": 0}}, {0: {"error": "timed out"}, 1: {"error": "NCCL error"}}, [])
    assert list(c2.lost) == [1] and list(c2.dead) == [3]
    # an exchange of it that passes clears it: a partner stuck later is blamed as before
    c3 = _judging(dead={3: "gone"}, shaken={1: "its exchange ... failed"}, backend="nccl", timeout_s=30.0)
    c3._judge({0: {"peer": 1}, 1: {"peer": 0}}, {0: ok, 1: ok}, [])
    assert not c3.lost and not c3.shaken
    c3._judge({1: {"peer": 2}, 2: {"peer": 1}}, {1: {"error": "watchdog timeout"}, 2: stuck}, [])
    assert sorted(c3.dead) == [2, 3] and not c3.lost, (c3.dead, c3.lost)


def test_a_rank_whose_partner_got_stuck_is_shaken_too():
    """Round 2: rank 3 stuck (drained: rank 1 answered), rank 1's exchange aborted under it.
    Round 3: rank 0 stuck with rank 1, which failed at once: node 0 is not drained."""
    c = _judging(backend="nccl", timeout_s=30.0)
    stuck = {"stuck": "stuck in the exchange (step 2) for more than 65 s"}
    c._judge({1: {"peer": 3}, 3: {"peer": 1}, 0: {"peer": 2}, 2: {"peer": 0}},
             {1: {"error": "watchdog timeout"}, 3: stuck, 0: {"pair": {}}, 2: {"pair": {}}}, [])
    assert list(c.dead) == [3] and list(c.shaken) == [1] and "got stuck" in c.shaken[1]
    c._judge({0: {"peer": 1}, 1: {"peer": 0}}, {0: stuck, 1: {"error": "NCCL error"}}, [])
    assert list(c.dead) == [3] and sorted(c.lost) == [0, 1], (c.dead, c.lost)


class _ThreeTwoRail:
    names = ["A", "B", "C"]
    node_of = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 5: 2}


def test_a_node_is_shaken_by_any_of_its_rails_whatever_their_order():
    """Nodes of two ranks, rails (0,2),(1,3) then (0,4),(1,5): in round 1 one rail of A fails
    beside a rank of B that got stuck, the other passes; in round 2 that rail of A fails at
    once and C's rank waits for it: C is not drained, whichever rail it was."""
    stuck = {"stuck": "stuck in the exchange (step 1) for more than 65 s"}
    ok = {"pair": {}}
    for bad_rail in (0, 1):
        c = _judging(_ThreeTwoRail(), backend="nccl", timeout_s=30.0)
        a_rank, b_rank, c_rank = bad_rail, 2 + bad_rail, 4 + bad_rail
        results = {r: ok for r in (0, 1, 2, 3)}
        results.update({a_rank: {"error": "watchdog timeout"}, b_rank: stuck})
        c._judge({0: {"peer": 2}, 2: {"peer": 0}, 1: {"peer": 3}, 3: {"peer": 1}}, results, [])
        assert list(c.dead) == [1] and list(c.shaken) == [0], (bad_rail, c.dead, c.shaken)
        results = {r: ok for r in (0, 1, 4, 5)}
        results.update({a_rank: {"error": "NCCL error"}, c_rank: stuck})
        c._judge({0: {"peer": 4}, 4: {"peer": 0}, 1: {"peer": 5}, 5: {"peer": 1}}, results, [])
        assert list(c.dead) == [1] and sorted(c.lost) == [0, 2], (bad_rail, c.dead, c.lost)


def test_a_stuck_rank_is_blamed_only_when_its_partner_answered():
    stuck = {"stuck": "stuck in the exchange with rank 1 (step 3) for more than 45 s"}
    tasks = {0: {"peer": 1}, 1: {"peer": 0}, 2: {"peer": 3}, 3: {"peer": 2}}
    # its partner answered (an error: the wait timed out): the stuck rank is the culprit
    dead, lost = _stuck_verdicts({0: stuck, 1: {"error": "timed out"}, 2: {"pair": {}}, 3: {"pair": {}}}, [], tasks)
    assert list(dead) == [0] and "rank 1 of n1 answered" in dead[0] and not lost
    # its partner stopped answering: it waited for a lost node; not judged, not drained
    dead, lost = _stuck_verdicts({0: stuck, 2: {"pair": {}}, 3: {"pair": {}}}, [1], tasks)
    assert list(dead) == [1] and list(lost) == [0] and "n1, which stopped answering" in lost[0]
    # both stuck with each other: neither is blamed, the pair is a hung link (it fails the run)
    hung = {}
    dead, lost = _stuck_verdicts({0: stuck, 1: stuck, 2: {"pair": {}}, 3: {"pair": {}}}, [], tasks, hung=hung)
    assert not dead and sorted(lost) == [0, 1] and list(hung) == [(0, 1)]
    # two nodes of two ranks, rails 0<->2 and 1<->3: rank 1 stuck (rank 3 answered), rank 2
    # stuck (rank 0 answered): both nodes are to blame, whatever order the ranks come in
    rails = {0: {"peer": 2}, 2: {"peer": 0}, 1: {"peer": 3}, 3: {"peer": 1}}
    answered = {"pair": {}}
    for results in ({0: answered, 1: stuck, 2: stuck, 3: answered}, {2: stuck, 3: answered, 0: answered, 1: stuck}):
        dead, lost = _stuck_verdicts(results, [], rails, layout=_TwoRails())
        assert sorted(dead) == [0, 1] and not lost and "rank 3 of B answered" in dead[0], (dead, lost)
    # stuck in its node's own collectives: the node
    dead, lost = _stuck_verdicts({0: stuck, 1: {}, 2: {}, 3: {}}, [], {0: {"node": [0]}})
    assert list(dead) == [0] and not lost


def test_a_hung_pair_fails_the_run_and_drains_neither_node():
    from ncclbench.faults.fleet import worker as fl
    from ncclbench.faults.fleet.report import FleetReport

    plan = fl.FleetPlan(backend="gloo", nbytes=1 << 20, node_bytes=1 << 20, iters=5, warmup=1, timeout_s=8.0, band=0.6)
    layout = fl.Layout(names=["n0", "n1", "n2", "n3"], ranks=[[0], [1], [2], [3]], gpus={n: 1 for n in range(4)},
                       models={n: None for n in range(4)}, node_of={r: r for r in range(4)})
    loc = Localiser([2, 3], 0.6)
    loc.record([PairTest(0, 2, 3, (1.0,))])
    loc.set_reference()
    lost = {0: "not judged further: rank 0 stuck ... (rank 1 stuck too)", 1: "not judged further: rank 1 ..."}
    hung = {(0, 1): "the exchange of rank 0 and rank 1 hung: neither ended within 21 s"}
    report = FleetReport.build(plan, layout, {}, {}, {}, {}, {}, loc, "all pairs", [], {}, lost=lost, hung=hung)
    assert report.drain == [] and report.exit_code == 1
    assert [link["hosts"] for link in report.links] == [["n0", "n1"]]
    assert report.links[0]["evidence"].startswith("hung: the exchange")
    verdicts = {n["host"]: (n["verdict"], n["evidence"]) for n in report.hosts}
    assert verdicts["n0"][0] == "suspect" and any(e.startswith("slow link with n1: hung: the exchange")
                                                  for e in verdicts["n0"][1]), verdicts
    assert verdicts["n2"][0] == "ok"


def test_a_task_past_its_limit_leaves_the_rank_stuck_and_answering():
    import threading

    from ncclbench.faults.fleet import worker as fl

    plan = fl.FleetPlan(backend="gloo", nbytes=1, node_bytes=1, iters=1, warmup=0, timeout_s=0.05, band=0.6)
    worker = fl.Worker.__new__(fl.Worker)
    worker.plan, worker.thread, worker.stuck = plan, None, None
    release = threading.Event()
    worker.do = lambda task, step: (release.wait(60), {"pair": {"s": 1.0}})[1]
    limit = fl.task_limit_s(plan.timeout_s)
    start = time.monotonic()
    first = worker.bounded({"peer": 3}, 5)
    assert limit <= time.monotonic() - start < limit + 2
    assert first == {"stuck": f"stuck in the exchange with rank 3 (step 5) for more than {limit:g} s"}
    start = time.monotonic()
    assert worker.bounded({"peer": 1}, 6) == first and time.monotonic() - start < 0.5  # answers at once
    release.set()
    healthy = fl.Worker.__new__(fl.Worker)
    healthy.plan, healthy.thread, healthy.stuck = plan, None, None
    healthy.do = lambda task, step: {"pair": {"s": 1.0}}
    assert healthy.bounded({"peer": 1}, 0) == {"pair": {"s": 1.0}} and healthy.stuck is None


def test_a_node_slow_once_is_retested_and_its_best_pair_decides():
    """4 nodes, all pairs: node 0's pairs slow in screening only (as a measuring artefact of
    one round would be): retested, fine, nothing named. Slow with every partner every time:
    drained. Slow with two partners every time but at full speed with the third: its NIC
    reaches full speed, so the two pairs are links and node 0 is not drained."""
    def once(k, a, b):
        return [40.0 if 0 in (a, b) and k < 3 and (a, b) != (0, 2) else 100.0]

    def every_partner(k, a, b):
        return [40.0 if 0 in (a, b) else 100.0]

    def two_partners(k, a, b):
        return [40.0 if 0 in (a, b) and (a, b) != (0, 2) else 100.0]

    loc, _name, screened, extra = simulate(4, 1, once, 0.2, 4, 6)
    assert len(screened) == 3 and extra >= 1 and loc.verdict(str) == ({}, {}, {})
    found, links, _suspects = simulate(4, 1, every_partner, 0.2, 4, 6)[0].verdict(str)
    assert list(found) == [0] and links == {}
    loc = simulate(4, 1, two_partners, 0.2, 4, 12)[0]  # the two pairs share node 0: retested in turn
    found, links, _suspects = loc.verdict(str)
    assert found == {} and sorted(links) == [(0, 1), (0, 3)], loc.judge()


def test_a_node_slow_alone_in_every_reading_is_drained_after_its_re_tests(tmp_path):
    """3 nodes of 2 gloo ranks on this host (--sim-node-size 2); rank 2 waits 20 ms after each
    op of its node's collectives (the `slow` fault): node 1 is slow in its first reading
    alone and in both re-tests, and is drained; the JSON counts the re-tests."""
    out = tmp_path / "fleet.json"
    r = run_cli([*FLEET, "-g", "6", "--sim-node-size", "2", "--json", str(out)],
                env={"NCCLBENCH_FAULT": "slow:rank=2,us=20000"}, timeout=180)
    report = json.loads(out.read_text())
    drained = report["drain"]
    assert r.returncode == 1 and len(drained) == 1 and drained[0].endswith("-n1"), r.stdout + r.stderr[-2000:]
    assert "node-local" in reason(report, report["drain"][0])
    retests = report["schedule"]["node_alone_retests"]
    # node 1: both re-tests, then drained. A healthy node caught slow in a reading by a loaded
    # box (CI once saw vm-n2 re-tested once) is re-tested and cleared: the drain above names n1 alone.
    assert retests[drained[0]] == 2, retests


def test_a_node_is_timed_at_its_best_iteration_across_all_its_ranks():
    """Each iteration ends with its slowest rank; the best of those is the node's time. One
    rank's best and another's from different iterations time no collective that ran."""
    from ncclbench.locate.stats import aligned_best_time

    assert aligned_best_time([[1.0, 5.0, 3.0], [5.0, 1.0, 3.0]]) == 3.0
    assert aligned_best_time([[2.0, 9.0], [2.5, 1.0]]) == 2.5
    assert aligned_best_time([[4.0]]) == 4.0


def test_a_node_slow_in_one_reading_alone_is_named_in_a_note_not_drained():
    from ncclbench.faults.fleet import worker as fl
    from ncclbench.faults.fleet.report import FleetReport

    plan = fl.FleetPlan(backend="gloo", nbytes=1, node_bytes=1, iters=1, warmup=0, timeout_s=8.0, band=0.6)
    layout = fl.Layout(names=["n0", "n1"], ranks=[[0, 1], [2, 3]], gpus={0: 2, 1: 2}, models={0: None, 1: None},
                       node_of={0: 0, 1: 0, 2: 1, 3: 1})
    report = FleetReport.build(plan, layout, {}, {}, {}, {}, {}, Localiser([0, 1], 0.6), "all pairs", [], {})
    report.add_retests({"n1": 1}, set())
    assert report.schedule["node_alone_retests"] == {"n1": 1}
    assert any(n.startswith("n1 was slow in a reading of its node alone") and "best of 2 readings" in n
               for n in report.notes), report.notes
    # a host whose re-test failed (or that was drained, lost, slow at its best) gets no such note
    other = FleetReport.build(plan, layout, {}, {}, {1: "node-local collectives failed: x"}, {}, {},
                              Localiser([0, 1], 0.6), "all pairs", [], {})
    other.add_retests({"n1": 1}, {"n1"})
    assert other.schedule["node_alone_retests"] == {"n1": 1} and not any("n1 was slow" in n for n in other.notes)


# ---- NCCL across simulated hosts (a GPU host as 4 hosts of one GPU) ----------------------------
def nccl_host_env(i: int) -> dict:
    """Node i as a host of its own to NCCL: its GPU, its host id, sockets over its eth0."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(i), "NCCL_HOSTID": f"simnode{i}", "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}


@pytest.mark.gpu
@sim
@pytest.mark.parametrize("fault", ["healthy", "nic", "link"])
def test_gpu_fleet_across_simulated_hosts(fault, tmp_path):
    """4 one-GPU hosts, NCCL over sockets between them: healthy passes; node 2's NIC at
    2 Gbit/s is drained alone; the link node1-node3 at 2 Gbit/s is named and nothing is
    drained. Every pair test says the bytes its probe chose."""
    import torch

    if torch.cuda.device_count() < 4:
        pytest.skip("needs 4 GPUs")
    with netsim.SimFleet(4) as fleet:
        if fault == "nic":
            fleet.slow_nic(2, "2gbit")
        elif fault == "link":
            fleet.slow_link(1, 3, "2gbit")
        code, stdout, report, _ = _run(fleet, tmp_path, base=["fleet", "--backend", "nccl", "-T", "60"],
                                       extra=["-b", "64M"], env=nccl_host_env)
    print(stdout)
    drained, links = report["drain"], [link["hosts"] for link in report["links"]]
    expect = {"healthy": ([], []), "nic": (["simnode2"], []), "link": ([], [["simnode1", "simnode3"]])}[fault]
    assert (drained, links) == expect, stdout
    assert code == (0 if fault == "healthy" else 1)
    assert all(t["bytes"] and t["bytes"] <= 64 << 20 for t in report["tests"])
    assert report["cost_s"]["pairs"] <= 2 * report["plan"]["budget_s"], report["cost_s"]


def _pairs_over(path: str | None, fabric, socket_band=0.5, n=4):
    """Coordinator.pairs on made-up numbers, NCCL's log naming `path` for every pair."""
    from ncclbench.faults.fleet import worker as fl
    from ncclbench.faults.fleet.run import Coordinator

    c = Coordinator.__new__(Coordinator)
    c.plan = fl.FleetPlan(backend="nccl", nbytes=1, node_bytes=1, iters=1, warmup=0, timeout_s=30.0, band=0.2,
                          socket_band=socket_band, screen_rounds=3, max_localise=6)
    c.dead, c.lost, c.shaken, c.rounds, c.paths = {}, {}, {}, [], {}

    def pair_round(loc, node_pairs, _clock):
        c.rounds.append(node_pairs)
        for a, b, _kind in node_pairs:
            c.paths.setdefault((a, b), path)
        loc.record([PairTest(len(c.rounds) - 1, a, b, (fabric(a, b),), kind) for a, b, kind in node_pairs])
    c.pair_round = pair_round
    loc, _name = c.pairs(list(range(n)))
    return loc, c


def test_pairs_over_tcp_sockets_are_judged_at_the_socket_band(capsys):
    """Seen on 2 H200 as 4 one-GPU hosts over NCCL's NET/Socket (two hosts per GPU): healthy
    runs drained a host whose pairs sat 23-24 % below the others (the 20 % band), as preflight
    did over sockets before it judged them at 50 %. Now fleet does the same under --band auto:
    that host passes, a NIC 4x slow is still drained alone, and over another network (or
    with a band the user gave) the 20 % band stays."""
    rng = random.Random(3)
    mild = lambda a, b: 1.5 * (0.76 if 2 in (a, b) else 1.0) * rng.gauss(1, 0.02)  # noqa: E731
    loc, _c = _pairs_over("NET/Socket/Shared", mild)
    assert loc.band == 0.5 and loc.verdict(str) == ({}, {}, {}), loc.verdict(str)
    assert loc.ref.cut(0) == pytest.approx(0.5 * loc.ref.ref(0))  # the pairs' cut too, not only the nodes'
    assert "judged at a 50% band" in capsys.readouterr().err
    loc, _c = _pairs_over("NET/IB/0/GDRDMA", mild)
    assert loc.band == 0.2 and list(loc.verdict(str)[0]) == [2], loc.verdict(str)
    loc, _c = _pairs_over("NET/Socket/Shared", mild, socket_band=None)  # --band given: kept
    assert loc.band == 0.2 and list(loc.verdict(str)[0]) == [2]
    slow = lambda a, b: 1.5 * (0.25 if 2 in (a, b) else 1.0) * rng.gauss(1, 0.05)  # noqa: E731
    loc, _c = _pairs_over("NET/Socket/Shared", slow)
    assert loc.band == 0.5 and list(loc.verdict(str)[0]) == [2], loc.verdict(str)
    assert not loc.verdict(str)[1]


@pytest.mark.parametrize("band,backend,expected", [(None, "nccl", (0.2, 0.5)), ("auto", "nccl", (0.2, 0.5)),
                                                   (" AUTO ", "nccl", (0.2, 0.5)), ("30%", "nccl", (0.3, None)),
                                                   ("0.6", "nccl", (0.6, None)), ("auto", "gloo", (0.6, None))])
def test_the_socket_band_comes_with_band_auto_on_nccl_only(band, backend, expected):
    from ncclbench.cli.fleet import build_plan

    o = {"size": None, "min_busbw": None, "json_path": None, "csv_path": None, "drain_path": None, "band": band,
         "iters": None, "warmup_iters": 1, "timeout": 30.0, "budget": 30.0, "gpus_per_node": None,
         "all_pairs_up_to": 16, "rounds": 4, "localise_rounds": 6, "seed": 0, "sim_node_size": None}
    plan = build_plan(o, backend)
    assert plan.band == pytest.approx(expected[0])
    assert plan.socket_band == (pytest.approx(expected[1]) if expected[1] else None)


@pytest.mark.slow
def test_one_node_is_refused_not_passed(tmp_path):
    """Fleet compares nodes: with one (2 ranks on this host), nothing is judged, it says so in
    one line and exits 2 on every rank, no 'passed'."""
    r = run_cli([*FLEET, "-g", "2", "--json", str(tmp_path / "f.json")], timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    assert "found one" in r.stderr and "nothing was judged" in r.stderr and "passed" not in r.stdout
