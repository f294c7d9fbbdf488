"""Preflight's Kubernetes side, for an existing cluster (``gke.cluster_name``): its API server can be reached, and
the caller may do in the run's namespace what the run's stages do there, asked of the API server itself with one
SelfSubjectAccessReview per action (``authorization.k8s.io/v1``, what ``kubectl auth can-i`` sends:
https://kubernetes.io/docs/reference/access-authn-authz/authorization/#checking-api-access). On GKE the answer is
IAM's and RBAC's together (https://cloud.google.com/kubernetes-engine/docs/concepts/access-control): a role such as
``roles/container.developer`` grants these.

What the stages do there is ``plan.k8s_actions``' table.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.platforms.gke.checks.findings import Problem, Report
from components.platforms.gke.cloud import control_plane as planes
from components.platforms.gke.plan.k8s_actions import actions
from components.spec import SpecError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud.container_v1 import Cluster

    from components.platforms.gke.cloud.kube import Kube


def check(
    cluster: Cluster, path: str, namespace: str, kinds: tuple[str, ...], creds: Credentials, report: Report
) -> None:
    """Ask the API server of the cluster (its ``Cluster`` message, at ``path``) whether the caller may do each of
    ``actions(kinds)``; each one denied, or an API server that cannot be reached, is a problem. One reached through
    an endpoint that keeps out callers outside the cluster's networks (``control_plane.restricted``) is a warning:
    Vertex AI tasks run outside them."""
    from kubernetes.client.exceptions import ApiException

    from components.cloud.credentials import AccessToken
    from components.platforms.gke.cloud import kube as gke_kube
    from components.platforms.gke.cloud.transient import Backoff

    short = cluster.name
    with tempfile.TemporaryDirectory() as ca_dir:
        api = gke_kube.api_client(planes.control_plane(cluster), AccessToken(creds), Path(ca_dir))
        kube = gke_kube.Kube(api, namespace, log=lambda m: None, backoff=Backoff(budget_s=gke_kube.REACH_BUDGET_S))
        denied = []
        try:
            for verb, group, resource, subresource, why in actions(kinds):
                allowed, reason = gke_kube.review(kube, namespace, verb, group, resource, subresource)
                if not allowed:
                    because = f"{why}; {reason}" if reason else why
                    denied.append(f"{_named(verb, group, resource, subresource)} ({because})")
        except ApiException as exc:
            report.problems.append(
                Problem(
                    "gke.cluster_name",
                    f"the Kubernetes API of cluster {short} refused the caller ({exc.status} {exc.reason})",
                )
            )
            return
        except Exception as exc:  # noqa: BLE001 - an API server that cannot be reached, whatever the client raises
            report.problems.append(Problem("gke.cluster_name", planes.unreachable(cluster, path, exc)))
            return
    why = planes.restricted(cluster)
    if why:
        report.warnings.append(
            f"cluster {short}: {why} and its DNS-based endpoint takes no user traffic: reached from here, but a run "
            f"on Vertex AI (whose tasks run outside the cluster's networks) cannot reach it: run "
            f"{planes.enable_dns_access(path)}"
        )
    where = f"namespace {namespace} of cluster {short}"
    if denied:
        report.problems.append(
            Problem(
                "gke.cluster_name",
                f"the caller may not, in {where}: {'; '.join(denied)}: grant roles/container.developer (or a "
                "Kubernetes Role and RoleBinding with these verbs)",
            )
        )
    else:
        report.checked.append(f"{where}: the caller may do all {len(actions(kinds))} things the run does there")


def _named(verb: str, group: str, resource: str, subresource: str) -> str:
    """``create services/proxy``, ``patch rayclusters.ray.io``: as ``kubectl auth can-i`` takes them."""
    return f"{verb} {resource}" + (f"/{subresource}" if subresource else "") + (f".{group}" if group else "")


@contextlib.contextmanager
def preflight_kube(cluster: Cluster, creds: Credentials, namespace: str) -> Iterator[Kube]:
    """A client of an existing cluster's Kubernetes API (``cluster``: its ``Cluster`` message) in ``namespace``, with
    ``creds``' token, retried as briefly as the access review (an API server that cannot be reached is reported, not
    waited on for the 600 s a stage's call may retry)."""
    from components.cloud.credentials import AccessToken
    from components.platforms.gke.cloud import kube as gke_kube
    from components.platforms.gke.cloud.transient import Backoff

    with tempfile.TemporaryDirectory() as tmp:
        api = gke_kube.api_client(planes.control_plane(cluster), AccessToken(creds), Path(tmp))
        yield gke_kube.Kube(api, namespace, log=lambda m: None, backoff=Backoff(budget_s=gke_kube.REACH_BUDGET_S))


def existing_cluster_kuberay(cluster: Cluster, creds: Credentials, namespace: str) -> tuple[SpecError | None, bool]:
    """For preflight: the KubeRay refusal of an existing cluster (``cluster``: its ``Cluster`` message), read through
    its Kubernetes API with ``creds``' token, None when its KubeRay will do; and whether it is a KubeRay 1.5, which
    generates the Ray token's Secret itself (``kube.generates_ray_token``)."""
    from components.platforms.gke.cloud import kube as gke_kube

    crd = existing_cluster_crd(cluster, creds, namespace, gke_kube.RAYCLUSTER_CRD)
    refusal = gke_kube.kuberay_refusal(crd, cluster.name, owns_cluster=False)
    return refusal, refusal is None and crd is not None and gke_kube.generates_ray_token(crd)


def existing_cluster_crd(cluster: Cluster, creds: Credentials, namespace: str, name: str) -> dict[str, Any] | None:
    """For preflight: the CustomResourceDefinition ``name`` an existing cluster serves, read through its Kubernetes
    API with ``creds``' token; None when it serves none."""
    with preflight_kube(cluster, creds, namespace) as kube:
        return kube.crd(name)
