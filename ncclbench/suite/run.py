"""`ncclbench suite FILE.yaml`: many runs (collectives x dtypes x ops x env settings) in
as few launches as the environment allows: one launch per distinct `env` block.

Everything a suite file goes through is here, top to bottom: the file read and checked
(load_suite, with --set's overrides), its entries grouped by environment, every entry's
plan built before anything starts, then one launch per group, whose ranks re-enter with
--group and run that group's plans, rank 0 printing the summary. `tune:` entries are
tune's own runs (ncclbench.tune.suite): the command runs them after these."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.api import command
from ncclbench.api.params import ALL_GPUS
from ncclbench.errors import ExitCode, PlanError

# option names a suite entry may set (the long names of the collective options)
RUN_KEYS = {
    "minbytes", "maxbytes", "stepbytes", "stepfactor", "op", "datatype", "root", "iters", "warmup_iters",
    "agg_iters", "run_cycles", "check", "blocking", "average", "timeout", "report_timestamps", "cudagraph",
    "report_cputime", "per_iter_timing", "per_iter_skip", "min_bw", "min_peak_bw", "unalign", "memory_report",
    "local_register", "stream_null",
}
ENTRY_KEYS = RUN_KEYS | {"collective", "label", "env", "tune"}


@dataclass(frozen=True)
class SuiteRun:
    index: int
    label: str
    collective: str
    options: dict               # RUN_KEYS values (raw, validated later by group_plans)
    env: tuple = field(default=())  # sorted (name, value) pairs
    tune: dict | None = None        # `tune:` settings: run `ncclbench tune` on this entry (ncclbench.tune.suite)


def parse_overrides(items) -> dict:
    """`--set KEY=VALUE` items -> {key: value}, values read as YAML scalars (`1` an int,
    `4G` a string), keys among RUN_KEYS."""
    import yaml

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PlanError(f"--set {item!r}: expected KEY=VALUE, e.g. --set cudagraph=1")
        if key not in RUN_KEYS:
            raise PlanError(f"--set: unknown key {key!r} (allowed: {', '.join(sorted(RUN_KEYS))})")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = None
        if value is None or isinstance(value, (list, dict)):
            raise PlanError(f"--set {key}: {text!r} is not a single value")
        out[key] = value
    return out


def load_suite(path: str, overrides: dict | None = None) -> list[SuiteRun]:
    """Parse and check a suite file; every problem names the file, the entry and the key.
    `overrides` (parse_overrides) replace those options in every entry."""
    import yaml

    from ncclbench.engine.collectives import lookup

    from ncclbench.inputs import InputFileError, read_text

    try:
        doc = yaml.safe_load(read_text(path, "suite"))
    except InputFileError as exc:
        raise PlanError(str(exc)) from None
    except RecursionError:
        raise PlanError(f"suite {path}: not valid YAML (nested too deep)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise PlanError(f"suite {path}: not valid YAML{where}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise PlanError(f"suite {path}: expected a mapping with a non-empty list 'runs'")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise PlanError(f"suite {path}: 'defaults' must be a mapping")
    _check_keys(path, "defaults", defaults, RUN_KEYS | {"env"})
    runs = []
    for i, entry in enumerate(doc["runs"]):
        where = f"runs[{i}]"
        if isinstance(entry, str):
            entry = {"collective": entry}
        if not isinstance(entry, dict):
            raise PlanError(f"suite {path}: {where} must be a mapping or a collective name")
        _check_keys(path, where, entry, ENTRY_KEYS)
        if "collective" not in entry:
            raise PlanError(f"suite {path}: {where} has no 'collective'")
        try:
            coll = lookup(str(entry["collective"]))
        except KeyError:
            raise PlanError(f"suite {path}: {where}: unknown collective {entry['collective']!r}") from None
        for scope in (defaults, entry):
            if not isinstance(scope.get("env") or {}, dict):
                raise PlanError(f"suite {path}: {where}: env must be a mapping of NAME: value")
        env = dict(defaults.get("env") or {})
        env.update(entry.get("env") or {})
        if not all(isinstance(k, str) for k in env):
            raise PlanError(f"suite {path}: {where}: env names must be strings")
        options = {k: v for k, v in defaults.items() if k != "env"}
        options.update({k: v for k, v in entry.items() if k in RUN_KEYS})
        options.update(overrides or {})
        label = str(entry.get("label") or _default_label(coll.command, options, env))
        tune = entry.get("tune") or None
        if tune is not None and tune is not True and not isinstance(tune, dict):
            raise PlanError(f"suite {path}: {where}: tune must be true or a mapping of tune settings")
        runs.append(SuiteRun(i, label, coll.name, options, tuple(sorted((k, str(v)) for k, v in env.items())),
                             {} if tune is True else tune))
    return runs


def _check_keys(path, where, mapping, allowed):
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise PlanError(f"suite {path}: {where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _default_label(name, options, env) -> str:
    parts = [name] + [str(options[k]) for k in ("datatype", "op") if k in options]
    parts += [f"{k}={v}" for k, v in sorted(env.items())]
    return "-".join(parts)


def env_groups(runs: list[SuiteRun]) -> list[tuple[tuple, list[SuiteRun]]]:
    """Runs sharing an environment, in file order of first appearance."""
    groups: dict[tuple, list[SuiteRun]] = {}
    for r in runs:
        groups.setdefault(r.env, []).append(r)
    return list(groups.items())


def run_suite(suite_file: str, runs: list[SuiteRun], ngpus, backend, outputs: dict, overrides=(),
              group_index: int | None = None, argv=()) -> int:
    """Run the suite's entries (none of them `tune:`): under a launcher, as one of its
    ranks (the group `group_index`, or the only one); else one local launch per group.
    `outputs`: csv_path, results_dir, no_save, quiet, metrics_path; `overrides`: the --set items, passed
    on to the launches; `argv`: the command line, kept with each run. The exit code."""
    from ncclbench.api import options as plan_options
    from ncclbench.launch import launcher as launch

    groups = env_groups(runs)
    info = launch.detect()
    launched = info.launcher != "none"
    chosen = plan_options.choose_backend(backend)
    # one --metrics file for the suite: a later launch (env group) adds its runs to the first's
    common = dict(outputs, output_file=None, command="suite", metrics_merge=bool(group_index))
    local = None if launched else command.local_rank_count(ngpus, chosen)
    nranks = info.world_size if launched else local
    # Build every plan now: a bad entry is refused before anything starts.
    plans_by_group = [group_plans(suite_file, members, chosen, list(argv), nranks) for _env, members in groups]

    if launched:
        if group_index is None:
            if len(groups) > 1:
                raise PlanError(f"suite {suite_file} sets {len(groups)} different env blocks: NCCL reads them once "
                                "per process, so run it with -g (one launch per env block) or split the file")
            group_index = 0
        spec = command.output_spec(plans_by_group[group_index][0], common) if info.rank == 0 else None
        labels = [r.label for r in groups[group_index][1]]
        return run_group(plans_by_group[group_index], labels, info, spec, suite_file)

    command.output_spec(plans_by_group[0][0], common)  # refuse unwritable outputs up front
    from ncclbench.api.capacity import check_host_capacity
    from ncclbench.launch.failures import say

    for line in check_host_capacity([p for plans in plans_by_group for p in plans], local, nranks, chosen):
        say(line)
    command.announce_backend(backend, chosen, 0, local if ngpus == ALL_GPUS else None)
    return launch_groups(suite_file, groups, local, chosen, outputs, overrides)


def group_plans(suite_file: str, members: list[SuiteRun], backend: str, argv: list[str], nranks) -> list:
    from ncclbench.api import options as plan_options

    plans = []
    for run in members:
        try:
            plan = plan_options.checked_plan(run.collective, run.options, backend, argv, nranks)
        except PlanError as exc:
            raise PlanError(f"suite {suite_file}: runs[{run.index}] ({run.label}): {exc}") from None
        plans.append(plan)
    _one_stream_per_launch(suite_file, members, plans)
    return plans


def launch_groups(suite_file: str, groups, local: int, backend: str, outputs: dict, overrides) -> int:
    """One local launch of `local` ranks per group, its env block set for it; the ranks
    re-enter with --group k. The most recent failing code; an interrupt stops the rest."""
    from ncclbench.launch import launcher as launch

    worst = ExitCode.OK
    for k, (env, _members) in enumerate(groups):
        argv = ["suite", suite_file, "--group", str(k), "--backend", backend]
        argv += ["--csv", outputs["csv_path"]] if outputs["csv_path"] else []
        argv += ["--results-dir", outputs["results_dir"]] if outputs["results_dir"] else []
        argv += ["--no-save"] if outputs["no_save"] else []
        argv += ["--quiet"] if outputs["quiet"] else []
        argv += ["--metrics", outputs["metrics_path"]] if outputs.get("metrics_path") else []
        argv += [word for item in overrides for word in ("--set", item)]
        with launch.environ_changed(dict(env)):
            code = launch.spawn_local(local, argv)
        if code != ExitCode.OK:
            worst = code
        if code == ExitCode.INTERRUPTED:
            break
    return worst


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


def run_group(plans, labels, info, spec, suite_file) -> int:
    """One group's plans on this rank; rank 0 prints the suite's summary at the end."""

    def print_summary(reporters):  # run before the rank's teardown, which a held signal cuts short
        if info.rank == 0:
            for line in summary_lines(suite_file, labels, reporters):
                print(line, flush=True)

    return command.run_as_rank(plans, info, spec, epilogue=print_summary)


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
