#!/usr/bin/env python3
"""Does a change keep ncclbench's output? Runs one list of commands against two checkouts of
the package (BASE and NEW, each a folder holding `ncclbench/`) and reports every difference.

Help texts, file tools (show, compare on the nccl-tests fixtures and on two saved runs),
topology with a stand-in `nvidia-smi` that prints the fixture host's text, and bad inputs are
compared byte for byte (stdout, stderr, exit code). Timed runs (every collective on gloo,
-d all -o all, -r -1, -I with -J, a suite, preflight, pairs, tune --rehearse; with --gpu the
same on the GPU backends) are compared with their numbers collapsed, since times differ run
to run: their layout, words and exit codes must not. Run twice on BASE alone first to see
that the comparison is quiet where nothing changed.

    python benchmarks/same_output.py --base /path/to/old --new . --out /tmp/same [--gpu]

Exit 0 when nothing differs, 1 otherwise."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NT = FIXTURES / "nccl-tests" / "h200-4gpu-nvswitch"
SMI = FIXTURES / "topology" / "h200-4gpu-nvswitch"
COMMANDS = ("allgather allreduce alltoall alltoallv broadcast compare fleet gather hypercube p2p pairs plot "
            "preflight reduce reducescatter scatter sendrecv show suite topo tune").split()
COLLECTIVES = "allreduce allgather reducescatter alltoall broadcast reduce gather scatter sendrecv hypercube alltoallv".split()
BAD = [
    "allreduce -b 1G -e 1M", "allreduce -d float7", "allreduce -o xor", "allreduce -g 0",
    "allreduce -g 2 --backend gloo -d fp8e4m3", "alltoallv -g 2 --backend gloo --alltoallv-spread 7",
    "sendrecv -g 1 --backend gloo -b 8 -e 8", "hypercube -g 3 --backend gloo -b 8 -e 8",
    "reduce -r 5 -g 2 --backend gloo -b 8 -e 8", "nosuch", "show /nonexistent.json", "show /etc/hostname",
    f"compare {NT}/all_reduce_np4.txt", "suite /nonexistent.yaml", "suite /etc/hostname",
    "tune allreduce --algos nosuch --rehearse -g 2", "tune hypercube --rehearse -g 2",
    "preflight --mesh 3x3 -g 2 --backend gloo", "preflight --band 150% -g 2 --backend gloo",
    "fleet -g 2 --backend gloo --band x", "pairs -g 2 --backend gloo -b 0", "p2p --size 0",
    "reduce -g 2 --backend gloo -b 8 -e 8 -o mulsum", "allreduce -g 2 --backend gloo -b 8 -e 8 -c -1",
    "allreduce -g 2 --backend gloo -b 8 -e 8 -a 7", "allreduce -G 5 -g 2 --backend gloo -b 8 -e 8",
    "compare --metric time --threshold 5 {IN}/a.json {IN}/b.json", "plot {IN}/a.json -o {W}/p.csv",
]
FAKE_SMI = f"""#!/bin/sh
case "$*" in
  "topo -m") cat "{SMI}/nvidia-smi_topo_-m.txt";;
  "nvlink --status") cat "{SMI}/nvidia-smi_nvlink_--status.txt";;
  *) echo "nvidia-smi stand-in: $* not recorded" >&2; exit 9;;
