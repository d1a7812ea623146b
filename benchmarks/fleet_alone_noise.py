"""`ncclbench fleet`'s node-alone readings on a loaded CPU host: RUNS healthy runs of 3 nodes of
2 gloo ranks (`ncclbench fleet --backend gloo -g 6 --sim-node-size 2 -T 20`) while BUSY other
processes spin on the cores; per run the drains, the node-alone re-tests and how far the
slowest node fell below the others' reference (the worse of all_reduce and all_gather, at
each node's best reading, as fleet judges them). No GPU, no root.

    python benchmarks/fleet_alone_noise.py --runs 20 --busy 1

Prints one line per run and a summary (docs/design/fleet-alone-reading.md quotes it)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ncclbench.locate.stats import worst_below  # noqa: E402


def spin() -> None:
    while True:
        pass


def one_run(folder: str, k: int) -> dict:
    out = os.path.join(folder, f"fleet{k}.json")
    cmd = [sys.executable, "-m", "ncclbench", "fleet", "--backend", "gloo", "-g", "6", "--sim-node-size", "2",
           "-T", "20", "--json", out]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"exit": None, "error": "no end within 300 s"}
    if proc.returncode not in (0, 1) or not os.path.exists(out):
        return {"exit": proc.returncode, "error": (proc.stderr.strip().splitlines() or [""])[-1]}
    report = json.loads(Path(out).read_text())
    alone = [n["alone_busbw_gbps"] for n in report["nodes"] if n.get("alone_busbw_gbps")]
    worst = max((worst_below({i: v[coll] for i, v in enumerate(alone) if coll in v}) for coll in
                 {c for v in alone for c in v}), default=0.0)
    return {"exit": proc.returncode, "drains": len(report["drain"]),
            "retests": sum(report["schedule"].get("node_alone_retests", {}).values()),
            "all_reduce": sorted(round(v["all_reduce"], 3) for v in alone if "all_reduce" in v),
            "worst_below": round(worst, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=1, help="other processes spinning on the cores meanwhile")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the spinning processes end too
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
          f"{sum(r['drains'] > 0 for r in done)} runs with a drain, {sum(r['retests'] > 0 for r in done)} with a "
          f"node-alone re-test; worst healthy node below the reference "
          f"{100 * max((r['worst_below'] for r in done), default=0):.0f}%")
    return 0 if len(done) == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
