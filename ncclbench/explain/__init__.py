"""`ncclbench explain`: the path NCCL took and the known causes of a lower number, from logs a
user already has or from a short all_reduce sweep run here.

logs: the files named, read and parsed into processes; jobs: those processes grouped by the
communicators they share, what each job's files leave out (ranks, hosts, NCCL's logging
subsystems); report: the lines printed; here: the sweep run here."""
