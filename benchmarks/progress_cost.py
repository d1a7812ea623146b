"""What reading a hang's GPU progress costs the timing: the same one-GPU sweeps with two
checkouts (the code before the census read the timed loop's marks, and after), run in turn
`--repeat` times each. Per mode and size: the median in-place time of each checkout, their
ratio, and each checkout's own run-to-run spread; a size is "within noise" when the ratio is
within the larger spread. Markdown on stdout and in OUT/progress_cost.md, the raw times in
OUT/progress_cost.json.

    NCCL_NVLS_ENABLE=0 python benchmarks/progress_cost.py --base /tmp/base --new . --out DIR"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROW = re.compile(r"^\s+\d+\s+\d+\s")
MODES = {  # name -> the ncclbench arguments (one rank on GPU 0)
    "nccl eager": ["allreduce", "-g", "1", "-b", "8", "-e", "64M", "-f", "8", "-n", "100", "-w", "10"],
    "nccl -G": ["allreduce", "-g", "1", "-b", "8", "-e", "64M", "-f", "8", "-n", "10", "-G", "20", "-w", "10"],
    "cupy eager": ["allreduce", "-g", "1", "-b", "8", "-e", "64M", "-f", "8", "-n", "100", "-w", "10",
                   "--backend", "cupy"],
}


def run_once(checkout: Path, args: list[str], log: Path) -> dict[int, float]:
    """size -> in-place time (us) of one run of `checkout`'s ncclbench."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, "-m", "ncclbench", *args, "--no-save"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=300)
    log.write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: exit {proc.returncode}: {proc.stderr[-500:]}")
    return {int(f[0]): float(f[9]) for f in (line.split() for line in proc.stdout.splitlines() if ROW.match(line))}


def spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return 100.0 * (max(values) - min(values)) / statistics.median(values) if values else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, type=Path, help="checkout of the code before")
    ap.add_argument("--new", default=Path("."), type=Path, help="checkout of the code after (default: .)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=float, default=1e9, help="seconds after which no new round starts")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of: " + ", ".join(MODES))
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    times: dict = {}
    started = time.time()
    failed: set = set()
    for k in range(a.repeat):  # every mode in each round: a budget cut still leaves each mode measured
        if k and time.time() - started > a.budget:
            print(f"# budget of {a.budget:g} s spent after {k} round(s)", file=sys.stderr)
            break
        for mode in [m for m in a.modes.split(",") if m not in failed]:
            for side, checkout in (("base", a.base), ("new", a.new)):  # in turn: drift hits both alike
                tag = f"{mode.replace(' ', '_')}.{side}.{k}"
                try:
                    got = run_once(checkout.resolve(), MODES[mode], a.out / f"cost.{tag}.txt")
                except Exception as exc:  # noqa: BLE001 - one mode failing (no CuPy) leaves the others
                    print(f"# {mode} ({side}): {exc}", file=sys.stderr)
                    failed.add(mode)
                    break
                for size, us in got.items():
                    times.setdefault(mode, {}).setdefault(size, {}).setdefault(side, []).append(us)
    lines = ["| mode | size (B) | before (us, median) | after (us, median) | after / before | spread before | "
             "spread after | verdict |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for mode, sizes in times.items():
        for size, sides in sorted(sizes.items()):
            if not sides.get("base") or not sides.get("new"):
                continue
            b, n = statistics.median(sides["base"]), statistics.median(sides["new"])
            noise = max(spread(sides["base"]), spread(sides["new"]))
            ratio = n / b if b else float("nan")
            verdict = "within noise" if abs(ratio - 1) * 100 <= noise else "OUTSIDE noise"
            lines.append(f"| {mode} | {size} | {b:.2f} | {n:.2f} | {ratio:.3f} | {spread(sides['base']):.1f} % | "
                         f"{spread(sides['new']):.1f} % | {verdict} |")
    text = "\n".join(lines) + f"\n\nup to {a.repeat} runs of each checkout per mode, in turn; {time.time() - started:.0f} s\n"
    print(text)
    (a.out / "progress_cost.md").write_text(text)
    (a.out / "progress_cost.json").write_text(json.dumps(times, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
