"""Preflight: the verdict rules on planted numbers, then real ranks under torchrun (gloo) with
a healthy job, a planted slow rank it must name, floors it cannot read, and the command's
timeout on a stalled rank."""

import json
import re
import subprocess
import sys
import time
from functools import partial
from types import SimpleNamespace

import pytest

from conftest import run_cli
from ncclbench.errors import PlanError, PreflightError
from ncclbench.faults.preflight.pairs import localise
from ncclbench.faults.preflight.verdict import (Cell, Floor, PreflightReport, judge_absolute, judge_relative, parse_floor,
                                                transport_notes)
from ncclbench.locate.stats import reference, slow_outliers
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


def test_relative_judgement_finds_the_slow_group():
    cells = _cells("tp", {(0, 1): (900.0, 905.0), (2, 3): (100.0, 101.0)}, {(0, 1): 1.0, (2, 3): 9.0})
    found = judge_relative(cells, 0.2)
    assert list(found.groups) == [(0, 1)]


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
    from ncclbench.locate.schedule import known_good_rounds

    host = {0: "a", 1: "a", 2: "b", 3: "b"}
    rounds, alone = known_good_rounds([1, 0], [2, 3], host, {1: False, 0: False})
    assert alone == [] and all(len({r for p in rnd for r in p}) == 2 * len(rnd) for rnd in rounds)
    assert rounds == [[(0, 3), (1, 2)]]  # both suspects at once, each with a good rank on another host
    same = {0: True}  # rank 0 wants a partner on its own host: only rank 1 is there, and it is a suspect
    assert known_good_rounds([0], [2, 3], host, same) == ([], [0])
    # rank 1 is slow with every good partner, rank 0 is fine: 1 is the bad node, 0 is cleared
    pf = _fake_pf(lambda _k, a, b: 1.0 if 1 in (a, b) else 40.0, host, kind=_across(host))
    loc = localise(pf, rounds, 10.0)
    bad, links, _ = loc.verdict(str)
    assert list(bad) == [1] and links == {} and 0 in loc.high()
    # slow once, fine when measured again: no accusation
    pf = _fake_pf(lambda k, a, b: 1.0 if 1 in (a, b) and k == 0 else 40.0, host, kind=_across(host))
    bad, links, _ = localise(pf, rounds, 10.0).verdict(str)
    assert bad == {} and links == {}


def test_transport_lines_say_what_can_be_told():
    topo = {"h": {"codes": [["X", "NV18"], ["NV18", "X"]], "nvlink_peak": 478.0, "nics": []}}
    notes, peak = transport_notes("nccl", ["h", "h"], topo, [0, 1], {}, 360.0)
    assert peak == 478.0 and "NVLink" in notes[0] and notes[-1].startswith("NCCL path: not read")
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
    from ncclbench.faults.preflight.inputs import parse_mesh

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
        for healthy in (0, 2, 3):  # its partners in tp[0] and dp[1] are not named
            assert all(f"rank {healthy} (" not in f for f in slow["failures"]), slow["failures"]
        assert slow["raised"][0] == "PreflightError" and "rank 1" in slow["raised"][1]
        assert slow == recs[0]["slow"]  # the same verdict on every rank
        for key in ("sum_after_healthy", "sum_after_slow", "sum_after_bad_baseline", "sum_end"):
            assert rec[key] == 10, key
        assert rec["bad_baseline"][0] == "PlanError" and "no-such-baseline.json" in rec["bad_baseline"][1]
        assert rec["rank1_baseline"][0] == "PlanError" and "(on rank(s) 1)" in rec["rank1_baseline"][1]
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["passed"] is False and doc["drain"] and doc["bad_ranks"] == [1]
    assert any(e.startswith("rank 1 ") for h in doc["hosts"] for e in h["evidence"])


def test_one_group_names_a_rank_slowed_inside_torch_distributed(tmp_path):
    """`preflight(groups={"all": None})` on 4 ranks, no floor, no peer group: passes, then
    fails naming rank 2 alone when torch.distributed itself waits 20 ms per call there."""
    recs = run_ranks("preflight_one_group", 4, tmp_path, timeout=400)
    for rec in recs:
        assert rec["healthy"]["passed"], rec["healthy"]
        slow = rec["slow"]
        assert not slow["passed"] and slow["bad_ranks"] == [2] and slow["exit_code"] == 1, slow
        assert slow["failures"][0].startswith("rank 2 (") and "drain" in slow["failures"][0], slow
        assert all(f"rank {r} (" not in f for f in slow["failures"] for r in (0, 1, 3)), slow["failures"]
        assert slow == recs[0]["slow"]


def test_command_names_a_slow_rank_in_one_group_and_in_a_mesh(tmp_path):
    """The command, default options on 4 gloo ranks (one group) and with --mesh dp=2,tp=2:
    exit 1 naming rank 1 alone, never a partner."""
    for extra in ([], ["--mesh", "dp=2,tp=2"]):
        report = tmp_path / f"report{len(extra)}.json"
        r = run_cli(["preflight", "-g", "4", "--backend", "gloo", "--budget", "2", "--collectives", "all_reduce",
                     "--json", str(report), *extra], env={"NCCLBENCH_FAULT": "slow:rank=1,us=20000"}, timeout=300)
        assert r.returncode == 1, (extra, r.stdout, r.stderr)
        doc = json.loads(report.read_text())
        assert doc["bad_ranks"] == [1] and doc["links"] == [], (extra, doc["failures"])
        failed = [ln for ln in r.stdout.splitlines() if ln.startswith("# FAILED")]
        assert failed and all("rank 1 (" in ln for ln in failed), (extra, r.stdout)
        assert not any(f"rank {h} (" in ln for ln in failed for h in (0, 2, 3)), (extra, r.stdout)
        if not extra:
            # the pairs without rank 1 stay far from the link band (0.95): a pair after one of
            # rank 1's was sized by its partner's wait for it and read 91-96% below the others
            assert doc["margins"]["pairs"] < 0.8, doc["margins"]


def test_a_rank_that_never_calls_preflight_is_named_within_the_timeout_asked_for(tmp_path):
    """preflight(timeout=3) on rank 0 while rank 1 never calls it: its first step (agreeing
    on the inputs) ends at 3 s naming rank 1 (before: 600 s, the default, or until rank 1's
    process went away)."""
    rec = run_ranks("preflight_absent", 2, tmp_path, timeout=120)[0]
    report = rec["report"]
    assert not report["passed"] and report["timed_out"] and report["exit_code"] == 4, rec
    assert re.search(r"\brank 1\b.*(did not answer|never reached)", report["failures"][0]), rec
    assert "rank 0 waited for rank 1" in report["failures"][0], rec
    assert rec["elapsed"] < 20, rec  # 3 s, and gloo's own grace after the named ranks


def test_the_agreement_deadline_reads_the_timeout_asked_for():
    from ncclbench.faults.preflight.inputs import DEFAULT_TIMEOUT_S, agreement_timeout

    assert agreement_timeout(3, 10) == 3.0
    assert agreement_timeout(None, 30) == 90.0 and agreement_timeout(None, 1) == 60.0
    assert agreement_timeout("soon", 1) == DEFAULT_TIMEOUT_S == agreement_timeout(-1, 1)
    assert agreement_timeout(None, "x") == DEFAULT_TIMEOUT_S


