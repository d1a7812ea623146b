"""`tune` with its ranks on two simulated hosts of one GPU machine (network namespaces,
tests/netsim.py; root): each host gets its own GPUs, hostname and NCCL_HOSTID, so NCCL runs
its NET/Socket transport between them and P2P inside each. Node 0's output (the table and
files) lands in --out; then `--verify` of the file it wrote, with --plugin.

    NCCL_NVLS_ENABLE=0 python benchmarks/tune_two_hosts.py --gpus-per-host 2 --out /tmp/two-hosts \\
        [--plugin /path/libnccl-tuner-example.so] [-- extra tune options]

Defaults: all_reduce and all_gather, 8 B to 256 MiB, -f 4, and (unless other tune options
are given after --) `-n 5 -w 1 -G 2 --repeat 3`: over sockets between hosts (~3 GB/s busbw
on 2 x 2 H100s) one 256 MiB all_reduce takes ~0.1 s, and tune's defaults (-n 20, -G 5,
5 repeats, 7 combinations) would spend ~40 s per item on that size alone. Exit 0 when both runs ended 0
(or the verify was not asked for), else the first failing exit code; 2 without root or
namespaces."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def node_env(i: int, gpus: int) -> dict:
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES=",".join(str(i * gpus + k) for k in range(gpus)), NCCL_HOSTID=f"simnode{i}",
               NCCL_SOCKET_IFNAME="eth0", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1")
    return env


def run_on_hosts(fleet, argv: list[str], gpus: int, port: int, out: Path, name: str, timeout: float) -> int:
    """The same tune command on both hosts; node 0's stdout/stderr and node 1's stderr saved."""
    began = time.monotonic()
    procs = [fleet.start(i, [sys.executable, "-m", "ncclbench", *argv], nproc=gpus, port=port, env=node_env(i, gpus))
             for i in range(2)]
    codes = []
    for i, proc in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        (out / f"{name}.node{i}.txt").write_text(stdout)
        (out / f"{name}.node{i}.err").write_text(stderr)
        codes.append(proc.returncode)
    seconds = time.monotonic() - began
    print(f"{name}: exit codes {codes} after {seconds:.0f} s (node 0's table: {out / (name + '.node0.txt')})")
    return next((c for c in codes if c), 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus-per-host", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plugin", default=None, help="NCCL's example tuner plugin, for --verify")
    parser.add_argument("--collectives", default="allreduce,allgather")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("extra", nargs="*", help="more tune options (after --)")
    args = parser.parse_args()
    from netsim import SimFleet, why_not

    reason = why_not()
    if reason:
        print(f"tune_two_hosts: cannot make simulated hosts: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    extra = args.extra or ["-n", "5", "-w", "1", "-G", "2", "--repeat", "3"]
    sweep = [*args.collectives.split(","), "-b", "8", "-e", "256M", "-f", "4", "--no-plot", *extra]
    tuned = args.out / "tuned"
    with SimFleet(2) as fleet:
        code = run_on_hosts(fleet, ["tune", *sweep, "-o", str(tuned)], args.gpus_per_host, 29555, args.out, "tune",
                            args.timeout)
        conf = tuned / "nccl_tuner.conf"
        if args.plugin and conf.exists():
            verify = ["tune", *sweep, "--verify", str(conf), "--plugin", args.plugin, "-o", str(args.out / "verified")]
            code = code or run_on_hosts(fleet, verify, args.gpus_per_host, 29575, args.out, "verify", args.timeout)
        elif args.plugin:
            print(f"no {conf}: --verify not run")
    noise = [str(p) for p in (tuned / "tune.json", args.out / "verified" / "verify.json") if p.exists()]
    if noise:
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_noise.py"), *noise])
    return code


if __name__ == "__main__":
    sys.exit(main())
