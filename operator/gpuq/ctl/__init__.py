"""`gpuq queues|jobs|explain|stop|resume|queue` (also `kubectl gpuq ...`): operating gpuq from a
terminal with the current kubeconfig. The answers come from the same code the operator runs: the
snapshot builder and the scheduling core, fed with fresh lists from the API server."""
