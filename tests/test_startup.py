"""Start-up: what each command imports, the -g launcher's environment for its ranks,
`-g all`, and the start-up phases a run reports. Each command runs in a fresh interpreter
and reports the heavy modules it imported (sys.modules at exit): no timing is asserted."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import REFERENCE, ROOT, table_rows

HEAVY = ("torch", "pandas", "matplotlib", "numpy")
TINY_RUN = ["-b", "8", "-e", "64", "-f", "8", "-n", "2", "--no-save"]
REPORT = """
import atexit, json, os, sys
def report():
    heavy = sorted({name.split('.')[0] for name in sys.modules} & set(%r))
    with open(os.environ['MODULES_OUT'], 'w') as f:
        json.dump(heavy, f)
atexit.register(report)
sys.argv = ['ncclbench'] + json.loads(os.environ['ARGS'])
from ncclbench.entry import main
main()
""" % (HEAVY,)


def heavy_imports(tmp_path, args, env=None, timeout=240):
    """(completed process, heavy modules imported) of `ncclbench <args>` in a fresh interpreter."""
    out = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.json"
    full_env = {k: v for k, v in os.environ.items()
                if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID")}
    full_env.update(NCCL_NVLS_ENABLE="0", MODULES_OUT=str(out), ARGS=json.dumps([str(a) for a in args]), **(env or {}))
    r = subprocess.run([sys.executable, "-c", REPORT], capture_output=True, text=True, timeout=timeout,
                       env=full_env, cwd=tmp_path)
    return r, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.parametrize("args", [
    ["--help"], ["--version"], [], ["allreduce", "--help"], ["compare", "--help"], ["plot", "--help"],
    ["show", "--help"], ["suite", "--help"], ["topo", "--help"], ["baseline", "--help"],
])
def test_help_and_version_import_nothing_heavy(tmp_path, args):
    r, heavy = heavy_imports(tmp_path, args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert heavy == [], heavy


@pytest.mark.parametrize("args,code", [
    (["allreduce", "-b", "8X"], 2),
    (["allreduce", "--backend", "gloo", "-g", "0"], 2),
    (["allreduce", "-g", "lots"], 2),
    (["allreduse"], 2),
    (["allreduce", "--backend", "gloo", "-d", "float7"], 2),
    (["allreduce", "--backend", "nccl", "-g", "64"], 5),
    (["compare", "a.json"], 2),
    (["compare", "a.json", "b.json", "--threshold", "5"], 2),
    (["compare", "missing-a.json", "missing-b.json"], 2),
    (["baseline", "missing-a.json", "missing-b.json", "-o", "base.json"], 2),
    (["allreduce", "--backend", "gloo", "-g", "100000"], 5),  # more ranks than the host's memory holds
    (["show", "missing.json"], 2),
    (["plot", "missing.csv", "-o", "out.jpg"], 2),
    (["suite", "missing.yaml"], 2),
    (["plot", "CONF", "-o", "no-such-dir/out.png"], 2),  # refused before the data is read
    (["tune", "allreduce", "-g", "2", "--verify", "CONF", "--plugin", "no-such-plugin.so"], 2),
    (["tune", "allreduce", "-g", "2", "--verify", "CONF", "--plugin", "CONF"], 2),  # not a shared library
])
def test_usage_errors_import_nothing_heavy(tmp_path, args, code):
    (tmp_path / "tuned.conf").write_text("allreduce,0,65536,tree,simple,-1,1,2\n")
    args = [str(tmp_path / "tuned.conf") if a == "CONF" else a for a in args]
    r, heavy = heavy_imports(tmp_path, args)
    assert r.returncode == code, r.stderr[-2000:]
    assert r.stderr.strip().startswith("ncclbench") and "Traceback" not in r.stderr
    assert heavy == [], heavy


def test_suite_file_validation_imports_nothing_heavy(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text("runs:\n  - collective: allreduce\n    datatype: float7\n")
    r, heavy = heavy_imports(tmp_path, ["suite", str(suite), "--backend", "gloo"])
    assert r.returncode == 2 and "runs[0]" in r.stderr, r.stderr[-2000:]
    assert heavy == []


def test_topo_answers_without_torch(tmp_path):
    r, heavy = heavy_imports(tmp_path, ["topo", "--json"])
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["versions"]["torch"]  # from the installed package, not an import
    assert "torch" not in heavy and "matplotlib" not in heavy


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """One real 2-rank gloo run through the -g launcher, with the modules its launcher imported."""
    tmp = tmp_path_factory.mktemp("run")
    r, heavy = heavy_imports(tmp, ["allreduce", "-g", "2", "--backend", "gloo", *TINY_RUN,
                                   "-J", str(tmp / "r.json"), "--csv", str(tmp / "r.csv")])
    return SimpleNamespace(r=r, heavy=heavy, dir=tmp)


def test_the_launcher_imports_neither_torch_nor_pandas_nor_matplotlib(gloo_run):
    """The ranks import torch; their launcher does not (it counted, validated and spawned)."""
    assert gloo_run.r.returncode == 0, gloo_run.r.stderr[-2000:]
    assert len(table_rows(gloo_run.r.stdout)) == 2
    assert gloo_run.heavy == [], gloo_run.heavy


def test_the_run_reports_where_its_start_up_went(gloo_run):
    """Start-up phases on one clock from the launcher's start, in order, in the JSON and a
    trailer line."""
    doc = json.loads((gloo_run.dir / "r.json").read_text())
    phases = doc["ncclbench"]["startup"]
    assert phases["origin"] == "the ncclbench launcher started"
    order = [phases[k] for k in ("rank_started_s", "imported_s", "backend_ready_s", "first_row_s")]
    assert all(isinstance(v, float) for v in order) and order == sorted(order) and order[0] >= 0, phases
    line = next(ln for ln in gloo_run.r.stdout.splitlines() if ln.startswith("# Start-up"))
    assert line.startswith("# Start-up (rank 0, seconds after the ncclbench launcher started): rank started ")
    assert line.endswith(f"first row {phases['first_row_s']:.2f}")


def test_compare_and_show_import_pandas_only_to_read_results(gloo_run, tmp_path):
    run_json, run_csv = gloo_run.dir / "r.json", gloo_run.dir / "r.csv"
    r, heavy = heavy_imports(tmp_path, ["show", str(run_json)])  # an ncclbench JSON: replayed as is
    assert r.returncode == 0 and "# Collective test concluded: all_reduce_perf" in r.stdout, r.stderr
    assert heavy == []
    r, heavy = heavy_imports(tmp_path, ["show", str(run_csv)])
    assert r.returncode == 0 and "all_reduce" in r.stdout, r.stderr
    assert "pandas" in heavy and "torch" not in heavy and "matplotlib" not in heavy
    reference = sorted(REFERENCE.glob("*/*.txt"))[0]
    r, heavy = heavy_imports(tmp_path, ["compare", str(reference), str(reference)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pandas" in heavy and "torch" not in heavy and "matplotlib" not in heavy


def test_plot_imports_matplotlib_only_to_draw(gloo_run, tmp_path):
    run_csv = gloo_run.dir / "r.csv"
    r, heavy = heavy_imports(tmp_path, ["plot", str(run_csv), "-o", "p.png", "--min-size", "1G"])
    assert r.returncode == 2 and "no rows left to plot" in r.stderr, r.stderr
    assert "matplotlib" not in heavy and "torch" not in heavy
    r, heavy = heavy_imports(tmp_path, ["plot", str(run_csv), "-o", "p.png"])
    assert r.returncode == 0 and (tmp_path / "p.png").stat().st_size > 0, r.stderr
    assert "matplotlib" in heavy and "torch" not in heavy


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_a_gpu_run_launcher_imports_nothing_heavy(backend, tmp_path):
    """First contact on a GPU host: the launcher counts GPUs through NVML and starts the
    rank without importing torch; the run reports its start-up phases."""
    r, heavy = heavy_imports(tmp_path, ["allreduce", "--backend", backend, "-b", "8", "-e", "8", "--no-save",
                                        "-J", str(tmp_path / "r.json")])
    assert r.returncode == 0, r.stderr[-2000:]
    assert heavy == [], heavy
    phases = json.loads((tmp_path / "r.json").read_text())["ncclbench"]["startup"]
    assert phases["first_row_s"] >= phases["backend_ready_s"] >= phases["imported_s"] > 0, phases


# ---- the lean launcher's environment ---------------------------------------------------------

ENV_PROBE = ("import json, os, sys\n"
             "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', 'GROUP_WORLD_SIZE',\n"
             "        'ROLE_RANK', 'ROLE_NAME', 'ROLE_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'OMP_NUM_THREADS')\n"
             "mine = {k: v for k, v in os.environ.items() if k in keys or k.startswith(('TORCHELASTIC_', 'TORCH_NCCL_'))}\n"
             "with open(os.path.join(sys.argv[1], os.environ['RANK'] + '.json'), 'w') as f:\n"
             "    json.dump(mine, f)\n")


def _clean_env():
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("TORCHELASTIC_", "TORCH_NCCL_"))}


def test_ranks_get_torchruns_environment(tmp_path, monkeypatch):
    """Every variable torchrun's agent gives its ranks, with the same values where they can
    agree (the store's host and port, the run id and the error file differ by design)."""
    from ncclbench.launch import spawn

    probe = tmp_path / "probe.py"
    probe.write_text(ENV_PROBE)
    theirs, ours = tmp_path / "torchrun", tmp_path / "ours"
    theirs.mkdir(), ours.mkdir()
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", str(probe), str(theirs)],
                       capture_output=True, text=True, timeout=240, env=_clean_env())
    assert r.returncode == 0, r.stderr[-2000:]
    for key, value in _clean_env().items():
        monkeypatch.setenv(key, value)
    for key in set(os.environ) - set(_clean_env()):
        monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what the launcher sets, as torchrun does for 2 ranks
    assert spawn.start_ranks(2, [sys.executable, str(probe), str(ours)]) == 0
    for rank in ("0", "1"):
        a = json.loads((theirs / f"{rank}.json").read_text())
        b = json.loads((ours / f"{rank}.json").read_text())
        assert set(a) - {"TORCHELASTIC_SIGNALS_TO_HANDLE"} <= set(b), set(a) ^ set(b)
        by_design = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                     "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE"}
        assert {k: v for k, v in a.items() if k not in by_design} == {k: v for k, v in b.items() if k not in by_design}
        assert b["TORCHELASTIC_USE_AGENT_STORE"] == "False" and b["MASTER_ADDR"] == "127.0.0.1"


