"""Chaos runs: a mixed training load on a local cluster while the operator and the control plane are
broken on purpose, with invariants checked on every sample of the API server's state.

Used by e2e/test_chaos.py (correctness, one bounded gauntlet) and bench/chaos.py (the full matrix and
leader-takeover figures). See docs/operations.md ("Chaos testing").
"""
