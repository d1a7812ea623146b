"""The maintainers' scripts in benchmarks/: speed_targets.py (the speed targets' verdicts),
bench_reference.py (ratio tables) and report.py (docs/BENCHMARKS.md's tables), all read from
a gpu_validate.sh log folder.

The fake log folders are built from the 4-GPU nccl-tests reference itself (so every ratio is
exactly 1), then one cell is made slower or wrong to show that each target can be missed."""

import json
import os
import statistics
import subprocess
import sys

import pytest

from conftest import REFERENCE, ROOT, load_script

REF4 = REFERENCE / "h200-4gpu-nvswitch"
SCRIPT = ROOT / "benchmarks" / "speed_targets.py"
REPORT = ROOT / "benchmarks" / "report.py"
MODES = ("nccl", "cupy", "nccl_graph", "cupy_graph")


def _slow_down(frame, rows, factor: float) -> None:
    """The planted change a real slower run shows: bandwidths times `factor`, time divided by it."""
    frame.loc[rows, ["busbw_gbps", "algbw_gbps"]] *= factor
    frame.loc[rows, "time_us"] /= factor


def _reference_sweeps():
    import pandas as pd
    from ncclbench.results.readers import read_results

    return pd.concat([read_results(p) for p in sorted(REF4.glob("*_np4.txt"))], ignore_index=True)


def _write_full(logdir, frame):
    for mode in MODES:
        frame.to_csv(logdir / f"full_{mode}_np4.csv", index=False)


def _write_small(logdir, eager_scale=1.0, graph_scale=1.0):
    """Latency logs as nccl-tests text: the reference files with every time scaled."""
    for backend in ("nccl", "cupy"):
        for mode, scale in (("eager", eager_scale), ("graph", graph_scale)):
            ref = "all_reduce_np4_small_n200.txt" if mode == "eager" else "all_reduce_np4_small_graph.txt"
            frame = _read(REF4 / ref)
            frame["time_us"] = frame["time_us"] * scale
            frame.to_csv(logdir / f"small_{backend}_{mode}_np4.csv", index=False)


def _read(path):
    from ncclbench.results.readers import read_results

    return read_results(path)


def _run(logdir, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), str(logdir), "--reference-dir", str(REF4), "--np", "4", *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture
def matching_logs(tmp_path):
    _write_full(tmp_path, _reference_sweeps())
    _write_small(tmp_path)
    return tmp_path


def test_results_equal_to_the_reference_meet_every_target(matching_logs):
    proc = _run(matching_logs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 of 7 targets met" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("| busbw")]
    assert len(lines) == 4 and all("| met | 1.000 | 30 |" in ln for ln in lines)  # 10 collectives x 3 sizes


def test_one_slow_large_cell_misses_the_busbw_target_and_names_it(matching_logs):
    frame = _reference_sweeps()
    slow = (frame.collective == "gather") & (frame.size_bytes == 536870912) & (frame.placement == "out_of_place")
    _slow_down(frame, slow, 0.97)
    frame.to_csv(matching_logs / "full_cupy_graph_np4.csv", index=False)
    proc = _run(matching_logs)
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if "CuPy -G" in ln and "busbw" in ln)
    assert "| MISSED | 0.970 |" in line and "gather 536870912 B" in line
    assert "6 of 7 targets met" in proc.stdout


def test_small_sizes_and_in_place_rows_do_not_count_for_busbw(matching_logs):
    frame = _reference_sweeps()
    _slow_down(frame, (frame.size_bytes < 64 << 20) | (frame.placement == "in_place"), 0.5)
    _write_full(matching_logs, frame)
    assert _run(matching_logs).returncode == 0


def test_wrong_results_miss_the_target_whatever_the_speed(matching_logs):
    frame = _reference_sweeps()
    frame.loc[(frame.collective == "all_reduce") & (frame.size_bytes == 134217728), "nwrong"] = 3
    frame.to_csv(matching_logs / "full_nccl_np4.csv", index=False)
    proc = _run(matching_logs)
    line = next(ln for ln in proc.stdout.splitlines() if "torch NCCL eager: >=" in ln)
    assert "| MISSED |" in line and "wrong results" in line
    assert proc.returncode == 1


