"""tune's performance.csv read by NCCL's own scripts/optimize_config.py (plugins/tuner/example),
on the CSV tune writes from planted measurements: the script accepts every row, and its
best setting per size is the one ncclbench measured fastest there.

The script is NCCL's, not copied here: NCCL_SOURCE names a copy of NVIDIA/nccl (a checkout,
or a bare clone read with `git show`). Without it the script test is skipped; the schema
test below always runs."""

import csv
import os
import subprocess
import sys

import pytest

from ncclbench.tune import report

from test_tune_report import _measured, _probe, _setup, confirmer

SCRIPT_PATHS = ("plugins/tuner/example/scripts/optimize_config.py", "ext-tuner/example/scripts/optimize_config.py")
# what optimize_config.py's PerformanceData reads from each row, and how (int with '-1' for any)
INT_COLUMNS = ("size_bytes", "channels", "nodes", "ranks", "pipeOps", "regBuff")
TEXT_COLUMNS = ("collective", "algorithm", "protocol")
METRICS = ("bandwidth_gbps", "latency_us")


def _written_csv(tmp_path, capsys, nnodes=1):
    setup = _setup(tmp_path)
    setup.nnodes = nnodes
    probe_items, probe_results, worlds = _probe(setup, tmp_path)
    items, results = _measured(setup, tmp_path)
    report.finish(setup, probe_items, probe_results, worlds, items, results, confirm=confirmer(setup, tmp_path))
    capsys.readouterr()
    return tmp_path / "performance.csv"


def test_the_csv_holds_what_optimize_config_reads_in_its_types(tmp_path, capsys):
    path = _written_csv(tmp_path, capsys, nnodes=2)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(INT_COLUMNS + TEXT_COLUMNS + METRICS) <= set(rows[0])
    for row in rows:
        ints = {k: int(row[k]) for k in INT_COLUMNS}
        assert ints["size_bytes"] > 0 and (ints["channels"] == -1 or ints["channels"] >= 1)
        assert (ints["nodes"], ints["ranks"], ints["pipeOps"], ints["regBuff"]) == (2, 8, 1, 0)
        assert row["collective"] == "allreduce" and row["algorithm"] in ("tree", "ring") and row["protocol"] == "ll"
        assert float(row["bandwidth_gbps"]) > 0 and float(row["latency_us"]) > 0


def _script_text() -> str:
    source = os.environ.get("NCCL_SOURCE")
    if not source:
        pytest.skip("NCCL's optimize_config.py is not part of this repository: set NCCL_SOURCE to a copy of "
                    "NVIDIA/nccl (a checkout or a bare clone) to run it")
    for rel in SCRIPT_PATHS:
        if os.path.isfile(os.path.join(source, rel)):
            with open(os.path.join(source, rel), encoding="utf-8") as f:
                return f.read()
        shown = subprocess.run(["git", "--git-dir", source, "show", f"HEAD:{rel}"], capture_output=True, text=True)
        if shown.returncode == 0:
            return shown.stdout
    pytest.skip(f"NCCL_SOURCE={source} holds no {' or '.join(SCRIPT_PATHS)}")


def test_nccls_optimize_config_reads_the_csv_and_agrees_on_the_best(tmp_path, capsys):
    script = tmp_path / "optimize_config.py"
    script.write_text(_script_text())
    (tmp_path / "tune").mkdir()
    path = _written_csv(tmp_path / "tune", capsys)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    done = subprocess.run([sys.executable, str(script), "-m", "bandwidth_gbps", "--dry-run", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Loaded {len(rows)} performance data points" in done.stdout and "Skipping invalid row" not in done.stdout
    configs = done.stdout.split("Generated configurations:")[1].split()
    best = {}   # size -> (algorithm, protocol) ncclbench measured fastest
    for row in rows:
        size = int(row["size_bytes"])
        if size not in best or float(row["bandwidth_gbps"]) > best[size][0]:
            best[size] = (float(row["bandwidth_gbps"]), row["algorithm"], row["protocol"])
    for size, (_bw, algo, proto) in best.items():
        chosen = [c.split(",") for c in configs if int(c.split(",")[1]) <= size <= int(c.split(",")[2])]
        assert len(chosen) == 1 and chosen[0][3:5] == [algo, proto], (size, chosen)
        assert chosen[0][6:10] == ["1", "8", "1", "0"]   # nodes, ranks, pipeOps, regBuff as measured
