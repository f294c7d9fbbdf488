"""The Kubernetes side of the gke platform: the ``kubernetes`` client built from the GKE cluster's endpoint, CA
certificate and a google-auth token (no gcloud, no kubeconfig); the run's objects created get-or-create; the
RayCluster server-side applied; its readiness as a small state machine; the Ray Jobs API through the API server's
service proxy.

``kubernetes`` and ``ray`` are imported inside functions.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.spec import InfraError

FIELD_MANAGER = "tpupipe"
RAY_TOKEN_KEY = "auth_token"  # the key KubeRay's token Secret holds
IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff")
RAYCLUSTER_CRD = "rayclusters.ray.io"
# The cluster autoscaler's events on a pod it cannot place (kubernetes/autoscaler FAQ, "What events are emitted by
# CA?"; GKE docs, "Troubleshoot the cluster autoscaler not scaling up"): TriggeredScaleUp, it is adding nodes for the
# pod (flex-start and Autopilot start with none: the pods wait there for minutes); NotTriggerScaleUp, no node group
# it may grow would fit the pod; FailedScaleUp, it tried and the scale-up failed, the message naming why (on GKE
# "Node scale up in zones ... associated with this pod failed: GCE out of resources. ...").
SCALE_UP_TRIGGERED = "TriggeredScaleUp"
SCALE_UP_NOT_TRIGGERED = "NotTriggerScaleUp"
SCALE_UP_FAILED = "FailedScaleUp"
AUTOSCALER_REASONS = (SCALE_UP_TRIGGERED, SCALE_UP_NOT_TRIGGERED, SCALE_UP_FAILED)
# RayCluster fields tpupipe sets that a KubeRay release added, by the release: an older KubeRay's CRD lacks them, and
# the API server drops a field its CRD lacks without a word. ``authOptions.secretName`` (the Ray token's Secret) came
# in KubeRay 1.6.0 (../shared/reference/platform-facts.md, "GKE / multislice details").
RAYCLUSTER_FIELDS_SINCE = {("spec", "authOptions", "secretName"): "1.6.0"}
CUSTOM = {  # kind -> (group, version, plural)
    "RayCluster": ("ray.io", "v1", "rayclusters"),
    "ResourceClaimTemplate": ("resource.k8s.io", "v1", "resourceclaimtemplates"),
}


class RayClusterNotReady(InfraError):
    """The RayCluster cannot become ready: pods unschedulable, an image that cannot be pulled, a bad pod config."""


def api_client(endpoint: str, ca_pem: bytes, token: str, ca_dir: Path):
    """A ``kubernetes.client.ApiClient`` for ``https://<endpoint>``, trusting the cluster's CA, with the bearer
    token (a Google OAuth access token: GKE accepts it for the identity it belongs to)."""
    from kubernetes import client

    ca_dir.mkdir(parents=True, exist_ok=True)
    ca_file = ca_dir / "cluster-ca.crt"
    ca_file.write_bytes(ca_pem)
    config = client.Configuration()
    config.host = f"https://{endpoint}"
    config.ssl_ca_cert = str(ca_file)
    config.verify_ssl = True
    config.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(config)


class Kube:
    def __init__(self, api, namespace: str, log: Callable[[str], None] = print):
        from kubernetes import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
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
        result = self.api.call_api(
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
            return self.api.call_api(
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

    # -- delete by the run label (not found is success)
    def delete_labelled(self, selector: str) -> list[str]:
        from kubernetes.client.exceptions import ApiException

        deleted = []
        for kind in ("RayCluster", "ResourceClaimTemplate"):
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


# ---------------------------------------------------------------- readiness


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when ``pod`` is Unschedulable (PodScheduled False), else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (cond.get("type"), cond.get("status"), cond.get("reason")) == ("PodScheduled", "False", "Unschedulable"):
            return cond.get("message", "")
    return None


def scale_up_events(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod name -> the cluster autoscaler's latest event about it (``AUTOSCALER_REASONS``), latest by its last time
    (seconds); in one second the failure wins (``AUTOSCALER_REASONS``' order)."""

    def when(event: dict[str, Any]) -> tuple[str, int]:
        return (
            event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "",
            AUTOSCALER_REASONS.index(event["reason"]),
        )

    latest: dict[str, dict[str, Any]] = {}
    for event in sorted((e for e in events if e.get("reason") in AUTOSCALER_REASONS), key=when):
        latest[(event.get("involvedObject") or {}).get("name", "")] = event
    return latest


