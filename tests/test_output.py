"""Our -J JSON against a real nccl-tests -J file, key by key; `show` replays a saved run."""

import json

from conftest import REFERENCE, run_cli, table_rows
from ncclbench.cli.main import main

NCCL_TESTS_JSON = REFERENCE / "h200-2gpu-nvswitch" / "all_reduce_np2_periter.json"


def _shape(value):
    """Type skeleton of a JSON value: same keys, same kinds of leaves."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _covers(ours, theirs, path="$"):
    """Every key nccl-tests writes is in ours with a value of the same kind (extra keys allowed)."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        for key, sub in theirs.items():
            assert key in ours, f"{path}.{key} missing"
            _covers(ours[key], sub, f"{path}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), path
        if theirs and ours:
            _covers(ours[0], theirs[0], f"{path}[0]")
    else:
        assert ours == theirs, f"{path}: {ours} vs {theirs}"


def test_json_has_nccl_tests_schema_key_by_key(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "8", "-e", "64", "-f", "8", "-n", "4", "-I", "1",
                 "-K", "1", "--no-save", "-J", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    ours = json.loads(out.read_text())
    theirs = json.loads(NCCL_TESTS_JSON.read_text())
    _covers(_shape(ours), _shape(theirs))
    assert ours["version"] == 3
    assert ours["results"][0]["root"] == "    -1"  # padded string, as nccl-tests writes it
    assert ours["config"]["blocking_collectives"] in ("true", "false")
    assert len(ours["config"]["devices"]) == 2
    # the numbers agree with the table
    rows = table_rows(r.stdout)
    for res, row in zip(ours["results"], rows):
        assert res["size"] == int(row[0]) and res["count"] == int(row[1])
        assert f"{res['out_of_place']['bus_bw']:.2f}" == row[7]


def test_json_name_is_never_overwritten(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("{}")
    r = run_cli(["allreduce", "-g", "1", "--backend", "gloo", "-b", "8", "-e", "8", "-n", "1", "--no-save",
                 "-J", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert out.read_text() == "{}"
    assert json.loads((tmp_path / "r.json.0").read_text())["version"] == 3
    assert f"# Writing JSON output to {out}.0" in r.stdout


def test_store_and_show_replay_the_table(tmp_path, capsys):
    store = tmp_path / "store"
    r = run_cli(["broadcast", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2",
                 "--results-dir", str(store)])
    assert r.returncode == 0, r.stderr[-2000:]
    saved = list(store.glob("*_broadcast_2r_gloo.json"))
    assert len(saved) == 1 and "results saved to" in r.stderr
    try:
        main(["show", str(saved[0])])
    except SystemExit as exc:
        assert exc.code in (0, None)
    shown = capsys.readouterr().out
    original = [row[:5] + row[6:8] for row in table_rows(r.stdout)]
    replayed = [row[:5] + row[6:8] for row in table_rows(shown)]
    assert replayed == original and len(original) == 2
    assert "# Collective test starting: broadcast_perf" in shown
    assert "# NCCL path: none (gloo backend: TCP through the hosts' network stack, no NCCL)" in shown  # the store keeps it


def test_show_reads_nccl_tests_text(capsys):
    try:
        main(["show", str(REFERENCE / "h200-4gpu-nvswitch" / "sendrecv_np4.txt")])
    except SystemExit as exc:
        assert exc.code in (0, None)
    out = capsys.readouterr().out
    assert "sendrecv" in out and "2147483648" in out


def _reporter_fixture(tmp_path, clock, spec=None):
    import io

    from ncclbench.results.output import OutputSpec, Reporter
    from ncclbench.results.records import DeviceRecord, PlacementResult, ResultRow, RunInfo

    config = {"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 64, "step_factor": 2,
              "warmup_iters": 1, "iterations": 5, "aggregated_iterations": 1, "validation": 1, "graph": 0}
    info = RunInfo(collective="all_reduce", args=["allreduce"], backend="gloo", mode="eager", timing="host clock",
                   nranks=1, devices=[DeviceRecord(0, 0, 1, "h", -1, "0", "cpu")], ncclbench_version="0",
                   torch_version="0", nccl_code=0, nccl_text="gloo", config=config, env=[], start_time="now")
    spec = spec or OutputSpec(json_path=str(tmp_path / "r.json"))
    rep = Reporter(info, spec, stream=io.StringIO(), clock=clock)

    def row(size):
        cell = PlacementResult(1.0, 1.0, 1.0, 0)
        return ResultRow("all_reduce", size, size // 4, "float", "sum", -1, cell, cell)
    return rep, row


def test_running_json_follows_every_row_while_it_is_cheap(tmp_path):
    """A JSON rewrite that costs little next to the rows keeps up row by row; a clock that
    never moves means each write took no time."""
    rep, row = _reporter_fixture(tmp_path, clock=lambda: 0.0)
    for k, size in enumerate((8, 16, 32)):
        rep.add_row(row(size))
        doc = json.loads((tmp_path / "r.json").read_text())
        assert [r["size"] for r in doc["results"]] == [8, 16, 32][: k + 1]
        assert doc["ncclbench"]["status"] == "running"


def test_the_run_is_finished_once_when_two_threads_end_it(tmp_path):
    """-T: the watchdog's thread writes the timeout trailer while the main thread, released
    by a lost peer or a SIGTERM, may end the run too: one trailer, and the first verdict
    stays in the JSON."""
    import threading

    from ncclbench.results.records import RunSummary

    rep, row = _reporter_fixture(tmp_path, clock=lambda: 0.0)
    rep.add_row(row(8))
    first = RunSummary(list(rep.rows), complete=False, status="timeout", errors=["timeout: ..."])
    watchdog = threading.Thread(target=rep.finish, args=(first,))
    watchdog.start()
    watchdog.join()
    rep.finish(RunSummary(list(rep.rows), complete=False, status="interrupted", errors=["terminated by SIGTERM"]))
    out = rep.stream.getvalue()
    assert out.count("# Collective test concluded") == 1 and "timeout: ..." in out and "SIGTERM" not in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "timeout"


def _json_writes_taking(monkeypatch, now: list, seconds: float) -> None:
    """Every JSON write advances the fake clock `now[0]` by `seconds` (then writes)."""
    import ncclbench.results.output as output

    real_write = output.write_json_atomic

    def timed_write(path, doc):
        now[0] += seconds
        real_write(path, doc)
    monkeypatch.setattr(output, "write_json_atomic", timed_write)


def test_running_json_keeps_up_with_every_row_of_an_ordinary_sweep(tmp_path, monkeypatch):
    """Writes of 5 ms with rows 1 ms apart: still every row (a sweep, not a 1000-row soak),
    because a rank torn down by its launcher after a peer died never writes the end of the
    run (tests/test_reliability.py)."""
    now = [0.0]
    rep, row = _reporter_fixture(tmp_path, clock=lambda: now[0])
    _json_writes_taking(monkeypatch, now, 0.005)
    for k in range(10):
        now[0] += 0.001
        rep.add_row(row(8 * (k + 1)))
        assert len(json.loads((tmp_path / "r.json").read_text())["results"]) == k + 1


def test_costly_running_json_is_rewritten_less_often_and_in_full_at_the_end(tmp_path, monkeypatch):
    """Past the every-row limit (set to 0 here, 1000 rows in use), each write costing 1 s on
    the fake clock and rows 2 s apart: the next rewrite waits 20 s (5 % of the time on JSON),
    the rows in between reach it later, finish writes all."""
    from ncclbench.results.records import RunSummary

    now = [0.0]
    rep, row = _reporter_fixture(tmp_path, clock=lambda: now[0])
    rep.JSON_EVERY_ROW_UP_TO = 0
    _json_writes_taking(monkeypatch, now, 1.0)
    seen = []
    for k in range(30):
        now[0] += 2.0
        rep.add_row(row(8 * (k + 1)))
        seen.append(len(json.loads((tmp_path / "r.json").read_text())["results"]))
    assert seen[-1] < 30
    assert 1 < len(set(seen)) <= 30 * 2 // 20 + 2  # a rewrite about every 20 fake seconds
    rep.finish(RunSummary(rep.rows, complete=True))
    doc = json.loads((tmp_path / "r.json").read_text())
    assert len(doc["results"]) == 30 and doc["ncclbench"]["complete"] is True


def test_a_result_file_that_stops_working_mid_run_loses_no_rows(tmp_path, capsys):
    """Its directory removed after the first row (a disk that fills up or goes away): one
    warning, that file is dropped, every row still reaches stdout and the other files, and
    the run ends as an output error (exit 6) naming the file."""
    import shutil

    import pandas as pd

    from ncclbench.results.output import OutputSpec
    from ncclbench.results.records import RunSummary
    from ncclbench.engine.outcome import exit_code_for

    (tmp_path / "j").mkdir()
    (tmp_path / "c").mkdir()
    spec = OutputSpec(json_path=str(tmp_path / "j" / "r.json"), csv_path=str(tmp_path / "c" / "r.csv"))
    rep, row = _reporter_fixture(tmp_path, clock=lambda: 0.0, spec=spec)
    rep.add_row(row(8))
    shutil.rmtree(tmp_path / "j")
    for size in (16, 32, 64):
        rep.add_row(row(size))
    summary = RunSummary(list(rep.rows), complete=True)
    rep.finish(summary)
    err = capsys.readouterr().err
    lost = f"cannot write JSON file {tmp_path / 'j' / 'r.json'}: No such file or directory"
    assert err.count("ncclbench: warning: " + lost) == 1
    assert summary.status == "output_error" and summary.errors == [lost]
    assert exit_code_for(summary) == 6
    text = rep.stream.getvalue()
    assert len(table_rows(text)) == 4 and f"# Error: {lost}" in text
    assert list(pd.read_csv(tmp_path / "c" / "r.csv").size_bytes) == [8, 8, 16, 16, 32, 32, 64, 64]
    assert not (tmp_path / "j").exists()  # nothing recreated it


def test_a_lost_csv_is_named_in_the_json_and_the_json_keeps_every_row(tmp_path, capsys):
    import shutil

    from ncclbench.results.output import OutputSpec
    from ncclbench.results.records import RunSummary

    (tmp_path / "c").mkdir()
    spec = OutputSpec(json_path=str(tmp_path / "r.json"), csv_path=str(tmp_path / "c" / "r.csv"))
    rep, row = _reporter_fixture(tmp_path, clock=lambda: 0.0, spec=spec)
    rep.add_row(row(8))
    shutil.rmtree(tmp_path / "c")
    rep.add_row(row(16))
    rep.finish(RunSummary(list(rep.rows), complete=True))
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["size"] for r in doc["results"]] == [8, 16]
    assert doc["ncclbench"]["status"] == "output_error"
    assert any("cannot write CSV file" in e for e in doc["errors"])
    assert "ncclbench: warning: cannot write CSV file" in capsys.readouterr().err


def test_an_output_error_ranks_below_every_measured_failure():
    from ncclbench.errors import ExitCode
    from ncclbench.engine.outcome import severity

    assert severity(ExitCode.OK) < severity(ExitCode.OUTPUT_ERROR) < severity(ExitCode.WRONG_RESULTS)


def test_ranks_whose_nccl_settings_differ_from_rank_0s_are_named():
    from ncclbench.engine.runfacts import environ_note

    same = ("NCCL_ALGO=Ring",)
    assert environ_note([same, same, same]) is None
    assert environ_note([same, (), same, ("NCCL_ALGO=Tree",), ("NCCL_ALGO=Tree",)]) == (
        "NCCL environment differs by rank: rank 1: no NCCL_* set; ranks 3,4: NCCL_ALGO=Tree")
