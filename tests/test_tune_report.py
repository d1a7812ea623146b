"""From what NCCL launches leave on disk (raw results, the probe's NCCL log) to the table and
files, on a made-up 8-rank all_reduce: the analysis a GPU run goes through, without one."""

import csv
import json
import math
import subprocess
import sys

import pytest

from ncclbench.tune import launches, report, run
from ncclbench.tune.analysis import ItemResult
from ncclbench.tune.plan import DEFAULT, CandidatePlan, Combination

SIZES = [65536, 131072, 262144, 524288]
TREE_LL, RING_LL = Combination("tree", "ll"), Combination("ring", "ll")
# busbw per repeat: tree/ll wins clearly at 128K and 256K; ring/ll is NCCL's own choice at 64K
BUSBW = {
    "default": {65536: [10.0, 10.2, 9.9], 131072: [20.0, 20.3, 19.8], 262144: [40.0, 40.5, 39.7], 524288: [80.0, 80.4, 79.6]},
    "tree/ll": {65536: [9.0, 9.1, 8.9], 131072: [24.0, 24.2, 23.9], 262144: [48.0, 48.3, 47.8], 524288: [70.0, 70.2, 69.9]},
    "ring/ll": {65536: [10.6, 10.7, 10.5], 131072: [19.0, 19.1, 18.9], 262144: [30.0, 30.1, 29.9], 524288: [41.0, 41.1, 40.9]},
}
# what NCCL ran (probe log): per combination, per size
RAN = {"default": {65536: ("RING", "LL", 4), 131072: ("RING", "LL", 4), 262144: ("RING", "LL128", 8), 524288: ("RING", "LL128", 16)},
       "tree/ll": dict.fromkeys(SIZES, ("TREE", "LL", 8)), "ring/ll": {s: ("RING", "LL", 4) for s in SIZES}}


def _raw(size_busbw, path):
    results = [{"size": s, "count": s // 4, "type": "float", "redop": "sum", "root": "    -1",
                "out_of_place": {"time": s / b / 1e3, "alg_bw": b, "bus_bw": b, "nwrong": 0.0},
                "in_place": {"time": s / b / 1e3, "alg_bw": b, "bus_bw": b, "nwrong": 0.0}}
               for s, b in size_busbw.items()]
    path.write_text(json.dumps({"version": 3, "results": results, "ncclbench": {
        "nccl": "NCCL 2.28.9", "torch_version": "2.11.0", "gpu": "NVIDIA H200", "status": "ok"}}))


def _setup(tmp_path):
    request = run.TuneRequest(["all_reduce"], {"datatype": "float", "op": "sum", "check": 1}, ngpus=8, repeat=3,
                              plot=False)
    plans = {"all_reduce": CandidatePlan("all_reduce", [TREE_LL, RING_LL], [("nvls", "NCCL_NVLS_ENABLE=0 is set")])}
    return run.Setup(request, "nccl", plans, 8, 1, str(tmp_path))


def _probe(setup, tmp_path):
    items = launches.work_items(setup, lambda c: [DEFAULT, TREE_LL, RING_LL], 1, csv=False)
    pre = "gpu-host:4242:4242 [0] NCCL INFO "
    lines = ["NCCL version 2.28.9+cuda13.0", pre + "24 coll channels, 24 collnet channels", pre + "comm 0x1 - Init COMPLETE"]
    for it in items:
        combo = Combination.from_dict(it["combo"])
        if combo.algo:
            lines += [pre + f"NCCL_ALGO set by environment to {combo.algo.title()}",
                      pre + f"NCCL_PROTO set by environment to {combo.proto.upper()}"]
        lines += [pre + "24 coll channels, 24 collnet channels", pre + "ncclCommSplit comm 0x2 - Init COMPLETE"]
        for size, (algo, proto, ch) in RAN[combo.label].items():
            lines += [pre + f"AllReduce: {size // 4 * 4} Bytes -> Algo {algo} proto {proto} channel{{Lo..Hi}}={{0..{ch - 1}}}"] * 2
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "nccl.gpu-host.4242.log").write_text("\n".join(lines) + "\n")
    return items, {it["index"]: ItemResult("ok", [], True, 4242) for it in items}, {4242: True}


