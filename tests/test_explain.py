"""`ncclbench explain` on what it was given: logs grouped by job and communicator (separate
jobs in one folder explained one by one), a subset of a multi-host job's files (the missing
ranks named, nothing concluded about them), logs whose NCCL_DEBUG_SUBSYS left subsystems out
(what could not be read is named), and a whole job explained as before.

Fixtures (tests/fixtures/nccl-logs): `h100-two-hosts-socket-one-host/node0.out` is one host's
combined job output (torchrun `--tee 3`, both local ranks interleaved, the table mixed in) of
the 2 hosts x 2 H100 job whose per-process files are `h100-two-hosts-socket/`;
`h100-two-hosts-subsys-p2p-shm/` holds the lines of that job NCCL 2.28.9 prints under
NCCL_DEBUG_SUBSYS=P2P,SHM (its INFO(NCCL_ALL) version line, INFO(NCCL_INIT|NCCL_P2P)
connections, INFO(NCCL_P2P|NCCL_ALLOC) buffers; INIT, ENV and NET lines gone)."""

import os
import shutil

import pytest

from conftest import FIXTURES, run_cli
from ncclbench.errors import BadInput
from ncclbench.explain.jobs import coverage, ranks_text, split_jobs, subsystem_notes
from ncclbench.explain.logs import read_processes
from ncclbench.explain.report import explain_logs
from ncclbench.topology.ncclpath import parse_text

LOGS = FIXTURES / "nccl-logs"
WHOLE = LOGS / "h100-two-hosts-socket"
ONE_HOST = LOGS / "h100-two-hosts-socket-one-host" / "node0.out"
NO_INIT = LOGS / "h100-two-hosts-subsys-p2p-shm"
JOBS = {"h100-one-host-default": "0x54e66e8e1f76025d", "h100-one-host-p2p-disabled": "0x762c7b7b7cc5621c",
        "h100-one-host-sockets": "0x2be6f5e2fc0c20c2", "h100-two-hosts-socket": "0xc57a963869fc48d4"}


def test_ranks_are_written_as_runs():
    assert ranks_text([3, 0, 1, 2, 8, 10, 11]) == "0-3, 8, 10-11"
    assert ranks_text([5]) == "5" and ranks_text([]) == ""


# ---- a whole job: as before ----
def test_a_whole_job_is_explained_as_before():
    assert explain_logs([WHOLE]) == [
        "# NCCL path of 4 process(es) on simnode0, simnode1, NCCL 2.28.9 (from 4 file(s))",
        "transport   rank pairs (src->dst)   channels  NICs",
        "NET/Socket  0->2, 1->2, 2->0, 3->0  2         eth0",
        "P2P/CUMEM   0->1, 1->0, 2->3, 3->2  2         -",
        "# network Socket, GDR 0, PXN 0, 2 channels, connected ring+tree, NCCL read NCCL_HOSTID=simnode0 "
        "NCCL_IB_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=eth0",
        "# Known causes of a lower number:",
        "#   - network Socket: TCP sockets between hosts; GDR 0 (sockets never use GPUDirect RDMA); set: NCCL_IB_DISABLE=1",
        "#   - NVLS off: NCCL_NVLS_ENABLE=0 set (NVLink SHARP all_reduce not used)",
    ]
    (job,) = split_jobs(read_processes([WHOLE])[0])
    cov = coverage(job)
    assert (cov.key, cov.nranks, cov.nnodes, cov.missing, cov.hosts) == \
        ("0xc57a963869fc48d4", 4, 2, [], ["simnode0", "simnode1"])


def test_sockets_within_one_host_are_still_named_so():
    """4 processes of one host with P2P and SHM off: NCCL counts 4 nodes, the host names say one host."""
    out = explain_logs([LOGS / "h100-one-host-sockets"])
    assert not any(line.startswith("# Missing") for line in out)
    assert any("TCP sockets between the GPUs of one host" in line for line in out), out


