"""The gke platform's cloud clients for a run, made with the platform's progress log and poll interval: GKE's
ClusterManager, Compute Engine, Cloud Storage, and the Kubernetes API of the run's cluster; the run's ledger as the gke
platform keeps it, and the run's cluster found from it (as recorded, else as the spec names or the run id derives).

The client libraries are imported inside functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke.plan import paths
from components.platforms.gke.plan.target import Target, binding_titles, bucket_binding, target

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud.container_v1 import Cluster

    from components.cloud.credentials import AccessToken
    from components.cloud.errors import RetryPolicy
    from components.cloud.storage import Storage
    from components.platforms.gke.cloud.cluster import Gke
    from components.platforms.gke.cloud.compute import Compute
    from components.platforms.gke.cloud.kube import Kube
    from components.platforms.gke.cloud.transient import Backoff


def load_ledger(ctx: RunContext) -> dict[str, Any]:
    """The run's ledger, or an empty one of a gke run."""
    return ledgers.load(ctx.store) or {"run_id": ctx.run_id, "platform": "gke", "created": []}


def run_cluster(ledger: dict[str, Any], t: Target) -> str:
    """The path of the run's cluster: as the ledger recorded it (in the location it records), else the one the spec
    names or the run id derives; a recorded cluster of another name or project is not the run's (the ledger is where
    the run's pods can write: components/platforms/gke/plan/ownership.py), and the derived one is used instead."""
    recorded = ledger.get("cluster") or paths.cluster_path(ledger.get("parent") or t.parent, t.cluster)
    return recorded if paths.is_cluster(recorded, t.project, t.cluster) else t.cluster_path


class Clients:
    def __init__(
        self,
        log: Callable[[str], None] = print,
        poll_s: float = 5.0,
        backoff: Backoff | None = None,
        rate_retry: RetryPolicy | None = None,
    ) -> None:
        self.log = log
        self.poll_s = poll_s
        self.backoff = backoff  # of the Kubernetes and Ray job clients' retries (transient.Backoff; None: its defaults)
        self.rate_retry = rate_retry  # of the Google Cloud adapters' rate limits (None: errors.RATE_LIMIT_RETRY)

    def gke(self, creds: Credentials | None = None) -> Gke:
        from components.platforms.gke.cloud import cluster as gke_cluster

        return gke_cluster.Gke(
            gke_cluster.cluster_manager(creds), log=self.log, poll_s=self.poll_s, rate_retry=self.rate_retry
        )

    def compute(self, creds: Credentials | None = None) -> Compute:
        from components.platforms.gke.cloud import compute as gke_compute

        return gke_compute.Compute(
            gke_compute.clients(creds), log=self.log, poll_s=min(self.poll_s, 2.0), rate_retry=self.rate_retry
        )

    def storage(self, t: Target, creds: Credentials | None = None) -> Storage:
        from components.cloud import storage as gke_storage

        return gke_storage.Storage(
            gke_storage.storage_client(t.project, creds), log=self.log, rate_retry=self.rate_retry
        )

    def kube(self, ctx: RunContext) -> tuple[Kube, Cluster, AccessToken] | tuple[None, None, None]:
        """(Kube, cluster, token) for the run's cluster, or (None, None, None) while it has no endpoint; ``token()``
        the Google access token both the Kubernetes and the Ray job client send, refreshed before it expires. The
        endpoint is ``control_plane``'s choice; one that keeps out callers outside the cluster's networks is tried
        once at once, so that a stage which cannot reach it says why and what to run instead of retrying for
        minutes."""
        from components.cloud.credentials import AccessToken
        from components.platforms.gke.cloud import cluster as gke_cluster
        from components.platforms.gke.cloud import kube as gke_kube
        from components.platforms.gke.cloud.control_plane import control_plane, restricted

        ledger = load_ledger(ctx)
        creds = gke_cluster.credentials()
        path = run_cluster(ledger, target(ctx.spec, ctx.run_id))
        cluster = self.gke(creds).get_cluster(path)
        if cluster is None or not control_plane(cluster).host:
            return None, None, None
        token = AccessToken(creds)
        api = gke_kube.api_client(control_plane(cluster), token, ctx.run_dir / "gke")
        if restricted(cluster):
            gke_kube.reach(api, cluster, path)
        namespace = ledger.get("namespace") or ctx.spec.gke.namespace
        return gke_kube.Kube(api, namespace, log=self.log, backoff=self.backoff), cluster, token

    def bucket_member(self, t: Target, uid: str, creds: Credentials | None = None) -> tuple[str, str]:
        """(role, member) of the run's binding on the bucket: its Kubernetes ServiceAccount's UID ``uid``, the project
        number looked up."""
        from components.cloud import iam as cloud_iam
        from components.cloud import storage as gke_storage

        binding = bucket_binding(t)
        return binding["role"], gke_storage.member(binding, cloud_iam.project_number(t.project, creds), uid)

    def revoke_bucket(self, t: Target) -> list[str]:
        """Remove the run's bindings on the bucket (its own prefix, the cache read-only), found by their conditions'
        titles (``binding_titles``) in the bucket's policy, which the run's pods cannot write, whatever a ledger
        says."""
        return [
            f"{role} on gs://{t.bucket} for {who}"
            for role, who in self.storage(t).remove_conditioned(t.bucket, binding_titles(t))
        ]
