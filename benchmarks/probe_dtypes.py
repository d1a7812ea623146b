"""Which dtype x op pairs each backend really runs (torchrun, 1 or more ranks). Prints one line
per pair; used to keep the gaps in ncclbench/backends/capabilities.py honest on a new torch/NCCL/CuPy.

    torchrun --nproc-per-node N benchmarks/probe_dtypes.py [torch|cupy]
"""

import os
import sys

import torch
import torch.distributed as dist

from ncclbench.engine.checkdata import InputPattern, count_mismatches
from ncclbench.dtypes import premul_scalar, to_dtype
from ncclbench.dtypes import DTYPES, OPS

backend_name = sys.argv[1] if len(sys.argv) > 1 else "torch"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dev = torch.device("cuda", rank)
if backend_name == "torch":
    dist.init_process_group("nccl", device_id=dev)

    def run(t, op):
        if op == "mulsum":
            red = dist._make_nccl_premul_sum(float(premul_scalar(rank)))
        else:
            red = getattr(dist.ReduceOp, {"prod": "PRODUCT"}.get(op, op.upper()))
        dist.all_reduce(t, op=red)
else:
    from cupy.cuda import nccl

    from ncclbench.backends.cupy_nccl import (NCCL_OPS, NCCL_TYPES, _TORCH_TO_NAME, destroy_op, factor_bytes,
                                              premul_sum_op)

    dist.init_process_group("gloo")
    uid = [nccl.get_unique_id() if rank == 0 else None]
    dist.broadcast_object_list(uid, src=0)
    comm = nccl.NcclCommunicator(world, uid[0], rank)

    def run(t, op):
        kind = NCCL_TYPES[_TORCH_TO_NAME[str(t.dtype)]]
        red = NCCL_OPS.get(op)
        if op == "mulsum":
            red = premul_sum_op(comm, kind, factor_bytes(torch, t.dtype, premul_scalar(rank)))
        try:
            comm.allReduce(t.data_ptr(), t.data_ptr(), t.numel(), kind, red, torch.cuda.current_stream().cuda_stream)
        finally:
            if op == "mulsum":
                torch.cuda.synchronize()
                destroy_op(comm, red)
for d in DTYPES.values():
    for op in OPS:
        try:
            p = InputPattern(d, op, world, seed=1)
            idx = torch.arange(1024, device=dev)
            t = to_dtype(p.values(rank, idx), d)
            run(t, op)
            torch.cuda.synchronize()
            wrong = count_mismatches(t, p.reduce(idx), d, op)
            result = f"ok wrong={wrong}"
        except Exception as exc:  # noqa: BLE001
            result = "FAIL " + (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        if rank == 0:
            print(f"{backend_name:6s} {d.name:9s} {op:6s} {result}", flush=True)
dist.destroy_process_group()
