"""What a benchmark command does around its plans, for each collective's command and the
suite alike: how many ranks start on this node, its outputs refused before anything starts,
the one line about the backend, and a launched rank's run with rank 0's reports."""

from __future__ import annotations

import os

from ncclbench.api.params import ALL_GPUS, CPU_RANKS_FOR_ALL
from ncclbench.errors import ExitCode, PlanError


def announce_backend(requested: str | None, chosen: str, rank: int, all_ranks: int | None = None) -> None:
    """Say once, after validation, that a GPU-less machine falls back to gloo (and with
    how many ranks `-g all` runs there)."""
    from ncclbench.launch.failures import say

    if requested is None and chosen == "gloo" and rank == 0 and not os.environ.get("NCCLBENCH_SPAWNED"):
        ranks = f" with {all_ranks} ranks (-g all)" if all_ranks else ""
        say(f"no CUDA GPU visible: using the gloo CPU backend{ranks} (timings are host-clock CPU numbers)")


def output_spec(plan, o: dict):
    from ncclbench.results.output import OutputSpec, check_csv_appendable, check_writable, default_results_dir, probe_directory

    for flag, key in (("-J", "output_file"), ("--csv", "csv_path")):
        if o[key] is not None and not o[key].strip():
            raise PlanError(f"{flag} needs a file name (got an empty one)")
    if o["output_file"] and o["csv_path"] and os.path.realpath(o["output_file"]) == os.path.realpath(o["csv_path"]):
        raise PlanError(f"-J and --csv name the same file {o['csv_path']}: the JSON rewrites would erase the CSV rows")
    if o["output_file"]:
        check_writable(o["output_file"], "JSON file")
    if o["csv_path"]:
        check_csv_appendable(o["csv_path"])
    results_dir = None
    if not o["no_save"]:
        results_dir = o["results_dir"] or default_results_dir()
        try:
            os.makedirs(results_dir, exist_ok=True)
        except OSError as exc:
            raise PlanError(f"cannot use result store {results_dir}: {exc.strerror}") from None
        if not os.access(results_dir, os.W_OK):
            raise PlanError(f"cannot write to result store {results_dir} (use --results-dir or --no-save)")
        probe_directory(results_dir, f"cannot write to result store {results_dir} (use --results-dir or --no-save)")
    return OutputSpec(json_path=o["output_file"], csv_path=o["csv_path"], results_dir=results_dir,
                      timestamps=plan.report_timestamps, per_iter=plan.per_iter, per_iter_skip=plan.per_iter_skip,
                      progress=not o.get("quiet"), metrics_path=o.get("metrics_path"),
                      metrics_merge=bool(o.get("metrics_merge")), command=o.get("command", ""))


def local_rank_count(requested, backend: str) -> int:
    """The ranks to start on this node for -g `requested` (None: 1; `all`: one per visible
    GPU, CPU_RANKS_FOR_ALL on gloo without a GPU); PlanError, exit 5 as in nccl-tests, when
    a GPU backend cannot have that many GPUs."""
    from ncclbench.topology import visible as topo_visible

    ngpus = 1 if requested is None else requested
    if ngpus != ALL_GPUS and ngpus < 1:
        raise PlanError(f"-g must be at least 1 (got {ngpus})")
    if backend not in ("nccl", "cupy"):
        if ngpus == ALL_GPUS:
            return topo_visible.visible_gpu_count() or CPU_RANKS_FOR_ALL
        return ngpus
    visible = topo_visible.visible_gpu_count()
    if visible == 0 and requested in (None, ALL_GPUS):
        raise PlanError(f"the {backend} backend needs a CUDA GPU and none is visible (--backend gloo runs on the CPU)",
                        ExitCode.BAD_GPU_COUNT)
    if ngpus == ALL_GPUS:
        return visible
    if ngpus > visible:
        raise PlanError(f"-g {ngpus} asks for more GPUs than the {visible} visible", ExitCode.BAD_GPU_COUNT)
    return ngpus


def run_as_rank(plans, info, spec, epilogue=None) -> int:
    """Run `plans` as the rank a launcher made this process; rank 0 reports each one to
    `spec`'s outputs. `epilogue(reporters)` runs once the plans have ended, before the
    rank's teardown, which a held signal cuts short (a suite prints its summary there)."""
    from dataclasses import replace

    from ncclbench.launch import launcher as launch
    from ncclbench.results.output import Reporter
    from ncclbench.engine.lifecycle import leave_launched_rank, run_rank

    launch.prepare_environ(info)
    reporters, metrics_runs = [], []  # every plan's run goes into the one --metrics file

    def make_report(plan, run_info):
        run_info.topology, run_info.link_peak_gbps, peak_line_for = topology_context(plan)
        peak_line_for = path_trailer(run_info, peak_line_for)
        rep = Reporter(run_info, replace(spec, timestamps=plan.report_timestamps, per_iter=plan.per_iter,
                                         per_iter_skip=plan.per_iter_skip,
                                         expected_rows=plan.expected_rows(run_info.nranks)),
                       peak_line_for=peak_line_for, metrics_runs=metrics_runs)
        reporters.append(rep)
        return rep

    after = (lambda: epilogue(reporters)) if epilogue else None
    return leave_launched_rank(info, run_rank(plans, info, make_report, epilogue=after))


def topology_context(plan):
    """(summary line, NVLink peak GB/s, trailer-line maker) for GPU runs; empty otherwise."""
    try:
        from ncclbench.topology.header import header_context
    except ImportError:
        return None, None, None
    return header_context(plan.backend)


def path_trailer(run_info, fallback):
    """The best-busbw line against the peak of the path NCCL used, where its log was read."""
    from ncclbench.topology.header import path_trailer as make

    return make(run_info.nccl_path, run_info.link_peak_gbps) or fallback
