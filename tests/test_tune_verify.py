"""`tune --verify`: every measured size judged against NCCL's default, on made-up numbers;
the launches (default before, plugin, default after, probe) replaced by a stand-in that
writes what each would leave on disk."""

import json
import os

import pytest

from ncclbench.errors import ExitCode
from ncclbench.tune import verify
from ncclbench.tune.files import parse_config_line, read_config
from ncclbench.tune.ranges import Series, judge_deploy
from test_tune_report import BUSBW, _raw, _setup

def _verify(tmp_path, tuned_busbw, wrong=()):
    from ncclbench.tune import analysis, verify_report

    setup = _setup(tmp_path)
    rows = [parse_config_line("allreduce,98305,393216,tree,ll,0,1,8,1,0", 3),
            parse_config_line("allreduce,0,196608,ring,ll,0,1,8", 4),
            parse_config_line("allreduce,196609,18446744073709551615,ring,ll128,0,1,8", 5)]
    before = analysis.Measured(busbw={s: v[:2] for s, v in BUSBW["default"].items()})
    after = analysis.Measured(busbw={s: v[2:] for s, v in BUSBW["default"].items()})
    tuned = analysis.Measured(busbw=tuned_busbw, wrong={s: True for s in wrong})
    choices = {65536: ("ring", "ll", 4), 131072: ("tree", "ll", 8), 262144: ("tree", "ll", 8),
               524288: ("ring", "ll128", 16)}
    judged = verify_report.Judged()
    lines, doc = verify_report.collective_report(setup, "all_reduce", (before, after, tuned), choices, rows, judged)
    return "\n".join(lines), doc, verify_report.verdict(judged, setup.nranks, False)


def test_verify_judges_every_measured_size_and_names_each_slower_one(tmp_path):
    """64K is inside NCCL's-own-choice rows, not a won range: it fails the run all the same."""
    tuned = {65536: [5.0, 5.1, 4.9], 131072: [24.0, 24.2, 23.9], 262144: [48.0, 48.3, 47.8], 524288: [80.1, 80.3, 79.7]}
    text, doc, (code, verdict) = _verify(tmp_path, tuned)
    assert code == 1
    assert verdict == "NOT safe to deploy: slower than NCCL's default beyond noise at all_reduce 64K (-49.5 %)"
    assert [d["slower"] for d in doc["sizes"]] == [True, False, False, False]
    assert [d["faster"] for d in doc["sizes"]] == [False, True, True, False]
    assert [d["row_line"] for d in doc["sizes"]] == [4, 3, 3, 5]
    assert [d["applied"] for d in doc["sizes"]] == [True, True, True, True]
    assert "line 3: allreduce,98305,393216,tree,ll,0,1,8,1,0: 2 size(s), NCCL applied it at 2; faster beyond noise " \
           "at 2, slower at 0" in text
    assert "line 4: allreduce,0,196608,ring,ll,0,1,8: 1 size(s), NCCL applied it at 1; faster beyond noise at 0, " \
           "slower at 1" in text
    assert "warning" not in text  # every size and kind of call is covered


def test_verify_passes_when_nothing_is_slower_and_fails_on_wrong_results(tmp_path):
    same = {s: [b * 1.001 for b in v] for s, v in BUSBW["default"].items()}
    _text, _doc, (code, verdict) = _verify(tmp_path, same)
    assert code == 0 and verdict.startswith("no measured size slower than NCCL's default beyond noise (4 size(s)")
    _text, _doc, (code, verdict) = _verify(tmp_path, same, wrong=[262144])
    assert code == 7 and verdict == "NOT safe to deploy: wrong results under the plugin at all_reduce 256K"
    missing = {s: v for s, v in same.items() if s != 524288}
    _text, _doc, (code, verdict) = _verify(tmp_path, missing)
    assert code == 1 and "could not compare at all_reduce 512K (not measured under the plugin)" in verdict


def test_verify_warns_of_sizes_and_calls_no_row_covers(tmp_path):
    from ncclbench.tune import verify_report

    rows = [parse_config_line("allreduce,98305,393216,tree,ll,-1,1,8,1,0", 1)]
    warnings = verify_report.coverage_warnings(rows, "allreduce", 1, 8)
    assert warnings[0] == ("allreduce single calls (numPipeOps 1, regBuff 0) match no row at 0-98304 B, 393217-max B: "
                           "the example plugin runs ONE channel there")
    assert "registered buffers or CUDA graphs (numPipeOps 1, regBuff 1) match no row at 0-max B" in warnings[1]
    assert "grouped calls" in warnings[2]
    assert warnings[3].startswith("line 1: channels -1 keeps the example plugin's ONE channel")


CONF = ("# made by a test\nallreduce,98305,393216,tree,ll,0,1,8,1,0\nallreduce,0,196608,ring,ll,0,1,8\n"
        "allreduce,196609,18446744073709551615,ring,ll128,0,1,8\n")
RAN_UNDER_PLUGIN = {65536: ("RING", "LL", 4), 131072: ("TREE", "LL", 8), 262144: ("TREE", "LL", 8),
                    524288: ("RING", "LL128", 16)}


