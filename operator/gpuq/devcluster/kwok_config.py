"""kwok's configuration: which nodes it manages and the Stages that play kubelet for them.

Pod lifecycle on a kwok node (documented in docs/devcluster.md):
  bound + Pending           -> Running and Ready (containers running, pod IP assigned)
  Running + SIM_DURATION    -> Succeeded that long after it started running (exit code 0)
  Running + SIM_FAIL_AFTER  -> Failed that long after it started running (exit code SIM_EXIT_CODE, default 1);
                               wins over SIM_DURATION when both are set
  deleting                  -> removed after SIM_TERMINATION_DELAY (default at once), like a kubelet
                               that saw its containers exit
Pods without these annotations run until deleted. Durations are Go durations ("90s", "5m", "1h30m")
or an RFC 3339 time to finish at; an unparsable value counts as 0.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuq.devcluster.shape import HEARTBEAT_LABEL, HEARTBEAT_ON

SIM_DURATION = "gpuq.dev/sim-duration"
SIM_FAIL_AFTER = "gpuq.dev/sim-fail-after"
SIM_EXIT_CODE = "gpuq.dev/sim-exit-code"
SIM_TERMINATION_DELAY = "gpuq.dev/sim-termination-delay"

POD_CIDR = "10.128.0.1/9"
_READY = '.status.conditions.[] | select( .type == "Ready" ) | .status'

# Go templates rendered by kwok into a status patch.
_NODE_READY_STATUS = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
{{ $kwok := printf "kwok-%s" Version }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  containerRuntimeVersion: {{ $kwok }}
  kernelVersion: {{ $kwok }}
  kubeletVersion: {{ $kwok }}
  kubeProxyVersion: {{ $kwok }}
phase: Running
"""

_NODE_REFRESH_STATUS = """\
{{ $now := Now }}
conditions:
{{ range .status.conditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ .lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

_POD_RUNNING_STATUS = """\
{{ $now := Now }}
conditions:
{{ range list "Initialized" "PodReadyToStartContainers" "ContainersReady" "Ready" }}
- {type: {{ . }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ end }}
{{ range .spec.readinessGates }}
- {type: {{ .conditionType | Quote }}, status: "True", lastTransitionTime: {{ $now | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state: {running: {startedAt: {{ $now | Quote }}}}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now|Quote }}}
{{ end }}
{{ with NodeIPsWith .spec.nodeName }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $uid := or .metadata.uid "" }}
{{ $name := or .metadata.name "" }}
{{ $ns := or .metadata.namespace "" }}
{{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) $uid $name $ns }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

# @EXIT_CODE@, @REASON@ and @PHASE@ are filled in per finishing stage.
_POD_FINISHED_STATUS = """\
{{ $now := Now }}
{{ $annotations := or .metadata.annotations dict }}
conditions:
{{ range list "ContainersReady" "Ready" }}
- {type: {{ . }}, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: @EXIT_CODE@
      reason: @REASON@
      startedAt: {{ $.status.startTime | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: @PHASE@
"""


def _match(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def _annotation(name: str) -> str:
    return f'.metadata.annotations["{name}"]'


def _stage(
    name: str,
    kind: str,
    match: list[dict[str, Any]],
    next_: dict[str, Any],
    delay: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": match},
    }
    if delay is not None:
        spec["delay"] = delay
    spec["next"] = next_
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _delay_from(annotation: str) -> dict[str, Any]:
    """Delay read from a pod annotation; 0 when it is missing or unparsable."""
    return {"durationMilliseconds": 0, "durationFrom": {"expressionFrom": _annotation(annotation)}}


def _finish_stage(
    name: str, after: str, phase: str, exit_code: str, reason: str, extra: list[dict[str, Any]]
) -> dict[str, Any]:
    template = (
        _POD_FINISHED_STATUS.replace("@EXIT_CODE@", exit_code)
        .replace("@REASON@", reason)
        .replace("@PHASE@", phase)
    )
    match = [
        _match(".metadata.deletionTimestamp", "DoesNotExist"),
        _match(".status.phase", "In", "Running"),
        _match(_annotation(after), "Exists"),
        *extra,
    ]
    return _stage(name, "Pod", match, {"statusTemplate": template}, _delay_from(after))


def stages() -> list[dict[str, Any]]:
    running_node = [_match(".status.phase", "In", "Running"), _match(_READY, "In", "True")]
    return [
        # Ready != True: a node kwok just took over (new, or recovered after fail-node). Capacity and
        # addresses were set when the node was created; only conditions and node info are filled in.
        _stage(
            "gpuq-node-ready",
            "Node",
            [_match(_READY, "NotIn", "True")],
            {"statusTemplate": _NODE_READY_STATUS},
        ),
        # The lease is the heartbeat the controller-manager watches; like a kubelet with nothing new to
        # report, conditions are only refreshed now and then.
        _stage(
            "gpuq-node-status-refresh",
            "Node",
            running_node,
            {"statusTemplate": _NODE_REFRESH_STATUS},
            {"durationMilliseconds": 60000, "jitterDurationMilliseconds": 90000},
        ),
        _stage(
            "gpuq-pod-running",
            "Pod",
            [
                _match(".metadata.deletionTimestamp", "DoesNotExist"),
                _match(".status.phase", "In", "Pending"),
                _match(_READY, "NotIn", "True"),
            ],
            {"statusTemplate": _POD_RUNNING_STATUS},
        ),
        _finish_stage(
            "gpuq-pod-succeed",
            SIM_DURATION,
            "Succeeded",
            "0",
            "Completed",
            [_match(_annotation(SIM_FAIL_AFTER), "DoesNotExist")],
        ),
        _finish_stage(
            "gpuq-pod-fail",
            SIM_FAIL_AFTER,
            "Failed",
            f'{{{{ or ( index $annotations "{SIM_EXIT_CODE}" ) 1 }}}}',
            "Error",
            [],
        ),
        _stage(
            "gpuq-pod-gone",
            "Pod",
            [_match(".metadata.deletionTimestamp", "Exists")],
            {"delete": True},
            _delay_from(SIM_TERMINATION_DELAY),
        ),
    ]


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings (the templates) as literal blocks, so config/kwok.yaml stays readable."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def kwok_config(lease_seconds: int) -> str:
    """The multi-document YAML passed to `kwok --config`."""
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithLabelSelector": f"{HEARTBEAT_LABEL}={HEARTBEAT_ON}",
            "nodeLeaseDurationSeconds": lease_seconds,
            "nodeLeaseParallelism": 8,
            "nodePlayStageParallelism": 8,
            "podPlayStageParallelism": 8,
            "cidr": POD_CIDR,
            "enableDebuggingHandlers": False,
        },
    }
    return yaml.dump_all([options, *stages()], Dumper=_Dumper, sort_keys=False, width=120)