def test_latency_ratio_just_over_1_15_misses_and_torch_eager_is_only_reported(tmp_path):
    _write_full(tmp_path, _reference_sweeps())
    _write_small(tmp_path, eager_scale=1.16, graph_scale=1.14)
    proc = _run(tmp_path)
    lines = {ln.split("|")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.startswith("| all_reduce")}
    assert "| MISSED | 1.160 |" in lines["all_reduce 8 B - 4 KiB time, CuPy eager: <= 1.15 x"]
    assert "| met | 1.140 |" in lines["all_reduce 8 B - 4 KiB time, CuPy -G: <= 1.15 x"]
    assert "| report | 1.160 |" in lines["all_reduce 8 B - 4 KiB time, torch NCCL eager: report"]
    assert "6 of 7 targets met" in proc.stdout and proc.returncode == 1


def test_missing_logs_or_collectives_are_not_measured_never_met(matching_logs):
    (matching_logs / "full_nccl_graph_np4.csv").unlink()
    (matching_logs / "small_cupy_eager_np4.csv").unlink()
    frame = _reference_sweeps()
    frame[frame.collective != "hypercube"].to_csv(matching_logs / "full_cupy_np4.csv", index=False)
    proc = _run(matching_logs)
    out = proc.stdout
    assert proc.returncode == 1 and "4 of 7 targets met" in out
    assert "| NOT MEASURED | - | 0 | no full_nccl_graph_np4.csv |" in out
    assert "not run: hypercube" in next(ln for ln in out.splitlines() if "CuPy eager: >=" in ln)
    assert "no small_cupy_eager_np4.json" in out


