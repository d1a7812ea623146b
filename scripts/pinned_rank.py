"""Run one ncclbench rank under torchrun with its CPU affinity narrowed first, to see
whether where a rank's threads run changes small-message times.

    PIN=4 torchrun --nproc-per-node 2 scripts/pinned_rank.py allreduce --backend cupy -b 8 -e 4K -f 8

PIN=none leaves the affinity alone; PIN=K gives local rank r the K CPUs that follow the
first two of the CPUs it may use (r*K+2 .. r*K+K+1), so that no two ranks share a CPU and
the first two CPUs stay free for the system (PIN_SKIP=n: the first n). Everything after the script name is
ncclbench's command line. The CPUs used are printed to stderr."""

from __future__ import annotations

import os
import sys


def pinned_cpus(allowed: list[int], local_rank: int, per_rank: int, skip: int = 2) -> list[int]:
    """The CPUs local_rank gets: `per_rank` of `allowed` (sorted), after the first `skip`."""
    if per_rank < 1:
        raise ValueError(f"PIN must be a positive number of CPUs, not {per_rank}")
    first = skip + local_rank * per_rank
    mine = sorted(allowed)[first:first + per_rank]
    if len(mine) < per_rank:
        raise ValueError(f"local rank {local_rank} needs CPUs {first}..{first + per_rank - 1} "
                         f"of the {len(allowed)} this process may use")
    return mine


def main() -> int:
    mode = os.environ.get("PIN", "none")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if mode != "none":
        try:
            cpus = pinned_cpus(list(os.sched_getaffinity(0)), local_rank, int(mode),
                               int(os.environ.get("PIN_SKIP", "2")))
        except ValueError as exc:
            print(f"pinned_rank.py: error: {exc}", file=sys.stderr)
            return 2
        os.sched_setaffinity(0, cpus)
    print(f"# local rank {local_rank} PIN={mode} cpus {sorted(os.sched_getaffinity(0))}", file=sys.stderr)
    from ncclbench.cli import main as ncclbench_main

    ncclbench_main(sys.argv[1:])  # exits with ncclbench's own code on failure
    return 0


if __name__ == "__main__":
    sys.exit(main())
