"""The correctness checker: expected values from an independent simulation of each
collective, exactness for every dtype/op, and a planted error that must be counted."""

import pytest
import torch

from ncclbench.engine.checkdata import InputPattern, bit_view, codebook, count_mismatches
from ncclbench.dtypes import premul_scalar, to_dtype
from ncclbench.engine.collectives import CheckContext, REGISTRY
from ncclbench.dtypes import DTYPES, OPS
from ncclbench.engine.traffic import Traffic


def simulate(coll, inputs, root, op, lay=None):
    """Each rank's output computed the slow, obvious way from all ranks' inputs (int64 / float64)."""
    n = len(inputs)

    def red(vals):  # vals in rank order
        if op == "mulsum":  # premul-sum: rank r's input times its factor, summed
            return sum(v * premul_scalar(r) for r, v in enumerate(vals))
        acc = vals[0].clone()
        for v in vals[1:]:
            acc = {"sum": acc + v, "avg": acc + v, "prod": acc * v,
                   "min": torch.minimum(acc, v), "max": torch.maximum(acc, v)}[op]
        return acc.double() / n if op == "avg" else acc

    chunk = None
    outs = []
    for r in range(n):
        if coll.name == "all_reduce" or (coll.name == "reduce" and r == root):
            outs.append(red(inputs))
        elif coll.name == "broadcast":
            outs.append(inputs[root])
        elif coll.name in ("all_gather", "hypercube") or (coll.name == "gather" and r == root):
            outs.append(torch.cat(inputs))
        elif coll.name == "reduce_scatter":
            chunk = inputs[0].numel() // n
            outs.append(red([x[r * chunk:(r + 1) * chunk] for x in inputs]))
        elif coll.name == "alltoall":
            chunk = inputs[0].numel() // n
            outs.append(torch.cat([x[r * chunk:(r + 1) * chunk] for x in inputs]))
        elif coll.name == "scatter":
            chunk = inputs[root].numel() // n
            outs.append(inputs[root][r * chunk:(r + 1) * chunk])
        elif coll.name == "sendrecv":
            outs.append(inputs[(r - 1) % n])
        elif coll.name == "alltoallv":
            # cut each sender's stream into per-destination parts, keep the parts for r
            parts = []
            for src in range(n):
                cuts = torch.tensor(lay.counts[src]).cumsum(0).tolist()
                begin = cuts[r - 1] if r else 0
                parts.append(inputs[src][begin:cuts[r]])
            outs.append(torch.cat(parts))
        else:
            outs.append(None)
    return outs


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_expected_matches_simulation(name, nranks):
    coll = REGISTRY[name]
    dtype = DTYPES["float"]
    ops = ["sum", "prod", "min", "max", "mulsum", "avg"] if coll.has_op else [None]
    root = nranks - 1 if coll.has_root else -1
    traffics = [None]
    if name == "alltoallv":
        matrix = tuple(tuple(16 * ((7 * i + 3 * j) % 5) for j in range(nranks)) for i in range(nranks))
        traffics = [Traffic(spread=1.0), Traffic(spread=0.0), Traffic(spread=0.37),
                    Traffic(matrix=matrix, source="m.txt")]
    for op in ops:
        for traffic in traffics:
            pattern = InputPattern(dtype, op, nranks, seed=5)
            lay = coll.layout(1024, dtype.itemsize, nranks, traffic)
            inputs = [pattern.values(r, torch.arange(lay.send_count)) for r in range(nranks)]
            outs = simulate(coll, inputs, root, op, lay)
            for r in range(nranks):
                if not coll.checked_on(r, root):
                    continue
                ctx = CheckContext(pattern, r, nranks, root, lay.param_count, lay.counts)
                exp = coll.expected(ctx, torch.arange(lay.recv_span(r)))
                assert torch.equal(exp, outs[r]), (name, op, r, traffic)


