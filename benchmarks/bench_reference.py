#!/usr/bin/env python3
"""ncclbench vs nccl-tests, size by size, as a ratio table.

Either runs a fresh sweep (--run) or reads result files (JSON/CSV/text from ncclbench),
then matches every row with the reference nccl-tests output and prints markdown:

  # run all collectives on 4 GPUs with the CuPy backend and compare with the 4-GPU reference
  python benchmarks/bench_reference.py --run all -g 4 --backend cupy \\
      --reference-dir tests/fixtures/nccl-tests/h200-4gpu-nvswitch
  # small-message latency under CUDA graphs against the reference -G 100 file
  python benchmarks/bench_reference.py --run allreduce -g 4 --backend nccl --extra "-b 8 -e 1M -f 8 -G 100" \\
      --reference tests/fixtures/nccl-tests/h200-4gpu-nvswitch/all_reduce_np4_small_graph.txt --metric time
  # existing results
  python benchmarks/bench_reference.py results/run.json --reference-dir ... --np 4
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ALL = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "gather", "scatter", "sendrecv"]


def run_sweep(colls, ngpus, backend, extra) -> list[str]:
    out = tempfile.mkdtemp(prefix="bench_ref_")
    paths = []
    for c in colls:
        path = os.path.join(out, f"{c}.json")
        cmd = ["ncclbench", c, "-g", str(ngpus), "--backend", backend, "--no-save", "-J", path]
        cmd += shlex.split(extra) if extra else ["-b", "8", "-e", "4G", "-f", "4"]
        print("#", " ".join(cmd), file=sys.stderr, flush=True)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if r.returncode != 0:
            print(f"# {c}: ncclbench exited {r.returncode}", file=sys.stderr)
        if os.path.exists(path):
            paths.append(path)
    return paths


def compare(ours, ref, metric: str, min_size: int):
    """(every out-of-place row with size > 0, those >= min_size): reference, ours, ratio
    (ours / reference), matched the way `ncclbench compare` matches (reference as BASE)."""
    from ncclbench.results.compare import compare_frames

    rows = compare_frames(ref, ours, metric).rows.rename(columns={"base": "reference", "new": "ours"})
    m = rows[rows.placement == "out_of_place"].sort_values(["collective", "size_bytes"], kind="stable")
    return m, m[m.size_bytes >= min_size]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="*", help="ncclbench result files (JSON, CSV or text)")
    ap.add_argument("--run", help="collectives to run first: 'all' or a comma list (allreduce,allgather)")
    ap.add_argument("-g", "--ngpus", type=int, default=4)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--extra", default="", help="extra ncclbench options (default -b 8 -e 4G -f 4)")
    ap.add_argument("--reference-dir", help="folder with <coll>_np<N>.txt nccl-tests files")
    ap.add_argument("--reference", help="one nccl-tests file to compare every result with")
    ap.add_argument("--np", type=int, default=None, help="rank count of the reference files (default -g)")
    ap.add_argument("--metric", choices=["busbw", "time"], default="busbw")
    ap.add_argument("--min-size", default="64M", help="summary over sizes >= this (default 64M)")
    args = ap.parse_args(argv)

    from ncclbench.results.readers import read_results
    from ncclbench.sizes import parse_size

    paths = list(args.results)
    if args.run:
        paths += run_sweep(ALL if args.run == "all" else args.run.split(","), args.ngpus, args.backend, args.extra)
    if not paths or not (args.reference_dir or args.reference):
        ap.error("need result files or --run, and --reference-dir or --reference")
    np_ = args.np or args.ngpus
    min_size = parse_size(args.min_size)
    worst = None
    print(f"| collective | size (B) | reference {args.metric} | ncclbench {args.metric} | ratio |")
    print("| --- | ---: | ---: | ---: | ---: |")
    summaries = []
    for path in paths:
        ours = read_results(path)
        for coll in sorted(ours.collective.unique()):
            ref_path = Path(args.reference) if args.reference else Path(args.reference_dir) / f"{coll}_np{np_}.txt"
            if not ref_path.exists():
                print(f"# no reference {ref_path}", file=sys.stderr)
                continue
            rows, big = compare(ours[ours.collective == coll], read_results(ref_path), args.metric, min_size)
            for _, r in rows.iterrows():
                print(f"| {coll} | {r.size_bytes} | {r.reference:.2f} | {r.ours:.2f} | {r.ratio:.3f} |")
            if len(big):
                lo = big.ratio.min() if args.metric == "busbw" else big.ratio.max()
                summaries.append((coll, lo, len(big)))
                worst = lo if worst is None else (min(worst, lo) if args.metric == "busbw" else max(worst, lo))
    print()
    word = "lowest" if args.metric == "busbw" else "highest"
    for coll, lo, n in summaries:
        print(f"- {coll}: {word} ratio over {n} sizes >= {args.min_size}: {lo:.3f}")
    if worst is not None:
        print(f"- overall {word} ratio: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
