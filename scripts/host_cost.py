"""Host cost per call of a plain all_reduce loop with no ncclbench code, to tell the
library's own launch cost from ncclbench's. Run with torchrun:

    torchrun --nproc-per-node 4 scripts/host_cost.py [--own-stream]   # torch.distributed
    torchrun --nproc-per-node 4 scripts/host_cost.py --cupy           # cupy.cuda.nccl

Prints, for 8-byte all_reduce loops of 20 and 200 calls, the host time per call and the
device time per op (CUDA events around the loop), as rank 0 saw them.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
cupy_mode = "--cupy" in sys.argv
own_stream = "--own-stream" in sys.argv or cupy_mode
if own_stream:
    torch.cuda.set_stream(torch.cuda.Stream(dev))
x = torch.ones(2, device=dev)

if cupy_mode:
    import cupy
    from cupy.cuda import nccl

    cupy.cuda.Device(dev.index).use()
    dist.init_process_group("gloo")
    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.NcclCommunicator(world, uid[0], rank)
    ptr, stream = x.data_ptr(), torch.cuda.current_stream(dev).cuda_stream

    def call():
        comm.allReduce(ptr, ptr, 2, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)
else:
    dist.init_process_group("nccl", device_id=dev)

    def call():
        dist.all_reduce(x)

for _ in range(50):
    call()
torch.cuda.synchronize()
for n in (20, 200, 200):
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    if rank == 0:
        what = "cupy" if cupy_mode else f"torch own_stream={own_stream}"
        print(f"{what} n={n}: host {1e6 * (t1 - t0) / n:.1f} us/call, "
              f"device {1e3 * start.elapsed_time(end) / n:.1f} us/op", flush=True)
if cupy_mode:
    torch.cuda.synchronize()
    comm.destroy()
dist.destroy_process_group()
