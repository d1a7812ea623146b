"""The CuPy backend's grouped send/recv collectives, without a GPU: NCCL itself cannot
exist here, so a recording stand-in takes the calls. Checks the order nccl-tests uses
(alltoall: every send, then every receive; alltoallv: per peer, send then receive, empty
parts skipped) and that the pre-bound eager form issues exactly the calls of the plain one."""

import pytest
import torch

from ncclbench.backends.cupy_nccl import CupyBackend
from ncclbench.engine.collectives import lookup
from ncclbench.engine.traffic import Traffic


class Recorder:
    def __init__(self):
        self.calls = []

    def groupStart(self):  # noqa: N802 - CuPy's names
        self.calls.append(("start",))

    def groupEnd(self):  # noqa: N802
        self.calls.append(("end",))

    def send(self, ptr, count, dtype, peer, stream):
        self.calls.append(("send", ptr, count, dtype, peer, stream))

    def recv(self, ptr, count, dtype, peer, stream):
        self.calls.append(("recv", ptr, count, dtype, peer, stream))


def backend(rank, n):
    b = object.__new__(CupyBackend)
    rec = Recorder()
    b.nccl = b.comm = rec
    b.group_rank, b.group_size = rank, n
    b._types = {torch.float32: 7}
    b._stream_handle = 1234
    return b, rec


def run_both(name, rank, n, send, recv, root=0, layout=None):
    coll = lookup(name)
    b, rec = backend(rank, n)
    coll.call(b, send, recv, "sum", root, layout)
    plain = list(rec.calls)
    rec.calls.clear()
    bound = b.bind(coll, send, recv, "sum", root, layout)
    bound()
    bound()
    return plain, rec.calls


def test_alltoall_sends_all_then_receives_all_and_bound_matches():
    send, recv = torch.zeros(12), torch.zeros(12)
    plain, bound = run_both("alltoall", 1, 3, send, recv)
    s, r = send.data_ptr(), recv.data_ptr()
    assert plain == [("start",)] + [("send", s + 16 * p, 4, 7, p, 1234) for p in range(3)] \
        + [("recv", r + 16 * p, 4, 7, p, 1234) for p in range(3)] + [("end",)]
    assert bound == plain * 2


@pytest.mark.parametrize("rank", [0, 2])
def test_gather_and_scatter_root_talks_to_everyone_others_to_root(rank):
    small, big = torch.zeros(4), torch.zeros(12)
    plain, bound = run_both("gather", rank, 3, small, big, root=0)
    peers = [c[4] for c in plain if c[0] == "recv"]
    assert [c[4] for c in plain if c[0] == "send"] == [0]
    assert peers == ([0, 1, 2] if rank == 0 else [])
    assert bound == plain * 2
    plain, bound = run_both("scatter", rank, 3, big, small, root=0)
    assert [c[4] for c in plain if c[0] == "send"] == ([0, 1, 2] if rank == 0 else [])
    assert [c[4] for c in plain if c[0] == "recv"] == [0]
    assert bound == plain * 2


def test_sendrecv_ring_neighbours():
    plain, bound = run_both("sendrecv", 0, 4, torch.zeros(8), torch.zeros(8))
    assert [(c[0], c[4]) for c in plain[1:-1]] == [("send", 1), ("recv", 3)]
    assert bound == plain * 2


def test_alltoallv_per_peer_order_skips_empty_parts_and_bound_matches():
    coll = lookup("alltoallv")
    lay = coll.layout(256, 4, 3, Traffic(spread=1.0))
    me = 1
    send, recv = torch.zeros(lay.send_count), torch.zeros(lay.recv_count)
    plain, bound = run_both("alltoallv", me, 3, send, recv, layout=lay)
    expect, s, r = [], send.data_ptr(), recv.data_ptr()
    for peer, (out, into) in enumerate(zip(lay.sends(me), lay.receives(me))):
        if out:
            expect.append(("send", s, out, 7, peer, 1234))
            s += 4 * out
        if into:
            expect.append(("recv", r, into, 7, peer, 1234))
            r += 4 * into
    assert 0 in lay.sends(me)  # spread 1 sends nothing to self: a skipped part is exercised
    assert plain == [("start",)] + expect + [("end",)]
    assert bound == plain * 2


def test_agg_group_encloses_each_iterations_grouped_ops():
    """-m: op_group() opens one NCCL group; the collectives' own groups nest inside it."""
    b, rec = backend(0, 2)
    factory, note = b.op_group("sendrecv")
    assert note is None
    bound = b.bind(lookup("sendrecv"), torch.zeros(4), torch.zeros(4), "sum", 0, None)
    with factory():
        bound()
        bound()
    kinds = [c[0] for c in rec.calls]
    assert kinds == ["start", "start", "send", "recv", "end", "start", "send", "recv", "end", "end"]
