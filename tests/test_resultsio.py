"""Readers: nccl-tests / ncclbench text, JSON and CSV into one normalized DataFrame."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ncclbench.results.readers import (
    CORE_COLUMNS,
    ResultsFormatError,
    canonical_collective,
    default_labels,
    detect_format,
    filter_results,
    read_many,
    read_results,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
H200_4 = FIXTURES / "h200-4gpu-nvswitch"
H200_2 = FIXTURES / "h200-2gpu-nvswitch"
TEXT_FIXTURES = sorted(FIXTURES.glob("*/*.txt"))
DATA_LINE = re.compile(r"^\s+\d+\s+\d+\s")


def one_row(frame: pd.DataFrame, **match) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for column, value in match.items():
        mask &= frame[column] == value
    rows = frame[mask]
    assert len(rows) == 1, f"{len(rows)} rows match {match}"
    return rows.iloc[0]


@pytest.mark.parametrize("path", TEXT_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_text_fixture_parses_into_two_rows_per_line(path):
    frame = read_results(path)
    data_lines = [line for line in path.read_text().splitlines() if DATA_LINE.match(line)]
    assert len(frame) == 2 * len(data_lines)
    assert list(frame.columns[: len(CORE_COLUMNS)]) == CORE_COLUMNS
    assert set(frame["placement"]) == {"out_of_place", "in_place"}
    assert (frame["label"] == path.stem).all()
    assert (frame["source"] == str(path)).all()
    assert frame["time_us"].notna().all() and frame["busbw_gbps"].notna().all()
    assert frame["ranks"].iloc[0] in (2, 4)
    assert frame["gpu"].iloc[0] == "NVIDIA H200"
    assert frame["nccl_version"].iloc[0] == "2.28.9"
    assert not frame["collective"].str.contains("perf|mpi").any()


def test_all_reduce_np4_values():
    frame = read_results(H200_4 / "all_reduce_np4.txt")
    assert len(frame) == 30
    assert frame["size_bytes"].nunique() == 15
    assert set(frame["collective"]) == {"all_reduce"}
    big = one_row(frame, size_bytes=2147483648, placement="out_of_place")
    assert big["busbw_gbps"] == pytest.approx(359.54)
    assert big["algbw_gbps"] == pytest.approx(239.69)
    assert big["time_us"] == pytest.approx(8959.30)
    assert big["count"] == 536870912
    assert (big["dtype"], big["op"], big["root"], big["nwrong"]) == ("float", "sum", -1, 0)
    assert one_row(frame, size_bytes=2147483648, placement="in_place")["busbw_gbps"] == pytest.approx(359.89)
    assert frame["ranks"].iloc[0] == 4 and frame["nodes"].iloc[0] == 1 and frame["hosts"].iloc[0] == "vm"
    assert frame["tool"].iloc[0] == "nccl-tests"
    assert frame["root"].dtype == "int64" and frame["size_bytes"].dtype == "int64"


def test_not_available_wrong_count_is_nan():
    frame = read_results(H200_2 / "sendrecv_np2.txt")
    assert frame.loc[frame["placement"] == "in_place", "nwrong"].isna().all()
    assert (frame.loc[frame["placement"] == "out_of_place", "nwrong"] == 0).all()


def test_hypercube_empty_redop_and_size_zero():
    frame = read_results(H200_4 / "hypercube_np2.txt")
    assert set(frame["collective"]) == {"hypercube"}
    assert set(frame["op"]) == {"none"}
    assert set(frame["root"]) == {-1}
    zero = one_row(frame, size_bytes=0, placement="out_of_place")
    assert zero["time_us"] == pytest.approx(6.69)
    assert one_row(frame, size_bytes=2147483648, placement="in_place")["busbw_gbps"] == pytest.approx(360.56)


def test_all_dtypes_all_ops_file():
    frame = read_results(H200_2 / "all_reduce_np2_dall_oall.txt")
    assert len(frame) == 12 * 6 * 2
    assert frame["dtype"].nunique() == 12 and frame["op"].nunique() == 6
    row = one_row(frame, dtype="f8e5m2", op="mulsum", placement="out_of_place")
    assert row["busbw_gbps"] == pytest.approx(52.01)
    assert one_row(frame, dtype="int8", op="sum", placement="in_place")["time_us"] == pytest.approx(19.20)


def test_every_root_file():
    frame = read_results(H200_2 / "broadcast_np2_rall.txt")
    assert sorted(frame["root"].unique()) == [0, 1]
    assert one_row(frame, root=1, placement="out_of_place")["busbw_gbps"] == pytest.approx(71.94)


def test_single_process_run_with_json_line():
    frame = read_results(H200_4 / "all_reduce_1proc_4gpu_f2.txt")  # starts with "# Writing JSON output to"
    assert set(frame["collective"]) == {"all_reduce"}  # "all_reduce_perf", no _mpi
    assert len(frame) == 60
    assert one_row(frame, size_bytes=4294967296, placement="out_of_place")["time_us"] == pytest.approx(17786.6)


def test_per_iteration_text():
    frame = read_results(H200_2 / "all_reduce_np2_periter.txt")
    assert len(frame) == 16
    row = one_row(frame, size_bytes=512, placement="in_place")
    assert row["busbw_gbps"] == pytest.approx(0.04)
    assert row["i_min_us"] == pytest.approx(8.35)
    assert row["i_max_us"] == pytest.approx(150.34)
    assert row["i_p99_us"] == pytest.approx(150.34)
    assert row["i_cv_pct"] == pytest.approx(150.26)
    assert one_row(frame, size_bytes=16777216, placement="out_of_place")["busbw_gbps"] == pytest.approx(204.33)


def test_per_iteration_json_matches_text():
    from_json = read_results(H200_2 / "all_reduce_np2_periter.json")
    from_text = read_results(H200_2 / "all_reduce_np2_periter.txt")
    assert len(from_json) == 16
    row = one_row(from_json, size_bytes=8, placement="out_of_place")
    assert row["time_us"] == pytest.approx(9.39178)
    assert row["root"] == -1 and row["collective"] == "all_reduce" and row["op"] == "sum"
    assert row["i_p99_us"] == pytest.approx(10.944)
    assert row["i_skipped"] == 2
    assert row["timestamp"] == "2026-11-22 08:33:09"
    assert row["ranks"] == 2 and row["gpu"] == "NVIDIA H200"
    merged = from_json.merge(from_text, on=["size_bytes", "placement"], suffixes=("_json", "_text"))
    assert len(merged) == 16
    assert ((merged["busbw_gbps_json"] - merged["busbw_gbps_text"]).abs() <= 0.006).all()
    assert ((merged["i_cv_pct_json"] - merged["i_cv_pct_text"]).abs() <= 0.006).all()


def _ncclbench_json(**bench) -> dict:
    doc = json.loads((H200_2 / "all_reduce_np2_periter.json").read_text())
    doc["args"] = ["/usr/bin/python", "-m", "ncclbench", "allreduce"]
    doc.pop("end_time")
    doc["ncclbench"] = {
        "collective": "all_reduce", "backend": "nccl", "mode": "eager", "ranks": 4, "nodes": 2,
        "hosts": ["node-a", "node-b"], "gpu": "NVIDIA H200", "link_peak_gbps": 478.1,
        "torch_version": "2.9.0", **bench,
    }
    return doc


def test_incomplete_ncclbench_json_loads(tmp_path):
    doc = _ncclbench_json(complete=False)
    doc["results"] = doc["results"][:3]
    doc["results"][2]["out_of_place"]["bus_bw"] = "nan"
    doc["results"][2]["in_place"]["nwrong"] = None
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(doc))
    frame = read_results(path)
    assert len(frame) == 6
    assert set(frame["collective"]) == {"all_reduce"}  # from the ncclbench key, not args[0]
    first = frame.iloc[0]
    assert (first["backend"], first["mode"], first["ranks"], first["nodes"]) == ("nccl", "eager", 4, 2)
    assert first["hosts"] == "node-a;node-b"
    assert first["link_peak_gbps"] == pytest.approx(478.1)
    assert first["tool"] == "ncclbench"
    assert not frame["complete"].any()
    assert math.isnan(one_row(frame, size_bytes=512, placement="out_of_place")["busbw_gbps"])
    assert math.isnan(one_row(frame, size_bytes=512, placement="in_place")["nwrong"])


def test_json_without_ncclbench_key_takes_collective_from_args(tmp_path):
    doc = json.loads((H200_2 / "all_reduce_np2_periter.json").read_text())
    doc["args"][0] = "/opt/nccl-tests/build/reduce_scatter_perf"
    path = tmp_path / "rs.json"
    path.write_text(json.dumps(doc))
    assert set(read_results(path)["collective"]) == {"reduce_scatter"}


def _ncclbench_csv_frame() -> pd.DataFrame:
    rows = []
    for size, busbw in ((1024, 0.5), (1048576, 40.25), (1073741824, 355.0)):
        for placement in ("out_of_place", "in_place"):
            rows.append({
                "timestamp": "2026-11-22 10:00:00", "collective": "all_reduce", "placement": placement,
                "size_bytes": size, "count": size // 4, "dtype": "float", "op": "sum", "root": -1,
                "time_us": size / busbw / 1000, "algbw_gbps": busbw / 1.5, "busbw_gbps": busbw,
                "nwrong": None if placement == "in_place" else 0, "ranks": 4, "nodes": 2,
                "hosts": "node-a;node-b", "gpu": "NVIDIA H200", "backend": "nccl", "mode": "graph",
                "torch_version": "2.9.0", "nccl_version": "NCCL 2.28.9", "ncclbench_version": "0.1.0",
                "i_p99_us": 12.5,
            })
    return pd.DataFrame(rows)


def test_csv_round_trip(tmp_path):
    written = _ncclbench_csv_frame()
    path = tmp_path / "run.csv"
    written.to_csv(path, index=False)
    frame = read_results(path, label="mine")
    assert len(frame) == 6
    assert (frame["label"] == "mine").all()
    row = one_row(frame, size_bytes=1048576, placement="out_of_place")
    assert row["busbw_gbps"] == pytest.approx(40.25)
    assert row["count"] == 262144 and row["root"] == -1 and row["nwrong"] == 0
    assert row["hosts"] == "node-a;node-b" and row["mode"] == "graph" and row["nodes"] == 2
    assert row["i_p99_us"] == pytest.approx(12.5)  # extra columns are kept
    assert row["nccl_version"] == "2.28.9"  # same spelling as text and JSON give
    assert frame.loc[frame["placement"] == "in_place", "nwrong"].isna().all()
    assert list(frame.columns[: len(CORE_COLUMNS)]) == CORE_COLUMNS


def test_format_is_detected_from_content_not_extension(tmp_path):
    json_as_txt = tmp_path / "really_json.txt"
    shutil.copy(H200_2 / "all_reduce_np2_periter.json", json_as_txt)
    text_as_json = tmp_path / "really_text.json"
    shutil.copy(H200_4 / "all_reduce_np4.txt", text_as_json)
    csv_as_log = tmp_path / "really_csv.log"
    _ncclbench_csv_frame().to_csv(csv_as_log, index=False)
    assert len(read_results(json_as_txt)) == 16
    assert len(read_results(text_as_json)) == 30
    assert len(read_results(csv_as_log)) == 6
    assert detect_format("hello world\n") is None


def test_log_with_several_tests_and_noise(tmp_path):
    noise = "vm:123:123 [0] NCCL INFO Bootstrap : Using eth0\n42 is not a result row outside a table\n"
    ours = (H200_2 / "gather_np2.txt").read_text().replace(
        "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809",
        "# ncclbench version 0.1.0 nccl-library=22809",
    ).replace("gather_perf_mpi", "gather")
    log = noise + (H200_4 / "all_reduce_np4.txt").read_text() + noise + ours
    path = tmp_path / "sweep.log"
    path.write_text(log)
    frame = read_results(path)
    assert len(frame) == 60
    assert frame.groupby("collective").size().to_dict() == {"all_reduce": 30, "gather": 30}
    assert one_row(frame, collective="gather", size_bytes=2147483648, placement="out_of_place")["ranks"] == 2
    gather = frame[frame["collective"] == "gather"]
    assert set(gather["tool"]) == {"ncclbench"} and set(gather["ncclbench_version"]) == {"0.1.0"}
    assert set(frame.loc[frame["collective"] == "all_reduce", "ranks"]) == {4}


def test_per_row_timestamps(tmp_path):
    lines = (H200_2 / "all_reduce_np2_small_graph.txt").read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("#       size"):
            line += "          timestamp"
        elif DATA_LINE.match(line):
            line += "  2026-11-22 08:33:09"
        out.append(line)
    path = tmp_path / "stamped.txt"
    path.write_text("\n".join(out))
    frame = read_results(path)
    assert len(frame) == 12
    assert set(frame["timestamp"]) == {"2026-11-22 08:33:09"}


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("empty.txt", "", "not a recognised results file"),
        ("prose.txt", "just some notes\nnothing else\n", "not a recognised results file"),
        ("broken.json", '{"version": 3, "results": [', "invalid JSON"),
        ("norows.json", '{"version": 3, "args": ["all_reduce_perf"], "results": []}', "no result rows"),
        ("badrow.json", '{"version": 3, "args": ["all_reduce_perf"], "results": [{"size": 8}]}', "results[0]"),
        ("cols.csv", "collective,size_bytes\nall_reduce,8\n", "CSV lacks column(s)"),
        ("header_only.txt", "# nccl-tests version 2.19.6\n# Collective test starting: all_reduce_perf\n", "no result rows"),
    ],
)
def test_malformed_files_raise_one_line_error(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ResultsFormatError) as info:
        read_results(path)
    message = str(info.value)
    assert problem in message
    assert str(path) in message
    assert "\n" not in message
    assert info.value.path == str(path)


def test_truncated_text_row_names_the_line(tmp_path):
    lines = (H200_4 / "all_reduce_np4.txt").read_text().splitlines()
    lines[16] = lines[16][:60]
    path = tmp_path / "cut.txt"
    path.write_text("\n".join(lines))
    with pytest.raises(ResultsFormatError, match=r"line 17: expected 13 fields"):
        read_results(path)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ResultsFormatError, match=r"absent.txt: cannot read a results file: No such file or directory$"):
        read_results(tmp_path / "absent.txt")


def test_canonical_collective_names():
    assert canonical_collective("all_reduce_perf_mpi") == "all_reduce"
    assert canonical_collective("/x/build/alltoall_perf") == "alltoall"
    assert canonical_collective("allreduce") == "all_reduce"
    assert canonical_collective("hypercube_perf_mpi") == "hypercube"


def test_default_labels_disambiguate_same_stems():
    paths = [H200_4 / "all_reduce_np2.txt", H200_2 / "all_reduce_np2.txt", H200_4 / "all_reduce_np4.txt"]
    assert default_labels(paths) == [
        "h200-4gpu-nvswitch/all_reduce_np2", "h200-2gpu-nvswitch/all_reduce_np2", "all_reduce_np4",
    ]
    frame = read_many(paths)
    assert frame["label"].nunique() == 3 and len(frame) == 90


def test_filter_results():
    frame = read_results(H200_4 / "all_reduce_np4.txt")
    kept = filter_results(frame, placement="in_place", min_size=1 << 20, max_size=1 << 30)
    assert set(kept["placement"]) == {"in_place"}
    assert sorted(kept["size_bytes"]) == [2097152, 8388608, 33554432, 134217728, 536870912]
    assert len(filter_results(frame, placement="both")) == 30


def test_all_ops_and_types_in_nccl_tests_order():
    """`-d all -o all` walks the same (type, op) sequence as the reference nccl-tests run,
    mulsum included (it was missing before)."""
    from ncclbench.dtypes import resolve_dtypes, resolve_ops

    frame = read_results(H200_2 / "all_reduce_np2_dall_oall.txt")
    reference = list(dict.fromkeys(zip(frame["dtype"], frame["op"])))
    ours = [(d.name, op) for d in resolve_dtypes("all") for op in resolve_ops("all")]
    assert ours == reference
