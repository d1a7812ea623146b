"""`--metrics FILE` (results/metrics.py) checked with the real tools: promtool's linter, and a
node_exporter started here with its textfile collector on a temporary folder, scraped over
HTTP on the loopback; every value read back must equal the command's JSON. The tools come
from Debian's prometheus and prometheus-node-exporter packages
(scripts/ci/install_cluster_tools.sh installs them for CI)."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ncclbench.results import metrics

REPO = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus; "
                                    "scripts/ci/install_cluster_tools.sh installs it)")
needs_exporter = pytest.mark.skipif(NODE_EXPORTER is None, reason="node_exporter not installed (Debian package "
                                    "prometheus-node-exporter; scripts/ci/install_cluster_tools.sh installs it)")


# ---- the tools ----------------------------------------------------------------------------------
def promtool_check(path: Path) -> None:
    proc = subprocess.run([PROMTOOL, "check", "metrics"], input=path.read_bytes(), capture_output=True, timeout=60)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), \
        (proc.stdout + proc.stderr).decode(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def node_exporter(folder: Path):
    """A node_exporter with only the textfile collector on `folder`, on 127.0.0.1; its URL."""
    port = _free_port()
    proc = subprocess.Popen([NODE_EXPORTER, "--collector.disable-defaults", "--collector.textfile",
                             f"--collector.textfile.directory={folder}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"node_exporter did not start: {proc.stderr.read().decode()}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stderr.close()


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)$')


def _labels(body: str) -> dict:
    """Label pairs of a scraped sample, escapes undone (written here, not taken from the module)."""
    out, i = {}, 1
    while i < len(body) - 1:
        eq = body.index("=", i)
        name, i, value = body[i:eq].strip(" ,"), eq + 2, []
        while body[i] != '"':
            if body[i] == "\\":
                value.append({"n": "\n", "\\": "\\", '"': '"'}[body[i + 1]])
                i += 2
            else:
                value.append(body[i])
                i += 1
        out[name] = "".join(value)
        i += 1
    return out


def scrape(url: str) -> dict:
    """{(name, frozenset(labels)): value} of every ncclbench_ sample, and node_exporter's
    own verdict on the folder (node_textfile_scrape_error)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m and not line.startswith("#"):
            name, body, value = m.groups()
            samples[(name, frozenset(_labels(body or "{}").items()))] = float(value)
    assert samples[("node_textfile_scrape_error", frozenset())] == 0, text
    return {k: v for k, v in samples.items() if k[0].startswith("ncclbench_")}


def one(samples: dict, name: str, **labels) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "ncclbench", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


# ---- the commands, end to end --------------------------------------------------------------------
@needs_promtool
@needs_exporter
def test_a_sweep_s_metrics_read_back_through_node_exporter_equal_its_json(tmp_path):
    folder = tmp_path / "textfile"
    folder.mkdir()
    prom = folder / "allreduce.prom"
    proc = run_cli(tmp_path, "allreduce", "-g", "2", "--backend", "gloo", "-b", "8", "-e", "64K", "-f", "4",
                   "-J", "x.json", "--metrics", str(prom), "--no-save")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in folder.iterdir()] == ["allreduce.prom"]  # the temporary file was renamed
    promtool_check(prom)
    doc = json.loads((tmp_path / "x.json").read_text())
    with node_exporter(folder) as url:
        samples = scrape(url)
    assert len(doc["results"]) == 7
    for row in doc["results"]:
        for placement in ("out_of_place", "in_place"):
            cell = {"collective": "all_reduce", "size_bytes": str(row["size"]), "dtype": row["type"],
                    "op": row["redop"], "placement": placement, "backend": "gloo", "ranks": "2"}
            assert one(samples, "ncclbench_busbw_bytes_per_second", **cell) == row[placement]["bus_bw"] * 1e9
            assert one(samples, "ncclbench_algbw_bytes_per_second", **cell) == row[placement]["alg_bw"] * 1e9
            assert one(samples, "ncclbench_time_seconds", **cell) == row[placement]["time"] * 1e-6
            assert one(samples, "ncclbench_wrong_elements", **cell) == row[placement]["nwrong"]
    nb = doc["ncclbench"]
    assert one(samples, "ncclbench_average_busbw_bytes_per_second") == doc["average_bus_bandwidth"]["bandwidth"] * 1e9
    assert one(samples, "ncclbench_peak_busbw_bytes_per_second") == nb["peak_bus_bandwidth"] * 1e9
    assert one(samples, "ncclbench_run_ok", status="ok") == 1
    assert one(samples, "ncclbench_run_info", command="all_reduce", torch_version=nb["torch_version"],
               ncclbench_version=nb["ncclbench_version"], nccl_version=nb["nccl"]) == 1


