"""`ncclbench tune --rehearse`: the launches, per-combination communicators, raw results,
files and table, for real on gloo ranks (NCCL's own part is in test_gpu.py)."""

import csv
import json

import pytest

from conftest import run_cli
from ncclbench.results.compare import compare_frames
from ncclbench.results.readers import read_results

pytestmark = pytest.mark.slow

SMALL = ["-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "--repeat", "2", "--no-plot"]


def _tune(args, tmp_path, env=None):
    out = tmp_path / "tuned"
    r = run_cli(["tune", *args, "-O", str(out)], env=env, timeout=300)
    return r, out


def test_rehearsal_launches_every_combination_and_writes_every_file(tmp_path):
    r, out = _tune(["allreduce", "allgather", "-g", "2", "--rehearse", "--algos", "ring", "--protos", "ll,simple",
                    "--channels", "4", "-N", "2", *SMALL[:-1]], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "each size measured in 2 sweeps per repeat (-N), their median kept" in r.stdout
    for coll in ("all_reduce", "all_gather"):
        assert f"# ncclbench tune: {coll}" in r.stdout
    assert "rehearsal on gloo" in r.stdout and "no winner called" in r.stdout
    labels = ["default", "ring/ll", "ring/ll ch4", "ring/simple", "ring/simple ch4"]
    doc = json.loads((out / "tune.json").read_text())
    assert doc["run_cycles"] == 2
    for coll in ("all_reduce", "all_gather"):
        assert {k: v["status"] for k, v in doc["collectives"][coll]["combinations"].items()} == dict.fromkeys(labels, "ok")
        assert [v["size"] for v in doc["collectives"][coll]["verdicts"]] == [1024, 4096, 16384]
    raw = sorted(p.name for p in (out / "raw").glob("*.json"))
    assert len(raw) == 2 * 5 * 2  # collectives x combinations x repeats
    assert "all_reduce.ring-ll-ch4.r2.json" in raw
    cycles = json.loads((out / "raw" / "all_reduce.ring-ll-ch4.r2.json").read_text())["results"]
    assert [r["size"] for r in cycles] == [1024, 4096, 16384] * 2  # -N 2: the sweep twice, one repeat
    env = json.loads((out / "raw" / "all_reduce.ring-ll-ch4.r2.json").read_text())["env"]
    assert "NCCL_ALGO=Ring" in env and "NCCL_PROTO=LL" in env  # the combination's environment, as the rank had it
    default_env = json.loads((out / "raw" / "all_reduce.default.r1.json").read_text())["env"]
    assert not any(e.startswith(("NCCL_ALGO=", "NCCL_PROTO=")) for e in default_env)
    with open(out / "performance.csv", newline="") as f:
        perf = list(csv.DictReader(f))
    assert len(perf) == 2 * 4 * 3  # forced combinations only, every size
    assert {row["collective"] for row in perf} == {"allreduce", "allgather"}
    # NCCL chose nothing on gloo: no row could reproduce its choice, and a file without rows
    # would run every call on one channel under the example plugin
    assert not (out / "nccl_tuner.conf").exists()
    assert "#   no nccl_tuner.conf written: rehearsal on gloo" in r.stdout
    assert doc["tuner_config"]["written"] is False and "tuner_config" in doc
    # compare reads tune's raw results like any ncclbench run
    cmp = compare_frames(read_results(out / "raw" / "all_reduce.default.r1.json"),
                         read_results(out / "raw" / "all_reduce.ring-ll.r1.json"))
    assert len(cmp.rows) == 3 * 2
    c = run_cli(["compare", str(out / "raw" / "all_reduce.default.r1.json"),
                 str(out / "raw" / "all_reduce.ring-simple.r2.json")])
    assert c.returncode in (0, 1) and "all_reduce" in c.stdout, c.stderr


def test_a_combination_whose_rank_dies_is_a_row_and_the_rest_go_on(tmp_path):
    env = {"NCCLBENCH_FAULT": "kill:rank=1,size=4096", "NCCLBENCH_FAULT_ITEM": "all_reduce.ring-ll.r1"}
    r, out = _tune(["allreduce", "-g", "2", "--rehearse", "--algos", "ring,tree", "--protos", "ll", *SMALL],
                   tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "tune.json").read_text())["collectives"]["all_reduce"]["combinations"]
    assert doc["ring/ll"]["status"] == "crashed"
    assert doc["default"]["status"] == "ok" and doc["tree/ll"]["status"] == "ok"
    assert "ring/ll            crashed" in r.stdout
    # every item after the crash ran, in a launch of its own
    assert (out / "raw" / "all_reduce.tree-ll.r2.json").exists()
    assert not (out / "raw" / "all_reduce.ring-ll.r1.json").exists() or \
        json.loads((out / "raw" / "all_reduce.ring-ll.r1.json").read_text())["ncclbench"]["status"] != "ok"


def test_wrong_results_are_reported_and_left_out_of_the_data(tmp_path):
    env = {"NCCLBENCH_FAULT": "corrupt:rank=0,size=4096", "NCCLBENCH_FAULT_ITEM": "all_reduce.ring-simple.r2"}
    r, out = _tune(["allreduce", "-g", "2", "--rehearse", "--algos", "ring", "--protos", "ll,simple", *SMALL],
                   tmp_path, env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ring/simple        wrong results" in r.stdout
    assert "wrong results at 2 size(s): never a winner there" in r.stdout
    with open(out / "performance.csv", newline="") as f:
        perf = [(row["protocol"], int(row["size_bytes"])) for row in csv.DictReader(f)]
    assert ("simple", 1024) in perf and ("simple", 4096) not in perf and ("ll", 4096) in perf


def test_one_rank_says_there_is_nothing_to_tune(tmp_path):
    r, out = _tune(["allreduce", "-g", "1", "--rehearse", *SMALL], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "chooses no algorithm or protocol" in r.stdout
    doc = json.loads((out / "tune.json").read_text())["collectives"]["all_reduce"]
    assert doc["ranges"] == []
    # torch's backends have no out-of-place call on one rank: the default column says N/A,
    # never the in-place no-op's busbw (before: the in-place cell, thousands of GB/s)
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("  ") and ln.split()[0][0].isdigit()]
    assert rows and all(row[1] == "N/A" for row in rows), r.stdout
    assert all(v["default_busbw"] is None and v["default_repeats"] == [None, None] for v in doc["verdicts"])
    assert sorted(p.name for p in (out / "raw").glob("*.json")) == ["all_reduce.default.r1.json",
                                                                   "all_reduce.default.r2.json"]


def test_a_suite_entry_runs_tune(tmp_path):
    out = tmp_path / "tuned"
    suite = tmp_path / "s.yaml"
    suite.write_text(f"""
runs:
  - collective: broadcast
    minbytes: 1K
    maxbytes: 4K
    stepfactor: 4
    iters: 2
    warmup_iters: 1
    tune: {{repeat: 2, protos: simple, output_dir: {out}, rehearse: true, plot: false}}
  - collective: all_gather
    minbytes: 1K
    maxbytes: 1K
""")
    r = run_cli(["suite", str(suite), "-g", "2", "--backend", "gloo", "--no-save"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "# Suite summary" in r.stdout and "# ncclbench tune: broadcast" in r.stdout
    combos = json.loads((out / "tune.json").read_text())["collectives"]["broadcast"]["combinations"]
    assert set(combos) == {"default", "ring/simple"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(suite.read_text().replace("iters: 2\n", "iters: 2\n    cudagraph: 1\n", 1))
    r = run_cli(["suite", str(bad), "-g", "2", "--backend", "gloo", "--no-save"], timeout=120)
    assert r.returncode == 2 and "'cudagraph' is not one of them" in r.stderr, r.stderr


def test_a_combination_failing_on_every_rank_is_an_error_not_a_crash(tmp_path):
    """Every rank's collective fails: each item is 'error' with the failed rank's line, all in
    one launch (before the one-line report raised RankFailures past tune's handler, every
    item read 'crashed' and was relaunched), and nothing but tune's progress on stderr."""
    r, out = _tune(["allreduce", "-g", "2", "--rehearse", "--algos", "ring", "--protos", "ll", "-b", "1K", "-e", "16K",
                    "-f", "4", "-n", "2", "-w", "1", "--repeat", "2", "--no-plot", "-T", "60"], tmp_path,
                   env={"NCCLBENCH_FAULT": "error:rank=0,size=4096;error:rank=1,size=4096"})
    assert r.returncode == 3, r.stderr[-3000:]
    combos = json.loads((out / "tune.json").read_text())["collectives"]["all_reduce"]["combinations"]
    assert {label: c["status"] for label, c in combos.items()} == {"default": "error", "ring/ll": "error"}
    assert all(c["error"].startswith("rank ") and " during all_reduce at 4096 B" in c["error"] for c in combos.values())
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench: error:")] == [], r.stderr[-3000:]
    assert "crashed" not in r.stderr


def _two_nodes(args: list[str], node0: list[str], timeout: float):
    """`tune ... --nnodes 2` as node 0 (with `node0` added) and node 1, both on this host
    (torchrun's static rendezvous does not mind): (their processes, (stdout, stderr) each)."""
    import os
    import socket
    import subprocess

    from conftest import cli_command

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
    common = ["tune", *args, "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    procs = [subprocess.Popen(cli_command() + common + ["--node-rank", str(i)] + (node0 if i == 0 else []),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in (0, 1)]
    try:
        return procs, [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_ranks_on_two_hosts_run_every_launch_and_rows_name_both(tmp_path):
    """Two `tune --nnodes 2` processes (node 0 and a following node, both on this host, which
    torchrun's static rendezvous does not mind): node 0 runs the launches and reports, node 1
    takes part in each and stops after node 0's last; rows and CSV say 2 nodes, 2 ranks."""
    out = tmp_path / "tuned"
    procs, results = _two_nodes(["allreduce", "-g", "1", "--rehearse", "--algos", "ring", "--protos", "simple", *SMALL],
                                ["-O", str(out)], 400)
    (out0, err0), (_out1, err1) = results
    assert procs[0].returncode == 0, err0[-3000:]
    assert procs[1].returncode == 0, err1[-3000:]
    assert "2 rank(s) on 2 node(s)" in out0 and "node 1 of 2: took part in 1 launch(es) of node 0" in err1
    doc = json.loads((out / "tune.json").read_text())
    assert (doc["nodes"], doc["ranks"]) == (2, 2)
    assert doc["timing"].startswith("eager: gloo (CPU) has no CUDA graphs")
    with open(out / "performance.csv", newline="") as f:
        assert {(r["nodes"], r["ranks"]) for r in csv.DictReader(f)} == {("2", "2")}
    devices = json.loads((out / "raw" / "all_reduce.default.r1.json").read_text())["config"]["devices"]
    assert len(devices) == 2   # one process per node took part in the measurement


def test_node_0_refusing_the_run_releases_the_other_nodes(tmp_path):
    """Node 0 refuses the run for a reason node 1 does not check (here its -O folder holds a
    run already; on GPUs: a --verify file missing): node 1 used to wait in its first
    rendezvous for torchrun's 600 s. Now node 0 makes the run's last launch before it says
    its one line, and node 1 stops with it, saying why, exit 2 (not 0: no run took place)."""
    import time

    taken = tmp_path / "taken"
    (taken / "raw").mkdir(parents=True)
    start = time.monotonic()
    procs, results = _two_nodes(["allreduce", "-g", "1", "--rehearse", *SMALL], ["-O", str(taken)], 150)
    took = time.monotonic() - start
    (_out0, err0), (_out1, err1) = results
    errors = [line for line in err0.splitlines() if line.startswith("ncclbench")]
    assert procs[0].returncode == 2 and len(errors) == 1 and "already holds a tune run" in errors[0], err0[-3000:]
    said = [line for line in err1.splitlines() if line.startswith("ncclbench")]
    assert procs[1].returncode == 2 and len(said) == 1, err1[-3000:]
    assert said[0].startswith("ncclbench: error: node 1 of 2: node 0 refused the run (") and \
        "already holds a tune run" in said[0], said
    assert took < 120, took


def test_paired_keeps_one_communicator_per_configuration_and_set(tmp_path):
    """--paired 2 over 8 repeats on gloo ranks: each configuration's two communicators are made
    in repeats 1 and 2 and every later repeat runs on one of them (rank 0's status lines say
    which items made one); the order turns every repeat; the table and tune.json say so."""
    r, out = _tune(["allreduce", "-g", "2", "--rehearse", "--algos", "ring", "--protos", "ll,simple", "-b", "1K",
                    "-e", "4K", "-f", "4", "-n", "2", "-w", "1", "--repeat", "8", "--paired", "2", "--no-plot"],
                   tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "side by side (--paired 2)" in r.stdout and "# rule: paired:" in r.stdout
    work = json.loads((out / "launches" / "raw.work.json").read_text())["items"]
    done = {e["index"]: e for e in map(json.loads, (out / "launches" / "raw.status.jsonl").read_text().splitlines())
            if e["event"] == "done"}
    assert len(done) == len(work) == 3 * 8 and all(e["status"] == "ok" for e in done.values())
    made = {(it["combo"]["algo"], it["combo"]["proto"], it["comm_set"])
            for it in work if done[it["index"]]["comm_made"]}
    assert len(made) == 3 * 2 and all(done[it["index"]]["comm_made"] == (it["round"] <= 2) for it in work)
    firsts = [it["combo"]["proto"] for it in work if it["index"] % 3 == 0]
    assert firsts == [None, "ll", "simple", None, "ll", "simple", None, "ll"]  # a turn every repeat
    doc = json.loads((out / "tune.json").read_text())
    assert doc["paired"] == 2 and all(v["ratio_interval"] for v in doc["collectives"]["all_reduce"]["verdicts"])
