"""The checkpoint protocol's names on the wire, shared by the SDK and the operator (gpuq.api.meta).

Kept here, in a standard-library-only module, so a worker image needs nothing but gpuq.sdk.
"""

ANNOTATION_CHECKPOINT = "gpuq.dev/checkpoint"  # pod annotation the SDK writes: {"step", "path", "time"}
ANNOTATION_CHECKPOINT_REQUESTED = "gpuq.dev/checkpoint-requested"  # set by the operator before preempting
