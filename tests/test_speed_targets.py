"""scripts/speed_targets.py: the Speed issue's verdicts from a gpu_validate.sh log folder.

The fake log folders are built from the 4-GPU nccl-tests reference itself (so every ratio is
exactly 1), then one cell is made slower or wrong to show that each target can be missed."""

import subprocess
import sys

import pytest

from conftest import REFERENCE, ROOT, load_script

REF4 = REFERENCE / "h200-4gpu-nvswitch"
SCRIPT = ROOT / "scripts" / "speed_targets.py"
MODES = ("nccl", "cupy", "nccl_graph", "cupy_graph")


def _reference_sweeps():
    import pandas as pd
    from ncclbench.resultsio import read_results

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
    from ncclbench.resultsio import read_results

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
    frame.loc[slow, "busbw_gbps"] *= 0.97
    frame.to_csv(matching_logs / "full_cupy_graph_np4.csv", index=False)
    proc = _run(matching_logs)
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if "CuPy -G" in ln and "busbw" in ln)
    assert "| MISSED | 0.970 |" in line and "gather 536870912 B" in line
    assert "6 of 7 targets met" in proc.stdout


def test_small_sizes_and_in_place_rows_do_not_count_for_busbw(matching_logs):
    frame = _reference_sweeps()
    frame.loc[(frame.size_bytes < 64 << 20) | (frame.placement == "in_place"), "busbw_gbps"] *= 0.5
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
    import json

    json_path = tmp_path / "small_cupy_eager_np4.json"
    run = subprocess.run([sys.executable, "-m", "ncclbench", "allreduce", "-g", "2", "-b", "8", "-e", "4K", "-f", "8",
                          "-n", "3", "-w", "1", "--no-save", "-J", str(json_path)],
                         capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    hosts = sorted(r["host_us"]["out_of_place"] for r in json.loads(json_path.read_text())["results"])
    mod = load_script("speed_targets")
    assert mod._median_host_us(json_path) == pytest.approx(hosts[len(hosts) // 2])
    proc = _run(tmp_path)
    line = next(ln for ln in proc.stdout.splitlines() if "CuPy eager: <=" in ln)
    assert "| MISSED |" in line and f"host time per call (median) {hosts[len(hosts) // 2]:.1f} us" in line


def test_bad_folders_and_unreadable_files_are_one_error_line(tmp_path):
    proc = _run(tmp_path / "absent")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert proc.stderr.startswith("speed_targets.py: error: log folder")
    (tmp_path / "full_nccl_np4.csv").write_text("not a results file\n")
    proc = _run(tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
