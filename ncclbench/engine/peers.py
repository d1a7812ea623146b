"""What a rank can find out about a peer that died, when no -g launcher told it: under
torchrun, srun or mpirun the launcher sees the death, and the ranks left hear only its
SIGTERM (or a lost connection). A peer on this host is looked up by its process (the ranks
exchange their pids while setting up); a death found that way is posted in the rendezvous
store, where ranks on other hosts, which cannot see the process, read it."""

from __future__ import annotations

import os
import socket

from ncclbench import procs
from ncclbench.launch import stop as rank_stop
from ncclbench.launch.stop import PeerDeath

DEATH_KEY = "ncclbench/peer_died"
STORE_WAIT_S = 1.0  # a store that does not answer within this is taken as gone (torch retries once: ~2.5 s)

_peers: list[tuple[int, str, int]] = []  # (rank, host, pid) of every rank of the run


def watch(devices, rank: int) -> None:
    """Remember the run's ranks (their DeviceRecords) and let the stop thread use them."""
    _peers[:] = [(d.rank, d.hostname, d.pid) for d in devices if d.rank != rank]
    rank_stop.on_peer_check(find_death, post_death)


def known() -> list[tuple[int, str, int]]:
    """(rank, host, pid) of every other rank of the run, as exchanged at set-up."""
    return list(_peers)


def find_death() -> PeerDeath | None:
    """A peer found dead: on this host by its process, elsewhere by a death posted in the store."""
    return dead_here() or posted_death()


def dead_here() -> PeerDeath | None:
    host = socket.gethostname()
    for rank, peer_host, pid in _peers:
        if peer_host == host and not procs.alive(pid):
            return PeerDeath(rank, f"rank {rank} (pid {pid}) on {host} died")
    return None


def _store():
    """A connection of its own to the rendezvous store (the main thread may be stuck inside
    its own), or None."""
    import datetime

    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=STORE_WAIT_S))


def _root(store):
    """The rendezvous store itself under torch's prefixes (the default group's store is
    prefixed): the key is the same whichever way it is reached."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def posted_death(store=None) -> PeerDeath | None:
    """The death a rank on another host posted, through `store` (the main thread's) or a
    connection of its own."""
    try:
        store = _root(store) if store is not None else _store()
        if store is None or not store.check([DEATH_KEY]):
            return None
        return PeerDeath.from_line(store.get(DEATH_KEY).decode())
    except Exception:  # noqa: BLE001 - the store is gone (it lived in the dead rank) or silent
        return None


def post_death(death: PeerDeath, store=None) -> None:
    """Tell ranks on other hosts; the first death posted stays."""
    try:
        store = _root(store) if store is not None else _store()
        if store is not None:
            store.compare_set(DEATH_KEY, "", death.line())
    except Exception:  # noqa: BLE001 - the store is gone: they will hear from their launcher
        pass
