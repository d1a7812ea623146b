#!/usr/bin/env python3
"""docs/BENCHMARKS.md's tables, printed as markdown from one gpu_validate.sh log folder.

    python benchmarks/report.py LOGDIR --reference-dir tests/fixtures/nccl-tests/h200-4gpu-nvswitch --np 4 > tables.md

LOGDIR is what `benchmarks/gpu_validate.sh` wrote ($OUT/logs, unpacked from logs.tgz). Each
section is printed only when its stage's files are there; the sections with nothing to show
are named on stderr. The ratio tables match rows the way `ncclbench compare` does
(bench_reference.py) and the target verdicts are speed_targets.py's, so the document, the
ad-hoc comparison and the gate can never disagree.

Exit codes: 0 printed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from bench_reference import compare

from ncclbench.topology.p2p import format_size as _size
from speed_targets import (BUSBW_MIN_SIZE, MODES, busbw_verdicts, find_log, latency_verdicts, log_folder_args,
                           median_host_us, read_errors, verdict_table)

LATENCY_MODES = {"nccl_eager": "torch NCCL eager", "cupy_eager": "CuPy eager",
                 "nccl_graph": "torch NCCL -G 100", "cupy_graph": "CuPy -G 100"}


def _agg_logs():
    """(file of the agg stage, row title), in the table's order."""
    for backend, name in (("cupy", "CuPy"), ("nccl", "torch")):
        for mode, how in (("eager", "eager"), ("graph", "-G 20")):
            for m in (1, 4):
                yield f"agg_{backend}_m{m}_{mode}.txt", f"{name} {how}, -m {m}"


def _cell(value: float | None, ratio: float | None = None, digits: int = 1) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}" + (f" ({ratio:.3f})" if ratio is not None and ratio == ratio else "")


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    align = ["---"] * left + ["---:"] * (len(head) - left)
    return ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"] + ["| " + " | ".join(r) + " |" for r in rows]


# ------------------------------------------------------------------------------- host

def host_section(logdir: Path) -> list[str]:
    env = logdir / "env.txt"
    if not env.exists():
        return []
    text = env.read_text(errors="replace")
    gpus = re.findall(r"^GPU \d+: (.+?) \(UUID", text, re.M)
    driver = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text)
    versions = re.search(r"^torch (\S+) NCCL (\S+) CuPy (\S+)", text, re.M)
    commit = re.search(r"^commit (\S+)", text, re.M)
    summary = None
    for name, key in (("topo.json", "summary"), ("p2p.json", "topology_summary")):
        try:
            summary = summary or json.loads((logdir / name).read_text()).get(key)
        except (OSError, ValueError):
            pass
    parts = [summary or (f"{len(gpus)}x {gpus[0]}" if gpus else "GPUs not listed")]
    if driver:
        parts.append(f"driver {driver.group(1)}, CUDA {driver.group(2)}")
    if versions:
        parts.append(f"torch {versions.group(1)}, NCCL {versions.group(2)}, CuPy {versions.group(3)}")
    lines = ["## Host", "", "; ".join(parts) + "."]
    if commit:
        lines.append(f"Code: commit {commit.group(1)}.")
    return lines


# ------------------------------------------------------------------------------ busbw

def busbw_section(logdir: Path, refdir: Path, np_: int) -> list[str]:
    """Out-of-place busbw at >= 64 MiB per collective, every backend/mode present."""
    from ncclbench.results.readers import read_results

    runs = {mode: read_results(path) for mode in MODES if (path := find_log(logdir, f"full_{mode}_np{np_}"))}
    if not runs:
        return []
    cells: dict[tuple[str, int], dict] = {}
    worst: dict[str, tuple[float, str]] = {}
    wrong = {mode: int((frame.nwrong.fillna(0) > 0).sum()) for mode, frame in runs.items()}
    for ref_path in sorted(refdir.glob(f"*_np{np_}.txt")):
        ref = read_results(ref_path)
        coll = ref.collective.iloc[0]
        for mode, ours in runs.items():
            _, big = compare(ours[ours.collective == coll], ref, "busbw", BUSBW_MIN_SIZE)
            for _, r in big.iterrows():
                row = cells.setdefault((coll, int(r.size_bytes)), {"ref": r.reference})
                row[mode] = (r.ours, r.ratio)
                if r.ratio == r.ratio and r.ratio < worst.get(mode, (9e9, ""))[0]:
                    worst[mode] = (r.ratio, f"{coll} {_size(int(r.size_bytes))}")
    if not cells:
        return []
    head = ["collective", "size", "nccl-tests"] + [MODES[m] for m in runs]
    rows = [[coll, _size(size), _cell(row["ref"])] + [_cell(*row.get(m, (None, None))) for m in runs]
            for (coll, size), row in sorted(cells.items())]
    lines = [f"## busbw vs nccl-tests at >= 64 MiB ({np_} GPUs)", "",
             f"Out-of-place busbw (GB/s) and its ratio to nccl-tests (`<coll>_np{np_}.txt`).", ""]
    lines += _table(head, rows, left=2) + [""]
    for mode in runs:
        low = worst.get(mode)
        lines.append(f"- {MODES[mode]}: lowest ratio {low[0]:.3f} ({low[1]})" if low else f"- {MODES[mode]}: no row")
        lines[-1] += f"; rows with #wrong > 0: {wrong[mode]}"
    return lines


