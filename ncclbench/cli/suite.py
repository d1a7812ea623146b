"""`ncclbench suite FILE`: every entry of a suite file (collectives, sizes, dtypes, ops,
NCCL settings) in as few launches as the entries' environments allow."""

from __future__ import annotations

import sys

import click

from ncclbench.api.params import GPU_COUNT, metrics_option
from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import ExitCode


@click.command("suite", cls=GetoptCommand)
@click.argument("suite_file", type=str)
@click.option("-g", "--ngpus", type=GPU_COUNT, default=None,
              help="Local ranks to spawn; all: one per visible GPU (omit under a launcher).")
@click.option("--backend", type=click.Choice(["nccl", "gloo", "cupy"]), default=None)
@click.option("--csv", "csv_path", default=None, help="Append every run's rows to this CSV.")
@click.option("--results-dir", default=None, help="Result store (default results/ or $NCCLBENCH_RESULTS_DIR).")
@click.option("--no-save", is_flag=True, help="Do not keep the runs in the result store.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Set a run option in every entry, over the file's value (e.g. cudagraph=1, agg_iters=4); repeatable.")
@metrics_option
@click.option("--group", "group_index", type=int, default=None, hidden=True)
def suite_command(suite_file, ngpus, backend, csv_path, results_dir, no_save, quiet, overrides, group_index,
                  metrics_path):
    """Run every entry of a suite file (collectives, sizes, dtypes, ops, env settings)."""
    from ncclbench.suite import run as suite
    from ncclbench.tune.suite import run_tune_entries, tune_entries

    runs, tunes = tune_entries(suite_file, suite.load_suite(suite_file, suite.parse_overrides(overrides)), ngpus,
                               backend, ranks_of_a_group=group_index is not None)
    if not runs:
        sys.exit(int(run_tune_entries(tunes)))
    outputs = {"csv_path": csv_path, "results_dir": results_dir, "no_save": no_save, "quiet": quiet,
               "metrics_path": metrics_path}
    worst = suite.run_suite(suite_file, runs, ngpus, backend, outputs, overrides, group_index, sys.argv[1:])
    if worst != ExitCode.INTERRUPTED and tunes:
        worst = run_tune_entries(tunes) or worst
    sys.exit(int(worst))
