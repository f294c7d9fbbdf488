"""Node taints and pod tolerations as the Kubernetes scheduler matches them, for the Kubernetes emulator's scheduler.

Kubernetes docs, "Taints and Tolerations" (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/):
- a toleration matches a taint when their keys and effects are the same and either its operator is ``Exists`` (no
  value then) or its operator is ``Equal`` and the values are equal; ``operator`` defaults to ``Equal``;
- "An empty key with operator Exists matches all keys, values and effects which means this will tolerate
  everything"; an empty ``effect`` matches every effect of the key;
- the scheduler places no pod on a node with a ``NoSchedule`` taint the pod does not tolerate (``NoExecute`` also
  keeps it off, and evicts it); ``PreferNoSchedule`` is a preference only, never a refusal.
The same rule in code: ``Toleration.ToleratesTaint`` of kubernetes/api, core/v1/toleration.go, and the scheduler's
TaintToleration filter (kubernetes/kubernetes, pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go),
whose refusal reads ``node(s) had untolerated taint {KEY: VALUE}`` (``UNTOLERATED``).
"""

from __future__ import annotations

# The effects the scheduler's filter refuses a node for; PreferNoSchedule only scores it lower.
REFUSING = ("NoSchedule", "NoExecute")
UNTOLERATED = "node(s) had untolerated taint {{{key}: {value}}}"


def tolerates(toleration: dict, taint: dict) -> bool:
    """Whether ``toleration`` (a pod's ``spec.tolerations[]`` entry) matches ``taint`` (a node's ``spec.taints[]``)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint["effect"]:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:  # an empty key is valid with Exists only, and then tolerates every taint
        return operator == "Exists"
    if key != taint["key"]:
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(pod_spec: dict, taints: list[dict]) -> dict | None:
    """The first taint of ``taints`` that keeps a pod of ``pod_spec`` off the node (NoSchedule or NoExecute, matched
    by none of its tolerations), else None."""
    tolerations = pod_spec.get("tolerations") or []
    for taint in taints:
        if taint["effect"] in REFUSING and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def refusal(taint: dict, nodes: int) -> str:
    """The scheduler's FailedScheduling message for a pod that ``nodes`` nodes, all with ``taint``, refuse (its
    Unschedulable condition's message, and the event's)."""
    why = UNTOLERATED.format(key=taint["key"], value=taint.get("value", ""))
    return (
        f"0/{nodes} nodes are available: {nodes} {why}. preemption: 0/{nodes} nodes are available: "
        f"{nodes} Preemption is not helpful for scheduling."
    )
