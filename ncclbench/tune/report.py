"""After the launches: read what they left, judge every size, write the files, print the
table. Everything measured is kept whatever happens to the rest."""

from __future__ import annotations

import json
import os
import sys

from ncclbench.errors import ExitCode
from ncclbench.sizes import format_size
from ncclbench.tune import analysis, precision, table, tuner_config
from ncclbench.tune.files import performance_csv
from ncclbench.tune.plan import DEFAULT, ONE_RANK_NOTE, Combination
from ncclbench.tune.paired import NOISE_TEXT, rule_text
from ncclbench.tune.ranges import Series, finite, win_ranges


def measured_in(setup, phase: str, coll: str, combos, items, results) -> dict:
    """label -> Measured: what `phase`'s launches left for these combinations of `coll`, with
    how each repeat was timed."""
    out = {}
    for combo in combos:
        m = analysis.Measured()
        for it in items:
            r = results.get(it["index"])
            if it["collective"] != coll or Combination.from_dict(it["combo"]) != combo:
                continue
            path = os.path.join(setup.output_dir, phase, it["name"] + ".json")
            if r is not None and r.status in ("ok", "wrong_results") and os.path.exists(path):
                analysis.read_rows(path, m, it["round"], r.pid)
                m.timings.add(r.timing or it.get("timing") or "eager")
                m.fallback = m.fallback or r.fallback
        if m.busbw:
            out[combo.label] = m
    return out


def collective_outcome(setup, coll, probe_items, probe_results, attributions, items, results):
    """Statuses, measurements and NCCL's choices of one collective's combinations."""
    combos = setup.plans[coll].combos
    status, errors, choices = {}, {}, {}
    probe_of = {Combination.from_dict(it["combo"]): it for it in probe_items if it["collective"] == coll}
    measured = measured_in(setup, "raw", coll, [DEFAULT, *combos], items, results)
    for combo in [DEFAULT, *combos]:
        runs = [(it, results.get(it["index"])) for it in items
                if it["collective"] == coll and Combination.from_dict(it["combo"]) == combo]
        status[combo.label], errors[combo.label] = combo_status(probe_of.get(combo), probe_results, runs)
    reference = measured.get("default") or next(iter(measured.values()), None)  # every combination has the sizes
    inits = {}
    for combo in [DEFAULT, *combos]:
        probe = probe_of.get(combo)
        if probe is not None and probe["index"] in attributions:
            inits[combo.label], calls = attributions[probe["index"]]
            choices[combo.label] = analysis.choices_by_printed_size(calls, coll, measured.get(combo.label) or reference)
    return analysis.CollectiveOutcome(coll, combos, status, errors, measured, choices, inits=inits)


def combo_status(probe_item, probe_results, runs) -> tuple[str, str]:
    """(what happened, first error) for one combination: the probe's word if it failed
    there, else the worst of its measured repeats."""
    if probe_item is not None:
        r = probe_results.get(probe_item["index"])
        if r is None:
            return "not run", ""
        if r.status != "ok":
            return analysis.describe(r), (r.errors[0] if r.errors else "")
    seen = [(r or analysis.ItemResult("not run")) for _it, r in runs]
    if not seen:
        return "not measured", ""
    bad = [r for r in seen if r.status not in ("ok",)]
    if not bad:
        return "ok", ""
    worst = bad[0]
    return analysis.describe(worst), (worst.errors[0] if worst.errors else "")


def combo_lines(outcome, setup) -> list[str]:
    lines = []
    for combo in [DEFAULT, *outcome.combos]:
        label = combo.label
        text = outcome.status.get(label, "not run")
        if outcome.errors.get(label):
            text += f" ({outcome.errors[label][:200]})"
        said = analysis.init_text(combo, outcome.inits.get(label))
        if said:
            text += f"; {said}"
        if label in outcome.overridden:
            sizes = ", ".join(format_size(s) for s in outcome.overridden[label][:6])
            text += f"; NCCL ran another algorithm/protocol at {sizes}: those sizes left out"
        m = outcome.measured.get(label)
        default = outcome.measured.get("default")
        if m is not None and default is not None and m.timing != default.timing:
            text += f"; {precision.fallback_text(m.timing, m.fallback)}, up to {own_noise(m):.1f} %"
        if m is not None and any(m.wrong.values()):
            text += f"; wrong results at {sum(m.wrong.values())} size(s): never a winner there"
        lines.append(f"{label:<18s} {text}")
    lines += [f"{what:<18s} left out: {why}" for what, why in setup.plans[outcome.collective].left_out]
    return lines


