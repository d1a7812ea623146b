"""What a run's header and JSON say about it besides its rows: the run info (versions,
configuration, environment, notes) and the ranks whose NCCL settings differ."""

from __future__ import annotations

import datetime as _dt
import os

from ncclbench import __version__
from ncclbench.engine import onerank
from ncclbench.engine.guard import ranks_text
from ncclbench.results.records import RunInfo
from ncclbench.topology import nccldebug


def now() -> str:
    return _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def nccl_environ() -> tuple[str, ...]:
    """This rank's NCCL settings (nccl-tests' NCCL_TESTS_* are not NCCL's)."""
    return tuple(sorted(f"{k}={v}" for k, v in os.environ.items()
                        if k.startswith("NCCL_") and not k.startswith("NCCL_TESTS_") and not nccldebug.ours(k, v)))


def environ_note(envs: list[tuple[str, ...]]) -> str | None:
    """A header note naming the ranks whose NCCL settings differ from rank 0's (the header's
    `# NCCL environment` line and the JSON's env are rank 0's)."""
    others: dict[tuple[str, ...], list[int]] = {}
    for rank, env in enumerate(envs):
        if env != envs[0]:
            others.setdefault(env, []).append(rank)
    if not others:
        return None
    return "NCCL environment differs by rank: " + "; ".join(
        f"{ranks_text(ranks)}: {' '.join(env) or 'no NCCL_* set'}" for env, ranks in others.items())


def skipped_text(plan) -> str:
    """`uint32, f8e4m3, int8 (avg)`: whole types, or the ops skipped for a type."""
    ops = plan.op_list()
    parts = []
    for d in plan.dtypes:
        gone = [op for op in ops if (d, op) in plan.skipped]
        if gone:
            parts.append(d if len(gone) == len(ops) or not plan.coll.has_op else f"{d} ({', '.join(gone)})")
    return ", ".join(parts)


def _integral(value: float) -> float | int:
    """8.0 -> 8 (nccl-tests writes the step factor as an integer); 1.5 stays 1.5."""
    return int(value) if float(value).is_integer() else value


def build_run_info(plan, backend, devices) -> RunInfo:
    import torch

    code, text = backend.library_version()
    notes = []
    if plan.split:
        groups = plan.groups(backend.nranks)
        notes.append(f"split {plan.split}: {len(groups)} groups of {len(groups[0])} ranks run the test in parallel "
                     "(each rank's group is in `# Using devices`); times are averaged over all ranks")
    if plan.traffic is not None:
        notes.append(plan.traffic.describe())
    if plan.skipped:
        where = f"the {plan.backend} backend"
        if plan.skipped != plan.without_unsupported().skipped:  # some pairs only for the rank count
            where += f" with {backend.group_size} rank(s) per communicator"
        notes.append(f"skipped what {where} cannot run: {skipped_text(plan)}")
    notes += onerank.header_notes(plan, backend.group_size)
    config = {
        "nthreads": 1, "ngpus": 1, "minimum_bytes": plan.min_bytes, "maximum_bytes": plan.max_bytes,
        "step_bytes" if plan.step_factor == 1 else "step_factor":
            plan.step_bytes if plan.step_factor == 1 else _integral(plan.step_factor),
        "warmup_iters": plan.warmup_iters, "iterations": plan.iters,
        "aggregated_iterations": plan.agg_iters, "validation": plan.check, "graph": plan.graph_replays,
        "blocking_collectives": "true" if plan.blocking else "false", "blocking_mode": plan.blocking,
        "per_iter_timing": "true" if plan.per_iter else "false", "per_iter_skip": plan.per_iter_skip,
        "parallel_init": "false", "unalign": plan.unalign, "min_bw": plan.min_bw, "min_peak_bw": plan.min_peak_bw,
    }
    # what shapes the numbers: NCCL's and PyTorch's knobs (TORCH_FR_*: its flight recorder)
    env = sorted(f"{k}={v}" for k, v in os.environ.items()  # less NCCL's log, which ncclbench turned on itself
                 if k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "CUDA_", "NCCLBENCH_")) and not nccldebug.ours(k, v))
    return RunInfo(
        collective=plan.coll.name, args=list(plan.args), backend=plan.backend, mode=plan.mode.value,
        timing=backend.timing_name(), nranks=backend.group_size, devices=devices,
        ncclbench_version=__version__, torch_version=torch.__version__, nccl_code=code, nccl_text=text,
        config=config, env=env, start_time=now(), notes=notes, report_cputime=plan.report_cputime,
    )
