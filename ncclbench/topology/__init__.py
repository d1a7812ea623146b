"""What the node is: NVML, nvidia-smi and CUDA peer-access probes, copy-engine bandwidth."""