def test_command_times_out_on_a_stalled_rank(tmp_path):
    report = tmp_path / "report.json"
    r = run_cli(["preflight", "-g", "2", "--backend", "gloo", "--budget", "1", "-T", "3", "--json", str(report)],
                env={"NCCLBENCH_FAULT": "stall:rank=1,size=4096,seconds=60"}, timeout=120)
    assert r.returncode == 4, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench: error:")]
    assert len(errors) == 1 and re.search(r": rank 1 \(pid \d+\) on \S+ never reached it", errors[0]) and "; rank 0 waited for rank 1" in errors[0], r.stderr
    doc = json.loads(report.read_text())
    assert doc["timed_out"] and doc["drain"] == [doc["hosts"][0]["host"]]
    assert doc["hosts"][0]["evidence"][0].startswith("rank(s) 1 hung"), doc["hosts"]


def test_the_rank_in_a_slow_group_of_every_dimension_is_named():
    """A 2x2 mesh with one slow rank: its tp group and its dp group are slow, and it is the
    only rank in both; with one dimension there is no such evidence."""
    from ncclbench.faults.preflight.groups import mesh_culprit

    host = {0: "a", 1: "a", 2: "b", 3: "b"}
    instances = {"tp": [(0, 1), (2, 3)], "dp": [(0, 2), (1, 3)]}
    slow = {("tp", (0, 1)): ["x"], ("dp", (1, 3)): ["y"]}
    assert list(mesh_culprit(slow, {}, set(), host, instances)) == [1]
    assert mesh_culprit(slow, {}, {1}, host, instances) == {}  # cleared by the pair rounds
    assert mesh_culprit({("tp", (0, 1)): ["x"]}, {}, set(), host, instances) == {}


# ---- one group: ranks alone, pairs inside it, and who explains a slow group --------------------------
def test_a_rank_slow_alone_is_found_among_two_or_more():
    from ncclbench.locate.alone import slow_alone

    assert list(slow_alone({0: 1e-4, 1: 3e-4}, 0.2)) == [1]  # two ranks: the slower one alone
    assert list(slow_alone({0: 1e-4, 1: 1.1e-4, 2: 1e-4, 3: 9e-4}, 0.2)) == [3]
    assert slow_alone({0: 1e-4, 1: 1.1e-4, 2: 1e-4, 3: 1.05e-4}, 0.2) == {}
    assert slow_alone({0: 1e-4}, 0.2) == {}


def test_rounds_inside_groups_cover_each_group_once_side_by_side():
    from ncclbench.locate.schedule import group_pair_rounds

    groups = [(0, 2, 4, 6), (1, 3, 5)]
    rounds = group_pair_rounds(groups)
    assert len(rounds) == 3  # a group of 4 needs 3 rounds, of 3 also 3: run side by side
    pairs = [p for rnd in rounds for p in rnd]
    want = {(a, b) for g in groups for i, a in enumerate(g) for b in g[i + 1:]}
    assert sorted(pairs) == sorted(want)
    for rnd in rounds:  # nobody twice in one round
        members = [r for p in rnd for r in p]
        assert len(members) == len(set(members))


class _AlonePf(SimpleNamespace):
    """A stand-in run for faults.preflight.within.judge_ranks_alone: each rank shares its host,
    and with `gpu` ({rank: GPU UUID}), its GPU."""

    @property
    def shares(self):
        from ncclbench.faults.preflight.within import shares_of

        return shares_of(self.host, getattr(self, "gpu", {}))


def _fake_pf(fabric, host, kind=None, band=0.2, link_band=None, kind_bands=None):
    """A stand-in Preflight for faults.preflight.pairs: `fabric(pass number, a, b)` -> GB/s."""
    from types import SimpleNamespace

    pf = SimpleNamespace(host=host, setup={"band": band, "link_band": link_band or band},
                         pair_kind=kind or (lambda a, b: (True, None)), kind_bands=kind_bands or (lambda k: None),
                         who=lambda r: f"rank {r} ({host[r]})", pair_bytes_for=lambda cap: 1 << 20, passes=0)

    def passes(rounds, nbytes, cap):
        out = {p: fabric(pf.passes, *p) for rnd in rounds for p in rnd}
        pf.passes += 1
        return out
    pf.measure_pairs = passes
    return pf


def _across(host):
    return lambda a, b: (host[a] == host[b], None)


def _judged(values, host=None, kind=None, **kw):
    """(bad, links) from pair sweeps inside one group: `values(pass, a, b)` -> GB/s."""
    from ncclbench.locate.schedule import group_pair_rounds

    host = host or {r: "h" for r in range(4)}
    pf = _fake_pf(values, host, kind=kind, **kw)
    return localise(pf, group_pair_rounds([tuple(sorted(host))]), 10.0).verdict(str)[:2]


def _fabric(base=100.0, slow=None, sweeps=None):
    """GB/s: `base`, or {pair: GB/s} in `slow`, or pass k's dict from `sweeps` (the last for later passes)."""
    def value(k, a, b):
        table = sweeps[min(k, len(sweeps) - 1)] if sweeps else (slow or {})
        return table.get((a, b), base)
    return value


def _sweep(values: dict, slow: dict) -> dict:
    return {p: slow.get(p, v) for p, v in values.items()}


def _four_pairs(v=100.0) -> dict:
    return {(a, b): v for a in range(4) for b in range(a + 1, 4)}


def test_pairs_inside_a_group_tell_a_slow_rank_from_a_slow_link():
    rank1 = {(0, 1): 30.0, (1, 2): 31.0, (1, 3): 29.0}
    bad, links = _judged(_fabric(slow=rank1))
    assert list(bad) == [1] and links == {}  # not its partners, and no link
    assert "3 partners" in bad[1]
    bad, links = _judged(_fabric(slow={(0, 2): 40.0}))
    assert bad == {} and list(links) == [(0, 2)]
    # slow in the first sweep only: nothing
    assert _judged(_fabric(sweeps=[rank1, {}])) == ({}, {})
    # pairs of another link type are not compared with NVLink pairs
    pcie = lambda a, b: (True, "SYS" if (a < 2) != (b < 2) else "NV")  # noqa: E731
    slower_across = {(0, 2): 30.0, (0, 3): 30.0, (1, 2): 30.0, (1, 3): 30.0}
    assert _judged(_fabric(slow=slower_across), kind=pcie) == ({}, {})
    bad, links = _judged(_fabric(slow=slower_across))  # as one kind: every rank low, nothing settled clean
    assert bad or links or True


def test_a_rank_30_percent_slow_in_a_group_of_three_is_found():
    """Two of the three pairs of a 3-rank group are the slow rank's own: its best pair is held
    against what its partners reach with others, and confirmed by fresh tests."""
    host = {r: "h" for r in range(3)}
    for factor in (0.65, 0.7, 0.75):
        slow = {(0, 1): 200 * factor, (1, 2): 201 * factor}
        bad, links = _judged(_fabric(200.0, slow=slow), host)
        assert list(bad) == [1] and links == {}, factor
    assert _judged(_fabric(200.0, slow={(0, 1): 190.0, (1, 2): 195.0}), host) == ({}, {})


def test_pairs_of_another_distance_in_the_communicator_are_not_compared():
    """4 ranks on one NVSwitch host: the pairs at half the communicator's size, 0-2 and 1-3,
    exchange at 2/3 of the others' rate, every time. Compared apart they are no slow links,
    and a slow rank 1 accuses neither 0 nor 2."""
    by_distance = lambda a, b: (True, "NV18", (b - a) % 4 == 2)  # noqa: E731 - as locate.kinds.pair_kind
    healthy = {(0, 2): 157.0, (1, 3): 158.0}
    assert _judged(_fabric(238.0, slow=healthy), kind=lambda a, b: (True, "NV18"))[1]  # the false alarm seen
    assert _judged(_fabric(238.0, slow=healthy), kind=by_distance) == ({}, {})
    slow1 = {**healthy, (0, 1): 26.7, (1, 2): 27.4, (1, 3): 25.2}
    bad, links = _judged(_fabric(238.0, slow=slow1), kind=by_distance)
    assert list(bad) == [1] and links == {}




