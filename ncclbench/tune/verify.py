"""`ncclbench tune --verify CONF --plugin SO`: measure NCCL's default and the same sweep with
NCCL's example tuner plugin reading CONF, and judge at every measured size whether the
config made it slower than NCCL's default beyond the noise (verify_report.py).

NCCL loads a tuner plugin once per process (src/plugin/tuner.cc keeps its load status for
the process), so the default and the plugin run in launches of their own: the default
before and after the plugin's, so that a drift between launches shows; a fourth,
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
from ncclbench.tune import analysis
from ncclbench.tune.launches import PROBE_OVERRIDES, probe_env, run_phase, work_items
from ncclbench.tune.plan import COLLECTIVES, DEFAULT

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


def verify_phases(repeat: int, env: dict, probe_overrides: dict):
    """(phase, environment, first repeat, repeats, overrides) in launch order: the default
    before and after the plugin's launch (half its repeats each, so that a drift between
    launches shows in the noise), the plugin, and the untimed launch that logs what NCCL
    ran under the plugin (environment None: the plugin's, with NCCL's debug log)."""
    before = (repeat + 1) // 2
    no_plugin = {"NCCL_TUNER_PLUGIN": None}
    return (("verify/default", no_plugin, 1, before, None), ("verify/plugin", env, 1, repeat, None),
            ("verify/default-after", no_plugin, before + 1, repeat - before, None),
            ("verify/probe", None, 1, 1, probe_overrides))


def run_verify(setup) -> int:
    req = setup.request
    (rows, mine), plugin = setup.verify_rows, setup.plugin
    env = {"NCCL_TUNER_PLUGIN": plugin.path, "NCCL_TUNER_CONFIG_FILE": os.path.abspath(req.verify)}
    phases, interrupted = {}, False
    for phase, extra, first, rounds, overrides in verify_phases(req.repeat, env, PROBE_OVERRIDES):
        if rounds < 1:
            continue
        folder = os.path.join(setup.output_dir, phase)
        extra = dict(env, **probe_env(folder)) if extra is None else dict(extra, **(setup.timing.env if setup.timing else {}))
        items = work_items(setup, lambda c: [DEFAULT], rounds, csv=overrides is None, first=first,
                           timing="eager" if overrides else None)
        results, worlds, code = run_phase(setup, phase, items, extra, overrides, outputs=overrides is None)
        phases[phase] = (items, results, worlds)
        if code == ExitCode.INTERRUPTED:
            interrupted = True
            break
    return report(setup, plugin, rows, mine, phases, interrupted)


def timing_lines(setup, phases) -> list[str]:
    """How the default and the plugin were timed, and every item that fell back to eager."""
    lines = [f"# timing: {setup.timing.text}; the default's and the plugin's launches alike"] if setup.timing else []
    for phase, (items, results, _worlds) in phases.items():
        for it in items:
            r = results.get(it["index"])
            if r is not None and r.fallback:
                lines.append(f"# {phase} {it['name']}: timed EAGER, its graph capture failed ({r.fallback}): its "
                             "noise is its own")
    return lines


def measured(setup, phases, phase, coll) -> analysis.Measured:
    items, results = phases.get(phase, ([], {}, {}))[:2]
    m = analysis.Measured()
    for it in items:
        r = results.get(it["index"])
        path = os.path.join(setup.output_dir, phase, it["name"] + ".json")
        if it["collective"] == coll and r is not None and r.status in ("ok", "wrong_results") and os.path.exists(path):
            analysis.read_rows(path, m)
    return m


def report(setup, plugin, rows, mine, phases, interrupted=False) -> int:
    from ncclbench.tune import verify_report

    probe_items, probe_results, worlds = phases.get("verify/probe", ([], {}, {}))
    logs = analysis.probe_logs(os.path.join(setup.output_dir, "verify/probe"))
    attributions = analysis.attribute_choices(probe_items, probe_results, logs, worlds)
    version = next((f"NCCL {log.version}" for log in logs.values() if log.version), "NCCL version unknown")
    loaded = sorted({line for log in logs.values() for line in log.plugin})
    lines = [f"# ncclbench tune --verify: {setup.request.verify} with {plugin.path} (plugin {plugin.name!r}, "
             f"interfaces v{', v'.join(map(str, plugin.interfaces))}), {version}, {setup.nranks} rank(s)"]
    lines += [f"# NCCL said: {text}" for text in loaded] or ["# NCCL said nothing of a tuner plugin: it may not have "
                                                            "loaded it (see verify/probe/nccl.*.log)"]
    lines += timing_lines(setup, phases)
    doc = {"config": setup.request.verify, "plugin": plugin.path, "nccl": version, "collectives": {}}
    judged = verify_report.Judged()
    for coll in setup.request.collectives:
        before, after, tuned = (measured(setup, phases, phase, coll)
                                for phase in ("verify/default", "verify/default-after", "verify/plugin"))
        probe = next((it for it in probe_items if it["collective"] == coll), None)
        calls = attributions[probe["index"]][1] if probe and probe["index"] in attributions else []
        any_run = next((m for m in (tuned, before, after) if m.busbw), None)
        choices = analysis.choices_by_printed_size(calls, coll, any_run)
        coll_lines, coll_doc = verify_report.collective_report(setup, coll, (before, after, tuned), choices, mine,
                                                               judged)
        lines += coll_lines
        doc["collectives"][coll] = coll_doc
    others = [r for r in rows if r not in mine]
    if others:
        lines.append(f"# {len(others)} row(s) of the config apply to other collectives or sizes of job: not measured")
    code, verdict = verify_report.verdict(judged, setup.nranks, interrupted)
    lines.append(f"# verdict: {verdict}")
    doc["verdict"], doc["exit_code"] = verdict, int(code)
    for line in lines:
        print(line, flush=True)
    with open(os.path.join(setup.output_dir, "verify.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"ncclbench tune --verify: {verdict}", file=sys.stderr)
    print(f"ncclbench tune: results in {setup.output_dir}", file=sys.stderr)
    return code
