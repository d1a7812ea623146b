"""The torch backend's -m grouping, without a GPU: a stand-in for torch.distributed
records what the backend calls. Inside op_group() the P2P collectives (gather, sendrecv,
hypercube) must issue their sends/receives straight into the open coalescing group
(batch_isend_irecv opens a group of its own, which cannot nest); outside it they go
through batch_isend_irecv as before."""

import contextlib
from types import SimpleNamespace

import torch

from ncclbench.backends.torch_dist import TorchBackend
from ncclbench.engine.timing import ALIGN_OPS, TimingSettings, measure


class FakeDist:
    def __init__(self):
        self.calls = []
        self.distributed_c10d = SimpleNamespace(_coalescing_manager=self._coalescing_manager)

    @contextlib.contextmanager
    def _coalescing_manager(self, group=None, device=None):
        self.calls.append(("group start", device.type))
        yield
        self.calls.append(("group end",))

    def P2POp(self, op, tensor, peer, group=None):  # noqa: N802 - torch's name
        return SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group)

    def isend(self, tensor, dst, group=None):
        self.calls.append(("send", dst))

    def irecv(self, tensor, src, group=None):
        self.calls.append(("recv", src))

    def batch_isend_irecv(self, ops):
        self.calls.append(("batch", [(("send" if p.op == self.isend else "recv"), p.peer) for p in ops]))
        return []


def backend(rank=0, n=4, gpu=True):
    b = object.__new__(TorchBackend)
    b.dist = FakeDist()
    b.device = SimpleNamespace(type="cuda" if gpu else "cpu")
    b.group, b.group_rank, b.group_size = None, rank, n
    b.torch = SimpleNamespace(cuda=SimpleNamespace(is_current_stream_capturing=lambda: False))  # hypercube's own-chunk copy
    return b


def test_sendrecv_goes_through_batch_isend_irecv_outside_a_group():
    b = backend(rank=1)
    b.sendrecv(torch.zeros(4), torch.zeros(4))
    assert b.dist.calls == [("batch", [("send", 2), ("recv", 0)])]


def test_inside_op_group_p2p_ops_join_the_open_group_directly():
    b = backend(rank=1)
    factory, note = b.op_group("sendrecv")
    assert note is None
    with factory():
        b.sendrecv(torch.zeros(4), torch.zeros(4))
        b.gather(torch.zeros(4), torch.zeros(16), 1)  # root 1: sends to itself, receives from all
    assert b.dist.calls == [("group start", "cuda"), ("send", 2), ("recv", 0),
                            ("send", 1), ("recv", 0), ("recv", 1), ("recv", 2), ("recv", 3), ("group end",)]
    assert not b._grouping  # cleared on exit
    b.dist.calls.clear()
    b.sendrecv(torch.zeros(4), torch.zeros(4))
    assert b.dist.calls[0][0] == "batch"


def test_hypercube_steps_inside_the_group():
    b = backend(rank=0, n=4)
    factory, _ = b.op_group("hypercube")
    with factory():
        b.hypercube(torch.zeros(4), torch.zeros(16))
    assert b.dist.calls == [("group start", "cuda"), ("send", 1), ("recv", 1), ("send", 2), ("recv", 2),
                            ("group end",)]


def test_timing_engine_opens_one_group_per_iteration_with_agg():
    b = backend(rank=0, n=2)
    b.markers = lambda n: [None] * n
    b.mark = lambda m: 0.0
    b.elapsed = lambda a, c: 1e-6
    b.synchronize = b.barrier = lambda: None
    factory, _ = b.op_group("sendrecv")
    send, recv = torch.zeros(4), torch.zeros(4)
    measure(b, lambda _k: b.sendrecv(send, recv), TimingSettings(iters=3, agg=2), factory)
    kinds = [c[0] for c in b.dist.calls]
    # the untimed ops through batch_isend_irecv, then 3 groups of 2 direct send/recv pairs
    assert kinds == ["batch"] * (1 + ALIGN_OPS) + ["group start", "send", "recv", "send", "recv", "group end"] * 3


def test_gloo_cannot_group_and_says_why():
    factory, note = backend(gpu=False).op_group("all_reduce")
    assert factory is None and note == "gloo has no NCCL groups"