def test_host_cost_comes_from_a_real_ncclbench_json(tmp_path):
    """A real 2-rank gloo run's -J file: its times are far above the GPU reference (missed),
    and the median host time per call of its 8 B - 4 KiB rows is printed."""
    json_path = tmp_path / "small_cupy_eager_np4.json"
    run = subprocess.run([sys.executable, "-m", "ncclbench", "allreduce", "-g", "2", "-b", "8", "-e", "4K", "-f", "8",
                          "-n", "3", "-w", "1", "--no-save", "-J", str(json_path)],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    hosts = [r["host_us"]["out_of_place"] for r in json.loads(json_path.read_text())["results"]]
    mod = load_script("speed_targets")
    assert mod.median_host_us(json_path) == pytest.approx(statistics.median(hosts))
    proc = _run(tmp_path)
    line = next(ln for ln in proc.stdout.splitlines() if "CuPy eager: <=" in ln)
    assert "| MISSED |" in line and f"host time per call (median) {statistics.median(hosts):.1f} us" in line


def test_bad_folders_and_unreadable_files_are_one_error_line(tmp_path):
    proc = _run(tmp_path / "absent")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("speed_targets.py: error: log folder")
    (tmp_path / "full_nccl_np4.csv").write_text("not a results file\n")
    proc = _run(tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


# ---------------------------------------------------------------------------
# bench_reference.py
# ---------------------------------------------------------------------------

def test_ratio_table_against_the_reference(tmp_path, capsys):
    bench = load_script("bench_reference")
    ours = _read(REF4 / "all_gather_np4.txt")
    slow = ours.size_bytes == 1 << 31
    _slow_down(ours, slow & (ours.placement == "out_of_place"), 0.9)
    path = tmp_path / "ours.csv"
    ours.to_csv(path, index=False)
    assert bench.main([str(path), "--reference-dir", str(REF4), "--np", "4"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("| all_gather |")]
    assert len(lines) == int(((ours.size_bytes > 0) & (ours.placement == "out_of_place")).sum())
    assert all(ln.endswith("| 1.000 |") for ln in lines if "| 2147483648 |" not in ln)
    assert [ln for ln in lines if "| 2147483648 |" in ln][0].endswith("| 0.900 |")
    assert "- all_gather: lowest ratio over" in out and "- overall lowest ratio: 0.900" in out


# ---------------------------------------------------------------------------
# report.py: a small log folder as gpu_validate.sh's stages write it
# ---------------------------------------------------------------------------

ENV_TXT = """commit 1a2b3c4
GPU 0: NVIDIA H200 (UUID: GPU-0)
GPU 1: NVIDIA H200 (UUID: GPU-1)
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
torch 2.11.0+cu130 NCCL 2.28.9 CuPy 14.2.0
"""


def _p2p_json(path):
    """p2p.json through ncclbench's own writer (P2PResult), two GPUs."""
    import dataclasses

    from ncclbench.topology.p2p import P2PConfig, P2PDevice, P2PResult

    result = P2PResult(config=dataclasses.asdict(P2PConfig()),
                       devices=[P2PDevice(0, "NVIDIA H200", "00000000:06:00.0"), P2PDevice(1, "NVIDIA H200", "00000000:07:00.0")],
                       peer_access=[[None, True], [True, None]], unidirectional_gbps=[[2100.2, 389.2], [389.0, 2096.0]],
                       bidirectional_gbps=[[None, 765.4], [765.4, None]], latency_us=[[1.6, 3.8], [4.1, 1.7]],
                       verified=[[True, True], [True, True]])
    summary = "2 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU per direction"
    path.write_text(json.dumps(result.to_dict() | {"topology_summary": summary, "nvlink_peak_gbps": 478.1}))


@pytest.fixture
def validation_logs(matching_logs):
    """The reference-equal sweeps and latency logs, plus every other stage's files."""
    (matching_logs / "env.txt").write_text(ENV_TXT)
    _p2p_json(matching_logs / "p2p.json")
    small = (REF4 / "all_reduce_np4_small_n200.txt").read_text()
    for name in ("agg_cupy_m1_eager", "agg_cupy_m4_eager", "agg_nccl_m4_graph"):
        (matching_logs / f"{name}.txt").write_text(small)
    (matching_logs / "reliab.txt").write_text(
        "kill:rank=1,size=1048576 exit 3 wall 12.2 s\nno ncclbench process left\n"
        "stall:rank=1,size=1048576,seconds=300 exit 4 wall 23.2 s\nno ncclbench process left\n")
    (matching_logs / "rel_kill.err").write_text("noise from torch\nncclbench: error: rank 1 (pid 7) was killed by SIGKILL\n")
    (matching_logs / "rel_kill.json").write_text('{"status": "failed", "results": [{}, {}, {}]}')
    (matching_logs / "pytest_gpu.txt").write_text("....\n13 passed, 12 skipped in 178.21s (0:02:58)\n")
    pairs = subprocess.run([sys.executable, "-m", "ncclbench", "pairs", "-g", "2", "--backend", "gloo", "-b", "64K",
                            "-n", "2", "--json", str(matching_logs / "pairs.json")],
                           capture_output=True, text=True, timeout=180, cwd=matching_logs)
    assert pairs.returncode == 0, pairs.stderr[-2000:]
    return matching_logs


def _report(logdir, *extra):
    return subprocess.run([sys.executable, str(REPORT), str(logdir), "--reference-dir", str(REF4), "--np", "4", *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def _section(text, title):
    """The lines of one `## title...` section."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.startswith(f"## {title}")
        elif inside:
            out.append(line)
    return out


def test_report_prints_every_section_from_a_log_folder(validation_logs):
    proc = _report(validation_logs)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert ("2 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU per direction; "
            "driver 580.159.04, CUDA 13.0; torch 2.11.0+cu130, NCCL 2.28.9, CuPy 14.2.0.") in out
    assert "Code: commit 1a2b3c4." in out
    busbw = [ln for ln in _section(out, "busbw") if ln.startswith("| ") and ln.split(" | ")[1][-3:] in ("MiB", "GiB")]
    assert len(busbw) == 30  # 10 collectives x 128 MiB, 512 MiB, 2 GiB
    assert all(ln.count("(1.000)") == 4 for ln in busbw)
    assert "| all_reduce | 2 GiB | 359.5 | 359.5 (1.000) |" in out
    latency = [ln for ln in _section(out, "Small-message") if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split(" | ")[0] for ln in latency] == ["| 8", "| 64", "| 512", "| 4096", "| 32768", "| 262144"]
    assert latency[0].startswith("| 8 | 8.72 | 7.61 | 8.72 (1.000) |")
    assert "| target | verdict |" in out and "| met |" in out
    agg = _section(out, "-m grouping")
    assert agg[1].startswith("| backend, mode | 8 B | 64 B |")
    assert [ln.split(" | ")[0] for ln in agg[3:6]] == ["| CuPy eager, -m 1", "| CuPy eager, -m 4", "| torch -G 20, -m 4"]
    topo = "\n".join(_section(out, "Topology"))
    assert "| 0 | 2100.2 (local) | 389.2 |" in topo and "Bidirectional per pair: 765.4-765.4 GB/s" in topo
    assert "peer-copy latency 3.8-4.1 us" in topo
    pairs = json.loads((validation_logs / "pairs.json").read_text())
    assert (f"`ncclbench pairs`, 64 KiB each way, busbw per direction (GB/s): 0-1 {pairs['pairs'][0]['busbw_gbps']:.1f}; "
            f"median {pairs['median_busbw_gbps']:.1f}.") in topo
    reliab = _section(out, "Reliability")
    assert ("| `kill:rank=1,size=1048576` | 3 | 12.2 | `ncclbench: error: rank 1 (pid 7) was killed by SIGKILL` | "
            "3 rows, JSON status `failed` |") in reliab
    assert any(ln.startswith("| `stall:") and "| 4 | 23.2 | `-` |" in ln for ln in reliab)
    assert "No ncclbench process was left after the runs." in reliab
    assert "`python -m pytest -q -m gpu tests`: 13 passed, 12 skipped in 178.21s (0:02:58)." in out
    assert "start-up" in proc.stderr  # no startup.md in this folder: named, not invented


def test_report_shows_a_slow_cell_and_the_lowest_ratio(validation_logs):
    frame = _reference_sweeps()
    slow = (frame.collective == "gather") & (frame.size_bytes == 536870912) & (frame.placement == "out_of_place")
    _slow_down(frame, slow, 0.97)
    frame.loc[(frame.collective == "reduce") & (frame.size_bytes == 8), "nwrong"] = 2
    frame.to_csv(validation_logs / "full_cupy_np4.csv", index=False)
    _write_small(validation_logs, eager_scale=1.5)
    out = _report(validation_logs).stdout
    row = next(ln for ln in out.splitlines() if ln.startswith("| gather | 512 MiB |"))
    assert row.split(" | ")[4] == "364.5 (0.970)"  # columns: torch eager, CuPy eager, ...
    assert "- CuPy eager: lowest ratio 0.970 (gather 512 MiB); rows with #wrong > 0: 2" in out
    assert "- torch NCCL eager: lowest ratio 1.000" in out
    latency = next(ln for ln in _section(out, "Small-message") if ln.startswith("| 8 |"))
    assert "13.08 (1.500)" in latency and "7.61 (1.000)" in latency


def test_report_on_an_empty_folder_prints_nothing_and_names_the_sections(tmp_path):
    proc = _report(tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == ""
    assert proc.stderr.strip().startswith("report.py: nothing in") and "busbw" in proc.stderr and "GPU tests" in proc.stderr


def test_report_bad_input_is_one_error_line(tmp_path):
    proc = _report(tmp_path / "absent")
    assert proc.returncode == 2 and proc.stderr.strip() == f"report.py: error: log folder {tmp_path / 'absent'} is not a folder"
    (tmp_path / "full_nccl_np4.csv").write_text("not a results file\n")
    proc = _report(tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("report.py: error:")


# ---------------------------------------------------------------------------
# The probes kept in benchmarks/: they must still run, and what they find broken must be
# what ncclbench refuses (the refusals are facts about one torch/NCCL; the probes re-check them)
# ---------------------------------------------------------------------------

def _torchrun_one_rank(script, *args):
    env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                           str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_dtype_probe_finds_broken_only_what_ncclbench_refuses(backend):
    from ncclbench.dtypes import DTYPES, OPS
    from ncclbench.engine.collectives import ALL_REDUCE

    if backend == "cupy":
        pytest.importorskip("cupy")
    proc = _torchrun_one_rank("probe_dtypes.py", backend)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln.split(None, 3) for ln in proc.stdout.splitlines() if ln.startswith(backend)]
    assert len(lines) == len(DTYPES) * len(OPS), proc.stdout
    name = "nccl" if backend == "torch" else "cupy"
    broken = [(dtype, op, result) for _, dtype, op, result in lines if result != "ok wrong=0"]
    allowed = [b for b in broken if ALL_REDUCE.unsupported(name, b[0], b[1], 1) is None]
    assert not allowed, f"broken on one rank but not refused by ncclbench: {allowed}"


@pytest.mark.gpu
def test_premul_probe_runs():
    proc = _torchrun_one_rank("torch_premul_probe.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len([ln for ln in proc.stdout.splitlines() if "factor" in ln]) == 11, proc.stdout


# ---------------------------------------------------------------------------
# same_output.py: a layout change is a difference, a timing change is not
# ---------------------------------------------------------------------------

def test_same_output_ignores_numbers_of_timed_runs_only():
    same = load_script("same_output")
    row = "        1024           256     float     sum      -1    {}    0.01    0.02       0\n"
    assert same.collapse(row.format("12.31"), timed=True) == same.collapse(row.format("9.04"), timed=True)
    assert same.collapse(row.format("12.31"), timed=False) != same.collapse(row.format("9.04"), timed=False)
    # a word or a column that changes is caught, even in a timed run
    assert same.collapse(row.format("12.31"), True) != same.collapse(row.format("12.31").replace("sum", "max"), True)
    assert same.collapse(row.format("1.0"), True) != same.collapse(row.format("1.0") + "N/A\n", True)
    # result-store names carry the time of day
    line = "ncclbench: results saved to store/20261126-164030_all_reduce_1r_gloo.json"
    assert same.collapse(line, False) == same.collapse(line.replace("164030", "171501"), False)


def _paired_times(ratio_by_set, per_set, seed):
    """Default and other times for `per_set` repeats in each communicator set: a drift every
    few repeats hits both alike, each time gets its own +-30 % jitter, and the other runs
    `ratio` times faster in its set."""
    import random

    rng = random.Random(seed)
    base, other, sets = [], [], []
    for rep in range(per_set * len(ratio_by_set)):
        c = rep % len(ratio_by_set)
        drift = 1 + 0.5 * ((rep // 50) % 2)
        base.append(60 * drift * rng.uniform(0.7, 1.3))
        other.append(60 * drift * rng.uniform(0.7, 1.3) / ratio_by_set[c])
        sets.append(c)
    return base, other, sets


def test_interleave_estimate_finds_a_planted_ratio_through_drift_and_jitter():
    mod = load_script("interleave_noise")
    base, other, sets = _paired_times([1.10], 600, seed=3)
    est = mod.ratio_estimate(base, other, sets, draws=400)
    assert est["low"] <= 1.10 <= est["high"] and est["low"] > 1.0
    assert est["half_width_pct"] < 5
    # the same sets with no difference: the interval holds 1
    base, other, sets = _paired_times([1.0], 600, seed=4)
    est = mod.ratio_estimate(base, other, sets, draws=400)
    assert est["low"] <= 1.0 <= est["high"]


def test_interleave_estimate_widens_when_communicators_disagree():
    """Communicator sets that disagree (0.56 and 0.67, as tree/LL at 256K across sockets)
    must widen the interval beyond what one set's repeats alone would give."""
    mod = load_script("interleave_noise")
    one = mod.ratio_estimate(*_paired_times([0.62], 600, seed=5), draws=400)
    four = mod.ratio_estimate(*_paired_times([0.56, 0.67, 0.58, 0.66], 150, seed=5), draws=400)
    assert four["half_width_pct"] > 2 * one["half_width_pct"]
    assert min(four["set_medians"]) < 0.59 and max(four["set_medians"]) > 0.64


def test_interleave_report_prints_each_configuration_against_the_default():
    mod = load_script("interleave_noise")
    base, other, sets = _paired_times([1.10, 1.12], 100, seed=6)
    doc = {"sizes": [8], "configs": ["default", "tree/LL"], "sets": sets,
           "times_us": {"default@8": base, "tree/LL@8": other}}
    lines = mod.report(doc, draws=200)
    assert len(lines) == 3 and "95% CI" in lines[0]
    row = lines[2].split()
    assert row[:2] == ["8", "tree/LL"] and 1.05 < float(row[5]) < 1.17
