"""Is the first small op after the GPUs sat idle slower, and is it the GPU or the link?

With -I the first or second timed iteration of a small all_reduce often reads ~110 us
against ~8 us for the rest, on the GPU's clock while the host issued at its normal pace.
Before each timed loop the engine waits for the GPU and then for a host barrier (0.3-1.2
ms with the GPUs idle). This probe, one process driving two GPUs (no NCCL), waits a chosen
idle gap and then times the next few tiny ops with CUDA events:

  local      a one-warp kernel on GPU 0 touching GPU 0 memory
  peer_load  the same kernel touching GPU 1 memory through peer access (NVLink, SM loads)
  peer_copy  an 8-byte cudaMemcpyPeerAsync from GPU 1 to GPU 0 (a copy engine over NVLink)
  host_load  the kernel touching pinned host memory (PCIe; NCCL keeps some state there)

`--gated` first queues a ~50 us spin kernel on GPU 0 so that every op is already queued
when the GPU reaches it (host launch latency out of the picture; the SMs are busy, the
link still idle).

    python scripts/idle_gap_probe.py [--gaps 0,100,500,1000,5000] [--reps 30] [--ops 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

_SRC = r"""
extern "C" __global__ void touch(float* p) { p[threadIdx.x] += 1.0f; }
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def _busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


VARIANTS = ("local", "peer_load", "peer_copy", "host_load")


def _gaps(text: str) -> list[float]:
    try:
        gaps = [float(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of microseconds: {text!r}") from None
    if any(g < 0 for g in gaps):
        raise argparse.ArgumentTypeError(f"gaps must be >= 0: {text!r}")
    return gaps


def _variants(text: str) -> list[str]:
    names = text.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {','.join(unknown)}; choose from {','.join(VARIANTS)}")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1: {text!r}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gaps", type=_gaps, default="0,20,50,100,200,500,1000,2000,5000,20000", help="idle gaps in us")
    ap.add_argument("--reps", type=_positive, default=30)
    ap.add_argument("--ops", type=_positive, default=4, help="ops timed after each gap")
    ap.add_argument("--gated", action="store_true", help="queue a ~50 us spin kernel before the ops")
    ap.add_argument("--variants", type=_variants, default=",".join(VARIANTS))
    args = ap.parse_args()

    try:
        import cupy
    except ImportError:
        raise SystemExit("idle_gap_probe: needs CuPy (pip install 'ncclbench[cuda12]' or '[cuda13]')") from None
    if cupy.cuda.runtime.getDeviceCount() < 2:
        raise SystemExit("idle_gap_probe: needs two GPUs")
    with cupy.cuda.Device(1):
        remote = cupy.zeros(64, dtype=cupy.float32)
    cupy.cuda.Device(0).use()
    cupy.cuda.runtime.deviceEnablePeerAccess(1)
    local = cupy.zeros(64, dtype=cupy.float32)
    pinned = cupy.cuda.alloc_pinned_memory(4096)  # cudaHostAlloc: device-visible under UVA
    module = cupy.RawModule(code=_SRC)
    touch, spin = module.get_function("touch"), module.get_function("spin")
    stream = cupy.cuda.Stream(non_blocking=True)
    clock_khz = cupy.cuda.runtime.getDeviceProperties(0)["clockRate"]
    spin_cycles = cupy.int64(50 * clock_khz // 1000)  # ~50 us at the nominal clock

    def op_local():
        touch((1,), (32,), (local,), stream=stream)

    def op_peer_load():
        touch((1,), (32,), (cupy.uint64(remote.data.ptr),), stream=stream)

    def op_peer_copy():
        cupy.cuda.runtime.memcpyPeerAsync(local.data.ptr, 0, remote.data.ptr, 1, 8, stream.ptr)

    def op_host_load():
        touch((1,), (32,), (cupy.uint64(pinned.ptr),), stream=stream)

    variants = {"local": op_local, "peer_load": op_peer_load, "peer_copy": op_peer_copy,
                "host_load": op_host_load}
    events = [cupy.cuda.Event() for _ in range(args.ops + 1)]
    print(f"# reps {args.reps}, ops {args.ops}, gated {args.gated}; per op position: median / max us")
    print(f"# {'variant':<10} {'gap_us':>7}  " + "  ".join(f"{'op' + str(i):>13}" for i in range(args.ops)))
    for name in args.variants:
        op = variants[name]
        for _ in range(10):  # warm every path once
            op()
        stream.synchronize()
        for gap in args.gaps:
            samples = [[] for _ in range(args.ops)]
            for _ in range(args.reps):
                stream.synchronize()
                _busy_wait(gap * 1e-6)
                if args.gated:
                    spin((1,), (1,), (spin_cycles,), stream=stream)
                events[0].record(stream)
                for i in range(args.ops):
                    op()
                    events[i + 1].record(stream)
                stream.synchronize()
                for i in range(args.ops):
                    samples[i].append(cupy.cuda.get_elapsed_time(events[i], events[i + 1]) * 1e3)
            cells = "  ".join(f"{statistics.median(s):6.1f}/{max(s):6.1f}" for s in samples)
            print(f"  {name:<10} {gap:7.0f}  {cells}", flush=True)


if __name__ == "__main__":
    main()