def test_a_failed_rank_ends_the_others_and_its_code_is_the_runs(tmp_path):
    """Rank 1 exits 4 at once, rank 0 would sleep a minute: the launcher ends rank 0 after
    the grace period and returns rank 1's code (the lowest rank's positive code)."""
    from ncclbench.launch import spawn

    script = tmp_path / "r.py"
    script.write_text("import os, sys, time\n"
                      "sys.exit(4) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    assert spawn.start_ranks(2, [sys.executable, str(script)]) == 4


def test_a_rank_killed_by_a_signal_is_named(tmp_path, capsys):
    from ncclbench.launch import spawn

    script = tmp_path / "r.py"
    script.write_text("import os, signal, time\n"
                      "os.kill(os.getpid(), signal.SIGKILL) if os.environ['RANK'] == '1' else time.sleep(60)\n")
    assert spawn.start_ranks(2, [sys.executable, str(script)]) == 3
    err = capsys.readouterr().err
    assert "error: rank 1 (pid" in err and "was killed by SIGKILL" in err


def test_the_reserved_port_takes_rank_zeros_store_and_nothing_else():
    import socket

    from ncclbench.launch.spawn import reserve_port

    held = reserve_port()
    port = held.getsockname()[1]
    other = socket.socket()
    with pytest.raises(OSError):
        other.bind(("", port))  # another program's bind
    store = socket.socket()
    store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    store.bind(("", port))  # what rank 0's TCPStore does
    store.listen()
    for s in (other, store, held):
        s.close()


# ---- counting GPUs without torch -------------------------------------------------------------

class FakeNvml:
    def __init__(self, uuids, fail=False):
        self.uuids, self.fail, self.shut = uuids, fail, False

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, k):
        return k

    def nvmlDeviceGetUUID(self, handle):
        return self.uuids[handle]


