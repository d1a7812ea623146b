#!/usr/bin/env python3
"""How long ncclbench takes to print one row, against the least any tool could take.

On the machine at hand, side by side in one run (repetitions interleaved, so that every
command sees the same minutes of a shared machine):

  nccl-tests      all_reduce_perf -b 8 -e 8 -g N (when --nccl-tests gives the binary)
  bare torch      import torch, init_process_group("nccl"), one 8-byte all_reduce
  bare CuPy       NCCL unique id, NcclCommunicator, one allReduce (no torch)
  bare gloo       the torch script on gloo, 2 processes
  ncclbench       `ncclbench allreduce -g N --backend B -b 8 -e 8`, self-spawned, for each
                  GPU backend and every -g this host allows; `-g 2 --backend gloo`
  torchrun        (--torchrun) the same one-size run under `torchrun --standalone`
  --help          `ncclbench --help`

The bare scripts' ranks are started by hand with torchrun's environment variables. Each
figure is the median wall time of --repeat runs of the whole process tree; each
ncclbench row is divided by the bare script of its backend and rank count (torch for
nccl, CuPy for cupy, gloo for gloo). ncclbench rows also carry their start-up phases
(the median of what each run's JSON reports). GPU rows are skipped, with the reason, on
a machine without GPUs. The wall time ends when the last process has exited: the bare
scripts exit as Python scripts do, ncclbench's ranks skip the interpreter's teardown once
their files are written (about half a second per process with torch loaded); the phases
show the time to the first row apart from that.

Writes startup.md (the table) and startup.json (every run) to --out, and prints the table.

    NCCL_NVLS_ENABLE=0 python benchmarks/startup.py --out /tmp/startup [--repeat 5]
        [--nccl-tests /path/to/all_reduce_perf] [--torchrun]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TARGET_RATIO = 1.15      # a one-size self-spawned run against its bare script
TARGET_HELP_S = 0.5
PHASES = ("rank_started_s", "imported_s", "backend_ready_s", "first_row_s")
TIMEOUT_S = 300

BARE_TORCH = """
import os, torch, torch.distributed as dist
backend = os.environ["BARE_BACKEND"]
if backend == "nccl":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
else:
    device = torch.device("cpu")
dist.init_process_group(backend)
x = torch.ones(2, device=device)  # 8 bytes
dist.all_reduce(x)
if backend == "nccl":
    torch.cuda.synchronize()
dist.destroy_process_group()
"""

BARE_CUPY = """
import os, cupy
from cupy.cuda import nccl
rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cupy.cuda.Device(int(os.environ["LOCAL_RANK"])).use()
uid = tuple(int(b) for b in os.environ["BARE_NCCL_ID"].split(",")) if n > 1 else nccl.get_unique_id()
try:
    comm = nccl.NcclCommunicator(n, uid, rank)
except TypeError:  # CuPy 14 takes the id as bytes (its get_unique_id gives them; the variable carried numbers)
    comm = nccl.NcclCommunicator(n, bytes(b % 256 for b in uid), rank)
x = cupy.ones(2, dtype=cupy.float32)  # 8 bytes
comm.allReduce(x.data.ptr, x.data.ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, cupy.cuda.Stream.null.ptr)
cupy.cuda.Stream.null.synchronize()
"""


@dataclass
class Case:
    name: str                    # what the row says
    kind: str                    # nccl-tests | bare | ncclbench | torchrun | help
    backend: str | None
    ranks: int | None
    commands: list[list[str]] = field(default_factory=list)  # started together: one per process
    envs: list[dict] = field(default_factory=list)
    json_path: Path | None = None  # an ncclbench run's -J file (its start-up phases)
    skipped: str | None = None
    walls: list[float] = field(default_factory=list)
    phases: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.walls) if self.walls else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_envs(n: int, extra: dict | None = None) -> list[dict]:
    """torchrun's variables for a one-node world of n processes started by hand."""
    port = free_port()
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(n),
                LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0", TORCHELASTIC_RUN_ID="bare", **(extra or {}))
    if n > 1:
        base.setdefault("OMP_NUM_THREADS", "1")
    return [dict(base, RANK=str(r), LOCAL_RANK=str(r)) for r in range(n)]


def ncclbench_command() -> list[str]:
    exe = shutil.which("ncclbench", path=os.path.dirname(sys.executable))
    return [exe] if exe else [sys.executable, "-m", "ncclbench"]


