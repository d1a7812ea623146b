"""One rank's whole `ncclbench pairs` run: the plan every rank agrees on, the screening
tournament, the localisation rounds, and the verdict every rank computes from the same
gathered numbers (rank 0 prints it and writes the files)."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from functools import partial

from ncclbench.engine import pathread
from ncclbench.errors import BenchError, CollectiveError, PlanError, first_line, ranks_list




@dataclass(frozen=True)
class PairsPlan:
    nbytes: int
    iters: int
    warmup_iters: int
    backend: str
    timeout_s: float
    fail_below: float | None
    json_path: str | None
    csv_path: str | None
    band: float | None = None        # None: the bands of ncclbench.locate.bands by transport
    pair_cap_s: float | None = None  # seconds one pair may take per round; None: no cap
    metrics_path: str | None = None  # --metrics: Prometheus text of the report

    def fingerprint(self) -> tuple:
        """What every rank must agree on, or the rounds would not line up."""
        return (self.nbytes, self.iters, self.warmup_iters, self.backend, self.band)


def parse_percent(text: str) -> float:
    """'20%' or '20' -> 20.0; a percentage strictly between 0 and 100."""
    raw = str(text).strip()
    number = raw[:-1].strip() if raw.endswith("%") else raw
    try:
        value = float(number)
    except ValueError:
        raise PlanError(f"--fail-below must be a percentage such as 20% (got {text!r})") from None
    if not 0 < value < 100:
        raise PlanError(f"--fail-below must be between 0% and 100% (got {text!r})")
    return value


def agree(backend, plan: PairsPlan) -> None:
    everyone = backend.all_gather_object(plan.fingerprint())
    differ = [r for r, fp in enumerate(everyone) if fp != everyone[0]]
    if differ:
        raise PlanError(f"rank(s) {ranks_list(differ)} run pairs with other options than rank 0; "
                        "every rank must get the same options")


def device_line(backend) -> dict:
    info = backend.device_info()
    return {"rank": backend.rank, "pid": os.getpid(), "host": socket.gethostname(),
            "device": info["device"], "device_hex": info["device_hex"], "device_info": info["device_info"]}


def localiser(plan: PairsPlan, devices: list[dict], networks=()):
    """The Localiser of a pairs run: ranks as endpoints, pairs compared within their kind
    (ncclbench.locate.kinds), each kind at the bands of the transport it took (`networks`:
    the networks NCCL's log named between hosts)."""
    from ncclbench.locate.bands import backend_bands, bands_for, over_sockets
    from ncclbench.locate.kinds import pair_kind
    from ncclbench.locate.localiser import Localiser

    host = {d["rank"]: d["host"] for d in devices}
    bands = backend_bands(plan.band, [plan.backend])
    sockets = plan.backend == "nccl" and over_sockets(networks)

    def bands_of(kind):
        if sockets and not kind[0]:  # across hosts over TCP sockets
            wide = bands_for(plan.band, ["socket"])
            return max(bands.rank, wide.rank), max(bands.link, wide.link)
        return None

    kind = partial(pair_kind, host, {}, devices, nccl=plan.backend == "nccl")
    return Localiser(sorted(host), bands.rank, link_band=bands.link, classify=kind, bands_of=bands_of)


def run_rank(plan: PairsPlan, info) -> int:
    """One rank's whole job. Every rank ends with the same verdict (each computes it from
    the same gathered numbers); rank 0 prints and writes the files."""
    from ncclbench.backends import create_backend
    from ncclbench.engine.pair_exchange import first_collective
    from ncclbench.launch import launcher as launch
    from ncclbench.locate.schedule import tournament_rounds
    from ncclbench.faults.pairs.report import PairsResult

    launch.prepare_environ(info)
    backend = create_backend(plan.backend, info, plan.timeout_s)
    try:
        agree(backend, plan)
        devices = backend.all_gather_object(device_line(backend))
        rounds = tournament_rounds(backend.nranks)
        try:
            first_collective(backend)
            screening = measure_pass(backend, plan, rounds)
            path = pathread.gather(backend) if plan.backend != "gloo" else None  # each rank's NCCL log, to rank 0
            networks = backend.all_gather_object(path.network if path is not None and path.crosses_hosts else None)
            loc, wrong, done = localise(plan, devices, screening, lambda asked: measure_pass(backend, plan, asked),
                                        networks)
        except BenchError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed exchange ends the run in one line
            raise CollectiveError(f"pair exchange failed: {first_line(exc)}") from exc
    finally:
        backend.close()
    result = PairsResult(plan, devices, rounds, screening[0], wrong, loc, done)
    result.path = path
    if info.rank == 0:
        sys.stdout.write("\n".join(result.report_lines(backend.timing_name())) + "\n")
        sys.stdout.flush()
        result.write_files()
    return result.exit_code()


def localise(plan: PairsPlan, devices: list[dict], screening: tuple, measure, networks=()):
    """(Localiser, pairs with wrong data, localisation rounds run) from the screening pass
    ({(a, b): GB/s}, [wrong pairs]) and the localisation rounds it still needs, each measured
    by `measure(rounds)` -> the same pair. The same on every rank: every rank has the same
    numbers."""
    loc = localiser(plan, devices, networks)
    loc.record_pass(screening[0], "screen", 0)
    wrong = set(screening[1])

    def measured(rounds):
        busbw, bad = measure(rounds)
        wrong.update(bad)
        return busbw
    done = loc.localise(measured)
    return loc, sorted(wrong), done


def measure_pass(backend, plan: PairsPlan, rounds) -> tuple[dict, list]:
    """Every rank's pairs of one pass of `rounds`, gathered: ({(a, b): GB/s}, [(a, b) whose
    data arrived wrong])."""
    from ncclbench.engine.pair_exchange import measure_rounds, pair_busbw

    mine = measure_rounds(backend, plan, rounds)
    everyone = backend.all_gather_object(mine)
    wrong = sorted({(min(r, p), max(r, p)) for r, (_t, peers) in enumerate(everyone) for p in peers})
    return pair_busbw([t for t, _w in everyone], plan.nbytes), wrong