def _measured(setup, tmp_path):
    items = launches.work_items(setup, lambda c: [DEFAULT, TREE_LL, RING_LL], 3, csv=True)
    (tmp_path / "raw").mkdir()
    for it in items:
        label = Combination.from_dict(it["combo"]).label
        _raw({s: v[it["round"] - 1] for s, v in BUSBW[label].items()}, tmp_path / "raw" / (it["name"] + ".json"))
    return items, {it["index"]: ItemResult("ok") for it in items}


def confirmer(setup, tmp_path, busbw=None):
    """Launch 2 as its leftovers: the combinations asked for, with `busbw` (default: BUSBW again)."""
    asked = []

    def confirm(winners, sizes):
        asked.append({c: [k.label for k in combos] for c, combos in winners.items()})
        confirm.sizes = sizes
        items = launches.work_items(setup, lambda c: [DEFAULT, *winners[c]] if c in winners else [], 3, csv=False)
        (tmp_path / "confirm").mkdir(exist_ok=True)
        for it in items:
            label = Combination.from_dict(it["combo"]).label
            _raw({s: v[it["round"] - 1] for s, v in (busbw or BUSBW)[label].items()},
                 tmp_path / "confirm" / (it["name"] + ".json"))
        return items, {it["index"]: ItemResult("ok", timing="graph") for it in items}, 0

    confirm.asked = asked
    return confirm


def test_wins_ranges_and_files_from_launch_leftovers(tmp_path, capsys):
    setup = _setup(tmp_path)
    probe_items, probe_results, worlds = _probe(setup, tmp_path)
    items, results = _measured(setup, tmp_path)
    confirm = confirmer(setup, tmp_path)
    assert report.finish(setup, probe_items, probe_results, worlds, items, results, confirm=confirm) == 0
    assert confirm.asked == [{"all_reduce": ["tree/ll"]}]   # only what won somewhere, with the default
    out = capsys.readouterr().out
    assert "NCCL 2.28.9, torch 2.11.0" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "ring/ll ch4" in rows["64K"] and "NCCL's own choice" in rows["64K"]   # forcing NCCL's choice is no win
    assert rows["128K"].endswith("yes  above noise; confirmed: launch 2, +20.0 % ± 2.5 %") and "+20.0%" in rows["128K"]
    assert "ring/ll128 ch8" in rows["256K"] and "tree/ll" in rows["256K"] and "+20.0%" in rows["256K"]
    assert " no " in rows["512K"]
    assert "tree/ll wins at 128K-256K (config 98305-393216 B): +20.0 %; 128K confirmed: launch 2, +20.0 % ± 2.5 %" in out
    conf_text = (tmp_path / "nccl_tuner.conf").read_text()
    assert "# won: allreduce,98305,393216,tree,ll,0,1,8,1,0 won at 128K-256K (+20.0 %); confirmed: launch 2" in conf_text
    assert "tree/ll            ok; NCCL read NCCL_ALGO=Tree NCCL_PROTO=LL, 24 channel(s)" in out
    assert "nvls               left out: NCCL_NVLS_ENABLE=0 is set" in out
    conf = [line for line in (tmp_path / "nccl_tuner.conf").read_text().splitlines() if not line.startswith("#")]
    # the win (channels 0: NCCL's own count for tree/ll, as measured), then NCCL's own choice at every size,
    # then ring/simple for calls NCCL cannot run the matching row's pair for
    assert conf == ["allreduce,98305,393216,tree,ll,0,1,8,1,0", "allreduce,0,196608,ring,ll,0,1,8",
                    "allreduce,196609,18446744073709551615,ring,ll128,0,1,8",
                    "allreduce,0,18446744073709551615,ring,simple,0,1,8"]
    assert "allreduce,196609,18446744073709551615,ring,ll128,0,1,8 NCCL's own choice at 256K-512K" in out
    assert "above 512K (not measured): NCCL's choice there, extended" in out
    with open(tmp_path / "performance.csv", newline="") as f:
        perf = list(csv.DictReader(f))
    assert len(perf) == 2 * 4 and {(r["algorithm"], r["channels"]) for r in perf} == {("tree", "8"), ("ring", "4")}
    doc = json.loads((tmp_path / "tune.json").read_text())["collectives"]["all_reduce"]
    assert doc["nccl_choice"]["262144"] == ["ring", "ll128", 8]
    assert [v["win"] for v in doc["verdicts"]] == [False, True, True, False]


