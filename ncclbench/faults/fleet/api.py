"""`ncclbench.fleet()`: the fleet run from Python, in every rank of a job started by torchrun,
srun or mpirun (one rank per GPU), on the job's default process group where it has one.
Every rank returns the same report (FleetReport: hosts, links, drain; its raise_if_failed)."""

from __future__ import annotations

from ncclbench.errors import PlanError


def fleet(**options):
    """Run a fleet check; the options are the command's, by their long names (size="256M",
    budget=30.0, iters, warmup_iters, gpus_per_node, band, min_busbw, all_pairs_up_to, rounds,
    localise_rounds, seed, timeout, backend, sim_node_size, json_path, csv_path, drain_path,
    drain_format, metrics_path),
    with the command's defaults (ncclbench.faults.fleet.plan.DEFAULTS)."""
    from dataclasses import replace

    from ncclbench.api.options import choose_backend
    from ncclbench.faults.fleet.plan import DEFAULTS, build_plan
    from ncclbench.faults.fleet.report import FleetReport
    from ncclbench.faults.fleet.run import run_fleet
    from ncclbench.launch import launcher as launch

    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise PlanError(f"fleet() got unknown option(s) {', '.join(unknown)}; it takes {', '.join(DEFAULTS)}")
    o = {**DEFAULTS, **options}
    info = launch.detect()
    if not info.launched:
        raise PlanError("fleet() runs in every rank of a job started by torchrun, srun or mpirun "
                        "(or use the command: ncclbench fleet -g N)")
    plan = replace(build_plan(o, choose_backend(o["backend"])), share_report=True)
    code, doc = run_fleet(plan, info)
    if doc is None:
        raise PlanError(f"fleet: nothing was judged (exit {code}); see the message above")
    return FleetReport.from_dict(doc)