def clean_env() -> dict:
    """This environment minus any launcher's rank variables (the script may run inside a job)."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("TORCHELASTIC_")}


def gpu_counts(visible: int) -> list[int]:
    """Every -g worth timing here: powers of two up to the GPUs visible, and all of them."""
    counts = [n for n in (1, 2, 4, 8) if n <= visible]
    return counts + ([visible] if visible and visible not in counts else [])


def plan_cases(args, work: Path) -> list[Case]:
    from ncclbench.topology.visible import visible_gpu_count

    visible = visible_gpu_count()
    has_cupy = _importable("cupy")
    scripts = {"torch": work / "bare_torch.py", "cupy": work / "bare_cupy.py"}
    scripts["torch"].write_text(BARE_TORCH)
    scripts["cupy"].write_text(BARE_CUPY)
    nb = ncclbench_command()
    one_size = ["allreduce", "-b", "8", "-e", "8", "--no-save"]
    cases = [Case("ncclbench --help", "help", None, None, [nb + ["--help"]], [clean_env()])]

    def ncclbench_case(backend: str, n: int, skipped: str | None = None) -> Case:
        path = work / f"ncclbench_{backend}_{n}.json"
        cmd = nb + one_size + ["-g", str(n), "--backend", backend, "-J", str(path)]
        return Case(f"ncclbench allreduce -g {n} --backend {backend} -b 8 -e 8", "ncclbench", backend, n,
                    [cmd], [clean_env()], path, skipped)

    def bare_case(backend: str, n: int, skipped: str | None = None) -> Case:
        script = scripts["cupy" if backend == "cupy" else "torch"]
        return Case(f"bare {'CuPy' if backend == 'cupy' else 'torch ' + backend} script, {n} process(es)", "bare",
                    backend, n, [[sys.executable, str(script)]] * n, [], None, skipped)

    no_gpu = None if visible else "no CUDA GPU visible"
    for n in gpu_counts(visible) or [1]:
        if args.nccl_tests:
            cases.append(Case(f"nccl-tests all_reduce_perf -b 8 -e 8 -g {n}", "nccl-tests", "nccl", n,
                              [[args.nccl_tests, "-b", "8", "-e", "8", "-g", str(n)]], [clean_env()], None, no_gpu))
        cases.append(bare_case("nccl", n, no_gpu))
        cases.append(ncclbench_case("nccl", n, no_gpu))
        no_cupy = no_gpu or (None if has_cupy else "CuPy is not installed")
        cases.append(bare_case("cupy", n, no_cupy))
        cases.append(ncclbench_case("cupy", n, no_cupy))
        if args.torchrun:
            cases.append(torchrun_case(work, "nccl", n, no_gpu))
    cases.append(bare_case("gloo", 2))
    cases.append(ncclbench_case("gloo", 2))
    if args.torchrun:
        cases.append(torchrun_case(work, "gloo", 2, None))
    return cases


def torchrun_case(work: Path, backend: str, n: int, skipped: str | None) -> Case:
    path = work / f"torchrun_{backend}_{n}.json"
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    cmd = [torchrun, "--standalone", "--nproc-per-node", str(n), "-m", "ncclbench", "allreduce", "-b", "8", "-e", "8",
           "--backend", backend, "--no-save", "-J", str(path)]
    return Case(f"torchrun --standalone --nproc-per-node {n} -m ncclbench allreduce --backend {backend} -b 8 -e 8",
                "torchrun", backend, n, [cmd], [clean_env()], path, skipped)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def environments_for(case: Case) -> list[dict]:
    """Fresh per run: a free port for the bare scripts, a new NCCL unique id for CuPy's."""
    if case.kind != "bare":
        return case.envs
    extra = {"BARE_BACKEND": case.backend}
    if case.backend == "cupy" and case.ranks > 1:
        from cupy.cuda import nccl  # this harness makes the id, as a launcher would hand it out

        extra["BARE_NCCL_ID"] = ",".join(str(b) for b in nccl.get_unique_id())
    return rank_envs(case.ranks, extra)


def run_once(case: Case) -> None:
    if case.json_path is not None and case.json_path.exists():
        case.json_path.unlink()
    envs = environments_for(case)
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in zip(case.commands, envs)]
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=TIMEOUT_S))
        except subprocess.TimeoutExpired:
            proc.kill()
            outputs.append(proc.communicate())
    wall = time.perf_counter() - start
    bad = [(p.returncode, err) for p, (_out, err) in zip(procs, outputs) if p.returncode != 0]
    if bad:
        code, err = bad[0]
        case.failures.append(f"exit {code}: {(err.strip().splitlines() or [''])[-1][:200]}")
        return
    case.walls.append(wall)
    if case.json_path is not None and case.json_path.exists():
        startup = json.loads(case.json_path.read_text()).get("ncclbench", {}).get("startup") or {}
        case.phases.append({k: startup.get(k) for k in PHASES})


