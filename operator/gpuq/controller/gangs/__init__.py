"""Gangs gpuq did not create: batch/v1 Indexed Jobs and Kubeflow PyTorchJobs whose pods ask for
scheduler `gpuq` (docs/existing-workloads.md). Each kind has one module that reads its owner object
into a `GangDemand` (the gang's size and the TrainingJobSpec it is scheduled as) and says which rank
a pod of it is; `owner` holds what every kind reads the same way (queue, priority, topology, ...)."""
