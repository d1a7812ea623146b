"""Finding what is slow: the one localisation core of `pairs`, `preflight` and `fleet`.

Pure functions and plain records (no torch, no distributed code), so every rank can reach
the same verdict from the same gathered numbers and the rules are unit-tested at sizes no
machine here runs. What lives where:

- `stats`: the robust reference of a set of readings (median of the better half, its
  spread), the one-sided best-of (noise only slows, a fault does not), how many repeats
  settle a verdict against a false-alarm target.
- `bands`: how far below the reference a reading may fall, by transport (NVLink/P2P, SHM,
  NET over RDMA, NET over sockets, gloo), and whether NCCL ran over sockets.
- `kinds`: which pairs are compared with which (one host or across hosts, the link type,
  NCCL's shared channels, the NIC rate).
- `schedule`: who meets whom in a round (round-robin screening, localisation rounds).
- `localiser`: pair tests in; bad endpoints (ranks or nodes), bad links, suspects out;
  endpoints alone (`slow_alone`).
- `finding`: the one report shape: hosts (ok | suspect | drain, with evidence), links as
  host pairs, the drain list.

Rules that answer other questions stay where they are asked: the CI gate's noise test
(ncclbench.results.noise: is a new run slower than a baseline's samples allow) and tune's
intervals (ncclbench.tune: is one configuration faster than another) compare two runs of
one thing, not endpoints against their peers."""
