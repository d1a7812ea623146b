"""The fault-finding commands, a package each: `pairs` (every pair of one job's ranks),
`preflight` (a training job's own process groups, before its first step) and `fleet` (many
nodes in one job). Each measures through the engine and decides through the one
localisation core, ncclbench.locate, and reports in its one shape (locate.finding)."""
