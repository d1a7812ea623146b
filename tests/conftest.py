import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
REFERENCE = FIXTURES / "nccl-tests"

ROW_RE = re.compile(r"^\s+\d+\s+\d+\s")


BENCHMARKS = ROOT / "benchmarks"


def load_script(name: str):
    """benchmarks/<name>.py imported as a module (the maintainers' scripts are not part of the
    package; they import each other by name, as they do when run from that folder)."""
    import importlib.util

    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there while the class is made
    spec.loader.exec_module(module)
    return module


def reference_files(pattern="*/*.txt"):
    return sorted(REFERENCE.glob(pattern))


def table_rows(text: str) -> list[list[str]]:
    """Whitespace-split data rows of nccl-tests style output (what users' scripts do)."""
    return [line.split() for line in text.splitlines() if ROW_RE.match(line)]


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def pytest_configure(config):
    """Runs that a test starts without --results-dir or --no-save save into a temporary store,
    not the checkout's results/ (the default store is relative to the working folder)."""
    if "NCCLBENCH_RESULTS_DIR" not in os.environ:
        import tempfile

        config._ncclbench_store = os.environ["NCCLBENCH_RESULTS_DIR"] = tempfile.mkdtemp(prefix="ncclbench-test-store-")


def pytest_unconfigure(config):
    store = getattr(config, "_ncclbench_store", None)
    if store:
        shutil.rmtree(store, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def cli_command() -> list[str]:
    """The installed console script (next to this Python), else `python -m ncclbench`."""
    exe = shutil.which("ncclbench", path=os.path.dirname(sys.executable)) or shutil.which("ncclbench")
    return [exe] if exe else [sys.executable, "-m", "ncclbench"]


def run_cli(args, env=None, timeout=240, cwd=None):
    """Run the real `ncclbench` console script in a fresh process. NVLink SHARP stays off
    (NCCL_NVLS_ENABLE=0, a rule of the GPU hosts the GPU tests run on) unless `env` says
    otherwise; a name that `env` maps to None is removed."""
    cmd = cli_command()
    full_env = dict(os.environ)
    full_env.setdefault("NCCL_NVLS_ENABLE", "0")
    full_env.pop("RANK", None)
    full_env.pop("WORLD_SIZE", None)
    full_env.pop("LOCAL_RANK", None)
    full_env.pop("TORCHELASTIC_RUN_ID", None)
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=cwd)


def leftover_processes(tag: str) -> list:
    """Processes whose command line still mentions `tag` (a test's unique folder)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(tag in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            pass
    return found


def wait_gone(tag: str, seconds: float = 15) -> list:
    """Waits up to `seconds` for the processes mentioning `tag` to end; those still there."""
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        left = leftover_processes(tag)
        if not left:
            return []
        time.sleep(0.5)
    return leftover_processes(tag)


def endless_run_with_rows(tmp_path, base: list[str], *extra, rows: int = 4, wait_s: float = 120, env=None):
    """`ncclbench <base> -N 0` (cycles until stopped) in its own session, CSV in tmp_path;
    returned once `rows` rows have landed in the CSV (or `wait_s` passed)."""
    import time

    csv = tmp_path / "r.csv"
    cmd = [*cli_command(), *base, "-N", "0", "--csv", str(csv), *extra]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", **(env or {}))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    deadline = time.time() + wait_s
    while time.time() < deadline:
        if csv.exists() and len(csv.read_text().splitlines()) > 2 * rows:  # header + two lines per row
            break
        time.sleep(0.5)
    return proc


def slower_copy(doc: dict, factor: float, up_to: float = float("inf")) -> dict:
    """A copy of a results document whose rows up to `up_to` bytes take `factor` x as long in
    every iteration: times, bandwidths, noise summaries and samples alike."""
    import json

    doc = json.loads(json.dumps(doc))
    for row in doc["results"]:
        if row["size"] > up_to:
            continue
        for placement in ("out_of_place", "in_place"):
            cell, block = row[placement], row[f"{placement}_noise"]
            cell["time"] *= factor
            cell["alg_bw"] /= factor
            cell["bus_bw"] /= factor
            for key in ("min_us", "p25_us", "median_us", "p75_us", "p90_us", "max_us"):
                block[key] *= factor
            block["samples_us"] = [v * factor for v in block["samples_us"]]
    return doc
