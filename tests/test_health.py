"""ncclbench.topology.health without a GPU: readings from a fake NVML module (pynvml's
shape) and a sysfs tree on disk, and the cause lines their comparison names, with each
degradation planted one at a time and none on healthy hosts."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from ncclbench.topology import health
from ncclbench.topology.health import causes_by_host, pcie_generation, read_local

H100 = "NVIDIA H100 80GB HBM3"


class FakeNvmlError(Exception):
    """Stands for pynvml.NVMLError."""


def healthy_gpu(index: int, name: str = H100) -> dict:
    return {
        "name": name, "bus": f"0000:{0x18 + 16 * index:02x}:00.0", "uuid": f"GPU-{index:08x}-aaaa",
        "pcie": (1, 16, 5, 16, 5),  # an idle GPU: Gen1 now, Gen5 reachable, x16
        "nvlink": [1] * 18, "ecc": (True, 0, 0), "remap": (0, 0, 0, 0),
        "reasons": 0x1,  # GpuIdle
    }


class FakeNvml:
    """A pynvml-shaped module over a list of GPU dicts (healthy_gpu's keys)."""

    NVMLError = FakeNvmlError

    def __init__(self, gpus, driver="580.65.06", cuda=13000, old_clock_api=False):
        self.gpus, self.driver, self.cuda = gpus, driver, cuda
        self.initialised = 0
        if old_clock_api:  # drivers before 535 have only the ThrottleReasons name
            self.nvmlDeviceGetCurrentClocksThrottleReasons = self._reasons
        else:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._reasons

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return self.cuda

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"]

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h]["uuid"]

    def nvmlDeviceGetPciInfo(self, h):
        domain, bus, rest = self.gpus[h]["bus"].split(":")
        return SimpleNamespace(domain=int(domain, 16), bus=int(bus, 16), device=int(rest.split(".")[0], 16))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self.gpus[h]["pcie"][0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self.gpus[h]["pcie"][1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.gpus[h]["pcie"][2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.gpus[h]["pcie"][3]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h):
        return self.gpus[h]["pcie"][4]

    def nvmlDeviceGetNvLinkState(self, h, link):
        states = self.gpus[h]["nvlink"]
        if link >= len(states):
            raise FakeNvmlError("Invalid Argument")
        return states[link]

    def nvmlDeviceGetEccMode(self, h):
        if self.gpus[h]["ecc"] is None:
            raise FakeNvmlError("Not Supported")
        return [int(self.gpus[h]["ecc"][0])] * 2

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        assert error_type == 1  # uncorrected
        return self.gpus[h]["ecc"][1 + counter]

    def nvmlDeviceGetRemappedRows(self, h):
        return self.gpus[h]["remap"]

    def _reasons(self, h):
        return self.gpus[h]["reasons"]


class FailingNvml:
    def nvmlInit(self):
        raise FakeNvmlError("NVML Shared Library Not Found")


def sysfs_tree(root, gpus):
    """/sys/bus/pci/devices/<bus>/ with the link files the kernel writes."""
    rates = {1: "2.5 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
    for gpu in gpus:
        device = root / "bus/pci/devices" / gpu["bus"]
        device.mkdir(parents=True)
        gen, width, max_gen, max_width, _ = gpu["pcie"]
        (device / "current_link_speed").write_text(rates[gen] + "\n")
        (device / "current_link_width").write_text(f"{width}\n")
        (device / "max_link_speed").write_text(rates[max_gen] + "\n")
        (device / "max_link_width").write_text(f"{max_width}\n")
    return root


def job_readings(hosts: dict[str, list[dict]], env=None, drivers=None) -> dict[int, dict]:
    """{rank: reading}: one rank per GPU, ranks numbered host by host, each read through read_local."""
    out, rank = {}, 0
    for host, gpus in hosts.items():
        nvml = FakeNvml(gpus, driver=(drivers or {}).get(host, "580.65.06"))
        for device in range(len(gpus)):
            out[rank] = read_local(device, nvml=nvml, sysfs="/nonexistent", host=host,
                                   env=(env or {}).get(host, {"NCCL_NVLS_ENABLE": "0"}))
            rank += 1
    return out


def two_hosts(gpus_per_host=4, hosts=("node1", "node2")):
    return {h: [healthy_gpu(i) for i in range(gpus_per_host)] for h in hosts}


# --------------------------------------------------------------------- reading


def test_reading_of_a_healthy_gpu_is_plain_json_and_complete(tmp_path):
    gpus = [healthy_gpu(i) for i in range(4)]
    nvml = FakeNvml(gpus)
    reading = read_local(2, nvml=nvml, sysfs=sysfs_tree(tmp_path, gpus), host="node1",
                         env={"NCCL_ALGO": "Ring", "PATH": "/bin"})
    assert json.loads(json.dumps(reading)) == reading
    assert nvml.initialised == 0  # NVML shut down again
    assert reading["host"] == "node1" and reading["device"] == 2
    assert reading["gpu"] == {"index": 2, "name": H100, "pci_bus_id": "0000:38:00.0", "uuid": "GPU-00000002-aaaa"}
    assert reading["pcie"] == {"gen": 1, "width": 16, "max_gen": 5, "max_width": 16, "gpu_max_gen": 5,
                               "sysfs": {"gen": 1, "width": 16, "max_gen": 5, "max_width": 16}}
    assert reading["nvlink"] == {"links": 18, "up": 18, "down": []}
    assert reading["ecc"] == {"enabled": True, "volatile_uncorrected": 0, "aggregate_uncorrected": 0}
    assert reading["row_remap"] == {"corrected_rows": 0, "uncorrected_rows": 0, "pending": False, "failed": False}
    assert reading["clocks"] == {"reasons_mask": 1, "idle": True, "slowdown": []}
    assert reading["versions"]["driver"] == "580.65.06" and reading["versions"]["cuda_driver"] == "13.0"
    assert reading["nccl_env"] == {"NCCL_ALGO": "Ring"}


def test_without_nvml_the_reading_says_so():
    for nvml, why in ((FailingNvml(), "NVML unavailable (FakeNvmlError: NVML Shared Library Not Found)"),
                      (None, "NVML not used")):  # fmt: skip
        reading = read_local(0, nvml=nvml, host="laptop", env={})
        assert reading["gpu"] is None and reading["notes"] == [f"no GPU reading: {why}"]
        assert reading["versions"]["torch"]  # read from the installed package, torch not imported for it
        json.dumps(reading)
    assert causes_by_host({0: read_local(0, nvml=None, host="laptop", env={})}) == {"laptop": []}


def test_on_this_machine_without_gpu_read_local_does_not_raise():
    reading = read_local(0)
    json.dumps(reading)
    assert reading["gpu"] is None or reading["gpu"]["index"] is not None


def test_cuda_visible_devices_picks_the_gpu_as_cuda_numbers_it():
    nvml = FakeNvml([healthy_gpu(i) for i in range(4)])
    reading = read_local(1, nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "2,3"}, host="h")
    assert reading["gpu"]["index"] == 3
    assert read_local(0, nvml=nvml, env={}, host="h", pci_bus_id="0000:28:00.0")["gpu"]["index"] == 1
    assert read_local(0, nvml=nvml, env={}, host="h", pci_bus_id="0000:99:00.0")["gpu"] is None
    missing = read_local(2, nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "0"}, host="h")
    assert missing["gpu"] is None and "NVML lists no GPU for CUDA device 2" in missing["notes"][0]


def test_drivers_before_535_answer_throttle_reasons_under_their_old_name():
    gpu = healthy_gpu(0) | {"reasons": 0x20}
    reading = read_local(0, nvml=FakeNvml([gpu], old_clock_api=True), host="h", env={})
    assert reading["clocks"]["slowdown"] == ["thermal"]


def test_a_gpu_without_ecc_or_nvlink_reads_none_for_them():
    gpu = healthy_gpu(0, "NVIDIA GeForce RTX 4090") | {"ecc": None, "nvlink": []}
    reading = read_local(0, nvml=FakeNvml([gpu]), host="h", env={})
    assert reading["ecc"] == {"enabled": None, "volatile_uncorrected": None, "aggregate_uncorrected": None}
    assert reading["nvlink"] is None
    assert causes_by_host({0: reading}) == {"h": []}


@pytest.mark.parametrize("text, gen", [("32.0 GT/s PCIe", 5), ("16.0 GT/s PCIe", 4), ("2.5 GT/s PCIe", 1),
                                       ("8.0 GT/s", 3), ("Unknown", None), ("", None), (None, None)])
def test_pcie_generation_from_sysfs_text(text, gen):
    assert pcie_generation(text) == gen


def test_sysfs_alone_gives_the_link_where_nvml_has_no_pcie_calls(tmp_path):
    gpus = [healthy_gpu(i) | {"pcie": (5, 8 if i == 1 else 16, 5, 16, 5)} for i in range(2)]
    nvml = FakeNvml(gpus)
    for name in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
                 "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"):  # fmt: skip
        setattr(nvml, name, None)
    sysfs = sysfs_tree(tmp_path, gpus)
    readings = {d: read_local(d, nvml=nvml, sysfs=sysfs, host="node1", env={}) for d in range(2)}
    assert readings[1]["pcie"]["gen"] is None and readings[1]["pcie"]["sysfs"]["width"] == 8
    assert causes_by_host(readings) == {"node1": ["GPU 1: PCIe Gen5 x8, the others Gen5 x16"]}