def bare_reference(cases: list[Case], case: Case) -> Case | None:
    if case.kind not in ("ncclbench", "torchrun"):
        return None
    return next((c for c in cases if c.kind == "bare" and c.backend == case.backend and c.ranks == case.ranks), None)


def median_phases(case: Case) -> dict:
    out = {}
    for key in PHASES:
        values = [p[key] for p in case.phases if p.get(key) is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    return out


def verdict(cases: list[Case], case: Case) -> tuple[float | None, str]:
    ref = bare_reference(cases, case)
    if case.kind == "help" and case.median is not None:
        return None, f"{'met' if case.median < TARGET_HELP_S else 'missed'} (< {TARGET_HELP_S} s)"
    if ref is None or ref.median is None or case.median is None:
        return None, ""
    ratio = case.median / ref.median
    if case.kind != "ncclbench":
        return ratio, ""
    return ratio, f"{'met' if ratio <= TARGET_RATIO else 'missed'} (<= {TARGET_RATIO}x)"


def markdown(cases: list[Case], header: dict) -> str:
    lines = [f"Start-up on {header['host']} ({header['gpus']}), {header['repeat']} runs each, median wall time "
             f"of the process tree; ratio: to the bare script of the same backend and rank count.", "",
             "| command | ranks | median (s) | min-max (s) | x bare | target | start-up phases, median (s) |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for case in cases:
        ranks = str(case.ranks or "")
        if case.skipped or not case.walls:
            why = case.skipped or "; ".join(sorted(set(case.failures))) or "no run"
            cells = [case.name, ranks, "skipped", "", "", "", why]
        else:
            ratio, target = verdict(cases, case)
            phases = ""
            if case.phases:
                p = median_phases(case)
                phases = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.2f}" for k, v in p.items() if v is not None)
            failed = f" ({len(case.failures)} failed runs)" if case.failures else ""
            cells = [case.name, ranks, f"{case.median:.2f}{failed}", f"{min(case.walls):.2f}-{max(case.walls):.2f}",
                     "" if ratio is None else f"{ratio:.2f}", target, phases]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def host_header(args) -> dict:
    from ncclbench import __version__
    from ncclbench.topology import probe as topo

    t = topo.probe(include_nics=False)
    names = sorted({g.name for g in t.gpus})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    return {"host": platform.node(), "cpus": os.cpu_count(), "gpus": f"{len(t.gpus)} x {', '.join(names)}"
            if t.gpus else "no GPU", "driver": t.versions.driver, "torch": t.versions.torch,
            "nccl": t.versions.nccl, "ncclbench": __version__, "commit": commit or None, "repeat": args.repeat,
            "nccl_tests": args.nccl_tests, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Folder for startup.md and startup.json.")
    parser.add_argument("--repeat", type=int, default=5, help="Runs of each command (default 5).")
    parser.add_argument("--nccl-tests", default=None, help="Path of nccl-tests' all_reduce_perf binary.")
    parser.add_argument("--torchrun", action="store_true", help="Also time the one-size run under torchrun.")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.nccl_tests and not os.access(args.nccl_tests, os.X_OK):
        parser.error(f"--nccl-tests {args.nccl_tests}: not an executable file")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = host_header(args)
    with tempfile.TemporaryDirectory(prefix="ncclbench-startup-") as tmp:
        cases = plan_cases(args, Path(tmp))
        for rep in range(args.repeat):
            for case in cases:
                if not case.skipped:
                    print(f"[{rep + 1}/{args.repeat}] {case.name}", file=sys.stderr, flush=True)
                    run_once(case)
    table = markdown(cases, header)
    (out / "startup.md").write_text(table)
    doc = {"host": header, "target_ratio": TARGET_RATIO, "target_help_s": TARGET_HELP_S, "cases": []}
    for case in cases:
        ratio, target = verdict(cases, case)
        doc["cases"].append({"name": case.name, "kind": case.kind, "backend": case.backend, "ranks": case.ranks,
                             "skipped": case.skipped, "walls_s": [round(w, 3) for w in case.walls],
                             "median_s": None if case.median is None else round(case.median, 3),
                             "ratio_to_bare": None if ratio is None else round(ratio, 3), "target": target or None,
                             "phases_median_s": median_phases(case) if case.phases else None,
                             "failures": case.failures,
                             "commands": [" ".join(c) for c in case.commands[:1]]})
    (out / "startup.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(table)
    return 1 if any(c.failures and not c.walls for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