@needs_promtool
@needs_exporter
def test_a_preflight_s_metrics_read_back_equal_its_report(tmp_path):
    folder = tmp_path / "textfile"
    folder.mkdir()
    prom, drain_file = folder / "preflight.prom", tmp_path / "drain.sh"
    proc = run_cli(tmp_path, "preflight", "-g", "2", "--backend", "gloo", "--budget", "2", "--json", "p.json",
                   "--metrics", str(prom), "--drain-file", str(drain_file), "--drain-format", "kubectl")
    report = json.loads((tmp_path / "p.json").read_text())
    assert proc.returncode == report["exit_code"], proc.stderr
    promtool_check(prom)
    with node_exporter(folder) as url:
        samples = scrape(url)
    verdicts = {"ok": 0, "suspect": 1, "drain": 2}
    for h in report["hosts"]:
        assert one(samples, "ncclbench_host_verdict", command="preflight", host=h["host"]) == verdicts[h["verdict"]]
    for g in report["groups"]:
        for collective, value in g["best_busbw"].items():
            assert one(samples, "ncclbench_group_best_busbw_bytes_per_second", group=g["name"],
                       collective=collective) == value * 1e9
    assert one(samples, "ncclbench_report_passed", command="preflight") == report["passed"]
    assert one(samples, "ncclbench_hosts_to_drain", command="preflight") == len(report["drain"])
    assert drain_file.read_text().count("kubectl cordon") == len(report["drain"])


