"""NCCL's RAS as a second witness of a hang (engine.ras): its wire protocol against a server
that speaks it over a real socket, and what the verdict line says for each kind of report.
The reports follow the JSON NCCL 2.28.7+ prints (NCCL's docs/troubleshooting/ras.rst)."""

import json
import socket
import threading
import time

import pytest

from ncclbench.engine import hang, ras
from ncclbench.engine.watchdog import BoardEntry


def rank(r, pid, counts=5, host="10.0.0.1"):
    return {"rank": r, "host": host, "pid": pid, "cuda_dev": r, "nvml_dev": r,
            "status": {"init_state": 0, "async_error": 0, "finalize_called": False},
            "collective_counts": {"Broadcast": 0, "AllReduce": counts}}


def report(ranks, missing=(), version="2.28.9"):
    return {"nccl_version": version, "communicators_count": 1,
            "communicators": [{"hash": "0xae94", "size": len(ranks) + len(missing), "ranks": list(ranks),
                               "missing_ranks": list(missing)}],
            "ras": {"collection_time_sec": 1.0, "timeouts_count": len(missing)}}


class FakeRas:
    """A listener speaking RAS's client protocol: handshake lines answered in turn, then
    `body` after STATUS and the connection closed. `refuse_format`: answer SET FORMAT as an
    older NCCL does; `stall_s`: wait that long before the body; `port`: bind that port
    beside another listener (SO_REUSEPORT, as every NCCL process of a host does)."""

    def __init__(self, body: str, refuse_format=False, stall_s=0.0, port=0, silent=False):
        self.body, self.refuse_format, self.stall_s = body, refuse_format, stall_s
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.addr = self.sock.getsockname()
        self.heard: list[str] = []
        if not silent:  # a stopped process: the kernel queues connections nobody accepts
            threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn):
        try:
            self._answer(conn)
        except OSError:  # a greeting the client closed once another connection answered
            pass

    def _answer(self, conn):
        with conn, conn.makefile("rwb") as f:
            for line in f:
                text = line.decode().strip()
                self.heard.append(text)
                if text.startswith("CLIENT PROTOCOL"):
                    f.write(b"SERVER PROTOCOL 2\n")
                elif text.startswith("TIMEOUT"):
                    f.write(b"OK\n")
                elif text.startswith("SET FORMAT"):
                    f.write(b"ERROR: unknown command\n" if self.refuse_format else b"OK\n")
                elif text == "STATUS":
                    time.sleep(self.stall_s)
                    f.write(self.body.encode())
                    f.flush()
                    break
                f.flush()

    def close(self):
        self.sock.close()


def test_the_client_speaks_rass_protocol_and_reads_the_report_to_its_end():
    body = json.dumps(report([rank(0, 100)], [{"rank": 1, "host": "10.0.0.2", "pid": 101,
                                               "status": {"unresponsive": True, "considered_dead": False}}]))
    server = FakeRas(body)
    doc = ras.query(server.addr)
    # every connection greets; the one asked goes on to its report
    assert [h for h in server.heard if h != "CLIENT PROTOCOL 2"] == ["TIMEOUT 1", "SET FORMAT json", "STATUS"]
    assert doc["communicators"][0]["missing_ranks"][0]["pid"] == 101
    server.close()


def test_an_nccl_without_json_or_without_an_answer_gives_a_reason_in_time():
    old = FakeRas("Job summary\n", refuse_format=True)
    with pytest.raises(ValueError, match="set answered 'ERROR"):
        ras.query(old.addr)
    slow = FakeRas("{}", stall_s=10)
    began = time.monotonic()
    text = ras.Witness(deadline_s=1.0, addr=slow.addr).text({})
    assert time.monotonic() - began < 2.5 and text.startswith("NCCL RAS at 127.0.0.1:") and "no report" in text
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    text = ras.Witness(addr=("127.0.0.1", port)).text({})
    assert "no report (ConnectionRefusedError" in text, text
    old.close(), slow.close()