def test_a_forced_setting_nccl_did_not_run_is_never_counted(tmp_path, capsys):
    setup = _setup(tmp_path)
    RAN["tree/ll"][262144] = ("RING", "SIMPLE", 8)  # NCCL ran something else at 256K
    try:
        probe_items, probe_results, worlds = _probe(setup, tmp_path)
    finally:
        RAN["tree/ll"][262144] = ("TREE", "LL", 8)
    items, results = _measured(setup, tmp_path)
    report.finish(setup, probe_items, probe_results, worlds, items, results, confirm=confirmer(setup, tmp_path))
    out = capsys.readouterr().out
    assert "NCCL ran another algorithm/protocol at 256K: those sizes left out" in out
    conf = [line for line in (tmp_path / "nccl_tuner.conf").read_text().splitlines() if not line.startswith("#")]
    assert conf == ["allreduce,98305,196608,tree,ll,0,1,8,1,0", "allreduce,0,196608,ring,ll,0,1,8",
                    "allreduce,196609,18446744073709551615,ring,ll128,0,1,8",
                    "allreduce,0,18446744073709551615,ring,simple,0,1,8"]


def test_no_config_when_nccls_own_choice_is_unknown_at_a_measured_size(tmp_path, capsys):
    """A symmetric kernel at 256K (no algorithm/protocol to reproduce): no file, one line, exit 6;
    everything else is still written."""
    setup = _setup(tmp_path)
    RAN["default"][262144] = ("SYMMETRIC", "", 8)
    try:
        probe_items, probe_results, worlds = _probe(setup, tmp_path)
    finally:
        RAN["default"][262144] = ("RING", "LL128", 8)
    log = tmp_path / "probe" / "nccl.gpu-host.4242.log"
    log.write_text(log.read_text().replace(
        "AllReduce: 262144 Bytes -> Algo SYMMETRIC proto  channel{Lo..Hi}={0..7}",
        "AllReduce [Symmetric]: 262144 Bytes -> Kernel AllReduce_AGxLL_R nchannels 8 nthreads 512"))
    items, results = _measured(setup, tmp_path)
    assert report.finish(setup, probe_items, probe_results, worlds, items, results) == 6
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert errors == ["ncclbench: error: no nccl_tuner.conf written: allreduce: NCCL's choice is not in its TUNING "
                      "log at 256K; a row there would impose a setting NCCL did not choose and a missing row runs one "
                      "channel (docs/tuning.md)"]
    assert not (tmp_path / "nccl_tuner.conf").exists()
    assert (tmp_path / "performance.csv").exists()
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["tuner_config"]["written"] is False and "256K" in doc["tuner_config"]["why"]
    assert "#   no nccl_tuner.conf written: allreduce: NCCL's choice is not in its TUNING log at 256K" in captured.out


