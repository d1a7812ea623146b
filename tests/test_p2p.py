"""Tests of ncclbench.topology.p2p and the `p2p` command, without a GPU.

FakeApi stands in for TorchCudaApi: buffers are CPU tensors (so copies really
happen and can be verified) and every stream keeps its own clock, advanced by
each copy by latency + bytes / link bandwidth. Events read the clock of their
stream, a stream that waits on an event jumps to the event's time, and a
synchronize brings every clock to "now". That is enough to check the timing
arithmetic, the concurrency of bidirectional copies and the spin handling.
"""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from ncclbench.topology import model, p2p, visible
from ncclbench.topology import probe as topo_mod
from ncclbench.topology.p2p import P2PConfig, P2PError, bandwidth_gbps, run_p2p
from ncclbench.cli.topo import p2p_command

MiB = 2**20


class FakeStream:
    def __init__(self, api, device):
        self.api = api
        self.device = SimpleNamespace(index=device)
        self.clock = 0.0  # seconds
        api.streams.append(self)

    def wait_event(self, event):
        self.clock = max(self.clock, event.time)


class FakeEvent:
    def __init__(self, api):
        self.api = api
        self.time = None

    def record(self, stream):
        self.time = stream.clock

    def query(self):
        return self.api.answer_query()

    def synchronize(self):
        self.api.settle()

    def elapsed_time(self, end):
        return (end.time - self.time) * 1e3


class FakeApi:
    def __init__(self, count=3, link_gbps=None, latency_s=2e-6, can_spin=True, start_passed=0, broken=()):
        self.count = count
        self.link_gbps = link_gbps or (lambda a, b: 2000.0 if a == b else 400.0)
        self.latency_s = latency_s
        self.can_spin = can_spin
        self.start_passed = start_passed  # how many start.query() calls say "already passed"
        self.broken = set(broken)  # (src, dst) pairs whose copies silently do nothing
        self.streams: list[FakeStream] = []
        self.spins: list[float] = []
        self.copied_pairs: set = set()

    def answer_query(self):
        if self.start_passed:
            self.start_passed -= 1
            return True
        return False

    def settle(self):
        now = max(s.clock for s in self.streams)
        for stream in self.streams:
            stream.clock = now

    def device_count(self):
        return self.count

    def device_name(self, device):
        return "Fake GPU"

    def pci_bus_id(self, device):
        return f"0000:00:{device + 6:02x}.0"

    def can_access_peer(self, src, dst):
        return True

    def empty(self, device, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8)

    def stream(self, device):
        return FakeStream(self, device)

    def event(self):
        return FakeEvent(self)

    def copy(self, job):
        nbytes = job.src.numel()
        job.stream.clock += self.latency_s + nbytes / (self.link_gbps(job.src_device, job.dst_device) * 1e9)
        self.copied_pairs.add((job.src_device, job.dst_device))
        if (job.src_device, job.dst_device) not in self.broken:
            job.dst.copy_(job.src)

    def spin(self, stream, milliseconds):
        if not self.can_spin:
            return False
        self.spins.append(milliseconds)
        stream.clock += milliseconds * 1e-3
        return True

    def synchronize(self, devices):
        self.settle()


def expected_gbps(nbytes, link_gbps, latency_s=2e-6):
    return nbytes / (latency_s + nbytes / (link_gbps * 1e9)) / 1e9


SMALL = P2PConfig(size_bytes=1 * MiB, reps=3, iters=4, warmup=1, latency_iters=20)


# ------------------------------------------------------------------ helpers


def test_bandwidth_gbps():
    assert bandwidth_gbps(10**9, 1000.0) == 1.0
    assert bandwidth_gbps(256 * MiB, 0.7) == pytest.approx(383.479, rel=1e-5)


# -------------------------------------------------------------- measurement