TIMINGS_SEEN = []


def _fake_launches(monkeypatch, tmp_path, plugin_busbw):
    """Each launch writes rank 0's status lines and each item's raw JSON (the default's numbers,
    or `plugin_busbw` under the plugin), the probe launch NCCL's log; returns the launches."""
    launches = []

    def spawn(setup, argv, env):
        with open(argv[2], encoding="utf-8") as f:
            work = json.load(f)
        pid = 100 + len(launches)
        launches.append((work["phase"], [it["round"] for it in work["items"]], dict(env)))
        TIMINGS_SEEN.append((work["phase"], {it["timing"] for it in work["items"]}))
        table = plugin_busbw if work["phase"] == "verify/plugin" else BUSBW["default"]
        with open(work["status"], "a", encoding="utf-8") as f:
            f.write(json.dumps({"event": "launch", "pid": pid, "world_comm": True}) + "\n")
            for it in work["items"]:
                if work["json"]:
                    _raw({s: v[(it["round"] - 1) % len(v)] for s, v in table.items()},
                         tmp_path / work["phase"] / (it["name"] + ".json"))
                f.write(json.dumps({"event": "done", "index": it["index"], "pid": pid, "status": "ok", "errors": [],
                                    "comm_ready": True}) + "\n")
        if work["phase"] == "verify/probe":
            pre = "gpu-host:1:1 [0] NCCL INFO "
            lines = ["NCCL version 2.28.9+cuda13.0", pre + "TUNER/ExamplePlugin: Loaded 3 tuning configurations from c",
                     pre + "comm 0x1 - Init COMPLETE", pre + "ncclCommSplit comm 0x2 - Init COMPLETE"]
            lines += [pre + f"AllReduce: {s} Bytes -> Algo {a} proto {p} channel{{Lo..Hi}}={{0..{c - 1}}}"
                      for s, (a, p, c) in RAN_UNDER_PLUGIN.items()]
            (tmp_path / "verify" / "probe" / f"nccl.gpu-host.{pid}.log").write_text("\n".join(lines) + "\n")
        return ExitCode.OK

    monkeypatch.setattr("ncclbench.tune.launches.spawn", spawn)
    return launches


def _run_verify(tmp_path, monkeypatch, plugin_busbw, repeat=5, timing=None):
    setup = _setup(tmp_path / "out")
    setup.timing = timing
    os.makedirs(setup.output_dir)
    conf = tmp_path / "tuned.conf"
    conf.write_text(CONF)
    setup.request.verify, setup.request.repeat = str(conf), repeat
    rows = read_config(str(conf))
    setup.verify_rows, setup.plugin = (rows, rows), verify.Plugin("/x/libnccl-tuner-example.so", "Example", [6, 5])
    launches = _fake_launches(monkeypatch, tmp_path / "out", plugin_busbw)
    return verify.run_verify(setup), launches, setup


def test_verify_measures_the_default_before_and_after_the_plugin_and_names_a_slower_size(tmp_path, monkeypatch,
                                                                                         capsys):
    slower = {s: list(v) for s, v in BUSBW["default"].items()}
    slower[524288] = [40.0, 40.2, 39.9]   # NCCL's own choice row, not a won range: still judged
    code, launches, setup = _run_verify(tmp_path, monkeypatch, slower)
    assert [(phase, rounds) for phase, rounds, _env in launches] == [
        ("verify/default", [1, 2, 3]), ("verify/plugin", [1, 2, 3, 4, 5]), ("verify/default-after", [4, 5]),
        ("verify/probe", [1])]
    envs = {phase: env for phase, _r, env in launches}
    assert envs["verify/default"]["NCCL_TUNER_PLUGIN"] is None and envs["verify/default-after"]["NCCL_TUNER_PLUGIN"] is None
    assert envs["verify/plugin"]["NCCL_TUNER_PLUGIN"] == "/x/libnccl-tuner-example.so"
    assert envs["verify/plugin"]["NCCL_TUNER_CONFIG_FILE"] == str(tmp_path / "tuned.conf")
    assert envs["verify/probe"]["NCCL_DEBUG"] == "INFO" and envs["verify/probe"]["NCCL_TUNER_PLUGIN"]
    out, err = capsys.readouterr()
    assert code == ExitCode.REGRESSION
    assert "ncclbench tune --verify: NOT safe to deploy: slower than NCCL's default beyond noise at all_reduce 512K " \
           "(-50.0 %)" in err
    assert "# NCCL said: TUNER/ExamplePlugin: Loaded 3 tuning configurations from c" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("512K"))
    assert "ring/ll128 ch16" in line and "yes" in line and line.endswith("SLOWER beyond noise")
    doc = json.loads((tmp_path / "out" / "verify.json").read_text())
    assert doc["exit_code"] == 1 and [d["slower"] for d in doc["collectives"]["all_reduce"]["sizes"]] == \
        [False, False, False, True]