def test_the_plot_draws_one_line_per_combination_and_imports_matplotlib_only_then(tmp_path):
    code = f"""
import sys
from ncclbench.tune import analysis, plot, report, run
assert 'matplotlib' not in sys.modules
from ncclbench.tune.plan import Combination
m = analysis.Measured(busbw={{1024: [1.0, 2.0], 2048: [3.0, 3.0]}})
o = analysis.CollectiveOutcome('all_reduce', [Combination('ring', 'll')], {{}}, {{}}, {{'default': m, 'ring/ll': m}}, {{}})
print(plot.plot_outcomes({str(tmp_path)!r}, [o], 'NCCL 2.28.9'))
assert 'matplotlib' in sys.modules
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "busbw_all_reduce.png").stat().st_size > 1000


def test_the_probe_names_the_path_nccl_took_without_the_forced_settings(tmp_path, capsys):
    """tune's header and tune.json carry the path of the probe's communicators, as their
    NCCL logs name it (real NCCL 2.28.9 logs of 2 simulated hosts x 2 H100 over sockets),
    without the NCCL_ALGO/NCCL_PROTO each combination set."""
    import shutil

    from conftest import FIXTURES
    from ncclbench.tune import analysis

    setup = _setup(tmp_path)
    probe_items, probe_results, worlds = _probe(setup, tmp_path)
    for log in sorted((FIXTURES / "nccl-logs" / "h100-two-hosts-socket").iterdir()):
        text = log.read_text()
        prefix = text.splitlines()[0].split(" NCCL INFO ")[0] + " NCCL INFO "
        (tmp_path / "probe" / log.name).write_text(text + prefix + "NCCL_ALGO set by environment to Tree\n")
    path = analysis.probe_path(str(tmp_path / "probe"))
    assert path is not None and set(path.transports()) == {"NET/Socket", "P2P/CUMEM"}
    assert "NCCL_ALGO" not in path.env and path.env.get("NCCL_IB_DISABLE") == "1"
    items, results = _measured(setup, tmp_path)
    report.finish(setup, probe_items, probe_results, worlds, items, results, confirm=confirmer(setup, tmp_path))
    out = capsys.readouterr().out
    assert "NCCL path: NET/Socket (" in out and "network Socket, GDR 0" in out, out
    doc = json.loads((tmp_path / "tune.json").read_text())
    assert doc["nccl_path"]["label"] == "NET/Socket + P2P/CUMEM" and doc["path_lines"][0].startswith("NCCL path: ")
    # the channels and the algorithms connected are one forced combination's or another's
    assert not any("channels" in line or "connected" in line for line in doc["path_lines"]), doc["path_lines"]
    assert "channels" not in doc["nccl_path"] and "channels" not in doc["nccl_path"]["facts"]
    shutil.rmtree(tmp_path / "probe")
    (tmp_path / "probe").mkdir()
    assert analysis.probe_path(str(tmp_path / "probe")) is None


def test_cycles_of_one_repeat_count_once_at_their_median(tmp_path):
    """-N 3: a repeat's file holds each size three times; it is one repeat, at the median
    of its cycles (not three repeats, which would widen the noise with every cycle), and a
    wrong element in any cycle marks the size."""
    from ncclbench.tune import analysis

    rows = []
    for bw, wrong in ((10.0, 0.0), (30.0, 0.0), (12.0, 0.0)):
        rows.append({"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": "    -1",
                     "out_of_place": {"time": 1024 / bw / 1e3, "alg_bw": bw, "bus_bw": bw, "nwrong": wrong},
                     "in_place": {"time": 1.0, "alg_bw": bw, "bus_bw": bw, "nwrong": 0.0}})
    rows.append(dict(rows[0], size=4096, count=1024, in_place={"time": 1.0, "alg_bw": 1, "bus_bw": 1, "nwrong": 2.0}))
    path = tmp_path / "r1.json"
    path.write_text(json.dumps({"version": 3, "results": rows, "ncclbench": {"nccl": "NCCL 2.28.9"}}))
    m = analysis.Measured()
    analysis.read_rows(str(path), m)
    analysis.read_rows(str(path), m)
    assert m.busbw[1024] == [12.0, 12.0]
    assert m.time_us[1024] == [pytest.approx(1024 / 12.0 / 1e3)] * 2
    assert m.wrong == {1024: False, 4096: True}
    # an even count: the lower middle cycle, with its own time (not the mean of two cycles)
    even = rows[:3] + [dict(rows[0], out_of_place={"time": 1024 / 20.0 / 1e3, "alg_bw": 20.0, "bus_bw": 20.0,
                                                   "nwrong": 0.0})]
    path.write_text(json.dumps({"version": 3, "results": even, "ncclbench": {}}))
    m = analysis.Measured()
    analysis.read_rows(str(path), m)
    assert m.busbw[1024] == [12.0] and m.time_us[1024] == [pytest.approx(1024 / 12.0 / 1e3)]
    na = dict(rows[1], out_of_place={"time": None, "alg_bw": None, "bus_bw": None, "nwrong": None})
    path.write_text(json.dumps({"version": 3, "results": [rows[0], na], "ncclbench": {}}))
    m = analysis.Measured()
    analysis.read_rows(str(path), m)
    assert math.isnan(m.busbw[1024][0])


def test_a_size_that_moves_0_bytes_is_said_not_silently_left_out():
    """all_gather -b 8 over 2 ranks: 8 B gives each rank no element (0 B, as nccl-tests
    prints it); the table had no row for it and no word why."""
    from ncclbench.tune.analysis import CollectiveOutcome, Measured, zero_size_notes

    def outcome(sizes):
        return CollectiveOutcome("all_gather", [], {}, {}, {"default": Measured(busbw={s: [0.1] for s in sizes})}, {})

    assert zero_size_notes(outcome([64, 512]), 2) == []
    said = zero_size_notes(outcome([0, 64]), 2)
    assert len(said) == 1 and said[0].startswith("all_gather: ") and "0 B at 2 ranks" in said[0]
