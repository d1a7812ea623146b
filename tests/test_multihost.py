"""Several hosts on one machine (tests/netsim.py): the rig itself, a job across hosts under
each launcher a user has (ncclbench's own -g/--nnodes, torchrun, srun's and mpirun's
variables), and, on a GPU machine, NCCL really crossing a network between hosts: its NET
transport between hosts and P2P within one, a capped NIC, preflight and fleet across hosts."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cli_command, load_script, table_rows
from ncclbench.engine import ras
from ncclbench.topology.pci import parse_index_ranges

sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402

REASON = netsim.why_not()
rig = pytest.mark.skipif(REASON is not None, reason=REASON or "")


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def _finish(procs, timeout=240, lost=None):
    """(exit codes, (stdout, stderr) of each): the processes waited for in turn, up to
    `timeout` s each; host `lost` (killed or stopped) last, for a few seconds only (a stopped
    host never ends: the fixture kills what is left)."""
    outs: list = [None] * len(procs)
    for i in [k for k in range(len(procs)) if k != lost] + ([lost] if lost is not None else []):
        try:
            outs[i] = procs[i].communicate(timeout=5 if i == lost else timeout)
        except Exception:  # noqa: BLE001 - the fixture kills what is left
            outs[i] = ("", "no end in time")
    return [p.returncode for p in procs], outs


# ---- the rig ---------------------------------------------------------------------------------
SERVER = ("import socket,sys;s=socket.socket();s.bind(('0.0.0.0',int(sys.argv[1])));s.listen();c,_=s.accept();n=0\n"
          "while True:\n d=c.recv(1<<20)\n if not d: break\n n+=len(d)\nprint(n)")
CLIENT = ("import socket,sys,time;s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5);"
          "b=b'x'*(1<<20);t=time.time();[s.sendall(b) for _ in range(int(sys.argv[3]))];s.close();"
          "print(int(sys.argv[3])*(1<<20)/(time.time()-t))")


def _throughput(fleet, src, dst, port, megabytes):
    server = fleet.run_in(dst, [sys.executable, "-c", SERVER, str(port)])
    time.sleep(0.5)
    client = fleet.run_in(src, [sys.executable, "-c", CLIENT, fleet.addrs[dst], str(port), str(megabytes)])
    out, err = client.communicate(timeout=60)
    server.communicate(timeout=30)
    assert client.returncode == 0, err
    return float(out)


@rig
def test_each_host_has_its_name_its_interface_and_its_address():
    with netsim.SimFleet(2) as fleet:
        proc = fleet.run_in(1, [sys.executable, "-c", "import os,socket;print(socket.gethostname());"
                                                      "print(sorted(os.listdir('/sys/class/net')))"])
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    name, interfaces = out.splitlines()
    assert name == "simnode1" and name != socket.gethostname()
    assert "eth0" in interfaces and "nbbr" not in interfaces


def test_hosts_get_cpus_of_their_own_when_asked():
    """split_cpus: disjoint even blocks of the usable CPUs (no GPU here: no NVML word on
    where they sit), all of them used while they divide evenly; refused with fewer CPUs than hosts."""
    usable = sorted(os.sched_getaffinity(0))
    parts = netsim.split_cpus(len(usable))
    assert [sorted(p) for p in parts] == [[c] for c in usable]
    assert netsim.split_cpus(1) == [set(usable)]
    with pytest.raises(ValueError, match="needs one of its own"):
        netsim.split_cpus(len(usable) + 1)
    assert parse_index_ranges("0-2, 5,7-8") == [0, 1, 2, 5, 7, 8]  # what --cpus LIST reads
    with pytest.raises(ValueError, match="cpus names 1"):
        netsim.SimFleet(2, cpus=[{0}])


@rig
def test_a_hosts_processes_run_on_its_cpus_only():
    usable = sorted(os.sched_getaffinity(0))
    cpus = [{usable[0]}, set(usable[1:]) or {usable[0]}]
    with netsim.SimFleet(2, cpus=cpus) as fleet:
        outs = []
        for i in range(2):
            proc = fleet.run_in(i, [sys.executable, "-c", "import os;print(sorted(os.sched_getaffinity(0)))"])
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
            outs.append(out.strip())
    assert outs == [str(sorted(c)) for c in cpus]


FAKE_MPS = """#!/bin/sh
echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY cvd=${CUDA_VISIBLE_DEVICES-unset} stdin=$(test -t 0 || head -c 20)" >> "$FAKE_MPS_LOG"
"""


@rig
def test_hosts_sharing_a_gpu_run_under_an_mps_daemon_of_their_own(tmp_path, monkeypatch):
    """SimFleet(mps=True) starts `nvidia-cuda-mps-control -d` with pipe and log folders of its
    own (seeing every GPU), every process of every host gets them, and close() quits the
    daemon and removes them. (MPS itself needs a GPU: a stand-in records how it was called.)"""
    fake = tmp_path / "bin" / netsim.MPS_CONTROL
    fake.parent.mkdir()
    fake.write_text(FAKE_MPS)
    fake.chmod(0o755)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert netsim.shared_gpus(["0", "0"]) == ["0"] and netsim.shared_gpus(["0,1", "2,3"]) == []
    assert netsim.shared_gpus(["0,1", "1,2", "3"]) == ["1"]
    with netsim.SimFleet(2, gpus=["0", "0"], mps=True) as fleet:
        pipe = fleet.env_for(1)["CUDA_MPS_PIPE_DIRECTORY"]
        proc = fleet.run_in(1, [sys.executable, "-c", "import os;print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"])
        assert proc.communicate(timeout=30)[0].strip() == pipe and os.path.isdir(pipe)
    calls = log.read_text().splitlines()
    assert calls == [f"-d pipe={pipe} cvd=unset stdin=", f" pipe={pipe} cvd=3 stdin=quit"], calls
    assert not os.path.exists(pipe)


@rig
def test_an_mps_daemon_that_will_not_start_leaves_nothing_behind(tmp_path, monkeypatch):
    """`-d` failing: one error, `quit` sent all the same (a daemon may have started), the
    MPS folders and the namespaces removed."""
    fake = tmp_path / "bin" / netsim.MPS_CONTROL
    fake.parent.mkdir()
    fake.write_text(FAKE_MPS + 'test "$1" = "-d" && { echo "cannot start" >&2; exit 1; }\nexit 0\n')
    fake.chmod(0o755)
    log = tmp_path / "mps.log"
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    fleet = netsim.SimFleet(2, gpus=["0", "0"], mps=True)
    with pytest.raises(netsim.RigError, match="-d ended 1: cannot start"):
        fleet.__enter__()
    calls = log.read_text().splitlines()
    assert [c.split(" pipe=")[0] for c in calls] == ["-d", ""] and calls[1].endswith("stdin=quit")
    pipe = calls[0].split(" pipe=")[1].split(" ")[0]
    assert not os.path.exists(pipe) and fleet._made_spaces == [] and not fleet._made_bridge


@rig
def test_a_capped_nic_and_a_capped_link_slow_only_their_traffic():
    with netsim.SimFleet(3) as fleet:
        free = _throughput(fleet, 1, 0, 5100, 100)
        fleet.slow_link(1, 2, "80mbit")
        capped_link = _throughput(fleet, 1, 2, 5101, 8)
        other = _throughput(fleet, 1, 0, 5102, 100)
        fleet.slow_nic(0, "80mbit")
        capped_nic = _throughput(fleet, 0, 1, 5103, 8)
    limit = 80e6 / 8 * 2  # the cap, with room for what sits in socket buffers
    assert capped_link < limit and capped_nic < limit, (capped_link, capped_nic)
    assert free > 3 * limit and other > 0.5 * free, (free, other)  # the link's cap is the link's alone


@rig
def test_a_hosts_nic_cap_is_read_from_the_kernel_on_that_host_only():
    """The rate a capped NIC's tbf qdisc sets, read over rtnetlink inside each host's own
    network namespace (ncclbench.topology.shaping): 2 Gbit/s on host 1, none on host 0."""
    code = "from ncclbench.topology.shaping import egress_rate_gbps as r; print(r('eth0'))"
    with netsim.SimFleet(2) as fleet:
        fleet.slow_nic(1, "2gbit")
        outs = [fleet.run_in(i, [sys.executable, "-c", code]).communicate(timeout=60) for i in (0, 1)]
    assert [out.strip() for out, _err in outs] == ["None", "0.25"], outs


@rig
def test_a_frozen_host_stops_and_a_downed_link_cuts_it_off():
    with netsim.SimFleet(2) as fleet:
        sleeper = fleet.run_in(1, ["sleep", "60"])
        time.sleep(0.3)
        assert sleeper.pid in fleet.freeze(1)
        time.sleep(0.2)
        assert Path(f"/proc/{sleeper.pid}/stat").read_text().split()[2] == "T"
        fleet.thaw(1)
        fleet.link_down(1)
        probe = fleet.run_in(1, [sys.executable, "-c", CLIENT, fleet.addrs[0], "5200", "1"])
        probe.communicate(timeout=30)
        assert probe.returncode != 0
        tag = fleet.tag
    left = [p for p in Path("/proc").iterdir() if p.name == str(sleeper.pid)]
    assert not left or Path(f"/proc/{sleeper.pid}/stat").read_text().split()[2] == "Z"
    assert not [ns for ns in os.listdir(netsim.NETNS_DIR) if tag in ns]
    assert not [i for i in os.listdir("/sys/class/net") if tag in i]


@rig
@pytest.mark.slow
@pytest.mark.parametrize("how", ["spawn", "torchrun", "slurm", "mpi"])
def test_gloo_job_across_hosts_under_each_launcher(how):
    args = ["allreduce", "--backend", "gloo", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-T", "60"]
    with netsim.SimFleet(2) as fleet:
        procs = fleet.launch(how, args, 2, port=29610, ncclbench=cli_command())
        codes, outs = _finish(procs)
    assert codes == [0] * len(procs), outs[0][1][-2000:]
    stdout = outs[0][0]
    assert "4 ranks on 2 nodes (simnode0, simnode1)" in stdout
    rows = table_rows(stdout)
    assert len(rows) == 3 and all(r[8] == "0" and r[12] == "0" for r in rows)


# ---- NCCL across hosts (GPU) ---------------------------------------------------------------
def _layout(hosts: int, per: int | None = None) -> list[str] | None:
    """Each host's CUDA_VISIBLE_DEVICES: `per` GPUs each (default: this machine's GPUs split
    evenly, at least one each), GPUs of their own where the machine has hosts x per of them;
    on a smaller machine of 2 or more GPUs the GPUs are dealt out in turn, so that two
    simulated hosts may drive one GPU (NCCL tells them apart by NCCL_HOSTID and crosses
    between them over its network all the same; two ranks of one host never share one), and
    on a one-GPU machine 2 hosts are one rank each on that GPU (no more: 4 would time-slice
    it 4 ways). None where there are too few GPUs for that."""
    n = _gpu_count()
    per = per or max(1, n // hosts)
    if n < 1 or n < per or (n == 1 and hosts > 2):
        return None
    return [",".join(str((h * per + k) % n) for k in range(per)) for h in range(hosts)]


@pytest.mark.parametrize("gpus,hosts,per,expected", [
    (1, 2, None, ["0", "0"]), (1, 4, None, None), (1, 2, 2, None), (0, 2, None, None),
    (2, 4, 1, ["0", "1", "0", "1"]), (2, 2, 2, ["0,1", "0,1"]), (4, 2, None, ["0,1", "2,3"])])
def test_hosts_are_dealt_the_machines_gpus(monkeypatch, gpus, hosts, per, expected):
    monkeypatch.setattr(sys.modules[__name__], "_gpu_count", lambda: gpus)
    assert _layout(hosts, per) == expected


def _nccl_log_env(folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    return dict(os.environ, NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,P2P,SHM,NET",
                NCCL_DEBUG_FILE=str(folder / "nccl.%h.%p.log"), NCCL_NVLS_ENABLE="0")


def _busbw(stdout: str) -> dict[int, float]:
    return {int(r[0]): float(r[7]) for r in table_rows(stdout)}


needs_gpu = pytest.mark.skipif(_layout(2) is None, reason="needs a GPU")
four_hosts = pytest.mark.skipif(_layout(4, 1) is None, reason="4 hosts need 2 GPUs or more")


def _layout_or_skip(hosts: int) -> list[str]:
    gpus = _layout(hosts)
    if gpus is None:
        pytest.skip(f"{hosts} hosts need 2 GPUs or more")
    return gpus


@rig
@pytest.mark.slow
def test_the_maintainers_command_runs_commands_in_turn_and_sums_them_up(tmp_path, capsys):
    """benchmarks/multihost.py: preflight then a sweep on the same 2 simulated hosts (gloo),
    one JSON line each with the exit code and, for preflight, its --json file's verdict."""
    multihost = load_script("multihost")
    report = tmp_path / "pre.json"
    code = multihost.main(["--hosts", "2", "--summary", "--logs", str(tmp_path / "logs"),
                           "--then", "allreduce --backend gloo -b 8 -e 64 --no-save",
                           "--", "preflight", "--backend", "gloo", "--budget", "2", "--json", str(report)])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert code == 0 and [line["exit"] for line in lines] == [0, 0], lines
    assert lines[0]["drain"] == [] and lines[0]["total_cost_s"] > 0 and "cost_s" not in lines[1]
    assert sorted(p.name for p in (tmp_path / "logs").iterdir())[:2] == ["cmd0.host0.0.err", "cmd0.host0.0.out"]


