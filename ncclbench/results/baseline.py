"""A baseline from several healthy runs (`ncclbench baseline RUN... -o base.json`).

Per row (collective, dtype, op, root, size, placement): the best run's numbers (the shortest
time, so the highest bandwidth) as the headline, and the spread of all of them as its noise:
every run's samples pooled (so the middle half holds the spread between runs too), each
run's median (`run_medians_us`) and fastest block (`run_fastest_us`) and the spread of the headline times (`time_spread_us`:
min, median, max over the runs). The file is an ncclbench JSON document like any run's, so
`compare`, `show` and `plot` read it; compare judges NEW against it as results.noise says."""

from __future__ import annotations

import math
from typing import Sequence

from ncclbench.errors import BadInput
from ncclbench.results import noise
from ncclbench.results.readers import PLACEMENTS, read_many

KEYS = ["collective", "dtype", "op", "root", "size_bytes", "placement"]
SAME_SETUP = ("ranks", "backend", "mode", "gpu", "nccl_version")


def _value(record: dict, column: str, default=math.nan):
    value = record.get(column, default)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return value


def _check_runs(frame, paths: Sequence[str]) -> None:
    wrong = frame[frame["nwrong"].fillna(0) > 0]
    if len(wrong):
        raise BadInput(f"{wrong['source'].iloc[0]} reports wrong results: a baseline is made of healthy runs only")
    for column in SAME_SETUP:
        if column in frame.columns:
            values = sorted(set(frame[column].dropna().astype(str)))
            if len(values) > 1:
                raise BadInput(f"the runs differ in {column} ({', '.join(values)}): a baseline is made of runs "
                               "of one setup")
    if len(set(frame["source"])) < len(set(paths)):
        raise BadInput("a run file is given twice")
    _check_same_sweeps(frame)


def _check_same_sweeps(frame) -> None:
    """Every run measured the same collectives, dtypes and ops: a row that only some runs
    hold would be a baseline of fewer runs than it says (refused, not kept apart)."""
    measured = {source: sorted(set(part[["collective", "dtype", "op"]].itertuples(index=False, name=None)))
                for source, part in frame.groupby("source", sort=False)}
    (first, want), *rest = measured.items()
    for source, got in rest:
        if got != want:
            def text(sweeps):
                return ", ".join(" ".join(v for v in s if v != "none") for s in sweeps)
            raise BadInput(f"the runs measured different things ({first}: {text(want)}; {source}: {text(got)}): "
                           "a baseline is made of runs of one setup (same collectives, dtypes and ops)")


def _cell(records: list[dict]) -> tuple[dict, dict, float]:
    """(placement JSON, its noise block, host_us) for one row's records, one per run."""
    best = min(records, key=lambda r: _value(r, "time_us", math.inf))
    sides = [noise.Side(time_us=_value(r, "time_us"),
                        samples_us=tuple(_value(r, "noise_samples_us", ())),
                        summary=_summary(r)) for r in records]
    pooled = noise.pooled(sides)
    block = dict(pooled.summary or {"n": 0})
    block["samples_us"] = list(pooled.samples_us)
    block["run_medians_us"] = list(pooled.run_medians_us)
    block["run_fastest_us"] = [s.fastest_us for s in sides]
    times = sorted(_value(r, "time_us") for r in records)
    block["runs"] = len(records)
    block["time_spread_us"] = [times[0], noise.quantile(times, 0.5), times[-1]]
    cell = {"time": _value(best, "time_us"), "alg_bw": _value(best, "algbw_gbps"),
            "bus_bw": _value(best, "busbw_gbps"), "nwrong": _value(best, "nwrong", None)}
    return cell, block, _value(best, "host_us")


def _summary(record: dict) -> dict | None:
    summary = {k: _value(record, c) for k, c in zip(noise.SUMMARY_KEYS, noise.CSV_COLUMNS)}
    return None if math.isnan(summary["median_us"]) else summary


def _template(path: str, collective: str) -> dict:
    """The first run's own JSON document of `collective` (its config, env, versions), so that
    `show` prints the baseline as a run; {} when that run is not ncclbench or nccl-tests JSON."""
    import json

    from ncclbench.inputs import InputFileError, read_text

    try:
        doc = json.loads(read_text(path, "results"))
    except (InputFileError, ValueError, RecursionError):
        return {}
    docs = doc if isinstance(doc, list) else [doc]
    for d in docs:
        if isinstance(d, dict) and (d.get("ncclbench") or {}).get("collective", collective) == collective:
            return {k: v for k, v in d.items() if k not in ("results", "ncclbench", "args")}
    return {}


def _document(collective: str, records: list[dict], sources: list[str], meta: dict) -> dict:
    rows: dict[tuple, dict] = {}
    by_cell: dict[tuple, list[dict]] = {}
    for r in records:
        row_key = (r["dtype"], r["op"], r["root"], r["size_bytes"])
        rows.setdefault(row_key, {"size": int(r["size_bytes"]), "count": int(r["count"]), "type": r["dtype"],
                                  "redop": r["op"], "root": f"{int(r['root']):6d}"})
        by_cell.setdefault(row_key + (r["placement"],), []).append(r)
    for row_key, row in rows.items():
        host = {}
        for placement in PLACEMENTS:
            cell_records = by_cell.get(row_key + (placement,))
            if cell_records:
                row[placement], row[f"{placement}_noise"], host[placement] = _cell(cell_records)
        row["host_us"] = {k: (None if math.isnan(v) else v) for k, v in host.items()}
    bench = {"collective": collective, "baseline": {"runs": sources, "rows_from": "best run; noise from every run"}}
    bench.update({k: v for k, v in meta.items() if v is not None})
    doc = dict(_template(sources[0], collective), version=3, args=["baseline", *sources])
    doc["results"] = list(rows.values())
    doc["ncclbench"] = bench
    return doc


def make_baseline(paths: Sequence[str], labels: Sequence[str] | None = None) -> list[dict]:
    """One JSON document per collective found in the runs. BadInput on runs that cannot make
    one (wrong results, different setups, fewer than two runs)."""
    if len(paths) < 2:
        raise BadInput("a baseline needs at least two runs (three or more give a truer spread)")
    frame = read_many(paths, labels)
    _check_runs(frame, paths)
    frame = frame[frame["size_bytes"] > 0]
    meta = {}
    for column in ("backend", "mode", "ranks", "nodes", "gpu", "nccl_version", "torch_version"):
        if column in frame.columns and frame[column].notna().any():
            value = frame[column].dropna().iloc[0]
            meta[column] = value.item() if hasattr(value, "item") else value
    sources = list(dict.fromkeys(frame["source"]))
    docs = []
    for collective, part in frame.groupby("collective", sort=False):
        docs.append(_document(collective, part.to_dict("records"), sources, meta))
    return docs
