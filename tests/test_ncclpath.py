"""The path NCCL took, read from its own INFO log: the parser on log text in NCCL 2.2x's formats
(tests/fixtures/nccl-logs: one folder per case, one file per process, plus a job's combined
output and a pasted fragment), the switch that turns the log on, the peak of the path,
the known causes, `ncclbench explain` on saved logs and `compare` on a changed path."""

import copy
import json
import os

import pytest

from conftest import FIXTURES, REFERENCE, run_cli
from ncclbench.topology import nccldebug, pathexplain, pathhost
from ncclbench.topology.ncclpath import kind_of, parse_text, read_logs, to_summary
from ncclbench.topology.ncclpath import whole as nccldebug_whole
from ncclbench.topology.pathview import Path

LOGS = FIXTURES / "nccl-logs"


def path_of(*names) -> Path:
    return Path([to_summary(p) for p in read_logs([LOGS / n for n in names])])


@pytest.mark.parametrize("via, kind", [
    ("P2P/CUMEM", "P2P/CUMEM"), ("P2P/CUMEM/read", "P2P/CUMEM/read"), ("P2P/IPC", "P2P/IPC"),
    ("P2P/IPC/read/CE", "P2P/IPC/read/CE"), ("P2P/MNNVL", "P2P/MNNVL"), ("P2P/direct pointer", "P2P/direct"),
    ("P2P/direct pointer/read", "P2P/direct/read"), ("P2P/indirect/2[2]", "P2P/indirect"),
    ("SHM/direct/direct", "SHM"), ("SHM/direct", "SHM"), ("SHM/CE/direct", "SHM/CE/direct"),
    ("NET/IB/0/GDRDMA", "NET/IB/GDRDMA"), ("NET/IB/1(3)/GDRDMA", "NET/IB/GDRDMA"), ("NET/IB/0", "NET/IB"),
    ("NET/Socket/0", "NET/Socket"), ("NET/IB/0/GDRDMA(PCI)/Shared", "NET/IB/GDRDMA(PCI)/Shared"),
])
def test_every_transport_kind_is_named_without_its_device_number(via, kind):
    assert kind_of(via) == kind


def test_two_hosts_over_sockets_per_process_files():
    """2 hosts x 2 GPUs, NCCL over TCP: the lines of NCCL 2.28.9 on simulated hosts."""
    path = path_of("two-hosts-socket")
    assert len(path.processes) == 4 and {p["host"] for p in path.processes} == {"h100-a", "h100-b"}
    assert path.transports() == {"NET/Socket": {(0, 2), (2, 0), (1, 3), (3, 1)},
                                 "P2P/CUMEM": {(0, 1), (1, 0), (2, 3), (3, 2)}}
    assert path.label == "NET/Socket + P2P/CUMEM" and path.bottleneck == "NET/Socket"
    assert (path.network, path.gdr, path.pxn, path.channels, path.nvls) == ("Socket", 0, 0, 2, False)
    assert path.version == "2.28.9" and path.env == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}
    assert path.nics_by_rank() == {str(r): ["eth0"] for r in range(4)}
    head = path.lines()
    assert head[0].startswith("NCCL path: NET/Socket (0->2") and "over eth0" in head[0]
    assert "network Socket, GDR 0, PXN 0, 2 channels" in head[1]


def _without_ring_lines(case: str, rewrite=lambda line: line) -> Path:
    """A case's logs as a communicator that connected only trees writes them: no `Connected
    all rings, use ring PXN p GDR g` line (seen on 4 H100s as 2 hosts x 2 GPUs, a 64 MiB
    all_reduce over sockets: NCCL connected trees alone)."""
    summaries = []
    for f in sorted((LOGS / case).iterdir()):
        text = "\n".join(rewrite(line) for line in f.read_text().splitlines() if "Connected all rings" not in line)
        summaries += [to_summary(p) for p in parse_text(text, str(f))]
    return Path(summaries)


def test_gdr_is_read_from_the_net_connections_when_no_ring_line_says_it():
    sock = _without_ring_lines("h100-two-hosts-socket")
    assert (sock.network, sock.gdr, sock.pxn) == ("Socket", 0, None)
    assert sock.lines()[1].startswith("  network Socket, GDR 0, 2 channels")
    ib = _without_ring_lines("two-hosts-ib")
    assert ib.gdr == 1 and ib.pxn is None
    # InfiniBand without GPUDirect RDMA: connections without /GDRDMA say GDR 0
    plain = _without_ring_lines("two-hosts-ib", lambda line: line.replace("/GDRDMA", ""))
    assert "NET/IB" in plain.transports() and plain.gdr == 0


@pytest.mark.parametrize("suffix, gdr", [("/GDRDMA", 1), ("", 0)])
def test_a_network_plugin_whose_name_has_a_space_keeps_its_gdr(suffix, gdr):
    """aws-ofi-nccl names its network `AWS Libfabric`: the connection line's GDRDMA is read."""
    text = "\n".join([
        "h0:11:11 [0] NCCL INFO Using network AWS Libfabric",
        "h0:11:11 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
        f"h0:11:11 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/AWS Libfabric/0{suffix}",
        f"h0:11:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/1{suffix}",
    ])
    (proc,) = parse_text(text)
    path = Path([to_summary(proc)])
    assert set(path.transports()) == {f"NET/AWS Libfabric{suffix}"}
    assert path.gdr == gdr and path.network == "AWS Libfabric"


