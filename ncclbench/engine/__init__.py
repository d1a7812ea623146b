"""One rank's work: the plan, the collective registry, the check, the one timing engine and the sweep."""