# --------------------------------------------------------------------- causes


def test_healthy_uniform_readings_name_no_cause():
    readings = job_readings(two_hosts(8, ("node1", "node2", "node3")))
    assert causes_by_host(readings) == {"node1": [], "node2": [], "node3": []}


def plant(hosts, host, gpu, **changes):
    hosts = copy.deepcopy(hosts)
    hosts[host][gpu].update(changes)
    return hosts


BUSY = (5, 16, 5, 16, 5)  # a busy GPU's link: Gen5 now
PLANTED = [
    ("PCIe width", dict(pcie=(1, 8, 5, 16, 5)), "GPU 3: PCIe Gen5 x8, the others Gen5 x16"),
    ("PCIe slot", dict(pcie=(1, 16, 4, 16, 5)), "GPU 3: PCIe Gen4 x16, the others Gen5 x16"),
    ("PCIe gen under load", dict(pcie=(3, 16, 5, 16, 5), reasons=0), "GPU 3: PCIe Gen3 x16, the others Gen5 x16"),
    ("NVLink down", dict(nvlink=[1] * 16 + [0, 0]), "GPU 3: 2 of 18 NVLink links down"),
    ("ECC since boot", dict(ecc=(True, 3, 3)), "GPU 3: 3 uncorrectable ECC errors since the driver loaded"),
    ("ECC lifetime", dict(ecc=(True, 0, 1)), "GPU 3: 1 uncorrectable ECC error in its lifetime"),
    ("ECC off", dict(ecc=(False, 0, 0)), "GPU 3: ECC off, on for the others"),
    ("row remap pending", dict(remap=(0, 1, 1, 0)), "GPU 3: row remap pending (applied at the next GPU reset)"),
    ("row remap failed", dict(remap=(0, 8, 0, 1)),
     "GPU 3: row remapping failed (no spare rows left: the GPU needs service)"),
    ("thermal", dict(reasons=0x20, pcie=BUSY), "GPU 3: throttled (thermal)"),
    ("power and hardware", dict(reasons=0x4 | 0x8 | 0x40, pcie=BUSY), "GPU 3: throttled (power cap, hardware slowdown, "
                                                             "hardware thermal slowdown)"),
]


