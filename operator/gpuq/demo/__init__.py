"""`gpuq demo` (`make demo`): the operator live on the embedded local cluster.

The scenario (gpuq.demo.scenario) queues, admits, preempts, fails over and completes TrainingJobs
while a live table shows each job and queue; e2e/test_demo.py runs the same scenario and asserts
that every act really happened. See docs/demo.md.
"""