@needs_promtool
@needs_exporter
def test_a_fleet_run_s_metrics_read_back_equal_its_report(tmp_path):
    """5 gloo ranks as nodes of 2: two whole nodes tested as a pair, the third (1 rank) drained."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    prom = folder / "fleet.prom"
    proc = run_cli(tmp_path, "fleet", "-g", "5", "--sim-node-size", "2", "--gpus-per-node", "2", "--backend", "gloo",
                   "--budget", "2", "--json", "f.json", "--metrics", str(prom))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "f.json").read_text())
    promtool_check(prom)
    with node_exporter(folder) as url:
        samples = scrape(url)
    values = {"ok": 0, "suspect": 1, "drain": 2}
    assert [h["verdict"] for h in report["hosts"]][-1] == "drain"
    for h in report["hosts"]:
        assert one(samples, "ncclbench_host_verdict", command="fleet", host=h["host"]) == values[h["verdict"]]
    latest = {}
    for t in report["pairs"]:
        if t["busbw_gbps"] is not None:
            latest[(*t["hosts"], "" if t["rail"] is None else str(t["rail"]))] = t["busbw_gbps"]
    assert latest
    for (a, b, rail), value in latest.items():
        assert one(samples, "ncclbench_pair_busbw_bytes_per_second", command="fleet", host_a=a, host_b=b,
                   rail=rail) == value * 1e9
    assert one(samples, "ncclbench_hosts_to_drain", command="fleet") == 1
    assert one(samples, "ncclbench_report_exit_code", command="fleet") == 1


# ---- the report shape, from made-up reports -------------------------------------------------------
HOSTILE_HOST = 'node"3\\x\n$(touch PWNED)'
SHAPE = {
    "command": "fleet", "passed": False, "exit_code": 1,
    "hosts": [{"host": "node1", "ranks": [0, 1], "verdict": "ok", "evidence": [], "causes": []},
              {"host": "node2", "ranks": [2, 3], "verdict": "drain",
               "evidence": ["slow alone: 3.1 GB/s, 45% below the fleet"], "causes": ["GPU 3: PCIe Gen4 x8"]},
              {"host": HOSTILE_HOST, "ranks": [4, 5], "verdict": "suspect", "evidence": ["slow once"], "causes": []}],
    "links": [{"hosts": ["node1", HOSTILE_HOST], "ranks": [1, 4], "evidence": "82% below", "below_pct": 82.0,
               "path": "NET/Socket"}],
    "drain": ["node2"],
    "notes": [],
    "pairs": [{"ranks": [0, 2], "hosts": ["node1", "node2"], "rail": 0, "busbw_gbps": 3.25,
               "reference_gbps": 12.5, "below_pct": 74.0, "slow": True},
              {"ranks": [1, 4], "hosts": ["node1", HOSTILE_HOST], "rail": 1, "busbw_gbps": 2.0,
               "reference_gbps": 12.5, "below_pct": 84.0, "slow": True},
              {"ranks": [1, 4], "hosts": ["node1", HOSTILE_HOST], "rail": 1, "busbw_gbps": 2.5,
               "reference_gbps": 12.5, "below_pct": 80.0, "slow": True},
              {"ranks": [0, 5], "hosts": ["node1", HOSTILE_HOST], "rail": None, "busbw_gbps": None,
               "reference_gbps": None, "below_pct": 0.0, "slow": False}],
}


@needs_promtool
@needs_exporter
def test_the_report_shape_reads_back_with_labels_escaped(tmp_path):
    """Verdicts 0/1/2 per host, each slow link, the latest reading of each pair; a host name
    with a quote, a backslash and a newline survives the label escaping."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    prom = folder / "report.prom"
    metrics.write_textfile(str(prom), metrics.report_text("fleet", SHAPE, {"backend": "nccl",
                                                                            "nccl_version": "NCCL 2.28.9"}))
    promtool_check(prom)
    with node_exporter(folder) as url:
        samples = scrape(url)
    assert one(samples, "ncclbench_host_verdict", host="node1") == 0
    assert one(samples, "ncclbench_host_verdict", host="node2") == 2
    assert one(samples, "ncclbench_host_verdict", host=HOSTILE_HOST) == 1
    link = {"host_a": "node1", "host_b": HOSTILE_HOST, "rank_a": "1", "rank_b": "4", "path": "NET/Socket"}
    assert one(samples, "ncclbench_slow_link", **link) == 1
    assert one(samples, "ncclbench_slow_link_below_reference_ratio", **link) == 82.0 / 100
    assert one(samples, "ncclbench_pair_busbw_bytes_per_second", rank_a="0", rank_b="2", rail="0") == 3.25e9
    assert one(samples, "ncclbench_pair_busbw_bytes_per_second", rank_a="1", rank_b="4", rail="1") == 2.5e9
    assert not [k for k in samples if k[0] == "ncclbench_pair_busbw_bytes_per_second" and ("rank_b", "5") in k[1]]
    assert one(samples, "ncclbench_report_passed") == 0
    assert one(samples, "ncclbench_hosts_to_drain") == 1
    assert one(samples, "ncclbench_run_info", nccl_path="NET/Socket", nccl_version="NCCL 2.28.9") == 1


@needs_promtool
def test_a_planted_bad_file_is_caught_by_the_checks(tmp_path):
    """The checks are live: an unescaped quote in a label, and a sample without its TYPE,
    fail promtool."""
    bad = tmp_path / "bad.prom"
    bad.write_text('# HELP ncclbench_x x\n# TYPE ncclbench_x gauge\nncclbench_x{host="a"b"} 1\n')
    with pytest.raises(AssertionError):
        promtool_check(bad)


