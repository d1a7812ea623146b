"""Plain result records and what rank 0 does with them: nccl-tests text, JSON, CSV, readers, compare, plots."""
