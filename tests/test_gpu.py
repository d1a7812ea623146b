"""Real NCCL on real GPUs (run on a GPU host: `pytest -m gpu`)."""

import json
import signal

import pandas as pd
import pytest

from conftest import ROOT, endless_run_with_rows, run_cli, table_rows, wait_gone

pytestmark = pytest.mark.gpu


def _gpus():
    import torch

    return torch.cuda.device_count()


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_every_collective_is_correct(backend, tmp_path):
    """The quick suite (every collective) in bfloat16: every row checked and right."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    suite = tmp_path / "s.yaml"
    suite.write_text((ROOT / "configs" / "quick.yaml").read_text().replace("iters: 5", "iters: 3\n  datatype: bfloat16"))
    csv = tmp_path / "r.csv"
    r = run_cli(["suite", str(suite), "-g", str(n), "--backend", backend, "--no-save", "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-3000:]
    frame = pd.read_csv(csv)
    assert set(frame.collective) == {"all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast",
                                     "reduce", "gather", "scatter", "sendrecv"}
    assert (frame.dtype == "bfloat16").all()
    checked = frame.dropna(subset=["nwrong"])
    assert len(checked) > 9 * 4 and (checked.nwrong == 0).all()


def _out_of_place_na(backend: str, n: int) -> bool:
    """torch's in-place stand-in for an out-of-place all_reduce times nothing on one rank."""
    return backend == "nccl" and n == 1


