"""GPU-to-GPU copy bandwidth and latency matrices, like CUDA's p2pBandwidthLatencyTest.

One process drives every GPU. For each ordered pair (source i, destination j) a
contiguous ``dst.copy_(src, non_blocking=True)`` runs on a stream of the source
GPU: torch turns that into one cudaMemcpyAsync, which a copy engine carries over
NVLink (or PCIe) once torch has enabled peer access, as it does on the first
copy between two GPUs. CUDA events on that stream time ``iters`` copies; the
median of ``reps`` such timings is reported.

Each timed batch is queued behind a short spin kernel so that the GPU starts it
only after the host has queued every copy; otherwise small copies would measure
how fast Python launches them. If the spin ends before the host is done, it is
lengthened and the batch repeated.

Everything that touches CUDA goes through ``TorchCudaApi`` so that tests can
drive the measurement loop with a fake on a machine without GPUs.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ncclbench.topology.pci import pci_bus_id_from_parts

MiB = 2**20
DEFAULT_SIZE = 256 * MiB
MAX_SPIN_MS = 100.0
SPIN_RETRIES = 3
# Latency copies go out back to back; rotating the destination GPU's current stream
# keeps torch's per-copy cross-GPU barrier from waiting on the previous copy.
DST_SIDE_STREAMS = 4

class P2PError(RuntimeError):
    """A measurement that cannot run (too few GPUs, bad device list)."""


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def bandwidth_gbps(nbytes: int, milliseconds: float) -> float:
    """Bytes moved in a time -> GB/s (1e9 bytes per second)."""
    return nbytes / (milliseconds * 1e-3) / 1e9


def fill_value(device: int) -> int:
    """The byte each GPU's source buffer holds, so a copy can be checked (never 0)."""
    return device % 251 + 1


@dataclass(frozen=True)
class P2PConfig:
    size_bytes: int = DEFAULT_SIZE
    reps: int = 5  # timed repetitions per pair; the median is reported
    iters: int = 5  # copies per timed repetition
    warmup: int = 2  # untimed copies per pair (also enables peer access)
    latency_bytes: int = 4
    latency_iters: int = 100
    bidirectional: bool = True
    devices: tuple[int, ...] | None = None  # CUDA indices; None: all visible
    time_limit_s: float = 120.0  # pairs not started by then are skipped


@dataclass
class P2PDevice:
    index: int
    name: str
    pci_bus_id: str | None


@dataclass
class P2PResult:
    config: dict[str, Any]
    devices: list[P2PDevice]
    # Matrices are [source][destination] in `devices` order.
    peer_access: list[list[bool | None]]
    unidirectional_gbps: list[list[float | None]]
    bidirectional_gbps: list[list[float | None]]  # symmetric; diagonal None
    latency_us: list[list[float | None]]
    verified: list[list[bool | None]]  # did the destination hold the source's data
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    versions: dict[str, str | None] = field(default_factory=dict)
    schema: str = "ncclbench.p2p/1"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def failed_pairs(self) -> list[tuple[int, int]]:
        return [
            (self.devices[i].index, self.devices[j].index)
            for i, row in enumerate(self.verified)
            for j, ok in enumerate(row)
            if ok is False
        ]

    def csv_text(self) -> str:
        """One row per ordered pair (long format, easy to load with pandas)."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            ["src", "dst", "src_pci_bus_id", "dst_pci_bus_id", "peer_access",
             "unidirectional_gbps", "bidirectional_gbps", "latency_us", "verified", "size_bytes"]
        )  # fmt: skip
        for i, src in enumerate(self.devices):
            for j, dst in enumerate(self.devices):
                writer.writerow(
                    [src.index, dst.index, src.pci_bus_id or "", dst.pci_bus_id or "",
                     _csv_cell(self.peer_access[i][j]), _csv_cell(self.unidirectional_gbps[i][j]),
                     _csv_cell(self.bidirectional_gbps[i][j]), _csv_cell(self.latency_us[i][j]),
                     _csv_cell(self.verified[i][j]), self.config.get("size_bytes")]
                )  # fmt: skip
        return out.getvalue()


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).lower() if isinstance(value, bool) else str(value)


# -------------------------------------------------------------- CUDA adapter


@dataclass
class Copy:
    """One copy of a batch: src on src_device to dst on dst_device, issued on `stream`
    (a stream of the source GPU); dst_side_stream, if set, is made the destination
    GPU's current stream while the copy is issued."""

    dst: Any
    src: Any
    src_device: int
    dst_device: int
    stream: Any
    dst_side_stream: Any = None


