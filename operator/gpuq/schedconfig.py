"""kube-scheduler configuration for gpuq's extender, and the translation of a legacy `kind: Policy`.

kube-scheduler stopped reading `kind: Policy` (`--policy-config-file`, the policy ConfigMap) in v1.23;
its replacement is a KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) whose profiles enable
plugins with weights and whose `extenders` list keeps the extender fields. `gpuq extender config`
prints one (`scheduler_configuration`); with `--from-policy` it translates a Policy (`translate`) and
reports what maps to what and what has no equivalent. docs/extender.md explains both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_URL = "http://127.0.0.1:8888"
# The extender's weight: kube-scheduler multiplies an extender's 0-10 score by 10 (MaxNodeScore /
# MaxExtenderPriority) and by this weight; at 5 gpuq's fragmentation score (<= 500) outweighs the
# spreading of LeastAllocated at weight 2 (<= 200), which would otherwise scatter small pods over
# whole nodes.
DEFAULT_EXTENDER_WEIGHT = 5

# Legacy priorities -> (score plugin, NodeResourcesFit scoring strategy or None, note).
PRIORITIES: dict[str, tuple[str, str | None, str]] = {
    "LeastRequestedPriority": ("NodeResourcesFit", "LeastAllocated", "scoringStrategy LeastAllocated"),
    "MostRequestedPriority": ("NodeResourcesFit", "MostAllocated", "scoringStrategy MostAllocated"),
    "RequestedToCapacityRatioPriority": (
        "NodeResourcesFit",
        "RequestedToCapacityRatio",
        "scoringStrategy RequestedToCapacityRatio (its shape is not translated: set it by hand)",
    ),
    "BalancedResourceAllocation": ("NodeResourcesBalancedAllocation", None, ""),
    "ImageLocalityPriority": ("ImageLocality", None, ""),
    "SelectorSpreadPriority": ("PodTopologySpread", None, "default topology spread constraints"),
    "EvenPodsSpreadPriority": ("PodTopologySpread", None, ""),
    "InterPodAffinityPriority": ("InterPodAffinity", None, ""),
    "NodeAffinityPriority": ("NodeAffinity", None, ""),
    "TaintTolerationPriority": ("TaintToleration", None, ""),
    "ResourceLimitsPriority": (
        "NodeResourcesFit",
        None,
        "no separate plugin: resource scoring is NodeResourcesFit's",
    ),
}
REMOVED_PRIORITIES = {
    "NodePreferAvoidPodsPriority": "removed in Kubernetes 1.22 (the preferAvoidPods annotation is gone)",
    "ServiceSpreadingPriority": "removed; PodTopologySpread's default constraints spread a Service's pods",
    "EqualPriority": "every node scores the same: nothing to enable",
}
# Legacy predicates -> filter plugins (all enabled by default in v1).
PREDICATES: dict[str, str] = {
    "PodFitsResources": "NodeResourcesFit",
    "PodFitsHostPorts": "NodePorts",
    "PodFitsPorts": "NodePorts",
    "HostName": "NodeName",
    "MatchNodeSelector": "NodeAffinity",
    "GeneralPredicates": "NodeResourcesFit, NodeName, NodePorts, NodeAffinity",
    "PodToleratesNodeTaints": "TaintToleration",
    "CheckNodeUnschedulable": "NodeUnschedulable",
    "NoVolumeZoneConflict": "VolumeZone",
    "NoDiskConflict": "VolumeRestrictions",
    "CheckVolumeBinding": "VolumeBinding",
    "MaxEBSVolumeCount": "EBSLimits (now NodeVolumeLimits)",
    "MaxGCEPDVolumeCount": "GCEPDLimits (now NodeVolumeLimits)",
    "MaxAzureDiskVolumeCount": "AzureDiskLimits (now NodeVolumeLimits)",
    "MaxCSIVolumeCountPred": "NodeVolumeLimits",
    "MatchInterPodAffinity": "InterPodAffinity",
    "EvenPodsSpread": "PodTopologySpread",
}
REMOVED_PREDICATES = {
    "CheckNodeMemoryPressure": "replaced by the node.kubernetes.io/memory-pressure taint (TaintToleration)",
    "CheckNodeDiskPressure": "replaced by the node.kubernetes.io/disk-pressure taint (TaintToleration)",
    "CheckNodePIDPressure": "replaced by the node.kubernetes.io/pid-pressure taint (TaintToleration)",
    "CheckNodeCondition": "replaced by the node.kubernetes.io/not-ready/unreachable taints",
    "NoVolumeNodeConflict": "replaced by VolumeBinding",
}
EXTENDER_FIELDS = {
    # legacy (scheduler/api/v1 ExtenderConfig) -> KubeSchedulerConfiguration v1 Extender
    "urlPrefix": "urlPrefix",
    "filterVerb": "filterVerb",
    "preemptVerb": "preemptVerb",
    "prioritizeVerb": "prioritizeVerb",
    "bindVerb": "bindVerb",
    "weight": "weight",
    "enableHttps": "enableHTTPS",
    "enableHTTPS": "enableHTTPS",
    "tlsConfig": "tlsConfig",
    "httpTimeout": "httpTimeout",
    "nodeCacheCapable": "nodeCacheCapable",
    "managedResources": "managedResources",
    "ignorable": "ignorable",
}


class PolicyError(ValueError):
    """The input is not a Policy gpuq can read; the message says why."""


def gpuq_extender(
    url: str = DEFAULT_URL, timeout: str = "3s", weight: int = DEFAULT_EXTENDER_WEIGHT
) -> dict[str, Any]:
    return {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "enableHTTPS": url.startswith("https"),
        "nodeCacheCapable": True,
        "httpTimeout": timeout,
        "ignorable": True,  # gpuq down: kube-scheduler goes on without it
        "managedResources": [{"name": GPU_RESOURCE, "ignoredByScheduler": False}],
    }


def scheduler_configuration(
    url: str = DEFAULT_URL,
    timeout: str = "3s",
    weight: int = DEFAULT_EXTENDER_WEIGHT,
    scheduler_name: str = "default-scheduler",
) -> dict[str, Any]:
    """The seed's setup as kube-scheduler reads it today: LeastRequestedPriority (2) and
    ImageLocalityPriority (1) become NodeResourcesFit/LeastAllocated and ImageLocality score plugins,
    and gpuq is the extender."""
    return _configuration(
        scheduler_name,
        {"NodeResourcesFit": 2, "ImageLocality": 1},
        "LeastAllocated",
        [gpuq_extender(url, timeout, weight)],
        only_listed=False,
    )


def _configuration(
    scheduler_name: str,
    scores: Mapping[str, int],
    strategy: str | None,
    extenders: list[dict[str, Any]],
    only_listed: bool,
) -> dict[str, Any]:
    score: dict[str, Any] = {"enabled": [{"name": n, "weight": w} for n, w in scores.items()]}
    if only_listed:
        score = {"disabled": [{"name": "*"}], **score}
    profile: dict[str, Any] = {"schedulerName": scheduler_name, "plugins": {"score": score}}
    if strategy is not None:
        profile["pluginConfig"] = [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": strategy,
                        "resources": [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}],
                    }
                },
            }
        ]
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [profile],
        "extenders": extenders,
    }


@dataclass
class Translation:
    configuration: dict[str, Any]
    mapped: list[str] = field(default_factory=list)  # "legacy -> new" lines
    unmapped: list[str] = field(default_factory=list)  # "legacy: why there is no equivalent"
    advice: list[str] = field(default_factory=list)  # translated as written, but worth changing

    def report(self) -> str:
        lines = ["maps to:", *(f"  {m}" for m in self.mapped)]
        if self.unmapped:
            lines += ["no equivalent:", *(f"  {u}" for u in self.unmapped)]
        if self.advice:
            lines += ["consider:", *(f"  {a}" for a in self.advice)]
        return "\n".join(lines)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)$")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: Any) -> str:
    """A legacy httpTimeout (Go time.Duration: integer nanoseconds in JSON, or "3s") as a v1 duration."""
    if isinstance(value, bool):
        raise PolicyError(f"httpTimeout {value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = value / 1e9
    else:
        match = _DURATION.match(str(value).strip())
        if match is None:
            raise PolicyError(f"httpTimeout {value!r} is not a duration (e.g. 3s, or nanoseconds)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    return f"{seconds:g}s"


def load_policy(text: str) -> dict[str, Any]:
    """A Policy from JSON or YAML, or from a ConfigMap holding one in any data key."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"not YAML or JSON: {exc}") from None
    if not isinstance(doc, Mapping):
        raise PolicyError("expected a Policy object (or a ConfigMap holding one)")
    if doc.get("kind") == "ConfigMap":
        for value in (doc.get("data") or {}).values():
            try:
                inner = json.loads(value) if str(value).lstrip().startswith("{") else yaml.safe_load(value)
            except (ValueError, yaml.YAMLError):
                continue
            if isinstance(inner, Mapping) and inner.get("kind") == "Policy":
                return dict(inner)
        raise PolicyError(f"ConfigMap {((doc.get('metadata') or {}).get('name'))!r} holds no kind: Policy")
    if doc.get("kind") != "Policy":
        raise PolicyError(f"expected kind: Policy, got {doc.get('kind')!r}")
    return dict(doc)


