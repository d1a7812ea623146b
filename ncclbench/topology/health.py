"""The health of a rank's GPU and software, and the causes it points to when ranks differ.

``read_local(device)`` is one rank's reading: from NVML and sysfs, its GPU's PCIe link
(generation and width, now and at most), NVLink states, uncorrectable ECC errors, row
remapping, the reasons its clocks are held down; from the process, its driver, CUDA, NCCL
and torch versions and NCCL_* environment. A plain JSON-able dict, never an exception: on a
machine without a GPU or NVML it says so in ``gpu: None`` and ``notes``.

``causes_by_host({rank: reading})`` compares the readings of a job (pure) and names, per
host, what is degraded or different: the lines a verdict shows as ``causes``
(docs/hardware.md lists them and how each is judged).

PCIe generation: an idle GPU lowers its link generation to save power (an idle H100 shows
Gen1), so the generation it has now is judged only in a reading where NVML says the clocks
are not idle; otherwise the generation the link can reach (NVML's maximum for this GPU in
this slot) stands for it. Width does not change with load and is always judged.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from ncclbench.topology.model import Versions
from ncclbench.topology.nvml import driver_versions, gpu_health, gpu_identities
from ncclbench.topology.pci import normalize_pci_bus_id
from ncclbench.topology.versions import torch_versions
from ncclbench.topology.visible import cuda_order_from_env

SCHEMA = "ncclbench.health/1"
_DEFAULT = object()

# PCIe transfer rate per lane (GT/s, as sysfs writes it) -> generation.
GT_PER_S_GENERATION = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}

# NVLinks a GPU of these models has on an HGX board (matched on NVML's name, which says
# "PCIe" or "NVL" for the PCIe cards, left out here: their bridges are optional).
MODEL_NVLINKS = (("A100-SXM", 12), ("H100 80GB HBM3", 18), ("H200", 18), ("B200", 18), ("B300", 18),
                 ("H800", 8), ("A800-SXM", 8))  # fmt: skip
_PCIE_CARD_MARKS = ("PCIe", "NVL")

# NCCL_* variables that name a host or a file of its own, or belong to nccl-tests: they differ
# between hosts by design and are not compared.
UNCOMPARED_ENV = ("NCCL_HOSTID", "NCCL_COMM_ID", "NCCL_DEBUG_FILE", "NCCL_RAS_ADDR", "NCCL_TESTS_")

VERSION_FIELDS = (("driver", "driver"), ("cuda_driver", "CUDA driver"), ("cuda_runtime", "CUDA runtime"),
                  ("nccl", "NCCL"), ("torch", "torch"))  # fmt: skip


# ------------------------------------------------------------------------ reading


def read_local(device_index: int = 0, *, nvml: Any = _DEFAULT, sysfs: str | os.PathLike = "/sys",
               env: Mapping[str, str] | None = None, host: str | None = None,
               pci_bus_id: str | None = None) -> dict:  # fmt: skip
    """The reading of this process's CUDA GPU `device_index` (what a rank calls).

    The GPU is found by `pci_bus_id` when given, else by torch's view of the device where
    torch has initialised CUDA, else by CUDA_VISIBLE_DEVICES and PCI order (no CUDA call).
    nvml: a pynvml-shaped module (default: import pynvml; None: no NVML)."""
    env = os.environ if env is None else env
    reading = _base_reading(host, env, device_index)
    module = _open_nvml(nvml, reading["notes"])
    if module is None:
        return reading
    try:
        _fill_versions(reading, module)
        gpus = gpu_identities(module)
        given = normalize_pci_bus_id(pci_bus_id)
        chosen = _choose(gpus, device_index, given or _torch_bus_id(device_index), env, strict=given is not None)
        if chosen is None:
            reading["notes"].append(f"NVML lists no GPU for CUDA device {device_index} ({len(gpus)} GPU(s) listed)")
            return reading
        _fill_gpu(reading, module, chosen, sysfs)
    except Exception as error:  # a reading must never stop a run
        reading["notes"].append(f"GPU health not read: {type(error).__name__}: {error}")
    finally:
        _shutdown(module)
    return reading


def read_host(*, nvml: Any = _DEFAULT, sysfs: str | os.PathLike = "/sys", env: Mapping[str, str] | None = None,
              host: str | None = None) -> list[dict]:  # fmt: skip
    """One reading per GPU NVML lists on this host (what `ncclbench topo` shows); [] without NVML."""
    env = os.environ if env is None else env
    notes: list[str] = []
    module = _open_nvml(nvml, notes)
    if module is None:
        return []
    readings = []
    try:
        for gpu in gpu_identities(module):
            reading = _base_reading(host, env, None)
            _fill_versions(reading, module)
            _fill_gpu(reading, module, gpu, sysfs)
            readings.append(reading)
    except Exception:  # noqa: BLE001 - what was read so far stands
        pass
    finally:
        _shutdown(module)
    return readings


def _base_reading(host: str | None, env: Mapping[str, str], device_index: int | None) -> dict:
    versions = Versions()
    torch_versions(versions)  # never imports torch: a rank has it loaded, a CLI reads its metadata
    return {
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "device": device_index,
        "gpu": None,
        "versions": {"driver": None, "cuda_driver": None, "cuda_runtime": versions.cuda_runtime,
                     "nccl": versions.nccl, "torch": versions.torch},
        "nccl_env": {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")},
        "notes": [],
    }


def _open_nvml(nvml: Any, notes: list[str]) -> Any:
    if nvml is _DEFAULT:
        try:
            import pynvml as nvml  # noqa: PLC0415 - optional dependency
        except Exception as error:  # noqa: BLE001
            notes.append(f"no GPU reading: pynvml not importable ({error})")
            return None
    if nvml is None:
        notes.append("no GPU reading: NVML not used")
        return None
    try:
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - no driver, no library, no permission
        notes.append(f"no GPU reading: NVML unavailable ({type(error).__name__}: {error})")
        return None
    return nvml


def _shutdown(module: Any) -> None:
    try:
        module.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


def _fill_versions(reading: dict, module: Any) -> None:
    reading["versions"]["driver"], reading["versions"]["cuda_driver"] = driver_versions(module)


def _torch_bus_id(device_index: int) -> str | None:
    """The PCI bus id torch gives the device, only where torch has initialised CUDA
    already (initialising it here could break a later fork)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        props = torch.cuda.get_device_properties(device_index)
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001
        return None


