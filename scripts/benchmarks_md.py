#!/usr/bin/env python3
"""Markdown tables for docs/BENCHMARKS.md from a gpu_validate.sh log folder.

    python scripts/benchmarks_md.py LOGDIR REFDIR [--np 4] > tables.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from ncclbench.resultsio import read_results

BIG = (134217728, 536870912, 2147483648)


def busbw_table(logdir: Path, refdir: Path, np_: int) -> str:
    ref = pd.concat([read_results(p) for p in sorted(refdir.glob(f"*_np{np_}.txt"))
                     if "hypercube" not in p.name and "small" not in p.name])
    ref = ref[ref.placement == "out_of_place"]
    runs = {b: read_results(logdir / f"full_{b}_np{np_}.csv") for b in ("nccl", "cupy")
            if (logdir / f"full_{b}_np{np_}.csv").exists()}
    lines = ["| collective | size | nccl-tests busbw | torch NCCL (eager) | ratio | CuPy NCCL (eager) | ratio |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    worst = {b: 1e9 for b in runs}
    for coll in sorted(ref.collective.unique()):
        for size in BIG:
            r = ref[(ref.collective == coll) & (ref.size_bytes == size)]
            if r.empty:
                continue
            rb = float(r.busbw_gbps.iloc[0])
            cells = [coll, f"{size >> 20} MiB", f"{rb:.1f}"]
            for b in ("nccl", "cupy"):
                if b not in runs:
                    cells += ["-", "-"]
                    continue
                o = runs[b]
                o = o[(o.collective == coll) & (o.size_bytes == size) & (o.placement == "out_of_place")]
                ob = float(o.busbw_gbps.iloc[0])
                worst[b] = min(worst[b], ob / rb)
                cells += [f"{ob:.1f}", f"{ob / rb:.3f}"]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"Lowest ratio at >= 128 MiB, {b}: {w:.3f}" for b, w in worst.items()]
    return "\n".join(lines)


def latency_table(logdir: Path, refdir: Path, np_: int) -> str:
    ref_e = read_results(refdir / f"all_reduce_np{np_}_small_n200.txt")
    ref_g = read_results(refdir / f"all_reduce_np{np_}_small_graph.txt")
    cols, data = [], {}
    for b in ("nccl", "cupy"):
        for mode in ("eager", "graph"):
            path = logdir / f"small_{b}_{mode}_np{np_}.json"
            if path.exists():
                doc = json.loads(path.read_text())
                cols.append((b, mode))
                data[(b, mode)] = {r["size"]: (r["out_of_place"]["time"], r["host_us"]["out_of_place"])
                                   for r in doc["results"]}
    head = "| size | nccl-tests eager (-n 200) | nccl-tests -G 100 | " + " | ".join(
        f"{'torch NCCL' if b == 'nccl' else 'CuPy'} {m} (ratio)" for b, m in cols) + " |"
    lines = [head, "| ---: | ---: | ---: | " + " | ".join("---:" for _ in cols) + " |"]
    e = ref_e[ref_e.placement == "out_of_place"].set_index("size_bytes").time_us
    g = ref_g[ref_g.placement == "out_of_place"].set_index("size_bytes").time_us
    for size in sorted(e.index):
        cells = [str(size), f"{e[size]:.2f}", f"{g[size]:.2f}"]
        for b, m in cols:
            t = data[(b, m)].get(size, (float("nan"),))[0]
            refv = e[size] if m == "eager" else g[size]
            cells.append(f"{t:.2f} ({t / refv:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for b, m in cols:
        hosts = [h for _, h in data[(b, m)].values()]
        lines.append(f"- host time per call issued, {b} {m}: median {sorted(hosts)[len(hosts) // 2]:.1f} us "
                     f"({'per op inside graph replays' if m == 'graph' else 'Python + library launch cost'})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("logdir", type=Path)
    ap.add_argument("refdir", type=Path)
    ap.add_argument("--np", type=int, default=4)
    a = ap.parse_args(argv)
    print(busbw_table(a.logdir, a.refdir, a.np))
    print()
    print(latency_table(a.logdir, a.refdir, a.np))
    return 0


if __name__ == "__main__":
    sys.exit(main())
