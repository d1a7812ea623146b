"""False alarms and detections of `ncclbench compare` used as a CI gate, measured.

    NCCL_NVLS_ENABLE=0 python benchmarks/gate_rates.py --out DIR            # GPUs: -g 4, NCCL
    python benchmarks/gate_rates.py --cpu --out DIR                         # gloo on the CPU
    python benchmarks/gate_rates.py --judge DIR                             # runs recorded before

Runs the same sweep HEALTHY times back to back (nothing changed), then once with each
planted regression, and compares with compare's defaults (busbw, 5%):
  healthy pairs        run i against run i+1 (HEALTHY - 1 pairs): every failure is a false alarm;
  baseline             `ncclbench baseline` of the first three runs against each later run;
  planted              the first run against a run with NCCL_MAX_NCHANNELS=2 (large sizes),
                       NCCL_PROTO=Simple (small sizes) and a late rank (the `slow` fault: rank 1
                       waits for its GPU and sleeps LATE_US after every call); on the CPU only
                       the late rank, 2 ms per call.
--judge DIR judges runs recorded before (DIR/healthy*.json in order, DIR/planted*.json; e.g.
tests/fixtures/gate/h200-4gpu) with today's rule, on any machine, and runs nothing.
Each comparison is also judged by the threshold alone (the noise dropped), the rule before
results carried their noise, for contrast. Prints a markdown table; writes DIR/gate_rates.json
and every run's JSON. GPU defaults: allreduce -g 4 -b 8 -e 256M -f 4 (14 sizes, 20 iterations,
~10 s a run on 4 H100s with start-up), 11 healthy runs: about 3 minutes with the planted runs."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _run(cmd: list[str], path: Path, env: dict) -> dict:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ncclbench", *cmd, "-J", str(path), "--no-save"],
                       env=dict(os.environ, **env), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} {env}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return {"path": str(path), "env": env, "seconds": round(time.monotonic() - start, 1)}


def _judge(base: Path, new: Path) -> dict:
    """compare's verdict with the noise, and the threshold-only verdict without it."""
    from ncclbench.results.compare import REGRESSION, WITHIN_NOISE, compare_frames
    from ncclbench.results.readers import read_results

    a, b = read_results(base), read_results(new)
    out = {}
    for name, frames in (("noise", (a, b)), ("threshold_only", (_bare(a), _bare(b)))):
        c = compare_frames(*frames)
        rows = c.rows[c.rows["status"] == REGRESSION]
        out[name] = {"failed": c.failed, "regressions": len(rows),
                     "sizes": sorted({int(s) for s in rows["size_bytes"]}),
                     "within_noise": c.count(WITHIN_NOISE)}
    return out


def _bare(frame):
    return frame.drop(columns=[c for c in frame.columns if c.startswith("noise_")])


def _size_text(sizes: list[int]) -> str:
    from ncclbench.sizes import format_size

    if not sizes:
        return "-"
    return format_size(sizes[0]) if len(sizes) == 1 else f"{format_size(sizes[0])}..{format_size(sizes[-1])} ({len(sizes)})"


