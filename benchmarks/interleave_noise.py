"""How precisely two NCCL configurations can be compared across simulated hosts when they
are measured side by side: every configuration keeps live communicators of its own (NCCL_ALGO /
NCCL_PROTO set when each is made), and each repeat times every configuration at a size back
to back, in a rotating order, as CUDA-graph replays queued behind a short spinning kernel
(no host time timed). With `--communicators C` each configuration has C communicators and
repeat r uses set r mod C, so what differs from one communicator to the next is sampled too.

Prints, per size and configuration: the spread of its own times over the repeats; the spread
of its ratio to NCCL's default within the same repeat (drift that hits configurations
measured a few milliseconds apart alike cancels in the ratio); the median ratio with a 95 %
interval from a two-level bootstrap (the communicator sets drawn again, then the repeats
within each), the interval's half-width in % (the precision of the comparison), and the
range of the per-set medians.

    python benchmarks/interleave_noise.py --hosts 2 --gpus 0 1 --repeats 600 --communicators 4 --out DIR

Needs root and GPUs (tests/netsim.py builds the hosts). One JSON file with every time and a
table on stdout. A maintainers' experiment for tune's precision across hosts."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"default": {}, "tree/LL": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"},
           "ring/LL": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"},
           "ring/simple": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}}


def spread(values: list[float]) -> float:
    """(max - min) / median, in %."""
    return (max(values) - min(values)) / statistics.median(values) * 100


def iqr(values: list[float]) -> float:
    """Interquartile range / median, in %."""
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values) * 100


def say(text: str) -> None:
    print(f"interleave_noise: rank {os.environ.get('RANK')}: {time.strftime('%H:%M:%S')} {text}",
          file=sys.stderr, flush=True)


def rank_main(opts) -> int:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    dist.init_process_group("nccl", device_id=dev)
    rank = dist.get_rank()
    groups = {}
    for name, env in ((n, e) for _ in range(opts.communicators) for n, e in CONFIGS.items()):
        saved = {k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO")}
        os.environ.update(env)
        for k in ("NCCL_ALGO", "NCCL_PROTO"):
            if k not in env:
                os.environ.pop(k, None)
        g = dist.new_group(backend="nccl")
        warm = torch.ones(1024, device=dev)
        dist.all_reduce(warm, group=g)  # the communicator is made now, under this environment
        torch.cuda.synchronize()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        groups.setdefault(name, []).append(g)
        say(f"communicator {name} #{len(groups[name])} made")
    sizes = [int(s) for s in opts.sizes.split(",")]
    graphs = {}
    stream = torch.cuda.Stream()
    for name, c, g in ((name, c, g) for name, gs in groups.items() for c, g in enumerate(gs)):
        for nbytes in sizes:
            buf = torch.ones(max(1, nbytes // 4), device=dev)
            with torch.cuda.stream(stream):
                for _ in range(2):
                    dist.all_reduce(buf, group=g)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(opts.ops):
                    dist.all_reduce(buf, group=g)
            torch.cuda.synchronize()
            graphs[(name, c, nbytes)] = (graph, buf)
    say(f"{len(graphs)} graphs captured")
    names = list(CONFIGS)
    times = {f"{n}@{s}": [] for n in names for s in sizes}
    stamps, sets, turns = [], [], []
    t0 = time.monotonic()
    for rep in range(opts.repeats):
        stamps.append(time.monotonic() - t0)
        c = rep % opts.communicators
        turn = (rep // opts.communicators) % len(names)  # every set runs in every order, not set c in order c
        sets.append(c)
        turns.append(turn)
        for nbytes in sizes:
            order = names[turn:] + names[:turn]
            for name in order:
                graph, _buf = graphs[(name, c, nbytes)]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(int(0.002 * 2e9))  # the GPU held while the replays are queued
                start.record()
                for _ in range(opts.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                times[f"{name}@{nbytes}"].append(start.elapsed_time(end) * 1e3 / (opts.replays * opts.ops))
        time.sleep(opts.pause)
        if rep == 0:
            say("repeat 1 (us per op): " + ", ".join(f"{k} {v[0]:.1f}" for k, v in times.items()))
        if rep % 10 == 9:
            say(f"repeat {rep + 1} of {opts.repeats}")
    dist.barrier()
    if rank == 0:
        print("RESULT " + json.dumps({"times_us": times, "stamps_s": stamps, "sets": sets, "turns": turns, "sizes": sizes,
                                            "configs": names}),
              flush=True)
    # no destroy_process_group: with 4 communicators and their captured graphs it has hung
    # after the result was out (NCCL 2.28.9 over sockets); the process ends as it is
    sys.stdout.flush()
    os._exit(0)


def ratio_estimate(base: list[float], other: list[float], sets: list[int], draws: int = 1000,
                   seed: int = 1) -> dict:
    """The other configuration's speed relative to the default (default time / its time, per
    repeat): the median over every repeat, a 95 % interval from a two-level bootstrap (the
    communicator sets drawn again with replacement, then the repeats within each drawn set),
    its half-width in % of the median, and each set's own median."""
    from ncclbench.tune.paired import group_by_set, ratio_interval

    pairs = [(c, b / x) for b, x, c in zip(base, other, sets)]
    middle, lo, hi = ratio_interval(pairs, draws, seed)
    by_set = group_by_set(pairs)
    return {"median": middle, "low": lo, "high": hi, "half_width_pct": (hi - lo) / 2 / middle * 100,
            "set_medians": [statistics.median(g) for g in by_set.values()]}


