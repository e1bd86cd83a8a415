"""Tests of the trace-driven simulator (gpuq.sim)."""
