"""scripts/bench_reference.py: size-by-size ratio tables of ncclbench results against
nccl-tests reference files (given result files; --run needs GPUs and is not run here)."""

from conftest import REFERENCE, load_script

REF4 = REFERENCE / "h200-4gpu-nvswitch"


def test_ratio_table_against_the_reference(tmp_path, capsys):
    from ncclbench.resultsio import read_results

    bench = load_script("bench_reference")
    ours = read_results(REF4 / "all_gather_np4.txt")
    slow = ours.size_bytes == 1 << 31
    ours.loc[slow & (ours.placement == "out_of_place"), "busbw_gbps"] *= 0.9
    path = tmp_path / "ours.csv"
    ours.to_csv(path, index=False)
    assert bench.main([str(path), "--reference-dir", str(REF4), "--np", "4"]) == 0
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("| all_gather |")]
    assert len(lines) == int(((ours.size_bytes > 0) & (ours.placement == "out_of_place")).sum())
    assert all(ln.endswith("| 1.000 |") for ln in lines if "| 2147483648 |" not in ln)
    assert [ln for ln in lines if "| 2147483648 |" in ln][0].endswith("| 0.900 |")
    assert "- all_gather: lowest ratio over" in out and "- overall lowest ratio: 0.900" in out