def _choose(gpus: list, device_index: int, bus_id: str | None, env: Mapping[str, str], strict: bool):
    """The GPU with `bus_id`; where none has it and the id was not the caller's (torch's
    view, which a container may number otherwise), the one CUDA_VISIBLE_DEVICES picks."""
    if bus_id:
        found = next((g for g in gpus if g[2] == bus_id), None)
        if found is not None or strict:
            return found
    order, _how = cuda_order_from_env(device_index + 1, [(g[0], g[2], g[3]) for g in gpus], env)
    nvml_index = order[device_index] if device_index < len(order) else None
    return next((g for g in gpus if g[0] == nvml_index), None)


def _fill_gpu(reading: dict, module: Any, gpu: tuple, sysfs: str | os.PathLike) -> None:
    index, handle, bus_id, uuid, name = gpu
    reading["gpu"] = {"index": index, "name": name, "pci_bus_id": bus_id, "uuid": uuid}
    health = gpu_health(module, handle)
    health["pcie"]["sysfs"] = pcie_from_sysfs(sysfs, bus_id)
    states = health.pop("nvlink_states")
    health["nvlink"] = None if states is None else {
        "links": len(states), "up": sum(states), "down": [k for k, s in enumerate(states) if not s]}
    reading.update(health)


def pcie_generation(text: str | None) -> int | None:
    """'32.0 GT/s PCIe' (sysfs) -> 5; None for what is not a known rate ('Unknown')."""
    try:
        rate = float(str(text).split()[0])
    except (ValueError, IndexError):
        return None
    return GT_PER_S_GENERATION.get(rate)


