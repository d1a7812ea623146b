#!/usr/bin/env python3
"""ncclbench's speed targets against nccl-tests, checked in one go from a gpu_validate.sh log folder.

    python benchmarks/speed_targets.py LOGDIR --reference-dir tests/fixtures/nccl-tests/h200-4gpu-nvswitch --np 4
    python benchmarks/speed_targets.py LOGDIR --reference-dir ... --np 4 --tag _b   # the second latency run

Reads what the stages wrote (full_{nccl,cupy}[_graph]_npN.csv, small_{nccl,cupy}_{eager,graph}_npN<tag>.json)
and the nccl-tests reference files, and prints one markdown line per target:

- busbw at >= 64 MiB, out-of-place, every collective the reference has, each backend/mode:
  ncclbench / nccl-tests >= 0.98;
- all_reduce time at 8 B - 4 KiB, out-of-place: CuPy eager / all_reduce_npN_small_n200.txt <= 1.15, and -G on either
  backend / all_reduce_npN_small_graph.txt <= 1.15;
- torch eager at 8 B - 4 KiB: ratio and host cost per call, reported only (no target).

The rows are matched and classified by ncclbench's own `compare` (the threshold rules of
`ncclbench compare --threshold 2%` / `--metric time --threshold 15%`). A target whose files
or rows are missing is NOT MEASURED, never passed.

Exit codes: 0 every target met, 1 a target missed or not measured, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

MODES = {  # file stem part -> how the tables name it
    "nccl": "torch NCCL eager",
    "cupy": "CuPy eager",
    "nccl_graph": "torch NCCL -G",
    "cupy_graph": "CuPy -G",
}
BUSBW_MIN_SIZE = 64 << 20
BUSBW_THRESHOLD = 0.02   # >= 0.98 x the reference
SMALL_MAX_SIZE = 4096
TIME_THRESHOLD = 0.15    # <= 1.15 x the reference


@dataclass
class Verdict:
    target: str
    status: str          # "met", "MISSED", "NOT MEASURED", "report"
    worst: float | None  # the worst ratio (lowest busbw ratio, highest time ratio)
    where: str           # the row that gave it, or why nothing was measured
    rows: int = 0

    def line(self) -> str:
        worst = f"{self.worst:.3f}" if self.worst is not None else "-"
        return f"| {self.target} | {self.status} | {worst} | {self.rows} | {self.where} |"


def verdict_table(verdicts: list[Verdict]) -> list[str]:
    return ["| target | verdict | worst ratio | rows | worst row / notes |",
            "| --- | --- | ---: | ---: | --- |"] + [v.line() for v in verdicts]


def find_log(logdir: Path, stem: str) -> Path | None:
    for ext in (".csv", ".json", ".txt"):
        path = logdir / f"{stem}{ext}"
        if path.exists():
            return path
    return None


def _compare(ref, ours, metric: str, threshold: float, min_size=None, max_size=None):
    from ncclbench.results.compare import compare_frames
    from ncclbench.results.readers import filter_results

    keep = dict(placement="out_of_place", min_size=min_size, max_size=max_size)
    return compare_frames(filter_results(ref, **keep), filter_results(ours, **keep), metric, threshold)


def _worst_row(rows, metric: str):
    pick = rows.ratio.idxmin() if metric == "busbw" else rows.ratio.idxmax()
    return rows.loc[pick]


def _judge(target: str, comparisons: list, metric: str) -> Verdict:
    """One verdict over several comparisons: missed if any row regressed or is wrong."""
    import pandas as pd

    rows = pd.concat([c.rows for c in comparisons], ignore_index=True) if comparisons else None
    if rows is None or rows.empty or rows.ratio.isna().all():
        return Verdict(target, "NOT MEASURED", None, "no row matched the reference")
    worst = _worst_row(rows.dropna(subset=["ratio"]), metric)
    failed = [c for c in comparisons if c.failed]
    wrong = int(sum(c.count("wrong") for c in comparisons))
    where = f"{worst.collective} {worst.size_bytes} B"
    if wrong:
        where += f"; {wrong} row(s) with wrong results"
    return Verdict(target, "MISSED" if failed else "met", float(worst.ratio), where, len(rows))


def busbw_verdicts(logdir: Path, refdir: Path, np_: int) -> list[Verdict]:
    from ncclbench.results.readers import read_results

    verdicts = []
    for mode, title in MODES.items():
        target = f"busbw >= 64 MiB, {title}: >= {1 - BUSBW_THRESHOLD:.2f} x"
        path = find_log(logdir, f"full_{mode}_np{np_}")
        if path is None:
            verdicts.append(Verdict(target, "NOT MEASURED", None, f"no full_{mode}_np{np_}.csv"))
            continue
        ours = read_results(path)
        comparisons, missing = [], []
        for ref_path in sorted(refdir.glob(f"*_np{np_}.txt")):
            ref = read_results(ref_path)
            coll = ref.collective.iloc[0]
            mine = ours[ours.collective == coll]
            if mine.empty:
                missing.append(coll)
                continue
            comparisons.append(_compare(ref, mine, "busbw", BUSBW_THRESHOLD, min_size=BUSBW_MIN_SIZE))
        verdict = _judge(target, comparisons, "busbw")
        if missing:
            verdict.status = "NOT MEASURED" if verdict.status == "met" else verdict.status
            verdict.where += f"; not run: {', '.join(missing)}"
        verdicts.append(verdict)
    return verdicts


def median_host_us(path: Path) -> float | None:
    """Median host time per call (ncclbench's JSON `host_us`, out-of-place), if the file has it."""
    if path.suffix != ".json":
        return None
    doc = json.loads(path.read_text())
    hosts = [r["host_us"]["out_of_place"] for r in doc.get("results", [])
             if isinstance(r.get("host_us"), dict) and r["host_us"].get("out_of_place") is not None
             and 0 < r.get("size", 0) <= SMALL_MAX_SIZE]
    return statistics.median(hosts) if hosts else None


def latency_verdicts(logdir: Path, refdir: Path, np_: int, tag: str) -> list[Verdict]:
    from ncclbench.results.readers import read_results

    refs = {"eager": refdir / f"all_reduce_np{np_}_small_n200.txt", "graph": refdir / f"all_reduce_np{np_}_small_graph.txt"}
    cases = [("cupy", "eager", True), ("nccl", "graph", True), ("cupy", "graph", True), ("nccl", "eager", False)]
    verdicts = []
    for backend, mode, is_target in cases:
        title = f"{'CuPy' if backend == 'cupy' else 'torch NCCL'} {'-G' if mode == 'graph' else 'eager'}"
        target = f"all_reduce 8 B - 4 KiB time, {title}: " + (f"<= {1 + TIME_THRESHOLD:.2f} x" if is_target else "report")
        path = find_log(logdir, f"small_{backend}_{mode}_np{np_}{tag}")
        if path is None or not refs[mode].exists():
            missing = f"small_{backend}_{mode}_np{np_}{tag}.json" if path is None else str(refs[mode])
            verdicts.append(Verdict(target, "NOT MEASURED", None, f"no {missing}"))
            continue
        comparison = _compare(read_results(refs[mode]), read_results(path), "time", TIME_THRESHOLD,
                              max_size=SMALL_MAX_SIZE)
        verdict = _judge(target, [comparison], "time")
        host = median_host_us(path)
        if host is not None:
            verdict.where += f"; host time per call (median) {host:.1f} us"
        if not is_target and verdict.status != "NOT MEASURED":
            verdict.status = "report"
        verdicts.append(verdict)
    return verdicts


def log_folder_args(argv, doc: str) -> argparse.Namespace:
    """LOGDIR --reference-dir DIR [--np N] [--tag T], as this script and report.py take them;
    a folder that is not there ends the program with one line and exit 2."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logdir", type=Path, help="a gpu_validate.sh log folder ($OUT/logs)")
    ap.add_argument("--reference-dir", type=Path, required=True, help="nccl-tests files for this host type")
    ap.add_argument("--np", type=int, default=4, help="rank count of the run and the reference files")
    ap.add_argument("--tag", default="", help="TAG of the latency logs (e.g. _b)")
    args = ap.parse_args(argv)
    for folder, what in ((args.logdir, "log folder"), (args.reference_dir, "reference folder")):
        if not folder.is_dir():
            ap.exit(2, f"{ap.prog}: error: {what} {folder} is not a folder\n")
    return args


def read_errors() -> tuple[type[Exception], ...]:
    """What an unreadable or malformed log file raises (one error line, exit 2)."""
    from ncclbench.results.readers import ResultsFormatError

    return ResultsFormatError, OSError, ValueError, KeyError


def main(argv=None) -> int:
    args = log_folder_args(argv, __doc__)
    try:
        verdicts = busbw_verdicts(args.logdir, args.reference_dir, args.np)
        verdicts += latency_verdicts(args.logdir, args.reference_dir, args.np, args.tag)
    except read_errors() as exc:
        print(f"speed_targets.py: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict_table(verdicts)))
    judged = [v for v in verdicts if v.status != "report"]
    met = sum(v.status == "met" for v in judged)
    print(f"\n{met} of {len(judged)} targets met")
    return 0 if met == len(judged) else 1

if __name__ == "__main__":
    sys.exit(main())
