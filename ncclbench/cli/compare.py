"""`ncclbench compare BASE NEW [NEW...]`: the command over results.compare (see there for
how rows are matched and judged). Exit codes: 0 no failure, 1 a regression or wrong
results, 2 bad input (unreadable or malformed file, bad option, nothing to compare)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import click

from ncclbench.api.params import SIZE, ParsedType
from ncclbench.cli.types import OneLineErrorCommand
from ncclbench.errors import BadInput, ExitCode
from ncclbench.results.compare import (METRICS, NOT_COMPARABLE, Comparison, compare_frames, comparisons_to_frame, comparisons_to_json,
                                       format_plain, parse_threshold, print_rich, read_inputs)
from ncclbench.results.readers import filter_results

@click.command("compare", cls=OneLineErrorCommand)
@click.argument("base")
@click.argument("new", nargs=-1, required=True)
@click.option("--metric", type=click.Choice(sorted(METRICS)), default="busbw", show_default=True,
              help="busbw: slower when NEW/BASE < 1-threshold. time: when NEW/BASE > 1+threshold.")
@click.option("--threshold", type=ParsedType("threshold", parse_threshold), default="5%", show_default=True,
              help="Allowed change before a row counts as a regression: 5% or 0.05 (a bare number is a fraction < 1).")
@click.option("--min-size", type=SIZE, default=None, help="Ignore sizes below this (e.g. 64K, 1M).")
@click.option("--max-size", type=SIZE, default=None, help="Ignore sizes above this (e.g. 1G).")
@click.option("--placement", type=click.Choice(["out_of_place", "in_place", "both"]), default="both", show_default=True)
@click.option("--label", "labels", multiple=True, help="Label per file, in order (BASE first). Default: file names.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the comparison (settings, verdict, rows) as JSON, for CI.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the compared rows as CSV.")
def compare_command(base, new, metric, threshold, min_size, max_size, placement, labels, json_path, csv_path):
    """Compare result files: BASE against each NEW (nccl-tests or ncclbench text, JSON or CSV).

    Rows match on collective, dtype, op, root, size and placement; size 0 is skipped.
    A row regresses when it is slower than the threshold and beyond the noise both files
    carry (the samples of each row's timed iterations; a baseline's spread between runs);
    files without noise (nccl-tests, older files) are judged by the threshold alone.
    NEW rows with wrong results (#wrong > 0) are failures too.
    Exit status: 0 pass, 1 regression or wrong results, 2 bad input."""
    base_frame, *new_frames = [
        filter_results(frame, placement=placement, min_size=min_size, max_size=max_size)
        for frame in read_inputs([base, *new], labels)
    ]
    comparisons = []
    for path, new_frame in zip(new, new_frames):
        comparison = compare_frames(base_frame, new_frame, metric=metric, threshold=threshold)
        if comparison.rows.empty:
            raise BadInput(f"no matching rows between {base} and {path} "
                           "(rows match on collective, dtype, op, root, size > 0 and placement, after filters)")
        if (comparison.rows["status"] == NOT_COMPARABLE).all():
            reasons = comparison.unmeasured_reasons()
            hint = ("; one rank: busbw is 0, and torch's backends print out-of-place as N/A"
                    if any(r.endswith("0 or N/A") for r in reasons) else "")
            raise BadInput(f"nothing to compare between {base} and {path}: no matched row can be judged "
                           f"({'; '.join(reasons)}{hint})")
        comparisons.append(comparison)

    _print_report(comparisons)
    filters = {"placement": placement, "min_size": min_size, "max_size": max_size}
    _write_outputs(comparisons, filters, json_path, csv_path)
    if any(c.failed for c in comparisons):
        # sys.exit rather than ctx.exit: Click turns Exit into a return value when the
        # group runs with standalone_mode=False, and this status is the CI verdict.
        sys.exit(ExitCode.REGRESSION)


def _print_report(comparisons: Sequence[Comparison]) -> None:
    console = None
    if sys.stdout.isatty():  # a person is watching: colours and a boxed table
        from rich.console import Console

        console = Console(file=sys.stdout)
    for i, c in enumerate(comparisons):
        if i:
            click.echo()
        if console is not None:
            print_rich(c, console)
        else:
            click.echo(format_plain(c))


def _write_outputs(comparisons, filters, json_path, csv_path) -> None:
    try:
        if json_path:
            Path(json_path).write_text(json.dumps(comparisons_to_json(comparisons, filters), indent=1) + "\n")
        if csv_path:
            comparisons_to_frame(comparisons).to_csv(csv_path, index=False)
    except OSError as exc:
        raise BadInput(f"{exc.filename or ''}: cannot write: {exc.strerror or exc}") from None