esac
"""


def commands(gpu: bool) -> list[tuple[bool, str]]:
    """(timed, command line after `ncclbench`); {IN} saved runs, {W} a scratch folder."""
    exact = [""] + [f"{c} --help" for c in COMMANDS] + ["--version"]
    exact += [f"show {NT}/{f}" for f in ("all_reduce_np4.txt", "all_gather_np4.txt", "sendrecv_np4.txt")]
    exact += ["show {IN}/a.json", "show --rich {IN}/a.json", f"compare {NT}/all_reduce_np2.txt {NT}/all_reduce_np4.txt",
              "compare {IN}/a.json {IN}/b.json --json {W}/c.json --csv {W}/c.csv",
              "SMI topo", "SMI topo --json", "SMI topo --compare-smi", "topo"] + BAD
    backend = [] if gpu else ["--backend", "gloo"]
    b = " ".join(backend)
    timed = [f"{c} -g 2 {b} -b 8 -e 64K -f 8 -n 2 -w 1 --no-save" for c in COLLECTIVES]
    timed += [f"allreduce -g 2 {b} -b 1K -e 4K -d all -o all -n 2 -w 1 --no-save",
              f"broadcast -g {2 if gpu else 3} {b} -b 1K -e 4K -r -1 -n 2 -w 1 --no-save",
              f"allreduce -g 2 {b} -b 1K -e 4K -I 1 -n 3 -w 1 --no-save",
              f"suite {ROOT}/configs/quick.yaml -g 2 {b} -q --no-save",
              f"preflight -g 2 {b}", f"pairs -g 2 {b} -b 64K -n 3"]
    if gpu:
        timed += ["allreduce -g 2 --backend cupy -b 8 -e 64M -f 8 -G 5 -I 1 --no-save",
                  "allreduce -g 2 -b 8 -e 1M -f 32 --split 'MOD 2' --no-save"]
    else:
        timed += ["tune allreduce -g 2 --rehearse -b 1K -e 16K -f 4 -n 2 -w 1 --repeat 1 -o {W}/tune --no-plot"]
    return [(False, c) for c in exact] + [(True, c) for c in timed]


def run(tree: Path, line: str, inputs: Path, work: Path, fakebin: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree), COLUMNS="100", NCCLBENCH_RESULTS_DIR=str(work / "store"))
    if line.startswith("SMI "):
        line, env["PATH"] = line[4:], f"{fakebin}:{env['PATH']}"
    line = line.format(IN=inputs, W=work)
    p = subprocess.run(f"ncclbench {line}", shell=True, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    return f"$ ncclbench {line}\n{p.stdout}--- stderr\n{p.stderr}--- exit {p.returncode}\n".replace(str(work), "WORK")


def collapse(text: str, timed: bool) -> str:
    text = re.sub(r"\d{8}-\d{6}", "STAMP", text)  # result-store file names
    text = re.sub(r'"probe_seconds": [\d.]+', '"probe_seconds": X', text)
    if not timed:
        return text
    text = re.sub(r"Pid +\d+", "Pid", text)
    text = re.sub(r"(tree|ring|nvls|pat|collnet)[a-z_]*/[a-z0-9]+", "ALGO", text)  # tune's per-size winner
    text = re.sub(r"^# Warning: at .* of the host cost per call .*$", "# Warning: host cost (sizes vary)", text, flags=re.M)
    return re.sub(r" +", " ", re.sub(r"[-+]?\d[\d.e+%-]*", "N", text))


def saved_runs(tree: Path, inputs: Path) -> None:
    """Two small gloo runs saved as JSON, read by show and compare on both sides."""
    inputs.mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        subprocess.run(["ncclbench", "allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "64K", "-n", "3",
                        "-w", "1", "--no-save", "-J", str(inputs / f"{name}.json")],
                       env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--new", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu", action="store_true", help="timed runs on the GPU backends instead of gloo")
    args = ap.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    fakebin = args.out / "bin"
    fakebin.mkdir(parents=True)
    (fakebin / "nvidia-smi").write_text(FAKE_SMI)
    (fakebin / "nvidia-smi").chmod(0o755)
    saved_runs(args.base.resolve(), args.out / "inputs")
    differ = 0
    for i, (timed, line) in enumerate(commands(args.gpu)):
        seen = []
        for side in ("base", "new"):
            work = args.out / side / f"{i:03d}"
            work.mkdir(parents=True)
            seen.append(run(getattr(args, side).resolve(), line, args.out / "inputs", work, fakebin))
            (args.out / side / f"{i:03d}.txt").write_text(seen[-1])
        a, b = (collapse(t, timed) for t in seen)
        if a != b:
            differ += 1
            print(f"DIFFERS: ncclbench {line}")
            print("".join(list(difflib.unified_diff(a.splitlines(True), b.splitlines(True), n=0))[2:14]))
    print(f"{len(commands(args.gpu))} commands, {differ} with different output "
          f"(timed runs compared with their numbers collapsed)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
