"""torch.distributed backend: NCCL on GPUs, gloo on CPUs.

torch.distributed has no out-of-place all_reduce, broadcast or reduce: for those the
engine runs the "out-of-place" column in place on the receive buffer (declared by their
registry entries' `in_place_only`, and said in the report header). What this backend
cannot run at all is declared in capabilities.py."""

from __future__ import annotations

import contextlib
import functools
import os
import time
import warnings

from ncclbench.backends.common import hypercube_schedule, process_group_store, process_group_timeout, world_group
from ncclbench.dtypes import premul_scalar
from ncclbench.errors import ExitCode, PlanError, first_line

_TORCH_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}


def group_backend_name(dist, group) -> str:
    """The engine backend for an existing process group: nccl when the group has NCCL and a
    GPU is usable (also for a "cpu:gloo,cuda:nccl" group), else gloo; PlanError for others."""
    import torch

    text = str(dist.get_backend(group)).lower()
    pg = group if group is not None else dist.GroupMember.WORLD
    for device in getattr(pg, "_device_types", []):  # a DeviceMesh's groups say "undefined" above
        try:
            text += f",{device.type}:{pg._get_backend(device).name().lower()}"
        except Exception:  # noqa: BLE001 - a torch without these: the name above is all there is
            pass
    if "nccl" in text and torch.cuda.is_available():
        return "nccl"
    if "gloo" in text:
        return "gloo"
    raise PlanError(f"the process group's backend is {text}: ncclbench measures nccl (on a GPU) and gloo groups")


def byte_copy(torch, dst, src) -> None:
    """dst <- src bit for bit with an elementwise kernel instead of a memcpy: the tensors
    (contiguous, equal byte size) are viewed as the widest integer type their size and
    offsets allow, and `add(src, 0)` in integers is an exact copy whatever they hold."""
    nbytes = dst.numel() * dst.element_size()
    a, b = dst.view(torch.uint8), src.view(torch.uint8)
    for width, kind in ((8, torch.int64), (4, torch.int32), (2, torch.int16)):
        if (nbytes % width == 0 and dst.storage_offset() * dst.element_size() % width == 0
                and src.storage_offset() * src.element_size() % width == 0):
            a, b = a.view(kind), b.view(kind)
            break
    torch.add(b, 0, out=a)


def gpu_for_rank(launch, visible: int) -> int:
    from ncclbench.launch.gpus import gpu_index_for_local_rank
    from ncclbench.launch.variables import LaunchEnvError

    try:
        return gpu_index_for_local_rank(launch, visible)
    except LaunchEnvError as exc:
        raise PlanError(str(exc), ExitCode.BAD_GPU_COUNT) from None


def setup_gpu(torch, launch, backend: str, stream_null: bool):
    """This rank's GPU, made current. Everything then runs on one non-blocking stream of
    our own, as nccl-tests does, rather than the legacy default stream that synchronizes
    with every other stream (-y 1 keeps the default stream)."""
    if not torch.cuda.is_available():
        raise PlanError(f"backend {backend} needs CUDA GPUs and none is visible; use --backend gloo",
                        ExitCode.BAD_GPU_COUNT)
    device = torch.device("cuda", gpu_for_rank(launch, torch.cuda.device_count()))
    torch.cuda.set_device(device)
    if not stream_null:
        torch.cuda.set_stream(torch.cuda.Stream(device))
    return device


HOLD_CLOCK_HZ = 2.0e9  # above the boost clock of H100/H200 (1.98 GHz): hold() never falls short