def test_run_p2p_recovers_the_link_model():
    # GPU 2 hangs off PCIe (50 GB/s) while 0 and 1 share NVLink (400 GB/s).
    def link(a, b):
        if a == b:
            return 2000.0
        return 50.0 if 2 in (a, b) else 400.0

    api = FakeApi(3, link)
    result = run_p2p(SMALL, api=api)
    size = SMALL.size_bytes
    for i in range(3):
        for j in range(3):
            assert result.unidirectional_gbps[i][j] == pytest.approx(expected_gbps(size, link(i, j)), rel=1e-9)
            assert result.latency_us[i][j] == pytest.approx((2e-6 + 4 / (link(i, j) * 1e9)) * 1e6, rel=1e-9)
            assert result.verified[i][j] is True
            # Both directions run at once on their own streams: twice the bytes in the same time.
            if i != j:
                assert result.bidirectional_gbps[i][j] == pytest.approx(2 * result.unidirectional_gbps[i][j], rel=1e-9)
            else:
                assert result.bidirectional_gbps[i][j] is None
    assert result.peer_access[0] == [None, True, True]
    assert api.copied_pairs == {(i, j) for i in range(3) for j in range(3)}
    assert result.notes == []
    assert [d.pci_bus_id for d in result.devices] == ["0000:00:06.0", "0000:00:07.0", "0000:00:08.0"]


def test_run_p2p_bidirectional_waits_for_the_slower_direction():
    # 0 -> 1 at 400 GB/s, 1 -> 0 at 100 GB/s: both directions start together after the
    # spin, and the timing ends when the slower one is done.
    api = FakeApi(2, lambda a, b: 2000.0 if a == b else (400.0 if a == 0 else 100.0))
    result = run_p2p(SMALL, api=api)
    slow_copy_s = 2e-6 + MiB / 100e9
    assert result.bidirectional_gbps[0][1] == pytest.approx(2 * MiB / slow_copy_s / 1e9, rel=1e-9)
    assert result.unidirectional_gbps[1][0] == pytest.approx(expected_gbps(MiB, 100.0), rel=1e-9)


def test_run_p2p_subset_of_devices_and_no_bidir():
    api = FakeApi(4)
    config = P2PConfig(size_bytes=MiB, reps=1, iters=1, warmup=0, latency_iters=4, bidirectional=False, devices=(3, 1))
    result = run_p2p(config, api=api)
    assert [d.index for d in result.devices] == [3, 1]
    assert api.copied_pairs == {(3, 3), (3, 1), (1, 3), (1, 1)}
    assert result.bidirectional_gbps == [[None, None], [None, None]]
    assert result.unidirectional_gbps[0][1] == pytest.approx(expected_gbps(MiB, 400.0))


def test_run_p2p_flags_a_copy_that_did_not_arrive():
    result = run_p2p(SMALL, api=FakeApi(3, broken={(0, 2)}))
    assert result.verified[0][2] is False and result.verified[2][0] is True
    assert result.failed_pairs() == [(0, 2)]


def test_run_p2p_lengthens_the_spin_when_the_host_is_too_slow():
    api = FakeApi(2, start_passed=2)  # the first two batches start before they are fully queued
    result = run_p2p(P2PConfig(size_bytes=MiB, reps=2, iters=2, warmup=0, latency_iters=4), api=api)
    assert api.spins[:3] == [1.0, 4.0, 16.0]  # bandwidth spin, retried twice, then kept
    assert api.spins[3] == 16.0
    assert result.notes == []

    api = FakeApi(2, start_passed=10**6)
    result = run_p2p(P2PConfig(size_bytes=MiB, reps=1, iters=1, warmup=0, latency_iters=4), api=api)
    assert max(api.spins) == p2p.MAX_SPIN_MS
    assert any(note.startswith("bandwidth: the host queued too slowly") for note in result.notes)
    assert any(note.startswith("latency: the host queued too slowly") for note in result.notes)


def test_run_p2p_without_spin_kernel_says_so():
    config = P2PConfig(size_bytes=MiB, reps=1, iters=1, warmup=0, latency_iters=4)
    result = run_p2p(config, api=FakeApi(2, can_spin=False))
    assert any("no spin kernel" in note for note in result.notes)
    assert result.unidirectional_gbps[0][1] == pytest.approx(expected_gbps(MiB, 400.0))


def test_run_p2p_time_limit_skips_pairs():
    result = run_p2p(P2PConfig(size_bytes=MiB, time_limit_s=0.0), api=FakeApi(2))
    assert result.unidirectional_gbps == [[None, None], [None, None]]
    assert any(note.startswith("time limit") for note in result.notes)


@pytest.mark.parametrize(("count", "devices"), [(1, None), (0, None), (4, (0, 4)), (4, (1, 1)), (4, (2,))])
def test_run_p2p_refuses_bad_device_sets(count, devices):
    with pytest.raises(P2PError):
        run_p2p(P2PConfig(size_bytes=MiB, devices=devices), api=FakeApi(count))


