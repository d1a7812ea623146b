"""`ncclbench plot FILE... -O busbw.png`: the command over results.plot."""

from __future__ import annotations

from typing import Sequence

import click

from ncclbench.api.params import SIZE
from ncclbench.cli.types import OLD_OUTPUT_SPELLINGS, OneLineErrorCommand
from ncclbench.errors import BadInput, PlanError
from ncclbench.lazy import lazy_import
from ncclbench.results.compare import read_inputs
from ncclbench.results.plot import check_output_name, plot_results
from ncclbench.results.output import check_writable
from ncclbench.results.readers import filter_results

pd = lazy_import("pandas")


@click.command("plot", cls=OneLineErrorCommand, old_spellings=OLD_OUTPUT_SPELLINGS)
@click.argument("files", nargs=-1, required=True)
@click.option("-O", "--out", "output", required=True, type=click.Path(dir_okay=False),
              help="Image to write; the format follows the extension (.png, .svg, .pdf).")
@click.option("--placement", type=click.Choice(["out_of_place", "in_place", "both"]), default="out_of_place",
              show_default=True)
@click.option("--label", "labels", multiple=True, help="Legend label per file, in order. Default: file names.")
@click.option("--title", default=None, help="Figure title. Default: what all series have in common.")
@click.option("--min-size", type=SIZE, default=None, help="Leave out sizes below this (e.g. 1K).")
@click.option("--max-size", type=SIZE, default=None, help="Leave out sizes above this (e.g. 1G).")
def plot_command(files: Sequence[str], output, placement, labels, title, min_size, max_size):
    """Plot bus bandwidth and time against size for result files (text, JSON or CSV).

    One series per file, collective, dtype, op, root and placement; the link peak, when
    the file records one, is a dashed line. The JSON result of pairs, preflight, fleet or
    p2p is drawn as a heat map of its pairs instead (slow pairs framed, drained hosts in
    red). Exit status: 0 written, 2 bad input."""
    try:
        check_output_name(output)  # before any file is read
        check_writable(output, "image")
    except (ValueError, PlanError) as exc:
        raise BadInput(str(exc)) from None
    if _plot_heatmap(files, output, title):
        return
    frames = read_inputs(list(files), labels)
    frame = filter_results(pd.concat(frames, ignore_index=True, sort=False),
                           placement=placement, min_size=min_size, max_size=max_size)
    if frame.empty:
        raise BadInput(f"no rows left to plot after filters (placement {placement}, "
                       f"sizes {min_size}..{max_size})")
    try:
        count = plot_results(frame, output, title=title)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"{output}: cannot write: {exc.strerror or exc}") from None
    click.echo(f"wrote {output} ({count} series)")


def _plot_heatmap(files: Sequence[str], output, title) -> bool:
    """Draw the heat map when the file is a pairs, preflight, fleet or p2p result; False
    when no file is one (sweep results: the plot above)."""
    from ncclbench.results import heatmap

    docs = [heatmap.read_source(f) for f in files]
    if not any(docs):
        return False
    if len(files) != 1:
        raise BadInput(f"a heat map is drawn from one pairs, preflight, fleet or p2p result at a time "
                       f"({len(files)} files given)")
    try:
        drawn = heatmap.plot_heatmap(docs[0], output, title=title)
    except ValueError as exc:
        raise BadInput(f"{files[0]}: {exc}") from None
    except OSError as exc:
        raise BadInput(f"{output}: cannot write: {exc.strerror or exc}") from None
    panels = len(drawn.panels)
    click.echo(f"wrote {output} (heat map of a {drawn.kind} result, {panels} panel{'s' if panels != 1 else ''})")
    return True
