"""The Kubernetes side of the gke platform: the ``kubernetes`` client built from the GKE cluster's endpoint, CA
certificate and a google-auth token (no gcloud, no kubeconfig); the run's objects created get-or-create; the
RayCluster server-side applied, after the check that the cluster's KubeRay serves every field it sets
(``kuberay_refusal``); what the caller may do, asked of the API server (``review``), and whether it answers at all
(``reach``). The Ray Jobs API through the API server's service proxy is ``ray_jobs``; waiting for the RayCluster
to be ready, ``run.readiness``. The client keeps its Google token valid (it lives at most an hour; runs wait longer)
and retries transient errors (``transient``).

``kubernetes`` is imported inside functions.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from components.platforms import redaction
from components.platforms.gke.cloud import transient
from components.platforms.gke.cloud.control_plane import ControlPlane
from components.platforms.gke.cloud.transient import Retrying
from components.spec import InfraError, SpecError, names

if TYPE_CHECKING:  # the message GKE describes a cluster with, for the type checker only (no client imported here)
    from google.cloud.container_v1 import Cluster

FIELD_MANAGER = "tpupipe"
RAY_TOKEN_KEY = "auth_token"  # the key KubeRay's token Secret holds
RAYCLUSTER_CRD = "rayclusters.ray.io"
# RayCluster fields tpupipe sets that a KubeRay release added, by the release: an older KubeRay's CRD lacks them, and
# the API server drops a field its CRD lacks without a word. Ray token authentication, ``authOptions`` with
# ``mode: token``, came in KubeRay 1.5.1, the operator generating the token's Secret itself
# (https://github.com/ray-project/kuberay/releases/tag/v1.5.1; docs.ray.io, "Configure Ray clusters to use token
# authentication": "If you are using KubeRay v1.5.1 or newer, you can use the authOptions API"); naming a Secret of
# ours, ``authOptions.secretName``, in 1.6.0 (https://github.com/ray-project/kuberay/releases/tag/v1.6.0).
AUTH_OPTIONS, AUTH_SECRET_NAME = ("spec", "authOptions"), ("spec", "authOptions", "secretName")
RAYCLUSTER_FIELDS_SINCE = {AUTH_OPTIONS: "1.5.1", AUTH_SECRET_NAME: "1.6.0"}
# KubeRay 1.5's generated Secret is named after the RayCluster as its utils.CheckName shortens names: the last 50
# characters, a leading digit or punctuation replaced by "r" (ray-operator/controllers/ray/utils/util.go and
# raycluster_controller.go reconcileAuthSecret, at tag ray-operator/v1.5.1); it holds the token under RAY_TOKEN_KEY.
GENERATED_SECRET_NAME_MAX = 50
REACH_BUDGET_S = 5.0  # how long a review is retried (a connection refused, a 503) before preflight reports it
REQUEST_TIMEOUT_S = 10.0  # an endpoint this machine cannot route to answers nothing: not waited on for long
CLUSTER_SCOPED = {"namespaces", "customresourcedefinitions"}
CUSTOM = {  # kind -> (group, version, plural)
    "RayCluster": ("ray.io", "v1", "rayclusters"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),  # a built-in kind, by the same generic calls
    "ProvisioningRequest": ("autoscaling.x-k8s.io", "v1", "provisioningrequests"),  # queued provisioning
}


def api_client(plane: ControlPlane, token: Callable[[], str], ca_dir: Path) -> Any:
    """A ``kubernetes.client.ApiClient`` for the cluster's endpoint ``plane`` (``control_plane.control_plane``),
    trusting its CA (written in ``ca_dir``) or, for the DNS-based endpoint, the public roots, with the bearer token
    ``token()`` (a Google OAuth access token, :class:`~components.cloud.credentials.AccessToken`: GKE accepts it
    for the identity it belongs to). The client's ``refresh_api_key_hook``, which it calls before every request that
    authenticates, sets the token again, refreshed when it is about to expire (as the client's own kubeconfig loader
    does for tokens with an expiry: ``kubernetes/config/kube_config.py``)."""
    from kubernetes import client

    config = client.Configuration()
    config.host = f"https://{plane.host}"
    config.ssl_ca_cert = plane.ca_file(ca_dir)  # None: the client's own roots (certifi's)
    config.verify_ssl = True

    def bearer(configuration: Any) -> None:
        configuration.api_key["authorization"] = f"Bearer {token()}"

    config.api_key = {}
    bearer(config)
    config.refresh_api_key_hook = bearer
    return client.ApiClient(config)


class _Retried:
    """An API object of the kubernetes client (``CoreV1Api``, ``CustomObjectsApi``) whose calls are retried on
    transient errors (``transient``)."""

    def __init__(self, api: Any, retrying: Retrying) -> None:
        self._api, self._retrying = api, retrying

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._retrying.call(name, method, *args, **kwargs)


class Kube:
    """The run's namespace through the kubernetes client; every call retried on transient errors (``retrying``,
    whose ``until`` a wait with a deadline sets)."""

    def __init__(
        self, api: Any, namespace: str, log: Callable[[str], None] = print, backoff: transient.Backoff | None = None
    ) -> None:
        from kubernetes import client

        self.api = api
        self.retrying = Retrying(backoff, log=log)
        self.core = _Retried(client.CoreV1Api(api), self.retrying)
        self.custom = _Retried(client.CustomObjectsApi(api), self.retrying)
        self.namespace = namespace
        self.log = log

    # -- get-or-create of core objects
    def ensure_namespace(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}})
            self.log(f"created namespace {self.namespace}")
        except ApiException as exc:
            if exc.status != 409:
                raise

    def ensure(self, obj: dict[str, Any]) -> bool:
        """Create ``obj``; an existing one is reused (True: created now)."""
        from kubernetes.client.exceptions import ApiException

        kind, ns = obj["kind"], self.namespace
        try:
            if kind == "ServiceAccount":
                self.core.create_namespaced_service_account(ns, obj)
            elif kind == "Secret":
                self.core.create_namespaced_secret(ns, obj)
            elif kind == "PodTemplate":
                self.core.create_namespaced_pod_template(ns, obj)
            elif kind in CUSTOM:
                group, version, plural = CUSTOM[kind]
                self.custom.create_namespaced_custom_object(group, version, ns, plural, obj)
            else:
                raise ValueError(f"no create for kind {kind}")
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        self.log(f"created {kind} {ns}/{obj['metadata']['name']}")
        return True

    def service_account_uid(self, name: str) -> tuple[str, dict[str, str]]:
        """The UID the API server gave the ServiceAccount ``name`` of the namespace when it created it, and the
        annotations it carries."""
        meta = self.core.read_namespaced_service_account(name, self.namespace).metadata
        return str(meta.uid), dict(meta.annotations or {})

    def secret(self, name: str) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            found = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}
        for value in data.values():  # a Secret's values never reach a log or the post-mortem (redaction)
            redaction.register(value)
        return data

    # -- server-side apply
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = CUSTOM[obj["kind"]]
        name = obj["metadata"]["name"]
        result: dict[str, Any] = self.retrying.call(
            "apply",
            self.api.call_api,
            f"/apis/{group}/{version}/namespaces/{{namespace}}/{plural}/{{name}}",
            "PATCH",
            {"namespace": self.namespace, "name": name},
            [("fieldManager", FIELD_MANAGER), ("force", "true")],
            {"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=obj,
            response_type="object",
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
        self.log(f"applied {obj['kind']} {self.namespace}/{name} (server-side apply)")
        return result

    def crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition ``name`` the API server serves; None when there is none."""
        from kubernetes.client.exceptions import ApiException

        try:
            found: dict[str, Any] = self.retrying.call(
                "get CRD",
                self.api.call_api,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}",
                "GET",
                {"name": name},
                [],
                {"Accept": "application/json"},
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return found

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        group, version, plural = CUSTOM[kind]
        try:
            return cast(
                dict[str, Any], self.custom.get_namespaced_custom_object(group, version, self.namespace, plural, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self, selector: str) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return [self.api.sanitize_for_serialization(p) for p in listed.items]

    def pod_events(self) -> list[dict[str, Any]]:
        """The namespace's Events about pods (core/v1, ``involvedObject.kind=Pod``), in the API server's order."""
        listed = self.core.list_namespaced_event(self.namespace, field_selector="involvedObject.kind=Pod")
        return [self.api.sanitize_for_serialization(e) for e in listed.items]

    def pod_log(self, name: str, container: str, tail_lines: int, previous: bool = False) -> str:
        """A container's log, its last ``tail_lines`` lines (``previous``: of its container before the last restart):
        the API server's "read log" of a pod (``GET .../pods/{name}/log``, its ``container``, ``tailLines`` and
        ``previous`` parameters: https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/
        #read-log-of-the-specified-pod)."""
        log: str = self.core.read_namespaced_pod_log(
            name, self.namespace, container=container, tail_lines=tail_lines, previous=previous
        )
        return log

    # -- delete by the run label (not found is success)
    def delete_labelled(self, selector: str, queued: bool = False) -> list[str]:
        """Delete the run's objects by its label; ``queued``: its ProvisioningRequest and PodTemplate too (asked of
        the API server only for a run that made them: another run's caller may hold no right on them)."""
        from kubernetes.client.exceptions import ApiException

        deleted = []
        customs = (
            "RayCluster",
            *(("ProvisioningRequest",) if queued else ()),
            "ResourceClaimTemplate",
            "NetworkPolicy",
        )
        for kind in customs:
            group, version, plural = CUSTOM[kind]
            try:
                items = self.custom.list_namespaced_custom_object(
                    group, version, self.namespace, plural, label_selector=selector
                )["items"]
            except ApiException as exc:
                if exc.status == 404:
                    continue
                raise
            for item in items:
                name = item["metadata"]["name"]
                try:
                    self.custom.delete_namespaced_custom_object(group, version, self.namespace, plural, name)
                    deleted.append(f"{kind}/{name}")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        cores = [
            ("Secret", self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
            ("ServiceAccount", self.core.list_namespaced_service_account, self.core.delete_namespaced_service_account),
        ]
        if queued:
            cores.append(
                ("PodTemplate", self.core.list_namespaced_pod_template, self.core.delete_namespaced_pod_template)
            )
        for kind, lister, deleter in cores:
            for item in lister(self.namespace, label_selector=selector).items:
                try:
                    deleter(item.metadata.name, self.namespace)
                    deleted.append(f"{kind}/{item.metadata.name}")
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        return deleted


def missing_fields(crd: dict[str, Any]) -> dict[str, str]:
    """Of ``RAYCLUSTER_FIELDS_SINCE``, the fields the served version of the RayCluster CRD lacks (dotted path -> the
    KubeRay release that added it)."""
    version = next((v for v in crd["spec"]["versions"] if v.get("storage")), crd["spec"]["versions"][0])
    missing = {}
    for path, since in RAYCLUSTER_FIELDS_SINCE.items():
        node = version["schema"]["openAPIV3Schema"]
        for part in path:
            node = (node or {}).get("properties", {}).get(part)
        if node is None:
            missing[".".join(path)] = since
    return missing


def generates_ray_token(crd: dict[str, Any]) -> bool:
    """Whether the cluster's KubeRay (its RayCluster CRD) is 1.5's: ``authOptions`` without ``secretName``, so the
    operator generates the token's Secret (:func:`generated_token_secret`) and the run reads the token from there."""
    return list(missing_fields(crd)) == [".".join(AUTH_SECRET_NAME)]


def generated_token_secret(raycluster: str) -> str:
    """The Secret KubeRay 1.5 generates for RayCluster ``raycluster``'s token (``GENERATED_SECRET_NAME_MAX``)."""
    name = raycluster[-GENERATED_SECRET_NAME_MAX:]
    return "r" + name[1:] if name[:1].isdigit() or (name[:1] and not name[:1].isalnum()) else name


def ray_token(kube: Kube, run_id: str) -> str:
    """The run's Ray token: from its own Secret (KubeRay >= 1.6 reads it from there), else from the one KubeRay 1.5
    generated for its RayCluster; '' when neither is there."""
    for name in (names.ray_token_secret(run_id), generated_token_secret(names.raycluster(run_id))):
        found = kube.secret(name)
        if found is not None and found.get(RAY_TOKEN_KEY):
            return found[RAY_TOKEN_KEY]
    return ""


def kuberay_refusal(crd: dict[str, Any] | None, cluster: str, owns_cluster: bool) -> SpecError | None:
    """Why the cluster's KubeRay (its RayCluster CRD, ``crd``; None when none is served) cannot run the run, naming
    the field to change; None when it can. The API server drops a field its CRD lacks without a word, and without
    ``authOptions`` (KubeRay < 1.5.1) the Ray cluster would run with no token: refused, never dropped silently.
    KubeRay 1.5 (``authOptions`` without ``secretName``) will do: it generates the token (``generates_ray_token``)."""
    field = "gke.cluster_version" if owns_cluster else "gke.cluster_name"
    if crd is None:
        return SpecError(
            field,
            f"cluster {cluster} serves no RayCluster (no {RAYCLUSTER_CRD} CRD): KubeRay, "
            "the Ray Operator add-on, is not installed",
            ["a cluster with the Ray Operator add-on"],
        )
    missing = missing_fields(crd)
    if missing and not generates_ray_token(crd):
        since = RAYCLUSTER_FIELDS_SINCE[AUTH_OPTIONS]
        return SpecError(
            field,
            f"cluster {cluster} runs a KubeRay older than {since}: its RayCluster has no "
            f"{', '.join(missing)}, which the API server would drop, leaving the Ray cluster without token "
            "authentication",
            [f"a GKE version whose Ray Operator add-on is KubeRay >= {since}"],
        )
    return None


def new_ray_token() -> str:
    token = secrets.token_hex(24)
    redaction.register(token)
    return token


def ray_token_secret(name: str, namespace: str, labels: dict[str, str], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {RAY_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def review(kube: Kube, namespace: str, verb: str, group: str, resource: str, subresource: str) -> tuple[bool, str]:
    """(allowed, the authorizer's reason) of one SelfSubjectAccessReview."""
    attributes = {"verb": verb, "group": group, "resource": resource}
    if subresource:
        attributes["subresource"] = subresource
    if resource not in CLUSTER_SCOPED:
        attributes["namespace"] = namespace
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    status = kube.retrying.call(
        "SelfSubjectAccessReview",
        kube.api.call_api,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        "POST",
        {},
        [],
        {"Content-Type": "application/json", "Accept": "application/json"},
        body=body,
        response_type="object",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _request_timeout=REQUEST_TIMEOUT_S,
    ).get("status", {})
    reason: str = status.get("reason", "")
    return bool(status.get("allowed")), reason


def reach(api: Any, cluster: Cluster, path: str) -> None:
    """Raise :class:`InfraError` naming the fix when the API server behind ``api`` (a client of ``cluster``, at
    ``path``) does not answer within preflight's short budget: a stage's own calls would retry it for minutes."""
    from components.platforms.gke.cloud import control_plane as planes
    from components.platforms.gke.cloud.transient import Backoff

    kube = Kube(api, "default", log=lambda m: None, backoff=Backoff(budget_s=REACH_BUDGET_S))
    try:
        review(kube, "default", "get", "ray.io", "rayclusters", "")
    except Exception as exc:  # noqa: BLE001 - whatever the client raises for an endpoint it cannot reach
        from kubernetes.client.exceptions import ApiException

        if isinstance(exc, ApiException):  # it answered: the caller's calls say what is wrong
            return
        raise InfraError(planes.unreachable(cluster, path, exc)) from None