@pytest.mark.parametrize("what, change, line", PLANTED, ids=[p[0] for p in PLANTED])
def test_each_planted_degradation_is_named_on_its_host_only(what, change, line):
    hosts = plant(two_hosts(4, ("node1", "node2", "node3")), "node2", 3, **change)
    assert causes_by_host(job_readings(hosts)) == {"node1": [], "node2": [line], "node3": []}


def test_an_idle_gpu_at_gen1_is_not_degraded_but_a_busy_one_is():
    idle = plant(two_hosts(), "node1", 0, pcie=(1, 16, 5, 16, 5), reasons=0x1)
    assert causes_by_host(job_readings(idle)) == {"node1": [], "node2": []}
    busy = plant(two_hosts(), "node1", 0, pcie=(1, 16, 5, 16, 5), reasons=0x0)
    assert causes_by_host(job_readings(busy))["node1"] == ["GPU 0: PCIe Gen1 x16, the others Gen5 x16"]


def test_idle_and_application_clock_settings_are_not_throttling():
    quiet = plant(two_hosts(), "node1", 0, reasons=0x1 | 0x2 | 0x10 | 0x100)
    assert causes_by_host(job_readings(quiet)) == {"node1": [], "node2": []}


def test_a_slot_platform_wide_below_the_gpu_is_no_cause():
    """Gen5 GPUs in Gen4 slots everywhere: the platform, not a fault."""
    hosts = {h: [healthy_gpu(i) | {"pcie": (1, 16, 4, 16, 5)} for i in range(4)] for h in ("node1", "node2")}
    assert causes_by_host(job_readings(hosts)) == {"node1": [], "node2": []}


