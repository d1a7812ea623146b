"""`tune:` entries of a suite file: the entry's collective and run options, tuned.

    runs:
      - collective: all_reduce
        minbytes: 8
        maxbytes: 1G
        stepfactor: 2
        tune: {repeat: 5, channels: "8,16", output_dir: tuned/all_reduce}

Each such entry is one `ncclbench tune` run (its own launches), after the suite's other
entries; all of them are checked before anything starts."""

from __future__ import annotations


from ncclbench.errors import ExitCode, PlanError
from ncclbench.launch.launcher import environ_changed

TUNE_KEYS = {"repeat", "channels", "algos", "protos", "min_gain", "output_dir", "rehearse", "plot"}


def request_for(suite_file: str, run, ngpus, backend):
    from ncclbench.api import options as plan_options
    from ncclbench.tune.plan import parse_channels, parse_names
    from ncclbench.tune.ranges import DEFAULT_REPEATS
    from ncclbench.tune.run import RUN_OPTIONS, TuneRequest

    where = f"suite {suite_file}: runs[{run.index}] ({run.label})"
    unknown = sorted(set(run.tune) - TUNE_KEYS)
    if unknown:
        raise PlanError(f"{where}: tune: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(TUNE_KEYS))})")
    t = run.tune
    others = sorted(set(run.options) - set(RUN_OPTIONS))
    if others:
        raise PlanError(f"{where}: tune measures with its own run options; {others[0]!r} is not one of them "
                        f"({', '.join(RUN_OPTIONS)})")
    defaults = {"minbytes": 8, "maxbytes": "1G", "stepfactor": 2, "warmup_iters": 5}
    try:
        opts = plan_options.options_for(dict(defaults, **run.options))
        request = TuneRequest(
            collectives=[run.collective], options={k: opts[k] for k in RUN_OPTIONS}, ngpus=ngpus or 1,
            backend=backend, rehearse=bool(t.get("rehearse")), repeat=int(t.get("repeat", DEFAULT_REPEATS)),
            channels=parse_channels(t.get("channels") if t.get("channels") is None else str(t["channels"])),
            algos=parse_names(t.get("algos"), "algorithm"), protos=parse_names(t.get("protos"), "protocol"),
            min_gain=float(t.get("min_gain", 2.0)), output_dir=t.get("output_dir"), plot=bool(t.get("plot", True)))
    except (ValueError, TypeError) as exc:
        raise PlanError(f"{where}: tune: {exc}") from None
    return request


def tune_entries(suite_file: str, runs, ngpus, backend, ranks_of_a_group=False):
    """(the other entries, the tune entries' prepared runs), everything checked now. The
    ranks the suite starts for its other entries leave the tune entries out."""
    from ncclbench.launch import launcher as launch
    from ncclbench.tune.run import prepare

    tunes = [r for r in runs if r.tune is not None]
    if ranks_of_a_group:
        return [r for r in runs if r.tune is None], []
    if tunes and launch.detect().launcher != "none":
        raise PlanError(f"suite {suite_file}: tune entries start their own launches; run the suite with -g, "
                        "not under torchrun/srun/mpirun")
    prepared = []
    for run in tunes:
        request = request_for(suite_file, run, ngpus, backend)
        with environ_changed(dict(run.env)):
            try:
                prepared.append((run, prepare(request)))
            except PlanError as exc:
                raise PlanError(f"suite {suite_file}: runs[{run.index}] ({run.label}): {exc}", exc.exit_code) from None
    return [r for r in runs if r.tune is None], prepared


def run_tune_entries(prepared) -> int:
    from ncclbench.tune.run import execute

    worst = ExitCode.OK
    for run, setup in prepared:
        with environ_changed(dict(run.env)):
            code = execute(setup)
        if code != ExitCode.OK:
            worst = code
        if code == ExitCode.INTERRUPTED:
            break
    return worst