class TorchCudaApi:
    """The few CUDA operations the measurement needs, done with torch."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self._cycles_per_ms: dict[int, float] = {}

    def device_count(self) -> int:
        cuda = self.torch.cuda
        return cuda.device_count() if cuda.is_available() else 0

    def device_name(self, device: int) -> str:
        return self.torch.cuda.get_device_name(device)

    def pci_bus_id(self, device: int) -> str | None:
        props = self.torch.cuda.get_device_properties(device)
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            return pci_bus_id_from_parts(props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
        return None

    def can_access_peer(self, src: int, dst: int) -> bool:
        return bool(self.torch.cuda.can_device_access_peer(src, dst))

    def empty(self, device: int, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=f"cuda:{device}")

    def stream(self, device: int) -> Any:
        return self.torch.cuda.Stream(device=device)

    def event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True)

    def copy(self, job: Copy) -> None:
        cuda = self.torch.cuda
        with contextlib.ExitStack() as stack:
            if job.dst_side_stream is not None:
                stack.enter_context(cuda.stream(job.dst_side_stream))
            # torch copies between GPUs on the *current stream of the source GPU*.
            stack.enter_context(cuda.device(job.src_device))
            stack.enter_context(cuda.stream(job.stream))
            job.dst.copy_(job.src, non_blocking=True)

    def spin(self, stream: Any, milliseconds: float) -> bool:
        """Queue a kernel that keeps `stream` busy for about `milliseconds`."""
        cuda = self.torch.cuda
        sleep = getattr(cuda, "_sleep", None)  # private but present since torch 1.x
        if sleep is None or milliseconds <= 0:
            return False
        device = stream.device.index
        cycles = int(milliseconds * self._clock_cycles_per_ms(device))
        with cuda.device(device), cuda.stream(stream):
            sleep(max(cycles, 1))
        return True

    def _clock_cycles_per_ms(self, device: int) -> float:
        if device not in self._cycles_per_ms:
            cuda = self.torch.cuda
            cycles, elapsed_ms = 2_000_000, 0.0
            with cuda.device(device):
                stream = cuda.current_stream(device)
                for _ in range(2):  # the first launch pays one-time costs
                    start, stop = self.event(), self.event()
                    start.record(stream)
                    cuda._sleep(cycles)
                    stop.record(stream)
                    stop.synchronize()
                    elapsed_ms = start.elapsed_time(stop)
            self._cycles_per_ms[device] = cycles / elapsed_ms if elapsed_ms > 0 else 1e6
        return self._cycles_per_ms[device]

    def synchronize(self, devices: Sequence[int]) -> None:
        for device in devices:
            self.torch.cuda.synchronize(device)

    def versions(self) -> dict[str, str | None]:
        torch = self.torch
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
        return {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "nccl": nccl}


# ------------------------------------------------------------- measurement


@dataclass
class _Timing:
    milliseconds: float
    # True: the GPU passed the start marker before the host had queued every copy,
    # so it may have idled between copies; None: no spin kernel, cannot tell.
    host_bound: bool | None


def _time_batch(api: Any, copies: Sequence[Copy], rounds: int, spin_ms: float, serial: bool = False) -> _Timing:
    """Time `rounds` rounds of `copies`, with the events on the first copy's stream.

    serial=False: the copies of a round run concurrently, each on its own stream
    (bidirectional). serial=True: the copies share the first copy's stream and run
    one after another (latency; they differ only in the destination-side stream).
    """
    lead = copies[0].stream
    spun = api.spin(lead, spin_ms) if spin_ms > 0 else False
    start, stop = api.event(), api.event()
    start.record(lead)
    others = [] if serial else copies[1:]
    for job in others:
        job.stream.wait_event(start)
    for _ in range(rounds):
        for job in copies:
            api.copy(job)
    for job in others:
        done = api.event()
        done.record(job.stream)
        lead.wait_event(done)
    stop.record(lead)
    host_bound = bool(start.query()) if spun else None
    stop.synchronize()
    return _Timing(start.elapsed_time(stop), host_bound)


def _median_ms(
    api: Any, copies: Sequence[Copy], rounds: int, reps: int, spin_ms: dict[str, float], notes: list[str],
    what: str, serial: bool = False,
) -> float:
    """Median over `reps` batches of the time of one round, in ms. spin_ms[what] is
    the spin before each batch; it grows (and stays grown) when it proves too short."""
    samples = []
    for _ in range(reps):
        timing = _time_batch(api, copies, rounds, spin_ms[what], serial)
        retries = 0
        while timing.host_bound and retries < SPIN_RETRIES and spin_ms[what] < MAX_SPIN_MS:
            spin_ms[what] = min(spin_ms[what] * 4, MAX_SPIN_MS)
            timing = _time_batch(api, copies, rounds, spin_ms[what], serial)
            retries += 1
        if timing.host_bound is not False:
            why = "no spin kernel (torch.cuda._sleep)" if timing.host_bound is None else "the host queued too slowly"
            note = f"{what}: {why}; times may include gaps between copy launches"
            if note not in notes:
                notes.append(note)
        samples.append(timing.milliseconds / rounds)
    return statistics.median(samples)


def _matrix(n: int, value: Any = None) -> list[list[Any]]:
    return [[value] * n for _ in range(n)]


def _chosen_devices(config: P2PConfig, count: int) -> list[int]:
    devices = list(config.devices) if config.devices is not None else list(range(count))
    bad = [d for d in devices if not 0 <= d < count]
    if bad:
        raise P2PError(f"no CUDA GPU {bad[0]}: {count} visible")
    if len(set(devices)) != len(devices):
        raise P2PError("a GPU is listed twice")
    if len(devices) < 2:
        raise P2PError("p2p needs at least 2 GPUs")
    return devices


@dataclass
class _Buffers:
    """Two buffers per GPU (it sends from `src` and receives into `dst`), its copy stream,
    and the destination-side streams the latency rounds cycle through."""
    src: dict
    dst: dict
    streams: dict
    dst_side: dict

    @classmethod
    def make(cls, api: Any, devices: list[int], size: int) -> "_Buffers":
        bufs = cls({d: api.empty(d, size) for d in devices}, {d: api.empty(d, size) for d in devices},
                   {d: api.stream(d) for d in devices},
                   {d: [api.stream(d) for _ in range(DST_SIDE_STREAMS)] for d in devices})
        for d in devices:
            bufs.src[d].fill_(fill_value(d))
        api.synchronize(devices)
        return bufs


# Spin long enough for the host to queue a batch (ms); raised when too short.
_SPIN_MS = {"bandwidth": 1.0, "latency": 5.0}


def _one_way(api: Any, config: P2PConfig, bufs: _Buffers, a: int, b: int, notes: list[str], spin_ms: dict):
    """(GB/s, verified, latency in us) of copies from GPU a to GPU b."""
    size = config.size_bytes
    small = min(config.latency_bytes, size)
    bufs.dst[b].zero_()
    api.synchronize([b])
    job = Copy(bufs.dst[b], bufs.src[a], a, b, bufs.streams[a])
    if config.warmup:
        _time_batch(api, [job], config.warmup, 0.0)
    ms = _median_ms(api, [job], config.iters, config.reps, spin_ms, notes, "bandwidth")
    gbps = bandwidth_gbps(size, ms)
    api.synchronize([a, b])
    verified = bool(bufs.dst[b].eq(fill_value(a)).all())
    # Latency: one small copy after another on the source stream; a round cycles
    # through the destination-side streams (see DST_SIDE_STREAMS).
    tiny = Copy(bufs.dst[b][:small], bufs.src[a][:small], a, b, bufs.streams[a])
    tiny_jobs = [dataclasses.replace(tiny, dst_side_stream=s) for s in bufs.dst_side[b]] if a != b else [tiny]
    rounds = max(1, math.ceil(config.latency_iters / len(tiny_jobs)))
    _time_batch(api, tiny_jobs, 1, 0.0, serial=True)
    ms_per_round = _median_ms(api, tiny_jobs, rounds, config.reps, spin_ms, notes, "latency", serial=True)
    return gbps, verified, ms_per_round / len(tiny_jobs) * 1e3


def _both_ways(api: Any, config: P2PConfig, bufs: _Buffers, a: int, b: int, notes: list[str], spin_ms: dict) -> float:
    """GB/s of copies a -> b and b -> a at once."""
    there = Copy(bufs.dst[b], bufs.src[a], a, b, bufs.streams[a])
    back = Copy(bufs.dst[a], bufs.src[b], b, a, bufs.streams[b])
    if config.warmup:
        _time_batch(api, [there, back], config.warmup, 0.0)
    ms = _median_ms(api, [there, back], config.iters, config.reps, spin_ms, notes, "bandwidth")
    return bandwidth_gbps(2 * config.size_bytes, ms)


def run_p2p(
    config: P2PConfig,
    api: Any | None = None,
    progress: Callable[[str], None] | None = None,
) -> P2PResult:
    """Measure every ordered pair of the configured GPUs. Raises P2PError when fewer
    than 2 GPUs are usable; CUDA errors (out of memory ...) propagate."""
    started = time.perf_counter()
    api = api or TorchCudaApi()
    devices = _chosen_devices(config, api.device_count())
    n = len(devices)
    notes: list[str] = []
    result = P2PResult(
        config=dataclasses.asdict(config) | {"devices": devices},
        devices=[P2PDevice(d, api.device_name(d), api.pci_bus_id(d)) for d in devices],
        peer_access=[[None if i == j else api.can_access_peer(a, b) for j, b in enumerate(devices)]
                     for i, a in enumerate(devices)],  # fmt: skip
        unidirectional_gbps=_matrix(n),
        bidirectional_gbps=_matrix(n),
        latency_us=_matrix(n),
        verified=_matrix(n),
        notes=notes,
        versions=api.versions() if hasattr(api, "versions") else {},
    )
    bufs = _Buffers.make(api, devices, config.size_bytes)
    deadline = started + config.time_limit_s
    spin_ms = dict(_SPIN_MS)

    def out_of_time(what: str) -> bool:
        if time.perf_counter() < deadline:
            return False
        message = f"time limit {config.time_limit_s:g} s reached: some {what} pairs were skipped"
        if message not in notes:
            notes.append(message)
        return True

    pairs = [(i, j) for i in range(n) for j in range(n)]
    if progress:
        progress(f"p2p: {n} GPUs, {len(pairs)} ordered pairs, {format_size(config.size_bytes)} copies")
    for i, j in pairs:
        if out_of_time("unidirectional"):
            break
        result.unidirectional_gbps[i][j], result.verified[i][j], result.latency_us[i][j] = \
            _one_way(api, config, bufs, devices[i], devices[j], notes, spin_ms)
    if config.bidirectional:
        for i in range(n):
            for j in range(i + 1, n):
                if out_of_time("bidirectional"):
                    break
                result.bidirectional_gbps[i][j] = result.bidirectional_gbps[j][i] = \
                    _both_ways(api, config, bufs, devices[i], devices[j], notes, spin_ms)
    api.synchronize(devices)
    result.elapsed_s = round(time.perf_counter() - started, 3)
    return result