# ---------------------------------------------------------------------------- latency

def latency_section(logdir: Path, refdir: Path, np_: int, tag: str) -> list[str]:
    """all_reduce time at the reference's small sizes, eager and -G, both backends."""
    from ncclbench.results.readers import read_results

    refs = {"eager": refdir / f"all_reduce_np{np_}_small_n200.txt", "graph": refdir / f"all_reduce_np{np_}_small_graph.txt"}
    runs = {key: path for key in LATENCY_MODES if (path := find_log(logdir, f"small_{key}_np{np_}{tag}"))}
    if not runs or not all(p.exists() for p in refs.values()):
        return []
    ref_frames = {mode: read_results(path) for mode, path in refs.items()}
    table: dict[int, dict] = {}
    for key, path in runs.items():
        rows, _ = compare(read_results(path), ref_frames[key.split("_")[1]], "time", 0)
        for _, r in rows.iterrows():
            table.setdefault(int(r.size_bytes), {})[key] = (r.ours, r.ratio)
    for mode, frame in ref_frames.items():
        out = frame[frame.placement == "out_of_place"]
        for size, t in zip(out.size_bytes, out.time_us):
            table.setdefault(int(size), {})[mode] = t
    head = ["size", "nccl-tests -n 200", "nccl-tests -G 100"] + [f"{LATENCY_MODES[k]} (ratio)" for k in runs]
    rows = [[str(size), _cell(row.get("eager"), digits=2), _cell(row.get("graph"), digits=2)]
            + [_cell(*row.get(k, (None, None)), digits=2) for k in runs] for size, row in sorted(table.items())]
    lines = [f"## Small-message latency: all_reduce ({np_} GPUs)", "",
             "Out-of-place time (us) and its ratio to nccl-tests' eager (`-n 200`) or graph (`-G 100`) run.", ""]
    lines += _table(head, rows) + [""]
    for key, path in runs.items():
        host = median_host_us(path)
        if host is not None:
            lines.append(f"- {LATENCY_MODES[key]}: host time per call issued, median over 8 B - 4 KiB: {host:.1f} us")
    return lines


def targets_section(logdir: Path, refdir: Path, np_: int, tag: str) -> list[str]:
    verdicts = busbw_verdicts(logdir, refdir, np_) + latency_verdicts(logdir, refdir, np_, tag)
    if all(v.status == "NOT MEASURED" for v in verdicts):
        return []
    return ["## Speed targets", ""] + verdict_table(verdicts)


# ---------------------------------------------------------------------------- -m, pairs

def agg_section(logdir: Path) -> list[str]:
    """-m 1 vs -m 4 (each iteration's ops in one NCCL group): out-of-place time per op."""
    from ncclbench.results.readers import read_results

    found = [(title, read_results(logdir / name)) for name, title in _agg_logs() if (logdir / name).exists()]
    if not found:
        return []
    sizes = sorted({int(s) for _, f in found for s in f.size_bytes if s > 0})
    rows = []
    for title, frame in found:
        out = frame[frame.placement == "out_of_place"].set_index("size_bytes").time_us
        rows.append([title] + [_cell(out.get(s), digits=2) for s in sizes])
    return ["## -m grouping: all_reduce time per op (us)", ""] + _table(["backend, mode"] + [_size(s) for s in sizes], rows)


