"""torch.distributed's NCCL premul-sum (`-o mulsum` on the torch backend) per float type:
3.0 times factors 1, 2, 0.5 on one rank. On torch 2.11 + NCCL 2.28.9 (H200) half and
float give 3, 6, 1.5 but bfloat16 gives 0 for every factor, and a bfloat16 tensor factor
raises "expected scalar type Float": the reason ncclbench refuses mulsum on bfloat16 with
--backend nccl (CuPy's premul-sum is right).

    torchrun --nproc-per-node 1 scripts/torch_premul_probe.py
"""
import torch, torch.distributed as dist
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
for dt in (torch.float16, torch.bfloat16, torch.float32):
    for f in (1.0, 2.0, 0.5):
        t = torch.full((8,), 3.0, dtype=dt, device="cuda")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(f))
        torch.cuda.synchronize()
        print(dt, "factor", f, "->", t[:3].tolist(), flush=True)
    try:
        t = torch.full((8,), 3.0, dtype=dt, device="cuda")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(torch.tensor([2.0], dtype=dt, device="cuda")))
        torch.cuda.synchronize(); print(dt, "tensor factor 2 ->", t[:3].tolist(), flush=True)
    except Exception as e:
        print(dt, "tensor factor:", str(e).splitlines()[0][:150])
dist.destroy_process_group()
