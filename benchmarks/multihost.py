"""One machine as several hosts, with NCCL crossing a network between them (tests/netsim.py):
run one ncclbench job on N simulated hosts, optionally with a fault, and keep every host's
output. Needs root; makes network namespaces, veths and a bridge, and removes them.

    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 -- allreduce -b 1M -e 256M -f 4
    python benchmarks/multihost.py --hosts 4 --gpus 0 1 2 3 --slow-nic 2=2gbit -- preflight
    python benchmarks/multihost.py --hosts 4 --gpus 0 1 2 3 --slow-link 1-3=2gbit -- fleet -b 64M
    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 --launcher slurm -- allgather -b 1M -e 64M
    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 --nccl-log DIR -- allreduce ...
    python benchmarks/multihost.py --hosts 4 --gpus 0 1 2 3 --slow-nic 2=2gbit --summary \
        -- preflight --budget 10 -T 60 --json /tmp/pre.json
    python benchmarks/multihost.py --hosts 2 --gpus 0,1 2,3 \
        --then "tune allreduce -b 8 -e 256M -f 4 -n 5 -w 1 -G 2 --verify /tmp/t/nccl_tuner.conf --plugin P" \
        -- tune allreduce -b 8 -e 256M -f 4 -n 5 -w 1 -G 2 --repeat 3 -O /tmp/t

`--cpus split` gives each host CPUs of its own (those near its GPUs, shared out evenly;
tests/netsim.py split_cpus), as separate machines have; `--cpus 0-7 8-15` names them.
`--gpus` gives each host's CUDA_VISIBLE_DEVICES (omit for gloo ranks: then `--per-host`);
hosts may share a GPU (`--gpus 0 0`: two hosts on one GPU), and then CUDA MPS runs for the
job where it is installed (`--mps on|off` to choose; time-sliced without it, every op
between those hosts waits milliseconds).
Host 0's first process prints to stdout/stderr here; every process's output is also written
to `--logs DIR` (host<i>.<k>.out/.err). `--freeze I@S` stops every process of host I with
SIGSTOP S seconds after the start, `--kill I@S` kills them, `--link-down I@S` pulls host I's
cable. `--then "ARGS"` runs another ncclbench command on the same hosts once the first has
ended (each in turn, on a port of its own: e.g. tune, then --verify of the file it wrote).
`--summary` prints one JSON line per command at the end: its exit code, wall time and, when
it wrote `--json FILE`, the file's cost per phase and verdict (drain, bad ranks and links,
notes, margins). The exit code is host 0's first process's (the first failing command's);
the wall time is printed on stderr.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402
from ncclbench.topology.pci import format_index_ranges, parse_index_ranges  # noqa: E402


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
    parser.add_argument("--cpus", nargs="*", help="`split`, or each host's CPU list, e.g. 0-7 8-15 (default: shared)")
    parser.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                        help="CUDA MPS for the run (auto: when two hosts share a GPU and MPS is installed)")
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
    parser.add_argument("--then", action="append", default=[], metavar="ARGS",
                        help="another ncclbench command (one string) run on the same hosts afterwards")
    parser.add_argument("--summary", action="store_true", help="one JSON line per command at the end")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the ncclbench command and options")
    opts = parser.parse_args(argv)
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    if not args:
        parser.error("give the ncclbench command after --")
    if opts.gpus is not None and len(opts.gpus) != opts.hosts:
        parser.error(f"--gpus names {len(opts.gpus)} hosts' GPUs for {opts.hosts} hosts")
    if opts.cpus and opts.cpus != ["split"] and len(opts.cpus) != opts.hosts:
        parser.error(f"--cpus names {len(opts.cpus)} hosts' CPUs for {opts.hosts} hosts")
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
    try:
        cpus = (None if not opts.cpus else netsim.split_cpus(opts.hosts, opts.gpus) if opts.cpus == ["split"]
                else [set(parse_index_ranges(text)) for text in opts.cpus])
    except ValueError as exc:
        print(f"multihost: --cpus: {exc}", file=sys.stderr)
        return 2
    if cpus:
        print("multihost: CPUs " + "; ".join(f"host {i}: {format_index_ranges(c)}" for i, c in enumerate(cpus)), file=sys.stderr)
    installed = shutil.which(netsim.MPS_CONTROL) is not None
    shared = " ".join(netsim.shared_gpus(opts.gpus))
    if opts.mps == "on" and not installed:
        print(f"multihost: --mps on, but {netsim.MPS_CONTROL} is not on PATH", file=sys.stderr)
        return 2
    mps = opts.mps == "on" or (opts.mps == "auto" and bool(shared) and installed)
    if opts.mps == "auto" and shared and not installed:
        print(f"multihost: hosts share GPU(s) {shared} and CUDA MPS is not installed: they time-slice it (each op "
              "between them waits milliseconds)", file=sys.stderr)
    if mps:
        print(f"multihost: CUDA MPS on (GPUs shared by hosts: {shared or 'none'})", file=sys.stderr)
    try:
        with netsim.SimFleet(opts.hosts, gpus=opts.gpus, cpus=cpus, mps=mps) as fleet:
            for spec in opts.slow_nic:
                host, rate = spec.split("=")
                fleet.slow_nic(int(host), rate)
            for spec in opts.slow_link:
                pair, rate = spec.split("=")
                a, b = pair.split("-")
                fleet.slow_link(int(a), int(b), rate)
            code, summaries = 0, []
            for k, command in enumerate([args] + [shlex.split(text) for text in opts.then]):
                t0 = time.monotonic()
                procs = fleet.launch(opts.launcher, command, per_host, port=opts.port + 10 * k, env=env)
                if k == 0:
                    for action, specs in (("freeze", opts.freeze), ("kill_node", opts.kill),
                                          ("link_down", opts.link_down)):
                        for spec in specs:
                            _arm(fleet, action, spec, t0)
                rc = _collect(procs, per_host, opts, t0, f"cmd{k}." if opts.then else "")
                summaries.append(_summary(command, rc, time.monotonic() - t0))
                code = code or rc
    except netsim.RigError as exc:  # the rig could not be built (MPS refused to start)
        print(f"multihost: {exc}", file=sys.stderr)
        return 2
    if opts.summary:
        for line in summaries:
            print(json.dumps(line), flush=True)
    return code


def _summary(command: list[str], code: int, wall_s: float) -> dict:
    """A command's exit code and wall time, and what its --json file says (when it wrote one):
    preflight's and fleet's cost per phase and verdict."""
    out = {"command": " ".join(command), "exit": code, "wall_s": round(wall_s, 1)}
    path = next((command[i + 1] for i, a in enumerate(command[:-1]) if a in ("--json", "-J")), None)
    try:
        doc = json.loads(Path(path).read_text()) if path else None
    except (OSError, ValueError):
        doc = None
    if isinstance(doc, dict):
        out["cost_s"] = {k: round(v, 1) for k, v in (doc.get("cost_s") or {}).items()}
        out["total_cost_s"] = round(sum(out["cost_s"].values()), 1)
        out.update({k: doc[k] for k in ("drain", "bad_ranks", "links", "notes", "margins") if k in doc})
    return out


def _collect(procs, per_host: int, opts, t0: float, prefix: str = "") -> int:
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
            (opts.logs / f"{prefix}host{k // per}.{k % per}.out").write_text(out)
            (opts.logs / f"{prefix}host{k // per}.{k % per}.err").write_text(err)
    codes = [p.returncode for p in procs]
    print(f"multihost: exit codes {codes}; host 0 done at {first_done:.1f} s, all at {all_done:.1f} s",
          file=sys.stderr)
    return codes[0] if codes[0] is not None else 4


if __name__ == "__main__":
    sys.exit(main())