def test_a_net_connection_printed_by_both_ends_counts_once():
    """NCCL prints `[send]` on the sender and `[receive]` on the receiver, both src -> dst."""
    path = path_of("two-hosts-socket")
    links = [tuple(l[:3]) for p in path.processes for c in p["comms"] for l in c["links"] if l[2] == "NET/Socket"]
    assert len(links) == 8 and len(set(links)) == 4  # seen twice, one pair each
    from ncclbench.explain.report import table as path_table

    table = path_table(path)
    assert table[1].split()[0] == "NET/Socket" and table[1].split()[-2:] == ["2", "eth0"]


def test_infiniband_with_gdr_and_pxn():
    path = path_of("two-hosts-ib")
    assert path.label == "NET/IB/GDRDMA + P2P/IPC"
    assert (path.network_label, path.gdr, path.pxn, path.nvls) == ("IB", 1, 1, True)
    assert path.nic_names() == ["mlx5_0", "mlx5_1"]
    assert pathexplain.causes(path, {"ib_devices": ["mlx5_0"], "peermem": True}, {}) == []


def test_one_host_p2p_and_shm():
    p2p, shm = path_of("one-host-p2p"), path_of("one-host-shm")
    assert p2p.label == "P2P/CUMEM/read" and shm.label == "SHM"
    assert shm.env == {"NCCL_P2P_DISABLE": "1"} and not p2p.env
    assert not shm.uses_network and "network" not in " ".join(shm.lines())  # one host: no network facts


def test_a_combined_job_log_with_other_output_mixed_in():
    """One file of a job's output: torchrun's `[default0]:` prefixes, two processes' lines
    interleaved, a table and warnings in between."""
    processes = read_logs([LOGS / "combined" / "job.out"])
    assert [(p.host, p.pid) for p in processes] == [("h100-a", 51200), ("h100-a", 51201)]
    path = Path([to_summary(p) for p in processes])
    assert path.transports() == {"SHM": {(0, 1), (1, 2)}}


def test_pasted_lines_without_nccls_prefix():
    processes = read_logs([LOGS / "pasted" / "fragment.txt"])
    assert len(processes) == 1 and processes[0].host is None
    path = Path([to_summary(p) for p in processes])
    assert set(path.transports()) == {"NET/IB", "SHM", "P2P/IPC/read", "P2P/direct/read"}
    assert (path.network_label, path.gdr, path.version) == ("RoCE", 0, "2.21.5")
    assert path.env == {"NCCL_NET_GDR_LEVEL": "LOC"}


def test_lines_that_only_look_alike_are_not_read():
    text = ("Channel 00/02 : 0 1 2 3\nTrees [0] 1/-1/-1->0->-1\nwe used NVLS multicast support yesterday\n"
            "Ring 00 : 3 -> 0 -> 1\nh:1:1 [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 0\n")
    assert parse_text(text) == []


def test_communicators_of_one_process_are_kept_apart():
    text = "\n".join([
        "h:7:7 [0] NCCL INFO comm 0xa1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
        "h:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0xa1 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
        "commId 0x11 - Init COMPLETE",
        "h:7:9 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:7:7 [0] NCCL INFO comm 0xb2 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0",
        "h:7:7 [0] NCCL INFO ncclCommSplit comm 0xb2 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 parent 0xa1 "
        "splitCount 1 color 0 key 0 - Init COMPLETE",
        "h:7:9 [0] NCCL INFO Channel 00 : 1[0] -> 0[2] via SHM/direct/direct",
    ])
    (p,) = parse_text(text)
    assert [(c.ptr, c.comm_id, c.rank, c.complete) for c in p.comms] == [("0xa1", "0x11", 0, True),
                                                                         ("0xb2", None, 1, True)]
    assert [set(k for *_, k in c.links) for c in p.comms] == [{"P2P/CUMEM/read"}, {"SHM"}]


# ---- the switch: NCCL's log on for a process, the user's own settings kept ----
@pytest.fixture
def fresh_switch(monkeypatch):
    monkeypatch.setattr(nccldebug._State, "armed_by_us", {})
    monkeypatch.setattr(nccldebug._State, "folder", None)
    monkeypatch.setattr(nccldebug._State, "handle", None)


def test_the_log_is_turned_on_only_where_the_user_did_not(fresh_switch, tmp_path):
    env = {}
    set_ = nccldebug.arm(env)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log")
    assert set(env["NCCL_DEBUG_SUBSYS"].split(",")) >= {"INIT", "ENV", "P2P", "SHM", "NET", "GRAPH"}
    assert set_ == env and nccldebug.ours("NCCL_DEBUG", "INFO") and not nccldebug.ours("NCCL_ALGO", "Ring")
    os.rmdir(nccldebug._State.folder)
    for users in ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG_FILE": str(tmp_path / "x.%p")}):
        nccldebug._State.armed_by_us = {}
        env = dict(users)
        assert nccldebug.arm(env) == {} and env == users


def test_the_header_environment_leaves_out_what_ncclbench_set(fresh_switch, monkeypatch):
    from ncclbench.engine.runfacts import nccl_environ

    monkeypatch.setenv("NCCL_ALGO", "Ring")
    for name in ("NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS"):
        monkeypatch.delenv(name, raising=False)
    nccldebug.arm(os.environ)
    os.rmdir(nccldebug._State.folder)
    assert [e for e in nccl_environ() if "DEBUG" in e] == [] and "NCCL_ALGO=Ring" in nccl_environ()


