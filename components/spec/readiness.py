"""How long a run waits for its hosts, by how its TPU nodes come: the readiness limits of deploy_raycluster."""

from __future__ import annotations

from dataclasses import dataclass

from components.spec.run_spec import RunSpec

# How long deploy_raycluster waits for every worker host when cluster.ready_timeout_s is 0 (the default), and how long
# a worker pod may stay Unschedulable with no scale-up under way (no TriggeredScaleUp event) before the run fails, by
# how the TPU nodes come. Seconds: (deadline, unschedulable grace).
READY_LIMITS_S = {
    # Standard node pools made with their nodes at provision (fixed size): the pods schedule at once, the wait is the
    # image pull and Ray's start; a pod left unschedulable means no capacity the pool can give.
    "on-demand": (180.0, 120.0),
    "reservation": (180.0, 120.0),
    "spot": (180.0, 120.0),
    # Flex-start pools start with 0 nodes and autoscale: the pods sit Unschedulable with a TriggeredScaleUp event while
    # the nodes come (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest,
    # https://cloud.google.com/kubernetes-engine/docs/concepts/dws); a flex-start request "persists until capacity
    # becomes available" (Cloud TPU docs, "Request Cloud TPUs using Flex-start"; GKE docs, "About flex-start
    # provisioning mode"): minutes, at times far more. An hour before the run gives up; cluster.ready_timeout_s for
    # longer.
    "flex-start": (3600.0, 120.0),
    # Autopilot makes the TPU nodes when the pods ask for them (GKE docs, "Deploy TPU workloads in GKE Autopilot"):
    # Unschedulable with TriggeredScaleUp while a slice's nodes are created, minutes. Combined with the capacity type's
    # row (the longer of each).
    "autopilot": (1800.0, 120.0),
}


@dataclass(frozen=True)
class ReadyLimits:
    """How long deploy_raycluster waits for every host, and for a pod unschedulable with no scale-up under way."""

    deadline_s: float
    unschedulable_grace_s: float
    by: str  # where the deadline comes from, for the plan and the log


def ready_limits(spec: RunSpec) -> ReadyLimits:
    """The readiness deadline and unschedulable grace of ``spec``: ``READY_LIMITS_S`` by cluster.capacity (and
    Autopilot), the deadline overridden by cluster.ready_timeout_s when it is set."""
    c = spec.cluster
    rows = [c.capacity] + (["autopilot"] if spec.gke.cluster_mode == "autopilot" else [])
    deadline = max(READY_LIMITS_S[row][0] for row in rows)
    grace = max(READY_LIMITS_S[row][1] for row in rows)
    if c.ready_timeout_s:
        return ReadyLimits(c.ready_timeout_s, grace, "cluster.ready_timeout_s")
    return ReadyLimits(
        deadline,
        grace,
        f"cluster.capacity={c.capacity}" + (", gke.cluster_mode=autopilot" if "autopilot" in rows else ""),
    )