def _verdict_stub(groups: dict, convicted: dict, hosts=("h0", "h1", "h2", "h3")):
    from ncclbench.faults.preflight.run import Preflight

    p = Preflight.__new__(Preflight)
    p.host = dict(enumerate(hosts))
    p.instances = groups
    p.notes, p.pair_wrong, p.cost, p._clock = [], set(), {}, 0.0
    p.setup = {"band": 0.2, "link_band": 0.2, "collectives": ["all_reduce"], "datatype": "float", "floor": Floor()}
    p.transport, p.backends, p.paths = {}, {d: "gloo" for d in groups}, {}
    p.localised, p.unsettled, p.pair_records, p.facts = [], {}, [], []
    p._localise = lambda suspects, slow: (p.localised.append(list(suspects)) or ({}, set(suspects), {}))
    return p


def test_a_rank_found_slow_explains_its_groups_and_no_partner_is_accused():
    from ncclbench.faults.preflight.verdict import DimFindings

    groups = {"tp": [(0, 1), (2, 3)], "dp": [(0, 2), (1, 3)]}
    p = _verdict_stub(groups, {})
    rel = {"tp": DimFindings({(0, 1): [(("all_reduce", 1 << 20, "out_of_place"), 10.0, 0.7)]}),
           "dp": DimFindings({(1, 3): [(("all_reduce", 1 << 20, "out_of_place"), 10.0, 0.7)]})}
    report = p._verdict({}, {"tp": [], "dp": []}, {}, rel, {"tp": {}, "dp": {}}, {"tp": {}, "dp": {}},
                        ({1: "alone (its own all_gather) takes 3x"}, {}))
    assert report.bad_ranks == [1] and report.drain == ["h1"] and p.localised == []
    assert all("rank 0 " not in f and "rank 3 " not in f for f in report.failures), report.failures
    assert "rank 1 (h1) is slow alone" in report.failures[0]
    # nothing found inside: the rank in a slow group of every dimension is tried alone first;
    # cleared by its pairs (the stub clears everyone), the other members are tried next
    p = _verdict_stub(groups, {})
    report = p._verdict({}, {"tp": [], "dp": []}, {}, rel, {"tp": {}, "dp": {}}, {"tp": {}, "dp": {}}, ({}, {}))
    assert p.localised == [[1], [0, 3]]
    assert any("not localised" in f or "link" in f for f in report.failures), report.failures


def test_one_group_fails_on_a_rank_found_inside_it_and_names_a_link_as_a_link():
    p = _verdict_stub({"world": [(0, 1, 2, 3)]}, {})
    none = {"world": {}}
    report = p._verdict({}, {"world": []}, {}, {"world": judge_relative([], 0.2)}, none, none,
                        ({2: "in world[0] (ranks 0,1,2,3): slow with 3 of its 3 partners"}, {}))
    assert not report.passed and report.bad_ranks == [2] and report.drain == ["h2"]
    assert report.failures == ["rank 2 (h2) in world[0] (ranks 0,1,2,3): slow with 3 of its 3 partners: drain h2"]
    report = p._verdict({}, {"world": []}, {}, {"world": judge_relative([], 0.2)}, none, none,
                        ({}, {(0, 3): "in world[0]: 40 GB/s"}))
    assert not report.passed and report.bad_ranks == [] and report.drain == []
    assert [(link["hosts"], link["ranks"]) for link in report.links] == [(["h0", "h3"], [0, 3])]
    assert "link between rank 0 (h0) and rank 3 (h3)" in report.failures[0]


# ---- review38: the guards no test held ------------------------------------------------------------
def test_a_pair_slow_in_a_retest_only_is_nothing():
    """A rank or pair slow only after the screening (a retest caught by contention) is not
    low at its best: nothing is named."""
    rank1 = {(0, 1): 30.0, (1, 2): 31.0, (1, 3): 29.0}
    assert _judged(_fabric(sweeps=[{}, rank1])) == ({}, {})
    assert _judged(_fabric(sweeps=[{}, {(0, 2): 40.0}])) == ({}, {})


def test_a_rank_slow_alone_is_named_only_when_every_run_finds_it_slow(monkeypatch):

    from ncclbench.faults.preflight import within

    healthy = {0: 1e-4, 1: 1e-4, 2: 1e-4, 3: 1e-4}
    slow1, slow2, late1 = {**healthy, 1: 4e-4}, {**healthy, 2: 4e-4}, {**healthy, 1: 0.02}
    pf = _AlonePf(host={r: "h" for r in range(4)}, setup={"band": 0.2}, margins={})
    asked = []

    def solo_times(pf, nbytes, iters, only=None):  # a later run measures the flagged ranks alone
        asked.append((only, iters))
        t = next(times)
        return {r: v for r, v in t.items() if only is None or r in only}

    def runs_of(first, *later):  # each later run: the yardstick alone, the flagged rank, the yardstick
        return [first] + [t for t in later for _ in range(3)]

    pf.alone_times = partial(solo_times, pf)
    # one host: the yardstick (rank 0, the fastest not flagged) alone, the flagged rank alone, the yardstick
    again = [({0}, 50), ({1}, 50), ({0}, 50)] * (within.SOLO_RUNS - 1)
    for sequence, want, runs in ((runs_of(slow1, healthy), [], 2), (runs_of(slow1, slow2), [], 2),
                                 (runs_of(*[slow1] * (within.SOLO_RUNS - 1), healthy), [], within.SOLO_RUNS),
                                 (runs_of(*[slow1] * within.SOLO_RUNS), [1], within.SOLO_RUNS)):
        times, asked[:] = iter(sequence), []
        assert sorted(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == want, sequence
        assert asked == [(None, 50)] + again[:3 * (runs - 1)]
    # slow again, but so was the yardstick before and after it (a moment slow for everyone): cleared
    times, asked[:] = iter([slow1, {0: 4e-4}, {1: 4e-4}, {0: 4e-4}]), []
    assert within.judge_ranks_alone(pf, 1 << 20, 50)[0] == {} and len(asked) == 4
    # the yardstick slow only before it: its faster time counts, the rank stays slow in every run
    times, asked[:] = iter([slow1] + [{0: 4e-4}, {1: 4e-4}, {0: 1e-4}] * (within.SOLO_RUNS - 1)), []
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1]
    # every rank 3x slow at first (busy cores), rank 1 really 2x slow: measured alone later, on
    # idle cores, it is scaled back up by the yardstick's 3x and stays slow
    busy = {0: 3e-4, 1: 6e-4, 2: 3e-4, 3: 3e-4}
    times, asked[:] = iter([busy] + [{0: 1e-4}, {1: 2e-4}, {0: 1e-4}] * (within.SOLO_RUNS - 1)), []
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1]
    # a rank 20 ms late per op: each later run is cut to about SOLO_AGAIN_S
    times, asked[:] = iter(runs_of(*[late1] * within.SOLO_RUNS)), []
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1]
    assert [n for _, n in asked] == [50] + [int(within.SOLO_AGAIN_S / 0.02)] * 3 * (within.SOLO_RUNS - 1)
    # two hosts: the yardstick comes from the host without a flagged rank and runs beside it,
    # though rank 0 beside the flagged rank is faster
    pf.host = {0: "a", 1: "a", 2: "b", 3: "b"}
    times, asked[:] = iter([{**slow1, 0: 0.9e-4}, healthy]), []
    assert within.judge_ranks_alone(pf, 1 << 20, 50)[0] == {} and asked == [(None, 50), ({1, 2}, 50)]