@pytest.mark.gpu
@rig
@needs_gpu
@pytest.mark.parametrize("how", ["spawn", "torchrun", "slurm", "mpi"])
def test_nccl_crosses_hosts_over_its_net_transport(how, tmp_path):
    gpus = _layout(2, 2) or _layout(2)
    per = len(gpus[0].split(","))
    args = ["allgather" if how != "spawn" else "allreduce", "-b", "1M", "-e", "16M", "-f", "4", "-T", "120"]
    with netsim.SimFleet(2, gpus=gpus) as fleet:
        procs = fleet.launch(how, args, per, port=29620, env=_nccl_log_env(tmp_path / "nccl"),
                             ncclbench=cli_command())
        codes, outs = _finish(procs)
    assert codes == [0] * len(procs), outs[0][1][-2000:]
    assert f"{2 * per} ranks on 2 nodes (simnode0, simnode1)" in outs[0][0]
    rows = table_rows(outs[0][0])
    assert rows and all(r[8] in ("0", "N/A") and r[12] == "0" for r in rows)
    log = "".join(p.read_text() for p in (tmp_path / "nccl").iterdir())
    assert re.search(r"via NET/Socket/\d", log), "NCCL did not cross hosts over its network transport"
    assert "Using network Socket" in log
    if per > 1:
        assert re.search(r"via (P2P|SHM)/", log), "ranks of one host did not talk directly"