@dataclass
class Readiness:
    """The RayCluster's way to ready, one observation at a time: ``step(raycluster, pods, now, events)`` returns True
    when every worker is available, None while it is on its way, and raises :class:`RayClusterNotReady` with the pod's
    own reason when it will not get there: an image that cannot be pulled, a pod that cannot start, a scale-up the
    cluster autoscaler reports failed (FailedScaleUp), pods unschedulable for ``unschedulable_grace_s`` with no
    scale-up under way (a fixed-size pool does not grow; NotTriggerScaleUp names why). A pod unschedulable with a
    TriggeredScaleUp event is waiting for its nodes (flex-start, Autopilot: they start with none): only the deadline
    of :func:`wait_ready` bounds that wait."""

    unschedulable_grace_s: float = 60.0
    unschedulable_since: float | None = None
    last: str = "no status yet"

    def step(
        self,
        raycluster: dict[str, Any] | None,
        pods: list[dict[str, Any]],
        now: float,
        events: list[dict[str, Any]] = (),
    ) -> bool | None:
        if raycluster is None:
            raise RayClusterNotReady("the RayCluster is gone (deleted while the run waited for it)")
        status = raycluster.get("status") or {}
        desired = status.get("desiredWorkerReplicas")
        available = status.get("availableWorkerReplicas", 0)
        self.last = (
            f"state {status.get('state') or '(none)'}, {available}/{desired if desired is not None else '?'} "
            f"workers available, {len(pods)} pods"
        )
        if status.get("state") == "ready" and desired is not None and available >= desired:
            return True
        for pod in pods:
            _check_containers(pod)
        scale_ups = scale_up_events(list(events))
        waiting, stuck = [], []  # (pod, scheduler's message, the autoscaler's latest event or None)
        for pod in pods:
            name, message = pod["metadata"]["name"], unschedulable(pod)
            if message is None:
                continue
            event = scale_ups.get(name)
            reason = (event or {}).get("reason")
            if reason == SCALE_UP_FAILED:
                raise RayClusterNotReady(
                    f"pod {name} cannot be scheduled and the cluster autoscaler's scale-up "
                    f"failed: {reason}: {event.get('message', '')}"
                )
            (waiting if reason == SCALE_UP_TRIGGERED else stuck).append((name, message, event))
        if waiting:
            self.last += f", {len(waiting)} waiting for new nodes ({SCALE_UP_TRIGGERED})"
        if not stuck:
            self.unschedulable_since = None
            return None
        if self.unschedulable_since is None:
            self.unschedulable_since = now
        if now - self.unschedulable_since >= self.unschedulable_grace_s:
            name, message, event = stuck[0]
            why = f"{event['reason']}: {event.get('message', '')}" if event else f"Unschedulable: {message}"
            raise RayClusterNotReady(
                f"{len(stuck)} pod(s) of the RayCluster cannot be scheduled for "
                f"{now - self.unschedulable_since:.0f}s with no scale-up under way; pod {name}: "
                f"{why}"
            )
        self.last += f", {len(stuck)} unschedulable"
        return None


def _check_containers(pod: dict[str, Any]) -> None:
    """Raise when a container of ``pod`` waits on something that will not come: its image, or its config."""
    name = pod["metadata"]["name"]
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = pod["spec"]["containers"][0].get("image", "")
            raise RayClusterNotReady(
                f"pod {name} cannot pull its image {image}: {waiting['reason']}: {waiting.get('message', '')}"
            )
        if waiting.get("reason") in CONFIG_REASONS:
            raise RayClusterNotReady(f"pod {name} cannot start: {waiting['reason']}: {waiting.get('message', '')}")


def wait_ready(
    kube: Kube,
    name: str,
    timeout_s: float,
    *,
    unschedulable_grace_s: float,
    poll_s: float = 2.0,
    log: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Step :class:`Readiness` every ``poll_s`` until ready or ``timeout_s``; the pods' events are read only while
    one of them is unschedulable."""
    from components.platforms.waiting import DeadlineExceeded, wait_for

    machine = Readiness(unschedulable_grace_s=unschedulable_grace_s)
    selector = f"ray.io/cluster={name}"

    def poll():
        raycluster, pods = kube.get("RayCluster", name), kube.pods(selector)
        events = kube.pod_events() if any(unschedulable(p) is not None for p in pods) else []
        return machine.step(raycluster, pods, clock(), events) or None

    def progress(elapsed: float) -> None:
        if int(elapsed) % 10 < poll_s:
            log(f"  RayCluster {name}: {machine.last} ({elapsed:.0f}s)")

    try:
        wait_for(
            poll,
            timeout_s=timeout_s,
            interval_s=poll_s,
            what=f"RayCluster {name} to be ready",
            progress=progress,
            clock=clock,
            sleep=sleep,
        )
    except DeadlineExceeded as exc:
        raise DeadlineExceeded(f"{exc}; last seen: {machine.last}") from None
    return kube.get("RayCluster", name)


# ---------------------------------------------------------------- Ray jobs through the service proxy


def proxy_address(endpoint: str, namespace: str, service: str, port: str = "dashboard") -> str:
    return f"https://{endpoint}/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy"


def job_client(endpoint: str, ca_file: Path, namespace: str, raycluster: str, k8s_token: str, ray_token: str):
    """The Ray Jobs API of the RayCluster's head, through the API server's service proxy: Kubernetes credentials in
    ``Authorization`` (the API server consumes them), the Ray token in ``X-Ray-Authorization``."""
    from ray.job_submission import JobSubmissionClient

    headers = {"Authorization": f"Bearer {k8s_token}"}
    if ray_token:
        headers["X-Ray-Authorization"] = f"Bearer {ray_token}"
    return JobSubmissionClient(
        proxy_address(endpoint, namespace, f"{raycluster}-head-svc"), headers=headers, verify=str(ca_file)
    )


def dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True)