UUIDS = ["GPU-1a2b0000-0000", "GPU-1a2c0000-0000", "GPU-99990000-0000", "GPU-77770000-0000"]


@pytest.mark.parametrize("setting,count", [
    (None, 4), ("", 0), ("0", 1), ("3,1", 2), ("1gpu,2", 2), ("0,5,1", 1), ("7", 0), ("1,1", 0), ("-1,0", 0),
    ("GPU-9999", 1), ("GPU-1a2", 0), ("GPU-1a2b,GPU-7777", 2), ("GPU-1a2b,GPU-1a2b", 0), ("MIG-abc", None),
])
def test_visible_gpus_are_counted_as_cuda_reads_its_variable(setting, count):
    from ncclbench.topology.visible import visible_cuda_count

    env = {} if setting is None else {"CUDA_VISIBLE_DEVICES": setting}
    nvml = FakeNvml(UUIDS)
    assert visible_cuda_count(nvml, env) == count
    assert nvml.shut or setting == ""


def test_no_nvml_means_no_answer_and_no_driver_means_no_gpu(monkeypatch):
    from ncclbench.launch import launcher as launch
    from ncclbench.topology import visible as topo

    assert topo.visible_cuda_count(FakeNvml(UUIDS, fail=True), {}) is None
    monkeypatch.setattr(topo, "visible_cuda_count", lambda *a, **k: None)
    monkeypatch.setattr(topo, "nvidia_driver_loaded", lambda: False)
    asked = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 7))  # what asking torch would answer
    monkeypatch.setitem(sys.modules, "torch", asked)
    assert topo.visible_gpu_count() == 0
    monkeypatch.setattr(topo, "nvidia_driver_loaded", lambda: True)  # a driver NVML cannot read: torch decides
    assert topo.visible_gpu_count() == 7


