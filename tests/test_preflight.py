"""Preflight: the verdict rules on planted numbers, then real ranks under torchrun (gloo) with
a healthy job, a planted slow rank it must name, floors it cannot read, and the command's
timeout on a stalled rank."""

import json

import pytest

from conftest import run_cli
from ncclbench.errors import PlanError, PreflightError
from ncclbench.api.verdict import (Cell, Floor, PreflightReport, judge_absolute, judge_pairs, judge_relative,
                               parse_floor, reference, repair_rounds, slow_outliers, transport_notes)
from test_api import run_ranks


# ---- the rules ----------------------------------------------------------------------------------
def test_one_slow_value_is_flagged_and_noise_is_not():
    assert slow_outliers({"a": 100, "b": 98, "c": 103, "d": 40}, 0.2) == {"d": pytest.approx(0.6, abs=0.02)}
    assert slow_outliers({"a": 100, "b": 90, "c": 103, "d": 85}, 0.2) == {}
    assert slow_outliers({"a": 100}, 0.2) == {}  # no peers, no verdict


def test_reference_is_not_dragged_down_by_a_slow_half():
    """Two groups of four slow (a 2x2 mesh with one bad rank): the reference stays healthy."""
    ref, _ = reference([10, 10, 100, 101])
    assert ref == pytest.approx(100.5)
    assert set(slow_outliers({0: 10, 1: 10, 2: 100, 3: 101}, 0.2)) == {0, 1}


def test_noise_in_the_good_half_widens_the_band():
    quiet = dict(enumerate([60, 100, 102, 98, 101, 99]))
    assert list(slow_outliers(quiet, 0.2)) == [0]
    noisy = dict(enumerate([60, 70, 90, 100, 130, 160]))  # the better half itself spreads widely
    _, spread = reference(list(noisy.values()))
    assert spread > 0 and slow_outliers(noisy, 0.2) == {}


def _cells(dim, times_by_group, busbw_by_group):
    return [Cell(dim, g, "all_reduce", size, "out_of_place", busbw_by_group[g], times_by_group[g])
            for g in busbw_by_group for size in (1 << 20, 4 << 20)]


def test_relative_judgement_finds_the_slow_group_and_its_ranks():
    cells = _cells("tp", {(0, 1): (900.0, 905.0), (2, 3): (100.0, 101.0)}, {(0, 1): 1.0, (2, 3): 9.0})
    found = judge_relative(cells, 0.2)
    assert list(found.groups) == [(0, 1)] and set(found.ranks) == {0, 1}


def test_floors():
    assert parse_floor(None) == Floor()
    assert parse_floor("80%") == Floor("percent", 80.0)
    assert parse_floor(300) == Floor("gbps", 300.0)
    assert parse_floor("base.json", "5%").kind == "baseline"
    for bad in ("0", "-3", "120%", "x%"):
        with pytest.raises(PlanError):
            parse_floor(bad)
    cells = _cells("dp", {(0, 1): (1.0, 1.0), (2, 3): (1.0, 1.0)}, {(0, 1): 350.0, (2, 3): 420.0})
    assert list(judge_absolute(cells, Floor("gbps", 400.0), {}, None)) == [(0, 1)]
    peaks = {(0, 1): 478.0, (2, 3): 478.0}
    assert list(judge_absolute(cells, Floor("percent", 80.0), peaks, None)) == [(0, 1)]
    assert judge_absolute(cells, Floor("percent", 80.0), {}, None) == {}  # peak unknown: not judged
    base = {("all_reduce", 1 << 20, "out_of_place"): 400.0, ("all_reduce", 4 << 20, "out_of_place"): 400.0}
    assert list(judge_absolute(cells, Floor("baseline", 0, "b", 0.1), {}, base)) == [(0, 1)]