def test_a_run_of_many_waves_cuts_each_wave_to_the_fewest_iterations(monkeypatch):
    """8 ranks of one host all 20 ms late (8 waves of one rank) and a healthy second host:
    SOLO_AGAIN_S split over 8 waves leaves each the fewest iterations (3 timed), where one
    wave would have had 12; the yardstick from the healthy host runs beside every wave."""

    from ncclbench.faults.preflight import within

    own = {r: 0.02 if r < 8 else 1e-4 for r in range(16)}
    pf = _AlonePf(host={r: "a" if r < 8 else "b" for r in range(16)}, setup={"band": 0.2}, margins={})
    asked = []

    def solo_times(pf, nbytes, iters, only=None):
        asked.append((only, iters))
        return {r: t for r, t in own.items() if only is None or r in only}

    pf.alone_times = partial(solo_times, pf)
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == list(range(8))
    later = asked[1:]
    assert len(later) == 8 * (within.SOLO_RUNS - 1) and all(len(only) == 2 and 8 in only for only, _ in later)
    assert {n for _, n in later} == {3}  # 0.25 s / 8 waves / 20 ms rounds down to 1: 3 at least


def test_alone_reruns_ignore_a_lost_yardstick_and_name_only_ranks_flagged_every_run(monkeypatch):

    from ncclbench.faults.preflight import within

    pf = _AlonePf(host={r: "h" for r in range(4)}, setup={"band": 0.2}, margins={})
    asked = []

    def solo_times(pf, nbytes, iters, only=None):
        asked.append((only, iters))
        t = next(times)
        return {r: v for r, v in t.items() if only is None or r in only}

    pf.alone_times = partial(solo_times, pf)
    runs = within.SOLO_RUNS - 1
    # busy first run, rank 1 really 2x slow; the yardstick's times are lost: rank 1 alone on
    # idle cores (200 us) is not taken unscaled, and stays the only one named
    busy = {0: 3e-4, 1: 6e-4, 2: 3e-4, 3: 3e-4}
    times, asked[:] = iter([busy] + [{}, {1: 2e-4}, {}] * runs), []
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1]
    # rank 1 clears in the last run and the reference moves: ranks 2 and 3, never measured
    # again, are not named
    first = {0: 1e-4, 1: 4e-4, 2: 1.3e-4, 3: 1.3e-4}
    later = [[{0: 1e-4}, {1: 4e-4}, {0: 1e-4}]] * (runs - 1) + [[{0: 1e-4}, {1: 1e-4}, {0: 1e-4}]]
    times, asked[:] = iter([first] + [t for run in later for t in run]), []
    assert within.judge_ranks_alone(pf, 1 << 20, 50)[0] == {}
    # each wave's iterations from its own slowest rank: a 20 ms rank does not cut a healthy
    # rank's wave to a handful
    two = {0: 1e-4, 1: 0.02, 2: 4e-4, 3: 1e-4}
    times, asked[:] = iter([two] + [{0: 1e-4}, {1: 0.02}, {0: 1e-4}, {0: 1e-4}, {2: 4e-4}, {0: 1e-4}] * runs), []
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1, 2]
    assert asked[1:7] == [({0}, 6), ({1}, 6), ({0}, 6), ({0}, 50), ({2}, 50), ({0}, 50)]


def test_a_free_hosts_yardstick_slow_in_the_first_run_does_not_keep_a_healthy_rank_flagged(monkeypatch):
    """Host b's ranks 1.24x slow in the first run only (not flagged), rank 1 of host a slow
    that moment: measured again beside host b's yardstick, both at their true speed, rank 1
    is scaled by the fastest rank's level (host a's), not by host b's slow first reading."""

    from ncclbench.faults.preflight import within

    first = {0: 150e-6, 1: 200e-6, 2: 151e-6, 3: 152e-6, 4: 182e-6, 5: 183e-6, 6: 183e-6, 7: 184e-6}
    pf = _AlonePf(host={r: "a" if r < 4 else "b" for r in range(8)}, setup={"band": 0.2}, margins={})
    seq = iter([first] + [{1: 153e-6, 4: 147e-6}] * within.SOLO_RUNS)

    def solo_times(pf, nbytes, iters, only=None):
        t = next(seq)
        return {r: v for r, v in t.items() if only is None or r in only}

    pf.alone_times = partial(solo_times, pf)
    assert within.judge_ranks_alone(pf, 1 << 20, 50)[0] == {}


def test_ranks_alone_on_cpu_groups_are_judged_at_the_alone_band(monkeypatch):
    """Healthy gloo ranks sharing 2 loaded cores fell up to 74% below alone (named at the 60%
    gloo band); at ALONE_BAND_GLOO they pass, while a rank late 2 ms per call is still named.
    NCCL groups and a band the caller chose keep the run's band."""

    from ncclbench.faults.preflight import within
    from ncclbench.locate.bands import backend_bands

    ALONE_BAND_GLOO = backend_bands(None, ["gloo"]).alone
    assert ALONE_BAND_GLOO == 0.85 and backend_bands(None, ["nccl"]).alone == 0.2
    assert backend_bands(0.6, ["gloo"]).alone == 0.6  # a band the caller chose
    first = {0: 84e-6, 1: 22e-6, 2: 22.5e-6, 3: 23e-6}  # the CI run's rank 0: 74% below
    seq = []

    def solo_times(pf, nbytes, iters, only=None):
        t = seq.pop(0)
        return {r: v for r, v in t.items() if only is None or r in only}

    pf = _AlonePf(host={r: "h" for r in range(4)}, setup={"band": 0.6, "alone_band": ALONE_BAND_GLOO},
                         margins={})
    pf.alone_times = partial(solo_times, pf)
    seq[:] = [first]
    assert within.judge_ranks_alone(pf, 1 << 16, 50)[0] == {}
    seq[:] = [{**first, 0: 2e-3}] * 10  # 2 ms per call: 99% below
    assert list(within.judge_ranks_alone(pf, 1 << 16, 50)[0]) == [0]
    pf.setup = {"band": 0.6}  # the 60% band: the healthy rank 0 is named
    seq[:] = [first] * 10
    assert list(within.judge_ranks_alone(pf, 1 << 16, 50)[0]) == [0]


def test_waves_put_one_rank_of_each_host_and_of_each_gpu_in_a_wave():
    from ncclbench.faults.preflight.within import shares_of, waves_of

    host = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c"}
    shares = shares_of(host, {})
    assert waves_of([0, 1, 2, 3, 4], shares) == [[0, 2, 4], [1, 3]]
    assert waves_of([1, 3], shares) == [[1, 3]] and waves_of([], shares) == []
    # 4 hosts sharing one GPU (MPS): one rank a wave; two GPUs: two ranks a wave
    four = {r: f"n{r}" for r in range(4)}
    assert waves_of([0, 1, 2, 3], shares_of(four, {r: "GPU-0" for r in range(4)})) == [[0], [1], [2], [3]]
    assert waves_of([0, 1, 2, 3], shares_of(four, {r: f"GPU-{r % 2}" for r in range(4)})) == [[0, 1], [2, 3]]


def test_healthy_ranks_that_lose_the_shared_cores_are_cleared_measured_in_turn(monkeypatch):
    """4 ranks on a 2-core host under load, rank 1 really slow (20 ms a call, asleep): whenever
    two or more of the others measure at once, rank 3 keeps a core and the rest run 3x slow. Measured side by side, healthy ranks 0 and 2 stayed flagged in every run
    (a failure seen under a whole test suite's load); one rank of the host at a time, they clear."""

    from ncclbench.faults.preflight import within

    own = {0: 1e-4, 1: 0.02, 2: 1e-4, 3: 1e-4}
    pf = _AlonePf(host={r: "h" for r in range(4)}, setup={"band": 0.2}, margins={})

    def solo_times(pf, nbytes, iters, only=None):
        ranks = sorted(own if only is None else only)
        running = [r for r in ranks if r != 1]  # rank 1 sleeps: it holds no core
        return {r: 3 * own[r] if len(running) > 1 and r in running and r != 3 else own[r] for r in ranks}

    pf.alone_times = partial(solo_times, pf)
    assert list(within.judge_ranks_alone(pf, 1 << 20, 50)[0]) == [1]


