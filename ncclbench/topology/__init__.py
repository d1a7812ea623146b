"""What the node is: NVML, nvidia-smi and CUDA peer-access probes, copy-engine bandwidth.

probe gathers what nvml, cuda_driver, sysfs and smi tell into model's records (pci and
nvlink hold the helpers they share); header makes a run's topology lines; visible counts
the GPUs CUDA will show without touching CUDA; p2p measures copies between GPUs.
"""
