"""Preflight for ``cluster.capacity=queued`` (``plan.queued``): an existing cluster (``gke.cluster_name``) serves the
ProvisioningRequest API the run's request needs (its CRD, ``provisioningrequests.autoscaling.x-k8s.io``, at
``autoscaling.x-k8s.io/v1``, read through the cluster's Kubernetes API), else a problem naming the field; a cluster
the run creates is made by GKE, which serves it.

The GKE version from which queued provisioning serves TPU node pools is a requirement of GKE's guide
(https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest, "Requirements") that tpupipe holds no
sourced figure for, so it is not checked: the report says so in a warning, never silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.plan import queued
from components.platforms.gke.plan.needs import Needs
from components.spec import RunSpec

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

VERSION_WARNING = (
    "cluster.capacity=queued: the GKE version must be one from which queued provisioning serves TPU node pools "
    '(GKE docs, https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest, "Requirements"); '
    "preflight does not check it"
)


def check(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    if not queued.enabled(spec):
        return
    report.warnings.append(VERSION_WARNING)
    if not n.cluster:
        return
    from components.platforms.gke.checks import k8s_access
    from components.platforms.gke.cloud.cluster import Gke, cluster_manager

    cluster = Gke(cluster_manager(creds), log=lambda m: None).get_cluster(n.cluster)
    if cluster is None:  # _cluster's problem
        return
    short = n.cluster.rsplit("/", 1)[-1]
    try:
        crd = k8s_access.existing_cluster_crd(cluster, creds, spec.gke.namespace, queued.CRD_NAME)
    except Exception as exc:  # noqa: BLE001 - unreachable, or no access: _kubernetes reports it
        report.warnings.append(f"cluster {short}: its ProvisioningRequest API could not be read ({type(exc).__name__})")
        return
    version = queued.API_VERSION.split("/")[1]
    served = [v["name"] for v in (crd or {}).get("spec", {}).get("versions", []) if v.get("served")]
    if crd is None or version not in served:
        report.problems.append(
            Problem(
                "gke.cluster_name",
                f"cluster {short} serves no {queued.API_VERSION} ProvisioningRequest (CRD {queued.CRD_NAME}"
                + (f" serves {', '.join(served) or 'no version'}" if crd is not None else " not found")
                + "), which cluster.capacity=queued needs: another cluster, or another cluster.capacity "
                "(flex-start, spot, on-demand, reservation)",
            )
        )
        return
    report.checked.append(f"cluster {short}: serves the {queued.API_VERSION} ProvisioningRequest API")
