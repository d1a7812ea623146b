"""Direct NCCL calls through CuPy (`cupy.cuda.nccl`): no PyTorch dispatcher in the
timed path, so small-message times show NCCL rather than launch overhead.

Memory, streams and events stay PyTorch's (torch tensors' pointers go to NCCL); the
NCCL unique id travels over the gloo process group that torch's rendezvous created,
so no MPI is needed. alltoall, gather, scatter and sendrecv are grouped send/recv, the
way nccl-tests builds them."""

from __future__ import annotations

import functools

from ncclbench.backends.common import hypercube_schedule, process_group_store, process_group_timeout
from ncclbench.backends.torch_dist import TorchBackend, setup_gpu
from ncclbench.dtypes import premul_scalar
from ncclbench.errors import PlanError

# ncclDataType_t and ncclRedOp_t values (nccl.h); passed as ints so that types newer
# than CuPy's constants (bfloat16, fp8) still work with a new enough libnccl.
NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
              "half": 6, "float": 7, "double": 8, "bfloat16": 9, "f8e4m3": 10, "f8e5m2": 11}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}  # mulsum: made per type, see premul_sum_op
_SCALAR_HOST_IMMEDIATE = 1  # ncclScalarResidence_t: the factor is read from host memory at creation
_TORCH_TO_NAME = {"torch.int8": "int8", "torch.uint8": "uint8", "torch.int32": "int32",
                  "torch.uint32": "uint32", "torch.int64": "int64", "torch.uint64": "uint64",
                  "torch.float16": "half", "torch.float32": "float", "torch.float64": "double",
                  "torch.bfloat16": "bfloat16", "torch.float8_e4m3fn": "f8e4m3", "torch.float8_e5m2": "f8e5m2"}


def _nccl_type_table(torch) -> dict:
    """torch dtype object -> ncclDataType_t, for a lookup without string building per call."""
    table = {}
    for key, name in _TORCH_TO_NAME.items():
        dt = getattr(torch, key.split(".", 1)[1], None)
        if dt is not None:
            table[dt] = NCCL_TYPES[name]
    return table


@functools.lru_cache(maxsize=1)
def _loaded_libnccl():
    """The libnccl.so.2 already in this process (the one CuPy's calls go to; RTLD_NOLOAD
    never loads a second copy). CuPy has no binding for ncclRedOpCreatePreMulSum."""
    import ctypes
    import os

    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise PlanError(f"-o mulsum on backend cupy needs libnccl.so.2 loaded by CuPy ({exc})") from None
    lib.ncclRedOpCreatePreMulSum.restype = lib.ncclRedOpDestroy.restype = ctypes.c_int
    lib.ncclRedOpCreatePreMulSum.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int,
                                             ctypes.c_int, ctypes.c_void_p]
    lib.ncclRedOpDestroy.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


def premul_sum_op(comm, nccl_type: int, factor: bytes) -> int:
    """ncclRedOpCreatePreMulSum on CuPy communicator `comm` for one datatype: the
    ncclRedOp_t value to pass to its reducing calls. `factor` is the scalar's bytes in
    that datatype. Destroy with destroy_op before the communicator."""
    import ctypes

    lib, op = _loaded_libnccl(), ctypes.c_int(-1)
    rc = lib.ncclRedOpCreatePreMulSum(ctypes.byref(op), ctypes.create_string_buffer(factor, len(factor)),
                                      nccl_type, _SCALAR_HOST_IMMEDIATE, ctypes.c_void_p(comm.comm))
    if rc:
        raise RuntimeError(f"ncclRedOpCreatePreMulSum: {lib.ncclGetErrorString(rc).decode()}")
    return op.value


def destroy_op(comm, op: int) -> None:
    import ctypes

    _loaded_libnccl().ncclRedOpDestroy(op, ctypes.c_void_p(comm.comm))


def factor_bytes(torch, dtype, factor: int) -> bytes:
    """`factor` as one element of torch dtype `dtype`, in bytes."""
    from ncclbench.dtypes import to_dtype
    from ncclbench.dtypes import DTYPES

    value = to_dtype(torch.tensor([factor]), DTYPES[_TORCH_TO_NAME[str(dtype)]])
    return bytes(value.view(torch.uint8).tolist())


