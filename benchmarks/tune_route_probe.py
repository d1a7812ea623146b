"""Shows the route `ncclbench tune` takes on real NCCL, through the same code: one process,
a fresh communicator per setting (TorchBackend.renew_communicator), NCCL reading NCCL_ALGO,
NCCL_PROTO and the channel limit again at each communicator's init, and, with two ranks or
more, each call's TUNING line showing the forced choice (one rank logs none: NCCL copies
locally). One line per communicator; exit 1 when NCCL did not run what was set.

    NCCL_NVLS_ENABLE=0 python benchmarks/tune_route_probe.py                           # one GPU
    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 benchmarks/tune_route_probe.py
"""

from __future__ import annotations

import glob
import os
import socket
import sys
import tempfile

SETTINGS = [(None, None, None), ("tree", "ll", None), ("ring", "simple", 4), ("ring", "ll128", 2), ("tree", "simple", None)]
SIZE = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    logdir = os.environ.get("TUNE_PROBE_LOGDIR") or tempfile.mkdtemp(prefix="tune-route-")
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING",
                      NCCL_DEBUG_FILE=os.path.join(logdir, "nccl.%h.%p.log"))
    if "RANK" not in os.environ:  # one process on its own
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import torch

    from ncclbench.launch import launcher as launch
    from ncclbench.backends import create_backend
    from ncclbench.tune.plan import Combination
    from ncclbench.tune.rank import combination_environment

    info = launch.detect()
    backend = create_backend("nccl", info, 120)
    combos = [Combination(*s) if s[0] else Combination() for s in SETTINGS]
    for combo in combos:
        with combination_environment(combo):
            backend.renew_communicator(combo.channels)
            t = torch.ones(SIZE // 4, device=backend.device)
            for _ in range(2):
                backend.all_reduce(t, t, "sum")
            backend.synchronize()
    world = info.world_size
    backend.close()
    if info.rank != 0:
        return 0
    return report(combos, logdir, world)


def report(combos, logdir, world) -> int:
    from ncclbench.tune import nccl_log
    from ncclbench.tune.analysis import init_text

    path = glob.glob(os.path.join(logdir, f"nccl.*.{os.getpid()}.log"))
    log = nccl_log.parse_log(open(path[0]).read()) if path else nccl_log.Log()
    comms = nccl_log.communicators_for(log, 1, len(combos)) or nccl_log.communicators_for(log, 0, len(combos))
    print(f"# NCCL {log.version}, {world} rank(s), log {path[0] if path else 'missing'}")
    if comms is None:
        print(f"# expected {len(combos)} communicators after the world's, the log has {len(log.communicators)}")
        return 1
    bad = 0
    for combo, (init, calls) in zip(combos, comms):
        said = init_text(combo, init)
        ran = sorted({c.label for c in calls if c.nbytes == SIZE})
        wrong_call = combo.algo and any((c.algo, c.proto) != (combo.algo, combo.proto) for c in calls)
        if world == 1 and init is not None:
            # A one-rank communicator runs no tuning model (NCCL copies locally), so it never
            # reads NCCL_ALGO/NCCL_PROTO; only the channel limit can be seen there.
            channels_ok = not combo.channels or init.channels == combo.channels
            said = said.replace(": NOT what was set", "") + (
                "" if channels_ok else ": NOT the channel limit set") + (
                " (one rank: NCCL_ALGO/NCCL_PROTO are not read without a tuning model)" if combo.algo else "")
        bad += "NOT" in said or bool(wrong_call) or (world > 1 and not ran)
        print(f"{combo.label:<18s} {said}; calls: {', '.join(ran) if ran else 'no TUNING line (one rank)' if world == 1 else 'none logged'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
