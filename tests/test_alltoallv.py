"""alltoallv: nccl-tests 2.19.6's alltoallv_perf traffic (generated spread, byte matrix),
its size/count/bandwidth conventions, and real gloo ranks moving uneven parts."""

import pytest

from conftest import run_cli, table_rows
from ncclbench.engine.collectives import lookup
from ncclbench.errors import PlanError
from ncclbench.engine.traffic import Traffic, read_matrix

A2AV = lookup("alltoallv")


def test_generated_spread_one_is_distance_weighted():
    # 1 KiB of floats on 4 ranks: 64 elements per peer on average; total 1024 B split by
    # distance 0..3 as 0, 1/6, 2/6, 3/6, each rounded down to 16 B: 0, 160, 336, 512.
    lay = A2AV.layout(256, 4, 4, Traffic(spread=1.0))
    assert lay.counts[0] == (0, 40, 84, 128)
    assert lay.counts[1] == (128, 0, 40, 84)  # the same pattern, rotated
    assert lay.printed_bytes(4) == 1008 and lay.param_count == 64
    assert all(sum(lay.receives(r)) == 252 for r in range(4))  # balanced totals
    algbw, busbw = A2AV.bandwidths(lay, 4, 4, 1e-6)
    assert algbw == pytest.approx(1008 / 1e3) and busbw == pytest.approx(algbw * 3 / 4)


def test_generated_spread_zero_is_even_and_in_between_blends():
    even = A2AV.layout(256, 4, 4, Traffic(spread=0.0))
    assert even.counts[2] == (64, 64, 64, 64) and even.printed_bytes(4) == 1024
    half = A2AV.layout(256, 4, 4, Traffic(spread=0.5))
    # 0.5 * 256 + 0.5 * {0, 170.67, 341.33, 512} bytes, rounded down to 16 B
    assert [c * 4 for c in half.counts[0]] == [128, 208, 288, 384]


def test_default_traffic_is_spread_one_and_counts_align_to_16_bytes():
    lay = A2AV.layout(1000, 8, 3)  # doubles: 333 per rank -> 332 (16 B = 2 doubles)
    assert lay.param_count == 332
    assert all(c % 2 == 0 for row in lay.counts for c in row)
    assert lay.counts == A2AV.layout(1000, 8, 3, Traffic(spread=1.0)).counts


def test_matrix_mode_sizes_from_the_busiest_rank(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("0 1000 2000\n100 0 200\n5000 0 0\n")
    m = read_matrix(str(path), scale=2.0)
    assert m == ((0, 2000, 4000), (192, 0, 400), (10000, 0, 0))  # x2, then down to 16 B
    t = Traffic(matrix=m, source=str(path), scale=2.0)
    lay = A2AV.layout(123, 4, 3, t)  # the message size plays no part
    assert lay.param_count == 0
    assert lay.send_count * 4 == 10000            # rank 2 sends the most
    assert lay.recv_count * 4 == 10192            # rank 0 receives the most
    assert lay.printed_bytes(4) == 10192 == t.busiest_rank_bytes(3)
    assert lay.recv_span(1) * 4 == 2000 and lay.recv_span(2) * 4 == 4400
    # a larger matrix serves fewer ranks with its first rows and columns
    assert A2AV.layout(1, 4, 2, t).counts == ((0, 500), (48, 0))


@pytest.mark.parametrize("text,words", [
    ("", "empty"),
    ("1 2\n3\n", "1 columns, the first row has 2"),
    ("1 2 3\n4 5 6\n", "must be square"),
    ("1 -2\n3 4\n", ">= 0"),
    ("1 x\n3 4\n", "'x' is not a number"),
    ("1 nan\n3 4\n", ">= 0"),
])
def test_bad_matrix_files_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "m.txt"
    path.write_text(text)
    with pytest.raises(PlanError) as exc:
        read_matrix(str(path))
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_generated_alltoallv_on_gloo_ranks_is_correct_with_summary():
    r = run_cli(["alltoallv", "-g", "3", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2",
                 "--alltoallv-spread", "0.7", "--alltoallv-summary", "--no-save"])
    assert r.returncode == 0, r.stderr
    assert "# Note: alltoallv traffic: generated, spread 0.700" in r.stdout
    rows = table_rows(r.stdout)
    # 1 KiB on 3 ranks: 84 floats per peer, 1008 B in all; spread 0.7 gives distance 0, 1, 2
    # 0.3*336 + 0.7*{0, 336, 672} = 100.8, 336, 571.2 -> 96 + 336 + 560 = 992 B
    assert [row[0] for row in rows] == ["992", "8160", "65504"]
    for row in rows:
        assert row[3] == "none" and row[4] == "-1" and row[8] == "0" and row[12] == "N/A", row
    summaries = [ln for ln in r.stdout.splitlines() if ln.startswith("# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY")]
    assert len(summaries) == 3 and "mode=generated nranks=3" in summaries[0] and "spread=0.700" in summaries[0]
    assert sum(1 for ln in r.stdout.splitlines() if ln.startswith("#   rank=")) == 9


def test_matrix_alltoallv_from_environment_like_nccl_tests(tmp_path):
    path = tmp_path / "traffic.txt"
    path.write_text("0 4096 16\n32 64 0\n8192 0 128\n")
    env = {"NCCL_TESTS_ALLTOALLV_MATRIX_FILE": str(path), "NCCL_TESTS_ALLTOALLV_MATRIX_SCALE": "0.5"}
    r = run_cli(["alltoallv", "-g", "3", "--backend", "gloo", "-b", "8K", "-e", "8K", "-n", "2", "--no-save",
                 "-d", "int8"], env=env)
    assert r.returncode == 0, r.stderr
    assert f"matrix {path} (3x3 bytes, scale 0.5)" in r.stdout
    (row,) = table_rows(r.stdout)
    # halved and rounded down: rank 2 sends 4096 + 64 = 4160 B, the most of any rank
    assert row[:4] == ["4160", "0", "int8", "none"] and row[8] == "0"


def test_planted_wrong_element_in_alltoallv_is_counted():
    r = run_cli(["alltoallv", "-g", "3", "--backend", "gloo", "-b", "4K", "-e", "4K", "-n", "1", "--no-save"],
                env={"NCCLBENCH_FAULT": "corrupt:rank=2"})
    assert r.returncode != 0
    (row,) = table_rows(r.stdout)
    assert row[8] == "1", row
    assert "# Out of bounds values : 1 FAILED" in r.stdout
