"""Which torch.distributed call moves gather/scatter data as fast as nccl-tests' grouped
send/recv? Times each candidate with CUDA events (no ncclbench code) and prints busbw
((n-1)/n x the gathered bytes / time) per size. Run with torchrun:

    torchrun --nproc-per-node 2 scripts/rooted_paths.py

Candidates: dist.gather / dist.scatter (torch copies the root's own chunk before the NCCL
group), all_to_all_single with one-sided split sizes, batch_isend_irecv including a
send/recv to self, and batch_isend_irecv without self plus a local copy.
"""

import os

import torch
import torch.distributed as dist

rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(dev)
torch.cuda.set_stream(torch.cuda.Stream(dev))
dist.init_process_group("nccl", device_id=dev)
ROOT = 0
SIZES = [32 << 20, 128 << 20, 512 << 20, 2 << 30]
big = torch.empty(max(SIZES) // 4, dtype=torch.float32, device=dev)
small = torch.empty(max(SIZES) // 4 // n, dtype=torch.float32, device=dev)


def gather_plain(whole, part):
    parts = list(whole.chunk(n)) if rank == ROOT else None
    dist.gather(part, parts, dst=ROOT)


def scatter_plain(whole, part):
    parts = list(whole.chunk(n)) if rank == ROOT else None
    dist.scatter(part, parts, src=ROOT)


def gather_a2a(whole, part):
    c = part.numel()
    to_root = [c if p == ROOT else 0 for p in range(n)]
    if rank == ROOT:
        dist.all_to_all_single(whole, part, [c] * n, to_root)
    else:
        dist.all_to_all_single(whole[:0], part, [0] * n, to_root)


def scatter_a2a(whole, part):
    c = part.numel()
    from_root = [c if p == ROOT else 0 for p in range(n)]
    if rank == ROOT:
        dist.all_to_all_single(part, whole, from_root, [c] * n)
    else:
        dist.all_to_all_single(part, whole[:0], from_root, [0] * n)


def _p2p(ops):
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def gather_p2p_self(whole, part):
    ops = [dist.P2POp(dist.isend, part, ROOT)]
    if rank == ROOT:
        ops += [dist.P2POp(dist.irecv, chunk, p) for p, chunk in enumerate(whole.chunk(n))]
    _p2p(ops)


def scatter_p2p_self(whole, part):
    ops = [dist.P2POp(dist.irecv, part, ROOT)]
    if rank == ROOT:
        ops = [dist.P2POp(dist.isend, chunk, p) for p, chunk in enumerate(whole.chunk(n))] + ops
    _p2p(ops)


def gather_p2p_copy(whole, part):
    if rank == ROOT:
        chunks = whole.chunk(n)
        _p2p([dist.P2POp(dist.irecv, chunks[p], p) for p in range(n) if p != ROOT])
        chunks[ROOT].copy_(part)
    else:
        _p2p([dist.P2POp(dist.isend, part, ROOT)])


def scatter_p2p_copy(whole, part):
    if rank == ROOT:
        chunks = whole.chunk(n)
        _p2p([dist.P2POp(dist.isend, chunks[p], p) for p in range(n) if p != ROOT])
        part.copy_(chunks[ROOT])
    else:
        _p2p([dist.P2POp(dist.irecv, part, ROOT)])


# sends to self last: if torch refuses one on the root only, the other ranks may hang
CANDIDATES = [gather_plain, gather_a2a, gather_p2p_copy, scatter_plain, scatter_a2a, scatter_p2p_copy,
              gather_p2p_self, scatter_p2p_self]

for fn in CANDIDATES:
    try:
        line = []
        for size in SIZES:
            whole, part = big[: size // 4], small[: size // 4 // n]
            for _ in range(3):
                fn(whole, part)
            torch.cuda.synchronize()
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn(whole, part)
            end.record()
            torch.cuda.synchronize()
            sec = start.elapsed_time(end) / 1e3 / 20
            line.append(f"{size >> 20}M {size / sec / 1e9 * (n - 1) / n:6.1f}")
        if rank == 0:
            print(f"{fn.__name__:18s} " + "  ".join(line), flush=True)
    except Exception as exc:  # noqa: BLE001 - a candidate torch refuses is a finding too
        if rank == 0:
            print(f"{fn.__name__:18s} failed: {str(exc).splitlines()[0][:150]}", flush=True)
    dist.barrier()
dist.destroy_process_group()
