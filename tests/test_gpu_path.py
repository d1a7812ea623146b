"""The path NCCL took, read from its own log on real GPUs (run on a GPU host: `pytest -m gpu`):
P2P named on one host, SHM named and flagged when P2P is disabled, the user's own log
settings kept, and saved logs explained again without a GPU."""

import json
import os

import pytest

from conftest import run_cli

pytestmark = pytest.mark.gpu

SWEEP = ["-b", "64M", "-e", "256M", "-f", "4", "-n", "5", "-w", "2", "--no-save"]


def _gpus():
    import torch

    return torch.cuda.device_count()


def _run(tmp_path, backend, env=None, name="r"):
    n = min(_gpus(), 4)
    if n < 2:
        pytest.skip("needs 2 GPUs")
    out = tmp_path / f"{name}.json"
    r = run_cli(["all_reduce", "-g", str(n), "--backend", backend, *SWEEP, "-J", str(out)], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, json.loads(out.read_text())["ncclbench"], out


def _path_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("# NCCL path")]


@pytest.mark.parametrize("backend", ["nccl", "cupy"])
def test_one_host_names_p2p(backend, tmp_path):
    r, nb, _ = _run(tmp_path, backend)
    (line,) = _path_lines(r.stdout)
    assert line.startswith("# NCCL path: P2P/"), r.stdout[:3000]
    assert nb["nccl_path"]["label"].startswith("P2P/") and not nb["nccl_path"]["unread"]
    env_line = next(l for l in r.stdout.splitlines() if l.startswith("# NCCL environment"))
    assert "NCCL_DEBUG" not in env_line  # ncclbench's own switch is not the user's environment
    best = next(l for l in r.stdout.splitlines() if l.startswith("# Best busbw"))
    assert "% of NVLink peak" in best or "peak is unknown" in best


def test_p2p_disabled_names_shm_as_the_cause_of_the_lower_number(tmp_path):
    r1, nb1, p2p = _run(tmp_path, "nccl", name="p2p")
    r2, nb2, shm = _run(tmp_path, "nccl", env={"NCCL_P2P_DISABLE": "1"}, name="shm")
    (line,) = _path_lines(r2.stdout)
    assert line.startswith("# NCCL path: SHM"), r2.stdout[:3000]
    best = next(l for l in r2.stdout.splitlines() if l.startswith("# Best busbw"))
    assert "% of NVLink" not in best and "SHM" in best
    assert nb2["peak_bus_bandwidth"] < nb1["peak_bus_bandwidth"]
    c = run_cli(["compare", str(p2p), str(shm)])
    assert c.returncode == 1 and "NCCL path changed: baseline P2P/" in c.stdout and "now SHM" in c.stdout, c.stdout
    assert "likely cause" in c.stdout
    e = run_cli(["explain", "-g", str(min(_gpus(), 4))], env={"NCCL_P2P_DISABLE": "1"})
    assert e.returncode == 0, e.stderr[-2000:]
    assert "SHM where P2P was expected: NCCL_P2P_DISABLE=1" in e.stdout, e.stdout


def test_the_users_own_log_stays_theirs_and_explains_again_without_a_gpu(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,P2P,SHM,NET,GRAPH",
           "NCCL_DEBUG_FILE": str(logs / "nccl.%h.%p.log"), "NCCL_P2P_DISABLE": "1"}
    r, nb, _ = _run(tmp_path, "nccl", env=env)
    files = sorted(logs.iterdir())
    assert len(files) == min(_gpus(), 4)  # one per rank, kept where the user asked
    assert nb["nccl_path"]["label"] == "SHM" and "NCCL_DEBUG=INFO" in r.stdout
    e = run_cli(["explain", str(logs)], env={"CUDA_VISIBLE_DEVICES": ""})
    assert e.returncode == 0 and "SHM" in e.stdout and "NCCL_P2P_DISABLE=1" in e.stdout, e.stdout
    assert "# Missing" not in e.stdout and "separate jobs" not in e.stdout and "No INIT line" not in e.stdout, e.stdout
    if len(files) > 1:  # one rank's file: the others are named missing
        one = run_cli(["explain", str(files[0])], env={"CUDA_VISIBLE_DEVICES": ""})
        assert one.returncode == 0 and "# Missing: the logs of rank(s)" in one.stdout, one.stdout


def test_info_without_a_file_says_plainly_the_path_cannot_be_read(tmp_path):
    r, nb, _ = _run(tmp_path, "nccl", env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": None})
    (line,) = _path_lines(r.stdout)
    assert "unknown" in line and "NCCL_DEBUG_FILE" in line, line
    assert nb["nccl_path"]["unread"]


def test_two_simulated_hosts_name_sockets_and_gdr_0(tmp_path):
    """2 hosts x 2 GPUs in network namespaces, NCCL over TCP between them (tests/netsim.py)."""
    import netsim

    from conftest import cli_command

    if min(_gpus(), 4) < 4:
        pytest.skip("needs 4 GPUs")
    if netsim.why_not():
        pytest.skip(netsim.why_not())
    out = tmp_path / "r.json"
    argv = cli_command() + ["all_reduce", "-b", "64M", "-e", "64M", "-n", "5", "--no-save", "-J", str(out)]
    with netsim.SimFleet(2) as fleet:
        procs = [fleet.start(i, argv, 2, port=29561,
                             env=dict(os.environ, CUDA_VISIBLE_DEVICES=f"{2 * i},{2 * i + 1}", NCCL_HOSTID=f"sim{i}",
                                      NCCL_SOCKET_IFNAME="eth0", NCCL_IB_DISABLE="1", NCCL_NVLS_ENABLE="0"))
                 for i in range(2)]
        stdout, stderr = procs[0].communicate(timeout=240)
        procs[1].wait(timeout=60)
    assert procs[0].returncode == 0, stderr[-3000:]
    (line,) = _path_lines(stdout)
    assert line.startswith("# NCCL path: NET/Socket") and "over eth0" in line, stdout[:3000]
    assert "network Socket, GDR 0" in stdout, "\n".join(l for l in stdout.splitlines() if l.startswith("#"))[:4000]
    nb = json.loads(out.read_text())["ncclbench"]
    assert nb["nccl_path"]["label"].startswith("NET/Socket") and nb["nccl_path"]["gdr"] == 0