def test_what_ras_saw_in_one_clause():
    pids = {100: [0], 101: [1], 102: [2]}
    frozen = report([rank(0, 100), rank(2, 102)], [{"rank": 1, "host": "10.0.0.2", "pid": 101,
                                                     "status": {"unresponsive": True, "considered_dead": False}}])
    assert ras.summary(frozen, pids) == "NCCL RAS (2.28.9, a second witness): no answer from rank 1 = pid 101 on 10.0.0.2"
    dead = report([rank(0, 100)], [{"rank": 1, "host": "h", "pid": 101, "status": {"considered_dead": True}}])
    assert ras.summary(dead, pids).endswith("no answer from rank 1 = pid 101 on h (considered dead)")
    behind = report([rank(0, 100, 9), rank(1, 101, 7), rank(2, 102, 9)])
    assert ras.summary(behind, pids).endswith("fewer collectives launched by rank 1 = pid 101 on 10.0.0.1 (7 against 9)")
    # rank 3 silent, rank 0 one launch short of 1 and 2: seen with a frozen host across 4 hosts
    pids4 = {**pids, 103: [3]}
    waited = report([rank(0, 100, 1076), rank(1, 101, 1077), rank(2, 102, 1077)],
                    [{"rank": 3, "host": "h3", "pid": 103, "status": {"unresponsive": True}}])
    assert ras.summary(waited, pids4).endswith(
        "no answer from rank 3 = pid 103 on h3; one collective fewer launched by rank 0 = pid 100 on 10.0.0.1 "
        "(1076 against 1077), as ranks waiting for a silent one can be")
    # a second communicator with nobody silent: one short there is plainly fewer
    other = report([rank(0, 100, 8), rank(1, 101, 9)])["communicators"][0]
    both = dict(waited, communicators=[waited["communicators"][0], other])
    assert ras.summary(both, pids4).endswith(
        "no answer from rank 3 = pid 103 on h3; fewer collectives launched by rank 0 = pid 100 on 10.0.0.1 (8 against 9)"
        "; one collective fewer launched by rank 0 = pid 100 on 10.0.0.1 (1076 against 1077), as ranks waiting for a "
        "silent one can be")
    waited["communicators"][0]["ranks"][0]["collective_counts"] = {"AllReduce": 1075}  # two short: behind
    assert "; fewer collectives launched by rank 0 = pid 100 on 10.0.0.1 (1075 against 1077)" in ras.summary(waited, pids4)
    blind = report([rank(0, 100), rank(1, 101), rank(2, 102)])
    assert "every rank answered and launched as many collectives as the others: it sees no hang" in ras.summary(blind, pids)
    other_job = report([rank(0, 900), rank(1, 901)])
    assert ras.summary(other_job, pids).endswith("none of this run's processes in its report")
    # a pid RAS names that is none of this run's board: no rank number is made up for it
    stranger = report([rank(0, 100)], [{"rank": 1, "host": "h", "pid": 555, "status": {"unresponsive": True}}])
    assert ras.summary(stranger, pids).endswith("no answer from pid 555 on h")
    # reachable but not in that communicator's data (init, teardown): not called silent
    absent = report([rank(0, 100)], [{"rank": 1, "host": "h", "pid": 101, "status": {"unresponsive": False}}])
    assert "no data from rank 1 = pid 101 on h (it answers; not a member" in ras.summary(absent, pids)
    failing = report([rank(0, 100), dict(rank(1, 101), status={"async_error": 6, "abort_flag": True})])
    assert ras.summary(failing, pids).endswith("an error reported by rank 1 = pid 101 on 10.0.0.1 (NCCL error 6)")


def test_a_process_id_on_two_hosts_is_no_rank_of_its_own():
    """Containers: one pid on every host. RAS names hosts by address, the board by name, so
    a pid held by two ranks gives no rank number, and the two processes stay apart."""
    pids = {57: [0, 1]}
    stopped = report([rank(1, 57, host="10.0.0.2")], [{"rank": 0, "host": "10.0.0.1", "pid": 57,
                                                       "status": {"unresponsive": True}}])
    assert ras.summary(stopped, pids).endswith("no answer from pid 57 on 10.0.0.1")
    counts = report([rank(0, 57, 4, host="10.0.0.1"), rank(1, 57, 5, host="10.0.0.2")])
    assert ras.summary(counts, pids).endswith("fewer collectives launched by pid 57 on 10.0.0.1 (4 against 5)")
    two_unknown = report([rank(0, 100)], [{"rank": r, "host": "unknown", "pid": -1, "status": {"unresponsive": True}}
                                          for r in (1, 2)])
    assert ras.summary(two_unknown, {100: [0], -1: []}).count("pid -1 on unknown") == 2


def test_a_report_of_a_shape_not_foreseen_is_said_so_never_raised():
    for body in ("[1, 2]", json.dumps(report([rank(0, 100), None])),
                 json.dumps(report([dict(rank(0, 100), collective_counts={"AllReduce": {"count": 5}})])),
                 json.dumps({"communicators": [{"ranks": [{"pid": [1]}]}]})):
        server = FakeRas(body)
        text = ras.Witness(addr=server.addr).text({100: [0]})
        assert text.startswith(("NCCL RAS (", "NCCL RAS at")) and "\n" not in text, text
        server.close()


def test_a_trickling_or_endless_answer_ends_at_the_deadline():
    class Trickle(FakeRas):
        def _answer(self, conn):
            conn.recv(100)
            conn.sendall(b"SERVER PROTOCOL 2\n")
            for _ in range(400):
                conn.sendall(b"O")
                time.sleep(0.03)
    server = Trickle("")
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        ras.query(server.addr, deadline_s=1.0, tries=1)
    assert time.monotonic() - began < 1.5
    server.close()


def test_the_comma_repair_is_linear():
    one = REPORT_2_28_9
    many = one.replace('"missing_ranks": [', '"missing_ranks": [' + ",".join(
        ['{"rank": %d, "pid": %d, "nvml_dev": 1\n "status": {"unresponsive": true}}' % (k, 1000 + k)
         for k in range(3000)]) + ",", 1)
    began = time.monotonic()
    doc = ras.parse(many)
    assert len(doc["communicators"][0]["missing_ranks"]) == 3001
    assert time.monotonic() - began < 1.0