def pcie_from_sysfs(sysfs: str | os.PathLike, bus_id: str | None) -> dict | None:
    """The PCIe link of a device as sysfs has it (the kernel reads the link registers):
    generation and width now and at most. None where sysfs does not list the device."""
    if not bus_id:
        return None
    device = Path(sysfs) / "bus/pci/devices" / bus_id
    if not device.is_dir():
        return None

    def read(name: str) -> str | None:
        try:
            return (device / name).read_text().strip()
        except OSError:
            return None

    def width(name: str) -> int | None:
        text = read(name)
        return int(text) if text and text.isdigit() else None

    return {"gen": pcie_generation(read("current_link_speed")), "width": width("current_link_width"),
            "max_gen": pcie_generation(read("max_link_speed")), "max_width": width("max_link_width")}


# --------------------------------------------------------------------- comparing


def causes_by_host(readings: Mapping[Any, dict], hosts: Mapping[Any, str] | None = None) -> dict[str, list[str]]:
    """{host: [cause lines]} from every rank's reading ({rank: read_local()}); each host of
    the readings is a key, [] where nothing is degraded or different. `hosts` ({rank: host
    name}) names the hosts as the caller's report does, where that differs from the
    readings' own host names."""
    by_rank = {rank: dict(r, host=(hosts or {}).get(rank, r.get("host") or "?")) for rank, r in readings.items()}
    out: dict[str, list[str]] = {r["host"]: [] for r in by_rank.values()}
    gpus = _distinct_gpus(by_rank.values())
    for host, line in _gpu_causes(gpus):
        _add(out, host, line)
    if gpus:
        for rank, r in sorted(by_rank.items(), key=lambda item: str(item[0])):
            if r.get("gpu") is None:
                why = next((n for n in r.get("notes", []) if n.startswith("no GPU reading")), "no GPU reading")
                _add(out, r["host"], f"rank {rank}: {why}")
    for host, line in _version_causes(by_rank):
        _add(out, host, line)
    for host, line in _env_causes(by_rank):
        _add(out, host, line)
    return out


def attach_causes(report_hosts: list[dict], readings: Mapping[Any, dict],
                  hosts: Mapping[Any, str] | None = None) -> None:  # fmt: skip
    """Set `causes` on each host record of a report ({"host": name, ...}) from the readings."""
    causes = causes_by_host(readings, hosts)
    for record in report_hosts:
        record["causes"] = causes.get(record["host"], [])


def _add(out: dict[str, list[str]], host: str, line: str) -> None:
    lines = out.setdefault(host, [])
    if line not in lines:
        lines.append(line)


def _distinct_gpus(readings: Iterable[dict]) -> list[dict]:
    """One reading per physical GPU (ranks sharing a GPU read it alike), by host and GPU index."""
    seen: dict[tuple, dict] = {}
    for r in readings:
        gpu = r.get("gpu")
        if gpu is not None:
            seen.setdefault((r["host"], gpu.get("pci_bus_id") or gpu.get("index")), r)
    return sorted(seen.values(), key=lambda r: (r["host"], r["gpu"].get("index") or 0))


