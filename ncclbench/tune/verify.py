"""`ncclbench tune --verify CONF --plugin SO`: measure NCCL's default, then the same sweep
with NCCL's example tuner plugin reading CONF, and show per config row whether NCCL applied
it and whether the gain came back.

NCCL loads a tuner plugin once per process (src/plugin/tuner.cc keeps its load status for
the process), so the default and the plugin run in launches of their own; a third,
untimed, launch logs what NCCL ran under the plugin. What is checked before any launch:
the config, line by line (files.read_config); that the plugin loads and exports an
interface this NCCL loads (NCCL 2.26-2.27 load tuner v2-v4, 2.28-2.29 up to v5, 2.30 up to
v6); and the example plugin built from NCCL sources before 2.30, whose getCollInfo
indexes NCCL's cost table as a float** and crashes NCCL on the first call a row matches
(fixed in 2.30's plugins/tuner/example/plugin.c)."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from dataclasses import dataclass

from ncclbench.errors import ExitCode, PlanError
from ncclbench.sizes import format_size
from ncclbench.tune import analysis
from ncclbench.tune.plan import COLLECTIVES, DEFAULT, ONE_RANK_NOTE
from ncclbench.tune.ranges import Series, finite, judge
from ncclbench.tune.table import gbps_text

INTERFACES = (6, 5, 4, 3, 2)


@dataclass
class Plugin:
    path: str
    name: str
    interfaces: list[int]


def max_interface(nccl: tuple | None) -> int | None:
    """The newest tuner interface this NCCL version loads (None: not known)."""
    if not nccl or tuple(nccl[:2]) < (2, 26):
        return None
    if tuple(nccl[:2]) >= (2, 30):
        return 6
    return 5 if tuple(nccl[:2]) >= (2, 28) else 4


def check_plugin(path: str, nccl) -> Plugin:
    """The plugin, loaded here once to read its exports; PlanError (exit 2) when NCCL could
    not use it or it would crash NCCL. `nccl`: NCCL's version, or a function that returns
    it, asked only once the file is a loadable tuner plugin (reading it imports torch)."""
    if not os.path.isfile(path):
        raise PlanError(f"--plugin {path}: no such file")
    try:
        lib = ctypes.CDLL(os.path.abspath(path), mode=getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2))
    except OSError as exc:
        raise PlanError(f"--plugin {path} does not load: {str(exc).strip()}") from None
    found = [v for v in INTERFACES if hasattr(lib, f"ncclTunerPlugin_v{v}")]
    if not found:
        raise PlanError(f"--plugin {path} exports no ncclTunerPlugin_v2..v6: not an NCCL tuner plugin")
    try:
        name = (ctypes.c_char_p.in_dll(lib, f"ncclTunerPlugin_v{found[0]}").value or b"").decode(errors="replace")
    except ValueError:
        name = "?"
    if callable(nccl):
        nccl = nccl()
    newest = max_interface(nccl)
    version = ".".join(map(str, nccl)) if nccl else "?"
    if newest is not None and not any(v <= newest for v in found):
        raise PlanError(f"--plugin {path} exports tuner interface v{', v'.join(map(str, found))} and NCCL {version} "
                        f"loads v{newest} at most: NCCL would run without it")
    if name == "Example" and 6 not in found:
        raise PlanError(f"--plugin {path} is NCCL's example plugin built from a source before 2.30: it indexes NCCL's "
                        "cost table as a float** and crashes NCCL on the first call a row matches; build it from "
                        "NCCL 2.30 or later (plugins/tuner/example), whose v5 interface NCCL 2.28-2.29 also load")
    return Plugin(os.path.abspath(path), name, found)


def nccl_version() -> tuple | None:
    try:
        import torch

        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a torch without NCCL: the ranks will say so
        return None
    if isinstance(v, int):
        return (v // 10000, v // 100 % 100, v % 100) if v >= 10000 else (v // 1000, v // 100 % 10, v % 100)
    return tuple(v[:3])


def relevant_rows(setup, rows):
    names = {COLLECTIVES[c][0] for c in setup.request.collectives}
    mine = [r for r in rows if r.collective in names and r.nnodes in (-1, setup.nnodes) and r.nranks in (-1, setup.nranks)]
    if not mine:
        raise PlanError(f"no row of {setup.request.verify} applies to {', '.join(sorted(names))} on "
                        f"{setup.nranks} rank(s) and {setup.nnodes} node(s)")
    return mine


def run_verify(setup) -> int:
    from ncclbench.tune.run import PROBE_OVERRIDES, probe_env, run_phase, work_items

    req = setup.request
    (rows, mine), plugin = setup.verify_rows, setup.plugin
    env = {"NCCL_TUNER_PLUGIN": plugin.path, "NCCL_TUNER_CONFIG_FILE": os.path.abspath(req.verify)}
    phases = {}
    for phase, extra, rounds, overrides in (("verify/default", {"NCCL_TUNER_PLUGIN": None}, req.repeat, None),
                                            ("verify/plugin", env, req.repeat, None),
                                            ("verify/probe", None, 1, PROBE_OVERRIDES)):
        folder = os.path.join(setup.output_dir, phase)
        extra = dict(env, **probe_env(folder)) if extra is None else extra
        items = work_items(setup, lambda c: [DEFAULT], rounds, csv=overrides is None)
        results, worlds, code = run_phase(setup, phase, items, extra, overrides, outputs=overrides is None)
        phases[phase] = (items, results, worlds)
        if code == ExitCode.INTERRUPTED:
            break
    return report(setup, plugin, rows, mine, phases)


def measured(setup, phase, items, results, coll) -> analysis.Measured:
    m = analysis.Measured()
    for it in items:
        r = results.get(it["index"])
        path = os.path.join(setup.output_dir, phase, it["name"] + ".json")
        if it["collective"] == coll and r is not None and r.status in ("ok", "wrong_results") and os.path.exists(path):
            analysis.read_rows(path, m)
    return m


def report(setup, plugin, rows, mine, phases) -> int:
    probe_items, probe_results, worlds = phases.get("verify/probe", ([], {}, {}))
    logs = analysis.probe_logs(os.path.join(setup.output_dir, "verify/probe"))
    attributions = analysis.attribute_choices(probe_items, probe_results, logs, worlds)
    version = next((f"NCCL {log.version}" for log in logs.values() if log.version), "NCCL version unknown")
    loaded = sorted({line for log in logs.values() for line in log.plugin})
    lines = [f"# ncclbench tune --verify: {setup.request.verify} with {plugin.path} (plugin {plugin.name!r}, "
             f"interfaces v{', v'.join(map(str, plugin.interfaces))}), {version}, {setup.nranks} rank(s)"]
    lines += [f"# NCCL said: {text}" for text in loaded] or ["# NCCL said nothing of a tuner plugin: it may not have "
                                                            "loaded it (see verify/probe/nccl.*.log)"]
    doc = {"config": setup.request.verify, "plugin": plugin.path, "nccl": version, "collectives": {}}
    reproduced_all = True
    for coll in setup.request.collectives:
        base = measured(setup, "verify/default", *phases.get("verify/default", ([], {}, {}))[:2], coll)
        tuned = measured(setup, "verify/plugin", *phases.get("verify/plugin", ([], {}, {}))[:2], coll)
        probe = next((it for it in probe_items if it["collective"] == coll), None)
        calls = attributions[probe["index"]][1] if probe and probe["index"] in attributions else []
        choices = analysis.choices_by_printed_size(calls, coll, tuned if tuned.busbw else base)
        coll_lines, coll_doc, ok = collective_report(setup, coll, base, tuned, choices, mine)
        lines += coll_lines
        doc["collectives"][coll] = coll_doc
        reproduced_all = reproduced_all and ok
    others = [r for r in rows if r not in mine]
    if others:
        lines.append(f"# {len(others)} row(s) of the config apply to other collectives or sizes of job: not measured")
    for line in lines:
        print(line, flush=True)
    with open(os.path.join(setup.output_dir, "verify.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"ncclbench tune: results in {setup.output_dir}", file=sys.stderr)
    return ExitCode.OK if reproduced_all else ExitCode.REGRESSION


def collective_report(setup, coll, base, tuned, choices, rows):
    """Lines, JSON and whether every row's gain came back, for one collective."""
    name = COLLECTIVES[coll][0]
    my_rows = [r for r in rows if r.collective == name]
    lines = [f"# {coll}: busbw out-of-place GB/s, median of {setup.request.repeat} repeat(s), default vs plugin",
             f"# {'size':>8s} {'default':>9s} {'plugin':>9s} {'gain':>8s}  {'row':>5s}  {'NCCL ran':<18s} "
             f"{'applied':<8s} {'gain above noise'}"]
    per_row = {r.line: [] for r in my_rows}
    doc_sizes = []
    for size in sorted(s for s in base.busbw if s > 0):
        row = next((r for r in my_rows if r.matches(name, size, setup.nnodes, setup.nranks)), None)
        ran = choices.get(size)
        applied = None if row is None or ran is None else \
            (ran[0], ran[1]) == (row.algorithm, row.protocol) and (row.channels <= 0 or ran[2] == row.channels)
        v = judge(size, Series(base.busbw[size], base.wrong.get(size, False)),
                  {"plugin": Series(tuned.busbw.get(size, []), tuned.wrong.get(size, False))}, setup.request.repeat,
                  setup.request.min_gain)
        if row is not None:
            per_row[row.line].append((size, applied, v))
        gain = f"{v.gain_pct:+7.1f}%" if v.gain_pct is not None else f"{'-':>8s}"
        tuned_text = gbps_text(v.best_series) if v.best_series else f"{'N/A':>9s}"
        ran_text = "N/A" if ran is None else f"{ran[0]}/{ran[1]}" + (f" ch{ran[2]}" if ran[2] else "")
        lines.append(f"  {format_size(size):>8s} {gbps_text(v.default)} {tuned_text} {gain}  "
                     f"{(row.line if row else '-'):>5}  {ran_text:<18s} {({True: 'yes', False: 'NO', None: '-'}[applied]):<8s} "
                     f"{({True: 'yes', False: 'no', None: '-'}[v.win])} ({v.why})")
        doc_sizes.append({"size": size, "row_line": row.line if row else None, "default": finite(base.busbw[size]),
                          "plugin": finite(tuned.busbw.get(size, [])), "nccl_ran": list(ran) if ran else None,
                          "applied": applied, "gain_pct": v.gain_pct, "above_noise": v.win})
    lines.append(f"# {coll}: per config row")
    if setup.nranks == 1:  # NCCL copies locally: it never asks the plugin, there is no gain to find
        lines += [f"#   line {r.line}: {r.text()}: not judged: {ONE_RANK_NOTE}" for r in my_rows]
        return lines, {"sizes": doc_sizes, "one_rank": True}, True
    ok = True
    for r in my_rows:
        got = per_row[r.line]
        applied = sum(1 for _s, a, _v in got if a)
        wins = sum(1 for _s, _a, v in got if v.win)
        ok = ok and bool(got) and wins == len(got)
        verdict = "reproduced" if got and wins == len(got) else ("no measured size in range" if not got else "NOT reproduced")
        lines.append(f"#   line {r.line}: {r.text()}: {len(got)} size(s), NCCL applied it at {applied}, gain above "
                     f"noise at {wins}: {verdict}")
    outside = [d for d in doc_sizes if d["row_line"] is None and d["gain_pct"] is not None]
    if outside:
        worst = min(outside, key=lambda d: d["gain_pct"])
        lines.append(f"#   {len(outside)} size(s) outside every row: worst {worst['gain_pct']:+.1f} % at "
                     f"{format_size(worst['size'])} (the example plugin runs one channel where no row matches)")
    return lines, {"sizes": doc_sizes}, ok