def own_noise(m) -> float:
    """The largest spread of one combination's repeats over its sizes, % (0 if none)."""
    spreads = [Series(v).spread_pct for v in m.busbw.values()]
    return max([x for x in spreads if x is not None], default=0.0)


def header(setup, outcome, nccl_text: str, path_lines=()) -> list[str]:
    req = setup.request
    m = outcome.measured.get("default")
    gpu = f" ({setup.nranks} x {m.gpu})" if m and m.gpu else ""
    lines = [f"{nccl_text or 'NCCL version unknown (no rank reported one)'}"
             f"{', torch ' + m.torch if m and m.torch else ''}; backend {setup.backend}",
             f"{setup.nranks} rank(s) on {setup.nnodes} node(s){gpu}; {req.options.get('datatype')} "
             f"{req.options.get('op')}; {len(outcome.combos)} forced combination(s) and NCCL's default, "
             f"{req.repeat} repeat(s) each, interleaved" + (paired_text(req.paired) if req.paired else ""),
             "busbw: out-of-place GB/s, median of the repeats; "
             + (NOISE_TEXT if req.paired else "noise: the largest spread (fastest - slowest repeat, % of the median) of "
                "any configuration's repeats at that size, among those timed like the default")
             + "; NCCL chose: algorithm/protocol and channels from its TUNING log"]
    lines += [line.strip() for line in path_lines]
    if setup.timing is not None:
        lines.append(f"timing: {setup.timing.text}; every combination and NCCL's default alike")
    if setup.backend == "gloo":
        lines.append("rehearsal on gloo: NCCL_ALGO/NCCL_PROTO select nothing here; the numbers are gloo's and no "
                     "winner is called")
    if setup.nranks == 1:
        lines.append(ONE_RANK_NOTE)
    return lines


def paired_text(sets: int) -> str:
    return (f", side by side (--paired {sets}): {sets} communicator(s) per configuration kept for the launch, repeat r "
            f"(from 1) on set (r - 1) mod {sets}, every configuration back to back in an order turned by one place "
            "every repeat")