def _gpu_causes(gpus: list[dict]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    by_model: dict[str, list[dict]] = {}
    for r in gpus:
        by_model.setdefault(r["gpu"].get("name") or "?", []).append(r)
    for r in gpus:
        peers = [p for p in by_model[r["gpu"].get("name") or "?"] if p is not r]
        label = f"GPU {r['gpu'].get('index')}"
        for line in (_pcie_cause(r, peers), _nvlink_cause(r, peers, gpus), _ecc_cause(r, peers),
                     _remap_cause(r), _clock_cause(r)):  # fmt: skip
            if line:
                out.append((r["host"], f"{label}: {line}"))
    return out


def pcie_link(reading: dict) -> tuple[int | None, int | None, int | None, int | None]:
    """(generation judged, width now, generation expected of this GPU, width expected) of a
    reading: the generation now where the GPU was busy, else what the link can reach."""
    pcie = reading.get("pcie") or {}
    sysfs = pcie.get("sysfs") or {}
    width = pcie.get("width") or sysfs.get("width")
    max_width = max([w for w in (pcie.get("max_width"), sysfs.get("max_width")) if w] or [None], key=lambda w: w or 0)
    reachable = pcie.get("max_gen") or sysfs.get("max_gen")
    busy = (reading.get("clocks") or {}).get("idle") is False
    now = pcie.get("gen") or sysfs.get("gen")
    gen = now if busy and now else reachable
    expected_gen = reachable if busy and now else None
    return gen, width, expected_gen, max_width


def _link_text(gen: int | None, width: int | None) -> str:
    return " ".join(part for part in (f"Gen{gen}" if gen else None, f"x{width}" if width else None) if part) or "?"


def _pcie_cause(r: dict, peers: list[dict]) -> str | None:
    gen, width, own_gen, own_width = pcie_link(r)
    if gen is None and width is None:
        return None
    links = [pcie_link(p)[:2] for p in peers]
    best_gen = max([g for g, _ in links if g] + [gen or 0, own_gen or 0])
    best_width = max([w for _, w in links if w] + [width or 0, own_width or 0])
    if (gen or best_gen) >= best_gen and (width or best_width) >= best_width:
        return None
    expected = (best_gen or None, best_width or None)
    mine = _link_text(gen, width)
    if peers and all(link == expected for link in links):
        return f"PCIe {mine}, the others {_link_text(*expected)}"
    return f"PCIe {mine}, {_link_text(*expected)} expected"


def model_nvlinks(name: str | None) -> int | None:
    """NVLinks a GPU of this model has on an HGX board, where known."""
    if not name or any(mark in name for mark in _PCIE_CARD_MARKS):
        return None
    return next((count for key, count in MODEL_NVLINKS if key in name), None)


def _nvlink_cause(r: dict, peers: list[dict], gpus: list[dict]) -> str | None:
    """Links down against what the same model has up elsewhere in the job, or (where NVLinks
    are in use: some are up, or the host has several GPUs of the model) what it should have."""
    link = r.get("nvlink")
    if link is None:
        return None
    up = link.get("up") or 0
    peers_up = max([(p.get("nvlink") or {}).get("up") or 0 for p in peers] + [up])
    expected = peers_up
    model = model_nvlinks(r["gpu"].get("name"))
    same_host = sum(1 for p in peers if p["host"] == r["host"])
    if model and (peers_up > 0 or same_host > 0):
        expected = max(expected, model)
    if up >= expected:
        return None
    return f"{expected - up} of {expected} NVLink links down"


def _ecc_cause(r: dict, peers: list[dict]) -> str | None:
    ecc = r.get("ecc") or {}
    volatile, aggregate = ecc.get("volatile_uncorrected") or 0, ecc.get("aggregate_uncorrected") or 0
    if volatile:
        return f"{volatile} uncorrectable ECC error{'s' if volatile != 1 else ''} since the driver loaded"
    if aggregate:
        return f"{aggregate} uncorrectable ECC error{'s' if aggregate != 1 else ''} in its lifetime"
    if ecc.get("enabled") is False and any((p.get("ecc") or {}).get("enabled") for p in peers):
        return "ECC off, on for the others"
    return None


def _remap_cause(r: dict) -> str | None:
    remap = r.get("row_remap") or {}
    if remap.get("failed"):
        return "row remapping failed (no spare rows left: the GPU needs service)"
    if remap.get("pending"):
        return "row remap pending (applied at the next GPU reset)"
    return None


def _clock_cause(r: dict) -> str | None:
    slowdown = (r.get("clocks") or {}).get("slowdown") or []
    return f"throttled ({', '.join(slowdown)})" if slowdown else None


def _host_values(by_rank: Mapping[Any, dict], value_of) -> dict[str, Any]:
    """{host: its ranks' value}, a tuple of the distinct values where its ranks differ."""
    values: dict[str, list] = {}
    for _rank, r in sorted(by_rank.items(), key=lambda item: str(item[0])):
        value = value_of(r)
        if value not in values.setdefault(r["host"], []):
            values[r["host"]].append(value)
    return {h: v[0] if len(v) == 1 else tuple(v) for h, v in values.items()}


def _split(values: Mapping[str, Any], render, only_suffix: str = "", elsewhere: str = "elsewhere"
           ) -> list[tuple[str, str]]:  # fmt: skip
    """Lines for the hosts whose value is not the one most hosts have ('X on node3, Y
    elsewhere'); with no such value, a line on every host naming each value's hosts."""
    groups: dict[Any, list[str]] = {}
    for host, value in sorted(values.items()):
        groups.setdefault(value, []).append(host)
    if len(groups) < 2:
        return []
    ranked = sorted(groups.items(), key=lambda item: -len(item[1]))
    if len(ranked[0][1]) > len(ranked[1][1]):
        common = ranked[0][0]
        out = []
        for value, hosts in ranked[1:]:
            line = render(value, common, ", ".join(hosts))
            out.extend((host, line) for host in hosts)
        return out
    line = ", ".join(f"{render(value, None, None)} on {', '.join(hosts)}" for value, hosts in ranked)
    return [(host, line) for host in values]


def _version_causes(by_rank: Mapping[Any, dict]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for key, name in VERSION_FIELDS:
        values = _host_values(by_rank, lambda r: (r.get("versions") or {}).get(key))
        known = {h: v for h, v in values.items() if v is not None and not isinstance(v, tuple)}
        for host, value in values.items():
            if isinstance(value, tuple):
                out.append((host, f"{name} differs between its ranks: " + ", ".join(str(v) for v in value)))

        def render(value, common, hosts, name=name):
            return f"{name} {value}" if hosts is None else f"{name} {value} on {hosts}, {common} elsewhere"

        out.extend(_split(known, render))
    return out


def _env_causes(by_rank: Mapping[Any, dict]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    names = sorted({k for r in by_rank.values() for k in (r.get("nccl_env") or {}) if not k.startswith(UNCOMPARED_ENV)})
    for name in names:
        values = _host_values(by_rank, lambda r: (r.get("nccl_env") or {}).get(name))
        for host, value in values.items():
            if isinstance(value, tuple):
                out.append((host, f"{name} differs between its ranks: "
                                  + ", ".join(_setting(name, v) for v in value)))  # fmt: skip
        plain = {h: v for h, v in values.items() if not isinstance(v, tuple)}

        def render(value, common, hosts, name=name):
            if hosts is None:
                return _setting(name, value)
            if common is None:
                return f"{name}={value} set on {hosts} only"
            return f"{_setting(name, value)} on {hosts}, {name}={common} elsewhere"

        out.extend(_split(plain, render))
    return out


def _setting(name: str, value: str | None) -> str:
    return f"{name} unset" if value is None else f"{name}={value}"


# ------------------------------------------------------------------------ showing


def reading_cells(reading: dict) -> dict[str, str]:
    """A reading in a few short words per column, for a table (topo)."""
    gpu = reading.get("gpu") or {}
    pcie = reading.get("pcie") or {}
    sysfs = pcie.get("sysfs") or {}
    now = _link_text(pcie.get("gen") or sysfs.get("gen"), pcie.get("width") or sysfs.get("width"))
    most = _link_text(pcie.get("max_gen") or sysfs.get("max_gen"),
                      max(w for w in (pcie.get("max_width"), sysfs.get("max_width"), 0) if w is not None) or None)
    link = reading.get("nvlink")
    ecc = reading.get("ecc") or {}
    remap = reading.get("row_remap")
    clocks = reading.get("clocks")

    def count(value: Any) -> str:
        return "?" if value is None else str(value)

    return {
        "GPU": f"GPU {gpu.get('index')}",
        "PCIe now": now + (" (idle)" if (clocks or {}).get("idle") else ""),
        "PCIe max": most,
        "NVLinks up": "-" if link is None else f"{link['up']}/{link['links']}",
        "ECC uncorr. (boot/life)": "off" if ecc.get("enabled") is False else
        f"{count(ecc.get('volatile_uncorrected'))}/{count(ecc.get('aggregate_uncorrected'))}",
        "row remap": "?" if remap is None else ("FAILED" if remap["failed"] else "pending" if remap["pending"] else
                                                f"{remap['corrected_rows'] + remap['uncorrected_rows']} remapped"),
        "clocks": "?" if clocks is None else (", ".join(clocks["slowdown"]) or ("idle" if clocks["idle"] else "ok")),
    }