# ---- -g all ------------------------------------------------------------------------------------

@pytest.fixture
def spawned(monkeypatch):
    """launch.spawn_local replaced: what it was asked to start, nothing started."""
    from ncclbench.launch import launcher as launch

    calls = []
    monkeypatch.setattr(launch, "spawn_local", lambda n, argv, **kw: calls.append((n, argv)) or 0)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    return calls


@pytest.mark.parametrize("visible,backend,expected", [
    (0, None, (2, "gloo")), (0, "gloo", (2, "gloo")), (1, None, (1, "nccl")), (8, None, (8, "nccl")),
    (4, "cupy", (4, "cupy")), (3, "gloo", (3, "gloo")),
])
def test_g_all_is_every_visible_gpu_or_two_cpu_ranks(visible, backend, expected, spawned, monkeypatch, capsys):
    from ncclbench.topology import visible as topo_visible
    from ncclbench.cli.main import main

    monkeypatch.setattr(topo_visible, "visible_gpu_count", lambda: visible)
    args = ["allreduce", "-g", "all", "-b", "8", "-e", "1M", "-f", "4", "--no-save"]
    args += ["--backend", backend] if backend else []
    monkeypatch.setattr(sys, "argv", ["ncclbench", *args])  # what the ranks are started with
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code in (0, None)
    (nprocs, argv), = spawned
    assert (nprocs, argv[argv.index("--backend") + 1]) == expected
    err = capsys.readouterr().err
    if backend is None and visible == 0:
        assert "using the gloo CPU backend with 2 ranks (-g all)" in err


