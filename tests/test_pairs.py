"""`ncclbench pairs`: the round-robin schedule and the verdict (the localisation core on made-up
numbers), then the real command on gloo ranks (healthy, and with one rank slowed by the test hook)."""

from __future__ import annotations

import csv
import itertools
import json
import random

import pytest

from conftest import run_cli
from ncclbench.engine.pair_exchange import pair_busbw
from ncclbench.errors import ExitCode, PlanError
from ncclbench.locate.schedule import peer_in_round, tournament_rounds
from ncclbench.faults.pairs.report import PairsResult, below_median, slow_pairs
from ncclbench.faults.pairs.run import PairsPlan, localise, parse_percent

# Small enough that gloo's exchanges cost next to nothing; the launch (torch imports on
# 2 cores) dominates each end-to-end test at ~10-20 s.
TINY = ["--backend", "gloo", "-b", "4K", "-n", "2", "-w", "1", "-T", "60"]


# ---- schedule ------------------------------------------------------------------------

@pytest.mark.parametrize("n", range(0, 14))
def test_tournament_covers_every_pair_once_and_keeps_ranks_busy(n):
    rounds = tournament_rounds(n)
    seen = [pair for r in rounds for pair in r]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))  # each pair exactly once, a < b
    expected_rounds = 0 if n < 2 else (n - 1 if n % 2 == 0 else n)
    assert len(rounds) == expected_rounds
    for pairs in rounds:
        busy = [rank for pair in pairs for rank in pair]
        assert len(busy) == len(set(busy)), "a rank in two pairs of one round"
        assert len(pairs) == n // 2  # even: everyone busy; odd: exactly one rank idle


def test_peer_in_round():
    pairs = [(0, 3), (1, 2)]
    assert [peer_in_round(pairs, r) for r in range(5)] == [3, 2, 1, 0, None]


# ---- numbers ---------------------------------------------------------------------------

def test_pair_busbw_takes_the_slower_side():
    # rank 0 saw 1 ms with rank 1, rank 1 saw 2 ms: the exchange is over after 2 ms
    times = [{1: 0.001, 2: 0.001}, {0: 0.002, 2: 0.001}, {0: 0.001, 1: 0.004}]
    busbw = pair_busbw(times, 2_000_000)
    assert busbw[(0, 1)] == pytest.approx(1.0)  # 2 MB / 2 ms = 1 GB/s
    assert busbw[(1, 2)] == pytest.approx(0.5)
    assert busbw[(0, 2)] == pytest.approx(2.0)
    assert set(busbw) == {(0, 1), (0, 2), (1, 2)}


def test_slow_pairs_flags_only_pairs_far_below_the_median():
    values = {(0, 1): 100, (0, 2): 100, (0, 3): 100, (1, 2): 40, (1, 3): 100, (2, 3): 85}
    assert [(a, b) for a, b, _, _ in slow_pairs(values, 20)] == [(1, 2)]
    (a, b, v, pct), = slow_pairs(values, 20)
    assert v == 40 and pct == pytest.approx(60.0)  # median of the six pairs is 100
    assert [(a, b) for a, b, _, _ in slow_pairs(values, 10)] == [(1, 2), (2, 3)]
    assert slow_pairs(values, 60) == []  # "more than" 60%: exactly 60% is not flagged


def test_below_median_lists_every_pair_slowest_first():
    ranked = below_median({(0, 1): 10, (0, 2): 30, (1, 2): 20})
    assert [(a, b) for a, b, _, _ in ranked] == [(0, 1), (1, 2), (0, 2)]
    assert [round(p) for *_, p in ranked] == [50, 0, -50]


def test_slow_pairs_edge_cases():
    assert slow_pairs({}, 20) == []
    assert slow_pairs({(0, 1): 5.0}, 20) == []  # one pair is its own median
    assert slow_pairs({pair: 7.0 for pair in itertools.combinations(range(5), 2)}, 1) == []


@pytest.mark.parametrize("text, value", [("20%", 20.0), ("20", 20.0), (" 12.5 % ", 12.5)])
def test_parse_percent(text, value):
    assert parse_percent(text) == value


@pytest.mark.parametrize("text", ["abc", "0", "100%", "-5%", "%"])
def test_parse_percent_refuses(text):
    with pytest.raises(PlanError):
        parse_percent(text)


