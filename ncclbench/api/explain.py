"""`ncclbench explain`: the path NCCL took and the known causes of a lower number, from logs
a user already has (NCCL_DEBUG_FILE's per-process files, a folder of them, a job's combined
output) or from a short all_reduce sweep run here with NCCL's log on. Reading logs imports
no torch and needs no GPU; the sweep runs as a child ncclbench process, whose JSON carries the
path its ranks read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ncclbench.errors import BadInput, PlanError
from ncclbench.topology import pathexplain
from ncclbench.topology.pathview import Path

# the sweep run here: large enough sizes to show the path's bandwidth, few enough to take seconds
SWEEP = ["-b", "1M", "-e", "256M", "-f", "4", "-n", "5", "-w", "2"]
CPU_SWEEP = ["-b", "64K", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"]  # gloo: no NCCL path to show, only the run


def read_path(paths) -> tuple[Path, list[str]]:
    """(the merged path, the files it came from) of the logs `paths` name; BadInput (one
    line, exit 2) for a missing or unreadable file or when no NCCL line is in them."""
    from ncclbench.topology.ncclpath import log_files, read_logs, to_summary

    for raw in paths:
        if not os.path.exists(raw):
            raise BadInput(f"no such file or folder: {raw}")
    files = log_files(paths)
    if not files:
        raise BadInput(f"no files in {', '.join(map(str, paths))}")
    try:
        processes = read_logs(files)
    except OSError as exc:
        raise BadInput(f"cannot read {exc.filename}: {exc.strerror}") from None
    if not any(p.comms for p in processes):
        raise BadInput(f"no NCCL INFO line about a communicator in {len(files)} file(s) "
                       "(the log needs NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,P2P,SHM,NET,GRAPH)")
    return Path([to_summary(p) for p in processes]), [str(f) for f in files]


def report_lines(path: Path, *, best: float | None = None, nvlink_peak: float | None = None,
                 facts: dict | None = None, environ: dict | None = None, source: str = "") -> list[str]:
    """The path table, its facts, how far the best busbw is from its peak, the known causes."""
    hosts = sorted({p.get("host") for p in path.processes if p.get("host")})
    where = f" on {', '.join(hosts)}" if hosts else ""
    version = f", NCCL {path.version}" if path.version else ""
    out = [f"# NCCL path of {len(path.processes)} process(es){where}{version}{source}"]
    if path.empty:
        out.append(f"# {path.unread_text() or 'NCCL log named no connection (one rank, or no collective ran)'}")
    elif path.connected:  # the table names the transports: the header's first line would again
        out += pathexplain.table(path) + [f"# {line.strip()}" for line in path.lines()[1:]]
    else:
        out += [f"# {line.strip()}" for line in path.lines()]
    nics = path.nics_by_rank()
    if nics and len({tuple(v) for v in nics.values()}) > 1:  # one NIC for all is in the table already
        out.append("# NICs per rank: " + "; ".join(f"{r} {','.join(v)}" for r, v in
                                                  sorted(nics.items(), key=lambda kv: int(kv[0]))))
    if best is not None:
        out.append(pathexplain.peak_line(best, path, nvlink_peak))
    found = pathexplain.causes(path, facts, environ) if not path.empty else []
    if found:
        out.append("# Known causes of a lower number:")
        out += [f"#   - {c}" for c in found]
    elif path.connected:
        out.append("# No known cause of a lower number shows in NCCL's log: the path is the expected one")
    return out


def explain_logs(paths) -> list[str]:
    path, files = read_path(paths)
    return report_lines(path, source=f" (from {len(files)} file(s))")


def explain_here(ngpus: str = "all", backend: str | None = None, timeout_s: int = 300) -> tuple[list[str], int]:
    """Run a short all_reduce sweep here (a child ncclbench, NCCL's log on) and explain it:
    (lines, the child's exit code)."""
    from ncclbench.engine.collectives import ALL_REDUCE
    from ncclbench.topology.pathhost import host_facts

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
        from ncclbench.inputs import read_text

        doc = json.loads(read_text(out, "results"))
    nb = doc.get("ncclbench", {})
    lines = [f"# Measured here: {ALL_REDUCE.name} {' '.join(sweep)} on {nb.get('ranks')} rank(s), {nb.get('backend')} backend"]
    path = Path.from_dict(nb.get("nccl_path"))
    if path is None:
        return lines + [f"# {line}" for line in nb.get("path_lines") or ["NCCL path: not read"]], done.returncode
    return lines + report_lines(path, best=nb.get("peak_bus_bandwidth"), nvlink_peak=nb.get("link_peak_gbps"),
                                facts=host_facts(), environ=dict(os.environ)), done.returncode