def _checked(row, backend, n) -> bool:
    """Both placements right, or N/A out of place where that is the honest answer."""
    oop = row[5:9] == ["N/A"] * 4 if _out_of_place_na(backend, n) else row[8] == "0"
    return oop and row[-1] == "0"


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_cuda_graph_replay(backend):
    n = min(_gpus(), 4)
    r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "8", "-e", "64K", "-f", "8",
                 "-G", "10", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "timing: graph" in r.stdout
    rows = table_rows(r.stdout)
    assert len(rows) == 5 and all(_checked(row, backend, n) for row in rows)
    assert ("# Note: -G on one rank: that skipped in-place all_reduce captures nothing" in r.stdout) == (n == 1)


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_one_rank_never_prints_a_no_op_as_out_of_place(backend):
    """One GPU: NCCL skips an in-place all_reduce. On the torch backend (no out-of-place
    call) the out-of-place column is N/A; CuPy's out-of-place call is a copy, whose algbw
    at 256 MiB is bounded by the memory bandwidth (a skipped call printed 117,098 GB/s)."""
    r = run_cli(["allreduce", "-g", "1", "--backend", backend, "-b", "8", "-e", "256M", "-f", "32", "-n", "5",
                 "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert len(rows) == 6 and all(_checked(row, backend, 1) for row in rows)
    assert "# Note: in-place on one rank: NCCL returns from an in-place all_reduce without moving data" in r.stdout
    if backend == "nccl":
        assert "# Note: out-of-place is N/A on one rank" in r.stdout
    else:
        assert float(rows[-1][6]) < 10_000, rows[-1]  # GB/s: a copy, not a skipped call


def test_planted_wrong_element_fails_the_run():
    n = min(_gpus(), 2)
    r = run_cli(["allreduce", "-g", str(n), "-b", "1M", "-e", "1M", "--no-save"],
                env={"NCCLBENCH_FAULT": f"corrupt:rank={n - 1}"})
    assert r.returncode == 7, r.stderr[-2000:]
    assert "FAILED" in r.stdout


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_graph_check_counts_what_the_graph_wrote(backend):
    """-G: the check replays a CUDA graph of the timed call, so a wrong element that the
    graph itself writes after the collective (corrupt_graph) is counted, once per
    placement, and the run exits 7; without -G the fault has no graph to go into and the
    run passes."""
    n = min(_gpus(), 2)
    base = ["allreduce", "-g", str(n), "--backend", backend, "-b", "1M", "-e", "1M", "-n", "5", "--no-save"]
    fault = {"NCCLBENCH_FAULT": f"corrupt_graph:rank={n - 1}"}
    # one rank on torch NCCL: no out-of-place all_reduce exists there, so that cell is N/A
    stand_in = n == 1 and backend == "nccl"
    r = run_cli(base + ["-G", "3"], env=fault)
    assert r.returncode == 7, r.stderr[-2000:]
    (row,) = table_rows(r.stdout)
    assert row[8] == ("N/A" if stand_in else "1") and row[-1] == "1", row
    r = run_cli(base, env=fault)
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = table_rows(r.stdout)
    assert row[8] == ("N/A" if stand_in else "0") and row[-1] == "0", row


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_alltoallv_generated_and_matrix(backend, tmp_path):
    """Uneven per-peer parts move right on GPUs, eagerly and inside a CUDA graph."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    for extra in ([], ["-G", "2"]):
        r = run_cli(["alltoallv", "-g", str(n), "--backend", backend, "-b", "8", "-e", "16M", "-f", "16",
                     "--alltoallv-spread", "0.6", "--no-save"] + extra)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = table_rows(r.stdout)
        assert len(rows) == 6 and all(row[8] == "0" for row in rows)  # 8 B .. 8 MiB
    matrix = tmp_path / "m.txt"
    matrix.write_text("\n".join(" ".join(str(4096 * (i + 2 * j)) for j in range(n)) for i in range(n)))
    r = run_cli(["alltoallv", "-g", str(n), "--backend", backend, "-b", "1M", "-e", "1M",
                 "--alltoallv-matrix", str(matrix), "-d", "half", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = table_rows(r.stdout)
    assert row[1] == "0" and row[8] == "0"


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_split_groups_on_gpus(backend):
    """--split makes per-group communicators (torch new_group / one NCCL comm per group)."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "8", "-e", "1M", "-f", "32",
                 "--split", "MOD 2", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{2 if n >= 2 else 1} groups of {n // 2} ranks" in r.stdout
    # groups of one rank on torch's NCCL: out-of-place is N/A by design (the header says why)
    out_of_place = "N/A" if backend == "nccl" and n // 2 == 1 else "0"
    if out_of_place == "N/A":
        assert "out-of-place is N/A on one rank" in r.stdout
    rows = table_rows(r.stdout)
    assert rows and all(row[8] == out_of_place and row[-1] == "0" for row in rows)


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_per_iteration_columns_with_cuda_graphs(backend):
    """-I with -G: one sample per replay, so the i_* columns are numbers (they were nan), in
    order and near the row's time (i_* take the max over ranks, time the mean: not exact)."""
    n = min(_gpus(), 2)
    r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "8", "-e", "64K", "-f", "8",
                 "-G", "10", "-n", "5", "-I", "1", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert len(rows) == 5
    first = 13 if _out_of_place_na(backend, n) else 5  # the in-place block where out-of-place is N/A
    for row in rows:
        time_us, i_min, i_max = float(row[first]), float(row[first + 4]), float(row[first + 5])
        assert 0 < i_min <= i_max and 0.5 * time_us <= i_max and i_min <= 2 * time_us, row


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
@pytest.mark.parametrize("graph", [0, 3])
def test_agg_iters_grouped_for_every_collective(backend, graph, tmp_path):
    """-m 4: each iteration's ops in one NCCL group (eagerly and captured in a graph) for
    every collective of the quick suite plus alltoallv and hypercube (torch's P2P ones go
    into the open group directly, not through batch_isend_irecv); results right, and no
    header note saying the ops were not grouped."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    suite = tmp_path / "s.yaml"
    suite.write_text((ROOT / "configs" / "quick.yaml").read_text()
                     .replace("iters: 5", f"iters: 3\n  agg_iters: 4\n  cudagraph: {graph}")
                     + "  - alltoallv\n  - hypercube\n")
    csv = tmp_path / "r.csv"
    r = run_cli(["suite", str(suite), "-g", str(n), "--backend", backend, "--no-save", "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-3000:]
    frame = pd.read_csv(csv)
    assert len(set(frame.collective)) == 11
    checked = frame.dropna(subset=["nwrong"])
    assert len(checked) > 11 * 4 and (checked.nwrong == 0).all()
    assert "not in one NCCL group" not in r.stdout


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_every_type_and_op_including_mulsum(backend):
    """-d all -o all as nccl-tests runs it (mulsum is NCCL's premul-sum, each rank with its
    own factor): every pair the backend can run is right, eagerly and captured in a graph;
    the torch NCCL group runs premul-sum for half, float and double only."""
    n = min(_gpus(), 2)
    floats = {"half", "float", "double"}
    for extra in ([], ["-G", "2"]):
        r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "64K", "-e", "64K", "-d", "all",
                     "-o", "all", "-n", "2", "--no-save"] + extra)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = table_rows(r.stdout)
        assert all(_checked(row, backend, n) for row in rows)
        mulsum = {row[2] for row in rows if row[3] == "mulsum"}
        one_rank_gaps = {"f8e4m3", "f8e5m2"} if n == 1 else set()  # NCCL refuses fp8 premul-sum there
        assert mulsum == (floats if backend == "nccl" else {row[2] for row in rows} - one_rank_gaps)
    for coll in ("reduce", "reducescatter"):
        r = run_cli([coll, "-g", str(n), "--backend", backend, "-b", "8", "-e", "1M", "-f", "32", "-o", "mulsum",
                     "-d", "half", "--no-save"])
        if backend == "nccl" and coll == "reducescatter" and n == 1:  # torch drops the factor there: refused
            assert r.returncode == 2 and "ignores the premul-sum factor" in r.stderr, r.stderr[-2000:]
            continue
        assert r.returncode == 0, r.stderr[-2000:]
        stand_in = coll == "reduce" and _out_of_place_na(backend, n)
        assert all(row[3] == "mulsum" and row[8] == ("N/A" if stand_in else "0") for row in table_rows(r.stdout))


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_stopped_launcher_ends_gpu_ranks_with_their_rows(backend, how, tmp_path):
    """A GPU run stopped mid-sweep: SIGTERM to the -g launcher (scancel, `timeout`) is
    forwarded by it; SIGKILL (OOM killer) reaches the ranks as their parent-death
    SIGTERM. Either way the ranks leave NCCL, rank 0 writes the trailer and JSON with the
    rows done, and no rank lives on."""
    n = min(_gpus(), 2)
    base = ["allreduce", "-g", str(n), "--backend", backend, "-b", "1K", "-e", "256M", "-f", "2", "-n", "20",
            "--no-save"]
    proc = endless_run_with_rows(tmp_path, base, "-J", str(tmp_path / "r.json"), rows=6)
    proc.send_signal(getattr(signal, how))
    out, err = proc.communicate(timeout=120)  # the ranks hold the pipes until they exit
    assert proc.returncode == (130 if how == "SIGTERM" else -signal.SIGKILL), err[-2000:]
    assert "# Error: terminated by SIGTERM" in out and "# Collective test concluded: all_reduce_perf" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "interrupted" and len(doc["results"]) >= 6
    checked = pd.read_csv(tmp_path / "r.csv").dropna(subset=["nwrong"])
    placements = 1 if _out_of_place_na(backend, n) else 2  # an N/A cell is not checked
    assert len(checked) >= 6 * placements and (checked.nwrong == 0).all()
    assert not wait_gone(str(tmp_path), 30)


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_cputime_changes_the_time_column_not_the_bandwidth(backend, tmp_path):
    """1 GiB all_gather on one GPU (a 1 GiB copy): -C 1 prints the host's issue time, far
    below the copy's duration, and the same bandwidth as -C 0 within noise (both from the
    timed duration). Before, -C 1 divided the bytes by the issue time (74,727 GB/s on an
    H100)."""
    cells = {}
    for cputime in (0, 1):
        out = tmp_path / f"c{cputime}.json"
        r = run_cli(["allgather", "-g", "1", "--backend", backend, "-b", "1G", "-e", "1G", "-n", "20", "-w", "5",
                     "-C", str(cputime), "--no-save", "-J", str(out)])
        assert r.returncode == 0, r.stderr[-3000:]
        assert any(line.startswith("# NCCL environment:") and "NCCL_NVLS_ENABLE=0" in line.split()
                   for line in r.stdout.splitlines())  # the tests' own setting, beside the host's
        cells[cputime] = json.loads(out.read_text())["results"][0]["out_of_place"]
    assert 0.8 < cells[1]["alg_bw"] / cells[0]["alg_bw"] < 1.25, cells
    assert cells[1]["cpu_time"] < 0.5 * cells[0]["time"], cells


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
@pytest.mark.parametrize("blocking", [1, 2, 3])
def test_each_blocking_mode(backend, blocking):
    n = min(_gpus(), 2)
    r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "8", "-e", "1M", "-f", "32", "-n", "5",
                 "-m", "2", "-I", "1", "-z", str(blocking), "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "# Blocking Enabled:" in r.stdout
    rows = table_rows(r.stdout)
    expected = "N/A" if n == 1 and backend == "nccl" else "0"  # one rank: torch has no out-of-place all_reduce
    assert len(rows) == 4 and all(row[8] == expected for row in rows), rows


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
@pytest.mark.parametrize("fault,code,reason", [
    ("device_fail", 3, "setting up the device: RuntimeError: CUDA error"),
    ("comm_fail", 3, "communicator: RuntimeError: NCCL error"),
    ("alloc_fail", 2, "cannot allocate the buffers"),
])
def test_a_set_up_failure_is_one_line_and_its_code(backend, fault, code, reason, tmp_path):
    """On every rank with one GPU, on rank 1 only with two: one line with the reason, the
    failure's code, no traceback, no result file."""
    n = min(_gpus(), 2)
    r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "4M", "-e", "4M", "-T", "60",
                 "--results-dir", str(tmp_path / "store")], env={"NCCLBENCH_FAULT": f"{fault}:rank={n - 1}"})
    assert r.returncode == code, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench:")]
    assert len(lines) == 1 and reason in lines[0], r.stderr[-3000:]
    assert (f"rank {n - 1} on " in lines[0]) == (n > 1)
    assert "Traceback" not in r.stderr and not list((tmp_path / "store").glob("*.json"))


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_every_row_carries_its_noise_and_a_healthy_pair_passes_compare(backend, tmp_path):
    """CUDA-event samples per iteration in each JSON cell (n = -n), their median near the
    row's time; two back-to-back runs pass compare with its defaults (2 GPUs or more: one
    rank's busbw is 0, and compare refuses a pair with nothing to judge)."""
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    paths = [tmp_path / f"r{i}.json" for i in range(2)]
    for path in paths:
        r = run_cli(["allreduce", "-g", str(n), "--backend", backend, "-b", "1M", "-e", "64M", "-f", "4",
                     "--no-save", "-J", str(path)])
        assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(paths[0].read_text())
    for row in doc["results"]:
        cell = row["in_place_noise"]
        assert cell["n"] == 20 and len(cell["samples_us"]) == 20 and min(cell["samples_us"]) > 0
        assert 0.5 < cell["median_us"] / row["in_place"]["time"] < 2.0
    r = run_cli(["compare", str(paths[0]), str(paths[1])])
    assert r.returncode == 0, r.stdout[-3000:]
