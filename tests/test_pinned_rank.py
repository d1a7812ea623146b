"""scripts/pinned_rank.py: which CPUs each local rank gets, and a real run under torchrun
(gloo) where each rank is pinned to one CPU of its own."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT, load_script

SCRIPT = ROOT / "scripts" / "pinned_rank.py"


def test_ranks_get_disjoint_cpus_after_the_first_two():
    pin = load_script("pinned_rank")
    allowed = [5, 1, 0, 3, 2, 4, 7, 6, 9, 8]  # order as a set may give it
    assert pin.pinned_cpus(allowed, 0, 4) == [2, 3, 4, 5]
    assert pin.pinned_cpus(allowed, 1, 4) == [6, 7, 8, 9]
    assert pin.pinned_cpus(allowed, 3, 1) == [5]


def test_too_few_cpus_or_a_bad_count_is_refused():
    pin = load_script("pinned_rank")
    with pytest.raises(ValueError, match="local rank 2 needs CPUs 10..13"):
        pin.pinned_cpus(list(range(12)), 2, 4)
    with pytest.raises(ValueError, match="positive"):
        pin.pinned_cpus(list(range(12)), 0, 0)


def test_torchrun_run_with_pinned_ranks(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 CPUs, one per rank")
    env = dict(os.environ, PIN="1", PIN_SKIP="0", NCCLBENCH_RESULTS_DIR=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(SCRIPT), "allreduce", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "--no-save"],
        capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"local rank 0 PIN=1 cpus [{cpus[0]}]" in proc.stderr
    assert f"local rank 1 PIN=1 cpus [{cpus[1]}]" in proc.stderr
    assert "# Out of bounds values : 0 OK" in proc.stdout


def test_bad_pin_is_one_error_line_and_exit_2():
    env = dict(os.environ, PIN="0", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, str(SCRIPT), "allreduce"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "pinned_rank.py: error: PIN must be a positive number of CPUs, not 0"
