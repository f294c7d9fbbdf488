"""What a GKE cluster must have for a run, as data: one row per feature, with how to read it off a ``Cluster`` and
whether GKE can turn it on in an existing cluster.

A cluster the run creates gets every feature in its body (``resources.cluster``). A cluster the spec names
(``gke.cluster_name``) is checked feature by feature before anything is created: a feature GKE enables in place
(a ``ClusterUpdate`` field) is enabled by provision, one UpdateCluster each, before any node pool exists, and kept
after the run; a feature GKE sets only when a cluster is created is refused by preflight, naming it. ``tpupipe plan``
states which. Sources: the ``ClusterUpdate`` message of google.container.v1 (``desired_addons_config``,
``desired_workload_identity_config``, ``desired_enable_multi_networking``); Dataplane V2 is chosen when a cluster is
created (https://cloud.google.com/kubernetes-engine/docs/concepts/dataplane-v2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components.spec import RunSpec
from components.workload import derive as d

if TYPE_CHECKING:  # the message preflight reads a cluster as; this layer imports no client
    from google.cloud.container_v1 import Cluster

ADVANCED_DATAPATH = 2  # google.container.v1.DatapathProvider.ADVANCED_DATAPATH


@dataclass(frozen=True)
class Feature:
    name: str
    has: Callable[[Cluster, str], bool]  # (the Cluster message, the project) -> present
    update: Callable[[str], dict[str, Any]] | None  # project -> the ClusterUpdate (REST JSON) that enables it
    refused_because: str = ""  # why it cannot be enabled in place (when ``update`` is None)
    needed: Callable[[RunSpec], bool] = lambda spec: True
    # (the Cluster, the project) -> why the cluster's own setting of it is kept and the cluster refused ("": none)
    conflict: Callable[[Cluster, str], str] = lambda cluster, project: ""
    conflict_summary: str = ""  # when ``conflict`` refuses, in the plan's words

    @property
    def in_place(self) -> bool:
        return self.update is not None

    def promise(self) -> str:
        """What provisioning does when an existing cluster lacks it (the plan's words)."""
        if not self.in_place:
            return f"{self.name} (refused when missing: {self.refused_because})"
        return f"{self.name} (enabled in place when missing, and kept" + (
            f"; refused {self.conflict_summary})" if self.conflict_summary else ")"
        )


def _workload_pool(project: str) -> str:
    return f"{project}.svc.id.goog"


FEATURES = (
    Feature(
        "Ray Operator add-on",
        lambda cl, p: cl.addons_config.ray_operator_config.enabled,
        lambda p: {"desiredAddonsConfig": {"rayOperatorConfig": {"enabled": True}}},
    ),
    Feature(
        "GCS FUSE CSI driver",
        lambda cl, p: cl.addons_config.gcs_fuse_csi_driver_config.enabled,
        lambda p: {"desiredAddonsConfig": {"gcsFuseCsiDriverConfig": {"enabled": True}}},
    ),
    Feature(
        "Workload Identity",
        lambda cl, p: cl.workload_identity_config.workload_pool == _workload_pool(p),
        lambda p: {"desiredWorkloadIdentityConfig": {"workloadPool": _workload_pool(p)}},
        conflict=lambda cl, p: (
            (
                f"it uses the workload pool {cl.workload_identity_config.workload_pool}, and the "
                f"run's bucket binding names {_workload_pool(p)}; changing a shared cluster's pool "
                "would cut off its other workloads"
            )
            if cl.workload_identity_config.workload_pool
            else ""
        ),
        conflict_summary="when the cluster uses another workload pool",
    ),
    Feature(
        "Dataplane V2",
        lambda cl, p: int(cl.network_config.datapath_provider) == ADVANCED_DATAPATH,
        None,
        refused_because="GKE chooses the dataplane when a cluster is created; use a cluster created with it, or "
        "let the run create its own (gke.cluster_name empty)",
    ),
    Feature(
        "multi-networking",
        lambda cl, p: cl.network_config.enable_multi_networking,
        lambda p: {"desiredEnableMultiNetworking": True},
        needed=lambda spec: (
            d.has_dcn_nics(spec)
            and spec.gke.multislice_network == "dcn_networks"
            and spec.gke.cluster_mode == "standard"
        ),
    ),
)


def needed(spec: RunSpec) -> list[Feature]:
    """The features a cluster must have for ``spec``, in the order they are checked."""
    return [f for f in FEATURES if f.needed(spec)]


def missing(spec: RunSpec, cluster: Cluster, project: str) -> list[Feature]:
    """The needed features ``cluster`` (a ``google.cloud.container_v1.Cluster``) lacks."""
    return [f for f in needed(spec) if not f.has(cluster, project)]


def refusals(spec: RunSpec, cluster: Cluster, project: str) -> list[str]:
    """Why ``cluster`` cannot serve the run, one reason per feature it lacks that is not enabled in place (empty: it
    can, after ``missing``'s in-place features are enabled)."""
    out = []
    for f in missing(spec, cluster, project):
        reason = f.conflict(cluster, project) or ("" if f.in_place else f.refused_because)
        if reason:
            out.append(f"the {f.name}: {reason}")
    return out


def to_enable(spec: RunSpec, cluster: Cluster, project: str) -> list[Feature]:
    """The features provision enables in place: those ``cluster`` lacks that GKE enables, with no conflict."""
    return [f for f in missing(spec, cluster, project) if f.in_place and not f.conflict(cluster, project)]