def import_nccl():
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001 - ImportError or a CUDA mismatch inside cupy
        raise PlanError("backend cupy needs CuPy with NCCL: pip install 'ncclbench[cuda12]' or "
                        f"'ncclbench[cuda13]' ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    if not getattr(nccl, "available", True):
        raise PlanError("CuPy was built without NCCL support; install cupy-cuda12x / cupy-cuda13x wheels")
    return nccl


class CupyBackend(TorchBackend):
    @staticmethod
    def prepare_device(name: str, launch, stream_null: bool = False):
        import torch

        import_nccl()
        device = setup_gpu(torch, launch, "cupy", stream_null)
        import cupy

        cupy.cuda.Device(device.index).use()
        return device

    def renew_communicator(self, channels: int | None = None) -> None:
        """tune's fresh communicators are torch's process groups; this backend's NCCL
        communicator is made once (tune refuses --backend cupy before any rank starts)."""
        raise PlanError("the CuPy backend does not renew its communicator: use --backend nccl")

    def __init__(self, name: str, launch, timeout_s: float, stream_null: bool = False, device=None, store=None):
        import cupy
        import torch
        import torch.distributed as dist

        self.nccl = import_nccl()
        self.torch, self.dist, self.name = torch, dist, "cupy"
        self.rank, self.nranks, self.local_rank = launch.rank, launch.world_size, launch.local_rank
        self.device = device if device is not None else self.prepare_device(name, launch, stream_null)
        dist.init_process_group("gloo", rank=self.rank, world_size=self.nranks,
                                timeout=process_group_timeout(timeout_s), **process_group_store(store))
        self.control = None
        self.group = None
        self.group_rank, self.group_size, self.group_index = self.rank, self.nranks, 0
        self._mem_start = torch.cuda.mem_get_info(self.device)
        self.comm = self._make_comm(self.rank, self.nranks)
        self._mem_after_init = torch.cuda.mem_get_info(self.device)
        self._types = _nccl_type_table(torch)
        # The stream handle is looked up once: torch.cuda.current_stream() builds a Python
        # object per call, several microseconds of host time per op. Capture resets it.
        self._stream_handle = torch.cuda.current_stream(self.device).cuda_stream
        self._event_record, self._event_elapsed = cupy.cuda.runtime.eventRecord, cupy.cuda.runtime.eventElapsedTime

    def _make_comm(self, rank: int, nranks: int):
        uid = [self.nccl.get_unique_id() if rank == 0 else None]
        self.dist.broadcast_object_list(uid, src=0)
        return self.nccl.NcclCommunicator(nranks, uid[0], rank)

    def use_groups(self, groups: list[list[int]]) -> None:
        """One NCCL communicator per group (--split); the first rank of each group makes
        its unique id and everyone learns them over the world's gloo group."""
        if len(groups) == 1:
            return
        index = next(i for i, ranks in enumerate(groups) if self.rank in ranks)
        ranks = groups[index]
        mine = self.nccl.get_unique_id() if ranks[0] == self.rank else None
        ids = self.all_gather_object(mine)
        self._world_comm = self.comm
        self.group_index, self.group_rank, self.group_size = index, ranks.index(self.rank), len(ranks)
        self.comm = self.nccl.NcclCommunicator(len(ranks), ids[ranks[0]], self.group_rank)

    def library_version(self) -> tuple[int, str]:
        code = self.nccl.get_version()
        return code, f"NCCL {code // 10000}.{code // 100 % 100}.{code % 100} via CuPy"

    # ---- collectives on raw pointers, on torch's current stream -------------------------
    def _stream(self) -> int:
        if self._stream_handle is not None:
            return self._stream_handle
        return self.torch.cuda.current_stream(self.device).cuda_stream

    # ---- timing marks: CUDA events through CuPy's runtime binding (recording a torch
    # event costs ~2.4 us of host time on these hosts, CuPy's ~0.6 us: it shows in -I)
    def markers(self, n: int) -> list:
        import cupy

        stream = self._stream()
        events = [cupy.cuda.Event() for _ in range(n)]  # created now, destroyed with the objects
        for event in events:
            self._event_record(event.ptr, stream)
        return events

    def mark(self, marker):
        self._event_record(marker.ptr, self._stream())
        return marker

    def reached(self, mark) -> bool | None:
        if mark is None:
            return None
        import cupy

        with cupy.cuda.Device(self.device.index or 0):  # the asking thread's device: the rank's
            return bool(mark.done)  # cudaEventQuery, no wait

    def elapsed(self, start, end) -> float:
        return self._event_elapsed(start.ptr, end.ptr) / 1e3

    def _type(self, t) -> int:
        return self._types[t.dtype]

    def _redop(self, op: str, t) -> int:
        """ncclRedOp_t for `op` on tensors like `t`; mulsum's premul-sum op is made once
        per datatype and communicator, with this rank's factor."""
        if op != "mulsum":
            return NCCL_OPS[op]
        made = self.__dict__.setdefault("_premul", {})
        key = (id(self.comm), t.dtype)
        if key not in made:
            factor = factor_bytes(self.torch, t.dtype, premul_scalar(self.group_rank))
            made[key] = (premul_sum_op(self.comm, self._type(t), factor), self.comm)
        return made[key][0]

    def capture(self, issue_ops, empty_ok=False):
        # during capture the ops must go to the capture stream, whatever it is
        saved, self._stream_handle = self._stream_handle, None
        try:
            return super().capture(issue_ops, empty_ok)
        finally:
            self._stream_handle = saved

    def bind(self, coll, send, recv, op, root, layout):
        """Pre-resolved call for the eager loop: pointers, counts, types and the stream are
        fixed, so each timed op costs one Python call into CuPy (host time per op is what
        limits eager small-message times). The registry entry's call picks the collective,
        on the bound forms instead of on the backend."""
        return coll.call(_BoundCalls(self), send, recv, op, root, layout)

    # ---- collectives: each issues its bound form once ------------------------------------
    def all_reduce(self, send, recv, op):
        _BoundCalls(self).all_reduce(send, recv, op)()

    def broadcast(self, send, recv, root):
        _BoundCalls(self).broadcast(send, recv, root)()

    def reduce(self, send, recv, op, root):
        _BoundCalls(self).reduce(send, recv, op, root)()

    def all_gather(self, send, recv):
        _BoundCalls(self).all_gather(send, recv)()

    def reduce_scatter(self, send, recv, op):
        _BoundCalls(self).reduce_scatter(send, recv, op)()

    def alltoall(self, send, recv):
        _BoundCalls(self).alltoall(send, recv)()

    def gather(self, send, recv, root):
        _BoundCalls(self).gather(send, recv, root)()

    def scatter(self, send, recv, root):
        _BoundCalls(self).scatter(send, recv, root)()

    def alltoallv(self, send, recv, layout):
        _BoundCalls(self).alltoallv(send, recv, layout)()

    def sendrecv(self, send, recv):
        _BoundCalls(self).sendrecv(send, recv)()

    def _issue_group(self, parts, dtype, stream) -> None:
        self._bind_group(parts, dtype, stream)()

    def _bind_group(self, parts, dtype, stream):
        """One zero-argument call issuing `parts`, (is_send, pointer, count, peer) each, in
        order, between ncclGroupStart and ncclGroupEnd."""
        start, end = self.nccl.groupStart, self.nccl.groupEnd
        calls = [functools.partial(self.comm.send if is_send else self.comm.recv, ptr, count, dtype, peer, stream)
                 for is_send, ptr, count, peer in parts]

        def grouped():
            start()
            for call in calls:
                call()
            end()
        return grouped

    def op_group(self, coll_name: str):
        """-m: each iteration's ops between ncclGroupStart and ncclGroupEnd, as nccl-tests
        does (grouped collectives nest: NCCL merges nested groups into the outer one)."""
        group = _NcclGroup(self.nccl.groupStart, self.nccl.groupEnd)  # stateless: one serves every iteration
        return (lambda: group), None

    def hypercube(self, send, recv):
        n, me = self.group_size, self.group_rank
        chunk, item = recv.numel() // n, recv.element_size()
        own = recv[me * chunk:(me + 1) * chunk]
        if own.data_ptr() != send.data_ptr():
            self._copy(own, send)
        base, dtype = recv.data_ptr(), self._type(recv)
        for step, (peer, sent, got) in enumerate(hypercube_schedule(n, me)):
            width = (1 << step) * chunk
            self._issue_group([(True, base + sent * chunk * item, width, peer),
                               (False, base + got * chunk * item, width, peer)], dtype, self._stream())

    def prepare_registration(self, mode: int) -> str | None:
        if mode:
            return f"-R {mode}: CuPy has no binding for ncclCommRegister/ncclCommWindowRegister; buffers not registered"
        return None

    def abort(self) -> None:
        """The NCCL communicators (NcclCommunicator.abort: NCCL's kernels return and the
        communicator is freed, so that close() has nothing left to destroy). The gloo group
        that carries the host-side messages is left to fail with the dead peer's sockets."""
        if self.aborted:
            return
        self.aborted = True
        for name in ("comm", "_world_comm"):
            comm = getattr(self, name, None)
            if comm is not None and hasattr(comm, "abort"):
                try:
                    comm.abort()
                except Exception:  # noqa: BLE001 - best effort: the rank is leaving
                    pass

    def close(self):
        self.release_graphs()
        if self.aborted:  # the communicators are freed: their premul ops with them
            self.__dict__.pop("_premul", None)
            super().close()
            return
        for op, comm in self.__dict__.pop("_premul", {}).values():
            try:
                self.torch.cuda.synchronize(self.device)
                destroy_op(comm, op)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
        for name in ("comm", "_world_comm"):
            comm = getattr(self, name, None)
            setattr(self, name, None)
            if comm is not None:
                try:
                    self.torch.cuda.synchronize(self.device)
                    comm.destroy()
                except Exception:  # noqa: BLE001 - best effort at exit
                    pass
        super().close()


class _NcclGroup:
    """`with`: ncclGroupStart on entry, ncclGroupEnd on exit (a class, not a generator:
    the same instance is entered once per timed iteration)."""

    __slots__ = ("_start", "_end")

    def __init__(self, start, end):
        self._start, self._end = start, end

    def __enter__(self):
        self._start()

    def __exit__(self, *exc):
        self._end()
        return False


class _BoundCalls:
    """The backend's collectives, with the same methods and arguments, as zero-argument
    calls on fixed pointers, counts, types and stream. alltoall, gather, scatter, sendrecv
    and alltoallv are grouped send/recv, as nccl-tests builds them."""

    __slots__ = ("b",)

    def __init__(self, backend: CupyBackend):
        self.b = backend

    def all_reduce(self, send, recv, op):
        b = self.b
        return functools.partial(b.comm.allReduce, send.data_ptr(), recv.data_ptr(), recv.numel(), b._type(recv),
                                 b._redop(op, recv), b._stream())

    def broadcast(self, send, recv, root):
        b = self.b
        return functools.partial(b.comm.broadcast, send.data_ptr(), recv.data_ptr(), recv.numel(), b._type(recv),
                                 root, b._stream())

    def reduce(self, send, recv, op, root):
        b = self.b
        return functools.partial(b.comm.reduce, send.data_ptr(), recv.data_ptr(), recv.numel(), b._type(recv),
                                 b._redop(op, recv), root, b._stream())

    def all_gather(self, send, recv):
        b = self.b
        return functools.partial(b.comm.allGather, send.data_ptr(), recv.data_ptr(), send.numel(), b._type(send),
                                 b._stream())

    def reduce_scatter(self, send, recv, op):
        b = self.b
        return functools.partial(b.comm.reduceScatter, send.data_ptr(), recv.data_ptr(), recv.numel(),
                                 b._type(recv), b._redop(op, recv), b._stream())

    def _group(self, parts, recv):
        return self.b._bind_group(parts, self.b._type(recv), self.b._stream())

    def alltoall(self, send, recv):
        n, item, s, r = self.b.group_size, recv.element_size(), send.data_ptr(), recv.data_ptr()
        chunk = recv.numel() // n
        return self._group([(True, s + p * chunk * item, chunk, p) for p in range(n)]
                           + [(False, r + p * chunk * item, chunk, p) for p in range(n)], recv)

    def gather(self, send, recv, root):
        n, item, r = self.b.group_size, recv.element_size(), recv.data_ptr()
        chunk = send.numel()
        gets = [(False, r + p * chunk * item, chunk, p) for p in range(n)] if self.b.group_rank == root else []
        return self._group([(True, send.data_ptr(), chunk, root)] + gets, recv)

    def scatter(self, send, recv, root):
        n, item, s = self.b.group_size, recv.element_size(), send.data_ptr()
        chunk = recv.numel()
        puts = [(True, s + p * chunk * item, chunk, p) for p in range(n)] if self.b.group_rank == root else []
        return self._group(puts + [(False, recv.data_ptr(), chunk, root)], recv)

    def sendrecv(self, send, recv):
        n, me = self.b.group_size, self.b.group_rank
        return self._group([(True, send.data_ptr(), recv.numel(), (me + 1) % n),
                            (False, recv.data_ptr(), recv.numel(), (me - 1) % n)], recv)

    def alltoallv(self, send, recv, layout):
        """Per peer in rank order: its part out, ours in; empty parts skipped."""
        me, item, s, r = self.b.group_rank, recv.element_size(), send.data_ptr(), recv.data_ptr()
        parts = []
        for peer, (out, into) in enumerate(zip(layout.sends(me), layout.receives(me))):
            if out:
                parts.append((True, s, out, peer))
                s += out * item
            if into:
                parts.append((False, r, into, peer))
                r += into * item
        return self._group(parts, recv)

    def hypercube(self, send, recv):  # one group per step: nothing to gain from binding ahead
        return functools.partial(self.b.hypercube, send, recv)
