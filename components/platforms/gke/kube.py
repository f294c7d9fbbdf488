"""The Kubernetes side of the gke platform: the ``kubernetes`` client built from the GKE cluster's endpoint, CA
certificate and a google-auth token (no gcloud, no kubeconfig); the run's objects created get-or-create; the
RayCluster server-side applied, after the check that the cluster's KubeRay serves every field it sets; the Ray Jobs
API through the API server's service proxy. Waiting for the RayCluster to be ready is ``readiness``. Both clients
keep their Google token valid (it lives at most an hour; runs wait longer) and retry transient errors
(``transient``).

``kubernetes`` and ``ray`` are imported inside functions.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.platforms.gke import transient
from components.platforms.gke.control_plane import ControlPlane
from components.platforms.gke.transient import Retrying

FIELD_MANAGER = "tpupipe"
RAY_TOKEN_KEY = "auth_token"  # the key KubeRay's token Secret holds
RAYCLUSTER_CRD = "rayclusters.ray.io"
# RayCluster fields tpupipe sets that a KubeRay release added, by the release: an older KubeRay's CRD lacks them, and
# the API server drops a field its CRD lacks without a word. ``authOptions.secretName`` (the Ray token's Secret) came
# in KubeRay 1.6.0 (https://github.com/ray-project/kuberay/releases/tag/v1.6.0).
RAYCLUSTER_FIELDS_SINCE = {("spec", "authOptions", "secretName"): "1.6.0"}
CUSTOM = {  # kind -> (group, version, plural)
    "RayCluster": ("ray.io", "v1", "rayclusters"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),  # a built-in kind, by the same generic calls
}


def api_client(plane: ControlPlane, token: Callable[[], str], ca_dir: Path):
    """A ``kubernetes.client.ApiClient`` for the cluster's endpoint ``plane`` (``control_plane.control_plane``),
    trusting its CA (written in ``ca_dir``) or, for the DNS-based endpoint, the public roots, with the bearer token
    ``token()`` (a Google OAuth access token, :class:`~components.platforms.credentials.AccessToken`: GKE accepts it
    for the identity it belongs to). The client's ``refresh_api_key_hook``, which it calls before every request that
    authenticates, sets the token again, refreshed when it is about to expire (as the client's own kubeconfig loader
    does for tokens with an expiry: ``kubernetes/config/kube_config.py``)."""
    from kubernetes import client

    config = client.Configuration()
    config.host = f"https://{plane.host}"
    config.ssl_ca_cert = plane.ca_file(ca_dir)  # None: the client's own roots (certifi's)
    config.verify_ssl = True

    def bearer(configuration) -> None:
        configuration.api_key["authorization"] = f"Bearer {token()}"

    config.api_key = {}
    bearer(config)
    config.refresh_api_key_hook = bearer
    return client.ApiClient(config)


class _Retried:
    """An API object of the kubernetes client (``CoreV1Api``, ``CustomObjectsApi``) whose calls are retried on
    transient errors (``transient``)."""

    def __init__(self, api, retrying: Retrying):
        self._api, self._retrying = api, retrying

    def __getattr__(self, name: str):
        method = getattr(self._api, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._retrying.call(name, method, *args, **kwargs)


class Kube:
    """The run's namespace through the kubernetes client; every call retried on transient errors (``retrying``,
    whose ``until`` a wait with a deadline sets)."""

    def __init__(
        self, api, namespace: str, log: Callable[[str], None] = print, backoff: transient.Backoff | None = None
    ):
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

    def secret(self, name: str) -> dict[str, str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            found = self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (found.data or {}).items()}

    # -- server-side apply
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = CUSTOM[obj["kind"]]
        name = obj["metadata"]["name"]
        result = self.retrying.call(
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
            return self.retrying.call(
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

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        group, version, plural = CUSTOM[kind]
        try:
            return self.custom.get_namespaced_custom_object(group, version, self.namespace, plural, name)
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
        return self.core.read_namespaced_pod_log(
            name, self.namespace, container=container, tail_lines=tail_lines, previous=previous
        )

    # -- delete by the run label (not found is success)
    def delete_labelled(self, selector: str) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        deleted = []
        for kind in ("RayCluster", "ResourceClaimTemplate", "NetworkPolicy"):
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
        for kind, lister, deleter in (
            ("Secret", self.core.list_namespaced_secret, self.core.delete_namespaced_secret),
            ("ServiceAccount", self.core.list_namespaced_service_account, self.core.delete_namespaced_service_account),
        ):
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


def new_ray_token() -> str:
    return secrets.token_hex(24)


def ray_token_secret(name: str, namespace: str, labels: dict[str, str], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {RAY_TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


# ---------------------------------------------------------------- Ray jobs through the service proxy


def proxy_address(endpoint: str, namespace: str, service: str, port: str = "dashboard") -> str:
    return f"https://{endpoint}/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy"


def job_client(
    plane: ControlPlane,
    ca_dir: Path,
    namespace: str,
    raycluster: str,
    k8s_token: Callable[..., str],
    ray_token: str,
    log: Callable[[str], None] = print,
    backoff: transient.Backoff | None = None,
) -> JobClient:
    """The Ray Jobs API of the RayCluster's head, through the API server's service proxy: Kubernetes credentials in
    ``Authorization`` (the API server consumes them; ``k8s_token()``, kept valid), the Ray token in
    ``X-Ray-Authorization``, always (without one the jobs would go to the cluster unauthenticated, so none is made);
    the endpoint's CA (written in ``ca_dir``) or the public roots trusted, as by :func:`api_client`."""
    from ray.job_submission import JobSubmissionClient

    from components.spec import InfraError

    if not ray_token:
        raise InfraError(
            f"no Ray token for RayCluster {raycluster} in namespace {namespace} (its Secret is missing or empty): "
            "the jobs are never sent to a Ray cluster unauthenticated"
        )
    address = proxy_address(plane.host, namespace, f"{raycluster}-head-svc")
    verify = plane.ca_file(ca_dir) or True  # True: requests' own roots (certifi's)

    def make(token: str):
        headers = {"Authorization": f"Bearer {token}", "X-Ray-Authorization": f"Bearer {ray_token}"}
        return JobSubmissionClient(address, headers=headers, verify=verify)

    return JobClient(make, k8s_token, Retrying(backoff, log=log))


