"""gpuq.core: pure, deterministic scheduling. No kubernetes/kopf imports, no I/O, no wall clock."""
