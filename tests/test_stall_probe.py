"""scripts/torch_stall_probe.py: its stall analysis and its argument checks (the probe itself
needs NCCL GPUs; its results are in docs/BENCHMARKS.md)."""

import subprocess
import sys

import pytest

from conftest import ROOT, load_script

SCRIPT = ROOT / "scripts" / "torch_stall_probe.py"


def test_stalls_whose_length_follows_the_calls_since_the_last_one():
    """Synthetic calls of 30 us; every 1000 calls a stall of 7 us per call issued since the
    previous stall (what a per-call list walked at a fixed period would give)."""
    probe = load_script("torch_stall_probe")
    durations, last = [], 0
    for i in range(5000):
        if i and i % 1000 == 0:
            durations.append(30.0 + 7.0 * (i - last))
            last = i
        else:
            durations.append(30.0)
    s = probe.summarize(durations, pad_us=0.0, threshold_us=1000.0)
    assert s["calls"] == 5000 and s["p50_us"] == 30.0
    assert s["stalls"] == 4 and s["stall_ms"] == pytest.approx(7.03)
    assert s["calls_between"] == 1000
    assert s["us_per_call_since"] == pytest.approx(7.0)
    assert s["ms_between"] == pytest.approx((999 * 30.0 + 7030.0) / 1e3)
    assert s["stalled_pct"] == pytest.approx(100 * 4 * 7000.0 / sum(durations))


def test_a_pad_raises_the_stall_threshold():
    probe = load_script("torch_stall_probe")
    durations = [100.0] * 300 + [1050.0] + [100.0] * 300
    assert probe.summarize(durations, pad_us=0.0, threshold_us=1000.0)["stalls"] == 1
    assert probe.summarize(durations, pad_us=90.0, threshold_us=1000.0)["stalls"] == 0
    assert probe.summarize([30.0] * 10, 0.0, 1000.0)["us_per_call_since"] == 0.0


@pytest.mark.parametrize("args, needle", [
    (["--pads", "0,x"], "--pads"),
    (["--pads", "-5"], "must be >= 0"),
    (["--seconds", "0"], "--seconds"),
    ([], "run it with torchrun"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(args, needle):
    env = {"PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(("torch_stall_probe.py: error:",))