def unauthenticated_status(
    plane: ControlPlane,
    ca_dir: Path,
    namespace: str,
    raycluster: str,
    k8s_token: Callable[..., str],
    tries: int = 10,
) -> int:
    """The HTTP status the head's Jobs API gives a request through the service proxy that carries the Kubernetes
    credentials and no Ray token: 401 when Ray's token authentication is on (Ray answers a request without a valid
    token so: https://docs.ray.io/en/latest/ray-security/token-auth.html). A proxy's transient answer (502, 503,
    504: the head's endpoints not published yet) is asked again, a second apart."""
    import time

    import requests

    url = proxy_address(plane.host, namespace, f"{raycluster}-head-svc") + "/api/jobs/"
    verify = plane.ca_file(ca_dir) or True  # as job_client's
    status = 0
    for attempt in range(tries):
        answer = requests.get(url, headers={"Authorization": f"Bearer {k8s_token()}"}, verify=verify, timeout=30)
        status = answer.status_code
        if status not in (502, 503, 504):
            break
        if attempt + 1 < tries:
            time.sleep(1.0)
    return status


def dashboard_get(
    plane: ControlPlane, ca_dir: Path, namespace: str, raycluster: str, k8s_token: Callable[..., str], ray_token: str
) -> Callable[[str, list[tuple[str, str]]], Any]:
    """``get(path, params)``: a GET on the RayCluster head's dashboard (its State API: the post-mortem's) through the
    API server's service proxy, with the job client's credentials (:func:`job_client`); the response, an HTTP error
    raised."""
    import requests

    address = proxy_address(plane.host, namespace, f"{raycluster}-head-svc")
    verify = plane.ca_file(ca_dir) or True

    def get(path: str, params: list[tuple[str, str]]):
        headers = {"Authorization": f"Bearer {k8s_token()}", "X-Ray-Authorization": f"Bearer {ray_token}"}
        response = requests.get(address + path, params=params, headers=headers, verify=verify, timeout=60)
        response.raise_for_status()
        return response

    return get


class JobClient:
    """Ray's ``JobSubmissionClient`` (the calls the stages make) with credentials that expire: the client takes its
    headers once, so it is made again whenever ``token()`` hands out a new token (refreshed before it expires), and
    after a 401 with a token refreshed at once (one that was revoked, or that a skewed clock let expire). Each call
    is retried on transient errors (``transient``) until ``retrying.until``, the job's deadline (``until``)."""

    def __init__(self, make: Callable[[str], Any], token: Callable[..., str], retrying: Retrying):
        self._make, self._token, self.retrying = make, token, retrying
        self._client, self._made_with = None, ""

    def until(self, deadline: float) -> None:
        self.retrying.until = deadline

    def _current(self, fresh: bool = False):
        token = self._token(fresh=True) if fresh else self._token()
        if self._client is None or token != self._made_with:
            self._client = self.retrying.call("connect to the Ray dashboard", self._make, token)
            self._made_with = token
        return self._client

    def _call(self, name: str, *args, **kwargs):
        from ray.exceptions import AuthenticationError

        tries = []

        def once():
            tries.append(name)
            try:
                return getattr(self._current(), name)(*args, **kwargs)
            except RuntimeError as exc:
                # A submission retried after an answer that never came (a 502, 504): Ray took the first one.
                if name == "submit_job" and len(tries) > 1 and "already exists" in str(exc):
                    return kwargs["submission_id"]
                raise

        try:
            return self.retrying.call(name, once)
        except AuthenticationError:  # a 401 (or 403) with a token thought valid: once more with a new one
            self._current(fresh=True)
            return self.retrying.call(name, once)

    def submit_job(self, **kwargs) -> str:
        return self._call("submit_job", **kwargs)

    def get_job_info(self, job_id: str):
        return self._call("get_job_info", job_id)

    def get_job_status(self, job_id: str):
        return self._call("get_job_status", job_id)

    def get_job_logs(self, job_id: str) -> str:
        return self._call("get_job_logs", job_id)

    def stop_job(self, job_id: str) -> bool:
        return self._call("stop_job", job_id)

    def tail_job_logs(self, job_id: str):
        """The job's log as Ray streams it (a WebSocket, opened with the current token): not retried, the stages
        read the whole log instead when the stream breaks."""
        return self._current().tail_job_logs(job_id)
