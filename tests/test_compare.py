"""`ncclbench compare`: matching, thresholds, exit codes and machine-readable output."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ncclbench.cli.compare import compare_command
from ncclbench.results.compare import compare_frames, parse_threshold, print_rich
from ncclbench.results.readers import read_results

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
H200_4 = FIXTURES / "h200-4gpu-nvswitch"
H200_2 = FIXTURES / "h200-2gpu-nvswitch"

SIZES = (1 << 10, 1 << 20, 1 << 30)
BASE_BUSBW = {1 << 10: 1.0, 1 << 20: 50.0, 1 << 30: 300.0}


def write_run(path: Path, busbw: dict[int, float], collective="all_reduce", nwrong=0, include_zero=True) -> Path:
    """A small ncclbench CSV: one row per size x placement, busbw as given, time derived from it."""
    rows = []
    sizes = ([0] if include_zero else []) + list(busbw)
    for size in sizes:
        bw = busbw.get(size, 0.0)
        for placement in ("out_of_place", "in_place"):
            rows.append({
                "collective": collective, "placement": placement, "size_bytes": size, "count": size // 4,
                "dtype": "float", "op": "sum", "root": -1,
                "time_us": 5.0 if size == 0 else size * 1.5 / bw / 1e3,
                "algbw_gbps": bw / 1.5, "busbw_gbps": bw, "nwrong": nwrong if size == 1 << 20 else 0,
                "ranks": 4, "backend": "nccl",
            })
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def scaled(factor: float, sizes=SIZES) -> dict[int, float]:
    return {s: BASE_BUSBW[s] * (factor if s in sizes else 1.0) for s in BASE_BUSBW}


def run(*args):
    return CliRunner().invoke(compare_command, [str(a) for a in args])


@pytest.fixture
def base(tmp_path):
    return write_run(tmp_path / "base.csv", BASE_BUSBW)


def assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ncclbench: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.output


def test_improvement_passes(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(1.20))
    result = run(base, new)
    assert result.exit_code == 0, result.output
    assert "improved" in result.stdout
    assert "PASS" in result.stdout


def test_regression_beyond_threshold_fails(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(0.90, sizes=(1 << 30,)))
    result = run(base, new)
    assert result.exit_code == 1, result.output
    assert "REGRESSION" in result.stdout
    assert "FAIL: 2 regression(s)" in result.stdout  # 1G, both placements


def test_regression_within_threshold_passes(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(0.97))
    assert run(base, new).exit_code == 0
    # ... but not with a tighter threshold, in either spelling.
    assert run(base, new, "--threshold", "2%").exit_code == 1
    assert run(base, new, "--threshold", "0.02").exit_code == 1


def test_exactly_at_threshold_is_not_a_regression(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(0.95))
    assert run(base, new, "--threshold", "5%").exit_code == 0


def test_time_metric(tmp_path, base):
    slower = write_run(tmp_path / "slower.csv", scaled(0.8))  # lower busbw = longer time
    result = run(base, slower, "--metric", "time", "--threshold", "10%")
    assert result.exit_code == 1
    assert "time in us (lower is better)" in result.stdout
    faster = write_run(tmp_path / "faster.csv", scaled(1.25))
    assert run(base, faster, "--metric", "time").exit_code == 0


def test_size_filters_limit_what_is_judged(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(0.5, sizes=(1 << 10,)))
    assert run(base, new).exit_code == 1
    assert run(base, new, "--min-size", "1M").exit_code == 0
    assert run(base, new, "--max-size", "1K").exit_code == 1


def test_size_zero_rows_are_skipped(tmp_path, base):
    new = write_run(tmp_path / "new.csv", BASE_BUSBW)
    comparison = compare_frames(read_results(base), read_results(new))
    assert 0 not in set(comparison.rows["size_bytes"])
    assert len(comparison.rows) == 6


def test_wrong_results_in_new_fail(tmp_path, base):
    new = write_run(tmp_path / "new.csv", BASE_BUSBW, nwrong=3)
    result = run(base, new)
    assert result.exit_code == 1
    assert "WRONG RESULTS (#wrong 3)" in result.stdout


def test_no_matching_rows_is_bad_input(tmp_path, base):
    other = write_run(tmp_path / "other.csv", BASE_BUSBW, collective="all_gather")
    assert_one_line_error(run(base, other), "no matching rows")


def test_filters_that_leave_nothing_are_bad_input(tmp_path, base):
    new = write_run(tmp_path / "new.csv", BASE_BUSBW)
    assert_one_line_error(run(base, new, "--min-size", "4G"), "no matching rows")


def test_malformed_file_is_bad_input(tmp_path, base):
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": 3, "results": [')
    assert_one_line_error(run(base, broken), str(broken), "invalid JSON")


def test_missing_file_is_bad_input(tmp_path, base):
    assert_one_line_error(run(base, tmp_path / "absent.txt"), "absent.txt", "cannot read")


@pytest.mark.parametrize("args, fragment", [
    (["--threshold", "five"], "cannot read threshold"),
    (["--threshold", "5"], "ambiguous"),
    (["--min-size", "12Q"], "cannot parse size"),
    (["--metric", "speed"], "--metric"),
    (["--label", "only-one"], "--label"),
])
def test_bad_options_are_one_line(tmp_path, base, args, fragment):
    new = write_run(tmp_path / "new.csv", BASE_BUSBW)
    assert_one_line_error(run(base, new, *args), fragment)


def test_missing_new_argument_is_one_line(base):
    assert_one_line_error(run(base), "Missing argument")


def test_parse_threshold():
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("0.05") == pytest.approx(0.05)
    assert parse_threshold("12.5%") == pytest.approx(0.125)
    assert parse_threshold("0") == 0
    for bad in ("5", "-1%", "x", "1.0"):
        with pytest.raises(ValueError):
            parse_threshold(bad)


def test_several_new_files_fail_if_any_regresses(tmp_path, base):
    good = write_run(tmp_path / "good.csv", scaled(1.0))
    bad = write_run(tmp_path / "bad.csv", scaled(0.5))
    result = run(base, good, bad)
    assert result.exit_code == 1
    assert result.stdout.count("BASE  base") == 2


def test_json_and_csv_outputs(tmp_path, base):
    new = write_run(tmp_path / "new.csv", scaled(0.9, sizes=(1 << 30,)))
    json_path, csv_path = tmp_path / "cmp.json", tmp_path / "cmp.csv"
    result = run(base, new, "--placement", "out_of_place", "--json", json_path, "--csv", csv_path,
                 "--label", "v1", "--label", "v2")
    assert result.exit_code == 1
    doc = json.loads(json_path.read_text())
    assert doc["passed"] is False and doc["metric"] == "busbw" and doc["threshold"] == pytest.approx(0.05)
    assert doc["base"]["label"] == "v1"
    (comparison,) = doc["comparisons"]
    assert comparison["new"]["label"] == "v2"
    assert comparison["summary"]["matched"] == 3 and comparison["summary"]["regression"] == 1
    worst = next(r for r in comparison["rows"] if r["status"] == "regression")
    assert worst["size_bytes"] == 1 << 30 and worst["ratio"] == pytest.approx(0.9)
    table = pd.read_csv(csv_path)
    assert len(table) == 3 and set(table["placement"]) == {"out_of_place"}
    assert list(table["status"]) == ["ok", "ok", "regression"]
    assert set(table["new_label"]) == {"v2"}


def test_two_nccl_tests_text_fixtures():
    base, new = H200_4 / "all_reduce_np2.txt", H200_2 / "all_reduce_np2.txt"
    result = run(base, new)
    # The 2-GPU machine is ~25% slower from 512B to 512K: real regressions.
    assert result.exit_code == 1
    assert "h200-4gpu-nvswitch/all_reduce_np2" in result.stdout
    assert "h200-2gpu-nvswitch/all_reduce_np2" in result.stdout
    assert "REGRESSION" in result.stdout
    # From 8M up the two agree within 5%.
    assert run(base, new, "--min-size", "8M").exit_code == 0

    comparison = compare_frames(read_results(base), read_results(new))
    assert len(comparison.rows) == 30  # 15 sizes x 2 placements
    top = comparison.rows[(comparison.rows["size_bytes"] == 2147483648) & (comparison.rows["placement"] == "out_of_place")]
    # one rank count: the ratio comes from the printed times (more digits than busbw), the same to 1e-5
    assert top["ratio"].iloc[0] == pytest.approx(337.84 / 333.55, rel=1e-4)


def test_rows_with_base_zero_are_not_comparable():
    frame = read_results(H200_4 / "all_reduce_np2.txt")
    comparison = compare_frames(frame, frame)
    assert comparison.count("not_comparable") == 4  # 8B and 32B print busbw 0.00
    assert comparison.count("ok") == 26
    assert not comparison.failed


def test_different_setups_are_noted():
    result = run(H200_4 / "all_reduce_np4.txt", H200_2 / "all_reduce_np2.txt", "--min-size", "1G")
    assert result.exit_code == 1  # 2G: 359.54 -> 337.84 GB/s is -6%
    assert "note: BASE and NEW differ in ranks: 4 vs 2" in result.stdout


def test_exit_codes_hold_when_run_inside_a_non_standalone_group(tmp_path, base):
    # ncclbench's main() runs its group with standalone_mode=False, where Click would
    # hand an Exit back as a return value: the status must still reach the shell.
    new = write_run(tmp_path / "new.csv", scaled(0.5))
    with pytest.raises(SystemExit) as regression:
        compare_command.main([str(base), str(new)], standalone_mode=False)
    assert regression.value.code == 1
    with pytest.raises(SystemExit) as bad_input:
        compare_command.main([str(base)], standalone_mode=False)
    assert bad_input.value.code == 2


def test_rich_rendering_on_a_terminal(tmp_path, base):
    from io import StringIO

    from rich.console import Console

    new = write_run(tmp_path / "new.csv", scaled(0.5, sizes=(1 << 30,)))
    console = Console(file=StringIO(), width=120, color_system=None)
    print_rich(compare_frames(read_results(base), read_results(new)), console)
    text = console.file.getvalue()
    assert "REGRESSION" in text and "FAIL" in text and "1G" in text


def test_a_base_with_nothing_comparable_is_bad_input(tmp_path):
    """A one-rank run's file (busbw 0, out-of-place N/A) against itself: exit 2, not a PASS
    that compared nothing; the N/A cells read N/A."""
    one = write_run(tmp_path / "one.csv", {1 << 10: 1.0, 1 << 20: 1.0})
    frame = pd.read_csv(one)
    frame["busbw_gbps"] = 0.0  # the factor is 0 on one rank
    frame.loc[frame.placement == "out_of_place", ["time_us", "algbw_gbps", "busbw_gbps", "nwrong"]] = None
    frame.to_csv(one, index=False)
    result = run(one, one)
    assert result.exit_code == 2 and "nothing to compare" in result.output, result.output
    shown = run(one, one, "--metric", "time")
    assert shown.exit_code == 0 and "N/A" in shown.output and "nan" not in shown.output, shown.output
