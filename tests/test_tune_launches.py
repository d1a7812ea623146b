"""How tune's launcher reads rank 0's status lines and starts a launch again after one dies
(the launches themselves replaced by a stand-in that writes what a launch would)."""

import json

import pytest

from ncclbench.errors import ExitCode
from ncclbench.tune import launches, run
from ncclbench.tune.plan import DEFAULT, CandidatePlan, Combination


def _setup(tmp_path):
    request = run.TuneRequest(["all_reduce"], {"timeout": 60, "check": 1})
    plans = {"all_reduce": CandidatePlan("all_reduce", [Combination("ring", "ll"), Combination("tree", "ll")], [])}
    return run.Setup(request, "gloo", plans, 2, 1, str(tmp_path))


def _items(setup):
    return launches.work_items(setup, lambda c: [DEFAULT, *setup.plans[c].combos], 2, csv=False)


def _fake_launches(monkeypatch, script):
    """script: one list per launch of (event, status) for the items it is given, in order,
    and the launch's exit code; each event applies to the next pending item."""
    calls = []

    def spawn(setup, argv, env):
        work = json.loads(open(argv[2]).read())
        events, code = script[len(calls)]
        calls.append([it["index"] for it in work["items"]])
        with open(work["status"], "a") as f:
            f.write(json.dumps({"event": "launch", "pid": 100 + len(calls), "world_comm": True}) + "\n")
            for item, (event, status) in zip(work["items"], events):
                f.write(json.dumps({"event": "started", "index": item["index"], "pid": 100 + len(calls)}) + "\n")
                if event == "done":
                    f.write(json.dumps({"event": "done", "index": item["index"], "pid": 100 + len(calls),
                                        "status": status, "errors": [status], "comm_ready": True}) + "\n")
        return code

    monkeypatch.setattr(launches, "spawn", spawn)
    return calls


def test_a_launch_that_dies_inside_an_item_is_started_again_for_the_rest(tmp_path, monkeypatch):
    setup = _setup(tmp_path)
    items = _items(setup)
    calls = _fake_launches(monkeypatch, [
        ([("done", "ok"), ("done", "ok"), ("started", None)], ExitCode.NCCL_ERROR),
        ([("done", "ok")] * 3, ExitCode.OK)])
    results, worlds, code = launches.run_phase(setup, "raw", items, {})
    assert calls == [[0, 1, 2, 3, 4, 5], [3, 4, 5]]
    assert [results[i].status for i in range(6)] == ["ok", "ok", "crashed", "ok", "ok", "ok"]
    assert results[2].pid == 101 and worlds == {101: True, 102: True} and code == ExitCode.OK


def test_peers_of_a_dead_rank_finish_its_item_with_an_error_and_start_the_next(tmp_path, monkeypatch):
    """The item that errored is the crash; the next one, cut short by the teardown, runs again."""
    setup = _setup(tmp_path)
    calls = _fake_launches(monkeypatch, [
        ([("done", "ok"), ("done", "error"), ("started", None)], ExitCode.NCCL_ERROR),
        ([("done", "ok")] * 4, ExitCode.OK)])
    results, _, _ = launches.run_phase(setup, "raw", _items(setup), {})
    assert calls[1] == [2, 3, 4, 5]
    assert results[1].status == "crashed" and "a rank died" in results[1].errors[-1]
    assert results[2].status == "ok"


def test_an_item_that_kills_its_launch_twice_is_the_crash(tmp_path, monkeypatch):
    setup = _setup(tmp_path)
    calls = _fake_launches(monkeypatch, [
        ([("done", "error"), ("started", None)], ExitCode.NCCL_ERROR),
        ([("started", None)], ExitCode.TIMEOUT),
        ([("done", "ok")] * 4, ExitCode.OK)])
    results, _, _ = launches.run_phase(setup, "raw", _items(setup), {})
    assert calls == [[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [2, 3, 4, 5]]
    assert results[0].status == "crashed" and results[1].status == "timeout"


def test_a_launch_that_starts_nothing_ends_the_phase(tmp_path, monkeypatch):
    setup = _setup(tmp_path)
    calls = _fake_launches(monkeypatch, [([], ExitCode.NCCL_ERROR)])
    results, _, code = launches.run_phase(setup, "raw", _items(setup), {})
    assert len(calls) == 1 and code == ExitCode.NCCL_ERROR
    assert {r.status for r in results.values()} == {"not run"}


@pytest.mark.parametrize("code,expected", [(ExitCode.INTERRUPTED, "interrupted"), (ExitCode.NCCL_ERROR, "crashed")])
def test_an_interrupted_item_is_the_users_interrupt_only_when_the_launch_says_so(tmp_path, monkeypatch, code, expected):
    """torchrun's agent ends the other ranks with SIGTERM when one dies: rank 0 then reports
    an interrupt that the user never sent."""
    setup = _setup(tmp_path)
    calls = _fake_launches(monkeypatch, [([("done", "ok"), ("done", "interrupted")], code),
                                         ([("done", "ok")] * 4, ExitCode.OK)])
    results, _, _ = launches.run_phase(setup, "raw", _items(setup), {})
    assert results[1].status == expected
    if expected == "interrupted":
        assert len(calls) == 1 and {results[i].status for i in range(2, 6)} == {"not run"}


def test_the_probe_passes_once_whatever_the_sweeps_per_repeat(tmp_path, monkeypatch):
    """-N 5 repeats each timed sweep; the untimed probe (NCCL's choices from its log) still
    makes one call per size: N sweeps would only lengthen it and its log."""
    setup = _setup(tmp_path)
    setup.request.options["run_cycles"] = 5
    seen = []

    def spawn(s, argv, env):
        seen.append(json.loads(open(argv[2]).read())["options"]["all_reduce"])
        return ExitCode.OK
    monkeypatch.setattr(launches, "spawn", spawn)
    launches.run_phase(setup, "probe", _items(setup), {}, launches.PROBE_OVERRIDES, outputs=False)
    launches.run_phase(setup, "raw", _items(setup), {})
    assert seen[0]["run_cycles"] == 1 and seen[0]["iters"] == 1
    assert seen[-1]["run_cycles"] == 5
