"""Why a number is low, from the path NCCL took (pathview.Path): the peak of that path (NVLink,
the NIC's rate, none for shared memory or an unknown link), how far the best busbw is from
it, and the known causes the log and the host show (sockets while an RDMA device exists,
GPUDirect RDMA off, shared memory where P2P was expected, fewer channels, NVLS, PXN)."""

from __future__ import annotations

from ncclbench.topology.pathview import Path

_TRUE = ("1", "y", "yes", "true", "on")


def _set(env: dict, name: str) -> bool:
    return str(env.get(name, "")).strip().lower().rstrip(".") in _TRUE


def _net_peak(path: Path) -> tuple[float | None, str]:
    """The slowest host's summed rate of the NICs its ranks' NET connections used."""
    per_host = path.host_nic_rates()
    if not per_host:
        names = ", ".join(path.nic_names()) or "the NIC"
        return None, f"the rate of {names} is unknown: sysfs gave none where the log was read"
    host, (rates, shaped) = min(per_host.items(), key=lambda kv: sum(kv[1][0].values()))
    total = sum(rates.values())
    how = f"; a tbf qdisc caps what {' + '.join(sorted(shaped))} sends" if shaped else ""
    return total, f"the NIC rate {total:.4g} GB/s ({' + '.join(sorted(rates))} on {host}{how})"


def _pcie_peak(path: Path, kind: str) -> tuple[float | None, str]:
    """P2P without a known NVLink peak: the slowest GPU's PCIe link, where sysfs gave it."""
    links = [link for p in path.processes for link in (p.get("pcie") or {}).values()]
    if not links:
        return None, f"the path is {kind} over PCIe or an unknown link: its peak is unknown"
    slow = min(links, key=lambda link: link["gbps"])
    return slow["gbps"], f"the PCIe link {slow['gen_gts']:g} GT/s x{slow['width']} {slow['gbps']:.1f} GB/s per direction"


def path_peak(path: Path | None, nvlink_peak: float | None) -> tuple[float | None, str]:
    """(peak GB/s of the transport that bounds the run, what it is); peak None when unknown."""
    if path is None or path.empty:
        return (nvlink_peak, f"NVLink peak {nvlink_peak:.1f} GB/s per GPU per direction") if nvlink_peak \
            else (None, "the path NCCL took is unknown")
    kind = path.bottleneck or ""
    if kind.startswith(("NET", "COLLNET")):
        return _net_peak(path)
    if kind.startswith("SHM"):
        return None, ("the path is SHM (shared memory through the host's CPU): no link peak is known for it"
                      + (f"; the NVLink peak {nvlink_peak:.1f} GB/s is not this path's" if nvlink_peak else ""))
    if kind.startswith("P2P") and nvlink_peak:
        return nvlink_peak, f"NVLink peak {nvlink_peak:.1f} GB/s per GPU per direction"
    if kind.startswith("P2P"):
        return _pcie_peak(path, kind)
    return None, f"no link peak is known for {kind or 'this path'}"


TREE_NOTE = ("busbw counts what a ring moves; NCCL's all_reduce tree sends less through each NIC, so "
             "its busbw may pass the NIC's rate, up to 2x")


def against_peak(best: float, peak: float | None, what: str) -> str:
    """What follows a best busbw: `= N % of <peak>`, or why no percentage is given. A NIC's
    rate can be passed by up to 2x: all_reduce's busbw counts 2(n-1)/n of the data per rank,
    while NCCL's tree sends each node's data once through its NIC
    (docs/design/preflight-nic-rate.md). Beyond that the rate bounds nothing
    (a veth says 10000 Mb/s whatever it carries)."""
    nic = what.startswith("the NIC rate")
    if peak and best > (2.0 if nic else 1.1) * peak:
        return f", above {what}: that rate is not this path's real bound"
    if peak and nic and best > 1.1 * peak:
        return f" = {100.0 * best / peak:.1f} % of {what} ({TREE_NOTE})"
    if peak:
        return f" = {100.0 * best / peak:.1f} % of {what}"
    return f" ({what})"


def peak_line(best: float, path: Path | None, nvlink_peak: float | None) -> str:
    """The trailer's '# Best busbw ...' line, against the peak of the path actually used."""
    peak, what = path_peak(path, nvlink_peak)
    return f"# Best busbw {best:.2f} GB/s{against_peak(best, peak, what)}"


