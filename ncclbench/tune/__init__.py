"""`ncclbench tune`: measure every algorithm x protocol (x channel limit) NCCL accepts next to
NCCL's own choice, call the wins that rise above run-to-run noise, and write a config for
NCCL's example tuner plugin that holds them and NCCL's own choice at every other size.

Pure parts (no torch): plan (the combinations), nccl_log (NCCL's debug lines), ranges (the
noise rule and size ranges), coverage (rows for every size), tuner_config (the file as a
whole), files (the two CSV formats NCCL's plugin tools read), table (the text on stdout),
verify_report (the deployed config against the default). Orchestration: run (launches, in
the user's process), rank (one rank of a launch), verify (the plugin's launches), plot."""
