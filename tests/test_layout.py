"""Sizes, counts and bandwidth factors against real nccl-tests output."""

import re

import pytest

from conftest import reference_files, table_rows
from ncclbench.engine.collectives import REGISTRY, lookup
from ncclbench.dtypes import DTYPES
from ncclbench.sizes import format_size, parse_size, size_sweep


@pytest.mark.parametrize("text,expected", [
    ("8", 8), ("64K", 65536), ("8M", 8 << 20), ("1G", 1 << 30), ("4g", 4 << 30), ("1KB", 1024), (" 2M ", 2 << 20),
    # nccl-tests reads the number with %lf and truncates the bytes
    ("0.5K", 512), ("1.5M", 3 << 19), (".5G", 1 << 29), ("1.3K", 1331), ("1e3", 1000), ("2.5e1K", 25600),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "-8", "-0.5K", "abc", "8X", "M", "1e", "1.2.3K", "nan", "inf"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_format_size_round_trips():
    for n in (8, 1000, 1024, 3 << 20, 1 << 30):
        assert parse_size(format_size(n)) == n


def test_sweeps_like_nccl_tests():
    assert size_sweep(8, 4 << 30, 0, 4)[-1] == 2 << 30
    assert len(size_sweep(8, 4 << 30, 0, 4)) == 15
    assert size_sweep(1 << 20, 1 << 20, 1 << 20, 1.0) == [1 << 20]
    assert size_sweep(1024, 4096, 1024, 1.0) == [1024, 2048, 3072, 4096]
    assert size_sweep(8, 8 << 20, 0, 8) == [8, 64, 512, 4096, 32768, 262144, 2097152]


@pytest.mark.parametrize("args", [(0, 8, 0, 2), (16, 8, 1, 1), (8, 64, 0, 1), (8, 64, 0, 0.5)])
def test_sweep_rejects_endless_or_empty(args):
    with pytest.raises(ValueError):
        size_sweep(*args)


def _nranks(path) -> int:
    return int(re.search(r"_np(\d)", path.name).group(1)) if "_np" in path.name else 4


def _collective(path):
    text = path.read_text()
    m = re.search(r"Collective test starting: (\w+)", text)
    return m.group(1)


CHECKED_FILES = [p for p in reference_files() if "1proc" not in p.name]


@pytest.mark.parametrize("path", CHECKED_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_size_count_and_bandwidth_match_reference(path):
    """Every reference row: our printed size and count from the requested size, and our
    algbw/busbw from its time, agree with what nccl-tests printed."""
    coll = lookup(_collective(path))
    n = _nranks(path)
    text = path.read_text()
    m = re.search(r"minBytes (\d+) maxBytes (\d+) step: (\d+)\((factor|bytes)\)", text)
    lo, hi, step, kind = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    requested = size_sweep(lo, hi, step if kind == "bytes" else 0, step if kind == "factor" else 1.0)
    rows = table_rows(text)
    assert rows, path
    per_combo = len(rows) // len(requested)
    for i, row in enumerate(rows):
        if len(row) == 12:  # hypercube prints an empty redop column
            row.insert(3, "")
        size, count, dtype, op, root = int(row[0]), int(row[1]), row[2], row[3], int(row[4])
        item = DTYPES[dtype].itemsize
        req = requested[i // per_combo]
        lay = coll.layout(req // item, item, n)
        assert lay.printed_bytes(item) == size, (row, req)
        assert lay.param_count == count, row
        time_us, algbw, busbw = float(row[5]), float(row[6]), float(row[7])
        if time_us > 1 and algbw > 0.5:  # enough digits printed to compare
            ours_alg, ours_bus = coll.bandwidths(lay, item, n, time_us * 1e-6)
            assert ours_alg == pytest.approx(algbw, rel=0.01, abs=0.011)
            assert ours_bus == pytest.approx(busbw, rel=0.01, abs=0.011)
        if coll.printed_op is not None:
            assert op == coll.printed_op
        if not coll.has_root:
            assert root == -1
        wrong_in_place = row[-1]
        assert (wrong_in_place == "N/A") == (not coll.in_place_checked)


def test_bus_factors():
    f = {c.name: c.bus_factor(8) for c in REGISTRY.values()}
    assert f["all_reduce"] == pytest.approx(2 * 7 / 8)
    for name in ("all_gather", "reduce_scatter", "alltoall", "gather", "scatter"):
        assert f[name] == pytest.approx(7 / 8)
    for name in ("broadcast", "reduce", "sendrecv"):
        assert f[name] == 1.0


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_hypercube_schedule_gathers_everything(n):
    """Simulate the exchanges: after log2(n) steps every rank holds every chunk."""
    from ncclbench.backends.common import hypercube_schedule

    held = [{r} for r in range(n)]
    for step in range(n.bit_length() - 1):
        new = [set(h) for h in held]
        for r in range(n):
            peer, sent, got = hypercube_schedule(n, r)[step]
            assert hypercube_schedule(n, peer)[step][1] == got  # the peer sends what r expects
            block = set(range(got, got + (1 << step)))
            assert block <= held[peer]
            new[r] |= block
        held = new
    assert all(h == set(range(n)) for h in held)


def test_lookup_accepts_nccl_tests_names():
    assert lookup("all_reduce_perf").name == "all_reduce"
    assert lookup("allreduce").name == "all_reduce"
    assert lookup("reduce_scatter_perf_mpi").name == "reduce_scatter"
    with pytest.raises(KeyError):
        lookup("allreduse")
