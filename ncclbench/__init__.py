"""ncclbench: NCCL collective benchmarks in the style of nccl-tests, on torch.distributed."""

__version__ = "0.1.0"
