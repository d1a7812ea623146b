"""`ncclbench plot`: images are written headless, at the expected size, with what they should show."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
from click.testing import CliRunner

from ncclbench.results.plot import DPI, build_figure, figure_size_inches
from ncclbench.cli.plot import plot_command
from ncclbench.results.readers import read_many, read_results

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"
H200_4 = FIXTURES / "h200-4gpu-nvswitch"
H200_2 = FIXTURES / "h200-2gpu-nvswitch"


def run(*args):
    return CliRunner().invoke(plot_command, [str(a) for a in args])


def legend_texts(fig) -> list[str]:
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


def test_png_is_written_with_expected_pixel_size(tmp_path):
    out = tmp_path / "busbw.png"
    result = run(H200_4 / "all_reduce_np4.txt", H200_4 / "all_reduce_np2.txt", H200_2 / "all_reduce_np2.txt", "-O", out)
    assert result.exit_code == 0, result.output
    assert "3 series" in result.stdout
    assert out.stat().st_size > 10_000
    image = matplotlib.image.imread(out)
    height, width = image.shape[:2]
    legend = ["all_reduce_np4", "h200-4gpu-nvswitch/all_reduce_np2", "h200-2gpu-nvswitch/all_reduce_np2"]
    expected_width = figure_size_inches(legend)[0] * DPI
    assert height == 500
    assert abs(width - expected_width) <= 1 and width > 1200
    assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_svg_by_extension(tmp_path):
    out = tmp_path / "busbw.svg"
    assert run(H200_4 / "broadcast_np4.txt", "-O", out).exit_code == 0
    assert "<svg" in out.read_text()[:2000]


def test_one_series_per_file_and_placement_with_distinguishing_labels():
    frame = read_many([H200_4 / "all_reduce_np4.txt", H200_4 / "reduce_np4.txt"])
    fig, count = build_figure(frame)
    assert count == 4  # 2 files x 2 placements
    assert legend_texts(fig) == [
        "all_reduce_np4 all_reduce out_of_place", "all_reduce_np4 all_reduce in_place",
        "reduce_np4 reduce root 0 out_of_place", "reduce_np4 reduce root 0 in_place",
    ]
    ax_bw, ax_time = fig.axes
    assert ax_bw.get_xscale() == "log" and ax_time.get_yscale() == "log"
    labels = [t.get_text() for t in ax_bw.get_xticklabels()]
    assert "1K" in labels and "1M" in labels and "1G" in labels


def test_link_peak_is_a_dashed_line(tmp_path):
    frame = read_results(H200_4 / "all_reduce_np4.txt").assign(link_peak_gbps=478.1)
    fig, _ = build_figure(frame[frame["placement"] == "out_of_place"])
    assert "link peak 478.1 GB/s" in legend_texts(fig)
    peak_lines = [line for line in fig.axes[0].get_lines() if line.get_linestyle() == "--"]
    assert len(peak_lines) == 1 and peak_lines[0].get_ydata()[0] == pytest.approx(478.1)


def test_size_zero_rows_are_left_out():
    frame = read_results(H200_4 / "gather_np4.txt")
    fig, count = build_figure(frame[frame["placement"] == "out_of_place"])
    (line,) = [l for l in fig.axes[0].get_lines()]
    assert min(line.get_xdata()) == 128 and count == 1


def test_many_series_widen_the_figure_instead_of_cutting_the_legend(tmp_path):
    out = tmp_path / "all.png"
    assert run(H200_2 / "all_reduce_np2_dall_oall.txt", "-O", out).exit_code == 0  # 72 series
    height, width = matplotlib.image.imread(out).shape[:2]
    one_column = figure_size_inches(["all_reduce_np2_dall_oall bfloat16 mulsum"])[0] * DPI
    assert height == 500
    assert width > one_column + 500  # 72 entries need several legend columns


@pytest.mark.parametrize("args, fragment", [
    (["-O", "plot.bmp"], "plot.bmp"),
    (["-O", "plot.png", "--min-size", "8G"], "no rows left"),
    (["-O", "plot.png", "--label", "a", "--label", "b"], "--label"),
    ([], "Missing option"),
])
def test_bad_input_is_one_line(tmp_path, args, fragment):
    args = [str(tmp_path / a) if a.startswith("plot.") else a for a in args]
    result = run(H200_4 / "all_reduce_np4.txt", *args)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ncclbench: error: ")
    assert fragment in lines[0]


def test_unreadable_input_is_one_line(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello\n")
    result = run(bogus, "-O", tmp_path / "x.png")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "not a recognised results file" in result.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_file_whose_cells_are_all_na_is_one_clear_error(tmp_path):
    """One rank on torch's backends: out-of-place is N/A everywhere. plot says so and how to
    plot the in-place column, instead of matplotlib's log-scale error."""
    frame = pd.DataFrame([{"collective": "all_reduce", "placement": p, "size_bytes": s, "count": s // 4,
                           "dtype": "float", "op": "sum", "root": -1, "time_us": None if p == "out_of_place" else 20.0,
                           "algbw_gbps": None if p == "out_of_place" else s / 20e3, "busbw_gbps": None if p == "out_of_place" else 0.0,
                           "nwrong": None if p == "out_of_place" else 0, "ranks": 1, "backend": "nccl"}
                          for s in (1024, 4096) for p in ("out_of_place", "in_place")])
    path = tmp_path / "one.csv"
    frame.to_csv(path, index=False)
    bad = CliRunner().invoke(plot_command, [str(path), "-O", str(tmp_path / "p.png")])
    assert bad.exit_code == 2 and "every cell left to plot is N/A" in bad.output, bad.output
    good = CliRunner().invoke(plot_command, [str(path), "-O", str(tmp_path / "p.png"), "--placement", "in_place"])
    assert good.exit_code == 0 and (tmp_path / "p.png").stat().st_size > 0, good.output
