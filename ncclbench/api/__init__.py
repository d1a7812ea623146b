"""The public Python face: measure() and preflight() on a job's own process groups, and the option table the command line shares with them."""
