"""The access a worker pod needs to report checkpoints, and nothing more (docs/failover.md).

RBAC alone cannot say "only your own pod", so two layers:
- Role + RoleBinding: the workers' service account may get and patch pods in its namespace;
- ValidatingAdmissionPolicy (+ binding), scoped to that service account in that namespace: a patch
  must come from a pod-bound token (every in-pod token is), target the pod the token is bound to,
  and change nothing but the gpuq.dev/checkpoint annotation. A pod therefore reports only for its own
  pod, and so only for its own job (the operator reads a pod's report for the job that owns it).
"""

from __future__ import annotations

from typing import Any

from gpuq.sdk.protocol import ANNOTATION_CHECKPOINT

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def _name(namespace: str, service_account: str) -> str:
    return f"gpuq-checkpoint-reporter-{namespace}-{service_account}"[:253]


def worker_rbac(namespace: str, service_account: str = "default") -> list[dict[str, Any]]:
    """Role, RoleBinding, ValidatingAdmissionPolicy and its binding for one namespace's workers."""
    name = "gpuq-checkpoint-reporter"
    user = f"system:serviceaccount:{namespace}:{service_account}"
    policy = _name(namespace, service_account)
    annotations = "has(object.metadata.annotations) ? object.metadata.annotations : {}"
    old_annotations = "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"
    labels = "has(object.metadata.labels) ? object.metadata.labels : {}"
    old_labels = "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"
    ck = ANNOTATION_CHECKPOINT
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{name}-{service_account}", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["UPDATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "matchConditions": [
                    {
                        "name": "from-the-workers-service-account",
                        "expression": f"request.userInfo.username == '{user}'",
                    }
                ],
                "variables": [
                    {"name": "new", "expression": annotations},
                    {"name": "old", "expression": old_annotations},
                ],
                "validations": [
                    {
                        "expression": f"'{POD_NAME_EXTRA}' in request.userInfo.extra && "
                        f"object.metadata.name == request.userInfo.extra['{POD_NAME_EXTRA}'][0]",
                        "message": "a worker may report checkpoints only on its own pod (pod-bound token)",
                    },
                    {
                        "expression": f"variables.new.all(k, k == '{ck}' || "
                        "(k in variables.old && variables.old[k] == variables.new[k])) && "
                        f"variables.old.all(k, k == '{ck}' || k in variables.new)",
                        "message": f"a worker may change only the {ck} annotation",
                    },
                    {
                        "expression": f"({labels}) == ({old_labels}) && object.spec == oldObject.spec",
                        "message": "a worker may not change its pod's labels or spec",
                    },
                ],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {
                "policyName": policy,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]