def test_the_users_own_file_is_read_and_an_unreadable_log_says_why(fresh_switch, tmp_path):
    pattern = str(tmp_path / "nccl.%h.%p.log")
    mine = nccldebug.expand(pattern)
    assert mine == str(tmp_path / f"nccl.{os.uname().nodename.split('.')[0]}.{os.getpid()}.log")
    assert nccldebug.expand("a%%b.%p", pid=7, host="n1.example.com") == "a%b.7"
    assert nccldebug.expand("%h.log", host="a/b.c") == "a-b.log"
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": pattern}
    summary, why = nccldebug.own_summary(0, env)
    assert summary is None and "wrote no log file" in why
    src = (LOGS / "one-host-shm" / "nccl.h100-a.51200.log").read_text()
    with open(mine, "w") as f:
        f.write(src.replace("h100-a:51200", f"h100-a:{os.getpid()}"))
    summary, why = nccldebug.own_summary(0, env)
    assert why is None and summary["pid"] == os.getpid() and summary["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert os.path.exists(mine)  # the user's file stays
    assert "stdout" in nccldebug.own_summary(0, {"NCCL_DEBUG": "INFO"})[1]
    assert "no INFO lines" in nccldebug.own_summary(0, {"NCCL_DEBUG": "WARN"})[1]


def test_probes_of_tune_share_the_switch():
    from ncclbench.tune.launches import probe_env

    env = probe_env("/x")
    assert env["NCCL_DEBUG_FILE"] == "/x/nccl.%h.%p.log"
    assert env["NCCL_DEBUG_SUBSYS"].split(",") == ["INIT", "ENV", "P2P", "SHM", "NET", "GRAPH", "TUNING"]


# ---- the peak of the path and the causes ----
def test_the_best_busbw_is_put_against_the_peak_of_the_path_used():
    shm, p2p, net = path_of("one-host-shm"), path_of("one-host-p2p"), path_of("two-hosts-socket")
    line = pathexplain.peak_line(28.34, shm, 478.1)
    assert "% of NVLink" not in line and "SHM" in line and "not this path's" in line
    assert pathexplain.peak_line(359.5, p2p, 478.1) == \
        "# Best busbw 359.50 GB/s = 75.2 % of NVLink peak 478.1 GB/s per GPU per direction"
    assert "rate of eth0 is unknown" in pathexplain.peak_line(3.0, net, 478.1)
    for p in net.processes:
        p["nic_rates"] = {"eth0": 3.125}  # 25 Gb/s
    assert pathexplain.peak_line(2.5, net, 478.1).startswith("# Best busbw 2.50 GB/s = 80.0 % of the NIC rate 3.125")
    assert "not this path's real bound" in pathexplain.peak_line(7.0, net, None)  # veth: a nominal 25 Gb/s
    # all_reduce's tree passes a NIC's rate (up to 2x): the percentage stays, with why
    line = pathexplain.peak_line(3.6, net, None)
    assert "= 115.2 % of the NIC rate 3.125" in line and "tree sends less through each NIC" in line, line
    # a host whose eth0 is shaped (tbf at 2 Gbit/s): that host's rate bounds the path, and says why
    host_b = [p for p in net.processes if p["host"] == "h100-b"]
    for p in host_b:
        p["nic_rates"], p["nic_shaped"] = {"eth0": 0.25}, {"eth0": 0.25}
    line = pathexplain.peak_line(0.24, net, 478.1)
    assert line == ("# Best busbw 0.24 GB/s = 96.0 % of the NIC rate 0.25 GB/s (eth0 on h100-b; a tbf qdisc caps "
                    "what eth0 sends)"), line


def test_a_tbf_qdisc_s_rate_is_read_from_its_netlink_options():
    import struct

    from ncclbench.topology.shaping import tbf_rate

    def attr(kind, payload):
        length = 4 + len(payload)
        return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)

    ratespec = struct.pack("=BBHhHI", 0, 1, 0, -1, 0, 250_000_000)  # 2 Gbit/s in bytes per second
    parms = ratespec + struct.pack("=BBHhHI", 0, 0, 0, 0, 0, 0) + struct.pack("=III", 1 << 20, 4096, 1500)
    assert tbf_rate(attr(1, parms)) == 250_000_000
    # above 4 GB/s the kernel adds TCA_TBF_RATE64 and the 32-bit field is saturated
    capped = struct.pack("=BBHhHI", 0, 1, 0, -1, 0, 0xFFFFFFFF) + parms[12:]
    assert tbf_rate(attr(1, capped) + attr(4, struct.pack("=Q", 50_000_000_000))) == 50_000_000_000
    assert tbf_rate(b"") is None and tbf_rate(attr(1, b"\0" * 4)) is None


def test_sysfs_facts(tmp_path):
    (tmp_path / "class/infiniband/mlx5_0/ports/1").mkdir(parents=True)
    (tmp_path / "class/infiniband/mlx5_0/ports/1/rate").write_text("400 Gb/sec (4X NDR)\n")
    (tmp_path / "class/net/eth0").mkdir(parents=True)
    (tmp_path / "class/net/eth0/speed").write_text("25000\n")
    (tmp_path / "class/net/veth1").mkdir(parents=True)
    (tmp_path / "class/net/veth1/speed").write_text("-1\n")
    (tmp_path / "module/nvidia").mkdir(parents=True)
    root = str(tmp_path)
    assert pathhost.nic_rate_gbps("mlx5_0", "1/IB", root) == 50.0
    assert pathhost.nic_rate_gbps("eth0", "198.18.0.10<0>", root) == 3.125
    assert pathhost.nic_rate_gbps("veth1", "", root) is None
    from ncclbench.explain.here import host_facts

    assert host_facts(root) == {"ib_devices": ["mlx5_0"], "peermem": False}
    (tmp_path / "module/nvidia_peermem").mkdir()
    assert pathhost.peermem_loaded(root) is True


