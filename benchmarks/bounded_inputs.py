#!/usr/bin/env python3
"""What a bad input file costs each reading command: peak memory and wall time.

Every command that reads a file (show, compare, baseline, plot, suite, alltoallv's matrix,
explain) is run on /dev/zero, /dev/urandom, a 2 GiB sparse file and 1 MiB of random bytes,
each in a child process under an address-space limit (--limit-gib, so that a reader that
loads the file fails instead of taking the machine down). Per run: the exit code, the peak
resident memory of the child (wait4's ru_maxrss), the wall time, and whether stderr was one
line, and its CPU time (user + system; the wall time on a shared machine waits for others).
A healthy results file read by show is the reference: what the process costs anyway.

Prints a markdown table (docs/BENCHMARKS.md, "Bad input files") and writes it with every
run to --out when given.

    python benchmarks/bounded_inputs.py [--repeat 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEALTHY = ROOT / "tests" / "fixtures" / "gate" / "h100-4gpu" / "healthy00.json"


def commands(path: str, scratch: str) -> dict[str, list[str]]:
    return {
        "show": ["show", path],
        "compare": ["compare", path, str(HEALTHY)],
        "baseline": ["baseline", path, str(HEALTHY), "-O", os.path.join(scratch, "base.json")],
        "plot": ["plot", path, "-O", os.path.join(scratch, "p.png")],
        "suite": ["suite", path, "--backend", "gloo", "--no-save"],
        "alltoallv matrix": ["alltoallv", "--backend", "gloo", "-b", "1K", "-e", "1K", "--alltoallv-matrix", path],
        "explain": ["explain", path],
    }


def measure(argv: list[str], limit: int) -> dict:
    """One run in a forked child under the address-space limit, its peak RSS from wait4."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: capped, then the command
        try:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            err = os.open(os.path.join(os.environ["BOUNDED_SCRATCH"], f"err.{os.getpid()}"),
                          os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(err, 2)
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "ncclbench", *argv])
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    err_path = os.path.join(os.environ["BOUNDED_SCRATCH"], f"err.{pid}")
    stderr = Path(err_path).read_text(errors="replace").strip().splitlines()
    os.unlink(err_path)
    return {"argv": argv, "exit": os.waitstatus_to_exitcode(status), "seconds": wall,
            "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mb": usage.ru_maxrss / 1024, "stderr": stderr}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the table shows the median and the worst")
    ap.add_argument("--limit-gib", type=float, default=1.0, help="address-space limit of each child")
    ap.add_argument("--out", help="folder for bounded_inputs.md and bounded_inputs.json")
    args = ap.parse_args()
    limit = int(args.limit_gib * (1 << 30))
    scratch = tempfile.mkdtemp(prefix="bounded-inputs-")
    os.environ["BOUNDED_SCRATCH"] = scratch
    try:
        sparse = os.path.join(scratch, "huge.json")
        with open(sparse, "wb") as f:
            f.truncate(2 << 30)
        binary = os.path.join(scratch, "binary.log")
        with open(binary, "wb") as f:
            f.write(os.urandom(1 << 20))
        inputs = {"/dev/zero": "/dev/zero", "/dev/urandom": "/dev/urandom", "2 GiB sparse file": sparse,
                  "1 MiB random bytes": binary}
        runs, lines = [], []
        reference = [measure(["show", str(HEALTHY)], limit) for _ in range(args.repeat)]
        runs += reference
        header = ["| command | input | exit | one line, no traceback | peak RSS (MB), median / max | "
                  "CPU (s), median / max | wall (s), median / max |", "| --- | --- | ---: | --- | ---: | ---: | ---: |"]
        lines.append(_row("show (reference)", "a healthy results file (25 KB JSON)", reference))
        for name in commands("-", scratch):
            for label, path in inputs.items():
                cell = [measure(commands(path, scratch)[name], limit) for _ in range(args.repeat)]
                runs += cell
                lines.append(_row(name, label, cell))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = "\n".join(header + lines)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        Path(args.out, "bounded_inputs.md").write_text(table + "\n")
        Path(args.out, "bounded_inputs.json").write_text(json.dumps(runs, indent=1) + "\n")
    return 0


def _row(command: str, label: str, cell: list[dict]) -> str:
    exits = sorted({r["exit"] for r in cell})
    one_line = all(len(r["stderr"]) == 1 and not any("Traceback" in s for s in r["stderr"]) for r in cell)
    rss = [r["peak_rss_mb"] for r in cell]
    wall = [r["seconds"] for r in cell]
    cpu = [r["cpu_seconds"] for r in cell]
    ok = "yes" if one_line else ("no" if any(r["exit"] for r in cell) else "")
    return (f"| {command} | {label} | {'/'.join(map(str, exits))} | {ok} | "
            f"{statistics.median(rss):.0f} / {max(rss):.0f} | {statistics.median(cpu):.2f} / {max(cpu):.2f} | "
            f"{statistics.median(wall):.2f} / {max(wall):.2f} |")


if __name__ == "__main__":
    sys.exit(main())