@pytest.mark.parametrize("dname", sorted(DTYPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("nranks", [2, 8, 64])
def test_reduction_is_exact_in_every_order(dname, op, nranks):
    """Reducing the real typed inputs in two different orders gives the exact expected bits."""
    dtype = DTYPES[dname]
    if dtype.torch_dtype() is None:
        pytest.skip("torch lacks this type")
    pattern = InputPattern(dtype, op, nranks, seed=3)
    idx = torch.arange(4096)
    typed = [to_dtype(pattern.values(r, idx), dtype) for r in range(nranks)]
    as_f64 = [_f64(t, dtype) for t in typed]
    # the inputs survive the cast unchanged
    for r in range(nranks):
        assert torch.equal(as_f64[r], pattern.values(r, idx).double())
    if op == "avg":
        return  # avg divides: covered by the tolerance test below
    for order in (range(nranks), reversed(range(nranks))):
        acc = None
        for r in order:
            v = typed[r]
            if dtype.is_float:
                v = v.double()
            elif dtype.name in ("uint32", "uint64"):
                v = bit_view(v, dtype)  # torch cannot add uint32; same bits as the signed twin
            if op == "mulsum":  # the factor is applied in the type, as NCCL does, and must be exact
                v = _combine(v, v * (premul_scalar(r) - 1), "sum", dtype)
            acc = v if acc is None else _combine(acc, v, "sum" if op == "mulsum" else op, dtype)
        if dtype.is_float:
            result = to_dtype(acc.double(), dtype)
        elif dtype.name in ("uint32", "uint64"):
            result = acc.view(dtype.torch_dtype())
        else:
            result = acc
        assert count_mismatches(result, pattern.reduce(idx), dtype, op) == 0


def _combine(a, b, op, dtype):
    if op == "sum":
        out = a + b
    elif op == "prod":
        out = a * b
    elif op == "min":
        out = torch.minimum(a, b)
    else:
        out = torch.maximum(a, b)
    if dtype.is_float:
        out = to_dtype(out, dtype).float().double() if dtype.itemsize <= 2 else out
    return out


def _f64(t, dtype):
    if dtype.name in ("uint32", "uint64"):
        return t.view(getattr(torch, dtype.signed_view)).double()
    return t.float().double() if dtype.is_float and dtype.itemsize == 1 else t.double()


PATTERN_RANKS = [1, 2, 3, 5, 64, 97, 110, 128, 256, 1000, 1024]


@pytest.mark.parametrize("dname", sorted(DTYPES))
@pytest.mark.parametrize("nranks", PATTERN_RANKS)
def test_every_rank_has_its_own_exact_inputs_within_span(dname, nranks):
    """For every op (and data movement), two seeds: within `span` consecutive elements
    every two ranks' inputs differ and, for a reduction, every rank contributes something
    other than the op's identity; every input and result is exact in the type and never
    the poison bits; the structured reduction equals a brute-force one."""
    dtype = DTYPES[dname]
    if dtype.torch_dtype() is None:
        pytest.skip("torch lacks this type")
    for op in (None,) + OPS:
        for seed in (1, 12345):
            p = InputPattern(dtype, op, nranks, seed)
            idx = torch.arange(3, 3 + max(p.span, 16))
            inputs = p.values(torch.arange(nranks)[:, None], idx[None, :])
            window = inputs[:, :p.span]
            assert torch.unique(window, dim=0).shape[0] == nranks, (op, seed, p.span)
            typed = to_dtype(inputs, dtype)
            assert torch.equal(_f64(typed, dtype), inputs.double()), (op, seed)  # exact in the type
            if op in (None, "max", "min"):  # what the output holds: never the poison
                assert not (bit_view(typed, dtype) == -1).any(), (op, seed)
            if op is None:
                continue
            book = codebook(dtype)  # what ranks outside the active group give max and min
            identity = {"sum": 0, "avg": 0, "mulsum": 0, "prod": 1, "max": book[0], "min": book[-1]}[op]
            if nranks > 1:
                assert ((window != identity).any(dim=1)).all(), (op, seed)
            result = p.reduce(idx)
            assert torch.equal(result, _brute_force(inputs, op, dtype, nranks)), (op, seed)
            if dtype.is_float and op == "avg":
                continue
            assert not (bit_view(to_dtype(result, dtype), dtype) == -1).any(), (op, seed)
            assert torch.equal(to_dtype(result, dtype).double() if dtype.is_float else result,
                               result.double() if dtype.is_float else result)


def _brute_force(inputs, op, dtype, nranks):
    if op == "mulsum":
        return (inputs * torch.tensor([premul_scalar(r) for r in range(nranks)])[:, None]).sum(0)
    if op == "avg":
        total = inputs.sum(0)
        return total.double() / nranks if dtype.is_float else torch.div(total, nranks, rounding_mode="trunc")
    return {"sum": lambda m: m.sum(0), "prod": lambda m: m.prod(0), "max": lambda m: m.max(0).values,
            "min": lambda m: m.min(0).values}[op](inputs)


def test_inputs_differ_by_rank_and_element():
    for op in (None, "sum"):
        p = InputPattern(DTYPES["float"], op, 4, seed=1)
        idx = torch.arange(64)
        a, b = p.values(0, idx), p.values(1, idx)
        assert not torch.equal(a, b)
        assert len(set(a.tolist())) > 10


@pytest.mark.parametrize("dname", ["float", "bfloat16", "int32", "half", "int8"])
def test_planted_error_is_counted(dname):
    dtype = DTYPES[dname]
    coll = REGISTRY["all_reduce"]
    pattern = InputPattern(dtype, "sum", 4, seed=9)
    ctx = CheckContext(pattern, 0, 4, -1, 1000)
    idx = torch.arange(1000)
    good = to_dtype(coll.expected(ctx, idx), dtype)
    assert count_mismatches(good, coll.expected(ctx, idx), dtype, "sum") == 0
    bad = good.clone()
    bad[17] = bad[17] + 1
    bad[999] = 0 if bad[999] != 0 else 1
    assert count_mismatches(bad, coll.expected(ctx, idx), dtype, "sum") == 2


def test_poisoned_buffer_never_passes():
    dtype = DTYPES["float"]
    out = torch.empty(100, dtype=torch.float32)
    bit_view(out, dtype).fill_(-1)
    p = InputPattern(dtype, "max", 2, seed=0)
    assert count_mismatches(out, p.reduce(torch.arange(100)), dtype, "max") == 100


def test_avg_tolerance_accepts_rounding_but_not_errors():
    dtype = DTYPES["half"]
    p = InputPattern(dtype, "avg", 3, seed=2)
    idx = torch.arange(500)
    exp = p.reduce(idx)
    got = to_dtype(exp, dtype)  # rounded to half: must pass
    assert count_mismatches(got, exp, dtype, "avg") == 0
    got[3] += 1.0
    got[4] = float("nan")  # a NaN is wrong, whatever the tolerance
    assert count_mismatches(got, exp, dtype, "avg") == 2


@pytest.mark.parametrize("dname", sorted(DTYPES))
@pytest.mark.parametrize("nranks", [1, 2, 3, 64])
def test_mulsum_check_catches_a_missing_or_shared_factor(dname, nranks):
    """-o mulsum: a backend that summed without the per-rank factors, or applied rank 0's
    factor everywhere, gives wrong elements; the exact premul-sum gives none."""
    dtype = DTYPES[dname]
    if dtype.torch_dtype() is None:
        pytest.skip("torch lacks this type")
    pattern = InputPattern(dtype, "mulsum", nranks, seed=4)
    idx = torch.arange(4096)
    expected = pattern.reduce(idx)
    plain = pattern.values(torch.arange(nranks)[:, None], idx).sum(0)
    assert count_mismatches(to_dtype(expected, dtype), expected, dtype, "mulsum") == 0
    # no factor at all: wrong on any rank count (rank 0's factor is 2)
    assert premul_scalar(0) != 1
    assert count_mismatches(to_dtype(plain, dtype), expected, dtype, "mulsum") > 0
    if nranks > 1:  # every rank given rank 0's factor, or rank 1's: wrong too
        for r in (0, 1):
            shared = plain * premul_scalar(r)
            assert count_mismatches(to_dtype(shared, dtype), expected, dtype, "mulsum") > 0
    assert int(expected.max()) <= dtype.exact_limit


def test_which_backend_runs_mulsum():
    """mulsum (premul-sum): refused on gloo, on the torch NCCL group for types other than
    half/float/double (ProcessGroupNCCL throws for them, and its bfloat16 one summed
    wrong when probed), allowed on CuPy."""
    from ncclbench.engine.collectives import ALL_REDUCE, REDUCE_SCATTER

    unsupported = ALL_REDUCE.unsupported
    assert "gloo has no mulsum" in unsupported("gloo", "float", "mulsum")
    for d in ("half", "float", "double"):
        assert unsupported("nccl", d, "mulsum") is None
    assert "wrong sums" in unsupported("nccl", "bfloat16", "mulsum")
    for d in ("int8", "int32", "int64", "f8e4m3", "f8e5m2"):
        assert "only for half, float and double" in unsupported("nccl", d, "mulsum")
    assert all(unsupported("cupy", d, "mulsum") is None for d in DTYPES)
    assert unsupported("nccl", "int8", "sum") is None
    # measured: torch's reduce_scatter_tensor drops the factor in a one-rank group
    assert "ignores the premul-sum factor" in REDUCE_SCATTER.unsupported("nccl", "float", "mulsum", 1)
    assert REDUCE_SCATTER.unsupported("nccl", "float", "mulsum", 2) is None
    assert unsupported("nccl", "float", "mulsum", 1) is None
    assert REDUCE_SCATTER.unsupported("cupy", "float", "mulsum", 1) is None


def test_all_pairs_depend_on_ranks_per_communicator():
    """-d all -o all: NCCL refuses fp8 avg/mulsum in a one-rank communicator (measured,
    NCCL 2.28.9), so those pairs are skipped on 1 rank (or --split groups of 1) and run on 2;
    an explicit fp8 avg on 1 rank is refused with one line."""
    from ncclbench.api import options as plan_options
    from ncclbench.errors import PlanError

    def skipped(nranks, **extra):
        o = plan_options.options_for({"datatype": "all", "op": "all", **extra})
        return set(plan_options.build_plan("allreduce", o, "cupy", [], nranks).skipped)

    fp8_pairs = {(d, op) for d in ("f8e4m3", "f8e5m2") for op in ("avg", "mulsum")}
    assert skipped(1) == fp8_pairs
    assert skipped(2) == set() and skipped(None) == set()
    assert skipped(4, split="MOD 4") == fp8_pairs  # four groups of one rank
    plan = plan_options.build_plan("allreduce", plan_options.options_for({"datatype": "f8e5m2", "op": "avg"}), "cupy", [], 1)
    with pytest.raises(PlanError, match="one-rank communicator"):
        plan.check_runnable(1)
    plan.check_runnable(2)


def test_skip_note_names_the_rank_count_when_it_matters():
    """The header note says a skip comes from the rank count when it does (fp8 avg/mulsum
    in one-rank communicators) and stays the plain backend note otherwise."""
    from types import SimpleNamespace

    from ncclbench.api import options as plan_options
    from ncclbench.engine.runfacts import build_run_info

    backend = SimpleNamespace(library_version=lambda: (22809, "NCCL 2.28.9 via CuPy"), nranks=1, group_size=1,
                              timing_name=lambda: "eager (CUDA events)")
    plan = plan_options.build_plan("allreduce", plan_options.options_for({"datatype": "all", "op": "all"}), "cupy", [], 1)
    (note,) = [n for n in build_run_info(plan, backend, []).notes if n.startswith("skipped")]
    assert note == ("skipped what the cupy backend with 1 rank(s) per communicator cannot run: "
                    "f8e4m3 (avg, mulsum), f8e5m2 (avg, mulsum)")
    plan = plan_options.build_plan("allreduce", plan_options.options_for({"datatype": "all", "op": "all"}), "gloo", [], 2)
    backend.nranks = backend.group_size = 2
    (note,) = [n for n in build_run_info(plan, backend, []).notes if n.startswith("skipped")]
    assert note.startswith("skipped what the gloo backend cannot run: int8 (avg, mulsum)")
