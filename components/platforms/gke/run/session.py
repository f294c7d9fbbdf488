"""One stage's walk of the plan on GKE (:class:`Session`): the run's target and ledger, its cloud clients (made on
first use, with one set of credentials), and what the creation handlers found that the stage returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.platforms import RunContext, vertex_run_labels
from components.platforms import ledger as ledgers
from components.platforms.gke.cloud.clients import Clients, load_ledger
from components.platforms.gke.plan.target import DEFAULT_NODE_SERVICE_ACCOUNT, target

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from components.cloud.build import Registry


class Session:
    def __init__(self, ctx: RunContext, clients: Clients):
        self.ctx, self.clients = ctx, clients
        self.log, self.poll_s = clients.log, clients.poll_s
        self.t = target(ctx.spec, ctx.run_id)
        self.ledger = load_ledger(ctx)
        self.record = ledgers.recorder(ctx.store, self.ledger)
        self._clients: dict[str, Any] = {}
        self.cluster: Any = None  # the cluster as GKE reports it, once provision got or created it
        self.tpu_pools: list[str] = []
        self.image_result: dict[str, Any] = {}
        self.build_source_generation: int | None = None  # of the build context uploaded by this stage
        self.content_image = ""  # the trainer image under its build context's tag (cloud.build.content_image)
        self.reused_digest: str | None = None  # what that tag names, when an earlier run built the same context
        self.deploy_result: dict[str, Any] = {}
        self.kuberay_generates_token = False  # KubeRay 1.5: it makes the Ray token's Secret (deploy.check_kuberay)
        self._project_number: str | None = None
        self.service_account_uid = ""  # of the run's Kubernetes ServiceAccount, once deploy created it

    def record_value(self, key: str, value: Any) -> None:
        """Write ``key: value`` into the stored ledger at once (and this session's copy)."""
        ledgers.update(self.ctx.store, lambda stored: stored.update({key: value}))
        self.ledger[key] = value

    def node_service_account(self) -> str:
        """The nodes' service account, the default's project number filled in (looked up once)."""
        account = self.t.node_service_account
        if account != DEFAULT_NODE_SERVICE_ACCOUNT:
            return account
        if self._project_number is None:
            from components.cloud import iam as cloud_iam

            self._project_number = cloud_iam.project_number(self.t.project, self.client("creds"))
        return account.replace("PROJECT_NUMBER", self._project_number)

    def node_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """A cluster or node pool body with the nodes' service account as it really is (the plan shows the default
        as PROJECT_NUMBER-compute@...), and on Vertex AI the pipeline run's labels beside the run's own on the cluster
        and its nodes (``resourceLabels``: their VMs and disks carry them), so the run's cost in Vertex AI counts its
        TPUs (``components.platforms.vertex_run_labels``)."""
        real = json.loads(
            json.dumps(body).replace(json.dumps(self.t.node_service_account), json.dumps(self.node_service_account()))
        )
        labelled: dict[str, Any] = with_labels(real, vertex_run_labels())
        return labelled

    def client(self, what: str) -> Any:
        """``creds``, ``gke``, ``compute``, ``storage``, ``registry`` (Artifact Registry) or ``kube`` (a (Kube,
        cluster, token) triple)."""
        if "creds" not in self._clients:
            from components.platforms.gke.cloud import cluster as gke_cluster

            self._clients["creds"] = gke_cluster.credentials()
        if what not in self._clients:
            creds, clients, t = self._clients["creds"], self.clients, self.t
            made: dict[str, Callable[[], Any]] = {
                "gke": lambda: clients.gke(creds),
                "compute": lambda: clients.compute(creds),
                "storage": lambda: clients.storage(t, creds),
                "kube": lambda: clients.kube(self.ctx),
                "registry": lambda: _registry(creds, self),
            }
            self._clients[what] = made[what]()
        return self._clients[what]


def _registry(creds: Credentials, s: Session) -> Registry:
    from components.cloud import build as gke_build

    return gke_build.Registry(gke_build.registry_client(creds), log=s.log, poll_s=min(s.poll_s, 2.0))


def with_labels(body: Any, labels: dict[str, str]) -> Any:
    """``body`` with ``labels`` added to every ``resourceLabels`` in it (the cluster's, its node pools' configs'); the
    run's own labels win a clash."""
    if isinstance(body, list):
        return [with_labels(item, labels) for item in body]
    if not isinstance(body, dict):
        return body
    found = {key: with_labels(value, labels) for key, value in body.items()}
    if "resourceLabels" in found:
        found["resourceLabels"] = {**labels, **found["resourceLabels"]}
    return found
