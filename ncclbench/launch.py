"""Starting ranks: run as the rank a launcher made us, or self-spawn local ranks
through torchrun's own machinery (torch.distributed.run)."""

from __future__ import annotations

import logging
import os
import sys

from ncclbench.errors import BenchError, ExitCode, PlanError

SPAWNED_ENV = "NCCLBENCH_SPAWNED"


def detect(explicit: dict | None = None):
    """This process's LaunchInfo; PlanError on a contradictory environment."""
    from ncclbench.launchenv import LaunchEnvError, detect as detect_env

    try:
        return detect_env(os.environ, explicit=explicit or None)
    except LaunchEnvError as exc:
        raise PlanError(str(exc)) from exc


def prepare_environ(info) -> None:
    from ncclbench.launchenv import LaunchEnvError, apply_to_environ

    try:
        apply_to_environ(info, os.environ)
    except LaunchEnvError as exc:
        raise PlanError(str(exc)) from exc


def spawn_local(nprocs: int, argv: list[str], nnodes: int = 1, node_rank: int = 0,
                rdzv_endpoint: str | None = None) -> int:
    """Run `python -m ncclbench <argv>` as `nprocs` ranks per node under torchrun's elastic
    agent, and return the exit code that best describes what happened."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set, minus its warning
    os.environ.setdefault("NCCL_NVLS_ENABLE", os.environ.get("NCCL_NVLS_ENABLE", "0"))
    os.environ[SPAWNED_ENV] = "1"
    targs = ["--nproc-per-node", str(nprocs), "--max-restarts", "0"]
    if nnodes > 1 or rdzv_endpoint:
        targs += ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                  "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint or "127.0.0.1:29500"]
    else:
        targs += ["--standalone"]
    targs += ["--module", "ncclbench", *argv]
    if not os.environ.get("NCCLBENCH_VERBOSE"):
        # The elastic agent logs each failed child with a traceback-like dump; the
        # ranks already said what went wrong on one line.
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        logging.getLogger("torch.distributed.run").setLevel(logging.CRITICAL)
    try:
        run(parse_args(targs))
    except ChildFailedError as exc:
        return exit_code_of_failure(exc.failures)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the agent itself failed (rendezvous, ports)
        raise BenchError(f"torchrun could not start the ranks: {str(exc).splitlines()[0]}",
                         ExitCode.NCCL_ERROR) from exc
    return ExitCode.OK


def exit_code_of_failure(failures: dict) -> int:
    """Rank 0's code when it failed (it knows the run's outcome), else the first failure's;
    a rank killed by a signal counts as a lost peer (NCCL error)."""
    if not failures:
        return ExitCode.NCCL_ERROR
    ordered = sorted(failures.items())
    for rank, failure in ordered:
        if rank == 0 and failure.exitcode > 0:
            return failure.exitcode
    code = ordered[0][1].exitcode
    return code if code > 0 else ExitCode.NCCL_ERROR


def visible_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU for us
        return 0


def say(message: str) -> None:
    print(f"ncclbench: {message}", file=sys.stderr, flush=True)
