"""The Python API (ncclbench.measure) on a job's own process groups: real ranks under
torchrun (gloo), the same rows as the command line, the groups usable afterwards, bad input
refused on every rank, a stalled rank timed out on every rank."""

import json
import re
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT, run_cli

RANKS_SCRIPT = ROOT / "tests" / "api_ranks.py"


def run_ranks(scenario: str, nranks: int, outdir, env=None, timeout=300) -> list[dict]:
    """tests/api_ranks.py SCENARIO under `torchrun --standalone --nproc-per-node N`; each rank's record."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nranks),
           str(RANKS_SCRIPT), scenario, str(outdir)]
    full_env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1", **(env or {}))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "NCCLBENCH_FAULT"):
        if name not in (env or {}):
            full_env.pop(name, None)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    records = []
    for rank in range(nranks):
        path = outdir / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing (exit {r.returncode}):\n{r.stderr[-3000:]}"
        records.append(json.loads(path.read_text()))
    for rec in records:
        assert "crash" not in rec, rec["crash"]
    return records


def test_import_is_light():
    """`import ncclbench` and reaching the API's names import neither torch nor pandas."""
    code = ("import sys, ncclbench; ncclbench.PlanError; ncclbench.measure; ncclbench.preflight; "
            "ncclbench.PreflightReport; print('torch' in sys.modules, 'pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "False"], r.stderr


def test_without_a_process_group_it_says_so():
    import torch.distributed as dist

    import ncclbench

    assert not dist.is_initialized()
    with pytest.raises(ncclbench.PlanError, match="no process group is initialised"):
        ncclbench.measure("all_reduce", "1K")
    with pytest.raises(ncclbench.PlanError, match="no process group is initialised"):
        ncclbench.preflight()


@pytest.mark.parametrize("spec,expected", [
    ("32M", {"minbytes": 32 << 20, "maxbytes": 32 << 20}),
    (1024, {"minbytes": 1024, "maxbytes": 1024}),
    ("8M:1G:x4", {"minbytes": 8 << 20, "maxbytes": 1 << 30, "stepfactor": 4.0}),
    ("8M:64M", {"minbytes": 8 << 20, "maxbytes": 64 << 20, "stepfactor": 2.0}),
    ("1M:4M:+1M", {"minbytes": 1 << 20, "maxbytes": 4 << 20, "stepbytes": 1 << 20}),
])
def test_sizes(spec, expected):
    from ncclbench.api.measure import parse_sizes

    assert parse_sizes(spec) == expected


@pytest.mark.parametrize("spec", ["8M:", "x:1G", "1K:2K:xq", "1:2:3:4", ""])
def test_bad_sizes(spec):
    from ncclbench.api.measure import parse_sizes
    from ncclbench.errors import PlanError

    with pytest.raises(PlanError, match="sizes"):
        parse_sizes(spec)


def test_plan_is_the_command_lines():
    """The same options give the same Plan as the command line's parser (one conversion)."""
    from ncclbench.api.measure import plan_for
    from ncclbench.api.options import build_plan, options_for

    api = plan_for("allreduce", "1K:16K:x4", {"iters": 7, "datatype": "half", "op": "max"}, "gloo", 4)
    o = options_for({"minbytes": 1024, "maxbytes": 16384, "stepfactor": 4, "iters": 7, "datatype": "half",
                     "op": "max"})
    assert api.fingerprint() == build_plan("all_reduce", o, "gloo", [], 4).fingerprint()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One 4-rank run of the measure scenario (records, its folder), shared by the tests below."""
    outdir = tmp_path_factory.mktemp("measure")
    return run_ranks("measure", 4, outdir), outdir


def test_measure_on_default_and_sub_groups(measured):
    recs, tmp_path = measured
    r0 = recs[0]
    assert r0["default"]["len"] == 3 and r0["default"]["has_rows"]
    assert [rec["default"]["len"] for rec in recs[1:]] == [0, 0, 0]
    assert {rec["default"]["status"] for rec in recs} == {"ok"}
    assert "#       size         count      type   redop    root     time   algbw   busbw  #wrong" in r0["table"]
    assert "# Out of bounds values : 0 OK" in r0["table"]
    doc = json.loads((tmp_path / "api.json").read_text())
    assert doc["version"] == 3 and [x["size"] for x in doc["results"]] == [1024, 4096, 16384]
    assert len(r0["per_rank"]["rank"]) == 3 * 2 * 4 and sorted(set(r0["per_rank"]["rank"])) == [0, 1, 2, 3]
    for rec in recs:
        assert rec["sum_default"] == 10 and rec["sum_after_alone"] == 10 and rec["sum_end"] == 10
        tp_ranks = [0, 1] if rec["rank"] < 2 else [2, 3]
        dp_ranks = [0, 2] if rec["rank"] % 2 == 0 else [1, 3]
        assert rec["tp"] == {"len": 3, "ranks": tp_ranks, "sizes": [1024, 2048, 4096]}  # all_ranks=True: every rank
        assert rec["sum_tp"] == sum(r + 1 for r in tp_ranks)
        assert rec["dp"]["ranks"] == dp_ranks and rec["dp"]["len"] == (3 if rec["rank"] == dp_ranks[0] else 0)
        assert rec["sum_dp"] == sum(r + 1 for r in dp_ranks)
        assert rec["groups_created_by_measure"] == 0
        assert rec["handlers_kept"]
    assert recs[0]["first_alone"] == 1 and recs[2]["second_alone"] == 1 and "first_alone" not in recs[2]
    assert recs[0]["alone_len"] == 1


def test_bad_input_is_refused_on_every_rank(measured):
    recs, _ = measured
    for rec in recs:
        bad, rank = rec["bad"], rec["rank"]
        assert bad["unknown"][0] == "PlanError" and "unknown collective 'all_foo'" in bad["unknown"][1]
        assert bad["sizes_on_rank1"][0] == "PlanError" and "junk" in bad["sizes_on_rank1"][1]
        assert "(on rank(s) 1)" in bad["sizes_on_rank1"][1]
        assert bad["plan_on_rank1"][0] == "PlanError" and "rank(s) 1 run a different plan" in bad["plan_on_rank1"][1]
        assert bad["cli_only_option"][0] == "PlanError" and "csv_path" in bad["cli_only_option"][1]
        assert bad["out_of_range"][0] == "PlanError" and "iters" in bad["out_of_range"][1]
        if rank:
            assert bad["not_member"][0] == "PlanError" and "not a member" in bad["not_member"][1]
        for key, value in bad.items():
            if key.endswith("_then_sum"):
                assert value == 10, key  # the default group still gives the right answer
        assert all("\n" not in message for _, message in (v for k, v in bad.items() if isinstance(v, list)))


def test_rows_have_the_command_lines_csv_columns(measured):
    """measure()'s to_pandas() and `ncclbench allreduce --csv` for the same plan."""
    _, tmp_path = measured
    csv = tmp_path / "cli.csv"
    r = run_cli(["allreduce", "-g", "4", "--backend", "gloo", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2",
                 "--no-save", "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-2000:]
    cli, api = pd.read_csv(csv), pd.read_csv(tmp_path / "api.csv")
    assert list(api.columns) == list(cli.columns)
    keys = ["collective", "placement", "size_bytes", "count", "dtype", "op", "root", "nwrong", "ranks", "nodes",
            "backend", "mode"]
    pd.testing.assert_frame_equal(api[keys], cli[keys])


def test_stalled_rank_times_out_on_every_rank(tmp_path):
    """Rank 1 stalls before 4096 B: rank 0 (waiting in gloo) raises at the timeout plus the
    gloo grace, before rank 1 is back; rank 1 raises when it comes back; the same message."""
    recs = run_ranks("timeout", 2, tmp_path, env={"NCCLBENCH_FAULT": "stall:rank=1,size=4096,seconds=15"})
    kinds = {rec["error"][0] for rec in recs}
    assert kinds == {"TimeoutExpired"}, recs
    message = recs[0]["error"][1]
    assert recs[1]["error"][1] == message
    assert "4096 B" in message and re.search(r": rank 1 \(pid \d+\) on \S+ never reached it", message) and "rank 0 waited for rank 1" in message and "within 2 s" in message
    assert recs[0]["returned_at"] < recs[1]["returned_at"]  # it did not wait for the stalled rank


@pytest.mark.gpu
def test_measure_on_one_gpu_matches_the_command_line(tmp_path):
    """One rank on NCCL: measure() and the command line on the same plan (same columns and
    rows; their busbw is compared in docs/BENCHMARKS.md), device and stream untouched,
    preflight refused on one GPU (nothing to judge), and a timeout on a one-rank group."""
    recs = run_ranks("gpu", 1, tmp_path)
    rec = recs[0]
    assert rec["status"] == "ok" and rec["stream_kept"] and rec["device_kept"] and rec["sum_after"] == 1
    assert rec["preflight"][0] == "PlanError" and "at least 2 ranks" in rec["preflight"][1], rec["preflight"]
    assert rec["timeout"][0] == "TimeoutExpired" and re.search(r": rank 0 \(pid \d+\) on \S+ never reached it", rec["timeout"][1])
    csv = tmp_path / "cli.csv"
    r = run_cli(["allgather", "-b", "1M", "-e", "64M", "-f", "8", "-n", "20", "--no-save", "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-2000:]
    cli, api = pd.read_csv(csv), pd.read_csv(tmp_path / "api.csv")
    assert list(api.columns) == list(cli.columns)
    keys = ["collective", "placement", "size_bytes", "count", "dtype", "nwrong", "ranks", "backend"]
    pd.testing.assert_frame_equal(api[keys], cli[keys])  # N/A cells (NaN) compare equal here
    ratio = (api["time_us"] / cli["time_us"]).round(3).tolist()
    print("time_us api/cli per row:", ratio)


def test_api_vs_cli_script_builds_the_same_plan_and_its_table(tmp_path):
    """benchmarks/api_vs_cli.py: the command line's options for measure()'s sizes, and the
    table of medians from alternating runs' CSVs."""
    import importlib.util
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("api_vs_cli", ROOT / "benchmarks" / "api_vs_cli.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = SimpleNamespace(collective="all_gather", sizes="1M:64M:x8", iters=7, warmup=2, nproc=2)
    argv = script.cli_args(args, tmp_path / "c.csv")
    assert argv[:5] == ["all_gather", "-b", str(1 << 20), "-e", str(64 << 20)]
    assert argv[argv.index("-f") + 1] == "8"
    assert argv[argv.index("-n") + 1] == "7" and argv[argv.index("-g") + 1] == "2"
    for kind, time_us in (("cli", 100.0), ("api", 110.0)):
        for k in range(2):
            pd.DataFrame([{"size_bytes": 1024, "placement": "out_of_place", "time_us": time_us + k,
                           "algbw_gbps": 1.0, "busbw_gbps": 0.5}]).to_csv(tmp_path / f"{kind}_{k}.csv", index=False)
    lines = script.table(tmp_path, 2)
    assert lines[-1].startswith("| 1024 | out_of_place | 100.50 | 110.50 | 1.100 |")


def test_counts_from_python_are_whole_numbers():
    """Click truncates 2.7 to 2 and reads True as 1: the API and suite files refuse both for a
    count, and take a bool for a 0/1 switch."""
    from ncclbench.api.options import options_for
    from ncclbench.errors import PlanError

    for bad in ({"iters": 2.7}, {"iters": True}, {"warmup_iters": 0.5}):
        with pytest.raises(PlanError, match="must be a whole number"):
            options_for(bad)
    assert options_for({"iters": 3.0})["iters"] == 3 and options_for({"report_cputime": True})["report_cputime"] == 1


def test_a_collective_failing_on_one_rank_raises_its_cause_on_every_rank(tmp_path):
    """Rank 1's collective fails mid-sweep; rank 0 only loses its peer. Both raise
    CollectiveError with the same message, the failed rank's own (not 'lost a peer')."""
    recs = run_ranks("sweep_error", 2, tmp_path, env={"NCCLBENCH_FAULT": "error:rank=1,size=4096"}, timeout=180)
    kinds = {rec["error"][0] for rec in recs}
    messages = {rec["error"][1] for rec in recs}
    assert kinds == {"CollectiveError"} and len(messages) == 1, recs
    assert messages.pop().startswith("rank 1 on ") and "during all_reduce at 4096 B" in recs[0]["error"][1], recs


@pytest.mark.slow
def test_fleet_from_python_returns_one_report_on_every_rank(tmp_path):
    """ncclbench.fleet() in a job's own ranks (torchrun, gloo, each rank a node): every rank
    gets the same report, rank 0 writes its JSON, the job's group works after it; an unknown
    option is refused in one line."""
    recs = run_ranks("fleet", 3, tmp_path, timeout=240)
    reports = [r["fleet"] for r in recs]
    assert all(r == reports[0] for r in reports), reports
    assert reports[0]["exit_code"] == 0 and reports[0]["drain"] == [] and len(reports[0]["hosts"]) == 3
    doc = json.loads((tmp_path / "fleet.json").read_text())
    assert doc["command"] == "fleet" and doc["drain"] == [] and [h["host"] for h in doc["hosts"]] == reports[0]["hosts"]
    assert all(r["sum_after"] == 6 for r in recs)
    assert recs[0]["unknown"][0] == "PlanError" and "bogus" in recs[0]["unknown"][1]

