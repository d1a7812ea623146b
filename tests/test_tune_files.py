"""The two files NCCL's example tuner plugin tools read, field by field against their
documented formats (NVIDIA/nccl plugins/tuner/example/README.md and scripts/README.md)."""

import csv
import io

import pytest

from ncclbench.tune.files import ConfigRow, PerfRow, config_text, parse_config_line, performance_csv, read_config

# scripts/README.md, "CSV Input Format"
DOCUMENTED_PERF_COLUMNS = ("collective,size_bytes,algorithm,protocol,channels,nodes,ranks,pipeOps,regBuff,"
                           "cost_metric,bandwidth_gbps,latency_us").split(",")
# README.md, "Configuration File Format"
DOCUMENTED_CONFIG_FIELDS = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"


def test_performance_csv_has_the_documented_columns_and_types():
    text = performance_csv([PerfRow("allreduce", 65536, "tree", "ll128", 16, 1, 8, 123.4567, 8.25),
                            PerfRow("allgather", 1 << 30, "nvls", "simple", -1, 1, 8, 401.0, 2677.5)])
    reader = csv.DictReader(io.StringIO(text))
    assert reader.fieldnames == DOCUMENTED_PERF_COLUMNS
    rows = list(reader)
    first = rows[0]
    # the types optimize_config.py reads each column as
    assert [first[k] for k in ("collective", "algorithm", "protocol")] == ["allreduce", "tree", "ll128"]
    assert [int(first[k]) for k in ("size_bytes", "channels", "nodes", "ranks", "pipeOps", "regBuff")] == \
        [65536, 16, 1, 8, 1, 0]
    assert float(first["bandwidth_gbps"]) == pytest.approx(123.457) and float(first["latency_us"]) == 8.25
    assert float(first["cost_metric"]) == float(first["latency_us"])
    assert rows[1]["channels"] == "-1"


def test_config_rows_are_the_documented_fields_in_order():
    row = ConfigRow("allreduce", 49153, 1572864, "tree", "ll128", 16, 1, 8, 1, 0)
    assert dict(zip(DOCUMENTED_CONFIG_FIELDS.split(","), row.text().split(","))) == {
        "collective_type": "allreduce", "min_bytes": "49153", "max_bytes": "1572864", "algorithm": "tree",
        "protocol": "ll128", "channels": "16", "nNodes": "1", "nRanks": "8", "numPipeOps": "1", "regBuff": "0"}
    assert ConfigRow("reduce", 0, 4294967295, "ring", "simple", -1, -1, -1).text() == "reduce,0,4294967295,ring,simple,-1,-1,-1"
    assert ConfigRow("broadcast", 0, 9, "ring", "ll", 2, 1, -1, 4).text() == "broadcast,0,9,ring,ll,2,1,-1,4"


def test_written_config_reads_back(tmp_path):
    rows = [ConfigRow("allreduce", 0, 1536, "tree", "ll", 4, 1, 8, 1, 0),
            ConfigRow("reducescatter", 1537, 1 << 30, "nvls_tree", "simple", 16, 2, 16, 1, 0)]
    path = tmp_path / "nccl_tuner.conf"
    path.write_text(config_text(rows, ["written by a test", ""]))
    text = path.read_text()
    assert text.startswith("# written by a test\n#\n# collective_type,")
    back = read_config(str(path))
    assert [r.text() for r in back] == [r.text() for r in rows] and [r.line for r in back] == [4, 5]


@pytest.mark.parametrize("line,problem", [
    ("allreduce,0,100,tree,simple,2,1", "7 fields"),
    ("allreduce,0,100,tree,simple,2,1,-1,-1,1,7", "11 fields"),
    ("allreduce,,100,tree,simple,2,1,-1", "empty field"),
    ("all_reduce,0,100,tree,simple,2,1,-1", "collective 'all_reduce'"),
    ("allreduce,0,100,Tree,simple,2,1,-1", "algorithm 'Tree'"),
    ("allreduce,0,100,tree,LL,2,1,-1", "protocol 'LL'"),
    ("allreduce,100,0,tree,simple,2,1,-1", "larger than max_bytes"),
    ("allreduce,0,1K,tree,simple,2,1,-1", "not a whole number"),
    ("allreduce,0,1_000,tree,simple,2,1,-1", "not a whole number"),   # strtoull reads 1
    ("allreduce,0,\uff11\uff10,tree,simple,2,1,-1", "not a whole number"),  # full-width digits: strtoull reads 0
    ("allreduce,0,100,tree,simple,65,1,-1", "channels 65"),
    ("allreduce,0,100,tree,simple,2,0,-1", "nNodes 0"),
    ("allreduce,0,100,tree,simple,2,1,-1,-1,2", "regBuff 2"),
])
def test_lines_the_plugin_would_misread_are_refused(line, problem):
    with pytest.raises(ValueError, match=problem):
        parse_config_line(line, 1)


def test_what_the_plugin_itself_accepts():
    """Spaces around fields (the plugin trims them), 8, 9 and 10 fields, -1 wildcards."""
    assert parse_config_line(" allreduce , 0,65536, tree ,simple,2,1,-1,-1,1", 3).protocol == "simple"
    assert parse_config_line("broadcast,0,32768,tree,simple,-1,1,-1", 1).pipe_ops is None
    assert parse_config_line("allgather,0,4294967295,ring,simple,4,2,-1,4", 1).reg_buff is None


def test_whole_file_errors_name_the_line(tmp_path):
    path = tmp_path / "c.conf"
    path.write_text("# a comment\n\nallreduce,0,100,tree,simple,2,1,8\nallreduce,0,100,tree\n")
    with pytest.raises(ValueError, match=r"c.conf line 4: 4 fields.*not NCCL's tuner config format"):
        read_config(str(path))
    path.write_text("# only comments\n")
    with pytest.raises(ValueError, match="no config rows"):
        read_config(str(path))
    path.write_text("allreduce,0,100,tree,simple,2,1,8," + "1" * 300 + "\n")
    with pytest.raises(ValueError, match="longer than"):
        read_config(str(path))
    path.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    with pytest.raises(ValueError, match="a binary file .a NUL byte at offset 7., not a tuner config"):
        read_config(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        read_config(str(tmp_path / "missing.conf"))


def test_the_plugins_match_rule():
    row = parse_config_line("allreduce,1000,2000,tree,simple,2,1,-1", 1)
    assert row.matches("allreduce", 1000, 1, 8) and row.matches("allreduce", 2000, 1, 4)
    assert not row.matches("allreduce", 2001, 1, 8) and not row.matches("allgather", 1500, 1, 8)
    assert not row.matches("allreduce", 1500, 2, 16)
    registered_only = parse_config_line("allreduce,0,2000,tree,simple,2,1,-1,-1,1", 1)
    assert not registered_only.matches("allreduce", 1500, 1, 8)  # tune measures unregistered buffers