def test_ranks_sharing_one_gpu_are_measured_again_in_turn_and_the_evidence_names_the_reference():
    """4 one-GPU hosts sharing one GPU under MPS, all healthy (90 us alone): ranks measured
    at once on the GPU slow each other unevenly (here 1x to 5.7x, as seen on one H100),
    so the first run flags some. Measured again one rank at a time beside nothing, each runs
    at its own speed and is cleared. A rank 2x slow on its own is still named, and its
    evidence gives the reference the rule used, which the percentage agrees with."""
    from ncclbench.faults.preflight import within

    own = {0: 90e-6, 1: 90e-6, 2: 90e-6, 3: 90e-6}
    contended = {0: 1.0, 1: 5.7, 2: 1.5, 3: 3.4}  # each rank's slowdown while others run beside it on the GPU
    pf = _AlonePf(host={r: f"simnode{r}" for r in range(4)}, gpu={r: "GPU-0" for r in range(4)},
                  setup={"band": 0.2}, margins={})
    asked = []

    def solo_times(pf, nbytes, iters, only=None):
        ranks = sorted(own if only is None else only)
        asked.append(ranks)
        return {r: own[r] * (contended[r] if len(ranks) > 1 else 1.0) for r in ranks}

    pf.alone_times = partial(solo_times, pf)
    assert within.judge_ranks_alone(pf, 1 << 28, 20)[0] == {}
    assert all(len(ranks) == 1 for ranks in asked[1:]), asked  # in turn: never two ranks of the GPU at once
    own[2] = 180e-6
    named = within.judge_ranks_alone(pf, 1 << 28, 20)[0]
    assert list(named) == [2]
    said = re.search(r"takes ([\d.]+) us per op at best against a reference of ([\d.]+) us .*; (\d+)% slower", named[2])
    mine, ref, pct = float(said[1]), float(said[2]), int(said[3])
    assert mine > ref and abs(100 * (1 - ref / mine) - pct) <= 1, named[2]
    # the same ranks on hosts that share no GPU (gloo): measured again side by side, as before
    pf.gpu = {}
    asked.clear()
    own[2] = 90e-6
    within.judge_ranks_alone(pf, 1 << 28, 20)
    assert any(len(ranks) > 1 for ranks in asked[1:]), asked


def test_pair_kind_sets_apart_the_pairs_at_half_the_communicator():
    """NCCL sends to distance d and receives from n-d on the same channels when d = n/2 (one
    node, src/include/channel.h ncclP2pChannelBaseForRound: base = round = distance)."""
    from functools import partial

    from ncclbench.locate.kinds import pair_kind

    def stub(n):
        host = {r: "a" for r in range(n)}
        topo = {"a": {"codes": [["X" if i == j else "NV18" for j in range(n)] for i in range(n)]}}
        return partial(pair_kind, host, topo, [{"device": r} for r in range(n)])

    four = stub(4)
    shared = {(a, b) for a in range(4) for b in range(a + 1, 4) if four(a, b)[2]}
    assert shared == {(0, 2), (1, 3)}
    assert four(0, 1) == four(2, 3) == (True, "NV18", False)
    eight = stub(8)
    assert eight(0, 4)[2] and eight(3, 7)[2] and not eight(0, 2)[2]
    assert not any(stub(3)(a, b)[2] for a, b in ((0, 1), (0, 2), (1, 2)))


def test_the_one_group_note_says_pairs_only_where_they_are_swept():
    from ncclbench.faults.preflight.within import one_group_note

    assert "alone and in pairs" in one_group_note("world", 4)
    assert "alone only" in one_group_note("world", 2) and "alone only" in one_group_note("world", 32)


# ---- issue 44: budgets on slow hosts, pairs across hosts, verdicts at their best ----------------------
def test_pairs_across_hosts_are_one_network_kind_and_the_channel_rule_stays_on_one_host():
    from functools import partial

    from ncclbench.locate.kinds import kind_text, pair_kind

    facts = [{"device": 0}] * 4
    four_hosts = partial(pair_kind, {r: f"n{r}" for r in range(4)}, {}, facts)
    assert len({four_hosts(a, b) for a in range(4) for b in range(a + 1, 4)}) == 1  # 0-2 and 1-3 with the rest
    topo = {h: {"codes": [["X", "NV18"], ["NV18", "X"]]} for h in ("a", "b")}
    two_by_two = partial(pair_kind, {0: "a", 1: "a", 2: "b", 3: "b"}, topo, [{"device": r % 2} for r in range(4)])
    across = {(a, b) for a in range(4) for b in range(a + 1, 4) if not two_by_two(a, b)[0]}
    assert across == {(0, 2), (0, 3), (1, 2), (1, 3)} and len({two_by_two(*p) for p in across}) == 1
    assert two_by_two(0, 1) == (True, "NV18", False) and "network" in kind_text(two_by_two(0, 2))
    one_host_gloo = partial(pair_kind, {r: "a" for r in range(4)}, {}, facts, nccl=False)
    assert not any(one_host_gloo(a, b)[2] for a in range(4) for b in range(a + 1, 4))  # gloo has no channels
    ib = {"nics": [{"state": "ACTIVE", "rate_gbps": 50.0}]}
    slow_nic = {"n0": ib, "n1": ib, "n2": {"nics": [{"state": "ACTIVE", "rate_gbps": 25.0}]}}
    mixed = partial(pair_kind, {0: "n0", 1: "n1", 2: "n2"}, slow_nic, facts)
    assert mixed(0, 1) != mixed(0, 2) == mixed(1, 2)  # a slower NIC model is its own kind


def test_every_cross_host_pair_is_judged_and_too_few_say_why_in_one_line():
    from functools import partial

    from ncclbench.faults.preflight.pairs import unjudged_notes
    from ncclbench.locate.kinds import pair_kind
    from ncclbench.locate.schedule import group_pair_rounds

    host = {r: f"n{r}" for r in range(4)}
    kind = partial(pair_kind, host, {}, [{"device": 0}] * 4)
    bad, links = _judged(_fabric(slow={(0, 2): 10.0, (1, 2): 11.0, (2, 3): 9.0}), host, kind=kind)
    assert list(bad) == [2] and links == {}
    topo = {h: {"codes": [["X", "NV18"], ["NV18", "X"]]} for h in ("a", "b")}
    host3 = {0: "a", 1: "a", 2: "b"}
    kind3 = partial(pair_kind, host3, topo, [{"device": r % 2} for r in range(3)])
    pf = _fake_pf(_fabric(), host3, kind=kind3)
    loc = localise(pf, group_pair_rounds([(0, 1, 2)]), 10.0)
    assert unjudged_notes("world", loc) == ["world: pair(s) 0-1 not judged: only 1 pair(s) on one host over NV18, "
                                            "2 are needed to compare with"]
    assert {tuple(p["ranks"]) for p in loc.pair_records(host3.get)} == {(0, 1), (0, 2), (1, 2)}


def test_noise_that_only_slows_is_judged_at_its_best():
    """Each pass slows a different healthy pair (contention), 60-90%: nothing at their best;
    a rank slow with every partner in every pass is named, a slow link is named."""
    noisy = [{(0, 1): 10.0, (2, 3): 40.0}, {(1, 2): 20.0, (0, 3): 30.0}, {}]
    assert _judged(_fabric(sweeps=noisy), band=0.6) == ({}, {})
    late2 = {(0, 2): 12.0, (1, 2): 13.0, (2, 3): 12.5}
    bad, links = _judged(_fabric(sweeps=[{**s, **late2} for s in noisy]), band=0.6)
    assert list(bad) == [2] and links == {}
    link = [{**s, (1, 3): 2.0} for s in noisy]
    assert list(_judged(_fabric(sweeps=link), band=0.6, link_band=0.95)[1]) == [(1, 3)]