# ---- a subset of a multi-host job ----
def test_one_hosts_file_of_a_two_host_job_names_the_missing_ranks_and_concludes_only_what_it_shows():
    r = run_cli(["explain", str(ONE_HOST)], timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("# NCCL path of 2 process(es) on simnode0, NCCL 2.28.9 (from 1 file(s))\n"), out
    assert ("# Missing: the logs of rank(s) 2-3 of the 4 in communicator 0xc57a963869fc48d4; read: rank(s) 0-1, on "
            "simnode0; NCCL counts 2 nodes in it, these logs come from 1 host(s)") in out
    assert "connections among the missing ranks are not in it" in out
    assert "between the GPUs of one host" not in out and "between hosts" not in out
    assert "TCP sockets to rank(s) 2, 3, whose logs were not read (their host is unknown)" in out
    assert "the path is the expected one" not in out
    # the other host's files given too: the job is whole again, and the sockets run between hosts
    both = run_cli(["explain", str(ONE_HOST)] + [str(f) for f in sorted(WHOLE.glob("*simnode1*"))], timeout=60)
    assert both.returncode == 0 and "# Missing" not in both.stdout and "TCP sockets between hosts" in both.stdout, \
        both.stdout + both.stderr
    assert "of 4 process(es) on simnode0, simnode1" in both.stdout


def test_a_subset_without_a_network_peer_still_names_what_is_missing():
    """One process of a one-host job: ranks missing, no node count to add (nNodes 1)."""
    out = explain_logs([LOGS / "h100-one-host-default" / "nccl.vm.1808.log"])
    assert out[1] == "# Missing: the logs of rank(s) 0, 2-3 of the 4 in communicator 0x54e66e8e1f76025d; read: rank(s) 1, on vm"
    assert "the path is the expected one" not in " ".join(out)


def test_a_subset_is_found_where_the_log_names_no_communicator_id(tmp_path):
    """NCCL before the commId in `Init COMPLETE`: the communicator is known by its size."""
    import re

    (tmp_path / "node0.out").write_text(re.sub(r"commId 0x[0-9a-f]+ ", "", ONE_HOST.read_text()))
    out = explain_logs([tmp_path])
    assert out[1].startswith("# Missing: the logs of rank(s) 2-3 of the 4 in its communicator (the log names no id); "
                             "read: rank(s) 0-1, on simnode0"), out


def test_a_process_found_in_two_files_is_read_once():
    out = explain_logs([ONE_HOST, WHOLE])
    assert out[0] == "# 2 process(es) appear in more than one file: each is read once"
    assert out[1].startswith("# NCCL path of 4 process(es)") and not any(line.startswith("# Missing") for line in out)


def test_a_rank_logged_by_two_processes_is_named(tmp_path):
    """The same communicator twice (a fixed NCCL_COMM_ID gives two runs one commId): warned, not silently merged."""
    for f in WHOLE.iterdir():
        shutil.copy(f, tmp_path / f.name)
    again = WHOLE / "nccl.simnode0.996.log"
    (tmp_path / "nccl.simnode0.4242.log").write_text(again.read_text().replace("simnode0:996:", "simnode0:4242:"))
    out = explain_logs([tmp_path])
    assert ("# Rank 0 of communicator 0xc57a963869fc48d4 was logged by 2 processes (simnode0:4242, simnode0:996): "
            "these files hold more than one run of it (the same NCCL_COMM_ID?), merged here") in out, out
    assert not any("logged by" in line for line in explain_logs([WHOLE]))


def test_a_runs_merge_ties_peers_to_hosts_by_the_ranks_it_gathered():
    """A run's rank 0 merges one summary per rank (summary["rank"]): a peer whose communicator
    entry was not kept (another communicator read on its rank) is still placed on its host."""
    from ncclbench.topology.ncclpath import read_logs, to_summary
    from ncclbench.topology.pathexplain import causes
    from ncclbench.topology.pathview import Path

    order = {"996": 0, "998": 1, "995": 2, "997": 3}
    summaries = [to_summary(p, order[str(p.pid)]) for p in read_logs(sorted(WHOLE.iterdir()))]
    for s in summaries[1:]:
        s["comms"] = [dict(c, key=None) for c in s["comms"]]  # only rank 0's entry keeps its key
    assert causes(Path(summaries))[0].startswith("network Socket: TCP sockets between hosts;")
    assert "whose logs were not read" in causes(Path(summaries[:2]))[0]


# ---- separate jobs in one folder ----
@pytest.fixture
def four_jobs(tmp_path):
    """Four whole jobs' per-process files in one folder, as `NCCL_DEBUG_FILE=logs/nccl.%h.%p.log` leaves them
    after four runs (three of them on one host, `vm`)."""
    for case in JOBS:
        for f in (LOGS / case).iterdir():
            shutil.copy(f, tmp_path / f.name)
    return tmp_path


def test_separate_jobs_in_one_folder_are_explained_one_by_one(four_jobs):
    jobs = split_jobs(read_processes([four_jobs])[0])
    assert sorted(j.ids[0] for j in jobs) == sorted(JOBS.values()) and [len(j.processes) for j in jobs] == [4] * 4
    r = run_cli(["explain", str(four_jobs)], timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.splitlines()[0] == "# 4 separate jobs in 16 file(s) (no communicator in common): each is explained on its own"
    assert "16 process(es)" not in out and "# Missing" not in out and "logged by" not in out
    sections = {}
    for part in out.split("\n#\n")[1:]:
        head = part.splitlines()[0]
        assert head.startswith("# Job ") and "NCCL path of 4 process(es)" in head, head
        sections[head.split("communicator ")[1].split(":")[0]] = part
    assert set(sections) == set(JOBS.values())
    # each job's own path and cause, none of another's
    assert "SHM" in sections[JOBS["h100-one-host-p2p-disabled"]] and "NET/Socket" not in sections[JOBS["h100-one-host-p2p-disabled"]]
    assert "TCP sockets between the GPUs of one host" in sections[JOBS["h100-one-host-sockets"]]
    assert "TCP sockets between hosts" in sections[JOBS["h100-two-hosts-socket"]]
    assert "P2P/CUMEM" in sections[JOBS["h100-one-host-default"]] and "NET/" not in sections[JOBS["h100-one-host-default"]]
    assert "(from 4 file(s))" not in out and "(from nccl.vm.1807.log, nccl.vm.1808.log, nccl.vm.1809.log +1)" in out


def test_lines_that_name_no_communicator_id_are_a_group_of_their_own(tmp_path):
    shutil.copy(LOGS / "pasted" / "fragment.txt", tmp_path / "fragment.txt")
    for f in (LOGS / "two-hosts-ib").iterdir():
        shutil.copy(f, tmp_path / f.name)
    out = explain_logs([tmp_path])
    assert out[0].startswith("# 2 separate jobs") and out[2].startswith("# Job 1 of 2, communicator 0x77aa55cc33ee1100")
    at = out.index(next(line for line in out if line.startswith("# Job 2 of 2: NCCL path of 1 process(es)")))
    assert out[at + 1] == "# Their lines name no communicator id (no `Init COMPLETE ... commId` line): read as one group"


def test_a_process_that_logged_no_communicator_is_named_not_made_a_job(tmp_path):
    for f in WHOLE.iterdir():
        shutil.copy(f, tmp_path / f.name)
    (tmp_path / "launcher.log").write_text("simnode0:900:900 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
                                           "simnode0:900:900 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n")
    out = explain_logs([tmp_path])
    assert out[0] == "# 1 process(es) logged no communicator, nothing to explain: simnode0:900"
    assert out[1].startswith("# NCCL path of 4 process(es) on simnode0, simnode1") and "separate jobs" not in out[1]
    assert out[2:] == explain_logs([WHOLE])[1:], out


def test_split_communicators_share_a_key_across_processes():
    def process(rank, pid):
        return parse_text("\n".join(f"h:{pid}:{pid} [0] NCCL INFO {m}" for m in (
            f"comm 0xa{rank} rank {rank} nRanks 2 nNodes 1 localRanks 2 localRank {rank} MNNVL 0",
            f"ncclCommInitRankConfig comm 0xa{rank} rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x11 - Init COMPLETE",
            f"ncclCommSplit comm 0xb{rank} rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 parent 0xa{rank} splitCount 1 "
            f"color {rank} key 0 - Init COMPLETE")))[0]

    a, b = process(0, 7), process(1, 8)
    assert [c.key for c in a.comms] == ["0x11", "0x11/1.0"] and [c.key for c in b.comms] == ["0x11", "0x11/1.1"]
    (job,) = split_jobs([a, b])
    assert coverage(job).key == "0x11" and coverage(job).missing == []


# ---- what NCCL_DEBUG_SUBSYS left out ----
def test_a_log_without_init_and_net_says_the_network_could_not_be_read():
    out = explain_logs([NO_INIT])
    text = "\n".join(out)
    assert out[0] == "# NCCL path of 4 process(es) on simnode0, simnode1, NCCL 2.28.9 (from 4 file(s))"
    assert "# No INIT line: NCCL_DEBUG_SUBSYS left INIT out (or the log is a fragment)" in text
    assert ("# No NET line: NET was not logged, so the network transport (NET/IB, NET/Socket, a plugin's) could not be "
            "read (that no rank used the network does not follow)") in out
    assert "# No SHM line: SHM connections could not be read (SHM not logged, or none made)" in out
    assert "P2P/CUMEM" in text and "the path is the expected one" not in text
    assert out[-1] == "# No known cause of a lower number shows in the lines read; they are not the whole path (above)"


def test_net_lines_without_init_make_the_network_readable(tmp_path):
    """The same job under NCCL_DEBUG_SUBSYS=P2P,SHM,NET: its NET lines are there, so nothing is said of NET."""
    for f in WHOLE.iterdir():
        lines = [line for line in f.read_text().splitlines()
                 if any(s in line for s in ("NCCL version", " via P2P/", " via NET/", "NET/Socket : ", "Allocated shareable"))]
        (tmp_path / f.name).write_text("\n".join(lines) + "\n")
    out = explain_logs([tmp_path])
    assert any(line.startswith("# No INIT line") for line in out)
    assert not any(line.startswith("# No NET line") for line in out) and any(line.startswith("NET/Socket") for line in out)


def test_init_on_hides_no_connection_whatever_else_was_left_out(tmp_path):
    """NCCL prints each connection under INIT too: a log with INIT and without NET-only lines is whole."""
    for f in WHOLE.iterdir():
        lines = [line for line in f.read_text().splitlines()
                 if "GPU Direct RDMA" not in line and "NCCL_SOCKET_IFNAME set to" not in line]
        (tmp_path / f.name).write_text("\n".join(lines) + "\n")
    assert explain_logs([tmp_path]) == explain_logs([WHOLE])


def test_only_the_processes_without_init_are_named(tmp_path):
    for f in WHOLE.iterdir():
        shutil.copy(f, tmp_path / f.name)
    shutil.copy(NO_INIT / "nccl.simnode1.997.log", tmp_path / "nccl.simnode1.997.log")
    notes = subsystem_notes(read_processes([tmp_path])[0])
    assert notes[0].startswith("No INIT line in 1 of 4 processes (simnode1:997): "), notes


# ---- the command line and the old import path ----
def test_bad_input_is_refused(tmp_path):
    (tmp_path / "empty.log").write_text("nothing from NCCL here\n")
    for args in ([str(tmp_path / "missing")], [str(tmp_path / "empty.log")], [str(tmp_path / "nothing")]):
        if args[0].endswith("nothing"):
            os.mkdir(args[0])
        with pytest.raises(BadInput):
            explain_logs(args)


def test_the_api_module_still_hands_out_explain():
    from ncclbench.api import explain

    assert explain.explain_logs([WHOLE])[0].startswith("# NCCL path of 4 process(es)")
    path, files = explain.read_path([WHOLE])
    assert len(files) == 4 and path.label == "NET/Socket + P2P/CUMEM"
    assert callable(explain.explain_here) and callable(explain.report_lines) and explain.SWEEP
