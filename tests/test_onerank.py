"""One rank per communicator: no cell prints a number its column title does not mean."""

import json
import math

import pandas as pd
import pytest

from conftest import run_cli, table_rows
from ncclbench.engine import onerank
from ncclbench.engine.collectives import ALL_REDUCE, ALLTOALL, lookup
from ncclbench.results import report
from ncclbench.engine.plan import Plan
from ncclbench.results.records import PlacementResult, ResultRow, RunSummary



def plan(collective="all_reduce", backend="nccl", ops=("sum",), dtypes=("float",), graph=0):
    return Plan(collective=collective, min_bytes=8, max_bytes=8, dtypes=dtypes, ops=ops, backend=backend,
                graph_replays=graph)


def cell(t=10.0, bw=1.0):
    return PlacementResult(t, bw, bw, 0, host_us=2.0)


@pytest.mark.parametrize("collective,backend,ranks,na", [
    ("all_reduce", "nccl", 1, True),     # torch: the stand-in is skipped on one rank
    ("broadcast", "gloo", 1, True),
    ("reduce", "nccl", 1, True),
    ("all_reduce", "nccl", 2, False),    # several ranks: the stand-in moves data (and is said)
    ("all_gather", "nccl", 1, False),    # a real out-of-place copy
    ("all_reduce", "cupy", 1, False),    # CuPy: NCCL's out-of-place call copies
])
def test_out_of_place_is_na_only_where_the_stand_in_would_be_timed(collective, backend, ranks, na):
    cells = onerank.honest_cells([cell(), cell(5.0)], lookup(collective), backend, ranks)
    assert cells[0].measured is (not na) and cells[1].measured
    if na:
        assert math.isnan(cells[0].time_us) and cells[0].nwrong is None and cells[1].time_us == 5.0


def test_header_says_why_and_what_the_in_place_column_times():
    gloo = onerank.header_notes(plan(backend="gloo"), 1)
    assert len(gloo) == 2 and gloo[0].startswith("out-of-place is N/A on one rank: torch.distributed has no "
                                                 "out-of-place all_reduce")
    assert gloo[1].startswith("in-place on one rank: gloo returns from an in-place all_reduce without moving data")
    graph = onerank.header_notes(plan(graph=10), 1)
    assert "--backend cupy times NCCL's out-of-place call" in graph[0]
    assert graph[-1].startswith("-G on one rank: that skipped in-place all_reduce captures nothing")
    cupy = onerank.header_notes(plan(backend="cupy", graph=10), 1)
    assert [n.split(":")[0] for n in cupy] == ["in-place on one rank", "-G on one rank"]
    several = onerank.header_notes(plan(), 2)
    assert several == ["torch.distributed has no out-of-place all_reduce: both columns run it in place on "
                       "distinct buffers (use --backend cupy for a true out-of-place call)"]
    assert onerank.header_notes(plan(backend="cupy"), 2) == []


def test_premul_sum_runs_a_kernel_even_on_one_rank():
    assert not onerank.in_place_is_skipped(ALL_REDUCE, "nccl", 1, "avg", "float")
    assert not onerank.in_place_is_skipped(ALL_REDUCE, "cupy", 1, "mulsum", "half")
    assert onerank.in_place_is_skipped(ALL_REDUCE, "nccl", 1, "avg", "int32")  # integer avg: divide by 1
    assert not onerank.in_place_is_skipped(ALLTOALL, "nccl", 1, "sum", "float")  # send/recv path
    mixed = onerank.header_notes(plan(ops=("sum", "avg")), 1)
    assert mixed[1].endswith("avg on floating types and mulsum still run a kernel that scales in place")


def test_na_cells_keep_the_layout_and_stay_out_of_the_summary():
    import dataclasses

    na = onerank.not_measured(dataclasses.replace(cell(), rank_us=(12.5,)))
    assert len(na.rank_us) == 1 and all(t != t for t in na.rank_us)  # the per-rank times too: nan, as the cell
    rows = [ResultRow("all_reduce", size, size // 4, "float", "sum", -1, na, cell(t, bw))
            for size, t, bw in ((8, 10.0, 0.5), (1024, 20.0, 3.0))]
    for per_iter in (False, True):
        line = report.row_line(rows[0], per_iter)
        assert line.split()[5:9] == ["N/A"] * 4 and len(line.split()) == (21 if per_iter else 13)
    assert len(report.row_line(rows[0])) == 117
    summary = RunSummary(rows, complete=True)
    assert summary.average_busbw == pytest.approx(1.75) and summary.peak_busbw == 3.0
    assert summary.largest_size_busbw == 3.0  # in-place where out-of-place is N/A


def test_one_gloo_rank_end_to_end(tmp_path):
    """gloo, one rank: all_reduce prints N/A out of place (JSON null, CSV empty) and `show`
    replays it; all_gather really copies, so both of its columns are numbers."""
    js, csv = tmp_path / "r.json", tmp_path / "r.csv"
    r = run_cli(["allreduce", "-g", "1", "--backend", "gloo", "-b", "1K", "-e", "1M", "-f", "32", "-n", "2",
                 "--no-save", "-J", str(js), "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert len(rows) == 3 and all(row[5:9] == ["N/A"] * 4 and row[12] == "0" for row in rows)
    assert "# Note: out-of-place is N/A on one rank" in r.stdout
    assert all(len(ln) in (117, 118) for ln in r.stdout.splitlines() if table_rows(ln))
    doc = json.loads(js.read_text())
    assert all(res["out_of_place"] == {"time": None, "alg_bw": None, "bus_bw": None, "nwrong": None}
               for res in doc["results"])
    frame = pd.read_csv(csv)
    oop = frame[frame.placement == "out_of_place"]
    assert oop.time_us.isna().all() and frame[frame.placement == "in_place"].time_us.notna().all()
    shown = run_cli(["show", str(js)])
    assert shown.returncode == 0 and [row[5] for row in table_rows(shown.stdout)] == ["N/A"] * 3, shown.stderr
    r = run_cli(["allgather", "-g", "1", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "2", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    (row,) = table_rows(r.stdout)
    assert "N/A" not in row[5:9] and "N/A on one rank" not in r.stdout
