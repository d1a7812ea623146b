"""A rank killed mid-sweep: who is named, how, and how long until every process is gone.

    python benchmarks/dead_rank.py --backend nccl --launcher g --out DIR [--np 4] [--kill-rank 3]

Runs `ncclbench allgather -b 1M -e 64M -f 4` on NP ranks (`-g NP`, or the user's own
`torchrun`) with rank KILL_RANK SIGKILLed before 16 MiB (the `kill` fault), and prints: the
exit code, the ncclbench error lines, the JSON status and errors, the seconds from the last
printed row to the end of the run (the kill lands just after that row), and any ncclbench
process left behind. Writes DIR/dead_rank_<backend>_<launcher>.{json,err,txt}."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--launcher", choices=["g", "torchrun"], default="g")
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--kill-rank", type=int, default=3)
    parser.add_argument("--out", required=True)
    a = parser.parse_args()
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, f"dead_rank_{a.backend}_{a.launcher}")
    args = ["allgather", "-b", "1M", "-e", "64M", "-f", "4", "--backend", a.backend, "--no-save", "-J", base + ".json"]
    cmd = (["ncclbench", *args[:1], "-g", str(a.np), *args[1:]] if a.launcher == "g" else
           [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(a.np),
            "-m", "ncclbench", *args])
    env = dict(os.environ, NCCLBENCH_FAULT=f"kill:rank={a.kill_rank},size=16777216")
    start = time.monotonic()
    last_row = start
    with open(base + ".err", "w") as err, open(base + ".txt", "w") as txt:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        for line in proc.stdout:
            txt.write(line)
            if line.split()[:1] and line.split()[0].isdigit():
                last_row = time.monotonic()
        proc.wait()
    end = time.monotonic()
    errors = [ln.rstrip() for ln in open(base + ".err") if ln.startswith("ncclbench:") or "exitcode" in ln]
    try:
        doc = json.load(open(base + ".json"))
        status = (doc.get("ncclbench", {}).get("status"), doc.get("errors"))
    except (OSError, ValueError) as exc:
        status = (f"no JSON: {exc}", None)
    found = subprocess.run(["pgrep", "-af", "ncclbench"], capture_output=True, text=True).stdout.splitlines()
    left = "; ".join(ln for ln in found if "dead_rank.py" not in ln and "pgrep" not in ln)
    print(f"{a.backend} {a.launcher}: exit {proc.returncode}, {end - start:.1f} s in all, "
          f"{end - last_row:.1f} s from the last row to the end")
    print("\n".join(f"  {ln}" for ln in errors))
    print(f"  JSON: {status[0]} {status[1]}")
    print(f"  left behind: {left or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