def causes(path: Path, facts: dict | None = None, environ: dict | None = None) -> list[str]:
    """The known causes of a lower number that `path` (and this host's `facts`:
    ncclbench.explain.here.host_facts; `environ`: the process's own variables) show, most likely first."""
    facts, env = facts or {}, dict(environ or {})
    env.update(path.env)  # what NCCL itself reports having read wins
    out: list[str] = []
    kinds = path.transports()
    if path.uses_network:
        out += _network_causes(path, facts, env)
    if any(k.startswith("SHM") for k in kinds):
        out.append(_shm_cause(env))
    if any(k.startswith("P2P/indirect") for k in kinds):
        out.append("P2P/indirect: data goes through a third GPU (no direct P2P between some pairs)")
    limits = [f"{n}={env[n]}" for n in ("NCCL_MAX_NCHANNELS", "NCCL_MAX_CTAS", "NCCL_MIN_NCHANNELS", "NCCL_MIN_CTAS",
                                        "NCCL_NCHANNELS_PER_NET_PEER") if n in env]
    if limits:
        out.append(f"fewer channels than NCCL's default: {' '.join(limits)} set"
                   + (f" ({path.channels} channels)" if path.channels else ""))
    if "NCCL_NVLS_ENABLE" in env and not _set(env, "NCCL_NVLS_ENABLE"):
        out.append("NVLS off: NCCL_NVLS_ENABLE=0 set (NVLink SHARP all_reduce not used)")
    return out


def _network_causes(path: Path, facts: dict, env: dict) -> list[str]:
    out = []
    devices = facts.get("ib_devices") or []
    if path.network == "Socket":
        why = [f"{n}={env[n]}" for n in ("NCCL_IB_DISABLE", "NCCL_NET") if n in env]
        where = f" while this host has RDMA devices ({', '.join(devices)})" if devices else ""
        out.append(f"network Socket: TCP sockets {_socket_span(path)}{where}; GDR 0 (sockets never use GPUDirect RDMA)"
                   + (f"; set: {' '.join(why)}" if why else
                      "; no InfiniBand/RoCE device or network plugin was usable (NCCL_IB_HCA, rdma-core, NCCL_NET_PLUGIN)"
                      if devices else ""))
        return out
    if path.gdr == 0:
        why = [f"{n}={env[n]}" for n in ("NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ") if n in env]
        if facts.get("peermem") is False:
            why.append("the nvidia_peermem module is not loaded")
        out.append("GDR 0: GPUDirect RDMA off, network data is staged through host memory"
                   + (f" ({'; '.join(why)})" if why else " (GPU-NIC PCIe distance above NCCL_NET_GDR_LEVEL, or no "
                                                          "peer-memory module)"))
    if path.pxn == 0 and "NCCL_PXN_DISABLE" in env and _set(env, "NCCL_PXN_DISABLE"):
        out.append("PXN off: NCCL_PXN_DISABLE=1 set (each GPU sends through its own NIC only)")
    return out


def _socket_span(path: Path) -> str:
    """Between which ranks the sockets ran, as far as the logs read show both ends."""
    span, unseen = path.network_span()
    parts = [text for key, text in (("hosts", "between hosts"),
                                     ("one host", "between the GPUs of one host (no P2P or SHM)")) if key in span]
    if unseen:
        parts.append(f"to rank(s) {', '.join(map(str, unseen))}, whose logs were not read (their host is unknown)")
    if "unknown" in span or not parts:
        parts.append("between ranks the log does not tie to hosts (no INIT line names their communicator)")
    return ", and ".join(parts)


def _shm_cause(env: dict) -> str:
    if _set(env, "NCCL_P2P_DISABLE"):
        return "SHM where P2P was expected: NCCL_P2P_DISABLE=1 set, so GPUs on one host exchange through host memory"
    if "NCCL_P2P_LEVEL" in env:
        return f"SHM where P2P was expected: NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']} keeps P2P off for these GPU pairs"
    return ("SHM where P2P was expected: NCCL found no P2P between these GPUs (PCIe ACS or IOMMU, a container "
            "without a shared IPC namespace (--ipc=host), or GPUs in different processes without peer access)")
