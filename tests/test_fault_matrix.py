"""The planted-fault matrix: for every collective, type and op, at 2 to 1024 ranks, the
outputs a faulty collective would leave (built from the same pure functions the check
uses: inputs, priming, expected values) must each count wrong elements, and the right
output none. Faults: a rank received nothing (its primed buffer left as is), data at
another rank's place, a rank's contribution missing from a reduction, prod computed as
max, min or sum."""

import functools

import pytest
import torch

from ncclbench.engine.checkdata import InputPattern, bit_view, count_mismatches
from ncclbench.dtypes import to_dtype
from ncclbench.engine.collectives import CheckContext, REGISTRY
from ncclbench.dtypes import DTYPES, OPS
from ncclbench.engine.traffic import Traffic

RANK_COUNTS = [2, 3, 4, 5, 8, 10, 16, 32, 64, 97, 128, 256, 1024]
TYPES = [d for d in DTYPES.values() if d.torch_dtype() is not None]
SEED = 11


def blind_spots(dtype, op, n):
    """Faults no check can see, for the truncating average of 8-bit integers: n inputs
    must sum exactly in the type, and all ones (-1, 255) read as the poison the buffer
    starts as, so few averages t are possible (int8: 1..127/n and -2..-128/n; uint8:
    1..254/n). With one,
    every element has the same average and a misplaced one is unseen; with none, the
    average is 0 whatever the inputs (docs/checks.md)."""
    if op != "avg" or dtype.is_float or dtype.itemsize > 1:
        return set()
    averages = 127 // n + max(0, 128 // n - 1) if dtype.name == "int8" else 254 // n
    if averages == 0:
        return {"missing", "misplaced", "nothing in place"}
    return {"misplaced"} if averages == 1 else set()


def layout_for(coll, dtype, n):
    """A small message: 2n elements (at least 64) for whole-buffer collectives, the
    smallest aligned chunk per rank (at least 4 elements) for the others."""
    return _layout(coll.name, dtype.itemsize, n)