@needs_exporter
def test_node_exporter_reports_a_malformed_file(tmp_path):
    """scrape() fails on node_exporter's own error flag, so a file it cannot read is caught."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    (folder / "bad.prom").write_text("ncclbench_x{host=\"a\"} not-a-number\n")
    with node_exporter(folder) as url, pytest.raises(AssertionError):
        scrape(url)


@needs_promtool
def test_tune_s_verdicts_become_gauges(tmp_path):
    doc = {"nccl": "NCCL 2.28.9", "collectives": {"all_reduce": {"verdicts": [
        {"size": 1024, "default_busbw": 1.5, "best": "ring/ll", "best_busbw": 2.0, "win": True},
        {"size": 2048, "default_busbw": None, "best": None, "best_busbw": None, "win": False}]}}}
    prom = tmp_path / "tune.prom"
    metrics.write_textfile(str(prom), metrics.tune_text(doc))
    promtool_check(prom)
    got = metrics.parse(prom.read_text()).families
    best = got["ncclbench_tune_best_busbw_bytes_per_second"]["samples"]
    assert [value for _, value in best.values()] == [2.0e9]
    assert [value for _, value in got["ncclbench_tune_win"]["samples"].values()] == [1.0, 0.0]


# ---- the file ------------------------------------------------------------------------------------
def test_a_later_launch_merges_into_the_file_and_escapes_round_trip(tmp_path):
    """A suite's second launch keeps the first's series and replaces its own."""
    prom = tmp_path / "suite.prom"
    first = {"ncclbench": {"collective": "all_reduce", "backend": "gloo", "ranks": 2, "status": "ok"},
             "results": [{"size": 8, "type": "float", "redop": "sum", "root": "    -1",
                          "out_of_place": {"time": 10.0, "alg_bw": 0.5, "bus_bw": 0.5, "nwrong": 0.0}}]}
    second = json.loads(json.dumps(first))
    second["ncclbench"]["collective"] = 'odd"name\\\n'
    metrics.write_textfile(str(prom), metrics.sweeps_text("suite", [first], now=1.0))
    metrics.write_textfile(str(prom), metrics.sweeps_text("suite", [second], now=2.0), merge=True)
    busbw = metrics.parse(prom.read_text()).families["ncclbench_busbw_bytes_per_second"]["samples"]
    assert sorted(dict(items)["collective"] for items, _ in busbw.values()) == ["all_reduce", 'odd"name\\\n']
    stamp = metrics.parse(prom.read_text()).families["ncclbench_last_run_timestamp_seconds"]["samples"]
    assert [value for _, value in stamp.values()] == [2.0]
    assert [p.name for p in tmp_path.iterdir()] == ["suite.prom"]


@pytest.mark.parametrize("path", ["/nonexistent-folder/m.prom", ""])
def test_an_unwritable_metrics_file_is_refused_in_one_line(tmp_path, path):
    proc = run_cli(tmp_path, "allreduce", "-g", "2", "--backend", "gloo", "--metrics", path, "--no-save")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ncclbench: error:") and "metrics file" in lines[0], proc.stderr


API_SCRIPT = """
import sys
import torch.distributed as dist
import ncclbench

dist.init_process_group("gloo")
rows = ncclbench.measure("all_reduce", "1K:16K:x4", iters=2)
try:
    ncclbench.measure("all_reduce", "1K", metrics_path="m.prom")
except ncclbench.PlanError as exc:
    refused = str(exc)
if dist.get_rank() == 0:
    rows.to_json(sys.argv[1] + "/rows.json")
    rows.to_metrics(sys.argv[1] + "/rows.prom")
    open(sys.argv[1] + "/refused.txt", "w").write(refused)