def test_result_exports():
    result = run_p2p(SMALL, api=FakeApi(3))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["schema"] == "ncclbench.p2p/1"
    assert data["config"]["size_bytes"] == MiB and data["config"]["devices"] == [0, 1, 2]
    assert len(data["unidirectional_gbps"]) == 3
    rows = list(csv.DictReader(io.StringIO(result.csv_text())))
    assert len(rows) == 9
    row = next(r for r in rows if (r["src"], r["dst"]) == ("1", "2"))
    assert float(row["unidirectional_gbps"]) == pytest.approx(expected_gbps(MiB, 400.0), abs=1e-4)
    assert row["peer_access"] == "true" and row["verified"] == "true" and row["dst_pci_bus_id"] == "0000:00:08.0"
    diagonal = next(r for r in rows if (r["src"], r["dst"]) == ("0", "0"))
    assert diagonal["bidirectional_gbps"] == "" and diagonal["peer_access"] == ""


# ------------------------------------------------------------------- the CLI


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize(
    ("count", "message"),
    [(0, "ncclbench: error: no CUDA GPU visible: p2p needs at least 2 GPUs"),
     (1, "ncclbench: error: only 1 CUDA GPU visible: p2p needs at least 2 GPUs")],
)
def test_p2p_command_without_enough_gpus_exits_2(monkeypatch, count, message):
    monkeypatch.setattr(visible, "visible_gpu_count", lambda: count)
    result = CliRunner().invoke(p2p_command, [])
    assert result.exit_code == 2
    assert one_line(result.stderr) == message
    assert result.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_p2p_command_on_this_machine_without_gpu():
    assert visible.visible_gpu_count() == 0
    result = CliRunner().invoke(p2p_command, ["--json", "-"])
    assert result.exit_code == 2
    assert one_line(result.stderr) == "ncclbench: error: no CUDA GPU visible: p2p needs at least 2 GPUs"


@pytest.mark.parametrize(
    "args",
    [["--size", "abc"], ["--size", "0"], ["--reps", "0"], ["--devices", "0"], ["--devices", "a,b"],
     ["--latency-size", "-1"], ["--nope"], ["--json", "-", "--csv", "-"]],
)  # fmt: skip
def test_p2p_command_bad_input_is_one_line_exit_2(args):
    result = CliRunner().invoke(p2p_command, args)
    assert result.exit_code == 2
    assert one_line(result.stderr).startswith("ncclbench: error: ")
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.fixture
def four_fake_gpus(monkeypatch):
    monkeypatch.setattr(visible, "visible_gpu_count", lambda: 4)
    monkeypatch.setattr(p2p, "TorchCudaApi", lambda: FakeApi(4))
    monkeypatch.setattr(topo_mod, "probe", lambda include_nics=True: SimpleNamespace())
    monkeypatch.setattr(model, "summary_line", lambda topo: "4 x Fake GPU, all pairs NV18 (NVSwitch)")
    monkeypatch.setattr(model, "link_peak_gbps", lambda topo: 478.116)


def test_p2p_command_with_fake_gpus(four_fake_gpus, tmp_path):
    json_file, csv_file = tmp_path / "p2p.json", tmp_path / "p2p.csv"
    args = ["--size", "1M", "--reps", "2", "--iters", "2", "--json", str(json_file), "--csv", str(csv_file)]
    result = CliRunner().invoke(p2p_command, args)
    assert result.exit_code == 0, result.output
    assert one_line(result.stderr) == "p2p: 4 GPUs, 16 ordered pairs, 1 MiB copies"
    out = result.stdout
    assert out.startswith("# 4 x Fake GPU, all pairs NV18 (NVSwitch)\n")
    assert "Unidirectional copy bandwidth (GB/s), 1 MiB copies, median of 2 x 2" in out
    best = expected_gbps(MiB, 400.0)
    assert f"# Best GPU-to-GPU copy {best:.2f} GB/s = {100 * best / 478.116:.1f} % of NVLink peak 478.1" in out
    sections = {block.splitlines()[0].split(" (")[0]: block.splitlines()[1:] for block in out.split("\n\n")}
    header, *rows = [line.split() for line in sections["Unidirectional copy bandwidth"]]
    assert header == ["src\\dst", "0", "1", "2", "3"]
    assert rows[1][3] == f"{best:.2f}"  # row 1 -> column 2
    assert rows[2][3] == f"{expected_gbps(MiB, 2000.0):.2f}"  # within GPU 2
    bidir = [line.split() for line in sections["Bidirectional copy bandwidth"]]
    assert bidir[1] == ["0", "-"] + [f"{2 * best:.2f}"] * 3
    data = json.loads(json_file.read_text())
    assert data["nvlink_peak_gbps"] == 478.116 and len(data["latency_us"]) == 4
    assert len(csv_file.read_text().splitlines()) == 1 + 16