class TorchBackend:
    @staticmethod
    def prepare_device(name: str, launch, stream_null: bool = False):
        """This rank's device, made current (the part of the set-up that needs no peer)."""
        import torch

        return setup_gpu(torch, launch, name, stream_null) if name == "nccl" else torch.device("cpu")

    def __init__(self, name: str, launch, timeout_s: float, stream_null: bool = False, device=None, store=None):
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.dist = dist
        self.name = name
        self._timeout = process_group_timeout(timeout_s)
        self.rank = launch.rank
        self.nranks = launch.world_size
        self.local_rank = launch.local_rank
        timeout = process_group_timeout(timeout_s)
        self.device = device if device is not None else self.prepare_device(name, launch, stream_null)
        if name == "nccl":
            self._mem_start = torch.cuda.mem_get_info(self.device)
            # device_id: eager communicator creation, so the first timed op does not pay for
            # it and CUDA-graph capture works.
            dist.init_process_group("nccl", rank=self.rank, world_size=self.nranks,
                                    timeout=timeout, device_id=self.device, **process_group_store(store))
            self.control = dist.new_group(backend="gloo", timeout=timeout)
            self._mem_after_init = torch.cuda.mem_get_info(self.device)
        else:
            dist.init_process_group("gloo", rank=self.rank, world_size=self.nranks, timeout=timeout,
                                    **process_group_store(store))
            self.control = None  # the world group is already host-side
        self.group = None  # None = world; a split sets a subgroup
        self.group_rank = self.rank
        self.group_size = self.nranks
        self.group_index = 0
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._plant_slow()

    def _plant_slow(self) -> None:
        """A planted late rank (`slow`): its bound ops each wait for the device, then sleep."""
        from ncclbench.failpoints import failpoint

        bind = failpoint("backend.bind", self.bind, rank=self.rank, global_rank=self.dist.get_rank(),
                         synchronize=self.synchronize)
        if bind != self.bind:
            self.bind = bind

    adopted = False  # True: the process group is the caller's (adopt), never created or destroyed here

    @classmethod
    def adopt(cls, group=None) -> "TorchBackend":
        """A backend on an existing process group (the default one when None), for the Python
        API. Nothing is created or destroyed: no process group, no device or stream change
        (the caller runs the engine inside a stream context, see ncclbench.api.measure). Ranks, sizes
        and the host-side messages (all_gather_object, barrier) are the group's own.
        NCCL runs on the current CUDA device; gloo on the CPU."""
        import torch
        import torch.distributed as dist

        self = cls.__new__(cls)
        self.torch, self.dist, self.adopted = torch, dist, True
        self.name = group_backend_name(dist, group)
        self.group = None if group is None or group is dist.GroupMember.WORLD else group
        self.control = self.group
        self.rank = self.group_rank = dist.get_rank(group)
        self.nranks = self.group_size = dist.get_world_size(group)
        self.group_index = 0
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        if self.name == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self._mem_start = self._mem_after_init = torch.cuda.mem_get_info(self.device)
        else:
            self.device = torch.device("cpu")
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        self._plant_slow()
        return self

    def use_groups(self, groups: list[list[int]]) -> None:
        """Run the collectives inside this rank's group (--split). Every rank creates every
        group, in the same order, as torch requires."""
        if len(groups) == 1:
            return
        for index, ranks in enumerate(groups):
            group = self.dist.new_group(ranks)
            if self.rank in ranks:
                self.group, self.group_index = group, index
                self.group_rank, self.group_size = ranks.index(self.rank), len(ranks)

    def renew_communicator(self, channels: int | None = None) -> None:
        """Run the collectives on a fresh communicator over every rank (the one this made
        before is destroyed first). NCCL reads NCCL_ALGO and NCCL_PROTO from the environment
        at each communicator's init (src/graph/tuning.cc), so a caller sets them first.
        `channels`: the communicator's minCTAs = maxCTAs (ncclConfig_t), NCCL's channel
        limit for this communicator alone (NCCL_MIN/MAX_NCHANNELS are read once per process)."""
        previous = getattr(self, "_renewed", None)
        if previous is not None:
            self.group, self._renewed = None, None
            self.dist.destroy_process_group(previous)
        self._renewed = world_group(self.dist, self.name, self.nranks, self._timeout, self.device, channels)
        self.group = self._renewed

    def kept_communicator(self, key, channels: int | None = None) -> bool:
        """Run the collectives on the communicator kept under `key`, made now (under the
        environment as it is, as renew_communicator's) if there is none yet; kept until the
        process group ends. True when it was made now."""
        kept = self.__dict__.setdefault("_kept", {})
        made = key not in kept
        if made:
            kept[key] = world_group(self.dist, self.name, self.nranks, self._timeout, self.device, channels)
        self.group = kept[key]
        return made

    # ---- description -------------------------------------------------------------
    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    def timing_name(self) -> str:
        return "CUDA events" if self.is_gpu else "host clock"

    def library_version(self) -> tuple[int, str]:
        """(nccl-tests style code such as 22809, human text) of the communication library."""
        if not self.is_gpu:
            return 0, "gloo"
        v = self.torch.cuda.nccl.version()
        if isinstance(v, int):  # old torch: already a code
            code = v
            v = (v // 10000, v // 100 % 100, v % 100)
        else:
            code = v[0] * 10000 + v[1] * 100 + v[2]
        return code, "NCCL " + ".".join(str(x) for x in v[:3])

    def device_info(self) -> dict:
        if not self.is_gpu:
            return {"device": self.local_rank, "device_hex": "cpu", "device_info": "CPU (gloo)"}
        idx = self.device.index
        props = self.torch.cuda.get_device_properties(idx)
        bus = "unknown"
        if hasattr(props, "pci_bus_id"):
            bus = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{getattr(props, 'pci_device_id', 0):02x}"
        return {"device": idx, "device_hex": bus, "device_info": props.name}

    # ---- memory ------------------------------------------------------------------
    def alloc_bytes(self, nbytes: int):
        pool = getattr(self, "_pool", None)
        with self.torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
            return self.torch.empty(max(nbytes, 1), dtype=self.torch.uint8, device=self.device)

    def prepare_registration(self, mode: int) -> str | None:
        """-R 1: NCCL user-buffer registration, -R 2: symmetric window registration, of the
        benchmark buffers (allocated next from an NCCL memory pool). Returns a note for the
        header when the mode cannot be had (the run then goes on unregistered)."""
        self._register_mode = 0
        if mode == 0:
            return None
        if self.name != "nccl":
            return f"-R {mode}: buffer registration needs the nccl backend; buffers not registered"
        try:
            owner = self.group if self.adopted and self.group is not None else None
            nccl = (owner or self.dist.distributed_c10d._get_default_group())._get_backend(self.device)
            self._pool = self.torch.cuda.MemPool(nccl.mem_allocator)
            self._nccl_pg, self._register_mode = nccl, mode
        except Exception as exc:  # noqa: BLE001 - old torch/NCCL: say so, run unregistered
            self._pool = None
            return f"-R {mode}: this torch/NCCL has no NCCL memory pool ({first_line(exc, 160)}); buffers not registered"
        return None

    def register_buffers(self) -> str | None:
        """Register what was allocated from the pool; a note when it failed."""
        mode = getattr(self, "_register_mode", 0)
        if not mode:
            return None
        try:
            if mode == 2:
                self._nccl_pg.register_mem_pool(self._pool, symm=True)
            else:
                self._nccl_pg.register_mem_pool(self._pool)
            self._registered = True
        except TypeError:
            return "-R 2: this torch cannot register symmetric windows (register_mem_pool has no symm); not registered"
        except Exception as exc:  # noqa: BLE001
            return f"-R {mode}: registration failed ({first_line(exc, 160)}); buffers not registered"
        return None

    def deregister_buffers(self) -> None:
        if getattr(self, "_registered", False) and not self.aborted:
            try:
                self._nccl_pg.deregister_mem_pool(self._pool)
            except Exception:  # noqa: BLE001 - best effort at exit
                pass
            self._registered = False

    def memory_usage(self, peak: bool = False) -> dict:
        """MiB by what holds it (-M): the CUDA context, the communicator (device memory that
        disappeared while it was created), our buffers, and the peak of our allocations."""
        mib = 1 << 20
        if not self.is_gpu:
            import psutil

            return {"process RSS": psutil.Process().memory_info().rss / mib}
        torch = self.torch
        free0, total = self._mem_start
        free1, _ = self._mem_after_init
        if peak:
            free_now, _ = torch.cuda.mem_get_info(self.device)
            return {"peak allocated by ncclbench": torch.cuda.max_memory_allocated(self.device) / mib,
                    "device used at end": (total - free_now) / mib}
        if self.adopted:  # the communicator existed before us: its share is not known
            return {"context, communicator and others": (total - free0) / mib,
                    "user buffers": torch.cuda.memory_allocated(self.device) / mib}
        return {"context and others": (total - free0) / mib, "communicator": (free0 - free1) / mib,
                "user buffers": torch.cuda.memory_allocated(self.device) / mib}

    def free_memory(self) -> int | None:
        if not self.is_gpu:
            return None
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return free

    # ---- collectives (send/recv are typed 1-D views) -------------------------------
    def _op(self, op):
        # cached: this runs once per timed op, where every microsecond of host time shows
        cache = self.__dict__.setdefault("_op_cache", {})
        if op not in cache:
            if op == "mulsum":  # NCCL premul-sum with this rank's factor (a host scalar)
                cache[op] = self.dist._make_nccl_premul_sum(float(premul_scalar(self.group_rank)))
            else:
                cache[op] = getattr(self.dist.ReduceOp, _TORCH_OPS[op])
        return cache[op]

    def all_reduce(self, send, recv, op):
        self.dist.all_reduce(recv, op=self._op(op), group=self.group)

    def broadcast(self, send, recv, root):
        self.dist.broadcast(recv, src=self._global(root), group=self.group)

    def reduce(self, send, recv, op, root):
        self.dist.reduce(recv, dst=self._global(root), op=self._op(op), group=self.group)

    def all_gather(self, send, recv):
        self._all_gather(recv, send, group=self.group)

    def reduce_scatter(self, send, recv, op):
        self._reduce_scatter(recv, send, op=self._op(op), group=self.group)

    def alltoall(self, send, recv):
        self.dist.all_to_all_single(recv, send, group=self.group)

    def gather(self, send, recv, root):
        # As nccl-tests builds it: every rank sends to the root, the root receives from
        # every rank including itself, all in one NCCL group (batch_isend_irecv): dist.gather
        # and one-sided all_to_all_single lag nccl-tests (docs/design/gather-scatter-calls.md).
        # gloo cannot send to itself: there the one-sided all_to_all_single does it.
        if not self.is_gpu:
            n, chunk = self.group_size, send.numel()
            to_root = [chunk if p == root else 0 for p in range(n)]
            out, splits = (recv, [chunk] * n) if self.group_rank == root else (recv[:0], [0] * n)
            self.dist.all_to_all_single(out, send, splits, to_root, group=self.group)
            return
        ops = [self.dist.P2POp(self.dist.isend, send, self._global(root), group=self.group)]
        if self.group_rank == root:
            ops += [self.dist.P2POp(self.dist.irecv, part, self._global(p), group=self.group)
                    for p, part in enumerate(recv.view(self.group_size, -1).unbind(0))]
        self._p2p(ops)

    def scatter(self, send, recv, root):
        # all_to_all_single with one-sided splits: one NCCL group of the root's sends
        # (self included) and each rank's receive; dist.scatter copies the root's own chunk
        # serially first (docs/design/gather-scatter-calls.md).
        n, chunk = self.group_size, recv.numel()
        from_root = [chunk if p == root else 0 for p in range(n)]
        if self.group_rank == root:
            self.dist.all_to_all_single(recv, send[:chunk * n], from_root, [chunk] * n, group=self.group)
        else:
            self.dist.all_to_all_single(recv, send[:0], from_root, [0] * n, group=self.group)

    def alltoallv(self, send, recv, layout):
        me = self.group_rank
        sends, receives = list(layout.sends(me)), list(layout.receives(me))
        self.dist.all_to_all_single(recv[:sum(receives)], send[:sum(sends)], receives, sends, group=self.group)

    def sendrecv(self, send, recv):
        n, me = self.group_size, self.group_rank
        ops = [
            self.dist.P2POp(self.dist.isend, send, self._global((me + 1) % n), group=self.group),
            self.dist.P2POp(self.dist.irecv, recv, self._global((me - 1) % n), group=self.group),
        ]
        self._p2p(ops)

    def hypercube(self, send, recv):
        n, me = self.group_size, self.group_rank
        chunk = recv.numel() // n
        own = recv[me * chunk:(me + 1) * chunk]
        if own.data_ptr() != send.data_ptr():
            self._copy(own, send)
        for step, (peer, sent, got) in enumerate(hypercube_schedule(n, me)):
            width = (1 << step) * chunk
            ops = [self.dist.P2POp(self.dist.isend, recv[sent * chunk: sent * chunk + width], self._global(peer),
                                   group=self.group),
                   self.dist.P2POp(self.dist.irecv, recv[got * chunk: got * chunk + width], self._global(peer),
                                   group=self.group)]
            self._p2p(ops)

    def _copy(self, dst, src) -> None:
        """dst <- src on the collective's stream: cudaMemcpyAsync eagerly, as nccl-tests
        does; inside a CUDA graph capture an elementwise kernel, faster there than a captured
        memcpy node (docs/design/graph-copy-kernel.md)."""
        if self.is_gpu and self.torch.cuda.is_current_stream_capturing():
            byte_copy(self.torch, dst, src)
        else:
            dst.copy_(src)

    def _p2p(self, ops) -> None:
        """Send/receive `ops` (dist.P2POp) in one NCCL group: batch_isend_irecv, or, inside
        op_group()'s group (-m), the ops themselves: the open group already holds them, and
        batch_isend_irecv's own coalescing group cannot nest in another."""
        if self._grouping:
            for p in ops:
                p.op(p.tensor, p.peer, group=p.group)
            return
        for req in self.dist.batch_isend_irecv(ops):
            req.wait()

    _grouping = False  # inside op_group()'s NCCL group

    def op_group(self, coll_name: str):
        """(factory of a context manager that puts the ops issued inside it in one NCCL
        group, or None; a one-line reason when None) for -m: torch's coalescing manager."""
        if not self.is_gpu:
            return None, "gloo has no NCCL groups"
        manager = getattr(self.dist.distributed_c10d, "_coalescing_manager", None)
        if manager is None:
            return None, "this torch has no coalescing manager"

        @contextlib.contextmanager
        def grouped():
            self._grouping = True
            try:
                with manager(group=self.group, device=self.device):
                    yield
            finally:
                self._grouping = False
        return grouped, None

    def bind(self, coll, send, recv, op, root, layout):
        """A zero-argument callable issuing one op on these buffers. Backends with a cheaper
        pre-resolved form override it (the eager timed loop calls it `iters` times)."""
        return functools.partial(coll.call, self, send, recv, op, root, layout)

    def _global(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return self.dist.get_global_rank(self.group, group_rank)

    # ---- timing --------------------------------------------------------------------
    def markers(self, n: int) -> list:
        """`n` unrecorded marks made ahead of a timed loop (creating a CUDA event inside
        the loop would add its host cost to every iteration of -I)."""
        if self.is_gpu:
            # The stream is looked up once (Event.record() with no stream builds a Python
            # stream object per call), and each event is recorded once here: torch creates
            # the CUDA event on its first record, which would otherwise happen in the loop.
            self._mark_stream = self.torch.cuda.current_stream(self.device)
            events = [self.torch.cuda.Event(enable_timing=True) for _ in range(n)]
            for event in events:
                event.record(self._mark_stream)
            return events
        return [None] * n

    def mark(self, marker):
        """A point in time on the stream the collectives run on (records `marker`, one of
        markers())."""
        if self.is_gpu:
            marker.record(self._mark_stream)
            return marker
        return time.perf_counter()

    def reached(self, mark) -> bool | None:
        """Whether the device passed `mark` (from mark()), without waiting: a CUDA event
        query; a host-clock mark (gloo) was passed when made; None: nothing recorded."""
        return None if mark is None else bool(mark.query()) if self.is_gpu else True

    def elapsed(self, start, end) -> float:
        """Seconds between two marks (call synchronize() first)."""
        if self.is_gpu:
            return start.elapsed_time(end) / 1e3
        return end - start

    def synchronize(self):
        if self.is_gpu:
            self.torch.cuda.synchronize(self.device)

    def hold(self, seconds: float) -> None:
        """A spinning kernel on the current stream for at least `seconds`: its cycles are
        counted at 2 GHz, faster than these GPUs run (the spin then lasts longer, never
        shorter). Nothing on the CPU, where the host clock times."""
        if self.is_gpu and seconds > 0:
            self.torch.cuda._sleep(int(seconds * HOLD_CLOCK_HZ))

    def capture(self, issue_ops, empty_ok=False):
        """Capture `issue_ops()` in a CUDA graph; returns a function that replays it."""
        if not self.is_gpu:
            raise PlanError("CUDA graphs (-G) need the nccl or cupy backend on GPUs")
        torch = self.torch
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            issue_ops()  # warm-up outside capture, as torch requires for NCCL
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings():
            if self.group_size == 1 or empty_ok:
                # one rank in place, or an op of 0 B: NCCL has nothing to do, so the graph is
                # rightly empty and torch's warning (meant for capture on a wrong stream) would
                # mislead; otherwise an empty graph is a bug and the warning stays
                warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
            with torch.cuda.graph(graph):
                issue_ops()
        self._graphs = getattr(self, "_graphs", [])
        self._graphs.append(graph)
        return graph.replay

    def release_graphs(self):
        self._graphs = []

    # ---- host side -------------------------------------------------------------------
    def barrier(self):
        if self.adopted and self.is_gpu:  # the control group is the caller's NCCL group
            self.dist.barrier(group=self.control, device_ids=[self.device.index])
        else:
            self.dist.barrier(group=self.control)

    def all_gather_object(self, obj) -> list:
        out = [None] * self.nranks
        self.dist.all_gather_object(out, obj, group=self.control)
        return out

    def close(self):
        self.release_graphs()
        self.deregister_buffers()
        if not self.adopted and not self.aborted and self.dist.is_initialized():
            try:
                self.dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - best effort at exit
                pass

    aborted = False  # abort() ran: the communicators are gone, and nothing may touch them again

    def abort(self) -> None:
        """End this rank's NCCL communicators now, from any thread: ncclbench's stop thread
        calls it (ncclbench.launch.stop) while the main thread waits inside a collective for
        a peer that died. NCCL's kernels then return, and the main thread's synchronize with
        them; its next collective raises. The groups are aborted one by one inside one NCCL
        group, as torch's `_abort_process_group` does, so that their aborts cannot wait on
        one another; unlike it, the group table (which the main thread may be reading) is
        left alone, and nothing is destroyed afterwards. gloo groups are not aborted: that
        frees no waiting call (tried on torch 2.13), and a peer's death ends theirs."""
        if self.adopted or self.aborted:
            return
        self.aborted = True
        self._abort_nccl_groups()

    def _abort_nccl_groups(self) -> None:
        torch = self.torch
        from torch.distributed import distributed_c10d as c10d

        groups = [pg for pg in list(getattr(getattr(c10d, "_world", None), "pg_map", None) or [])
                  if _nccl_backend(torch, pg) is not None]
        if not groups:
            return
        world = _nccl_backend(torch, c10d.GroupMember.WORLD) if c10d.GroupMember.WORLD is not None else None
        opened = False
        if world is not None and hasattr(world, "_group_start"):
            try:
                world._group_start()
                opened = True
            except Exception:  # noqa: BLE001 - each abort on its own then
                pass
        for pg in groups:
            _abort_group(torch, pg)
        if opened:
            try:
                world._group_end()
            except Exception:  # noqa: BLE001
                pass


def _nccl_backend(torch, pg):
    """The group's NCCL backend, or None (gloo groups answer for "cuda" too: checked by name)."""
    try:
        backend = pg._get_backend(torch.device("cuda"))
    except Exception:  # noqa: BLE001 - no CUDA backend in this group
        return None
    return backend if type(backend).__name__ == "ProcessGroupNCCL" else None


def _abort_group(torch, pg) -> None:
    """Abort one process group with what this torch has: the group's abort (torch 2.6 and
    later), else its NCCL backend's."""
    for target in (pg, _nccl_backend(torch, pg)):
        abort = getattr(target, "abort", None) if target is not None else None
        if abort is None:
            continue
        try:
            abort()
            return
        except Exception:  # noqa: BLE001 - try the next spelling
            continue

