"""`ncclbench suite`: many runs from one YAML file (run.py)."""