dist.destroy_process_group()
"""


@needs_promtool
def test_the_api_s_rows_write_the_same_metrics(tmp_path):
    """ncclbench.measure() refuses metrics_path (it returns rows) and Rows.to_metrics writes
    what --metrics would: checked by promtool, values equal to Rows.to_json."""
    script = tmp_path / "ranks.py"
    script.write_text(API_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Rows.to_metrics" in (tmp_path / "refused.txt").read_text()
    promtool_check(tmp_path / "rows.prom")
    doc = json.loads((tmp_path / "rows.json").read_text())
    busbw = metrics.parse((tmp_path / "rows.prom").read_text()).families["ncclbench_busbw_bytes_per_second"]
    got = {(dict(items)["size_bytes"], dict(items)["placement"]): value for items, value in busbw["samples"].values()}
    want = {(str(r["size"]), p): r[p]["bus_bw"] * 1e9 for r in doc["results"] for p in ("out_of_place", "in_place")}
    assert got == want and len(want) == 6


@needs_promtool
def test_a_suite_s_launches_share_one_file(tmp_path):
    """Two env blocks are two launches: the second adds its run to the file of the first."""
    suite = tmp_path / "s.yaml"
    suite.write_text("defaults: {minbytes: 8, maxbytes: 1K, stepfactor: 16, iters: 2, warmup_iters: 1}\n"
                     "runs:\n  - allreduce\n  - collective: broadcast\n    env: {NCCL_DEBUG: WARN}\n")
    prom = tmp_path / "suite.prom"
    proc = run_cli(tmp_path, "suite", str(suite), "-g", "2", "--backend", "gloo", "--no-save", "--csv", "rows.csv",
                   "--metrics", str(prom))
    assert proc.returncode == 0, proc.stderr
    promtool_check(prom)
    import csv

    with open(tmp_path / "rows.csv") as f:
        rows = list(csv.DictReader(f))
    busbw = metrics.parse(prom.read_text()).families["ncclbench_busbw_bytes_per_second"]["samples"]
    got = {(dict(items)["collective"], dict(items)["size_bytes"], dict(items)["placement"]): value
           for items, value in busbw.values()}
    assert {c for c, _, _ in got} == {"all_reduce", "broadcast"}
    assert len(got) == len(rows) == 8
    for r in rows:  # the CSV rounds to 4 decimals of GB/s
        assert got[(r["collective"], r["size_bytes"], r["placement"])] / 1e9 == pytest.approx(float(r["busbw_gbps"]),
                                                                                            abs=1e-4)


@needs_promtool
def test_tune_s_metrics_equal_its_tune_json(tmp_path):
    prom = tmp_path / "tune.prom"
    proc = run_cli(tmp_path, "tune", "allreduce", "-g", "2", "--rehearse", "--backend", "gloo", "-b", "1K", "-e", "2K",
                   "--repeat", "2", "-n", "2", "-w", "1", "--no-plot", "-O", "out", "--metrics", str(prom))
    assert proc.returncode == 0, proc.stderr
    promtool_check(prom)
    doc = json.loads((tmp_path / "out" / "tune.json").read_text())
    got = metrics.parse(prom.read_text()).families["ncclbench_tune_default_busbw_bytes_per_second"]["samples"]
    want = {str(v["size"]): v["default_busbw"] * 1e9 for v in doc["collectives"]["all_reduce"]["verdicts"]}
    assert {dict(items)["size_bytes"]: value for items, value in got.values()} == want and len(want) == 2


def test_a_sweep_whose_metrics_file_cannot_be_written_keeps_its_rows_and_ends_as_an_output_error(tmp_path, capsys):
    """The folder is gone by the end of the sweep: one warning, the JSON still written with
    every row, the status output_error (exit 6), as for the sweep's other files."""
    import io

    from ncclbench.engine.outcome import exit_code_for
    from ncclbench.results.output import OutputSpec, Reporter
    from ncclbench.results.records import DeviceRecord, PlacementResult, ResultRow, RunInfo, RunSummary

    info = RunInfo(collective="all_reduce", args=["allreduce"], backend="gloo", mode="eager", timing="host clock",
                   nranks=1, devices=[DeviceRecord(0, 0, 1, "h", -1, "0", "cpu")], ncclbench_version="0",
                   torch_version="0", nccl_code=0, nccl_text="gloo", env=[], start_time="now",
                   config={"nthreads": 1, "ngpus": 1, "minimum_bytes": 8, "maximum_bytes": 16, "step_factor": 2,
                           "warmup_iters": 1, "iterations": 5, "aggregated_iterations": 1, "validation": 1,
                           "graph": 0})
    spec = OutputSpec(json_path=str(tmp_path / "r.json"), metrics_path=str(tmp_path / "gone" / "m.prom"))
    rep = Reporter(info, spec, stream=io.StringIO())
    cell = PlacementResult(10.0, 1.0, 1.0, 0)
    rows = [ResultRow("all_reduce", size, size // 4, "float", "sum", -1, cell, cell) for size in (8, 16)]
    for row in rows:
        rep.add_row(row)
    summary = RunSummary(rows, complete=True)
    rep.finish(summary)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "metrics file" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("ncclbench: warning: cannot write metrics file"), warnings
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["size"] for r in doc["results"]] == [8, 16] and doc["ncclbench"]["status"] == "output_error"
    assert int(exit_code_for(summary)) == 6