def finish(setup, probe_items, probe_results, worlds, items, results, interrupted=False, confirm=None) -> int:
    """Judge, confirm, write and print. `confirm(winners, sizes)`: launch 2 for {collective:
    [combinations that won somewhere]} over the sizes that won, returning (items, results,
    exit code); None: no second launch can be made, so no win stands."""
    logs = analysis.probe_logs(os.path.join(setup.output_dir, "probe"))
    attributions = analysis.attribute_choices(probe_items, probe_results, logs, worlds)
    nccl_text = nccl_version_text(logs, setup)
    path = analysis.probe_path(os.path.join(setup.output_dir, "probe")) if setup.backend == "nccl" else None
    path_lines = path.lines(forced=True) if path is not None else []
    path_doc = None
    if path is not None:  # one channel count would be one forced combination's
        path_doc = dict(path.to_dict(), facts=", ".join(path.fact_list(forced=True)))
        path_doc.pop("channels", None)
    doc = {"tool": "ncclbench tune", "nccl": nccl_text, "nccl_path": path_doc,
           "path_lines": path_lines, "backend": setup.backend, "ranks": setup.nranks,
           "nodes": setup.nnodes, "repeat": setup.request.repeat,
           "run_cycles": int(setup.request.options.get("run_cycles", 1)), "min_gain_pct": setup.request.min_gain,
           "timing": setup.timing.text if setup.timing else "", "paired": setup.request.paired,
           "rule": rule_text(setup.request.min_gain, setup.request.paired),
           "notes": list(setup.notes), "interrupted": interrupted, "collectives": {}}
    outcomes = []
    for coll in setup.request.collectives:
        outcome = collective_outcome(setup, coll, probe_items, probe_results, attributions, items, results)
        outcomes.append(outcome)
        judged = setup.backend == "nccl" and setup.nranks > 1
        outcome.verdicts = analysis.verdicts_for(outcome, setup.request.repeat, setup.request.min_gain,
                                                 setup.request.paired)
        if not judged:
            for v in outcome.verdicts:
                v.win, v.why = None, "rehearsal: no winner called" if setup.backend == "gloo" else "one rank"
    doc["confirmation"] = confirm_wins(setup, outcomes, None if interrupted else confirm)
    interrupted = interrupted or doc["confirmation"].get("exit_code") == ExitCode.INTERRUPTED
    perf = [row for outcome in outcomes for row in analysis.perf_rows(outcome, setup.nnodes, setup.nranks)]
    config = tuner_config.build(setup, outcomes)
    out = []
    for outcome in outcomes:
        ranges = win_ranges(outcome.verdicts)
        out += table.collective_lines(
            f"ncclbench tune: {outcome.collective}", header(setup, outcome, nccl_text, path_lines), outcome.verdicts,
            combo_lines(outcome, setup), ranges,
            setup.notes + [n for n in config.notes if n.startswith(f"{outcome.collective}:")]
            + analysis.zero_size_notes(outcome, setup.nranks),
            rule_text(setup.request.min_gain, setup.request.paired),
            config_lines(config, outcome.collective)) + [""]
        doc["collectives"][outcome.collective] = outcome_json(outcome, ranges, setup)
    code = write_files(setup, doc, perf, config, outcomes)
    for line in out:
        print(line, flush=True)
    if config.refused:
        print(f"ncclbench: error: no {tuner_config.FILE_NAME} written: {config.refused}", file=sys.stderr,
              flush=True)
    print(f"ncclbench tune: results in {setup.output_dir}", file=sys.stderr, flush=True)
    if interrupted:
        return ExitCode.INTERRUPTED
    if not any(o["verdicts"] for o in doc["collectives"].values()):
        return ExitCode.NCCL_ERROR  # not even NCCL's default could be measured
    return ExitCode.OUTPUT_ERROR if config.refused else code


def confirm_wins(setup, outcomes, confirm) -> dict:
    """Launch 2 for every combination that won somewhere in launch 1 (with NCCL's default),
    and each win kept only where launch 2 reproduces it (precision.confirm). What was done,
    for tune.json."""
    winners = {}
    for outcome in outcomes:
        labels = precision.candidates_to_confirm(outcome.verdicts)
        combos = [c for c in outcome.combos if c.label in labels]
        if combos:
            winners[outcome.collective] = combos
    if not winners:
        return {"launch": None, "why": "no win in launch 1 to confirm"}
    won = sorted({v.size for outcome in outcomes for v in outcome.verdicts if v.win})
    items, results, code = confirm(winners, won) if confirm else ([], {}, None)
    for outcome in outcomes:
        m = measured_in(setup, "confirm", outcome.collective, [DEFAULT, *winners.get(outcome.collective, [])],
                        items, results)
        for v in outcome.verdicts:
            if v.win:
                precision.confirm(v, series_at(m.get("default"), v.size), series_at(m.get(v.best), v.size),
                                  setup.request.repeat, setup.request.min_gain, setup.request.paired)
    return {"launch": precision.CONFIRM_LAUNCH if confirm else None, "exit_code": code,
            "combinations": {c: [k.label for k in combos] for c, combos in winners.items()}}


def series_at(m, size: int):
    """One size of a Measured as a Series (None when not measured there)."""
    if m is None or size not in m.busbw:
        return None
    return analysis.series_of(m, size)