def report(doc: dict, draws: int = 1000) -> list[str]:
    lines = [f"{'size':>8s} {'config':<12s} {'median us':>10s} {'spread':>8s} {'IQR':>7s} "
             f"{'ratio':>7s} {'r.spread':>8s} {'r.IQR':>7s} {'95% CI':>13s} {'+-':>6s} {'per set':>13s}"]
    t = doc["times_us"]
    for s in doc["sizes"]:
        base = t[f"default@{s}"]
        sets = doc.get("sets") or [0] * len(base)
        for name in doc["configs"]:
            v = t[f"{name}@{s}"]
            line = f"{s:>8d} {name:<12s} {statistics.median(v):>10.2f} {spread(v):>7.1f}% {iqr(v):>6.1f}%"
            if name != "default":
                ratio = [b / x for b, x in zip(base, v)]  # speed relative to the default, per repeat
                est = ratio_estimate(base, v, sets, draws)
                line += (f" {est['median']:>7.3f} {spread(ratio):>7.1f}% {iqr(ratio):>6.1f}%"
                         f" {est['low']:>6.3f}-{est['high']:<6.3f} {est['half_width_pct']:>5.1f}%"
                         f" {min(est['set_medians']):>6.3f}-{max(est['set_medians']):<6.3f}")
            lines.append(line)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--gpus", nargs="*", default=["0", "1"])
    ap.add_argument("--sizes", default="8,4096,65536,262144",
                    help="bytes, comma-separated (LL over sockets is slow at MiB sizes)")
    ap.add_argument("--repeats", type=int, default=600)
    ap.add_argument("--communicators", type=int, default=1, help="communicators per configuration, used in turn")
    ap.add_argument("--ops", type=int, default=10, help="ops captured in one graph")
    ap.add_argument("--replays", type=int, default=2, help="graph replays per measurement")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds between repeats")
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--timeout", type=float, default=600, help="seconds for the whole run")
    ap.add_argument("--out", type=Path, default=None, help="folder for each host's output and the JSON")
    ap.add_argument("--report", type=Path, default=None, help="print the table of a saved interleave.json and stop")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.communicators < 1 or opts.repeats < opts.communicators:
        ap.error("--communicators must be at least 1 and at most --repeats")
    if opts.report:
        print("\n".join(report(json.loads(opts.report.read_text()))))
        return 0
    if opts.rank:
        return rank_main(opts)
    sys.path.insert(0, str(ROOT / "tests"))
    import netsim

    args = [sys.executable, "-u", str(Path(__file__).resolve()), "--rank", "--sizes", opts.sizes,
            "--repeats", str(opts.repeats), "--communicators", str(opts.communicators), "--ops", str(opts.ops),
            "--replays", str(opts.replays), "--pause", str(opts.pause)]
    out = opts.out or Path(tempfile.mkdtemp(prefix="interleave-"))
    out.mkdir(parents=True, exist_ok=True)
    with netsim.SimFleet(opts.hosts, gpus=opts.gpus) as fleet:
        procs = []
        for i in range(opts.hosts):  # each host's output into files, read as it comes: no pipe fills up
            env = fleet.env_for(i)
            env.update(RANK=str(i), WORLD_SIZE=str(opts.hosts), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR=fleet.addrs[0], MASTER_PORT=str(opts.port))
            with open(out / f"host{i}.out", "w") as o, open(out / f"host{i}.err", "w") as e:
                procs.append(fleet._run_env(i, args, env, stdout=o, stderr=e))
        deadline = time.monotonic() + opts.timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # the result, if out, is still read below
                print(f"interleave_noise: no end within {opts.timeout:g} s; each host's output is in {out}",
                      file=sys.stderr)
                break
    codes = [p.returncode for p in procs]
    line = next((x for x in (out / "host0.out").read_text().splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        print(f"interleave_noise: no result (exit codes {codes}); each host's output is in {out}", file=sys.stderr)
        return 1
    doc = json.loads(line[len("RESULT "):])
    (out / "interleave.json").write_text(json.dumps(doc))
    print("\n".join(report(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