def test_causes_name_what_the_log_and_the_host_show():
    shm = pathexplain.causes(path_of("one-host-shm"))
    assert len(shm) == 1 and "NCCL_P2P_DISABLE=1" in shm[0] and shm[0].startswith("SHM where P2P was expected")
    assert pathexplain.causes(path_of("one-host-p2p")) == []
    sock = pathexplain.causes(path_of("two-hosts-socket"), {"ib_devices": ["mlx5_0"]})
    assert "network Socket" in sock[0] and "mlx5_0" in sock[0] and "NCCL_IB_DISABLE=1" in sock[0]
    assert "GDR 0" in sock[0]
    ib = path_of("two-hosts-ib")
    for c in ib.comms():
        c["gdr"] = 0
    ib.processes = [dict(p, comms=[dict(c, links=[[s, d, k.replace("/GDRDMA", ""), ch] for s, d, k, ch in c["links"]])
                                   for c in p["comms"]]) for p in ib.processes]
    gdr = pathexplain.causes(ib, {"ib_devices": ["mlx5_0"], "peermem": False}, {"NCCL_MAX_NCHANNELS": "1"})
    assert gdr[0].startswith("GDR 0") and "nvidia_peermem" in gdr[0]
    assert any("NCCL_MAX_NCHANNELS=1" in c for c in gdr)


def test_gdr_and_pxn_are_read_from_the_communicators_that_crossed_a_network():
    """A process with a communicator within its host (NCCL prints `GDR 1` there) and one
    across hosts over sockets (`GDR 0`): the facts and the cause line both say GDR 0."""
    sock = path_of("two-hosts-socket")
    local = {"rank": 0, "nranks": 2, "nnodes": 1, "channels": 24, "pxn": 0, "gdr": 1,
             "links": [[0, 1, "P2P/CUMEM", ["00/0"]]]}
    for p in sock.processes:
        p["comms"] = [dict(local)] + p["comms"]
    assert sock.gdr == 0 and "GDR 0" in sock.facts()
    assert "GDR 0" in pathexplain.causes(sock)[0]
    one_host = Path([{"host": "a", "comms": [local]}])
    assert one_host.gdr == 1  # no network: what NCCL printed, the facts line leaves it out
    assert "between the GPUs of one host" in pathexplain.causes(path_of("h100-one-host-sockets"))[0]
    assert "between hosts" in pathexplain.causes(path_of("two-hosts-socket"))[0]


