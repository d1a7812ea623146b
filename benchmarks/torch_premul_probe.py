"""torch.distributed's NCCL premul-sum (`-o mulsum` on the torch backend), per float type
and collective, on one rank: 3.0 times factors 1, 2 and 0.5. On torch 2.11 + NCCL 2.28.9
(H200) all_reduce in half and float gives 3, 6 and 1.5, but bfloat16 gives 0 for every
factor, and a bfloat16 tensor factor raises "expected scalar type Float". That is why
ncclbench refuses mulsum on bfloat16 with --backend nccl (CuPy's premul-sum is right).
The reduce_scatter_tensor and reduce lines show whether those apply the factor too.

    torchrun --nproc-per-node 1 benchmarks/torch_premul_probe.py
"""
import torch
import torch.distributed as dist

dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
n = dist.get_world_size()


def run(kind, dt, factor):
    t = torch.full((8 * n,), 3.0, dtype=dt, device="cuda")
    out = torch.empty(8, dtype=dt, device="cuda")
    op = dist._make_nccl_premul_sum(factor)
    if kind == "all_reduce":
        dist.all_reduce(t, op=op)
        res = t
    elif kind == "reduce":
        dist.reduce(t, dst=0, op=op)
        res = t
    else:
        dist.reduce_scatter_tensor(out, t, op=op)
        res = out
    torch.cuda.synchronize()
    return res[:2].tolist()


for kind in ("all_reduce", "reduce", "reduce_scatter_tensor"):
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        try:
            got = [run(kind, dt, f) for f in (1.0, 2.0, 0.5)]
        except Exception as exc:  # noqa: BLE001
            got = str(exc).splitlines()[0][:120]
        print(f"{kind:22s} {str(dt):15s} factors 1, 2, 0.5 -> {got}", flush=True)
for dt in (torch.float16, torch.bfloat16):
    try:
        t = torch.full((8,), 3.0, dtype=dt, device="cuda")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([2.0], dtype=dt, device="cuda")))
        torch.cuda.synchronize()
        print(f"all_reduce {dt} tensor factor 2 -> {t[:2].tolist()}", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"all_reduce {dt} tensor factor: {str(exc).splitlines()[0][:120]}", flush=True)
dist.destroy_process_group()
