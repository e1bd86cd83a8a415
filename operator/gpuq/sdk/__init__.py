"""gpuq.sdk: what training code inside a gpuq worker pod uses to take part in checkpoint-aware
scheduling. Standard library only at runtime; talks to the API server with the pod's own service
account token (in-cluster config). Protocol and RBAC: docs/failover.md.

    from gpuq import sdk
    start = sdk.resume_info()                    # None on a first start
    if sdk.checkpoint_requested(): ...           # gpuq wants a checkpoint before preempting
    sdk.report_checkpoint(step, "s3://b/run/1200")
"""

from gpuq.sdk.checkpoint import ResumeInfo, checkpoint_requested, report_checkpoint, resume_info
from gpuq.sdk.context import PodContext, SdkError

__all__ = [
    "PodContext",
    "ResumeInfo",
    "SdkError",
    "checkpoint_requested",
    "report_checkpoint",
    "resume_info",
]
