"""Host cost per call of a plain torch.distributed.all_reduce loop (no ncclbench code),
to tell PyTorch's own launch cost from ncclbench's. Run with torchrun:

    torchrun --nproc-per-node 4 scripts/host_cost.py [--own-stream]
"""

import os
import sys
import time

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
if "--own-stream" in sys.argv:
    torch.cuda.set_stream(torch.cuda.Stream(dev))
dist.init_process_group("nccl", device_id=dev)
x = torch.ones(2, device=dev)
for _ in range(50):
    dist.all_reduce(x)
torch.cuda.synchronize()
for n in (20, 200):
    dist.barrier()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        dist.all_reduce(x)
    end.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    if rank == 0:
        print(f"n={n} own_stream={'--own-stream' in sys.argv}: host {1e6 * (t1 - t0) / n:.1f} us/call, "
              f"device {1e3 * start.elapsed_time(end) / n:.1f} us/op", flush=True)
dist.destroy_process_group()