@pytest.mark.gpu
@rig
@needs_gpu
def test_a_capped_nic_lowers_busbw_across_hosts():
    gpus = _layout(2)
    per = len(gpus[0].split(","))
    args = ["allreduce", "-b", "16M", "-e", "64M", "-f", "4", "-n", "5", "-T", "120"]
    measured = []
    for cap in (None, "2gbit"):
        with netsim.SimFleet(2, gpus=gpus) as fleet:
            if cap:
                fleet.slow_nic(1, cap)
            codes, outs = _finish(fleet.launch("spawn", args, per, port=29630, ncclbench=cli_command()))
        assert codes == [0, 0], outs[0][1][-2000:]
        measured.append(_busbw(outs[0][0])[64 << 20])
        if cap:  # the capped NIC is the path's bound, and the trailer says so
            best = [line for line in outs[0][0].splitlines() if line.startswith("# Best busbw")]
            assert best and "the NIC rate 0.25 GB/s (eth0 on simnode1; a tbf qdisc caps" in best[0], best
    healthy, capped = measured
    assert capped < 0.5 * healthy, measured
    assert capped < 2e9 / 8 / 1e9 * 1.5  # a ring through a 2 Gbit/s NIC moves no more than it sends


def _preflight(fleet, per, tmp_path, extra=()):
    out = tmp_path / "preflight.json"
    start = time.monotonic()
    procs = fleet.launch("torchrun", ["preflight", "--json", str(out), *extra], per, port=29640,
                         env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    codes, outs = _finish(procs, timeout=300)
    return codes, outs, json.loads(out.read_text()) if out.exists() else {}, time.monotonic() - start


@pytest.mark.gpu
@rig
@needs_gpu
@pytest.mark.parametrize("hosts", [2, 4])
def test_preflight_across_hosts_names_the_host_with_a_slow_nic_within_its_budget(hosts, tmp_path):
    gpus = _layout_or_skip(hosts)
    per = len(gpus[0].split(","))
    with netsim.SimFleet(hosts, gpus=gpus) as fleet:
        codes, outs, _report, healthy_s = _preflight(fleet, per, tmp_path)
    assert codes == [0] * hosts, outs[0][0][-3000:] + outs[0][1][-2000:]
    with netsim.SimFleet(hosts, gpus=gpus) as fleet:
        fleet.slow_nic(hosts - 1, "2gbit")
        codes, outs, report, slow_s = _preflight(fleet, per, tmp_path)
    text = outs[0][0] + outs[0][1]
    assert codes[0] == 1, text[-3000:]
    drained = [h["host"] for h in report["hosts"] if h["verdict"] == "drain"]
    assert drained == [f"simnode{hosts - 1}"], text[-3000:]
    # the budget (10 s) holds: at most twice it, plus the start-up of a healthy run's launch
    assert slow_s < healthy_s + 2 * 10, (healthy_s, slow_s)


def _fleet(fleet, tmp_path, extra=(), freeze=None, kill=None):
    out = tmp_path / "fleet.json"
    procs = [fleet.start(i, cli_command() + ["fleet", "-b", "64M", "-T", "30", "--json", str(out), *extra], 1,
                         port=29650, env=dict(os.environ, NCCL_NVLS_ENABLE="0")) for i in range(fleet.n)]
    if freeze is not None or kill is not None:
        for line in procs[0].stderr:
            if "round 2 of" in line:
                (fleet.freeze if freeze is not None else fleet.kill_node)(freeze if freeze is not None else kill)
                break
    codes, outs = _finish(procs, timeout=150, lost=freeze if freeze is not None else kill)
    return codes[0], outs[0], json.loads(out.read_text()) if out.exists() else None


@pytest.mark.gpu
@rig
@four_hosts
@pytest.mark.parametrize("fault", ["none", "nic", "link", "kill", "freeze"])
def test_fleet_across_four_gpu_hosts(fault, tmp_path):
    with netsim.SimFleet(4, gpus=_layout(4, 1)) as fleet:
        if fault == "nic":
            fleet.slow_nic(2, "2gbit")
        if fault == "link":
            fleet.slow_link(1, 3, "2gbit")
        code, (stdout, stderr), report = _fleet(fleet, tmp_path, kill=3 if fault == "kill" else None,
                                               freeze=3 if fault == "freeze" else None)
    assert report is not None, stderr[-3000:]
    drained = [d["host"] for d in report["drain"]]
    links = [link["hosts"] for link in report["links"]]
    expected = {"none": ([], []), "nic": (["simnode2"], []), "link": ([], [["simnode1", "simnode3"]]),
                "kill": (["simnode3"], []), "freeze": (["simnode3"], [])}[fault]
    tests = "\n".join(f"{t['host_a']}-{t['host_b']} round {t['round']}: {t['busbw_gbps']} GB/s at {t['bytes']} B, "
                      f"{t['below_reference_pct']}% below {t['reference_gbps']}" for t in report["tests"])
    assert (drained, links) == expected, stdout[-3000:] + "\n" + tests
    assert code == (0 if fault == "none" else 1)
    if fault in ("none", "nic", "link"):  # NCCL's log named NET/Socket for the pairs: the socket band
        assert report["plan"]["band_used"] == 0.5, report["plan"]


@pytest.mark.gpu
@rig
@needs_gpu
@pytest.mark.parametrize("hosts", [2, 4])
def test_a_frozen_host_is_named_alone_across_hosts(hosts, tmp_path):
    """Every process of the last host stopped mid-sweep (SIGSTOP): the run names a rank of
    that host as the one that stopped, never a rank of another host, within -T + 5 s of the
    freeze; NCCL's RAS, asked on host 0, names no rank of a healthy host either."""
    gpus = _layout_or_skip(hosts)
    per = len(gpus[0].split(","))
    frozen, name = hosts - 1, f"simnode{hosts - 1}"
    args = ["allreduce", "-b", "64M", "-e", "64M", "-n", "100000", "-T", "10"]
    with netsim.SimFleet(hosts, gpus=gpus) as fleet:
        procs = fleet.launch("spawn", args, per, port=29660, ncclbench=cli_command(),
                             env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
        _wait_for_sweep(procs[0])
        time.sleep(3)  # inside the 64 MiB size's timed loop
        frozen_at = time.monotonic()
        fleet.freeze(frozen)
        out, err = procs[0].communicate(timeout=60)
        named_after = time.monotonic() - frozen_at
        fleet.thaw(frozen)
    text = out + err
    lines = [line for line in err.splitlines() if line.startswith("ncclbench: error")]
    assert procs[0].returncode == 4, text[-3000:]
    assert lines and name in lines[-1], text[-3000:]
    assert not re.search(r"rank \d+ (failed|died)", lines[-1].split(name)[0]), lines[-1]
    culprit_hosts = set(re.findall(r"\(pid \d+\) on ([\w.-]+)", lines[-1].split("; NCCL RAS")[0]))
    assert culprit_hosts == {name}, lines[-1]
    assert named_after < 10 + 5 + 5, named_after  # -T + 5 s, plus this host's own start-up slack
    said = re.search(r"; NCCL RAS \([^,]+, a second witness\): (.*)$", lines[-1])
    assert said, lines[-1]
    named = {int(r) for r in re.findall(r"rank (\d+) = pid", said.group(1).split("; " + ras.LAGGING)[0])}
    assert named <= set(range(frozen * per, hosts * per)), lines[-1]
    print(f"{hosts} hosts ({' '.join(gpus)}): frozen host named after {named_after:.1f} s; RAS: {said.group(1)}")


def _wait_for_sweep(proc) -> None:
    """Read rank 0's stdout up to the table's column header: the sweep starts next."""
    for line in proc.stdout:
        if line.startswith("#") and "(B)" in line:
            return
    raise AssertionError("the run ended before its sweep began")


@pytest.mark.gpu
@rig
@needs_gpu
def test_tune_paired_across_hosts_times_every_configuration_side_by_side(tmp_path):
    """`tune --paired 2` with NCCL over sockets between 2 hosts (CUDA MPS where they share a
    GPU, as the rig does on a one-GPU machine): both hosts end 0, every size has an interval of each combination's ratio to the default, the communicators are made in
    the first 2 repeats and kept, and NCCL's log names its network transport."""
    gpus = _layout(2)
    per = len(gpus[0].split(","))
    out = tmp_path / "tuned"
    args = ["tune", "allreduce", "-b", "8", "-e", "4K", "-f", "8", "-n", "5", "-w", "1", "-G", "2",
            "--algos", "tree,ring", "--protos", "ll,simple", "--paired", "2", "--repeat", "8", "--no-plot",
            "-o", str(out)]
    with netsim.SimFleet(2, gpus=gpus, mps=bool(netsim.shared_gpus(gpus))) as fleet:
        procs = fleet.launch("spawn", args, per, port=29670, ncclbench=cli_command(),
                             env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
        codes, outs = _finish(procs, timeout=500)
    assert codes == [0, 0], outs[0][0][-3000:] + outs[0][1][-3000:]
    assert "side by side (--paired 2)" in outs[0][0], outs[0][0][-3000:]
    doc = json.loads((out / "tune.json").read_text())
    verdicts = doc["collectives"]["all_reduce"]["verdicts"]
    assert doc["paired"] == 2 and [v["size"] for v in verdicts] == [8, 64, 512, 4096]
    assert all(v["ratio_interval"] and v["noise_pct"] is not None for v in verdicts), verdicts
    work = json.loads((out / "launches" / "raw.work.json").read_text())["items"]
    done = {e["index"]: e for e in map(json.loads, (out / "launches" / "raw.status.jsonl").read_text().splitlines())
            if e["event"] == "done"}
    assert all(done[it["index"]]["comm_made"] == (it["round"] <= 2) for it in work)
    logs = "".join(p.read_text(errors="replace") for p in (out / "probe").glob("nccl.*.log"))
    assert "via NET/Socket" in logs or "Using network Socket" in logs, logs[-2000:]
    print("\n".join(f"{v['size']} noise {v['noise_pct']:.2f} % best {v['best']} gain {v['gain_pct']:+.1f} % "
                    f"{v['ratio_interval']} {v['why']}" for v in verdicts))
