"""`ncclbench preflight` across simulated hosts on one machine (tests/netsim.py: a network
namespace, hostname and bridge port per host), healthy and with one host's NIC capped;
wall time, preflight's own time per phase, and the verdict, one JSON line per run.

    python benchmarks/preflight_hosts.py --hosts 4 --gpus-per-host 1 [--slow-nic 2:2gbit] [--budget 10]

On GPUs each host gets its own GPUs (CUDA_VISIBLE_DEVICES) and NCCL_HOSTID, so that NCCL
crosses the simulated network (NET/Socket over eth0); without GPUs, gloo ranks. Needs root."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def host_env(i: int, gpus: int, gpu: bool) -> dict:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1")
    if gpu:
        env.update(CUDA_VISIBLE_DEVICES=",".join(str(i * gpus + k) for k in range(gpus)), NCCL_HOSTID=f"simhost{i}",
                   NCCL_SOCKET_IFNAME="eth0", NCCL_IB_DISABLE="1")
    return env


def run(hosts: int, gpus: int, slow: str | None, budget: float, gpu: bool) -> dict:
    import netsim

    out = Path(tempfile.mkdtemp()) / "preflight.json"
    argv = [sys.executable, "-m", "ncclbench", "preflight", "--backend", "nccl" if gpu else "gloo", "-T", "60",
            "--budget", str(budget), "--json", str(out)]
    with netsim.SimFleet(hosts) as fleet:
        if slow:
            node, rate = slow.split(":")
            fleet.slow_nic(int(node), rate)
        start = time.monotonic()
        procs = [fleet.start(i, argv, gpus, port=29571, env=host_env(i, gpus, gpu)) for i in range(hosts)]
        stdout, stderr = procs[0].communicate(timeout=900)
        for p in procs[1:]:
            p.wait(timeout=120)
        wall = time.monotonic() - start
    doc = json.loads(out.read_text()) if out.exists() else {}
    return {"hosts": hosts, "gpus_per_host": gpus, "slow_nic": slow, "budget_s": budget, "exit": procs[0].returncode,
            "wall_s": round(wall, 1), "preflight_s": round(sum(doc.get("cost_s", {}).values()), 1),
            "cost_s": {k: round(v, 1) for k, v in doc.get("cost_s", {}).items()}, "drain": doc.get("drain"),
            "bad_ranks": doc.get("bad_ranks"), "bad_links": doc.get("bad_links"), "notes": doc.get("notes"),
            "margins": doc.get("margins"), "stdout": stdout[-3000:], "stderr": stderr[-1500:] if not doc else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus-per-host", type=int, default=1)
    parser.add_argument("--slow-nic", default=None, help="NODE:RATE, e.g. 2:2gbit (tc tbf on that host's eth0)")
    parser.add_argument("--budget", type=float, default=10.0)
    args = parser.parse_args()
    import netsim

    reason = netsim.why_not()
    if reason:
        sys.exit(f"preflight_hosts: cannot make simulated hosts: {reason}")
    try:
        import torch

        gpu = torch.cuda.is_available() and torch.cuda.device_count() >= args.hosts * args.gpus_per_host
    except ImportError:
        gpu = False
    print(json.dumps(run(args.hosts, args.gpus_per_host, args.slow_nic, args.budget, gpu)), flush=True)


if __name__ == "__main__":
    main()
