"""`ncclbench tune`: measure every algorithm x protocol (x channel limit) NCCL accepts next to
NCCL's own choice, call the wins that rise above run-to-run noise, and write them as a
config for NCCL's example tuner plugin.

Pure parts (no torch): plan (the combinations), nccl_log (NCCL's debug lines), ranges (the
noise rule and size ranges), files (the two CSV formats NCCL's plugin tools read), table
(the text on stdout). Orchestration: run (launches, in the user's process), rank (one rank
of a launch), verify (the plugin's second pass), plot."""
