"""ncclbench: NCCL collective benchmarks in the style of nccl-tests, on torch.distributed.

The Python API (`ncclbench.measure`, `ncclbench.preflight`, `ncclbench.fleet`, their result
types and errors) is imported on first use, so that `import ncclbench` stays light: no torch,
no pandas."""

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "measure": "ncclbench.api.measure",
    "Rows": "ncclbench.api.rows",
    "preflight": "ncclbench.faults.preflight.run",
    "fleet": "ncclbench.faults.fleet.api",
    "FleetReport": "ncclbench.faults.fleet.report",
    "PreflightReport": "ncclbench.faults.preflight.verdict",
    "BenchError": "ncclbench.errors",
    "PlanError": "ncclbench.errors",
    "LaunchError": "ncclbench.errors",
    "CollectiveError": "ncclbench.errors",
    "TimeoutExpired": "ncclbench.errors",
    "PreflightError": "ncclbench.errors",
    "FleetError": "ncclbench.errors",
    "RankFailures": "ncclbench.errors",
    "Interrupted": "ncclbench.errors",
    "ExitCode": "ncclbench.errors",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ncclbench' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
