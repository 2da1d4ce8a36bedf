"""The optimization cycle: run records, phases, the per-direction pipeline."""