def _baseline(paths: list[Path], out: Path) -> Path:
    from ncclbench.results.baseline import make_baseline

    docs = make_baseline([str(p) for p in paths])
    out.write_text(json.dumps(docs[0] if len(docs) == 1 else docs))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="gloo ranks on the CPU (a late rank only)")
    parser.add_argument("--out", help="folder for the runs and gate_rates.json")
    parser.add_argument("--judge", metavar="DIR", help="judge the runs recorded in DIR, run nothing")
    parser.add_argument("-g", "--ranks", type=int, default=None, help="ranks (4 on GPUs, 2 on the CPU)")
    parser.add_argument("--healthy", type=int, default=11, help="healthy runs (pairs: one fewer)")
    parser.add_argument("--sweep", default=None, help="-b/-e/-f and more, as one string")
    parser.add_argument("--late-us", type=float, default=None, help="the late rank's delay per call (100 us on GPUs, 2000 on the CPU)")
    a = parser.parse_args()
    if a.judge:
        print(_table(judge_recorded(Path(a.judge))))
        return 0
    if not a.out:
        parser.error("--out is required (or --judge DIR)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ranks = a.ranks or (2 if a.cpu else 4)
    sweep = (a.sweep or ("-b 8 -e 1M -f 4" if a.cpu else "-b 8 -e 256M -f 4")).split()
    cmd = ["allreduce", "-g", str(ranks), *sweep] + (["--backend", "gloo"] if a.cpu else [])
    late_us = a.late_us or (2000.0 if a.cpu else 100.0)
    planted = {"late rank": {"NCCLBENCH_FAULT": f"slow:rank=1,us={late_us:g}"}}
    if not a.cpu:
        planted = {"NCCL_MAX_NCHANNELS=2": {"NCCL_MAX_NCHANNELS": "2"},
                   "NCCL_PROTO=Simple": {"NCCL_PROTO": "Simple"}, **planted}

    started = time.monotonic()
    runs = [_run(cmd, out / f"healthy{i}.json", {}) for i in range(a.healthy)]
    planted_runs = {name: _run(cmd, out / f"planted{k}.json", env) for k, (name, env) in enumerate(planted.items())}
    results = _judge_all("ncclbench " + " ".join(cmd), runs, planted_runs, out)
    results["late_us"] = late_us
    results["seconds"] = round(time.monotonic() - started, 1)
    (out / "gate_rates.json").write_text(json.dumps(results, indent=1) + "\n")
    print(_table(results))
    return 0


def _judge_all(command: str, runs: list, planted_runs: dict, scratch: Path) -> dict:
    healthy = [Path(r["path"]) for r in runs]
    results = {"command": command, "runs": runs, "planted_runs": planted_runs, "pairs": [], "baseline": [],
               "planted": {}}
    for i in range(len(healthy) - 1):
        results["pairs"].append(dict(_judge(healthy[i], healthy[i + 1]), pair=[i, i + 1]))
    if len(healthy) > 3:
        base = _baseline(healthy[:3], scratch / "baseline.json")
        for i in range(3, len(healthy)):
            results["baseline"].append(dict(_judge(base, healthy[i]), run=i))
    for name, run in planted_runs.items():
        results["planted"][name] = _judge(healthy[0], Path(run["path"]))
    return results


def judge_recorded(folder: Path) -> dict:
    """_judge_all() on the runs of a folder: healthy*.json (in natural order) and planted*.json."""
    import re
    import tempfile

    def natural(p: Path):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    healthy = sorted(folder.glob("healthy*.json"), key=natural)
    if len(healthy) < 2:
        raise SystemExit(f"{folder}: fewer than two healthy*.json runs")
    recorded = json.loads((folder / "gate_rates.json").read_text()) if (folder / "gate_rates.json").exists() else {}
    names = {Path(r["path"]).name: name for name, r in recorded.get("planted_runs", {}).items()}
    planted = {names.get(p.name, p.stem): {"path": str(p)} for p in sorted(folder.glob("planted*.json"), key=natural)}
    command = recorded.get("command") or _command_of(healthy[0])
    with tempfile.TemporaryDirectory() as scratch:
        results = _judge_all(command, [{"path": str(p)} for p in healthy], planted, Path(scratch))
    results["seconds"] = 0.0
    return results


def _command_of(path: Path) -> str:
    doc = json.loads(path.read_text())
    args = doc.get("args") if isinstance(doc, dict) else None
    if not isinstance(args, list):
        return path.name
    kept, skip = [], False
    for arg in args:  # the run's own file and --no-save say nothing of the sweep
        if skip or arg == "--no-save":
            skip = False
            continue
        if arg in ("-J", "--json"):
            skip = True
            continue
        kept.append(str(arg))
    return "ncclbench " + " ".join(kept)


def _table(results: dict) -> str:
    def rate(items, rule):
        return f"{sum(1 for x in items if x[rule]['failed'])} of {len(items)}"

    took = f", {results['seconds']:.0f} s in all" if results.get("seconds") else " (recorded before)"
    lines = [f"`{results['command']}`, {len(results['runs'])} healthy runs{took}", "",
             "| comparison | fails (noise rule) | fails (threshold only) | rows within noise |",
             "| --- | --- | --- | --- |"]
    for label, items in (("healthy pairs (run i vs i+1)", results["pairs"]),
                         ("baseline of runs 0-2 vs each later run", results["baseline"])):
        if items:
            noisy = sum(x["noise"]["within_noise"] for x in items)
            lines.append(f"| {label} | {rate(items, 'noise')} | {rate(items, 'threshold_only')} | {noisy} |")
    lines += ["", "| planted | caught (noise rule) | regressed sizes | threshold only |", "| --- | --- | --- | --- |"]
    for name, verdict in results["planted"].items():
        n, t = verdict["noise"], verdict["threshold_only"]
        lines.append(f"| {name} | {'yes' if n['failed'] else 'NO'} ({n['regressions']} rows) | {_size_text(n['sizes'])} "
                     f"| {'yes' if t['failed'] else 'no'} ({t['regressions']} rows) |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
