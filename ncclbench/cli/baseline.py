"""`ncclbench baseline RUN RUN... -O base.json`: several healthy runs made into one
baseline for `compare` (results.baseline says what it keeps). Exit codes: 0 written,
2 bad input (unreadable file, wrong results in a run, runs of different setups)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ncclbench.cli.types import OLD_OUTPUT_SPELLINGS, OneLineErrorCommand
from ncclbench.errors import BadInput


@click.command("baseline", cls=OneLineErrorCommand, old_spellings=OLD_OUTPUT_SPELLINGS)
@click.argument("runs", nargs=-1, required=True)
@click.option("-O", "--out", "output", required=True, type=click.Path(dir_okay=False),
              help="The baseline file to write (JSON; compare reads it as BASE).")
@click.option("--label", "labels", multiple=True, help="Label per run, in order. Default: file names.")
def baseline_command(runs, output, labels):
    """Make one baseline from several runs of one setup (ncclbench JSON best: it keeps the
    samples; CSV or nccl-tests text work with less).

    Each row keeps its best run's numbers and the spread of all of them: `ncclbench compare
    base.json NEW.json` then fails only on rows slower than the threshold and beyond that
    spread. Exit status: 0 written, 2 bad input."""
    from ncclbench.results.baseline import make_baseline
    from ncclbench.results.compare import read_inputs

    if labels and len(labels) != len(runs):
        raise BadInput(f"--label given {len(labels)} time(s) for {len(runs)} file(s); give one per file or none")
    read_inputs(list(runs), list(labels))  # every file readable, each failure in one line
    docs = make_baseline(list(runs), list(labels) or None)
    try:
        Path(output).write_text(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1) + "\n")
    except OSError as exc:
        raise BadInput(f"{output}: cannot write: {exc.strerror or exc}") from None
    rows = sum(len(d["results"]) for d in docs)
    click.echo(f"baseline of {len(runs)} runs, {rows} rows: {output}")
