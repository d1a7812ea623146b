"""The long host stalls of eager `dist.all_reduce`: when they come and what their length follows.
Run with torchrun, one process per GPU:

    torchrun --nproc-per-node 2 scripts/torch_stall_probe.py                 # pads 0,30,90 us
    torchrun --nproc-per-node 2 scripts/torch_stall_probe.py --pads 0,60 --seconds 3

Each rank issues 8-byte all_reduces back to back for about `--seconds` per pad, timing every
call on the host; with a pad it busy-waits that long after each call, so fewer calls are
issued per second of wall time. A call over `--threshold-us` (plus the pad) is a stall.
Per pad and rank it prints the stalls' count and median length, the median number of calls
and of milliseconds between stalls, and the median of stall length / calls since the previous
stall. If the stalls come at a fixed wall-clock period and their length follows the calls
issued since the previous one (not the time), something walks a per-call list at that
period while the issuing thread waits, as ProcessGroupNCCL's watchdog does with its work list
(docs/BENCHMARKS.md, seventh session).
"""

import argparse
import os
import statistics
import sys
import time


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="torch_stall_probe.py", description=__doc__.split("\n")[0])
    parser.add_argument("--pads", default="0,30,90", help="busy-wait after each call, us, comma-separated")
    parser.add_argument("--seconds", type=float, default=1.5, help="wall time per pad (about)")
    parser.add_argument("--threshold-us", type=float, default=1000.0, help="a call longer than this (+ pad) stalls")
    args = parser.parse_args(argv)
    try:
        args.pads = [float(p) for p in args.pads.split(",")]
    except ValueError:
        parser.error(f"--pads: comma-separated numbers of us, got {args.pads!r}")
    if any(p < 0 for p in args.pads) or not 0 < args.seconds <= 60 or args.threshold_us <= 0:
        parser.error("--pads must be >= 0, --seconds in (0, 60], --threshold-us > 0")
    return args


def issue(all_reduce, x, calls: int, pad_s: float) -> list[float]:
    """Host duration (us) of each of `calls` calls, each followed by a busy-wait of pad_s."""
    clock = time.perf_counter
    stamps = [0.0] * (calls + 1)
    stamps[0] = clock()
    for i in range(calls):
        all_reduce(x)
        t = clock()
        while pad_s and clock() - t < pad_s:
            pass
        stamps[i + 1] = clock()
    return [(b - a) * 1e6 for a, b in zip(stamps, stamps[1:])]


def summarize(durations: list[float], pad_us: float, threshold_us: float) -> dict:
    """Stalls among the call durations and how their length relates to the calls before them."""
    p50 = statistics.median(durations)
    stalls = [(i, d) for i, d in enumerate(durations) if d > threshold_us + pad_us]
    starts, elapsed = [], 0.0
    for d in durations:
        starts.append(elapsed)
        elapsed += d
    pairs = list(zip(stalls, stalls[1:]))
    return {
        "calls": len(durations), "p50_us": p50, "wall_ms": elapsed / 1e3, "stalls": len(stalls),
        "stall_ms": statistics.median(d for _, d in stalls) / 1e3 if stalls else 0.0,
        "stalled_pct": 100.0 * sum(d - p50 for _, d in stalls) / elapsed if elapsed else 0.0,
        "calls_between": statistics.median(j - i for (i, _), (j, _) in pairs) if pairs else 0,
        "ms_between": statistics.median((starts[j] - starts[i]) / 1e3 for (i, _), (j, _) in pairs) if pairs else 0.0,
        # the stall's excess over a normal call, per call issued since the previous stall
        "us_per_call_since": statistics.median((d - p50) / (j - i) for (i, _), (j, d) in pairs) if pairs else 0.0,
    }


def main(argv) -> int:
    args = parse_args(argv)
    if "LOCAL_RANK" not in os.environ:
        print("torch_stall_probe.py: error: run it with torchrun (one process per GPU)", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist
    if not torch.cuda.is_available():
        print("torch_stall_probe.py: error: needs CUDA GPUs (it probes ProcessGroupNCCL)", file=sys.stderr)
        return 1
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    x = torch.ones(2, device="cuda")
    for _ in range(200):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    for pad_us in args.pads:
        calls = max(100, int(args.seconds * 1e6 / (30.0 + pad_us)))  # ~30 us per plain call on H200 hosts
        dist.barrier()
        torch.cuda.synchronize()
        s = summarize(issue(dist.all_reduce, x, calls, pad_us * 1e-6), pad_us, args.threshold_us)
        torch.cuda.synchronize()
        print(f"rank {rank} pad {pad_us:g} us: {s['calls']} calls, p50 {s['p50_us']:.1f} us, wall {s['wall_ms']:.0f} ms; "
              f"{s['stalls']} stalls, median {s['stall_ms']:.1f} ms, {s['stalled_pct']:.1f} % of the wall time; "
              f"median between stalls {s['calls_between']:.0f} calls / {s['ms_between']:.0f} ms; "
              f"median stall excess per call since the previous stall {s['us_per_call_since']:.2f} us", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