@pytest.mark.parametrize("args,message", [
    (["-g", "all", "--backend", "nccl"], "the nccl backend needs a CUDA GPU and none is visible"),
    (["-g", "2", "--backend", "cupy"], "-g 2 asks for more GPUs than the 0 visible"),
])
def test_a_gpu_count_that_cannot_be_met_is_exit_5(args, message, spawned, monkeypatch, capsys):
    from ncclbench.topology import visible as topo_visible
    from ncclbench.cli.main import main

    monkeypatch.setattr(topo_visible, "visible_gpu_count", lambda: 0)
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", *args, "--no-save"])
    assert exc.value.code == 5 and message in capsys.readouterr().err
    assert spawned == []


def test_the_readme_command_runs_on_this_machine(tmp_path):
    """README's main command works on any machine: without a GPU, two gloo ranks and every
    cell a number; on one GPU one rank (out-of-place N/A on the torch NCCL backend)."""
    from conftest import cuda_available, run_cli

    readme = (ROOT / "README.md").read_text()
    line = next(ln for ln in readme.splitlines() if "ncclbench allreduce -g all" in ln)
    command = line[line.index("ncclbench allreduce -g all"):].split("#")[0].split()
    r = run_cli(command[1:] + ["--no-save"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert [int(row[0]) for row in rows] == [8 * 4**k for k in range(9)]  # -b 8 -e 1M -f 4
    if not cuda_available():
        assert "2 ranks on 1 node" in r.stdout and all(row[8] == "0" and row[12] == "0" for row in rows)


# ---- the start-up benchmark ------------------------------------------------------------------

def test_the_startup_benchmark_runs_here_and_writes_its_table(tmp_path):
    """benchmarks/startup.py with one repetition: every row of the table is there, GPU rows
    skipped with a reason on a machine without GPU, gloo rows timed with a ratio to the bare
    script and the run's start-up phases; the JSON holds every run."""
    from conftest import cuda_available

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--out", str(tmp_path),
                        "--repeat", "1"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    assert r.returncode == 0, r.stderr[-3000:]
    table = (tmp_path / "startup.md").read_text()
    assert r.stdout.strip().endswith(table.strip().splitlines()[-1])
    head = "| command | ranks | median (s) | min-max (s) | x bare | target | start-up phases, median (s) |"
    lines = table.splitlines()
    cells_of = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in lines[lines.index(head) + 2:]]
    rows = {cells[0]: cells for cells in cells_of}
    assert {len(cells) for cells in cells_of} == {7} and len(rows) == len(cells_of)
    gloo = rows["ncclbench allreduce -g 2 --backend gloo -b 8 -e 8"]
    assert float(gloo[2]) > 0 and float(gloo[4]) > 0 and gloo[5].startswith(("met", "missed"))
    assert gloo[6].startswith("rank started ") and "first row " in gloo[6]
    assert float(rows["bare torch gloo script, 2 process(es)"][2]) > 0
    assert rows["ncclbench --help"][5] in ("met (< 0.5 s)", "missed (< 0.5 s)")
    gpu_rows = [cells for name, cells in rows.items() if "--backend nccl" in name or "--backend cupy" in name]
    assert gpu_rows
    if not cuda_available():
        assert all(cells[2] == "skipped" and cells[-1] == "no CUDA GPU visible" for cells in gpu_rows)
    doc = json.loads((tmp_path / "startup.json").read_text())
    assert doc["target_ratio"] == 1.15 and {c["name"] for c in doc["cases"]} == set(rows)
    timed = [c for c in doc["cases"] if c["walls_s"]]
    assert all(len(c["walls_s"]) == 1 and c["median_s"] == c["walls_s"][0] for c in timed)