def test_verify_passes_a_config_that_changes_nothing(tmp_path, monkeypatch, capsys):
    code, _launches, _setup_ = _run_verify(tmp_path, monkeypatch, BUSBW["default"])
    out, err = capsys.readouterr()
    assert code == ExitCode.OK, out
    assert "no measured size slower than NCCL's default beyond noise (4 size(s); faster beyond noise at 0)" in err


def test_a_size_no_row_matches_is_judged_too(tmp_path):
    """A hand-written file with only a winning row: the sizes outside it run one channel and
    fail the run (before, --verify left them out of its exit code)."""
    from ncclbench.tune import analysis, verify_report

    setup = _setup(tmp_path)
    rows = [parse_config_line("allreduce,98305,393216,tree,ll,8,1,8,1,0", 1)]
    default = analysis.Measured(busbw=BUSBW["default"])
    one_channel = {s: ([b / 10 for b in v] if s == 524288 else v) for s, v in BUSBW["default"].items()}
    judged = verify_report.Judged()
    lines, doc = verify_report.collective_report(setup, "all_reduce", (default, analysis.Measured(),
                                                 analysis.Measured(busbw=one_channel)), {}, rows, judged)
    code, verdict = verify_report.verdict(judged, setup.nranks, False)
    assert code == 1 and verdict.endswith("at all_reduce 512K (-90.0 %)")
    assert [d["row_line"] for d in doc["sizes"]] == [None, 1, 1, None]


@pytest.mark.parametrize("before,after,plugin,verdict", [
    ([100, 101, 100], [100, 101], [95, 95.5, 95.2, 94.9, 95.1], "SLOWER beyond noise"),
    ([100, 108, 100], [100, 101], [95, 95.5, 95.2, 94.9, 95.1], "within noise"),      # one launch's repeats spread 8 %
    ([100, 101, 100], [107, 107.5], [95, 95.5, 95.2, 94.9, 95.1], "within noise"),    # the default drifted 7 %
    ([100, 101, 100], [100, 101], [98.5, 98.7, 98.6, 98.4, 98.5], "within noise"),    # -1.5 %: below --min-gain
    ([100, 100, 100], [96, 96], [95.5, 95.5, 95.5, 95.5, 96.5], "within noise"),       # -4.5 %, drift 4 %: overlap
    ([100, 101, 100], [100, 101], [105, 105.5, 105.2, 104.9, 105.1], "faster beyond noise"),
    ([100, 100, 101], [100, 99], [101, 50, 50, 51, 50], "SLOWER beyond noise"),       # the plugin's scatter widens nothing
    ([100, 60, 100], [100, 100], [70, 70, 70, 70, 70], "SLOWER beyond noise"),        # nor one stall of the default
])
def test_when_a_size_is_slower_beyond_noise(before, after, plugin, verdict):
    v = judge_deploy(4096, Series(before), Series(after), Series(plugin), 2.0)
    assert v.why == verdict, (v.change_pct, v.noise_pct)
    assert v.slower is (verdict.startswith("SLOWER"))


def test_what_cannot_be_judged_is_not_called_safe():
    assert judge_deploy(8, Series([1.0] * 3), Series([1.0] * 2), Series([1.0] * 5, wrong=True)).wrong is True
    v = judge_deploy(8, Series([1.0] * 3), Series([1.0] * 2), Series([]))
    assert v.slower is None and v.why == "not measured under the plugin"
    v = judge_deploy(8, Series([1.0]), Series([]), Series([1.0, 1.0]))
    assert v.slower is None and v.why.startswith("fewer than 3 repeats")


def test_verify_times_like_tune_and_sees_a_5_percent_loss_at_every_size(tmp_path, monkeypatch, capsys):
    """Graph replay in the timed launches (NCCL_GRAPH_REGISTER=0, so the rows' regBuff 0 match),
    the probe eager; with replay's tight repeats a 5 % loss is slower beyond noise at every size."""
    from ncclbench.tune import precision

    tight = {s: [v[1], v[1] * 1.001, v[1] * 0.999] for s, v in BUSBW["default"].items()}
    monkeypatch.setitem(BUSBW, "default", tight)
    TIMINGS_SEEN.clear()
    code, launches, _s = _run_verify(tmp_path, monkeypatch, {s: [b * 0.95 for b in v] for s, v in tight.items()},
                                     timing=precision.choose_timing("nccl", "auto", 5, 20))
    envs = {phase: env for phase, _r, env in launches}
    assert envs["verify/default"]["NCCL_GRAPH_REGISTER"] == "0" and envs["verify/plugin"]["NCCL_GRAPH_REGISTER"] == "0"
    assert "NCCL_GRAPH_REGISTER" not in envs["verify/probe"]
    assert TIMINGS_SEEN == [("verify/default", {"graph"}), ("verify/plugin", {"graph"}),
                            ("verify/default-after", {"graph"}), ("verify/probe", {"eager"})]
    out, err = capsys.readouterr()
    assert code == ExitCode.REGRESSION
    assert "# timing: CUDA-graph replay at every size" in out
    assert all(f"all_reduce {k} (-5.0 %)" in err for k in ("64K", "128K", "256K", "512K"))
