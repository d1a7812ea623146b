"""`ncclbench fleet`'s node-alone readings on a loaded CPU host: RUNS healthy runs of 3 nodes of
2 gloo ranks (`ncclbench fleet --backend gloo -g 6 --sim-node-size 2 -T 20`) while BUSY other
processes spin on the cores; per run the drains, the node-alone re-tests and how far the
slowest node's all_reduce fell below the others' reference. No GPU, no root.

    python benchmarks/fleet_alone_noise.py --runs 20 --busy 1

Prints one line per run and a summary (docs/fleet.md quotes it)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ncclbench.api.verdict import worst_below  # noqa: E402


def spin() -> None:
    while True:
        pass


def one_run(folder: str, k: int) -> dict:
    out = os.path.join(folder, f"fleet{k}.json")
    cmd = [sys.executable, "-m", "ncclbench", "fleet", "--backend", "gloo", "-g", "6", "--sim-node-size", "2",
           "-T", "20", "--json", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if not os.path.exists(out):
        return {"exit": proc.returncode, "error": proc.stderr.strip().splitlines()[-1:]}
    report = json.loads(Path(out).read_text())
    alone = {n["host"]: n["alone_busbw_gbps"]["all_reduce"] for n in report["nodes"] if n.get("alone_busbw_gbps")}
    return {"exit": proc.returncode, "drains": len(report["drain"]),
            "retests": sum(report["schedule"].get("node_alone_retests", {}).values()),
            "busbw": sorted(alone.values()), "worst_below": worst_below(alone)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=1, help="other processes spinning on the cores meanwhile")
    a = ap.parse_args()
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    runs = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            for k in range(a.runs):
                r = one_run(folder, k)
                runs.append(r)
                print(f"run {k + 1}: {r}", flush=True)
    finally:
        for p in busy:
            p.terminate()
    done = [r for r in runs if "worst_below" in r]
    print(f"\n{len(done)} of {a.runs} runs reported, {a.busy} busy process(es): "
          f"{sum(r['drains'] > 0 for r in done)} with a drain, {sum(r['retests'] > 0 for r in done)} with a "
          f"node-alone re-test; worst healthy fall below the reference "
          f"{100 * max((r['worst_below'] for r in done), default=0):.0f}%")
    return 0 if len(done) == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