def test_a_lone_gpu_compares_against_its_own_maximum():
    gpu = healthy_gpu(0) | {"pcie": (5, 8, 5, 16, 5), "reasons": 0}
    assert causes_by_host(job_readings({"node1": [gpu]})) == {"node1": ["GPU 0: PCIe Gen5 x8, Gen5 x16 expected"]}


def test_nvlinks_all_down_on_a_host_of_several_hgx_gpus_and_not_on_a_single_gpu_machine():
    down = {"node1": [healthy_gpu(i) | {"nvlink": [0] * 18} for i in range(2)]}
    assert causes_by_host(job_readings(down)) == {"node1": ["GPU 0: 18 of 18 NVLink links down",
                                                            "GPU 1: 18 of 18 NVLink links down"]}
    single = {"node1": [healthy_gpu(0) | {"nvlink": [0] * 18}]}
    assert causes_by_host(job_readings(single)) == {"node1": []}
    pcie_cards = {"node1": [healthy_gpu(i, "NVIDIA H100 PCIe") | {"nvlink": [0] * 18} for i in range(2)]}
    assert causes_by_host(job_readings(pcie_cards)) == {"node1": []}


def test_two_ranks_on_one_gpu_name_its_fault_once():
    hosts = plant(two_hosts(1), "node1", 0, reasons=0x20, pcie=BUSY)
    readings = job_readings(hosts)
    readings[2] = copy.deepcopy(readings[0])
    assert causes_by_host(readings)["node1"] == ["GPU 0: throttled (thermal)"]


def test_a_driver_differing_on_one_host_is_named_there():
    readings = job_readings(two_hosts(2, ("node1", "node2", "node3")), drivers={"node3": "575.57.08"})
    assert causes_by_host(readings) == {"node1": [], "node2": [],
                                        "node3": ["driver 575.57.08 on node3, 580.65.06 elsewhere"]}


def test_two_hosts_differing_without_a_majority_both_get_the_line():
    readings = job_readings(two_hosts(1), drivers={"node2": "575.57.08"})
    line = "driver 580.65.06 on node1, driver 575.57.08 on node2"
    assert causes_by_host(readings) == {"node1": [line], "node2": [line]}


def test_torch_differing_on_one_host():
    readings = job_readings(two_hosts(1, ("a", "b", "c")))
    readings[1]["versions"]["torch"] = "2.10.0"
    causes = causes_by_host(readings)
    assert causes["b"] == [f"torch 2.10.0 on b, {readings[0]['versions']['torch']} elsewhere"]
    assert causes["a"] == causes["c"] == []


