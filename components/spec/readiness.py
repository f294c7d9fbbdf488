"""How long a run waits for its hosts, by how its TPU nodes come: the readiness limits of deploy_raycluster."""

from __future__ import annotations

import math
from dataclasses import dataclass

from components.spec.run_spec import RunSpec

# Fixed-size node pools (on-demand, reservation, spot) are made with their nodes at provision, so the wait is the
# pods' scheduling, the image pull on every host and Ray's start: the MaxText tutorial's own RayCluster took 2 min
# 11 s to become ready (https://cloud.google.com/kubernetes-engine/docs/tutorials/multi-slice-training-ray), before
# a multi-GB image pull on each host. The deadline is derived, rounded up to the second:
# FIXED_BASE_S, plus the trainer image's pull at PULL_MIB_S, plus HOST_S for every host of the run (each host's pod
# pulls and starts its raylet, which then joins the head).
FIXED_BASE_S = 180.0
HOST_S = 10.0
# An assumed pull rate (no public figure: GKE documents image streaming, on in the clusters tpupipe creates, as
# faster, without a rate): the plan and the log state the figures, and cluster.ready_timeout_s overrides them.
PULL_MIB_S = 50.0
# The trainer images' sizes by workload, GiB: the environments' measured sizes (README, "Prerequisites": torch 7.1
# GB, maxtext 1.8 GB) plus the Python base image, rounded up.
IMAGE_GIB = {"fsdp": 8.0, "maxtext": 3.0}

# How long deploy_raycluster waits for every worker host when cluster.ready_timeout_s is 0 (the default), how long a
# worker pod may stay Unschedulable with no scale-up under way (no TriggeredScaleUp event) before the run fails, and
# how long the cluster autoscaler's FailedScaleUp may repeat before it ends the run (0: the first one does), by how
# the TPU nodes come. Seconds: (deadline, unschedulable grace, failed scale-up grace); a deadline of None is derived
# (fixed pools, above).
READY_LIMITS_S = {
    # A fixed pool does not grow: a pod left unschedulable means no capacity the pool can give, and a FailedScaleUp
    # (the autoscaler tried a node pool of the cluster for it) is final.
    "on-demand": (None, 120.0, 0.0),
    "reservation": (None, 120.0, 0.0),
    "spot": (None, 120.0, 0.0),
    # Flex-start pools start with 0 nodes and autoscale: the pods sit Unschedulable with a TriggeredScaleUp event while
    # the nodes come (https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest,
    # https://cloud.google.com/kubernetes-engine/docs/concepts/dws); a flex-start request "persists until capacity
    # becomes available" (Cloud TPU docs, "Request Cloud TPUs using Flex-start"; GKE docs, "About flex-start
    # provisioning mode"): minutes, at times far more. An hour before the run gives up; cluster.ready_timeout_s for
    # longer. A stockout is a FailedScaleUp event the cluster autoscaler retries after a backoff of 5 minutes at
    # first, doubling up to 30 (its flags initial-node-group-backoff-duration and max-node-group-backoff-duration,
    # https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md, "What are the parameters to
    # CA?"; GKE docs, "Troubleshoot the cluster autoscaler not scaling up",
    # https://cloud.google.com/kubernetes-engine/docs/troubleshooting/cluster-autoscaler-scale-up): FailedScaleUp
    # ends the run only when it repeats for longer than the longest backoff.
    "flex-start": (3600.0, 120.0, 1800.0),
    # Queued provisioning: the pods wait Unschedulable until the run's ProvisioningRequest is Provisioned (all its
    # nodes at once) and fail as soon as it is Failed (https://cloud.google.com/kubernetes-engine/docs/how-to/
    # provisioningrequest; the ProvisioningRequest's conditions, kubernetes/autoscaler cluster-autoscaler/apis/
    # provisioningrequest/autoscaling.x-k8s.io/v1/types.go); no FailedScaleUp retries to sit out: the request is the
    # wait. An hour before the run gives up, as for flex-start; cluster.ready_timeout_s for longer.
    "queued": (3600.0, 120.0, 0.0),
    # Autopilot makes the TPU nodes when the pods ask for them (GKE docs, "Deploy TPU workloads in GKE Autopilot"):
    # Unschedulable with TriggeredScaleUp while a slice's nodes are created, minutes; a stockout retried as above.
    # Combined with the capacity type's row (the longer of each).
    "autopilot": (1800.0, 120.0, 1800.0),
}


@dataclass(frozen=True)
class ReadyLimits:
    """How long deploy_raycluster waits for every host, for a pod unschedulable with no scale-up under way, and for
    the cluster autoscaler's FailedScaleUp to stop repeating (0: the first one is final)."""

    deadline_s: float
    unschedulable_grace_s: float
    by: str  # where the deadline comes from, for the plan and the log
    failed_scale_up_grace_s: float = 0.0


def fixed_deadline(spec: RunSpec) -> tuple[float, str]:
    """The readiness deadline of fixed-size pools, derived from the run's hosts and its trainer image's size."""
    hosts = spec.cluster.num_hosts * spec.cluster.num_slices
    gib = IMAGE_GIB[spec.train.workload]
    pull_s = gib * 1024 / PULL_MIB_S
    deadline = float(math.ceil(FIXED_BASE_S + pull_s + HOST_S * hosts))
    return deadline, (
        f"{FIXED_BASE_S:g} s + a {gib:g} GiB image at an assumed {PULL_MIB_S:g} MiB/s ({pull_s:.0f} s) + "
        f"{HOST_S:g} s x {hosts} hosts"
    )


def ready_limits(spec: RunSpec) -> ReadyLimits:
    """The readiness limits of ``spec``: ``READY_LIMITS_S`` by cluster.capacity (and Autopilot), a fixed pool's
    deadline derived (``fixed_deadline``), the deadline overridden by cluster.ready_timeout_s when it is set."""
    c = spec.cluster
    rows = [c.capacities[0]] + (["autopilot"] if spec.gke.cluster_mode == "autopilot" else [])
    derived, how = fixed_deadline(spec)
    deadline = max(READY_LIMITS_S[row][0] or derived for row in rows)
    grace = max(READY_LIMITS_S[row][1] for row in rows)
    failed_grace = max(READY_LIMITS_S[row][2] for row in rows)
    by = f"cluster.capacity={c.capacities[0]}" + (", gke.cluster_mode=autopilot" if "autopilot" in rows else "")
    if c.ready_timeout_s:
        return ReadyLimits(c.ready_timeout_s, grace, "cluster.ready_timeout_s", failed_grace)
    if deadline == derived:
        by += f": {how}"
    return ReadyLimits(deadline, grace, by, failed_grace)
