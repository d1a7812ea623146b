"""Per-size noise of a `tune` run and of a `tune --verify` run, from the files they wrote:
whether each size met the precision target, and what the run found.

    python benchmarks/tune_noise.py TUNED/tune.json [VERIFIED/verify.json] [--target 3]

For tune.json, per collective and size: the noise (largest spread of any configuration's
repeats timed like the default), how the configurations were timed, the verdict and its
confirmation. For verify.json: per size the noise the verdict used, the change and the
verdict. Exit 0 when every judged size's noise is within --target %, 1 otherwise, 2 on a
file that cannot be read."""

from __future__ import annotations

import argparse
import json
import sys


def size_text(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def pct(x) -> str:
    return "N/A" if x is None else f"{x:.1f}%"


def tune_lines(doc: dict, target: float) -> tuple[list[str], int]:
    lines, over = [f"# {doc.get('nccl', '?')}, {doc.get('ranks')} rank(s) on {doc.get('nodes')} node(s), "
                   f"{doc.get('repeat')} repeat(s); timing: {doc.get('timing') or 'not recorded'}"], 0
    for coll, c in doc.get("collectives", {}).items():
        timings = c.get("timing", {})
        base = timings.get("default", {}).get("timing")
        unlike = sorted(k for k, t in timings.items() if t.get("timing") != base)
        lines.append(f"## {coll} (timing: {base or 'unknown'}"
                     + (f"; timed unlike the default: {', '.join(unlike)})" if unlike else ")"))
        lines.append(f"{'size':>8s} {'noise':>7s} {'target':>6s}  {'best':<18s} {'gain':>8s}  verdict")
        for v in c.get("verdicts", []):
            ok = v["noise_pct"] is not None and v["noise_pct"] <= target
            over += 0 if ok else 1
            gain = f"{v['gain_pct']:+.1f}%" if v.get("gain_pct") is not None else "-"
            why = v["why"] + (f"; {v['confirmation']}" if v.get("confirmation") and v.get("win") else "")
            lines.append(f"{size_text(v['size']):>8s} {pct(v['noise_pct']):>7s} {'ok' if ok else 'OVER':>6s}  "
                         f"{(v.get('best') or '-'):<18s} {gain:>8s}  {'WIN' if v['win'] else 'no'}: {why}")
        noises = [v["noise_pct"] for v in c.get("verdicts", []) if v["noise_pct"] is not None]
        if noises:
            lines.append(f"# {coll}: noise at most {max(noises):.1f}% over {len(noises)} size(s) (target {target:g}%)")
        if c.get("precision"):
            lines.append(f"# {c['precision']}")
    return lines, over


def verify_lines(doc: dict, target: float) -> tuple[list[str], int]:
    lines, over = [f"# --verify: {doc.get('verdict')}"], 0
    for coll, c in doc.get("collectives", {}).items():
        lines.append(f"## {coll} --verify")
        lines.append(f"{'size':>8s} {'noise':>7s} {'target':>6s} {'change':>8s}  verdict")
        for s in c.get("sizes", []):
            ok = s["noise_pct"] is not None and s["noise_pct"] <= target
            over += 0 if ok else 1
            change = f"{s['change_pct']:+.1f}%" if s.get("change_pct") is not None else "-"
            lines.append(f"{size_text(s['size']):>8s} {pct(s['noise_pct']):>7s} {'ok' if ok else 'OVER':>6s} "
                         f"{change:>8s}  {s['why']}")
    return lines, over


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="tune.json and/or verify.json")
    parser.add_argument("--target", type=float, default=3.0, help="largest noise in %% a size may show")
    args = parser.parse_args(argv)
    over = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"tune_noise: cannot read {path}: {exc}", file=sys.stderr)
            return 2
        lines, n = verify_lines(doc, args.target) if "verdict" in doc else tune_lines(doc, args.target)
        print("\n".join([f"# {path}"] + lines))
        over += n
    print(f"# sizes over the {args.target:g}% noise target: {over}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