def test_pairs_tell_a_bad_node_from_a_bad_link():
    host = {0: "a", 1: "a", 2: "b", 3: "b"}
    rounds, alone = repair_rounds([1, 0], [2, 3], host, {1: False, 0: False})
    assert alone == [] and all(len({r for p in rnd for r in p}) == 2 * len(rnd) for rnd in rounds)
    assert rounds == [[(0, 3), (1, 2)]]  # both suspects at once, each with a good rank on another host
    same = {0: True}  # rank 0 wants a partner on its own host: only rank 1 is there, and it is a suspect
    assert repair_rounds([0], [2, 3], host, same) == ([], [0])
    # rank 1 is slow with every good partner, rank 0 is fine: 1 is the bad node
    repeats = [{(1, 2): 1.0, (0, 3): 40.0, (2, 3): 41.0}, {(1, 3): 1.2, (0, 2): 39.0, (2, 3): 40.0}]
    bad, fine = judge_pairs(repeats, [1, 0], {0: "a", 1: "b", 2: "a", 3: "b"}, 0.2)
    assert list(bad) == [1] and fine == {0}
    # slow once, fine once: no accusation
    bad, fine = judge_pairs([repeats[0], {(1, 2): 40.0, (0, 3): 40.0, (2, 3): 41.0}], [1, 0],
                            {0: "a", 1: "b", 2: "a", 3: "b"}, 0.2)
    assert bad == {} and 1 not in fine


def test_transport_lines_say_what_can_be_told():
    topo = {"h": {"codes": [["X", "NV18"], ["NV18", "X"]], "nvlink_peak": 478.0, "nics": []}}
    notes, peak = transport_notes("nccl", ["h", "h"], topo, [0, 1], {}, 360.0)
    assert peak == 478.0 and "NVLink" in notes[0] and "cannot read the transport" in notes[-1]
    notes, _ = transport_notes("nccl", ["h", "h"], topo, [0, 1], {}, 12.0)
    assert any("not used" in n for n in notes)
    notes, _ = transport_notes("nccl", ["h", "h"], topo, [0, 1], {"NCCL_P2P_DISABLE": "1"}, 12.0)
    assert any("NCCL_P2P_DISABLE" in n for n in notes)
    ib = {"nics": [{"name": "mlx5_0", "layer": "InfiniBand", "state": "ACTIVE", "rate_gbps": 50.0}]}
    notes, peak = transport_notes("nccl", ["a", "b"], {"a": ib, "b": ib}, [0, 0], {}, 2.0)
    assert peak == 50.0 and any("socket fallback" in n for n in notes)


def test_report_verdict_and_exit_codes():
    ok = PreflightReport(passed=True)
    ok.raise_if_failed()
    assert ok.exit_code == 0
    bad = PreflightReport(passed=False, failures=["tp[0] (ranks 0,1): slow; rank 1 (h1)", "x"],
                          hosts=[{"host": "h1", "verdict": "drain", "ranks": [1], "evidence": ["e"]}])
    with pytest.raises(PreflightError, match=r"rank 1 \(h1\) \(\+1 more\)") as info:
        bad.raise_if_failed()
    assert info.value.exit_code == 1 and bad.drain == ["h1"]
    assert PreflightReport(passed=False, failures=["t"], timed_out=True).exit_code == 4
    assert PreflightReport(passed=False, failures=["w"], wrong_results=True).exit_code == 7


def test_mesh_spec_lays_ranks_out_like_init_device_mesh():
    from ncclbench.api.preflight import parse_mesh

    assert parse_mesh("dp=2,tp=4", 8) == [("dp", [[0, 4], [1, 5], [2, 6], [3, 7]]),
                                          ("tp", [[0, 1, 2, 3], [4, 5, 6, 7]])]
    for bad in ("dp=3", "dp=2,dp=4", "dp", "tp=0"):
        with pytest.raises(PlanError):
            parse_mesh(bad, 8)


