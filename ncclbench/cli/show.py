"""`ncclbench show FILE`: a saved run (ncclbench JSON) printed again in the nccl-tests
layout, or as a rich table."""

from __future__ import annotations

import json
import sys

import click

from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import PlanError


@click.command("show", cls=GetoptCommand)
@click.argument("result_file", type=str)
@click.option("--rich", "as_rich", is_flag=True, help="A rich table instead of the nccl-tests layout.")
def show_command(result_file, as_rich):
    """Print a saved result (ncclbench JSON) again in the nccl-tests layout; other formats
    (nccl-tests text/JSON, CSV) as a table."""
    from ncclbench.inputs import InputFileError, read_text

    try:
        text = read_text(result_file, "results")
    except InputFileError as exc:
        raise PlanError(str(exc)) from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    # a run's document replays as its table; one without a run's config (a baseline made
    # from CSV or text files) prints as the table of its rows
    if isinstance(doc, dict) and "ncclbench" in doc and "minimum_bytes" in (doc.get("config") or {}) and not as_rich:
        try:
            lines = _replay_lines(doc)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"{result_file}: not a run's JSON document as ncclbench writes it "
                            f"({type(exc).__name__}: {exc})") from None
        for line in lines:
            print(line)
        return
    from pathlib import Path

    from ncclbench.results.readers import parse_results

    frame = parse_results(text, result_file, Path(result_file).stem)
    _print_frame(frame, as_rich)


def _replay_lines(doc: dict) -> list[str]:
    from ncclbench.results import report
    from ncclbench.results.records import DeviceRecord, PlacementResult, ResultRow, RunInfo, RunSummary

    nb = doc["ncclbench"]
    cfg = dict(doc.get("config", {}))
    devices = [DeviceRecord(**d) for d in cfg.pop("devices", [])]
    info = RunInfo(
        collective=nb["collective"], args=doc.get("args", []), backend=nb.get("backend", "?"),
        mode=nb.get("mode", "?"), timing=nb.get("timing", "?"), nranks=nb.get("ranks", len(devices)),
        devices=devices, ncclbench_version=nb.get("ncclbench_version", "?"),
        torch_version=nb.get("torch_version", "?"), nccl_code=doc.get("nccl_version", 0),
        nccl_text=nb.get("nccl", ""), config=cfg, env=doc.get("env", []), start_time=doc.get("start_time", ""),
        topology=nb.get("topology"), link_peak_gbps=nb.get("link_peak_gbps"), notes=nb.get("notes", []),
        report_cputime=any("cpu_time" in (r.get("out_of_place") or {}) for r in doc.get("results", [])),
        startup=nb.get("startup"), nccl_path=nb.get("nccl_path"), path_lines=nb.get("path_lines") or [],
    )

    def cell(d):
        w = d.get("nwrong")
        nwrong = None if w in (None, "nan") else int(w)
        time_us = d["cpu_time"] if info.report_cputime else d["time"]
        if time_us is None:  # a cell the run printed N/A
            nan = float("nan")
            return PlacementResult(nan, nan, nan, None, host_us=nan, measured=False)
        return PlacementResult(float(time_us), float(d["alg_bw"]), float(d["bus_bw"]), nwrong)

    rows = [ResultRow(info.collective, r["size"], r["count"], r["type"], r["redop"], int(str(r["root"]).strip()),
                      cell(r["out_of_place"]), cell(r["in_place"]), r.get("timestamp", ""))
            for r in doc.get("results", [])]
    for row, r in zip(rows, doc.get("results", [])):
        hosts = r.get("host_us") or {}
        for name, placement in row.placements():
            if placement.measured:
                placement.host_us = hosts.get(name) or 0.0
    complete = bool(nb.get("complete", True))
    summary = RunSummary(rows, complete=complete, status=nb.get("status", "ok"),
                         errors=[e for e in doc.get("errors", []) if e])
    lines = report.header_lines(info)
    lines += [report.row_line(r) for r in rows]
    lines += report.trailer_lines(info, summary)
    return lines


def _print_frame(frame, as_rich: bool) -> None:
    cols = [c for c in ("label", "collective", "dtype", "op", "root", "size_bytes", "placement", "time_us",
                        "algbw_gbps", "busbw_gbps", "nwrong") if c in frame.columns]
    if as_rich and sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(*cols)
        for _, row in frame[cols].iterrows():
            table.add_row(*[str(v) for v in row.tolist()])
        Console().print(table)
    else:
        print(frame[cols].to_string(index=False))
