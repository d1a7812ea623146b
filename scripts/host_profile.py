"""Where the host time of one small all_reduce goes: a breakdown for the launch-bound rows.
Run with torchrun, one process per GPU:

    torchrun --nproc-per-node 2 scripts/host_profile.py cupy    # CUDA launch, CuPy, ctypes
    torchrun --nproc-per-node 2 scripts/host_profile.py torch   # dist.all_reduce + torch.profiler
    ... host_profile.py cupy --pin                              # each rank pinned to one CPU

`cupy` times, per call on the host (loops of 200, three rounds, median of the rounds):
an empty kernel launch (the floor any NCCL call pays), a CUDA event record,
`NcclCommunicator.allReduce` (CuPy's Cython wrapper) and the same `ncclAllReduce` called
through ctypes on the same communicator (to tell the wrapper from NCCL itself).
`torch` times `dist.all_reduce` the same way and prints torch.profiler's table of host
time per operator for 200 calls. 8-byte float32 all_reduce everywhere. Rank 0 prints.
`--pin` binds each rank to one CPU (spread over the CPUs this process may use), as mpirun
binds nccl-tests' ranks to cores by default, to see whether thread migration is the noise.
"""

import ctypes
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist



def usage_error(message):
    print(f"host_profile.py: error: {message}", file=sys.stderr)
    sys.exit(2)


WHAT = next((a for a in sys.argv[1:] if not a.startswith("-")), "cupy")
if WHAT not in ("cupy", "torch") or any(a not in ("--pin",) for a in sys.argv[1:] if a.startswith("-")):
    usage_error(f"usage: torchrun ... host_profile.py [cupy|torch] [--pin] (got {' '.join(sys.argv[1:])})")
ROUNDS, CALLS = os.environ.get("ROUNDS", "3").strip(), 200
if not ROUNDS.isdigit() or int(ROUNDS) == 0:
    usage_error(f"ROUNDS must be a whole number > 0 (got {ROUNDS!r})")
ROUNDS = int(ROUNDS)
if "RANK" not in os.environ:
    usage_error("run it with torchrun (RANK, WORLD_SIZE, LOCAL_RANK unset)")
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
stream = torch.cuda.Stream(dev)
torch.cuda.set_stream(stream)
x = torch.ones(2, device=dev)
if "--pin" in sys.argv:
    cpus = sorted(os.sched_getaffinity(0))
    local, nlocal = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    os.sched_setaffinity(0, {cpus[(local * len(cpus)) // nlocal]})


def say(text):
    if rank == 0:
        print(text, flush=True)


def per_call_us(call, sync, barrier=None):
    """Median over rounds of host microseconds per call (loop of CALLS), and of device
    microseconds per call between two events on the stream."""
    host, device = [], []
    for _ in range(ROUNDS):
        sync()
        if barrier:
            barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            call()
        t1 = time.perf_counter()
        end.record()
        sync()
        host.append(1e6 * (t1 - t0) / CALLS)
        device.append(1e3 * start.elapsed_time(end) / CALLS)
    per_call_us.rounds = " ".join(f"{d:.1f}" for d in device)
    return statistics.median(host), statistics.median(device)


def time_collective(label, call, sync):
    """50 untimed calls, then per_call_us with the ranks lined up by a barrier; one line."""
    for _ in range(50):
        call()
    h, d = per_call_us(call, sync, dist.barrier)
    say(f"{label}: host {h:.2f} us/call, device {d:.2f} us/op (rounds {per_call_us.rounds})")


def loaded_library(fragment):
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if fragment in os.path.basename(path):
                return path
    return None


def run_cupy():
    import cupy
    from cupy.cuda import nccl

    cupy.cuda.Device(dev.index).use()
    dist.init_process_group("gloo")
    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.NcclCommunicator(world, uid[0], rank)
    handle = stream.cuda_stream
    cp_stream = cupy.cuda.Stream.from_external(stream) if hasattr(cupy.cuda.Stream, 'from_external') else cupy.cuda.ExternalStream(handle)
    sync = stream.synchronize
    say(f"# NCCL {nccl.get_version()} via CuPy {cupy.__version__}, {world} ranks, "
        f"CPUs {sorted(os.sched_getaffinity(0))[:4]}..., "
        f"NCCL_GRAPH_MIXING_SUPPORT={os.environ.get('NCCL_GRAPH_MIXING_SUPPORT', 'unset')}")

    try:
        kernel = cupy.RawKernel('extern "C" __global__ void nothing() {}', "nothing")
        kernel((1,), (1,), (), stream=cp_stream)

        def launch():
            kernel((1,), (1,), (), stream=cp_stream)
        h, d = per_call_us(launch, sync)
        say(f"empty kernel launch (cupy.RawKernel): host {h:.2f} us/call, device {d:.2f} us/call")
    except Exception as exc:  # no NVRTC in this wheel set: say so and go on
        say(f"empty kernel launch: not measured ({type(exc).__name__}: {str(exc)[:80]})")

    event = cupy.cuda.Event(disable_timing=True)

    def record():
        event.record(cp_stream)
    h, d = per_call_us(record, sync)
    say(f"event record (cupy): host {h:.2f} us/call")
    marker = torch.cuda.Event(enable_timing=True)
    h, d = per_call_us(lambda: marker.record(), sync)
    h2, d = per_call_us(lambda: marker.record(stream), sync)
    fresh = iter([torch.cuda.Event(enable_timing=True) for _ in range(ROUNDS * CALLS)])
    h3, d = per_call_us(lambda: next(fresh).record(stream), sync)
    say(f"event record (torch, timing): host {h:.2f} us/call with the current stream looked up, "
        f"{h2:.2f} us/call with the stream given, {h3:.2f} us/call on first record (creation)")

    ptr = x.data_ptr()

    time_collective("NcclCommunicator.allReduce",
                    lambda: comm.allReduce(ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, handle), sync)

    raw_comm = getattr(comm, "comm", None)
    path = loaded_library("libnccl")
    if raw_comm is None or path is None:
        say(f"ctypes ncclAllReduce: not measured (comm pointer {raw_comm}, libnccl {path})")
    else:
        lib = ctypes.CDLL(path)
        fn = lib.ncclAllReduce
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_void_p, ctypes.c_void_p]
        args = (ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, raw_comm, handle)
        time_collective(f"ctypes ncclAllReduce ({os.path.basename(path)})", lambda: fn(*args), sync)
    sync()
    comm.destroy()


def run_torch():
    from torch.profiler import ProfilerActivity, profile

    dist.init_process_group("nccl", device_id=dev)
    sync = stream.synchronize
    say(f"# torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {world} ranks")

    def call():
        dist.all_reduce(x)
    time_collective("dist.all_reduce", call, sync)
    sync()
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        sync()
    if rank == 0:
        print(f"# torch.profiler, {CALLS} calls of dist.all_reduce (8 B), rank 0, host times are totals")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=48))


if __name__ == "__main__":
    {"cupy": run_cupy, "torch": run_torch}[WHAT]()
    dist.destroy_process_group()
