"""One machine as several hosts, with NCCL crossing a network between them (tests/netsim.py):
run one ncclbench job on N simulated hosts, optionally with a fault, and keep every host's
output. Needs root; makes network namespaces, veths and a bridge, and removes them.

    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 -- allreduce -b 1M -e 256M -f 4
    python benchmarks/multihost.py --hosts 4 --gpus 0 1 2 3 --slow-nic 2=2gbit -- preflight
    python benchmarks/multihost.py --hosts 4 --gpus 0 1 2 3 --slow-link 1-3=2gbit -- fleet -b 64M
    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 --launcher slurm -- allgather -b 1M -e 64M
    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 --nccl-log DIR -- allreduce ...

`--gpus` gives each host's CUDA_VISIBLE_DEVICES (omit for gloo ranks: then `--per-host`).
Host 0's first process prints to stdout/stderr here; every process's output is also written
to `--logs DIR` (host<i>.<k>.out/.err). `--freeze I@S` stops every process of host I with
SIGSTOP S seconds after the start, `--kill I@S` kills them, `--link-down I@S` pulls host I's
cable. The exit code is host 0's first process's; the wall time is printed on stderr.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402


def _timed(spec: str) -> tuple[int, float]:
    host, _, when = spec.partition("@")
    return int(host), float(when or 0)


def _arm(fleet: netsim.SimFleet, action: str, spec: str, t0: float) -> threading.Thread:
    host, when = _timed(spec)

    def fire():
        time.sleep(max(0.0, t0 + when - time.monotonic()))
        getattr(fleet, action)(host)
        print(f"multihost: {action} host {host} at {time.monotonic() - t0:.1f} s", file=sys.stderr)
    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, required=True)
    parser.add_argument("--gpus", nargs="*", help="each host's CUDA_VISIBLE_DEVICES, e.g. 0,1 2,3")
    parser.add_argument("--per-host", type=int, help="ranks per host (default: the host's GPU count, else 1)")
    parser.add_argument("--launcher", choices=["spawn", "torchrun", "slurm", "mpi"], default="spawn")
    parser.add_argument("--port", type=int, default=29555)
    parser.add_argument("--slow-nic", action="append", default=[], metavar="I=RATE")
    parser.add_argument("--slow-link", action="append", default=[], metavar="I-J=RATE")
    parser.add_argument("--freeze", action="append", default=[], metavar="I@SECONDS")
    parser.add_argument("--kill", action="append", default=[], metavar="I@SECONDS")
    parser.add_argument("--link-down", action="append", default=[], metavar="I@SECONDS")
    parser.add_argument("--logs", type=Path, help="folder for every process's stdout and stderr")
    parser.add_argument("--nccl-log", type=Path, help="NCCL_DEBUG=INFO into this folder, one file per process")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the ncclbench command and options")
    opts = parser.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args:
        parser.error("give the ncclbench command after --")
    if opts.gpus is not None and len(opts.gpus) != opts.hosts:
        parser.error(f"--gpus names {len(opts.gpus)} hosts' GPUs for {opts.hosts} hosts")
    why = netsim.why_not()
    if why:
        print(f"multihost: {why}", file=sys.stderr)
        return 2
    per_host = opts.per_host or (len(opts.gpus[0].split(",")) if opts.gpus else 1)
    env = None
    if opts.nccl_log:
        import os

        opts.nccl_log.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM,NET,GRAPH,ENV",
                   NCCL_DEBUG_FILE=str(opts.nccl_log.resolve() / "nccl.%h.%p.log"))
    with netsim.SimFleet(opts.hosts, gpus=opts.gpus) as fleet:
        for spec in opts.slow_nic:
            host, rate = spec.split("=")
            fleet.slow_nic(int(host), rate)
        for spec in opts.slow_link:
            pair, rate = spec.split("=")
            a, b = pair.split("-")
            fleet.slow_link(int(a), int(b), rate)
        t0 = time.monotonic()
        procs = fleet.launch(opts.launcher, args, per_host, port=opts.port, env=env)
        for action, specs in (("freeze", opts.freeze), ("kill_node", opts.kill), ("link_down", opts.link_down)):
            for spec in specs:
                _arm(fleet, action, spec, t0)
        return _collect(procs, per_host, opts, t0)


def _collect(procs, per_host: int, opts, t0: float) -> int:
    outs = [None] * len(procs)

    def drain(k):
        try:
            outs[k] = procs[k].communicate(timeout=opts.timeout)
        except Exception as exc:  # noqa: BLE001 - a process that outlives the limit is reported
            outs[k] = ("", f"multihost: no end within {opts.timeout} s ({exc})")
    threads = [threading.Thread(target=drain, args=(k,)) for k in range(len(procs))]
    for t in threads:
        t.start()
    threads[0].join()
    first_done = time.monotonic() - t0
    for t in threads[1:]:
        t.join()
    all_done = time.monotonic() - t0
    sys.stdout.write(outs[0][0])
    sys.stderr.write(outs[0][1])
    if opts.logs:
        opts.logs.mkdir(parents=True, exist_ok=True)
        per = max(1, len(procs) // opts.hosts)
        for k, (out, err) in enumerate(outs):
            (opts.logs / f"host{k // per}.{k % per}.out").write_text(out)
            (opts.logs / f"host{k // per}.{k % per}.err").write_text(err)
    codes = [p.returncode for p in procs]
    print(f"multihost: exit codes {codes}; host 0 done at {first_done:.1f} s, all at {all_done:.1f} s",
          file=sys.stderr)
    return codes[0] if codes[0] is not None else 4


if __name__ == "__main__":
    sys.exit(main())