@functools.lru_cache(maxsize=None)
def _layout(name, itemsize, n):  # cached: alltoallv's per-peer table costs n^2 Python calls
    coll = REGISTRY[name]
    chunk = max(16 // itemsize, 4)
    whole = coll.layout(1, itemsize, 2).send_count == 1
    count = max(64, 2 * n) if whole else chunk * n
    traffic = Traffic(spread=0.0) if name == "alltoallv" else None
    return coll.layout(count, itemsize, n, traffic)


def ranks_to_look_at(n, root):
    return sorted({0, 1, n // 2, n - 1, root} - {-1})


def expected(coll, pattern, layout, rank, root):
    ctx = CheckContext(pattern, rank, pattern.nranks, root, layout.param_count, layout.counts)
    return coll.expected(ctx, torch.arange(layout.recv_span(rank)))


def wrong(actual, exp, dtype, op):
    return count_mismatches(actual, exp, dtype, op)


def primed(coll, layout, pattern, rank, root, in_place, dtype):
    """What `rank`'s receive view holds after the check's priming, before the op: poison
    everywhere, except, in place, where its send view overlaps it: there its own input,
    or poison if its send buffer is no input (broadcast, scatter off the root)."""
    span = layout.recv_span(rank)
    out = torch.full((span,), -1, dtype=getattr(torch, dtype.signed_view))
    if in_place and coll.input_on(rank, root):
        # recv index t is buffer position recv_off + t, which is send index t + recv_off - send_off
        u = torch.arange(span) + layout.recv_inplace_offset * rank - layout.send_inplace_offset * rank
        inside = (u >= 0) & (u < layout.send_count)
        out[inside] = bit_view(to_dtype(pattern.values(rank, u[inside]), dtype), dtype)
    return out.view(dtype.torch_dtype())


def placements(coll):
    return (False, True) if coll.in_place_checked else (False,)


def nothing_needed(coll, rank, root, in_place):
    """In place at the root of a broadcast or scatter the output is the root's own input:
    nothing has to arrive, so an untouched buffer is right."""
    return in_place and rank == root and coll.name in ("broadcast", "scatter")


def misplaced(coll, pattern, layout, rank, root, dtype, exp):
    """Outputs of `rank` (whose right output is `exp`) holding data that belongs to
    another rank's place."""
    n = pattern.nranks
    out = []
    if coll.name in ("all_gather", "gather", "hypercube", "alltoall", "alltoallv"):
        c = layout.param_count  # equal parts (alltoallv with an even spread)
        for a, b in ((0, 1), (0, n - 1), (n // 2, n - 1)):
            if a != b:
                bad = exp.clone()
                bad[a * c:(a + 1) * c] = exp[b * c:(b + 1) * c]  # slot a got slot b's part
                out.append(bad)
    elif coll.name in ("reduce_scatter", "scatter"):
        out.append(expected(coll, pattern, layout, (rank + 1) % n, root))  # another rank's part
    elif coll.name == "broadcast":
        out.append(pattern.values((root + 1) % n, torch.arange(layout.recv_count)))  # from another root
    elif coll.name == "sendrecv":
        out.append(pattern.values(rank, torch.arange(layout.recv_count)))  # its own data back
        if n > 2:
            out.append(pattern.values((rank + 1) % n, torch.arange(layout.recv_count)))  # the wrong neighbour
    else:  # all_reduce, reduce: ring chunks at each other's places
        block = max(exp.numel() // n, 8)
        bad = exp.clone()
        bad[:block], bad[block:2 * block] = exp[block:2 * block], exp[:block]
        out.append(bad)
    return [to_dtype(b, dtype) for b in out]


def check_one(coll, dtype, op, n):
    """Every fault of one (collective, type, op, rank count): a list of the ones not caught."""
    root = n - 1 if coll.has_root else -1
    pattern = InputPattern(dtype, op, n, SEED)
    layout = layout_for(coll, dtype, n)
    blind = blind_spots(dtype, op, n)
    missed = []
    for r in [r for r in ranks_to_look_at(n, root) if coll.checked_on(r, root)]:
        exp = expected(coll, pattern, layout, r, root)
        assert exp.numel() > 0
        if wrong(to_dtype(exp, dtype), exp, dtype, op):
            missed.append(f"right output counted wrong on rank {r}")
        for in_place in placements(coll):
            if nothing_needed(coll, r, root, in_place) or in_place and "nothing in place" in blind:
                continue
            if not wrong(primed(coll, layout, pattern, r, root, in_place, dtype), exp, dtype, op):
                missed.append(f"rank {r} received nothing ({'in' if in_place else 'out-of'}-place)")
        for k, bad in enumerate(misplaced(coll, pattern, layout, r, root, dtype, exp)):
            if not wrong(bad, exp, dtype, op) and "misplaced" not in blind:
                missed.append(f"misplaced data #{k} on rank {r}")
    if coll.has_op:
        missed += reduction_faults(coll, pattern, layout, dtype, op, root, blind)
    return missed


def whole_output(coll, pattern, layout, without=()):
    """Every checked rank's output of a reduction, end to end (reduce_scatter: rank r's part
    is elements [r*c, (r+1)*c) of the one reduction, as its expected function says)."""
    span = layout.recv_count * (pattern.nranks if coll.name == "reduce_scatter" else 1)
    return pattern.reduce(torch.arange(span), without)


def reduction_faults(coll, pattern, layout, dtype, op, root, blind):
    n, missed = pattern.nranks, []
    right = whole_output(coll, pattern, layout)
    if coll.name == "reduce_scatter":  # the shortcut above agrees with the registry
        c = layout.recv_count
        for r in (0, n - 1):
            assert torch.equal(expected(coll, pattern, layout, r, root), right[r * c:(r + 1) * c])
    if "missing" not in blind:
        for q in sorted({0, n // 3, n - 1}):
            if not wrong(to_dtype(whole_output(coll, pattern, layout, without={q}), dtype), right, dtype, op):
                missed.append(f"rank {q}'s contribution missing")
    if op == "prod":  # on the first 256 elements: enough, and every rank's inputs make a big table
        idx = torch.arange(min(right.numel(), 256))
        inputs = pattern.values(torch.arange(n)[:, None], idx[None, :])
        for other, fold in (("max", lambda m: m.max(0).values), ("min", lambda m: m.min(0).values),
                            ("sum", lambda m: m.sum(0))):
            if not wrong(to_dtype(fold(inputs), dtype), right[:idx.numel()], dtype, op):
                missed.append(f"prod computed as {other}")
    return missed


def cases():
    for name in sorted(REGISTRY):
        for n in RANK_COUNTS:
            if name == "hypercube" and n & (n - 1):
                continue
            if name == "alltoallv" and n > 256:  # its per-peer table alone takes seconds at 1024
                continue
            yield pytest.param(name, n, id=f"{name}-{n}")


@pytest.mark.parametrize("name,n", list(cases()))
def test_every_planted_fault_is_caught(name, n):
    coll = REGISTRY[name]
    missed = {}
    for dtype in TYPES:
        for op in OPS if coll.has_op else (None,):
            found = check_one(coll, dtype, op, n)
            if found:
                missed[f"{dtype.name}/{op}"] = found
    assert not missed, missed