def topology_section(logdir: Path) -> list[str]:
    lines = []
    p2p = _json(logdir / "p2p.json")
    if p2p:
        n = len(p2p["devices"])
        uni, bi, lat = p2p["unidirectional_gbps"], p2p["bidirectional_gbps"], p2p["latency_us"]
        rows = [[str(i)] + [_cell(uni[i][j]) + (" (local)" if i == j else "") for j in range(n)] for i in range(n)]
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        lines += [f"`ncclbench p2p`: {p2p.get('topology_summary') or ''}", "",
                  f"Copy bandwidth, {_size(p2p['config']['size_bytes'])} copies (GB/s, row = source):", ""]
        lines += _table(["src \\ dst"] + [str(j) for j in range(n)], rows) + [""]
        lines.append(f"Bidirectional per pair: {_span(bi[i][j] for i, j in pairs)} GB/s; peer-copy latency "
                     f"{_span(lat[i][j] for i, j in pairs + [(j, i) for i, j in pairs])} us.")
    pairs_doc = _json(logdir / "pairs.json")
    if pairs_doc:
        each = ", ".join(f"{p['rank_a']}-{p['rank_b']} {p['busbw_gbps']:.1f}" for p in pairs_doc["pairs"])
        lines += ["", f"`ncclbench pairs`, {_size(pairs_doc['size_bytes'])} each way, busbw per direction (GB/s): {each}; "
                  f"median {pairs_doc['median_busbw_gbps']:.1f}."]
    return (["## Topology, p2p, pairs", ""] + lines) if lines else []


def _span(values) -> str:
    values = [v for v in values if v is not None]
    return f"{min(values):.1f}-{max(values):.1f}" if values else "-"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------- reliability, tests

def reliability_section(logdir: Path) -> list[str]:
    """The reliab stage: one row per planted fault (exit, wall time, message, rows kept)."""
    path = logdir / "reliab.txt"
    if not path.exists():
        return []
    rows = []
    for m in re.finditer(r"^(\w+):(\S+) exit (\d+) wall ([\d.]+) s", path.read_text(), re.M):
        kind = m.group(1)
        err = (logdir / f"rel_{kind}.err")
        message = next((ln for ln in err.read_text().splitlines() if ln.startswith("ncclbench: error")), "-") \
            if err.exists() else "-"
        doc = _json(logdir / f"rel_{kind}.json") or {}
        kept = f"{len(doc.get('results', []))} rows, JSON status `{doc.get('status', '-')}`"
        rows.append([f"`{kind}:{m.group(2)}`", m.group(3), m.group(4), f"`{message}`", kept])
    left = "no ncclbench process left" in path.read_text()
    return (["## Reliability", ""] + _table(["fault", "exit", "wall s", "message", "kept"], rows, left=1)
            + ["", "No ncclbench process was left after the runs." if left else "A process was left: see reliab.txt."])


def tests_section(logdir: Path) -> list[str]:
    lines = []
    pytest_log = logdir / "pytest_gpu.txt"
    if pytest_log.exists():
        tally = [ln.strip("= ") for ln in pytest_log.read_text().splitlines() if re.search(r"\d+ (passed|failed)", ln)]
        lines.append(f"`python -m pytest -q -m gpu tests`: {tally[-1] if tally else 'no summary line'}.")
    single = logdir / "single.txt"
    if single.exists():
        lines += ["", "The options on one GPU (stage `single`), exit codes:", "",
                  *(f"- {ln}" for ln in single.read_text().splitlines() if ln.strip())]
    return (["## GPU tests", ""] + lines) if lines else []


def startup_section(logdir: Path) -> list[str]:
    path = logdir / "startup.md"
    return ["## Start-up", "", path.read_text().rstrip()] if path.exists() else []


# ------------------------------------------------------------------------------- main

def report(logdir: Path, refdir: Path, np_: int, tag: str = "") -> tuple[list[str], list[str]]:
    """(markdown lines, names of the sections with nothing in this folder)."""
    sections = {
        "host": lambda: host_section(logdir),
        "busbw": lambda: busbw_section(logdir, refdir, np_),
        "latency": lambda: latency_section(logdir, refdir, np_, tag),
        "targets": lambda: targets_section(logdir, refdir, np_, tag),
        "-m grouping": lambda: agg_section(logdir),
        "start-up": lambda: startup_section(logdir),
        "topology": lambda: topology_section(logdir),
        "reliability": lambda: reliability_section(logdir),
        "GPU tests": lambda: tests_section(logdir),
    }
    out, empty = [], []
    for name, make in sections.items():
        lines = make()
        while lines and not lines[-1]:
            lines.pop()
        if lines:
            out += lines + [""]
        else:
            empty.append(name)
    return out, empty


def main(argv=None) -> int:
    args = log_folder_args(argv, __doc__)
    try:
        lines, empty = report(args.logdir, args.reference_dir, args.np, args.tag)
    except read_errors() as exc:
        print(f"report.py: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines).rstrip())
    if empty:
        print(f"report.py: nothing in {args.logdir} for: {', '.join(empty)}", file=sys.stderr)
    return 0

if __name__ == "__main__":
    sys.exit(main())
