"""How ranks come to be: under torchrun, srun or mpirun, or started locally with torchrun's environment."""
