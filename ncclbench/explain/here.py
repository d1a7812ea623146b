"""`ncclbench explain` without logs: a short all_reduce sweep run here as a child ncclbench
process with NCCL's log on, whose JSON carries the path its ranks read, explained with this
host's facts (RDMA devices, the GPUDirect RDMA module) and the best busbw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ncclbench.errors import PlanError
from ncclbench.inputs import read_text
from ncclbench.explain.report import report_lines
from ncclbench.topology.pathview import Path

# the sweep run here: large enough sizes to show the path's bandwidth, few enough to take seconds
SWEEP = ["-b", "1M", "-e", "256M", "-f", "4", "-n", "5", "-w", "2"]
CPU_SWEEP = ["-b", "64K", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"]  # gloo: no NCCL path to show, only the run


def host_facts(sysfs: str = "/sys") -> dict:
    """The facts the explanation of a path reads from this host (pathexplain.causes)."""
    from ncclbench.topology.pathhost import ib_devices, peermem_loaded

    return {"ib_devices": ib_devices(sysfs), "peermem": peermem_loaded(sysfs)}


def explain_here(ngpus: str = "all", backend: str | None = None, timeout_s: int = 300) -> tuple[list[str], int]:
    """Run a short all_reduce sweep here (a child ncclbench, NCCL's log on) and explain it:
    (lines, the child's exit code)."""
    from ncclbench.engine.collectives import ALL_REDUCE
    from ncclbench.topology.visible import visible_gpu_count

    sweep = CPU_SWEEP if backend == "gloo" or (backend is None and not visible_gpu_count()) else SWEEP
    with tempfile.TemporaryDirectory(prefix="ncclbench-explain-") as folder:
        out = os.path.join(folder, "run.json")
        argv = [sys.executable, "-m", "ncclbench", ALL_REDUCE.name, "-g", str(ngpus), *sweep, "-J", out, "--no-save",
                "--quiet"] + (["--backend", backend] if backend else [])
        try:
            done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise PlanError(f"the measurement did not end within {timeout_s} s") from None
        if not os.path.exists(out):
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise PlanError(f"the measurement failed (exit code {done.returncode}): {last}", done.returncode or 1)
        doc = json.loads(read_text(out, "results"))
    nb = doc.get("ncclbench", {})
    lines = [f"# Measured here: {ALL_REDUCE.name} {' '.join(sweep)} on {nb.get('ranks')} rank(s), {nb.get('backend')} backend"]
    path = Path.from_dict(nb.get("nccl_path"))
    if path is None:
        return lines + [f"# {line}" for line in nb.get("path_lines") or ["NCCL path: not read"]], done.returncode
    return lines + report_lines(path, best=nb.get("peak_bus_bandwidth"), nvlink_peak=nb.get("link_peak_gbps"),
                                facts=host_facts(), environ=dict(os.environ)), done.returncode
