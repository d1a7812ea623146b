"""How fast is a device-to-device copy of one rank's own chunk, eagerly and inside a CUDA graph?

hypercube (and nccl-tests' hypercube) copies its own chunk into the receive buffer with
cudaMemcpyAsync before the exchanges. Under -G that copy becomes a graph memcpy node. This
probe times, on one GPU, `dst.copy_(src)` (cudaMemcpyAsync) and an elementwise-kernel copy
(`byte_copy`: integer `add(src, 0)`, what the backends use under capture), each eagerly and captured in a graph, at a few sizes.

    python scripts/graph_copy_probe.py [--sizes 128M,512M,1G] [--iters 20] [--device 0]
"""

from __future__ import annotations

import argparse

from ncclbench.sizes import parse_size


def _copy_memcpy(dst, src):
    dst.copy_(src)


def _copy_kernel(dst, src):
    # what the backends use inside a capture: an exact integer add(src, 0) kernel
    import torch

    from ncclbench.backends.torch_dist import byte_copy

    byte_copy(torch, dst, src)


def _time(torch, fn, iters, graph):
    stream = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for _ in range(iters):
                    fn()
            g.replay()
            stream.synchronize()
            start.record(stream)
            g.replay()
            end.record(stream)
        else:
            stream.synchronize()
            start.record(stream)
            for _ in range(iters):
                fn()
            end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="128M,512M,1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    import torch

    torch.cuda.set_device(args.device)
    print(f"# {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}; GB/s = bytes copied / time")
    print(f"# {'size':>12} {'memcpy':>9} {'memcpy-G':>9} {'kernel':>9} {'kernel-G':>9}  (GB/s)")
    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        src = torch.randint(-2**30, 2**30, (nbytes // 4,), dtype=torch.int32, device="cuda")
        dst = torch.empty_like(src)
        cells = []
        for fn in (_copy_memcpy, _copy_kernel):
            for graph in (False, True):
                seconds = _time(torch, lambda fn=fn: fn(dst, src), args.iters, graph)
                if not torch.equal(dst, src):
                    raise SystemExit(f"copy wrong ({fn.__name__}, graph={graph}, {text})")
                cells.append(nbytes / seconds / 1e9)
        print(f"  {nbytes:>12} " + " ".join(f"{c:9.1f}" for c in cells))


if __name__ == "__main__":
    main()