# ---- the command line ----
def test_explain_reads_saved_logs_without_a_gpu():
    r = run_cli(["explain", str(LOGS / "one-host-shm")], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "SHM" in r.stdout and "NCCL_P2P_DISABLE=1" in r.stdout and "Known causes" in r.stdout
    r = run_cli(["explain", str(LOGS / "two-hosts-socket" / "nccl.h100-a.40100.log"),
                 str(LOGS / "two-hosts-socket" / "nccl.h100-b.40102.log")], timeout=60)
    assert r.returncode == 0 and "NET/Socket" in r.stdout and "GDR 0" in r.stdout, r.stdout + r.stderr
    assert "of 2 process(es)" in r.stdout


def test_explain_refuses_bad_input_in_one_line(tmp_path):
    (tmp_path / "empty.log").write_text("nothing from NCCL here\n")
    for args in (["explain", str(tmp_path / "missing")], ["explain", str(tmp_path / "empty.log")]):
        r = run_cli(args, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_explain_reads_only_what_nccl_wrote_whole(tmp_path):
    """A log cut mid-line loses that line (what is left of `via NET/IB/1/GDRDMA` is no
    transport); other output in a log with NCCL's prefixes is not read as NCCL's; a log with
    communicators but no connection line says the path is unknown, never that it is the
    expected one; a log naming no communicator, a device or a pipe is one line, exit 2."""
    ib = LOGS / "two-hosts-ib" / "nccl.dgx-01.70300.log"
    text = ib.read_text()
    cut = text[:text.rindex("via NET/IB/") + len("via NET/I")]
    (tmp_path / "cut.log").write_text(cut)
    kinds = set(path_of(tmp_path / "cut.log").transports())
    assert kinds and all(k in ("NET/IB/GDRDMA", "P2P/IPC") for k in kinds), kinds
    (live,) = parse_text(nccldebug_whole(cut))  # a log read while NCCL writes it
    assert set(Path([to_summary(live)]).transports()) == kinds
    for via in ("NET/I", "NET/IB/"):  # no device index: what is left of a cut line, never a transport
        (p,) = parse_text("h:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
                          f"h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via {via}")
        assert not Path([to_summary(p)]).transports(), via
    mixed = text + "NCCL WARN an application's own line\nUsing network Socket for logging\nEpoch 3: 1 coll channels, 0 " \
        "collnet channels, 0 nvls channels, 1 p2p channels, 1 p2p channels per peer\n"
    (tmp_path / "mixed.log").write_text(mixed)
    path = path_of(tmp_path / "mixed.log")
    assert len(path.processes) == 1 and path.network == "IB" and path.channels == path_of(ib).channels
    marked = "".join("NCCL INFO " + line.split(" NCCL INFO ", 1)[1]
                     for line in text.splitlines(keepends=True) if " NCCL INFO " in line)
    (tmp_path / "marked.log").write_text("h:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n" + marked)
    assert path_of(tmp_path / "marked.log").transports() == path_of(ib).transports()  # NCCL's marker, no prefix
    (tmp_path / "sizes.log").write_text("NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p "
                                        "channels, 32 p2p channels per peer\nNCCL INFO NVLS multicast support is available\n")
    assert path_of(tmp_path / "sizes.log").lines()[0].startswith("NCCL path: unknown")
    head = "".join(line for line in text.splitlines(keepends=True) if " via " not in line and "Connected all" not in line)
    (tmp_path / "head.log").write_text(head)
    r = run_cli(["explain", str(tmp_path / "head.log")], timeout=60)
    assert r.returncode == 0 and "NCCL path: unknown" in r.stdout and "expected" not in r.stdout, r.stdout + r.stderr
    (tmp_path / "warn.log").write_text("h:1:1 [0] NCCL WARN Call to connect returned Connection refused\n"
                                       "h:1:1 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n")
    os.mkfifo(tmp_path / "pipe")
    for name, words in (("warn.log", "no NCCL INFO line about a communicator"), ("pipe", "not a regular file")):
        r = run_cli(["explain", str(tmp_path / name)], timeout=60)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and words in r.stderr, \
            r.stdout + r.stderr


@pytest.mark.parametrize("subsys, readable", [
    (None, True), ("INIT,NET", True), ("ALL", True), ("^NET,P2P", True), ("NET,P2P,SHM", True), ("^INIT", True),
    ("COLL", False), ("ENV,GRAPH", False), ("^INIT,P2P,SHM,NET", False), ("^ALL", False),
])
def test_a_log_without_connection_lines_says_the_path_cannot_be_read(subsys, readable):
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log"}
    if subsys:
        env["NCCL_DEBUG_SUBSYS"] = subsys
    why = nccldebug.unreadable_reason(env)
    assert (why is None) == readable, why
    if not readable:
        assert "leaves out INIT, P2P, SHM and NET" in why


def test_a_verdict_without_the_log_says_so_and_guesses_nothing():
    from ncclbench.faults.preflight.verdict import NOT_READ, transport_notes

    lines, _ = transport_notes("nccl", ["a", "b"], {}, [0, 0], {"NCCL_IB_DISABLE": "1"}, 1.0)
    assert lines[-1] == NOT_READ and not any("inferred" in line for line in lines)
    lines, _ = transport_notes("nccl", ["a", "b"], {}, [0, 0], {}, 1.0, "rank(s) 1: NCCL_DEBUG=WARN is set")
    assert lines[-1] == "NCCL path: not read (rank(s) 1: NCCL_DEBUG=WARN is set)"


def test_compare_names_a_changed_path_as_the_likely_cause(tmp_path):
    from ncclbench.results.compare import compare_frames
    from ncclbench.results.readers import read_results

    doc = json.loads((REFERENCE / "h200-2gpu-nvswitch" / "all_reduce_np2_periter.json").read_text())
    base, new = copy.deepcopy(doc), copy.deepcopy(doc)
    ib, sock = path_of("two-hosts-ib").to_dict(), path_of("two-hosts-socket").to_dict()
    base["ncclbench"] = {"collective": "all_reduce", "nccl_path": ib}
    new["ncclbench"] = {"collective": "all_reduce", "nccl_path": sock}
    for doc_ in (base, new):
        for res in doc_["results"]:  # no per-iteration samples: compare's threshold rule alone
            res.pop("out_of_place_per_iter", None)
            res.pop("in_place_per_iter", None)
    for res in new["results"]:
        for placement in ("out_of_place", "in_place"):
            for key in ("bus_bw", "alg_bw"):
                res[placement][key] = res[placement][key] / 4
            res[placement]["time"] = res[placement]["time"] * 4
    (tmp_path / "base.json").write_text(json.dumps(base))
    (tmp_path / "new.json").write_text(json.dumps(new))
    c = compare_frames(read_results(tmp_path / "base.json"), read_results(tmp_path / "new.json"))
    assert c.notes[0] == ("NCCL path changed: baseline NET/IB/GDRDMA + P2P/IPC, now NET/Socket + P2P/CUMEM "
                          "(the likely cause of the regression)")
    same = compare_frames(read_results(tmp_path / "base.json"), read_results(tmp_path / "base.json"))
    assert not any("NCCL path" in n for n in same.notes)
    r = run_cli(["compare", str(tmp_path / "base.json"), str(tmp_path / "new.json")], timeout=60)
    assert r.returncode == 1 and "NCCL path changed: baseline NET/IB/GDRDMA" in r.stdout


def test_a_fact_one_side_does_not_name_is_no_change_of_path():
    """A tree-only run names no PXN; an older file of one named no GDR either: unknown, not
    changed. A fact both name with another value is a change."""
    from ncclbench.results.compare import _facts_differ

    ring = ["network Socket, GDR 0, PXN 0, 2 channels"]
    assert not _facts_differ(ring, ["network Socket, GDR 0, 2 channels"])
    assert not _facts_differ(["network Socket, 2 channels"], ring)
    assert _facts_differ(ring, ["network Socket, GDR 0, PXN 0, 4 channels"])
    assert _facts_differ(["network IB, GDR 1, 16 channels"], ["network IB, GDR 0, 16 channels"])
    assert _facts_differ(["network IB, GDR 1"], ["network Socket, GDR 0"])
    assert not _facts_differ(["NVLS available, 24 channels"], ["NVLS available, 24 channels"])


# ---- a run: each rank reads its own log, rank 0 merges ----
class _Ranks:
    """Stands in for a backend's small-object exchange: what the other ranks sent."""

    def __init__(self, rank, others):
        self.rank, self.others = rank, others

    def all_gather_object(self, obj):
        return [obj] + self.others


def test_rank_0_merges_every_ranks_path_and_names_those_it_could_not_read(fresh_switch, tmp_path):
    from ncclbench.engine import pathread

    pattern = str(tmp_path / "nccl.%h.%p.log")
    src = (LOGS / "two-hosts-socket" / "nccl.h100-a.40100.log").read_text()
    (tmp_path / os.path.basename(nccldebug.expand(pattern))).write_text(src.replace(":40100:", f":{os.getpid()}:"))
    other = to_summary(read_logs([LOGS / "two-hosts-socket" / "nccl.h100-b.40102.log"])[0], 2)
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_FILE=pattern)
    try:
        path = pathread.gather(_Ranks(0, [(other, None), (None, "NCCL wrote no log file x")]))
        assert pathread.gather(_Ranks(1, [(other, None)])) is None  # only rank 0 keeps the merge
    finally:
        del os.environ["NCCL_DEBUG"], os.environ["NCCL_DEBUG_FILE"]
    assert path.transports() == {"NET/Socket": {(0, 2), (2, 0)}, "P2P/CUMEM": {(0, 1), (2, 3)}}
    assert path.unread == {"2": "NCCL wrote no log file x"}
    lines = pathread.header_lines(path, "nccl")
    assert lines[0].startswith("NCCL path: NET/Socket") and "rank(s) 2: NCCL wrote no log file x" in lines[1]
    assert pathread.header_lines(Path([], {"0": "NCCL's log is off"}), "nccl") == \
        ["NCCL path: unknown: rank(s) 0: NCCL's log is off"]
    assert pathread.header_lines(None, "gloo")[0].startswith("NCCL path: none (gloo")


def test_log_folders_of_ended_processes_are_removed(fresh_switch, tmp_path, monkeypatch):
    import subprocess
    import sys

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"ncclbench-nccl-log-{int(ended.stdout)}-abc"
    live = tmp_path / f"ncclbench-nccl-log-{os.getpid()}-def"
    for d in (dead, live):
        d.mkdir()
        (d / "nccl.h.1.log").write_text("x")
    monkeypatch.setattr(nccldebug.tempfile, "tempdir", str(tmp_path))
    env = {}
    nccldebug.arm(env)
    assert not dead.exists() and live.exists() and env["NCCL_DEBUG_FILE"].startswith(str(tmp_path))


def test_fleet_links_and_pair_tests_carry_the_path(tmp_path):
    import csv

    from ncclbench.faults.fleet.report import FleetReport

    report = FleetReport(plan={"backend": "nccl", "nbytes": 1 << 26, "budget_s": 30.0, "csv_path": str(tmp_path / "t.csv")})
    report.finding.links = [{"hosts": ["n1", "n2"], "evidence": "slow twice"}]
    report.tests = [{"round": 1, "kind": "screen", "host_a": "n2", "host_b": "n1", "rail": 0},
                    {"round": 1, "kind": "screen", "host_a": "n3", "host_b": "n4", "rail": 0}]
    report.add_paths({("n1", "n2"): "NET/Socket"})
    assert report.links[0]["path"] == "NET/Socket" and [t["path"] for t in report.tests] == ["NET/Socket", None]
    assert "# LINK n1 <-> n2: slow twice (NCCL path NET/Socket)" in report.lines()
    report.emit()
    rows = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert rows[0]["path"] == "NET/Socket"


def test_preflight_groups_take_the_path_their_log_named():
    from ncclbench.engine.pathread import path_notes

    shm = path_of("one-host-shm").to_dict()
    lines, peak = path_notes(shm, 478.1, 28.3)
    assert lines[0].startswith("NCCL path: SHM") and peak is None
    assert "% of NVLink" not in " ".join(lines) and any("NCCL_P2P_DISABLE=1" in l for l in lines)
    assert path_notes(None, 478.1, 28.3) is None  # not read: the topology's lines stay, marked so
    sock = path_of("two-hosts-socket").to_dict()
    lines, _ = path_notes(sock, None, 2.0)
    assert not any("RDMA devices" in line for line in lines)
    lines, _ = path_notes(sock, None, 2.0, {"ib_devices": ["mlx5_0"]}, {"NCCL_NET": "Socket"})
    assert any("while this host has RDMA devices (mlx5_0)" in line and "NCCL_NET=Socket" in line for line in lines), lines


def _lines(*msgs, host="simnode0", pid=7):
    return [f"{host}:{pid}:{pid} [0] NCCL INFO {m}" for m in msgs]


WORLD_AND_NODE = _lines(  # a 4-rank communicator across 2 hosts, then its 2-rank split within host 0
    "comm 0xa1 rank 0 nRanks 4 nNodes 2 localRanks 2 localRank 0 MNNVL 0",
    "ncclCommInitRankConfig comm 0xa1 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x11 - Init COMPLETE",
    "comm 0xb2 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
    "ncclCommSplit comm 0xb2 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 parent 0xa1 splitCount 1 color 0 key 0 "
    "- Init COMPLETE")
WORLD_CONNECTS = _lines(  # NCCL >= 2.22: at the first op, after both inits
    "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", "Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM",
    "Channel 00/0 : 3[3] -> 0[0] [receive] via NET/Socket/0", "Channel 00/0 : 0[0] -> 2[2] [send] via NET/Socket/0",
    "Connected all rings, use ring PXN 0 GDR 0")
NODE_CONNECTS = _lines("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM", "Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM",
                       "Connected all rings, use ring PXN 0 GDR 1")


@pytest.mark.parametrize("order", ["world first", "node first"])
def test_connection_lines_go_to_the_communicator_they_fit(order):
    """Since NCCL 2.22 a communicator connects at its first op: its lines, which name no
    communicator, follow another one's init. Each run goes to the one its ranks fit."""
    runs = [WORLD_CONNECTS, NODE_CONNECTS] if order == "world first" else [NODE_CONNECTS, WORLD_CONNECTS]
    (p,) = parse_text("\n".join(WORLD_AND_NODE + runs[0] + runs[1]))
    world, node = p.comms
    assert {k for *_, k in world.links} == {"P2P/CUMEM", "NET/Socket"} and world.gdr == 0
    assert {k for *_, k in node.links} == {"P2P/CUMEM"} and node.gdr == 1 and node.nnodes == 1


def test_a_groups_path_is_its_own_communicators(monkeypatch):
    """A process that holds a 4-rank communicator across hosts (NET/Socket) and its 2-rank
    split within its host, both made before either connected: each group's path, read after
    its own connecting op, names its own links (preflight's world and node groups)."""
    from ncclbench.engine import pathread
    from ncclbench.topology import nccldebug

    log = list(WORLD_AND_NODE)
    monkeypatch.setattr(nccldebug, "own_text", lambda environ=None: ("\n".join(log), None))

    class Backend:
        rank, group_size = 0, 4

        def all_gather_object(self, obj):
            return [obj]

    class Runner:
        def __init__(self, lines):
            self.lines = lines

        def connect(self, _buffers):
            log.extend(self.lines)

    class Plan:
        backend = "nccl"

    node = Backend()
    node.group_size = 2
    read = pathread.read_for_run(Plan(), node, Runner(NODE_CONNECTS), None)
    assert read.label == "P2P/CUMEM" and not read.uses_network and "GDR" not in " ".join(read.lines())
    read = pathread.read_for_run(Plan(), Backend(), Runner(WORLD_CONNECTS), None)
    assert read.uses_network and read.gdr == 0 and "P2P/CUMEM" in read.label
    whole = pathread.gather(Backend())
    assert "NET/Socket" in whole.label  # the process's every communicator (`ncclbench pairs`)
    # an op that connected nothing new: the communicators of the group's size
    assert pathread.gather(node, since=pathread.log_lines()).label == "P2P/CUMEM"

def test_p2p_over_pcie_is_put_against_the_pcie_link(tmp_path):
    from ncclbench.topology.ncclpath import pci_address

    assert pci_address("18000") == "0000:18:00.0" and pci_address("1000b1") == "0001:00:0b.1"
    dev = tmp_path / "bus/pci/devices/0000:18:00.0"
    dev.mkdir(parents=True)
    (dev / "current_link_speed").write_text("16.0 GT/s PCIe\n")
    (dev / "current_link_width").write_text("16\n")
    link = pathhost.pcie_link("0000:18:00.0", str(tmp_path))
    assert link["width"] == 16 and round(link["gbps"], 2) == 31.51
    assert pathhost.pcie_link("0000:19:00.0", str(tmp_path)) is None
    p2p = path_of("one-host-p2p")
    assert [c["bus_id"] for c in p2p.comms()] == ["0000:18:00.0", "0000:28:00.0", "0000:38:00.0", "0000:48:00.0"]
    assert "peak is unknown" in pathexplain.peak_line(20.0, p2p, None)
    p2p.processes[0]["pcie"] = {"0000:18:00.0": link}
    assert pathexplain.peak_line(20.0, p2p, None) == \
        "# Best busbw 20.00 GB/s = 63.5 % of the PCIe link 16 GT/s x16 31.5 GB/s per direction"


def test_pairs_name_the_transport_of_each_slow_pair(tmp_path):
    from ncclbench.engine.pair_exchange import pair_busbw
    from ncclbench.locate.schedule import tournament_rounds
    from ncclbench.faults.pairs.report import PairsResult
    from ncclbench.faults.pairs.run import PairsPlan

    plan = PairsPlan(nbytes=1_000_000, iters=2, warmup_iters=1, backend="nccl", timeout_s=60, fail_below=20.0,
                     json_path=str(tmp_path / "p.json"), csv_path=None)
    devices = [{"rank": r, "pid": 100 + r, "host": f"h100-{'ab'[r // 2]}", "device": r % 2, "device_hex": "0x2330",
                "device_info": "NVIDIA H100"} for r in range(4)]
    times = [{1: 1e-4, 2: 1e-2, 3: 1e-4}, {0: 1e-4, 2: 1e-4, 3: 1e-4}, {0: 1e-2, 1: 1e-4, 3: 1e-4},
             {0: 1e-4, 1: 1e-4, 2: 1e-4}]
    result = PairsResult(plan, devices, tournament_rounds(4), pair_busbw(times, plan.nbytes), [])
    result.path = path_of("two-hosts-socket")
    lines = result.report_lines("CUDA events")
    assert any(l.startswith("# NCCL path: NET/Socket") for l in lines)
    assert any("0 <-> 2" in l and "via NET/Socket" in l for l in lines), lines
    result.write_files()
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["nccl_path"]["label"] == "NET/Socket + P2P/CUMEM"
    assert {(p["rank_a"], p["rank_b"]): p["path"] for p in doc["pairs"]}[(0, 1)] == "P2P/CUMEM"


# ---- logs NCCL 2.28.9 wrote on 4 H100s (one host; 2 and 4 simulated hosts over sockets) --------
@pytest.mark.parametrize("case, transports, hosts, network_used", [
    ("h100-one-host-default", {"P2P/CUMEM"}, ["vm"], False),
    ("h100-one-host-p2p-disabled", {"SHM"}, ["vm"], False),
    ("h100-one-host-sockets", {"NET/Socket"}, ["vm"], True),
    ("h100-two-hosts-socket", {"NET/Socket", "P2P/CUMEM"}, ["simnode0", "simnode1"], True),
    ("h100-four-hosts-socket", {"NET/Socket"}, [f"simnode{i}" for i in range(4)], True),
])
def test_real_logs_read_as_the_path_nccl_took(case, transports, hosts, network_used):
    path = path_of(case)
    assert set(path.transports()) == transports
    assert sorted({p.get("host") for p in path.processes}) == hosts and len(path.processes) == 4
    assert path.uses_network == network_used
    if network_used:
        assert path.network == "Socket" and path.gdr == 0 and path.pxn == 0
    if case == "h100-two-hosts-socket":  # between hosts over the network, within one over NVLink
        assert path.transports()["NET/Socket"] == {(0, 2), (1, 2), (2, 0), (3, 0)}
        assert path.transports()["P2P/CUMEM"] == {(0, 1), (1, 0), (2, 3), (3, 2)}


def test_explain_names_the_cause_in_real_logs():
    r = run_cli(["explain", str(LOGS / "h100-one-host-p2p-disabled")], timeout=60)
    assert r.returncode == 0 and "SHM" in r.stdout and "NCCL_P2P_DISABLE=1" in r.stdout, r.stdout + r.stderr
    r = run_cli(["explain", str(LOGS / "h100-two-hosts-socket")], timeout=60)
    assert r.returncode == 0 and "NET/Socket" in r.stdout and "P2P/CUMEM" in r.stdout, r.stdout + r.stderr
    assert "network Socket" in r.stdout and "NCCL_IB_DISABLE=1" in r.stdout


def test_send_recv_runs_and_tree_lines_go_to_their_own_communicator():
    """A send/recv's connections (index 1) end a ring run and start their own; a network line
    never goes to a communicator within one node, nor P2P to one with no rank on its node;
    a channel a communicator already holds is another one's."""
    sendrecv_world = _lines("Channel 00/1 : 0[0] -> 2[2] [send] via NET/Socket/0",
                            "Channel 00/1 : 2[2] -> 0[0] [receive] via NET/Socket/0")
    (p,) = parse_text("\n".join(WORLD_AND_NODE + sendrecv_world + NODE_CONNECTS))
    world, node = p.comms
    assert {k for *_, k in world.links} == {"NET/Socket"} and not world.rings
    assert {k for *_, k in node.links} == {"P2P/CUMEM"} and node.gdr == 1
    node_sendrecv = _lines("Channel 00/1 : 0[0] -> 1[1] via P2P/CUMEM")
    (p,) = parse_text("\n".join(WORLD_AND_NODE + NODE_CONNECTS + node_sendrecv + WORLD_CONNECTS))
    world, node = p.comms
    assert set(node.links[(0, 1, "P2P/CUMEM")]) == {"00/0", "01/0", "00/1"}
    assert world.gdr == 0 and (0, 2, "NET/Socket") in world.links
    cross = _lines("comm 0xc3 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
                   "ncclCommSplit comm 0xc3 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 parent 0xa1 splitCount 2 "
                   "color 1 key 0 - Init COMPLETE")
    pair = _lines("Channel 00/0 : 0[0] -> 1[2] [send] via NET/Socket/0", "Channel 00/0 : 1[2] -> 0[0] [receive] via "
                  "NET/Socket/0", "Connected all rings, use ring PXN 0 GDR 0")
    (p,) = parse_text("\n".join(WORLD_AND_NODE + cross + NODE_CONNECTS + pair))
    world, node, across = p.comms
    assert {k for *_, k in node.links} == {"P2P/CUMEM"} and {k for *_, k in across.links} == {"NET/Socket"}
    assert not world.links


def test_a_mesh_groups_path_connected_before_its_op_is_told_by_its_hosts(monkeypatch):
    """Two 2-rank groups of one process, one within a host and one across two, both connected
    before either group's own read (the API's set-up ops run on the group): each group's path
    is that of the communicator of its size spanning as many nodes as its ranks' hosts."""
    from ncclbench.engine import pathread
    from ncclbench.topology import nccldebug

    cross = _lines("comm 0xc3 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
                   "ncclCommSplit comm 0xc3 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 parent 0xa1 splitCount 2 "
                   "color 1 key 0 - Init COMPLETE",
                   "Channel 00/0 : 0[0] -> 1[2] [send] via NET/Socket/0",
                   "Channel 00/0 : 1[2] -> 0[0] [receive] via NET/Socket/0", "Connected all rings, use ring PXN 0 GDR 0")
    log = WORLD_AND_NODE + NODE_CONNECTS + cross
    monkeypatch.setattr(nccldebug, "own_text", lambda environ=None: ("\n".join(log), None))

    class Group:
        rank, group_size = 0, 2

        def __init__(self, hosts):
            self.hosts = hosts

        def all_gather_object(self, obj):
            return [obj] + [(dict(obj[0], host=h), None) for h in self.hosts[1:]]

    since = pathread.log_lines()
    within = pathread.gather(Group(["simnode0", "simnode0"]), since=since)
    across = pathread.gather(Group(["simnode0", "simnode1"]), since=since)
    assert within.label == "P2P/CUMEM" and across.label == "NET/Socket"
