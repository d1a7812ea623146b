"""Preflight a training job's own process groups before its first step.

    torchrun --nproc-per-node 8 examples/preflight_job.py --dp 2 --tp 4
    torchrun --nproc-per-node 4 examples/preflight_job.py --dp 2 --tp 2     # no GPU: gloo on the CPU

Copy the block between the markers into your training script, after the DeviceMesh is built.

What the verdict means:
  passed          every group of each mesh dimension ran its short plan (all_reduce, all_gather,
                  reduce_scatter at three sizes) within the band of its peers (20 % by default,
                  wider where the healthy groups themselves are noisy) and above the floor.
  report.failures one line each, worst first: which group and collective, how far below its
                  peers or the floor, and, when it could be localised, which rank and host:
                  "slow with known-good partners" = a bad node (drain that host);
                  "its ranks are fine with known-good partners" = a slow link between them.
  report.drain    hosts a scheduler should take out; report.to_json(path) keeps the evidence.
  report.groups   per group: best busbw, link peak, and what NCCL most likely used (NVLink,
                  PCIe, RDMA NICs or a TCP socket fallback; inferred, and said so).

What it costs: a few collectives to agree and calibrate, then about 60 % of budget_s when
everything is healthy; about budget_s plus a few pair rounds when something is flagged (it is
measured again before anyone is accused). GPU memory: buffers for 256 MiB messages at most,
and never more than a sixth of what is free. It creates no process group and leaves the
mesh's groups, the current device and stream as they were.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import ncclbench


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--floor", default=None, help="GB/s, 80%% of the link peak, or a baseline results file")
    parser.add_argument("--json", default="preflight.json")
    args = parser.parse_args()

    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh("cuda" if gpu else "cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))

    # ---- copy from here ----------------------------------------------------------------------
    report = ncclbench.preflight(
        groups={"dp": mesh.get_group("dp"), "tp": mesh.get_group("tp")},
        min_peak_busbw=args.floor,   # None: judge groups and ranks against their peers only
        budget_s=args.budget,
        json_path=args.json,         # rank 0 writes the hosts to drain and the evidence
    )
    if dist.get_rank() == 0:
        print("\n".join(report.lines()), flush=True)
    if not report.passed:            # the same verdict on every rank: all stop together
        dist.destroy_process_group()
        try:
            report.raise_if_failed()
        except ncclbench.PreflightError as exc:
            print(f"rank {dist.get_rank()}: {exc}", file=sys.stderr)
            return int(exc.exit_code)
    # ---- to here ----------------------------------------------------------------------------------

    # ... the job's first step would start here ...
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