def config_lines(config, collective: str) -> list[str]:
    if config.refused or config.skipped:
        return [f"no {tuner_config.FILE_NAME} written: {config.refused or config.skipped}"]
    return config.explained.get(collective, [])


def nccl_version_text(logs, setup) -> str:
    for log in logs.values():
        if log.version:
            return f"NCCL {log.version}"
    raw = os.path.join(setup.output_dir, "raw")
    for name in sorted(os.listdir(raw)) if os.path.isdir(raw) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(raw, name), encoding="utf-8") as f:
                    text = json.load(f).get("ncclbench", {}).get("nccl", "")
            except (OSError, ValueError):
                continue
            if text:
                return text if text.startswith("NCCL") else f"{text} (no NCCL)"
    return ""


def outcome_json(outcome, ranges, setup) -> dict:
    return {
        "left_out": [{"what": w, "why": y} for w, y in setup.plans[outcome.collective].left_out],
        "combinations": {label: {"status": s, "error": outcome.errors.get(label, ""),
                                 "overridden_sizes": outcome.overridden.get(label, [])}
                         for label, s in outcome.status.items()},
        "nccl_choice": {str(size): list(s) for size, s in sorted(outcome.choices.get("default", {}).items())},
        "verdicts": [{"size": v.size, "default_busbw": v.default.median if v.default.measured else None,
                      "default_repeats": finite(v.default.busbw),
                      "noise_pct": v.noise_pct, "nccl_choice": list(v.default.setting) if v.default.setting else None,
                      "best": v.best, "best_busbw": v.best_series.median if v.best_series and v.best_series.measured else None,
                      "best_repeats": finite(v.best_series.busbw) if v.best_series else None,
                      "best_setting": list(v.best_series.setting) if v.best_series and v.best_series.setting else None,
                      "gain_pct": v.gain_pct, "ratio_interval": list(v.interval) if v.interval else None,
                      "win": v.win, "why": v.why, "confirmation": v.confirmation}
                     for v in outcome.verdicts],
        "timing": {label: {"timing": m.timing, "capture_failed": m.fallback} for label, m in outcome.measured.items()},
        "precision": precision.precision_line(outcome.verdicts),
        "ranges": [{"setting": list(r.setting), "combination": r.label, "sizes": r.sizes, "gains_pct": r.gains,
                    "confirmations": r.confirmations,
                    "min_bytes": r.min_bytes, "max_bytes": r.max_bytes} for r in ranges],
    }


def write_files(setup, doc, perf, config, outcomes) -> int:
    """tune.json, performance.csv, nccl_tuner.conf (when it may be written) and the plots;
    OUTPUT_ERROR if one failed."""
    folder = setup.output_dir
    files = {"tune.json": None, "performance.csv": performance_csv(perf)}
    if config.refused or config.skipped:
        doc["tuner_config"] = {"written": False, "why": config.refused or config.skipped}
    else:
        files[tuner_config.FILE_NAME] = config.text(tuner_config.comments(setup, config, doc["nccl"]))
        doc["tuner_config"] = {"written": True, "rows": [r.text() for r in config.rows], "notes": config.notes}
    doc["files"] = {name: os.path.join(folder, name) for name in files}
    files["tune.json"] = json.dumps(doc, indent=1) + "\n"
    code = ExitCode.OK
    if setup.request.metrics_path:
        from ncclbench.results import metrics

        if not metrics.write_or_warn(setup.request.metrics_path, metrics.tune_text(doc, metrics.process_info(setup.backend))):
            code = ExitCode.OUTPUT_ERROR
    for name, text in files.items():
        try:
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            print(f"ncclbench: error: cannot write {os.path.join(folder, name)}: {exc.strerror}",
                  file=sys.stderr)
            code = ExitCode.OUTPUT_ERROR
    if setup.request.plot:
        from ncclbench.tune.plot import plot_outcomes

        for message in plot_outcomes(folder, outcomes, doc["nccl"]):
            print(f"ncclbench tune: {message}", file=sys.stderr)
    return code