def test_nccl_settings_set_on_one_host_only_or_differing():
    base = {"NCCL_NVLS_ENABLE": "0"}
    env = {"node1": base, "node2": base | {"NCCL_ALGO": "Ring"}, "node3": base}
    causes = causes_by_host(job_readings(two_hosts(2, ("node1", "node2", "node3")), env=env))
    assert causes == {"node1": [], "node2": ["NCCL_ALGO=Ring set on node2 only"], "node3": []}

    env = {"node1": base | {"NCCL_PROTO": "Simple"}, "node2": base, "node3": base | {"NCCL_PROTO": "Simple"}}
    causes = causes_by_host(job_readings(two_hosts(1, ("node1", "node2", "node3")), env=env))
    assert causes["node2"] == ["NCCL_PROTO unset on node2, NCCL_PROTO=Simple elsewhere"]

    env = {"node1": {"NCCL_PROTO": "LL"}, "node2": {"NCCL_PROTO": "Simple"}, "node3": {"NCCL_PROTO": "Simple"}}
    causes = causes_by_host(job_readings(two_hosts(1, ("node1", "node2", "node3")), env=env))
    assert causes["node1"] == ["NCCL_PROTO=LL on node1, NCCL_PROTO=Simple elsewhere"]


def test_variables_that_name_a_host_differ_by_design():
    env = {h: {"NCCL_HOSTID": h, "NCCL_DEBUG_FILE": f"/tmp/{h}.%p.log", "NCCL_TESTS_MIN_BW": h}
           for h in ("node1", "node2")}
    assert causes_by_host(job_readings(two_hosts(1), env=env)) == {"node1": [], "node2": []}


def test_ranks_of_one_host_with_different_settings():
    readings = job_readings(two_hosts(2))
    readings[1]["nccl_env"]["NCCL_ALGO"] = "Tree"
    assert causes_by_host(readings)["node1"] == ["NCCL_ALGO differs between its ranks: NCCL_ALGO unset, "
                                                 "NCCL_ALGO=Tree"]


def test_a_rank_without_a_gpu_reading_among_ranks_with_one():
    readings = job_readings(two_hosts(1))
    readings[1] = read_local(0, nvml=FailingNvml(), host="node2", env={"NCCL_NVLS_ENABLE": "0"})
    causes = causes_by_host(readings)
    assert causes["node2"] == ["rank 1: no GPU reading: NVML unavailable (FakeNvmlError: NVML Shared Library "
                               "Not Found)"]
    assert causes["node1"] == []


def test_host_names_of_the_report_override_the_readings_and_attach_to_its_hosts():
    hosts = plant(two_hosts(1), "node2", 0, reasons=0x21)  # thermal while idle
    readings = job_readings(hosts)
    names = {0: "gpu-a.cluster", 1: "gpu-b.cluster"}
    assert causes_by_host(readings, names) == {"gpu-a.cluster": [], "gpu-b.cluster": ["GPU 0: throttled (thermal)"]}
    report_hosts = [{"host": "gpu-a.cluster", "verdict": "ok"}, {"host": "gpu-b.cluster", "verdict": "drain"}]
    health.attach_causes(report_hosts, readings, names)
    assert report_hosts[1]["causes"] == ["GPU 0: throttled (thermal)"] and report_hosts[0]["causes"] == []


def test_several_causes_on_one_host_come_gpu_by_gpu_then_software():
    hosts = plant(two_hosts(4, ("node1", "node2", "node3")), "node2", 1, ecc=(True, 2, 2))
    hosts = plant(hosts, "node2", 0, reasons=0x8, pcie=BUSY)
    readings = job_readings(hosts, drivers={"node2": "575.57.08"})
    assert causes_by_host(readings)["node2"] == [
        "GPU 0: throttled (hardware slowdown)",
        "GPU 1: 2 uncorrectable ECC errors since the driver loaded",
        "driver 575.57.08 on node2, 580.65.06 elsewhere",
    ]


# --------------------------------------------------------------------- topo