# ---- real ranks ------------------------------------------------------------------------------------
def test_preflight_passes_then_names_a_planted_slow_rank(tmp_path):
    recs = run_ranks("preflight", 4, tmp_path, timeout=400)
    for rec in recs:
        assert rec["healthy"]["passed"], rec["healthy"]["failures"]
        assert rec["healthy"]["groups"] == 4
        slow = rec["slow"]
        assert not slow["passed"] and slow["bad_ranks"] == [1], slow
        assert "rank 1 (" in slow["failures"][0] and "drain" in slow["failures"][0] and slow["exit_code"] == 1
        assert slow["raised"][0] == "PreflightError" and "rank 1" in slow["raised"][1]
        assert slow == recs[0]["slow"]  # the same verdict on every rank
        for key in ("sum_after_healthy", "sum_after_slow", "sum_after_bad_baseline", "sum_end"):
            assert rec[key] == 10, key
        assert rec["bad_baseline"][0] == "PlanError" and "no-such-baseline.json" in rec["bad_baseline"][1]
        assert rec["rank1_baseline"][0] == "PlanError" and "(on rank(s) 1)" in rec["rank1_baseline"][1]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["passed"] is False and doc["drain"] and doc["bad_ranks"] == [1]
    assert any(e.startswith("rank 1 ") for h in doc["hosts"] for e in h["evidence"])


def test_a_rank_that_never_calls_preflight_is_named_within_the_timeout_asked_for(tmp_path):
    """preflight(timeout=3) on rank 0 while rank 1 never calls it: its first step (agreeing
    on the inputs) ends at 3 s naming rank 1 (before: 600 s, the default, or until rank 1's
    process went away)."""
    rec = run_ranks("preflight_absent", 2, tmp_path, timeout=120)[0]
    report = rec["report"]
    assert not report["passed"] and report["timed_out"] and report["exit_code"] == 4, rec
    assert "rank(s) 1" in report["failures"][0], rec
    assert rec["elapsed"] < 20, rec  # 3 s, and gloo's own grace after the named ranks


def test_the_agreement_deadline_reads_the_timeout_asked_for():
    from ncclbench.api.preflight import DEFAULT_TIMEOUT_S, _agreement_timeout

    assert _agreement_timeout(3, 10) == 3.0
    assert _agreement_timeout(None, 30) == 90.0 and _agreement_timeout(None, 1) == 60.0
    assert _agreement_timeout("soon", 1) == DEFAULT_TIMEOUT_S == _agreement_timeout(-1, 1)
    assert _agreement_timeout(None, "x") == DEFAULT_TIMEOUT_S


def test_command_times_out_on_a_stalled_rank(tmp_path):
    report = tmp_path / "report.json"
    r = run_cli(["preflight", "-g", "2", "--backend", "gloo", "--budget", "1", "-T", "3", "--json", str(report)],
                env={"NCCLBENCH_FAULT": "stall:rank=1,size=4096,seconds=60"}, timeout=120)
    assert r.returncode == 4, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench: error:")]
    assert len(errors) == 1 and "rank(s) 1 never reached it" in errors[0], r.stderr
    doc = json.loads(report.read_text())
    assert doc["timed_out"] and doc["drain"] and doc["hosts"][0]["ranks"] == [1]


def test_the_rank_in_a_slow_group_of_every_dimension_is_named():
    """A 2x2 mesh with one slow rank: its tp group and its dp group are slow, and it is the
    only rank in both; with one dimension there is no such evidence."""
    from ncclbench.api.preflight import Preflight

    p = Preflight.__new__(Preflight)
    p.host = {0: "a", 1: "a", 2: "b", 3: "b"}
    p.instances = {"tp": [(0, 1), (2, 3)], "dp": [(0, 2), (1, 3)]}
    slow = {("tp", (0, 1)): ["x"], ("dp", (1, 3)): ["y"]}
    assert list(p._mesh_culprit(slow, {}, set())) == [1]
    assert p._mesh_culprit(slow, {}, {1}) == {}  # cleared by the pair rounds
    assert p._mesh_culprit({("tp", (0, 1)): ["x"]}, {}, set()) == {}
