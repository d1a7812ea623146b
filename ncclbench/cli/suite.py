"""`ncclbench suite FILE`: every entry of a suite file (collectives, sizes, dtypes, ops,
NCCL settings) in as few launches as the entries' environments allow."""

from __future__ import annotations

import sys

import click

from ncclbench.api.params import ALL_GPUS, GPU_COUNT
from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import ExitCode, PlanError


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
@click.option("--group", "group_index", type=int, default=None, hidden=True)
def suite_command(suite_file, ngpus, backend, csv_path, results_dir, no_save, quiet, overrides, group_index):
    """Run every entry of a suite file (collectives, sizes, dtypes, ops, env settings)."""
    from ncclbench.api import options as plan_options
    from ncclbench.cli import main as cli
    from ncclbench.launch import launcher as launch
    from ncclbench.engine.suite import env_groups, load_suite, parse_overrides

    from ncclbench.tune.suite import run_tune_entries, tune_entries

    runs, tunes = tune_entries(suite_file, load_suite(suite_file, parse_overrides(overrides)), ngpus, backend,
                               ranks_of_a_group=group_index is not None)
    if not runs:
        sys.exit(int(run_tune_entries(tunes)))
    groups = env_groups(runs)
    info = launch.detect()
    launched = info.launcher != "none"
    chosen = plan_options.choose_backend(backend)
    common = {"csv_path": csv_path, "results_dir": results_dir, "no_save": no_save, "output_file": None,
              "quiet": quiet}
    local = None if launched else cli.local_rank_count(ngpus, chosen)
    nranks = info.world_size if launched else local
    # Build every plan now: a bad entry is refused before anything starts.
    plans_by_group = []
    for _env, members in groups:
        plans = []
        for run in members:
            try:
                plan = plan_options.build_plan(run.collective, plan_options.options_for(run.options), chosen, sys.argv[1:], nranks)
                plan_options.validate_for_backend(plan, nranks)
            except PlanError as exc:
                raise PlanError(f"suite {suite_file}: runs[{run.index}] ({run.label}): {exc}") from None
            plans.append(plan)
        _one_stream_per_launch(suite_file, members, plans)
        plans_by_group.append(plans)

    if launched:
        if group_index is None:
            if len(groups) > 1:
                raise PlanError(f"suite {suite_file} sets {len(groups)} different env blocks: NCCL reads them once "
                                "per process, so run it with -g (one launch per env block) or split the file")
            group_index = 0
        spec = cli.output_spec(plans_by_group[group_index][0], common) if info.rank == 0 else None
        labels = [r.label for r in groups[group_index][1]]
        return sys.exit(int(_run_group(plans_by_group[group_index], labels, info, spec, suite_file)))

    cli.output_spec(plans_by_group[0][0], common)  # refuse unwritable outputs up front
    cli.announce_backend(backend, chosen, 0, local if ngpus == ALL_GPUS else None)
    worst = ExitCode.OK
    for k, (env, _members) in enumerate(groups):
        argv = ["suite", suite_file, "--group", str(k), "--backend", chosen]
        argv += ["--csv", csv_path] if csv_path else []
        argv += ["--results-dir", results_dir] if results_dir else []
        argv += ["--no-save"] if no_save else []
        argv += ["--quiet"] if quiet else []
        argv += [word for item in overrides for word in ("--set", item)]
        with launch.environ_changed(dict(env)):
            code = launch.spawn_local(local, argv)
        if code != ExitCode.OK:
            worst = code
        if code in (ExitCode.INTERRUPTED,):
            break
    if worst != ExitCode.INTERRUPTED and tunes:
        worst = run_tune_entries(tunes) or worst
    sys.exit(int(worst))


def _one_stream_per_launch(suite_file, members, plans) -> None:
    """The stream (-y, stream_null) is chosen once per launch, when the backend starts: an
    entry that asks for another one than the launch's first entry is refused, not ignored."""
    for run, plan in zip(members, plans):
        if plan.stream_null != plans[0].stream_null:
            raise PlanError(f"suite {suite_file}: runs[{run.index}] ({run.label}) sets stream_null "
                            f"{int(plan.stream_null)} but runs[{members[0].index}] ({members[0].label}), launched "
                            f"with it, sets {int(plans[0].stream_null)}: the stream is chosen once per launch; "
                            "put the entries of each stream_null in a suite of their own, or set it for all "
                            "with --set stream_null=N")


def _run_group(plans, labels, info, spec, suite_file) -> int:
    from dataclasses import replace

    from ncclbench.cli import main as cli
    from ncclbench.launch import launcher as launch
    from ncclbench.results.output import Reporter
    from ncclbench.engine.runner import leave_launched_rank, run_rank

    launch.prepare_environ(info)
    reporters = []

    def make_report(plan, run_info):
        run_info.topology, run_info.link_peak_gbps, peak_line_for = cli.topology_context(plan)
        rep = Reporter(run_info, replace(spec, timestamps=plan.report_timestamps, per_iter=plan.per_iter,
                                         per_iter_skip=plan.per_iter_skip,
                                         expected_rows=plan.expected_rows(run_info.nranks)),
                       peak_line_for=peak_line_for)
        reporters.append(rep)
        return rep

    def print_summary():  # run before the rank's teardown, which a held signal cuts short
        if info.rank == 0:
            for line in summary_lines(suite_file, labels, reporters):
                print(line, flush=True)

    return leave_launched_rank(info, run_rank(plans, info, make_report, epilogue=print_summary))


def summary_lines(suite_file, labels, reporters) -> list[str]:
    lines = [f"# Suite summary: {suite_file}",
             f"# {'label':32s} {'collective':>14s} {'rows':>5s} {'peak busbw':>11s} {'largest busbw':>14s} "
             f"{'#wrong':>7s}  status"]
    for label, rep in zip(labels, reporters):
        s = getattr(rep, "summary", None)
        if s is None:
            continue
        lines.append(f"# {label[:32]:32s} {rep.info.collective:>14s} {len(s.rows):5d} {s.peak_busbw:11.2f} "
                     f"{s.largest_size_busbw:14.2f} {s.wrong:7d}  {s.status}")
    for label in labels[len(reporters):]:
        lines.append(f"# {label[:32]:32s} {'-':>14s} {0:5d} {'-':>11s} {'-':>14s} {'-':>7s}  not run")
    return lines
