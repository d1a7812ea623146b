"""One rank's send and receive memory: allocated once for the largest size, typed per
dtype, cut into per-op slots; check inputs written and outputs counted in chunks."""

from __future__ import annotations

from ncclbench.dtypes import DType, to_dtype
from ncclbench.engine.checkdata import InputPattern, bit_view, count_mismatches
from ncclbench.engine.collectives import CheckContext, Collective
from ncclbench.errors import PlanError, first_line
from ncclbench.failpoints import failpoint


# Elements per expected-value chunk: computing a chunk's expected values took 65-92 bytes of
# int64 temporaries per element on the CPU (about 400 MiB here), well inside the 2 GiB that validate()
# leaves free beside the buffers.
CHECK_CHUNK = 1 << 22


def memory_text(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} B"


class Buffers:
    """Send and receive memory allocated once for the largest size, typed per dtype."""

    def __init__(self, backend, send_bytes: int, recv_bytes: int, unalign: int = 0):
        try:
            failpoint("engine.alloc", rank=backend.rank, nbytes=send_bytes + recv_bytes)
            self.send_raw = backend.alloc_bytes(send_bytes)
            self.recv_raw = backend.alloc_bytes(recv_bytes)
        except (RuntimeError, MemoryError) as exc:  # torch's CPU and CUDA out-of-memory errors
            lower = "lower -e or -u" if unalign else "lower -e"
            raise PlanError(f"cannot allocate the buffers ({memory_text(send_bytes + recv_bytes)}): "
                            f"{first_line(exc, 200)}; {lower}") from None
        self.unalign = unalign

    def typed(self, dtype: DType):
        def view(raw):
            n = raw.numel() // dtype.itemsize
            return raw[: n * dtype.itemsize].view(dtype.torch_dtype())[self.unalign:]

        return view(self.send_raw), view(self.recv_raw)


class Slots:
    """Per-op (send, recv) views for one size and placement. Successive ops use successive
    slices of the big buffers, as nccl-tests shifts each op, so repeated small ops do not
    hit the same cache lines."""

    def __init__(self, layout, send_t, recv_t, in_place: bool, use_recv_as_send: bool, rank: int, nslots: int):
        self.views = []
        span = max(layout.send_count, layout.recv_count, 1)
        if in_place:
            fit = recv_t.numel() // span
        else:
            fit = min(send_t.numel() // max(layout.send_count, 1), recv_t.numel() // max(layout.recv_count, 1))
        for slot in range(max(1, min(fit, nslots))):
            if in_place:
                base = slot * span
                r0 = base + layout.recv_inplace_offset * rank
                s0 = base + layout.send_inplace_offset * rank
                recv = recv_t[r0: r0 + layout.recv_count]
                send = recv_t[s0: s0 + layout.send_count]
            else:
                recv = recv_t[slot * layout.recv_count: (slot + 1) * layout.recv_count]
                send = send_t[slot * layout.send_count: (slot + 1) * layout.send_count]
                if use_recv_as_send:
                    send = recv
            self.views.append((send, recv))

    def __getitem__(self, op_index: int):
        return self.views[op_index % len(self.views)]

    def bind(self, backend, coll, op, root, layout):
        """One ready-to-call op per slot (backend.bind), for the eager timed loop."""
        return [backend.bind(coll, send, recv, op, root, layout) for send, recv in self.views]


def fill_input(view, pattern: InputPattern, rank: int, dtype: DType, device):
    import torch

    bits = bit_view(view, dtype)
    for a in range(0, view.numel(), CHECK_CHUNK):
        b = min(a + CHECK_CHUNK, view.numel())
        idx = torch.arange(a, b, device=device, dtype=torch.int64)
        bits[a:b].copy_(bit_view(to_dtype(pattern.values(rank, idx), dtype), dtype))


def count_wrong(view, coll: Collective, ctx: CheckContext, dtype: DType, op: str | None, device) -> int:
    import torch

    wrong = 0
    for a in range(0, view.numel(), CHECK_CHUNK):
        b = min(a + CHECK_CHUNK, view.numel())
        idx = torch.arange(a, b, device=device, dtype=torch.int64)
        wrong += count_mismatches(view[a:b], coll.expected(ctx, idx), dtype, op)
    return wrong
