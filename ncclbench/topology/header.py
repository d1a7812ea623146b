"""The topology lines of a run: the summary in its header and, on NVLink, the trailer
line that puts the best bus bandwidth against the NVLink peak."""

from __future__ import annotations

from typing import Callable

from ncclbench.topology.model import link_peak_gbps, summary_line


def peak_percent_line(best_busbw_gbps: float, peak_gbps: float | None) -> str:
    """'# Best busbw 359.54 GB/s = 75.2 % of NVLink peak 478.1 GB/s per GPU per direction'."""
    try:
        best = float(best_busbw_gbps)
        if not peak_gbps or peak_gbps <= 0:
            return f"# Best busbw {best:.2f} GB/s (NVLink peak unknown)"
        return (
            f"# Best busbw {best:.2f} GB/s = {100.0 * best / peak_gbps:.1f} % of NVLink peak "
            f"{peak_gbps:.1f} GB/s per GPU per direction"
        )
    except (TypeError, ValueError):
        return f"# Best busbw {best_busbw_gbps} GB/s"


def header_context(backend: str) -> tuple[str | None, float | None, Callable | None]:
    """(summary line, NVLink peak GB/s, trailer-line maker) for a run's header and trailer on
    `backend`; all None for gloo (CPU) runs or when the probe fails: topology is context,
    never a reason to fail a run."""
    if backend == "gloo":
        return None, None, None
    try:
        from ncclbench.topology.probe import probe  # the probe's sources load for GPU runs only

        t = probe(include_nics=False)
        summary, peak = summary_line(t), link_peak_gbps(t)
    except Exception:  # noqa: BLE001
        return None, None, None
    if not peak:
        return summary, None, None
    return summary, peak, lambda s: peak_percent_line(s.peak_busbw, peak)


def path_trailer(path: dict | None, nvlink_peak: float | None) -> Callable | None:
    """The trailer-line maker for a run whose NCCL path was read: the best busbw against the
    peak of the transport NCCL used (SHM has none; a NET path has its NIC's rate), not the
    NVLink peak of a path NCCL may not have taken. None when the path is unknown."""
    from ncclbench.topology.pathexplain import peak_line
    from ncclbench.topology.pathview import Path

    view = Path.from_dict(path)
    if view is None or view.empty:
        return None
    return lambda s: peak_line(s.peak_busbw, view, nvlink_peak)