# ---- the verdict: the localisation core on made-up numbers ------------------------------

def devices_of(n: int, per_host: int = 1) -> list[dict]:
    return [{"rank": r, "pid": 100 + r, "host": f"node{r // per_host}", "device": r % per_host,
             "device_hex": "cpu", "device_info": "CPU (gloo)"} for r in range(n)]


def fabric(slow_rank=None, slow_link=None, noise=0.05, seed=0, slow=0.01):
    """GB/s per pair: 1.0 with noise; `slow` x that where a pair holds the slow rank or is the
    slow link (100x: gloo's links are judged at a 95% band)."""
    rng = random.Random(seed)

    def measure(rounds):
        out = {}
        for pairs in rounds:
            for a, b in pairs:
                hit = slow_rank in (a, b) or {a, b} == set(slow_link or ())
                out[(a, b)] = (slow if hit else 1.0) * rng.gauss(1.0, noise)
        return out, []
    return measure


def decided(n=4, per_host=1, fail_below=None, band=None, wrong=(), **faults):
    plan = PairsPlan(nbytes=1_000_000, iters=2, warmup_iters=1, backend="gloo", timeout_s=60,
                     fail_below=fail_below, json_path=None, csv_path=None, band=band)
    devices = devices_of(n, per_host)
    measure = fabric(**faults)
    busbw, _ = measure(tournament_rounds(n))
    loc, bad_data, rounds = localise(plan, devices, (busbw, list(wrong)), measure)
    return PairsResult(plan, devices, tournament_rounds(n), busbw, bad_data, loc, rounds)


def test_a_slow_rank_drains_its_host_alone_and_exits_1():
    result = decided(slow_rank=2)
    assert result.finding.drain == ["node2"] and result.finding.links == [], result.finding
    assert result.exit_code() == ExitCode.REGRESSION
    text = "\n".join(result.report_lines("host clock"))
    assert "# DRAIN node2 (rank 2)" in text and "slow with every partner" in text
    assert "then " in text and "localisation round(s)" in text


def test_a_slow_link_names_its_host_pair_and_drains_nothing():
    result = decided(slow_link=(1, 3))
    doc = result.to_dict()
    assert doc["drain"] == [] and [link["hosts"] for link in doc["links"]] == [["node1", "node3"]], doc["hosts"]
    assert doc["links"][0]["ranks"] == [1, 3] and doc["links"][0]["below_pct"] > 80
    assert {h["host"]: h["verdict"] for h in doc["hosts"]} == {"node0": "ok", "node1": "suspect",
                                                                "node2": "ok", "node3": "suspect"}
    assert doc["exit_code"] == ExitCode.REGRESSION and doc["passed"] is False


@pytest.mark.parametrize("seed", range(10))
def test_a_healthy_job_localises_nothing(seed):
    result = decided(n=6, seed=seed, noise=0.1)
    assert not result.finding.localised and result.exit_code() == ExitCode.OK, result.finding


def test_fail_below_is_a_floor_beside_the_verdict_and_wrong_data_exits_7():
    assert decided(fail_below=5.0, noise=0.2, seed=1).exit_code() == ExitCode.REGRESSION
    assert decided(wrong=[(0, 1)]).exit_code() == ExitCode.WRONG_RESULTS


def test_two_ranks_are_not_judged_and_say_so():
    result = decided(n=2, slow_link=(0, 1))
    assert not result.finding.localised and result.exit_code() == ExitCode.OK
    assert any("not judged" in n for n in result.finding.notes), result.finding.notes


def test_pairs_of_one_host_are_compared_among_themselves():
    """2 hosts of 2 ranks: the two pairs on one host are a kind too small to judge; the four
    pairs across hosts find a slow rank."""
    result = decided(n=4, per_host=2, slow_rank=3)
    assert result.finding.drain == ["node1"], result.finding


# ---- the command, for real -------------------------------------------------------------

