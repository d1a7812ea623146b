"""`ncclbench tune` on real NCCL (run on a GPU host: `pytest -m gpu tests/test_gpu_tune.py`).

With NCCLBENCH_TUNER_PLUGIN set to NCCL's example tuner plugin built there
(docs/tuning.md), --verify runs too."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.gpu


def _gpus():
    import torch

    return torch.cuda.device_count()


def test_route_fresh_communicators_read_the_setting_again(tmp_path):
    """One process, a communicator per setting: NCCL's init reads NCCL_ALGO/NCCL_PROTO and
    the channel limit each time (and with 2 GPUs each call's TUNING line shows it)."""
    env = dict(os.environ, TUNE_PROBE_LOGDIR=str(tmp_path), NCCL_NVLS_ENABLE="0")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NCCL_ALGO", "NCCL_PROTO"):
        env.pop(name, None)
    if _gpus() >= 2:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "benchmarks" / "tune_route_probe.py")]
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "tune_route_probe.py")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    if _gpus() >= 2:  # one rank runs no tuning model: NCCL reads no algorithm setting there
        assert any(line.startswith("tree/ll ") and "NCCL read NCCL_ALGO=Tree NCCL_PROTO=LL" in line
                   for line in lines), r.stdout
    assert any(line.startswith("ring/simple ch4") and "4 channel(s)" in line for line in lines), r.stdout
    assert any(line.startswith("default") and "no NCCL_ALGO/NCCL_PROTO" in line for line in lines), r.stdout


def test_one_gpu_measures_the_default_and_says_there_is_nothing_to_tune(tmp_path):
    out = tmp_path / "tuned"
    r = run_cli(["tune", "allreduce", "-g", "1", "-b", "1K", "-e", "1M", "-f", "8", "--repeat", "2", "-o", str(out)],
                timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "chooses no algorithm or protocol" in r.stdout
    doc = json.loads((out / "tune.json").read_text())
    assert doc["nccl"].startswith("NCCL 2.")
    assert doc["collectives"]["all_reduce"]["combinations"]["default"]["status"] == "ok"
    assert "NCCL read no NCCL_ALGO/NCCL_PROTO" in r.stdout  # the probe's log was read and attributed
    assert list((out / "probe").glob("nccl.*.log")) and (out / "busbw_all_reduce.png").exists()
    assert [line for line in (out / "nccl_tuner.conf").read_text().splitlines() if not line.startswith("#")] == []


def test_two_gpus_sweep_every_combination(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / "tuned"
    r = run_cli(["tune", "allreduce", "-g", "2", "-b", "1K", "-e", "16M", "-f", "4", "--repeat", "2",
                 "--channels", "4", "-o", str(out)], env={"NCCL_NVLS_ENABLE": "0"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "tune.json").read_text())["collectives"]["all_reduce"]
    assert doc["nccl_choice"], "no TUNING line attributed to the default"
    assert all(v["nccl_choice"] for v in doc["verdicts"])
    assert "NOT what was set" not in r.stdout
    assert doc["combinations"]["ring/simple ch4"]["status"] == "ok"


def test_verify_with_nccls_example_plugin(tmp_path):
    plugin = os.environ.get("NCCLBENCH_TUNER_PLUGIN")
    if not plugin:
        pytest.skip("set NCCLBENCH_TUNER_PLUGIN to NCCL's example tuner plugin (docs/tuning.md)")
    n = min(_gpus(), 2)
    conf = tmp_path / "tuned.conf"
    conf.write_text(f"allreduce,0,70000,ring,simple,2,1,{n},1,0\n")
    r = run_cli(["tune", "allreduce", "-g", str(n), "-b", "1K", "-e", "1M", "-f", "8", "--repeat", "2",
                 "--verify", str(conf), "--plugin", plugin, "-o", str(tmp_path / "v")],
                env={"NCCL_NVLS_ENABLE": "0"}, timeout=600)
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: a row's gain did not come back (it was not a win)
    assert "TUNER/ExamplePlugin: Loaded 1 tuning configurations" in r.stdout, r.stdout
    doc = json.loads((tmp_path / "v" / "verify.json").read_text())
    sizes = doc["collectives"]["all_reduce"]["sizes"]
    if n > 1:
        inside = [s for s in sizes if s["row_line"] == 1]
        assert inside and all(s["applied"] for s in inside), sizes
    else:
        assert r.returncode == 0 and "not judged" in r.stdout
