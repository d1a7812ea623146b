"""A fleet run's plan from its options, for the command line and the Python API alike (one
table of defaults, one conversion, the same messages)."""

from __future__ import annotations

from ncclbench.errors import PlanError
from ncclbench.sizes import parse_size

# what the command line and ncclbench.fleet() take when an option is not given
DEFAULTS = {"size": None, "budget": 30.0, "iters": None, "warmup_iters": 1, "gpus_per_node": None, "band": "auto",
            "min_busbw": None, "all_pairs_up_to": 16, "rounds": 4, "localise_rounds": 6, "seed": 0, "timeout": 60.0,
            "backend": None, "sim_node_size": None, "json_path": None, "csv_path": None, "drain_path": None,
            "drain_format": "scontrol", "metrics_path": None}
DEFAULT_BYTES = {"nccl": "256M", "gloo": "1M"}
NODE_BYTES = {"nccl": 64 << 20, "gloo": 256 << 10}
# gloo's exchanges on shared CPU cores are slowed by whatever else runs; more of them give the
# best one a better chance to show the link (they cost milliseconds each)
DEFAULT_ITERS = {"nccl": 5, "gloo": 20}


def build_plan(o: dict, backend: str):
    from ncclbench.faults.fleet.worker import FleetPlan
    from ncclbench.locate.bands import backend_bands, bands_for, parse_band
    from ncclbench.results.drain import checked_format
    from ncclbench.results.output import check_writable

    text = o["size"] or DEFAULT_BYTES[backend]
    try:
        nbytes = parse_size(text)
    except ValueError as exc:
        raise PlanError(f"-b {text!r}: {exc}") from None
    if nbytes < 1:
        raise PlanError("-b must be at least 1 byte")
    floor = o["min_busbw"]
    for path, what in ((o["json_path"], "JSON file"), (o["csv_path"], "CSV file"), (o["drain_path"], "drain file"),
                       (o.get("metrics_path"), "metrics file")):
        if path is not None:
            if not path.strip():
                raise PlanError(f"the {what} needs a name (got an empty one)")
            check_writable(path, what)
    asked = parse_band(o["band"])
    bands = backend_bands(asked, [backend])
    sockets = bands_for(asked, ["socket"]) if asked is None and backend == "nccl" else None
    return FleetPlan(backend=backend, nbytes=nbytes, node_bytes=NODE_BYTES[backend], iters=o["iters"] or DEFAULT_ITERS[backend],
                     warmup=o["warmup_iters"], timeout_s=o["timeout"], band=bands.rank, link_band=bands.link,
                     socket_band=sockets and max(bands.rank, sockets.rank),
                     socket_link_band=sockets and max(bands.link, sockets.link),
                     budget_s=o["budget"],
                     floor=floor, gpus_per_node=o["gpus_per_node"], all_pairs_rounds=max(1, o["all_pairs_up_to"] - 1),
                     screen_rounds=o["rounds"], max_localise=o["localise_rounds"], seed=o["seed"],
                     sim_node_size=o["sim_node_size"], json_path=o["json_path"], csv_path=o["csv_path"],
                     drain_path=o["drain_path"], drain_format=checked_format(o.get("drain_format")),
                     metrics_path=o.get("metrics_path"))