@pytest.fixture
def fake_host(monkeypatch):
    """`topo` on a (fake) host of 4 H100s, GPU 2 with 2 NVLinks down and at PCIe x8."""
    from ncclbench.topology import probe as topo_probe

    gpus = [healthy_gpu(i) for i in range(4)]
    gpus[2].update(nvlink=[1] * 16 + [0, 0], pcie=(1, 8, 5, 16, 5))
    topo = topo_probe.probe(nvml=FakeNvml(gpus), cuda=False, smi=None, sysfs="/nonexistent", env={})
    monkeypatch.setattr(topo_probe, "probe", lambda include_nics=True: topo)
    real = health.read_host
    monkeypatch.setattr(health, "read_host", lambda: real(nvml=FakeNvml(gpus), sysfs="/nonexistent", host="node1"))


def test_topo_shows_each_gpus_readings_and_the_causes(fake_host):
    from ncclbench.cli.topo import topo_command

    result = CliRunner().invoke(topo_command, ["--no-nics"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "GPU health" in out
    row = next(line.split() for line in out.splitlines() if line.strip().startswith("GPU 2 "))
    assert row[:5] == ["GPU", "2", "Gen1", "x8", "(idle)"] and "16/18" in row
    assert "Causes:\n  - GPU 2: PCIe Gen5 x8, the others Gen5 x16\n  - GPU 2: 2 of 18 NVLink links down" in out

    data = json.loads(CliRunner().invoke(topo_command, ["--json", "--no-nics"]).stdout)
    assert [r["gpu"]["index"] for r in data["health"]["readings"]] == [0, 1, 2, 3]
    assert data["health"]["causes"] == ["GPU 2: PCIe Gen5 x8, the others Gen5 x16", "GPU 2: 2 of 18 NVLink links down"]


def test_topo_on_a_healthy_host_says_no_cause(monkeypatch):
    from ncclbench.cli.topo import topo_command
    from ncclbench.topology import probe as topo_probe

    gpus = [healthy_gpu(i) for i in range(2)]
    topo = topo_probe.probe(nvml=FakeNvml(gpus), cuda=False, smi=None, sysfs="/nonexistent", env={})
    monkeypatch.setattr(topo_probe, "probe", lambda include_nics=True: topo)
    monkeypatch.setattr(health, "read_host", lambda: [read_local(d, nvml=FakeNvml(gpus), host="n", env={})
                                                      for d in range(2)])
    out = CliRunner().invoke(topo_command, ["--no-nics"]).stdout
    assert "Causes: none (PCIe, NVLink, ECC, row remapping and clocks as expected)" in out


# ----------------------------------------------- on the GPU machine (pytest -m gpu)


@pytest.mark.gpu
def test_real_gpu_reading_idle_and_under_load():
    """On a real GPU: every reading is there, and a GPU kept busy (matmuls and host-to-device
    copies) reads not idle, at the PCIe generation its link can reach."""
    import threading
    import time

    import torch

    idle = read_local(0)
    print(json.dumps(idle, indent=1))
    assert idle["gpu"] is not None, idle["notes"]
    assert idle["pcie"]["width"] and idle["pcie"]["max_width"] and idle["pcie"]["max_gen"]
    assert idle["versions"]["driver"] and idle["versions"]["nccl"] and idle["clocks"] is not None
    json.dumps(idle)

    x = torch.randn(8192, 8192, device="cuda")
    host = torch.empty(1 << 28, dtype=torch.uint8).pin_memory()
    device = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    stop = threading.Event()

    def work():
        while not stop.is_set():
            device.copy_(host, non_blocking=True)
            x @ x
            torch.cuda.synchronize()

    worker = threading.Thread(target=work)
    worker.start()
    try:
        time.sleep(2)
        busy = read_local(0)
    finally:
        stop.set()
        worker.join()
    print(json.dumps(busy, indent=1))
    print(causes_by_host({0: idle}), causes_by_host({0: busy}))
    assert busy["clocks"]["idle"] is False
    assert busy["pcie"]["gen"] == busy["pcie"]["max_gen"]