def matrix_rows(stdout: str) -> dict[int, tuple[str, list[str]]]:
    """rank -> (host, cells) from the matrix printed by rank 0."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        rank, host, *cells = line.split()
        rows[int(rank)] = (host, cells)
    return rows


def test_usage_errors_are_one_line_and_exit_2():
    for args, words in ((["--fail-below", "150%"], "between 0% and 100%"),
                        (["-g", "1"], "at least 2 ranks"),
                        (["-g", "2", "-b", "0"], "at least 1 byte")):
        proc = run_cli(["pairs", *TINY, *args], timeout=60)
        assert proc.returncode == ExitCode.USAGE, proc.stderr
        assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
        assert proc.stdout == ""


@pytest.mark.slow
def test_pairs_on_four_gloo_ranks(tmp_path):
    out_json, out_csv = tmp_path / "pairs.json", tmp_path / "pairs.csv"
    proc = run_cli(["pairs", "-g", "4", *TINY, "--json", str(out_json), "--csv", str(out_csv)], timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("#  Rank ") == 4
    assert "3 rounds of 2 pairs side by side" in proc.stdout
    assert "# Slowest pairs:" in proc.stdout or "# No pair below the median" in proc.stdout
    rows = matrix_rows(proc.stdout)
    assert sorted(rows) == [0, 1, 2, 3]
    for r, (_host, cells) in rows.items():
        assert len(cells) == 4 and cells[r] == "-"
        assert all(float(cells[c]) > 0 for c in range(4) if c != r)
        assert all(cells[c] == rows[c][1][r] for c in range(4))  # symmetric

    doc = json.loads(out_json.read_text())
    assert doc["nranks"] == 4 and doc["size_bytes"] == 4096
    assert sorted(map(tuple, (p for r in doc["rounds"] for p in r))) == list(itertools.combinations(range(4), 2))
    assert len(doc["pairs"]) == 6 and not any(p["wrong_data"] for p in doc["pairs"])
    with open(out_csv, newline="") as f:
        records = list(csv.DictReader(f))
    assert [(int(r["rank_a"]), int(r["rank_b"])) for r in records] == list(itertools.combinations(range(4), 2))


@pytest.mark.slow
def test_slow_rank_is_flagged_and_fails_the_run(tmp_path):
    """Rank 1 sleeps 0.1 s in each timed exchange: its three pairs are ~50x slower than the
    others, so they sit below the median (the mean of one slow and one fast pair) and only
    they are flagged, however noisy the fast pairs are on a busy 2-core machine."""
    out_json = tmp_path / "pairs.json"
    proc = run_cli(["pairs", "-g", "4", *TINY, "--fail-below", "20%", "--json", str(out_json)],
                   env={"NCCLBENCH_PAIRS_SLOW": "1"}, timeout=180)
    assert proc.returncode == ExitCode.REGRESSION, proc.stdout + proc.stderr
    assert "3 pair(s) more than 20% below the median" in proc.stdout
    doc = json.loads(out_json.read_text())
    flagged = {(p["rank_a"], p["rank_b"]) for p in doc["pairs"] if p["flagged"]}
    assert flagged == {(0, 1), (1, 2), (1, 3)}
    # the verdict: rank 1 slow with every partner, its host (the only one) to drain, no link
    assert doc["drain"] == [doc["devices"][1]["host"]] and doc["links"] == [], doc["hosts"]
    assert any("rank 1" in e for e in doc["hosts"][0]["evidence"]), doc["hosts"]


@pytest.mark.slow
def test_odd_world_idles_one_rank_per_round(tmp_path):
    """3 ranks: 3 rounds of one pair, the third rank waiting in each round's barrier. Rank 1
    is slowed: the pair without it must come out fastest, which shows each time landed in
    its own pair's cell; the localisation rounds settle rank 1 as slow with every partner."""
    out_json = tmp_path / "pairs.json"
    proc = run_cli(["pairs", "-g", "3", *TINY, "--json", str(out_json)],
                   env={"NCCLBENCH_PAIRS_SLOW": "1"}, timeout=180)
    assert proc.returncode == ExitCode.REGRESSION, proc.stdout + proc.stderr
    assert "3 rounds of 1 pair side by side (round-robin; one rank idle per round)" in proc.stdout
    doc = json.loads(out_json.read_text())
    assert all(len(r) == 1 for r in doc["rounds"])
    assert sorted(tuple(p) for r in doc["rounds"] for p in r) == [(0, 1), (0, 2), (1, 2)]
    fastest = max(doc["pairs"], key=lambda p: p["busbw_gbps"])
    assert (fastest["rank_a"], fastest["rank_b"]) == (0, 2)
    assert doc["drain"] == [doc["devices"][1]["host"]] and doc["links"] == [], doc["hosts"]
