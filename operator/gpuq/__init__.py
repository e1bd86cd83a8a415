"""gpuq: a Kubernetes operator that schedules distributed training on GPU clusters."""

__version__ = "0.1.0"
