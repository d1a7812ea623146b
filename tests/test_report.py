"""The nccl-tests text layout: number formatting and row width, checked against the
reference output and against values past the widths of its columns."""

import pytest

from conftest import REFERENCE
from ncclbench.results.report import fixed_width, row_line
from ncclbench.results.records import PlacementResult, ResultRow


def _reference_rows():
    for path in sorted(REFERENCE.glob("*/*.txt")):
        for line in path.read_text().splitlines():
            tokens = line.split()
            if line.startswith("#") or len(tokens) < 9 or not tokens[0].isdigit():
                continue
            yield path.name, line, tokens


def test_every_time_and_bandwidth_in_the_reference_formats_back_to_itself():
    checked = 0
    for name, line, tokens in _reference_rows():
        # the two 4-field blocks (time algbw busbw #wrong) are the last 8 fields
        for block in (tokens[-8:-4], tokens[-4:]):
            for text, width in zip(block[:3], (7, 6, 6)):
                assert fixed_width(float(text), width).strip() == text, (name, line)
                checked += 1
    assert checked > 1000


@pytest.mark.parametrize("value,width,text", [
    (10048.45, 7, "10048.5"),     # a long -I time: one decimal, still 7 wide
    (123456.4, 7, " 123456"),
    (12345678.0, 7, "1.2e+07"),
    (1160.8, 6, "1160.8"),        # busbw past 1000 GB/s keeps the 6-wide column
    (123456.7, 6, "123457"),
    (1234567.0, 6, " 1e+06"),
    (0.05, 6, "  0.05"),
])
def test_values_past_the_column_width_lose_decimals_not_alignment(value, width, text):
    assert fixed_width(value, width) == text


def _row(time_us, algbw, busbw, nwrong):
    cell = PlacementResult(time_us, algbw, busbw, nwrong)
    return ResultRow("all_reduce", 2147483648, 536870912, "float", "sum", -1, cell, cell)


def test_rows_stay_118_characters_whatever_the_values():
    ordinary = row_line(_row(8959.3, 239.69, 359.54, 0))
    assert ordinary == ("  2147483648     536870912     float     sum      -1"
                        "  8959.30  239.69  359.54       0  8959.30  239.69  359.54       0")
    huge = row_line(_row(12345678.0, 1160.8, 2321.6, 3))
    assert len(huge) == len(ordinary) == 118
    assert huge.split()[5:9] == ["1.2e+07", "1160.8", "2321.6", "3"]


def test_wrong_counts_print_as_printf_g_like_nccl_tests():
    """%6g: exact up to 999999, then exponent form (wider than the column, as in nccl-tests)."""
    assert row_line(_row(10.0, 1.0, 1.0, 999999)).split()[8] == "999999"
    assert row_line(_row(10.0, 1.0, 1.0, 1048576)).split()[8] == "1.04858e+06"


def test_unchecked_cells_print_n_a_one_character_narrower_like_nccl_tests():
    """nccl-tests prints '    N/A' (7 characters) where a count would take 8 ('  %6g'):
    the reference's rows with one unchecked block are 117 characters, not 118."""
    line = row_line(_row(10.0, 1.0, 1.0, None))
    assert line.endswith("1.00    N/A") and len(line) == 116
    lengths = {len(line) for _, line, tokens in _reference_rows() if tokens[-1] == "N/A" and tokens[-5] != "N/A"}
    assert lengths == {117}