def test_a_subgroups_clause_numbers_ranks_as_the_line_does():
    doc = report([rank(0, 100)], [{"rank": 1, "host": "h", "pid": 101, "status": {"unresponsive": True}}])
    assert ras.summary(doc, {100: [0], 101: [1]}, name=lambda r: [4, 5][r]).endswith("no answer from rank 5 = pid 101 on h")


def test_the_address_follows_nccl_ras_addr():
    assert ras.address({}) == ("localhost", 28028)
    assert ras.address({"NCCL_RAS_ADDR": "127.0.0.1:29000"}) == ("127.0.0.1", 29000)
    assert ras.address({"NCCL_RAS_ADDR": "[::1]:29001"}) == ("::1", 29001)
    assert ras.address({"NCCL_RAS_ADDR": "nonsense"}) == ("localhost", 28028)


def test_the_verdict_carries_ras_after_its_own_clauses_and_names_no_culprit_by_it(monkeypatch):
    """The census asks RAS (NCCL runs) while the witnesses come in; its clause comes last
    and never counts as a culprit of the line (culprits_in reads the verdict's own)."""
    body = json.dumps(report([rank(0, 100), rank(2, 102)], [{"rank": 1, "host": "h0", "pid": 101,
                                                              "status": {"unresponsive": True}}]))
    server = FakeRas(body)
    monkeypatch.setenv("NCCL_RAS_ADDR", f"{server.addr[0]}:{server.addr[1]}")

    class Board:
        rank, nranks, store = 0, 3, None

        def entries(self, store=None):
            return {r: BoardEntry(7, 100 + r, "h0", "all_reduce at 128 B") for r in range(3)}

    census = hang.Census(Board(), 7, "all_reduce at 128 B", "p/", ras=True)
    census.gather = lambda wait_s=hang.GATHER_S: (census.post(), hang.decide(
        3, 7, "w", census.entries, {r: hang.Witness(r, 7, "w") for r in (0, 2)}, {1: "T"}))[1]
    verdict = census.gather_within()
    text = verdict.text()
    assert text.startswith("rank 1 (pid 101) on h0 is stopped")
    assert text.endswith("; NCCL RAS (2.28.9, a second witness): no answer from rank 1 = pid 101 on h0"), text
    assert hang.culprits_in("timeout: w did not finish within 5 s (-T): " + text) == [1]
    server.close()
    plain = hang.Census(Board(), 7, "w", "p/")  # gloo: nothing asked
    plain.gather = lambda wait_s=hang.GATHER_S: hang.decide(3, 7, "w", {}, {}, {})
    assert plain.gather_within().second is None


def test_a_stopped_process_holding_the_port_beside_a_live_one_is_passed_by():
    """Every NCCL process of a host listens on the port (SO_REUSEPORT); a stopped one takes
    connections into its queue and answers none. Several greetings at once reach the live one."""
    body = json.dumps(report([rank(0, 100)]))
    silent = FakeRas("", silent=True)
    live = FakeRas(body, port=silent.addr[1])
    for _ in range(5):
        assert ras.query(silent.addr, tries=16)["communicators"][0]["ranks"][0]["pid"] == 100
    only_silent = FakeRas("", silent=True)
    with pytest.raises(TimeoutError, match="none of 4 connections answered"):
        ras.query(only_silent.addr, deadline_s=0.5, tries=4)
    silent.close(), live.close(), only_silent.close()


# a missing rank as NCCL 2.28.7-2.28.9 print it: no comma after "nvml_dev" (src/ras/client_support.cc)
REPORT_2_28_9 = """{
  "nccl_version": "2.28.9",
  "communicators_count": 1,
  "communicators": [
    {
      "hash": "0x1",
      "size": 2,
      "ranks": [
        {
          "rank": 0,
          "pid": 100,
          "collective_counts": {
            "AllReduce": 12
          }
        }
      ],
      "missing_ranks": [
        {
          "rank": 1,
          "host": "198.18.0.2",
          "pid": 101,
          "cuda_dev": 0,
          "nvml_dev": 1
          "status": {
            "unresponsive": true,
            "considered_dead": false
          }
        }
      ]
    }
  ],
  "ras": {
    "collection_time_sec": 1.002,
    "timeouts_count": 1
  }
}
"""


def test_the_missing_comma_of_nccl_2_28_9_is_put_back():
    with pytest.raises(ValueError):
        json.loads(REPORT_2_28_9)
    doc = ras.parse(REPORT_2_28_9)
    assert doc["communicators"][0]["missing_ranks"][0]["status"]["unresponsive"] is True
    assert ras.summary(doc, {100: [0], 101: [1]}).endswith("no answer from rank 1 = pid 101 on 198.18.0.2")
    with pytest.raises(ValueError):
        ras.parse("Job summary\n===========\n")
