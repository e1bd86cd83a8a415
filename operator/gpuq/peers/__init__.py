"""Real peer schedulers run beside gpuq, and gpuq run on their benchmarks.

Kueue v0.17.0 is built here from its Go module (hack/kueue.sh, `kueue_binaries`). Its own scheduler
benchmark (test/performance/scheduler in the Kueue module) is run as Kueue's Makefile runs it
(`perf_kueue`), and the same generator file is translated to GPUQueues and TrainingJobs and run
through the gpuq operator on a local cluster (`perf_generator`, `perf_gpuq`), with the recording
rules of Kueue's runner in one place for both sides (`perf_recorder`). bench/kueue_perf.py prints
them side by side; docs/throughput.md ("Kueue's benchmark") says where the two do different work.
"""