def test_p2p_command_json_to_stdout_replaces_tables(four_fake_gpus):
    result = CliRunner().invoke(p2p_command, ["--size", "64K", "--reps", "1", "--json", "-", "--devices", "0,2"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["index"] for d in data["devices"]] == [0, 2]
    assert data["topology_summary"] == "4 x Fake GPU, all pairs NV18 (NVSwitch)"


def test_p2p_command_device_out_of_range(four_fake_gpus):
    result = CliRunner().invoke(p2p_command, ["--devices", "0,7"])
    assert result.exit_code == 2
    assert one_line(result.stderr) == "ncclbench: error: --devices: no CUDA GPU 7 (4 visible)"


def test_p2p_command_verification_failure_exits_1(monkeypatch, four_fake_gpus):
    monkeypatch.setattr(p2p, "TorchCudaApi", lambda: FakeApi(4, broken={(1, 3)}))
    result = CliRunner().invoke(p2p_command, ["--size", "64K", "--reps", "1"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "ncclbench: error: copy verification failed (destination did not hold the source data) for pairs 1->3"
    )


def test_p2p_command_cuda_error_is_one_line(monkeypatch, four_fake_gpus):
    def out_of_memory():
        raise RuntimeError("CUDA out of memory. Tried to allocate 256.00 MiB\nmore details")

    monkeypatch.setattr(p2p, "TorchCudaApi", out_of_memory)
    result = CliRunner().invoke(p2p_command, [])
    assert result.exit_code == 1
    assert one_line(result.stderr) == "ncclbench: error: RuntimeError: CUDA out of memory. Tried to allocate 256.00 MiB"


def test_p2p_exit_code_survives_a_non_standalone_group(monkeypatch):
    # ncclbench.cli.main runs its group with standalone_mode=False, where click returns
    # (instead of raising) the code of a click Exit; ours must still reach the shell.
    import click

    monkeypatch.setattr(visible, "visible_gpu_count", lambda: 0)
    group = click.Group("ncclbench")
    group.add_command(p2p_command)
    with pytest.raises(SystemExit) as exit_info:
        group.main(["p2p"], standalone_mode=False)
    assert exit_info.value.code == 2


# ----------------------------------------------- on the GPU machine (pytest -m gpu)


@pytest.mark.gpu
def test_real_p2p_default_run_on_up_to_4_gpus():
    count = min(visible.visible_gpu_count(), 4)
    if count < 2:
        pytest.skip("needs 2 GPUs")
    result = run_p2p(P2PConfig(devices=tuple(range(count))))  # the defaults: 256 MiB, 5 x 5
    assert result.elapsed_s < 60
    assert result.failed_pairs() == [] and all(ok for row in result.verified for ok in row)
    for i in range(count):
        for j in range(count):
            assert result.unidirectional_gbps[i][j] > 1.0
            assert 0.3 < result.latency_us[i][j] < 200.0
            if i != j and result.peer_access[i][j] and result.peer_access[j][i]:
                # Copy engines are full duplex: both directions at once must beat one direction
                # clearly, or the two directions were serialized somewhere.
                one_way = min(result.unidirectional_gbps[i][j], result.unidirectional_gbps[j][i])
                assert result.bidirectional_gbps[i][j] > 1.3 * one_way, (i, j, result.bidirectional_gbps[i][j], one_way)


@pytest.mark.gpu
def test_real_p2p_command(tmp_path):
    if visible.visible_gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    json_file = tmp_path / "p2p.json"
    result = CliRunner().invoke(p2p_command, ["--size", "32M", "--reps", "2", "--devices", "0,1",
                                              "--json", str(json_file)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Unidirectional copy bandwidth" in result.stdout
    assert json.loads(json_file.read_text())["verified"] == [[True, True], [True, True]]