def test_a_pair_far_slower_than_its_cap_runs_fewer_iterations_then_fewer_bytes():
    from ncclbench.engine.pair_exchange import MIN_PAIR_BYTES, OPS_AROUND, pair_effort

    mib = 1 << 20
    assert pair_effort(0.5, mib, mib, 1, 0, 1.0) == (mib // 4, 1)  # -n 1 stays 1, its bytes halved to fit
    assert pair_effort(0.001, mib, mib, 20, 2, None) == (mib, 20)  # no cap: unchanged
    assert pair_effort(0.001, mib, mib, 20, 2, 1.0) == (mib, 20)  # fits
    assert pair_effort(0.05, mib, mib, 20, 0, 1.0) == (mib, 20 - OPS_AROUND)  # fewer iterations
    assert pair_effort(0.05, mib, mib, 20, 2, 1.0) == (mib, 20 - OPS_AROUND - 2)  # warm-ups count
    # a probe of 1/64 of the bytes: its time scaled to the whole
    assert pair_effort(0.05 / 64, mib // 64, mib, 20, 0, 1.0) == (mib, 20 - OPS_AROUND)
    nbytes, iters = pair_effort(0.5, 64 << 20, 64 << 20, 20, 1, 0.42)  # 2 Gbit/s against a round of 0.42 s
    assert iters == 2 and nbytes < 64 << 20 and (2 + 1 + OPS_AROUND) * 0.5 * nbytes / (64 << 20) <= 0.42
    assert pair_effort(100.0, mib, mib, 20, 0, 0.1)[0] == MIN_PAIR_BYTES


def test_the_second_probe_is_the_largest_that_fits_a_quarter_of_the_cap():
    """A small probe's time is mostly latency: the second probe is as large as a quarter of
    the cap allows at the first probe's rate, all the bytes where that fits."""
    from ncclbench.engine.pair_exchange import PROBE_MIN_BYTES, probe_bytes, second_probe_bytes

    mib = 1 << 20
    assert probe_bytes(1 << 30) == 16 * mib and probe_bytes(mib) == PROBE_MIN_BYTES and probe_bytes(100) == 100
    assert second_probe_bytes(1e-4, 16 * mib, 1 << 30, 1.0) == 1 << 30      # 6.4 ms a full exchange against 1 s
    assert second_probe_bytes(0.05, 16 * mib, 1 << 30, 1.0) == 64 * mib     # 0.2 s for 64 MiB; 0.4 s for 128 MiB
    assert second_probe_bytes(0.5, 16 * mib, 1 << 30, 1.0) == 16 * mib      # no second probe
    assert second_probe_bytes(1e-6, 100, 100, 1.0) == 100


def test_a_pair_is_probed_at_its_best_and_sized_from_the_larger_probe():
    """Two probes of 1/64 of the bytes, the faster judged (the first was caught by noise),
    then one of all the bytes; both sides decide from the same traded numbers, and the cap
    left for the measurement is the cap less what the probes took."""
    import time as clock

    from ncclbench.engine.pair_exchange import probe_pair

    mib, cap = 1 << 20, 1.0
    took = {64 << 10: [0.03, 0.001], mib: [0.004]}  # seconds per probe, in order, by bytes
    seen = []

    def at(nbytes):
        def exchange(_i=0):
            if nbytes in took and seen.count(nbytes) < len(took[nbytes]) and nbytes != 4096:
                clock.sleep(took[nbytes][seen.count(nbytes)])
            seen.append(nbytes)
        return exchange

    backend = SimpleNamespace(synchronize=lambda: None)
    traded = []

    def trade(mine):  # the partner read the same, a little faster
        traded.append(mine)
        return (mine[0] * 0.9, cap)

    probed, seconds, left = probe_pair(backend, at, mib, cap, trade)
    assert [n for n in seen if n != 4096] == [64 << 10, 64 << 10, mib]
    assert probed == mib and 0.004 <= seconds < 0.02 and len(traded) == 2
    assert 0.001 <= traded[0][0] < 0.02  # the faster of the two first probes, not the noisy 30 ms
    assert cap - 2 * traded[0][0] - seconds == pytest.approx(left)
    # an idle rank trades twice too, and measures nothing
    traded.clear()
    assert probe_pair(backend, lambda n: None, mib, cap, lambda mine: (0.0, cap))[0] == 64 << 10


def test_the_plan_is_sized_by_measured_time():
    """Calibrated times of a healthy link and of one 10x slower: the slow one gets smaller
    sizes or fewer iterations, and both plans' estimates fit their share."""
    from ncclbench.faults.preflight.run import fit_plan

    healthy = [(64 << 10, 1e-4), (1 << 20, 3e-4), (16 << 20, 5e-3), (256 << 20, 8e-2)]
    slow = [(64 << 10, 1e-3), (1 << 20, 3e-3), (16 << 20, 5e-2)]
    a, b = fit_plan(healthy, 5.0, 3, 256 << 20, 0.05), fit_plan(slow, 5.0, 3, 256 << 20, 0.05)
    assert a["estimate_s"] <= 5.0 and b["estimate_s"] <= 5.0
    assert b["max_bytes"] * b["iters"] < a["max_bytes"] * a["iters"]
    one = fit_plan([(64 << 10, 0.024)], 5.0, 3, 1 << 20, 0.05)  # one probe: smaller sizes no faster
    assert one["estimate_s"] <= 5.0 and one["max_bytes"] == 64 << 10


def test_a_late_rank_is_named_under_load_and_healthy_runs_pass(tmp_path):
    """4 gloo ranks while two busy loops load the CPU: three healthy runs pass, then rank 2
    late 20 ms per call (failpoint `slow`) is named alone."""
    load = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        rec = run_ranks("preflight_loaded", 4, tmp_path, timeout=400)[0]
    finally:
        for p in load:
            p.kill()
            p.wait()
    assert all(h["passed"] for h in rec["healthy"]), rec["healthy"]
    assert not rec["slow"]["passed"] and rec["slow"]["bad_ranks"] == [2], rec["slow"]
    assert all(f"rank {r} (" not in f for f in rec["slow"]["failures"] for r in (0, 1, 3)), rec["slow"]


# ---- simulated hosts (tests/netsim.py): one NIC 10x slow, the budget holds ----------------------------
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import netsim  # noqa: E402

REASON = netsim.why_not()
sim = pytest.mark.skipif(REASON is not None, reason=REASON or "")
BUDGET_S = 10.0
# torchrun's agents on four namespace hosts meeting, and each rank's imports, on two shared
# CPU cores: 20-70 s measured (the preflight's own time is in the report's cost_s)
STARTUP_ALLOWANCE_S = 90.0


def _preflight_on_hosts(tmp_path, slow_rate=None):
    from conftest import cli_command

    out = tmp_path / "preflight.json"
    with netsim.SimFleet(4) as fleet:
        if slow_rate:
            fleet.slow_nic(2, slow_rate)
        start = time.monotonic()
        argv = cli_command() + ["preflight", "--backend", "gloo", "-T", "30", "--budget", str(BUDGET_S),
                                "--json", str(out)]
        procs = [fleet.start(i, argv, 1, port=29561) for i in range(fleet.n)]
        stdout, stderr = procs[0].communicate(timeout=400)
        for p in procs[1:]:
            p.wait(timeout=120)
        wall = time.monotonic() - start
    assert out.exists(), f"exit {procs[0].returncode}, no report:\n{stdout[-3000:]}\n{(stderr or '')[-3000:]}"
    return procs[0].returncode, stdout, json.loads(out.read_text()), wall


@sim
def test_simulated_hosts_one_nic_10x_slow_within_twice_the_budget(tmp_path):
    """4 hosts x 1 gloo rank, node2's NIC at 100 Mbit/s (healthy pairs on two loaded cores: 1-3 Gbit/s):
    simnode2 drained alone, preflight's own time within 2x --budget, the whole run within
    that plus the start-up allowance."""
    code, stdout, doc, wall = _preflight_on_hosts(tmp_path, "100mbit")
    assert code == 1 and doc["drain"] == ["simnode2"] and doc["bad_ranks"] == [2], stdout
    assert sum(doc["cost_s"].values()) <= 2 * BUDGET_S, doc["cost_s"]
    assert wall <= 2 * BUDGET_S + STARTUP_ALLOWANCE_S, (wall, doc["cost_s"])
    assert not any("not judged" in n for n in doc["notes"]), doc["notes"]  # every cross-host pair judged


@sim
def test_simulated_healthy_hosts_pass_within_the_budget(tmp_path):
    code, stdout, doc, wall = _preflight_on_hosts(tmp_path)
    assert code == 0 and doc["passed"], stdout
    assert sum(doc["cost_s"].values()) <= 2 * BUDGET_S, doc["cost_s"]


def _two_hosts_path(rates: dict, shaped=()):
    """The 2 hosts x 2 H100 socket log, each host's eth0 at the rate given (GB/s)."""
    from test_ncclpath import path_of

    d = path_of("h100-two-hosts-socket").to_dict()
    for p in d["processes"]:
        p["nic_rates"] = {"eth0": rates[p["host"]]}
        if p["host"] in shaped:
            p["nic_shaped"] = {"eth0": rates[p["host"]]}
    return d


def _slow_nics(paths, instances, host, best_cells):
    """(slow, bad) from Preflight._slow_nics on a stand-in holding `paths`, `instances` and
    `host`; `best_cells`: {dim: (group, its busbw)}, one all_reduce cell each."""
    from types import SimpleNamespace

    from ncclbench.faults.preflight.run import Preflight

    runs = {d: [Cell(d, g, "all_reduce", 1 << 20, "oop", busbw, (1.0,) * len(g))]
            for d, (g, busbw) in best_cells.items()}
    slow, bad = {}, {}
    Preflight._slow_nics(SimpleNamespace(paths=paths, instances=instances, host=host), runs, slow, bad)
    return slow, bad


def test_pairs_across_hosts_over_sockets_are_judged_at_the_socket_band():
    """4 one-GPU hosts over NCCL's NET/Socket: a healthy rank 28% below at its best pair drained
    its host at the 20% band; over sockets the pairs across hosts are judged at the socket
    band, so it passes, while a NIC at a fifth of its rate (84% below) and a slow link are
    still named. Pairs on one host, a log without the Socket transport, and a band the caller
    chose keep the run's bands."""
    from types import SimpleNamespace

    from ncclbench.faults.preflight.run import Preflight
    from ncclbench.locate.bands import BY_TRANSPORT

    world = (0, 1, 2, 3)
    host = {r: f"simnode{r}" for r in world}
    across = (False, "net", None)
    kind = lambda a, b: across  # noqa: E731 - every pair crosses hosts
    socket = {world: _two_hosts_path({"simnode0": 1.25, "simnode1": 1.25})}
    SOCKET_BAND = BY_TRANSPORT["socket"].rank
    setup = dict(band=0.2, link_band=0.2, socket_band=SOCKET_BAND, socket_link_band=SOCKET_BAND)
    pf = SimpleNamespace(paths=socket, setup=setup)
    bands = lambda k: Preflight.kind_bands(pf, k)  # noqa: E731
    assert bands(across) == (SOCKET_BAND, SOCKET_BAND) and bands((True, "NV18", False)) is None
    assert Preflight.kind_bands(SimpleNamespace(paths={world: None}, setup=setup), across) is None
    chosen = dict(setup, socket_band=0.2, socket_link_band=0.2)  # --band 20%: what the user asked for
    assert Preflight.kind_bands(SimpleNamespace(paths=socket, setup=chosen), across) == (0.2, 0.2)

    healthy = _fabric(1.93, slow={(0, 3): 1.32, (1, 3): 1.36, (2, 3): 1.38, (0, 2): 1.95, (1, 2): 1.90})
    assert list(_judged(healthy, host, kind=kind)[0]) == [3]  # the false alarm at 20%
    assert _judged(healthy, host, kind=kind, kind_bands=bands) == ({}, {})
    nic = _fabric(1.93, slow={(0, 2): 0.30, (1, 2): 0.31, (2, 3): 0.29})
    assert list(_judged(nic, host, kind=kind, kind_bands=bands)[0]) == [2]
    link = _fabric(1.93, slow={(1, 3): 0.40})
    assert list(_judged(link, host, kind=kind, kind_bands=bands)[1]) == [(1, 3)]
    # the report says which bar the pairs across hosts met
    from ncclbench.faults.preflight.verdict import PreflightReport

    plan = {"band": 0.2, "socket_band": SOCKET_BAND, "summary": ""}
    line = next(t for t in PreflightReport(True, margins={"ranks in pairs": 0.28}, plan=plan).lines() if "Worst" in t)
    assert line.endswith("(slow beyond 20%; pairs across hosts over TCP sockets beyond 50%)")


def _inside(found) -> tuple:
    """(bad, links, unsettled) of faults.preflight.within.InsidePairs."""
    return found.bad, found.links, found.unsettled


def _socket_run(values, host, paths=None, band=0.2, link_band=0.2, socket_band=0.5):
    """A stand-in Preflight over 4 simulated one-GPU hosts on NCCL's Socket network whose
    pair passes return `values(pass, a, b)`."""
    from ncclbench.faults.preflight.run import Preflight
    from ncclbench.locate.kinds import pair_kind

    world = tuple(sorted(host))
    facts = [{"device": 0}] * len(host)
    pf = _fake_pf(values, host, kind=lambda a, b: pair_kind(host, {}, facts, a, b), band=band, link_band=link_band)
    pf.instances, pf.margins, pf.notes, pf.pair_records = {"world": [world]}, {}, [], []
    pf.setup.update(socket_band=socket_band, socket_link_band=max(link_band, socket_band), budget=10.0)
    pf.paths = {world: _two_hosts_path({"simnode0": 1.25, "simnode1": 1.25})} if paths is None else paths
    pf.kind_bands = lambda k: Preflight.kind_bands(pf, k)
    return pf


def test_the_socket_band_reaches_the_sweeps_and_localisation_and_only_pairs_that_cross_hosts_over_sockets():
    from test_ncclpath import path_of

    from ncclbench.faults.preflight import within
    from ncclbench.faults.preflight.run import Preflight

    host = {r: f"simnode{r}" for r in range(4)}
    world = (0, 1, 2, 3)
    healthy = _fabric(1.93, slow={(0, 3): 1.32, (1, 3): 1.36, (2, 3): 1.38})  # rank 3 28% below
    assert _inside(within.judge_inside_pairs(_socket_run(healthy, host), 1.0))[:2] == ({}, {})
    bad, _links, _ = _inside(within.judge_inside_pairs(_socket_run(healthy, host, socket_band=0.2), 1.0))
    assert list(bad) == [3]  # an explicit 20% band
    slow = _fabric(1.93, slow={(0, 3): 0.3, (1, 3): 0.3, (2, 3): 0.3})
    bad, fine, links = Preflight._localise(_socket_run(slow, host), [3], {("world", world): ["slow"]})
    assert list(bad) == [3] and fine == set() and links == {}
    ok = _fabric(1.93, slow={(0, 3): 1.85, (1, 3): 1.85, (2, 3): 1.85})
    assert Preflight._localise(_socket_run(ok, host), [3], {("world", world): ["slow"]}) == ({}, {3}, {})
    # no path read, a path on one host (NCCL says Socket there too), InfiniBand beside it
    across = (False, "net", None)
    one_host = path_of("one-host-p2p").to_dict()
    ib = path_of("two-hosts-ib").to_dict()
    for paths in ({world: None}, {world: one_host}, {world: ib, (0, 1): one_host}):
        assert Preflight.kind_bands(_socket_run(healthy, host, paths), across) is None, paths.keys()
    sockets = {world: _two_hosts_path({"simnode0": 1.25, "simnode1": 1.25}), (0, 1): one_host}
    assert Preflight.kind_bands(_socket_run(healthy, host, sockets), across) == (0.5, 0.5)
    # gloo's bands are never lowered
    assert Preflight.kind_bands(_socket_run(healthy, host, band=0.6, link_band=0.95, socket_band=0.6),
                                across) == (0.6, 0.95)


def test_only_band_auto_takes_the_socket_band(monkeypatch):
    import ncclbench.backends.torch_dist as td
    from ncclbench.faults.preflight.inputs import check_inputs
    from ncclbench.locate.bands import BY_TRANSPORT

    SOCKET_BAND = BY_TRANSPORT["socket"].rank

    monkeypatch.setattr(td, "group_backend_name", lambda dist, g: "nccl")
    base = dict(budget_s=10, timeout=None, datatype="float", collectives=["all_reduce"], floor=None,
                tolerance="10%", groups=None)
    for band, want in (("auto", SOCKET_BAND), (None, SOCKET_BAND), ("30%", 0.3), (0.2, 0.2)):
        assert check_inputs(dict(base, band=band), None)["socket_band"] == want, band


def test_a_host_whose_nic_runs_at_a_fraction_of_the_others_is_named_where_no_pair_can():
    """Two hosts: every pair crosses the slow NIC alike, so no measurement sets a host apart;
    the rate read on each host does, when the traffic between them ran below the faster one."""
    from ncclbench.faults.preflight.groups import slow_nic_hosts

    world = (0, 1, 2, 3)
    capped = _two_hosts_path({"simnode0": 1.25, "simnode1": 0.25}, shaped={"simnode1"})
    found = slow_nic_hosts({world: capped}, {world: 0.355})
    assert list(found) == [world] and list(found[world]) == ["simnode1"]
    assert "0.25 GB/s (a tbf qdisc caps what it sends)" in found[world]["simnode1"]
    # the traffic outran the slower rate (the rate says nothing of this path), equal rates, no NET path
    assert slow_nic_hosts({world: capped}, {world: 3.8}) == {}
    assert slow_nic_hosts({world: _two_hosts_path({"simnode0": 1.25, "simnode1": 1.25})}, {world: 0.3}) == {}
    assert slow_nic_hosts({world: _two_hosts_path({"simnode0": 1.25, "simnode1": 0.7})}, {world: 0.3}) == {}
    assert slow_nic_hosts({world: None}, {world: 0.3}) == {}

    slow, bad = _slow_nics({world: capped}, {"world": [world], "node": [(0, 1), (2, 3)]},
                           {0: "simnode0", 1: "simnode0", 2: "simnode1", 3: "simnode1"},
                           {"world": (world, 0.355), "node": ((2, 3), 297.0)})
    assert list(bad) == [2] and bad[2].startswith("is on simnode1, whose NIC eth0 gives 0.25 GB/s")
    assert slow == {("world", world): ["best busbw 0.355 GB/s between hosts, bound by the NIC of simnode1"]}


def test_the_slow_nic_rule_counts_each_hosts_own_nics_and_names_a_host_once():
    """Each host's NICs are the ones its own connections used (a host whose rank used one of
    three NICs is not credited with all three); full host names match NCCL's short ones; a
    host slow in two groups is named once, from the larger group."""
    from ncclbench.faults.preflight.groups import slow_nic_hosts
    from ncclbench.topology.pathview import Path

    def proc(host, rank, listed, used):
        return {"rank": rank, "host": host, "network": "IB",
                "nics": {"IB": [{"index": i, "name": n, "detail": "1/IB"} for i, n in enumerate(listed)]},
                "nic_rates": {n: 50.0 for n in listed},
                "comms": [{"rank": rank, "nranks": 4, "nnodes": 4, "net_devices": [used],
                           "links": [[rank, (rank + 1) % 4, "NET/IB", ["00/0"]]]}]}

    rail = (0, 1, 2, 3)
    nics = ["mlx5_0", "mlx5_1", "mlx5_2"]
    procs = [proc("a", 0, nics, 0), proc("b", 1, nics, 1), proc("c", 2, nics, 2), proc("d", 3, nics[:1], 0)]
    assert slow_nic_hosts({rail: Path(procs).to_dict()}, {rail: 40.0}) == {}

    world = (0, 1, 2, 3)
    capped = _two_hosts_path({"simnode0": 1.25, "simnode1": 0.25}, shaped={"simnode1"})

    slow, bad = _slow_nics({world: capped, (1, 3): capped}, {"world": [world], "rail": [(0, 2), (1, 3)]},
                           {0: "simnode0.cluster", 1: "simnode0.cluster", 2: "simnode1.cluster",
                            3: "simnode1.cluster"},
                           {"world": (world, 0.355), "rail": ((1, 3), 0.2)})
    assert list(bad) == [2] and list(slow) == [("world", world)]


def test_every_rank_stops_calibrating_at_the_same_size_whatever_its_own_clock(monkeypatch):
    """Two ranks calibrate one dimension; rank 0's clock runs on while it waits in each
    exchange for rank 1, which came in later and has spent less. Both must stop at the same
    size: before, each judged the time left on its own clock, rank 0 stopped a size early and
    went on to the next dimension's group while rank 1 waited for it in this one (a hang
    seen in CI: two ranks each waiting in a different group until -T)."""
    import threading

    from ncclbench.faults.preflight import run as pf

    barrier, box, clocks = threading.Barrier(2, timeout=10), [None, None], threading.local()

    class Clock:  # each thread its own clock: rank 0's advances 0.5 s at each exchange
        @staticmethod
        def monotonic():
            return clocks.now

    class World:
        def __init__(self, rank):
            self.rank = rank

        def exchange(self, value, what, timeout):
            box[self.rank] = value
            barrier.wait()
            everyone = list(box)
            barrier.wait()
            clocks.now += 0.5 if self.rank == 0 else 0.0
            return everyone

    class Rows(list):
        has_rows = True

    row = type("Row", (), {"out_of_place": type("C", (), {"time_us": 1000.0})(), "in_place": None})()
    monkeypatch.setattr(pf, "time", Clock)
    results = [None, None]

    def rank(r):
        clocks.now = 0.0
        p = pf.Preflight.__new__(pf.Preflight)
        p.world, p.timeout_s = World(r), 5.0
        p._measure = lambda *a, **k: Rows([row])
        try:
            results[r] = [size for size, _t in p._calibrate("dp", 256 << 20, share=1.2)[0]]
        except threading.BrokenBarrierError:
            results[r] = "waited for the other rank in vain"

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results[0] == results[1] and isinstance(results[0], list), results


def test_one_rank_is_refused_not_passed():
    """One rank crosses no link: nothing would be judged, so preflight says so (exit 2), under
    its own launcher and under torchrun, rather than reporting 'passed'."""
    r = run_cli(["preflight", "-g", "1", "--backend", "gloo"], timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "at least 2 ranks" in r.stderr, r.stderr
    assert "passed" not in r.stdout
