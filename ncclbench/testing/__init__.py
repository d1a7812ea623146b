"""Test support that has to ship in the package: the ranks under test are real processes
started by real launchers, so the fault hooks they run must be importable there.

`faults` plants failures (wrong data, a killed, stalled or slow rank, set-up failures) at
named points of the engine, the backends and the API, when NCCLBENCH_FAULT is set. Unset,
as in every normal run, each hook returns after one environment lookup, and none runs
inside a timed region."""