def translate(policy: Mapping[str, Any], scheduler_name: str = "default-scheduler") -> Translation:
    t = Translation({})
    scores: dict[str, int] = {}
    strategy: str | None = None
    for p in policy.get("priorities") or []:
        name, weight = str(p.get("name", "")), int(p.get("weight", 1))
        if name in PRIORITIES:
            plugin, strat, note = PRIORITIES[name]
            scores[plugin] = max(scores.get(plugin, 0), weight)
            strategy = strat or strategy
            t.mapped.append(f"priority {name} (weight {weight}) -> score plugin {plugin}, weight {weight}"
                            + (f"; {note}" if note else ""))  # fmt: skip
        elif name in REMOVED_PRIORITIES:
            t.unmapped.append(f"priority {name}: {REMOVED_PRIORITIES[name]}")
        else:
            t.unmapped.append(
                f"priority {name}: not a known priority (a custom one needs a plugin or an extender)"
            )
    for p in policy.get("predicates") or []:
        name = str(p.get("name", ""))
        if name in PREDICATES:
            t.mapped.append(f"predicate {name} -> filter plugin {PREDICATES[name]} (enabled by default)")
        elif name in REMOVED_PREDICATES:
            t.unmapped.append(f"predicate {name}: {REMOVED_PREDICATES[name]}")
        else:
            t.unmapped.append(f"predicate {name}: not a known predicate")
    if policy.get("predicates"):
        t.unmapped.append(
            "a Policy's predicate list also switched off the predicates it left out; every default filter "
            "plugin stays enabled (switching one off by hand is rarely safe)"
        )
    extenders = []
    for i, e in enumerate(policy.get("extenders") or []):
        out: dict[str, Any] = {}
        for key, value in e.items():
            if key not in EXTENDER_FIELDS:
                t.unmapped.append(f"extenders[{i}].{key}: not an extender field")
                continue
            out[EXTENDER_FIELDS[key]] = duration(value) if key == "httpTimeout" else value
        fields = ", ".join(f"{k}={v}" for k, v in out.items() if k != "urlPrefix")
        t.mapped.append(f"extender {out.get('urlPrefix')} -> extenders[{i}] ({fields})")
        if not out.get("ignorable"):
            t.advice.append(
                f"extenders[{i}]: set ignorable: true, or kube-scheduler fails pods while it is down"
            )
        if not out.get("managedResources"):
            only_gpu = f"managedResources [{{name: {GPU_RESOURCE}}}]"
            t.advice.append(f"extenders[{i}]: set {only_gpu} so only GPU pods wait for it")
        extenders.append(out)
    for key in policy:
        if key not in ("kind", "apiVersion", "priorities", "predicates", "extenders", "metadata"):
            t.unmapped.append(
                f"{key}: not translated (set the matching KubeSchedulerConfiguration field by hand)"
            )
    t.configuration = _configuration(scheduler_name, scores, strategy, extenders, only_listed=bool(scores))
    if scores:
        t.mapped.append(
            "the Policy's priority list replaced the default scores: score plugins not listed are disabled"
        )
    return t


def dump(configuration: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(configuration), sort_keys=False)
