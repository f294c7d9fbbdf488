"""A Kubernetes API server emulator over HTTPS on 127.0.0.1, enough for the gke platform's kubernetes client:

- namespaces, secrets, service accounts, pods, services and events (core v1), and the namespaced objects of any API
  group by the same generic paths (ResourceClaimTemplates of resource.k8s.io/v1, NetworkPolicies of
  networking.k8s.io/v1, RayClusters of ray.io/v1): create (409 when it exists), get, list by ``labelSelector``,
  delete (404 when missing), server-side apply (``application/apply-patch+yaml``); a pod's log (``pods/log``);
  SelfSubjectAccessReviews (``ACCESS_REVIEW_PATH``);
- RayCluster objects are validated against the KubeRay CRD schema (422 with the reasons), as the API
  server does with strict field validation;
- ProvisioningRequests and the cluster autoscaler's queued provisioning, PodTemplates (``provisioning``): a request's
  pods wait until it is Provisioned, then are scheduled together; ``lose_pod`` loses a host mid-run;
- node taints and pod tolerations (``taints``, Kubernetes' matching rules): the nodes a ProvisioningRequest brings
  carry GKE's queued provisioning taint (``provisioning.QUEUED_TAINT``), and a pod that does not tolerate it stays
  Pending, Unschedulable with the scheduler's ``untolerated taint`` message, while the nodes are up;
- the RayCluster CRD is served (``apiextensions.k8s.io/v1``) as the KubeRay release ``kuberay_version`` installs it:
  the vendored v1.7.0 CRD, less the fields added after an older release (``FIELDS_SINCE``), which the API
  server then drops from RayClusters without a word, as a real one prunes fields its CRD lacks;
- every request needs ``Authorization: Bearer <token>``: the static ``token``, or one the emulated token issuer
  (``tests/emulators/tokens.py``) minted that has not expired; 401 otherwise, as the API server answers a request it
  cannot authenticate (https://kubernetes.io/docs/reference/access-authn-authz/authentication/);
- it plays the KubeRay operator's part: for a RayCluster it makes the head and worker pods, and when they can be
  scheduled, starts a local Ray cluster of the manifest's shape (the head, and replicas x numOfHosts raylets with
  the resources KubeRay gives them from the containers: CPU from the cpu limit, ``TPU`` from google.com/tpu, the
  TPU webhook's environment) from the torch image's environment, with Ray token authentication on, and reports
  the status fields KubeRay reports;
- ``/api/v1/namespaces/{ns}/services/{svc}:{port}/proxy/...`` is forwarded to that cluster's dashboard, with the
  ``Authorization`` header removed as the API server does after authenticating the caller; plain requests only (a
  WebSocket upgrade is refused with 400, so the stages' fallback of reading a job's whole log is what runs here).
- the pods' Cloud Storage FUSE volumes: a RayCluster's pods mount a bucket (``volumeAttributes.bucketName`` of a CSI
  volume of the ``gcsfuse.csi.storage.gke.io`` driver), or only a directory of it (the ``only-dir=D`` mount option),
  where their manifest says (the gke platform's: ``/data``), and the emulated pods are processes on this machine,
  which has no such mount; so the storage emulator's directory of that bucket (``bucket_dir(bucket)``, whose files
  are the bucket's objects: tests/emulators/storage.py), or its ``D`` under it, plays each mount: a path under a
  mount path in what a caller sends to the cluster through the proxy (a job's entrypoint) is the same path under that
  directory for the processes, and such a path in what the cluster answers (a job's log and records) is shown under
  the mount path again, as a pod prints it. A path under none of the mounts is left as it is (a pod cannot reach it,
  as on GKE). What the pods write there is in the bucket, and what is written to the bucket through the Cloud Storage
  API is there for the pods. The caller (a pipeline task, the stages) sees the pods' paths only, as on GKE, and needs
  no mount of its own.

- core/v1 Events are listed with a ``fieldSelector`` (``involvedObject.kind=Pod,involvedObject.name=...``, the
  event fields the API server selects on); the emulator records the scheduler's and the cluster autoscaler's events
  on the worker pods it cannot place.

Faults: ``unschedulable`` (pods stay Pending with the scheduler's reason), ``image_pull`` (ErrImagePull),
``scale_from_zero`` (the node pool starts with no nodes: the worker pods are Unschedulable with a TriggeredScaleUp
event for ``scale_up_s`` seconds, then the nodes come and the pods are scheduled as without the fault) and
``never_scales_up`` (Unschedulable, and the scale-up fails: ``scale_up_failure``, a FailedScaleUp after a
TriggeredScaleUp and ``scale_up_s``, or a NotTriggerScaleUp at once). ``stockouts`` (with ``scale_from_zero``): the
first that many scale-ups fail with a FailedScaleUp (GCE out of resources) and the autoscaler tries again after its
backoff (``scale_up_s`` here; 5 minutes at first, doubling up to 30, in the cluster autoscaler: its flags
initial-node-group-backoff-duration and max-node-group-backoff-duration,
https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md), a TriggeredScaleUp again, until the
nodes come. ``never_starts``: the pods are scheduled but their container stays waiting in ContainerCreating (the
kubelet's reason for a container not yet started, while its image is pulled: kubernetes/kubernetes,
pkg/kubelet/kubelet_pods.go), so the RayCluster never becomes ready. With ``ready_without_ray`` and no Ray
environment, the RayCluster's status turns ready once its pods are scheduled, with no Ray behind it (the service
proxy answers 503): KubeRay's part without the Ray cluster, for tests of readiness alone; with ``jobs`` (a
``tests/emulators/rayjobs.py`` Jobs API) as well, the proxy forwards to that, the cluster's Ray token required.

``kueue``: Kueue installed (``tests/emulators/kueue.py``: its objects, validated against its CRDs, and its controller's
part for RayClusters labelled with a queue); None (the default): no Kueue, its CRDs and objects not served.

``denied``: the (verb, group, resource, subresource) a SelfSubjectAccessReview answers not allowed (the caller's
IAM and RBAC lack it); every other is allowed.

``unavailable(times, when)``: a burst of 503s — the next ``times`` requests that ``when(method, path)`` selects are
answered ``503 ServiceUnavailable`` with ``Retry-After``, as while GKE upgrades a zonal cluster's single control
plane (https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-upgrades); the Kubernetes API conventions
tell the client to retry a 503 with exponential backoff
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#error-codes).
"""

from __future__ import annotations

import base64
import copy
import datetime
import functools
import ipaddress
import json
import os
import re
import secrets
import signal
import ssl
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.emulators import kube_schema, kueue, provisioning, taints
from tests.emulators.tokens import authorized

# PodTemplates (queued provisioning's) are not checked by the client's model: kubernetes 30.1.0's pod spec predates
# resourceClaims[].resourceClaimTemplateName (Kubernetes 1.31), which the DCN NICs' claims use.
CORE = {"namespaces", "secrets", "serviceaccounts", "pods", "services", "events", "podtemplates", "configmaps"}
# The fields the API server selects Events on (kubernetes pkg/registry/core/event/strategy.go, ToSelectableFields),
# and the ones every kind has.
EVENT_FIELDS = {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}
OBJECT_FIELDS = {"metadata.name", "metadata.namespace"}
# RayCluster fields by the KubeRay release that added them (the emulator's own table): authOptions (Ray token
# authentication, the operator generating the token's Secret) came in v1.5.1
# (https://github.com/ray-project/kuberay/releases/tag/v1.5.1: "This release adds support for Ray token
# authentication"; v1.5.0's RayCluster has no authOptions, ray-operator/apis/ray/v1/raycluster_types.go at tag
# ray-operator/v1.5.0), authOptions.secretName in v1.6.0 (https://github.com/ray-project/kuberay/releases/tag/v1.6.0).
FIELDS_SINCE = {("spec", "authOptions"): "1.5.1", ("spec", "authOptions", "secretName"): "1.6.0"}
# KubeRay's utils.CheckName, which names the generated token Secret after its RayCluster: the last 50 characters, a
# leading digit or punctuation replaced by "r" (ray-operator/controllers/ray/utils/util.go at tag ray-operator/v1.5.1).
CHECK_NAME_MAX = 50
# SelfSubjectAccessReview (authorization.k8s.io/v1): "can I", answered for the caller; 201 with ``status.allowed``
# (https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-access-review-v1/).
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CRD_PATH = re.compile(r"^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/([^/]+)$")
CRD_KINDS = {"rayclusters": "RayCluster"}
TPU_RESOURCE = "google.com/tpu"
POD_RESTARTS = 3  # the times a Ray pod whose Ray start failed is started again before the cluster is left unready
GCSFUSE_DRIVER = "gcsfuse.csi.storage.gke.io"  # Cloud Storage FUSE's CSI driver on GKE
UNSCHEDULABLE_MESSAGE = (
    "0/{n} nodes are available: {n} Insufficient google.com/tpu. preemption: 0/{n} nodes are "
    "available: {n} No preemption victims found for incoming pod."
)
# The cluster autoscaler's events on a pod it places by growing a pool (kubernetes/autoscaler FAQ, "What events are
# emitted by CA?"), the messages in GKE's words.
TRIGGERED_SCALE_UP = (
    "TriggeredScaleUp",
    "pod triggered scale-up: [{{https://www.googleapis.com/compute/v1/projects/"
    "{project}/zones/{zone}/instanceGroups/gke-{pool}-grp 0->{n} (max: {n})}}]",
)
OUT_OF_RESOURCES = (
    "FailedScaleUp",
    "Node scale up in zones {zone} associated with this pod failed: GCE out of "
    "resources. Pod is at risk of not being scheduled.",
)
NOT_TRIGGERED = ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached")
# After a failed scale-up the autoscaler keeps the node group in backoff until it may try again, and each loop meanwhile
# tells the pod so: a NotTriggerScaleUp naming the skipped reason "in backoff after failed scale-up"
# (kubernetes/autoscaler, cluster-autoscaler/core/scaleup/orchestrator/skippedreasons.go, ``BackoffReason``, at
# d610672804edab46a4931a26a9d11435cd698787; the event as GKE users see it: "pod didn't trigger scale-up: 1 in backoff
# after failed scale-up"). Recorded halfway through the backoff (``scale_up_s``), between the FailedScaleUp and the
# retry.
IN_BACKOFF = ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 in backoff after failed scale-up")


def make_certificates(directory: Path) -> tuple[bytes, Path, Path]:
    """A CA and a server certificate signed by it for 127.0.0.1 (the cluster's IP endpoint) and ``localhost`` (its
    DNS-based endpoint, which clients reach by name and check the name of): (CA PEM, cert file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpupipe emulator CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "apiserver.crt", directory / "apiserver.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca.public_bytes(serialization.Encoding.PEM), cert_file, key_file


@functools.cache
def _vendored_crds() -> dict[str, dict]:
    """The vendored KubeRay CRDs by name (``rayclusters.ray.io``), read once."""
    import yaml

    from tests.contract.kuberay_schema import CRD_FILES, schema_dir

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds = [yaml.load((schema_dir() / f).read_text(), Loader=loader) for f in CRD_FILES.values()]
    return {crd["metadata"]["name"]: crd for crd in crds}


def _check_name(name: str) -> str:
    name = name[-CHECK_NAME_MAX:]
    return "r" + name[1:] if name[0].isdigit() or not name[0].isalnum() else name


def _older(version: str, than: str) -> bool:
    return tuple(int(x) for x in version.split(".")) < tuple(int(x) for x in than.split("."))


def _into_pods(data: bytes, mounts: dict[str, Path]) -> bytes:
    """Paths at or under the pods' mounts (``/data/...``) as the emulated pods reach them: at or under the directory
    that plays each mount (``KubeEmulator._fuse_mounts``), the longest mount path that holds the path; a path under
    no mount stays as it is."""
    return _rewrite(data, {path: str(here) for path, here in mounts.items()})


def _from_pods(data: bytes, mounts: dict[str, Path]) -> bytes:
    """Paths at or under the directories that play the pods' mounts as a pod shows them: at or under its mount path
    (wherever they are in the text, a ``file://`` URI's among them: those directories are this machine's own)."""
    return _rewrite(data, {str(here): path for path, here in mounts.items()}, start=b"")


# a path starts where no path's character is before it
PATH_START = rb"(?<![\w./-])"


def _rewrite(data: bytes, prefixes: dict[str, str], start: bytes = PATH_START) -> bytes:
    """``data`` with each path that is a key of ``prefixes``, or under one (the longest), starting with its value
    instead: where ``start`` matches before it, and followed by ``/`` or by no path's character."""
    if not (prefixes and data):
        return data
    keys = sorted(prefixes, key=len, reverse=True)
    alternatives = b"|".join(re.escape(key.encode()) for key in keys)
    pattern = re.compile(start + rb"(" + alternatives + rb")(?=/|(?![\w.-]))")
    return pattern.sub(lambda m: prefixes[m[1].decode()].encode(), data)


def _running(container: dict) -> dict:
    """The kubelet's status of a container that started and runs: one entry per container of the pod's spec
    (PodStatus ``containerStatuses``; ContainerStatus ``state.running.startedAt``, ``ready``, ``restartCount``:
    https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#PodStatus)."""
    return {
        "name": container["name"],
        "ready": True,
        "started": True,
        "image": container["image"],
        "imageID": container["image"],
        "restartCount": 0,
        "state": {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
    }


def _status(code: int, reason: str, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _matches(labels: dict, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _selectable(plural: str) -> set[str]:
    return OBJECT_FIELDS | (EVENT_FIELDS if plural == "events" else set())


def _terms(selector: str) -> list[tuple[str, str, str]]:
    """``a.b=v,c!=w`` -> [(field, operator, value)]; ``==`` is ``=``."""
    out = []
    for term in filter(None, selector.split(",")):
        field, op, value = re.match(r"^([^=!]+)(==|!=|=)(.*)$", term).groups()
        out.append((field, "!=" if op == "!=" else "=", value))
    return out


def _unselectable(plural: str, selector: str) -> str:
    """The first field of ``selector`` the API server does not select ``plural`` on ('' when none)."""
    return next((f for f, _, _ in _terms(selector) if f not in _selectable(plural)), "")


def _fields_match(obj: dict, selector: str) -> bool:
    for field, op, value in _terms(selector):
        node = obj
        for part in field.split("."):
            node = node.get(part, "") if isinstance(node, dict) else ""
        if field == "source" and isinstance(node, dict):
            node = node.get("component", "")
        if (str(node) == value) != (op == "="):
            return False
    return True


class KubeEmulator:
    """The API server and the KubeRay operator. ``start()`` serves on 127.0.0.1; ``stop()`` stops every local
    Ray cluster it started."""

    def __init__(
        self,
        work_dir: Path,
        token: str,
        crd_validator,
        ray_env=None,
        fault: str = "",
        ready_delay_s: float = 0.0,
        scale_up_s: float = 2.0,
        bucket_dir: Callable[[str], Path] | None = None,
    ):
        self.work_dir = Path(work_dir)
        self.token = token
        self.crds = crd_validator
        self.ray_env = ray_env  # components.envs.Env of the torch image, for the raylets; None: never start Ray
        # a bucket's name -> the directory whose files are its objects, which plays the pods' mounts of it (the
        # storage emulator's bucket_dir); None: no mount is played (paths under the mounts are sent as they are)
        self.bucket_dir = bucket_dir
        self.fault = fault
        self.ready_delay_s = ready_delay_s
        self.scale_up_s = scale_up_s  # scale_from_zero / never_scales_up: how long the nodes take to come (or fail)
        self.scale_up_failure = OUT_OF_RESOURCES  # never_scales_up: the autoscaler's event, or NOT_TRIGGERED
        self.stockouts = 0  # scale_from_zero: how many scale-ups fail (FailedScaleUp) before the nodes come
        # The GKE behind this API server (its ``scale_up_stockout``): given a worker pod's nodeSelector, the zone whose
        # TPU pools for it the autoscaler cannot grow (no flex-start capacity there), else None. Such pods scale from
        # zero and every scale-up fails (FailedScaleUp), retried after the backoff, for as long as the pods ask.
        self.scale_up_stockout: Callable[[dict], str | None] | None = None
        self.autoscaler_place = {"project": "tpupipe-emulated", "zone": "us-east5-b"}  # in the autoscaler's messages
        self.ready_without_ray = False  # no Ray environment: the status turns ready once the pods are scheduled
        self.kuberay_version = "1.7.0"  # the KubeRay release whose CRD is served (an older one lacks newer fields)
        # A fault: the Ray cluster runs without token authentication whatever its spec says (a Ray older than 2.52 in
        # the image, or RAY_AUTH_MODE=disabled baked into it), so it answers requests that carry no token.
        self.ray_auth_off = False
        self.kueue: kueue.Kueue | None = None  # Kueue installed (tests/emulators/kueue.py): its objects and controller
        self._own_jobs = False  # the Jobs API below was made here (not given by a test): stopped with the server
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, namespace, name) -> object
        self.lock = threading.RLock()
        self.provisioner = provisioning.Provisioner(self.objects, self.lock)  # ProvisioningRequests (queued)
        self.provisioner.lose_pod = self.lose_pod  # CapacityRevoked: the request's nodes, and their pods, go
        self.clusters: dict[tuple[str, str], dict] = {}  # (namespace, raycluster) -> local Ray cluster record
        self._stopping: dict[tuple[str, str], threading.Thread] = {}  # a RayCluster's Ray being stopped (stop_pods)
        self.denied: set[tuple[str, str, str, str]] = set()  # (verb, group, resource, subresource) the caller may not
        self.reviews: list[tuple[str, str, str, str]] = []  # the SelfSubjectAccessReviews asked, in order
        self.jobs = None  # with ready_without_ray: the Jobs API (rayjobs.RayJobsEmulator) behind the head's proxy
        self.burst = {"times": 0, "when": None, "answered": 0}  # unavailable(): the 503s left, which, how many sent
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers) of every request
        self.statuses: list[tuple[str, str, int]] = []  # (method, path, status) of every answer
        self.bodies: list[tuple[str, str, str]] = []  # (method, path, body text) of every request
        self.ca_pem, self._cert, self._key = make_certificates(self.work_dir / "pki")
        self._server = None
        self.endpoint = ""  # 127.0.0.1:PORT, the cluster's IP endpoint
        self.dns_endpoint = ""  # localhost:PORT, the same server by name: the cluster's DNS-based endpoint

    # ------------------------------------------------------------------ serving
    def start(self) -> str:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                emulator._handle(self, "GET")

            def do_POST(self):
                emulator._handle(self, "POST")

            def do_PATCH(self):
                emulator._handle(self, "PATCH")

            def do_PUT(self):
                emulator._handle(self, "PUT")

            def do_DELETE(self):
                emulator._handle(self, "DELETE")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self._cert, self._key)
        # Each connection's TLS handshake in its own handler thread, on its first read, as a real API server serves
        # connections concurrently: a handshake in the accept loop would let one client that stops mid-handshake (a
        # signal's handler sending another request first) hold every other connection back.
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"
        self.dns_endpoint = f"localhost:{self._server.server_address[1]}"
        return self.endpoint

    def stop(self) -> None:
        for key in list(self.clusters):
            self._stop_ray(key)
        if self._own_jobs:
            self.jobs.stop()
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def _access_review(self, review: dict) -> dict:
        """A SelfSubjectAccessReview answered: allowed unless ``denied`` holds (verb, group, resource, subresource)."""
        attributes = review.get("spec", {}).get("resourceAttributes", {})
        key = tuple(attributes.get(k, "") for k in ("verb", "group", "resource", "subresource"))
        with self.lock:
            self.reviews.append(key)
            allowed = key not in self.denied
        return {**review, "status": {"allowed": allowed, **({"reason": "access granted by IAM"} if allowed else {})}}

    def unavailable(self, times: int, when=lambda method, path: True) -> None:
        """Answer the next ``times`` requests that ``when(method, path)`` selects with 503 (a burst)."""
        with self.lock:
            self.burst.update(times=times, when=when)

    # ------------------------------------------------------------------ HTTP
    def _send(self, h: BaseHTTPRequestHandler, code: int, body, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        with self.lock:
            self.statuses.append((h.command, urllib.parse.urlsplit(h.path).path, code))
        h.send_response(code)
        h.send_header("Content-Type", content_type)
        if code in (429, 503) and not isinstance(body, bytes):  # the API server's own: says when to retry
            h.send_header("Retry-After", "1")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((method, url.path, dict(h.headers)))
            self.bodies.append((method, url.path, body.decode(errors="replace")))
            burst = self.burst["times"] > 0 and self.burst["when"](method, url.path)
            if burst:
                self.burst["times"] -= 1
                self.burst["answered"] += 1
        if burst:
            return self._send(
                h, 503, _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
            )
        if not authorized(self.token, h.headers.get("Authorization")):
            return self._send(h, 401, _status(401, "Unauthorized", "Unauthorized"))
        if url.path == ACCESS_REVIEW_PATH and method == "POST":
            return self._send(h, 201, self._access_review(json.loads(body or b"{}")))
        crd = CRD_PATH.match(url.path)
        if crd and method == "GET":
            found = self.served_crd(crd.group(1))
            if found is None:
                return self._send(
                    h,
                    404,
                    _status(
                        404, "NotFound", f'customresourcedefinitions.apiextensions.k8s.io "{crd.group(1)}" not found'
                    ),
                )
            return self._send(h, 200, found)
        visibility = kueue.VISIBILITY_PATH.match(url.path)
        if visibility and method == "GET" and self.kueue is not None and self.kueue.visibility:
            with self.lock:
                return self._send(h, 200, self.kueue.pending_workloads(visibility.group(1), visibility.group(2)))
        pod_log = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$", url.path)
        if pod_log and method == "GET":
            code, out = self._pod_log(pod_log.group(1), pod_log.group(2), query)
            return self._send(h, code, out, "text/plain" if code == 200 else "application/json")
        proxy = re.match(r"^/api/v1/namespaces/([^/]+)/services/([^/:]+):([^/]+)/proxy(/.*)?$", url.path)
        if proxy:
            return self._proxy(h, method, proxy.group(1), proxy.group(2), proxy.group(4) or "/", url.query, body)
        ns_obj = re.match(r"^/api/v1/namespaces(?:/([^/]+))?$", url.path)
        cluster_scoped = re.match(r"^/apis/[^/]+/[^/]+/([a-z]+)(?:/([^/]+))?$", url.path)
        m = re.match(r"^/api/v1/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?$", url.path) or re.match(
            r"^/apis/[^/]+/[^/]+/namespaces/([^/]+)/([a-z]+)(?:/([^/]+))?$", url.path
        )
        if ns_obj:
            plural, namespace, name = "namespaces", "", ns_obj.group(1) or ""
        elif m:
            namespace, plural, name = m.group(1), m.group(2), m.group(3) or ""
        elif cluster_scoped and cluster_scoped.group(1) in kueue.CLUSTER_SCOPED:
            plural, namespace, name = cluster_scoped.group(1), "", cluster_scoped.group(2) or ""
        else:
            return self._send(h, 404, _status(404, "NotFound", f"the server could not find {url.path}"))
        try:
            code, out = self._object(method, plural, namespace, name, query, body, h.headers.get("Content-Type", ""))
        except Exception as exc:  # noqa: BLE001 - an emulator bug shows as a 500 with its message
            code, out = 500, _status(500, "InternalError", repr(exc))
        self._send(h, code, out)

    # ------------------------------------------------------------------ objects
    def _object(self, method, plural, namespace, name, query, body, content_type):
        key = (plural, namespace, name)
        with self.lock:
            if method == "GET" and not name:
                fields = query.get("fieldSelector", "")
                unknown = _unselectable(plural, fields)
                if unknown:
                    return 400, _status(
                        400,
                        "BadRequest",
                        f'"{unknown}" is not a known field selector: only "{", ".join(sorted(_selectable(plural)))}"',
                    )
                items = [
                    o
                    for (p, ns, _), o in self.objects.items()
                    if p == plural
                    and (ns == namespace or not namespace)
                    and _matches(o["metadata"].get("labels", {}), query.get("labelSelector", ""))
                    and _fields_match(o, fields)
                ]
                return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
            if method == "GET":
                if key not in self.objects:
                    return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
                return 200, self.objects[key]
            if method == "DELETE":
                if key not in self.objects:
                    return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
                obj = self.objects.pop(key)
                if plural == "rayclusters":
                    self._delete_raycluster(namespace, name)
                    if self.kueue is not None:
                        self.kueue.raycluster_deleted(namespace, name)
                return 200, obj
            obj = json.loads(body or b"{}")
            if method == "POST":
                name = obj.get("metadata", {}).get("name", "")
                key = (plural, namespace, name)
                if key in self.objects:
                    return 409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            elif method == "PATCH" and content_type != "application/apply-patch+yaml":
                return 415, _status(415, "UnsupportedMediaType", f"only server-side apply here, not {content_type}")
            if plural == "rayclusters":
                self._prune(obj)
            errors = self._validate(plural, namespace, obj)
            if errors:
                kind = CRD_KINDS.get(plural) or obj.get("kind") or plural
                return 422, _status(422, "Invalid", f'{kind} "{name}" is invalid: ' + "; ".join(errors))
            existed = key in self.objects
            meta = obj.setdefault("metadata", {})
            if namespace:
                meta["namespace"] = namespace
            # the API server sets both, never the client ("Populated by the system. Read-only", uid and
            # creationTimestamp: https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/);
            # an apply to an existing object keeps them
            kept = self.objects[key]["metadata"] if existed else {}
            meta["uid"] = kept.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = kept.get("creationTimestamp") or time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime()
            )
            if existed and "status" in self.objects[key]:
                obj["status"] = self.objects[key]["status"]
            self.objects[key] = obj
            if plural == "rayclusters" and not existed:
                held = self.kueue is not None and self.kueue.raycluster_created(namespace, obj)
                if not held and obj["spec"].get("suspend"):
                    # KubeRay makes no pods for a suspended RayCluster ("A suspended RayCluster will have head pods
                    # and worker pods deleted": ray-project/kuberay v1.7.0, ray-operator/apis/ray/v1/
                    # raycluster_types.go, ``Suspend``): it waits for whoever unsuspends it.
                    obj["status"] = {"state": "suspended", "desiredWorkerReplicas": 0, "readyWorkerReplicas": 0}
                elif not held:
                    self._create_raycluster(namespace, obj)
            elif plural in kueue.KINDS and self.kueue is not None:
                self.kueue.reconcile()  # a queue or its quota changed
            if plural == provisioning.PLURAL and not existed:
                self.provisioner.created(namespace, obj)
            return (200 if existed else 201), obj

    def _dropped(self) -> list[tuple[str, ...]]:
        """The RayCluster fields the served KubeRay release does not have."""
        return [path for path, since in FIELDS_SINCE.items() if _older(self.kuberay_version, since)]

    def served_crd(self, name: str) -> dict | None:
        """The CRD ``name`` as the served KubeRay release installs it; None when it is not one of KubeRay's."""
        crd = _vendored_crds().get(name) or (provisioning.crd() if self.provisioner.serves(name) else None)
        if crd is None and self.kueue is not None:  # Kueue's, while it is installed
            crd = self.crds.crds.get(name)
        if crd is None:
            return None
        crd = copy.deepcopy(crd)
        for version in crd["spec"]["versions"]:
            for *parents, leaf in self._dropped():
                node = version["schema"]["openAPIV3Schema"]
                for part in parents:
                    node = node.get("properties", {}).get(part, {})
                node.get("properties", {}).pop(leaf, None)
        return crd

    def _prune(self, obj: dict) -> None:
        """Drop the fields the served CRD lacks, without a word, as the API server prunes unknown fields."""
        for *parents, leaf in self._dropped():
            node = obj
            for part in parents:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(leaf, None)

    def _validate(self, plural: str, namespace: str, obj: dict) -> list[str]:
        if plural in CRD_KINDS:
            return self.crds.errors(obj)
        if plural == provisioning.PLURAL:
            return provisioning.errors(obj)
        if plural in kueue.KINDS and self.kueue is not None:
            if namespace and ("namespaces", "", namespace) not in self.objects:
                return [f'namespaces "{namespace}" not found']
            return self.crds.errors(obj)
        if plural not in CORE and plural != "resourceclaimtemplates" and plural not in kube_schema.MODELS:
            return [f"unknown resource {plural}"]
        if namespace and ("namespaces", "", namespace) not in self.objects:
            return [f'namespaces "{namespace}" not found']
        if plural in kube_schema.MODELS:
            return kube_schema.errors(obj, kube_schema.MODELS[plural])
        return []

    # ------------------------------------------------------------------ the KubeRay operator
    def _pod(self, namespace: str, cluster: str, name: str, group: dict, node_type: str) -> dict:
        template = group["template"]
        labels = {
            **template.get("metadata", {}).get("labels", {}),
            "ray.io/cluster": cluster,
            "ray.io/node-type": node_type,
            "ray.io/group": group.get("groupName", "headgroup"),
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": secrets.token_hex(8),
                "labels": labels,
                "annotations": dict(template.get("metadata", {}).get("annotations", {})),
            },
            "spec": template["spec"],
            "status": {"phase": "Pending", "conditions": []},
        }

    def _create_raycluster(self, namespace: str, obj: dict) -> None:
        name = obj["metadata"]["name"]
        spec = obj["spec"]
        self._generate_token_secret(namespace, obj)
        pods = [self._pod(namespace, name, f"{name}-head", spec["headGroupSpec"], "head")]
        for group in spec.get("workerGroupSpecs", []):
            for replica in range(group.get("replicas", 1)):
                for host in range(group.get("numOfHosts", 1)):
                    pods.append(
                        self._pod(namespace, name, f"{name}-{group['groupName']}-{replica}-{host}", group, "worker")
                    )
        for pod in pods:
            self.objects[("pods", namespace, pod["metadata"]["name"])] = pod
        self.objects[("services", namespace, f"{name}-head-svc")] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{name}-head-svc", "namespace": namespace, "labels": {"ray.io/cluster": name}},
            "spec": {"ports": [{"name": "dashboard", "port": 8265}]},
        }
        desired = sum(g.get("replicas", 1) * g.get("numOfHosts", 1) for g in spec.get("workerGroupSpecs", []))
        obj["status"] = {
            "desiredWorkerReplicas": desired,
            "availableWorkerReplicas": 0,
            "readyWorkerReplicas": 0,
            "state": "",
            "conditions": [],
        }
        if self.fault == "unschedulable":
            for pod in pods[1:]:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": UNSCHEDULABLE_MESSAGE.format(n=2),
                    }
                ]
            return
        if self.fault == "image_pull":
            for pod in pods:
                image = pod["spec"]["containers"][0]["image"]
                pod["status"]["containerStatuses"] = [
                    {
                        "name": pod["spec"]["containers"][0]["name"],
                        "ready": False,
                        "image": pod["spec"]["containers"][0]["image"],
                        "imageID": "",
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "ErrImagePull",
                                "message": f'failed to pull image "{image}": not found',
                            }
                        },
                    }
                ]
            return
        if self.provisioner.holds(namespace, pods, lambda: self._provisioned(namespace, name)):
            return  # its workers wait for their ProvisioningRequest
        if self.fault in ("scale_from_zero", "never_scales_up") or self._stocked_out(pods):
            return self._scale_from_zero(namespace, obj, pods)
        if self.fault == "never_starts":
            for pod in pods:
                container = pod["spec"]["containers"][0]
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                pod["status"]["containerStatuses"] = [
                    {
                        "name": container["name"],
                        "ready": False,
                        "image": container["image"],
                        "imageID": "",
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "ContainerCreating"}},
                    }
                ]
            return
        self._schedule(namespace, obj, pods)

    def _schedule(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """The pods are placed: they start (or cannot, for a Secret they lack), and Ray starts in them; unless a pod
        does not tolerate its nodes' taints (``_refused_by_taints``), when the pods stay as they are and Ray does not
        start."""
        if self._refused_by_taints(namespace, pods):
            return
        missing = self._missing_secrets(namespace, pods)
        if missing:
            for pod in pods:
                pod["status"]["containerStatuses"] = [
                    {
                        "name": pod["spec"]["containers"][0]["name"],
                        "ready": False,
                        "image": pod["spec"]["containers"][0]["image"],
                        "imageID": "",
                        "restartCount": 0,
                        "state": {
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": f'secret "{missing}" not found',
                            }
                        },
                    }
                ]
            return
        for pod in pods:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        if self.ray_env is not None:
            threading.Thread(target=self._start_ray, args=(namespace, obj, pods), daemon=True).start()
        elif self.ready_without_ray:
            name = obj["metadata"]["name"]
            if self.jobs is None:  # the head's dashboard: the emulated Jobs API, with the cluster's Ray token
                from tests.emulators.rayjobs import RayJobsEmulator

                self.jobs = RayJobsEmulator()
                self.jobs.start()
                self._own_jobs = True
            self.jobs.token = "" if self.ray_auth_off else self._ray_token(namespace, obj)
            self.clusters[(namespace, name)] = {
                "processes": [],
                "temp_dir": self.work_dir / "no-ray",
                "dashboard": self.jobs.port,
                "token": self.jobs.token,
                "run_id": f"no-ray-{secrets.token_hex(6)}",  # no process of any run is this cluster's
            }
            self._mark_ready(namespace, name, len(pods))

    def _refused_by_taints(self, namespace: str, pods: list[dict]) -> bool:
        """The scheduler's taint filter (``taints``): a pod that does not tolerate a NoSchedule or NoExecute taint of
        the nodes it would land on (``provisioning.node_taints``: a queued provisioning pool's) is not scheduled; it
        stays Pending, Unschedulable with the scheduler's message, and a FailedScheduling event is recorded for it,
        while the nodes stay up (and bill). True when some pod is refused (the RayCluster then never gets ready)."""
        refused = {}
        for pod in pods:
            taint = taints.untolerated(pod["spec"], provisioning.node_taints(pod))
            if taint is not None:
                refused[pod["metadata"]["name"]] = taint
        if not refused:
            return False
        nodes = sum(1 for pod in pods if provisioning.node_taints(pod))  # one node per TPU host pod
        for pod in pods:
            taint = refused.get(pod["metadata"]["name"])
            if taint is None:
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
                continue
            message = taints.refusal(taint, nodes)
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]
            self._event(namespace, pod["metadata"]["name"], "FailedScheduling", message, "default-scheduler")
        return True

    # ------------------------------------------------------------------ the cluster autoscaler
    def _event(self, namespace: str, pod: str, reason: str, message: str, component: str) -> None:
        """A core/v1 Event about pod ``pod``, as the scheduler or the cluster autoscaler records it."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        name = f"{pod}.{secrets.token_hex(8)}"
        self.objects[("events", namespace, name)] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace, "uid": secrets.token_hex(8), "creationTimestamp": now},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod},
            "reason": reason,
            "message": message,
            "type": "Normal" if reason == "TriggeredScaleUp" else "Warning",
            "source": {"component": component},
            "reportingComponent": component,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
        }

    def _scale_from_zero(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        """The TPU pool has no nodes: the worker pods are Unschedulable and the autoscaler grows the pool (after
        ``scale_up_s`` the nodes come and the pods are scheduled), or, for ``never_scales_up``, cannot."""
        workers = pods[1:]
        group = obj["spec"]["workerGroupSpecs"][0]["groupName"]
        triggered = TRIGGERED_SCALE_UP[1].format(pool=group, n=len(workers), **self.autoscaler_place)
        failure = self.fault == "never_scales_up" and self.scale_up_failure
        pods[0]["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]  # the head: on the CPU pool
        for pod in workers:
            message = UNSCHEDULABLE_MESSAGE.format(n=1)
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
            ]
            self._event(namespace, pod["metadata"]["name"], "FailedScheduling", message, "default-scheduler")
            if failure and failure[0] == NOT_TRIGGERED[0]:
                self._event(namespace, pod["metadata"]["name"], *failure, "cluster-autoscaler")
            else:
                self._event(namespace, pod["metadata"]["name"], TRIGGERED_SCALE_UP[0], triggered, "cluster-autoscaler")
        if failure and failure[0] == NOT_TRIGGERED[0]:
            return
        args = (namespace, obj["metadata"]["name"], failure, obj["metadata"].get("uid", ""))
        timer = threading.Timer(self.scale_up_s, self._nodes_came, args=args)
        timer.daemon = True
        timer.start()

    def _stocked_out(self, pods: list[dict]) -> str | None:
        """The zone where the GKE behind this server cannot grow the TPU pools the worker pods select
        (``scale_up_stockout``), else None."""
        workers = [p for p in pods if p["metadata"]["labels"].get("ray.io/node-type") == "worker"]
        if self.scale_up_stockout is None or not workers:
            return None
        return self.scale_up_stockout(workers[0]["spec"].get("nodeSelector") or {})

    def _nodes_came(self, namespace: str, name: str, failure, uid: str = "") -> None:
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, name))
            if obj is None or (uid and obj["metadata"].get("uid") != uid):  # deleted (or made anew) meanwhile
                return
            pods = [
                p
                for (plural, ns, _), p in self.objects.items()
                if plural == "pods" and ns == namespace and p["metadata"]["labels"].get("ray.io/cluster") == name
            ]
            workers = [p for p in pods if p["metadata"]["labels"]["ray.io/node-type"] == "worker"]
            zone = None if failure else self._stocked_out(pods)
            stockout = not failure and (zone is not None or self.stockouts > 0)
            if failure or stockout:
                reason, message = failure or OUT_OF_RESOURCES
                place = {**self.autoscaler_place, **({"zone": zone} if zone else {})}
                for pod in workers:
                    self._event(
                        namespace, pod["metadata"]["name"], reason, message.format(**place), "cluster-autoscaler"
                    )
                if stockout:  # in backoff (said halfway through it), then the autoscaler tries again
                    self.stockouts -= 0 if zone else 1
                    args = (namespace, name, workers, obj["metadata"].get("uid", ""))
                    for delay, then in (
                        (self.scale_up_s / 2, self._in_backoff),
                        (self.scale_up_s, self._retry_scale_up),
                    ):
                        timer = threading.Timer(delay, then, args=args)
                        timer.daemon = True
                        timer.start()
                return
            self._schedule(namespace, obj, pods)

    def _provisioned(self, namespace: str, name: str) -> None:
        """A ProvisioningRequest the RayCluster's workers consume is Provisioned: once every one they consume is, all
        its pods are placed (meanwhile those of the provisioned ones are PodScheduled)."""
        with self.lock:
            pods = [
                p
                for (plural, ns, _), p in self.objects.items()
                if plural == "pods" and ns == namespace and p["metadata"]["labels"].get("ray.io/cluster") == name
            ]
            if self.provisioner.holds(namespace, pods):
                return
        self._nodes_came(namespace, name, None)

    def _live(self, namespace: str, name: str, uid: str) -> dict:
        """The RayCluster ``name`` when it is still the one the autoscaler acted for (``uid``), else {}."""
        obj = self.objects.get(("rayclusters", namespace, name)) or {}
        return obj if obj and not (uid and obj["metadata"].get("uid") != uid) else {}

    def _in_backoff(self, namespace: str, name: str, workers: list[dict], uid: str = "") -> None:
        with self.lock:
            if self._live(namespace, name, uid):
                for pod in workers:
                    self._event(namespace, pod["metadata"]["name"], *IN_BACKOFF, "cluster-autoscaler")

    def _retry_scale_up(self, namespace: str, name: str, workers: list[dict], uid: str = "") -> None:
        with self.lock:
            obj = self._live(namespace, name, uid)
            group = obj.get("spec", {})
            if not group:
                return
            pool = group["workerGroupSpecs"][0]["groupName"]
            triggered = TRIGGERED_SCALE_UP[1].format(pool=pool, n=len(workers), **self.autoscaler_place)
            for pod in workers:
                self._event(namespace, pod["metadata"]["name"], TRIGGERED_SCALE_UP[0], triggered, "cluster-autoscaler")
        timer = threading.Timer(self.scale_up_s, self._nodes_came, args=(namespace, name, None, uid))
        timer.daemon = True
        timer.start()

    def _missing_secrets(self, namespace: str, pods: list[dict]) -> str:
        """The first Secret a pod names (an env var's secretKeyRef, a secret volume) that the namespace lacks: the
        kubelet cannot start its containers (CreateContainerConfigError, or the volume's mount fails)."""
        for pod in pods:
            named = [v["secret"]["secretName"] for v in pod["spec"].get("volumes", []) if "secret" in v]
            for container in pod["spec"]["containers"]:
                for env in container.get("env", []):
                    ref = env.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        named.append(ref["name"])
            for name in named:
                if ("secrets", namespace, name) not in self.objects:
                    return name
        return ""

    def _volumes(self, namespace: str, pod: dict) -> dict[str, str]:
        """The pod's emptyDir and Secret volumes as directories here, by the container's mount path: a Secret's keys
        are files with the volume's mode (https://kubernetes.io/docs/concepts/configuration/secret/#using-secrets-as-
        files-from-a-pod). The processes of a pod see its paths there (``_container_env``)."""
        root = self.work_dir / "pods" / namespace / pod["metadata"]["name"]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        out = {}
        for mount in pod["spec"]["containers"][0].get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "emptyDir" not in volume and "secret" not in volume:
                continue
            where = root / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            if "secret" in volume:
                data = self.objects[("secrets", namespace, volume["secret"]["secretName"])].get("data", {})
                for item in volume["secret"].get("items") or [{"key": k, "path": k} for k in data]:
                    path = where / item["path"]
                    path.write_bytes(base64.b64decode(data[item["key"]]))
                    path.chmod(volume["secret"].get("defaultMode", 0o644))
            out[mount["mountPath"]] = str(where)
        return out

    def _container_env(self, namespace: str, container: dict, mounts: dict[str, str] | None = None) -> dict[str, str]:
        out = {}
        for env in container.get("env", []):
            if "value" in env:
                value = env["value"]
                for path, here in (mounts or {}).items():  # a path in one of the pod's volumes: where it is here
                    if value == path or value.startswith(path + "/"):
                        value = here + value[len(path) :]
                out[env["name"]] = value
            elif "secretKeyRef" in env.get("valueFrom", {}):
                ref = env["valueFrom"]["secretKeyRef"]
                secret = self.objects[("secrets", namespace, ref["name"])]
                out[env["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
        return out

    def _generate_token_secret(self, namespace: str, obj: dict) -> None:
        """KubeRay's reconcileAuthSecret for a RayCluster in token mode that names no Secret (all KubeRay 1.5 can
        do): unless it exists, a Secret named after the RayCluster (``_check_name``), labelled ``ray.io/cluster``,
        owned by the RayCluster (so deleting it deletes the Secret:
        https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents), with a random token
        under ``auth_token`` (raycluster_controller.go createAuthSecret at tag ray-operator/v1.5.1: 32 random bytes,
        base64)."""
        auth = obj["spec"].get("authOptions", {})
        if auth.get("mode") != "token" or auth.get("secretName"):
            return
        name = obj["metadata"]["name"]
        key = ("secrets", namespace, _check_name(name))
        if key in self.objects:
            return
        token = base64.b64encode(secrets.token_bytes(32)).decode()
        owner = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": obj["metadata"]["uid"]}
        self.objects[key] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": key[2],
                "namespace": namespace,
                "labels": {"ray.io/cluster": name},
                "ownerReferences": [{**owner, "controller": True}],
            },
            "data": {"auth_token": base64.b64encode(token.encode()).decode()},
        }

    def _ray_token(self, namespace: str, obj: dict) -> str:
        auth = obj["spec"].get("authOptions", {})
        if auth.get("mode") != "token":
            return ""
        secret_name = auth.get("secretName") or _check_name(obj["metadata"]["name"])
        key = ("secrets", namespace, secret_name)
        if key not in self.objects:  # KubeRay generates the Secret when the spec names none
            self.objects[key] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": namespace},
                "data": {"auth_token": base64.b64encode(secrets.token_hex(16).encode()).decode()},
            }
        return base64.b64decode(self.objects[key]["data"]["auth_token"]).decode()

    def _start_ray(self, namespace: str, obj: dict, pods: list[dict]) -> None:
        from components.platforms.local import cluster, processes
        from components.platforms.local.ports import allocate_ports
        from components.tpu import catalogue

        name = obj["metadata"]["name"]
        run_id = obj["metadata"].get("labels", {}).get("tpupipe-run", name)
        stopping = self._stopping.get((namespace, name))
        if stopping is not None:  # suspended (evicted), then admitted again: its old processes end first
            stopping.join()
        with self.lock:
            token = "" if self.ray_auth_off else self._ray_token(namespace, obj)
            head_group = obj["spec"]["headGroupSpec"]
            envs = {
                pod["metadata"]["name"]: self._container_env(
                    namespace, pod["spec"]["containers"][0], self._volumes(namespace, pod)
                )
                for pod in pods
            }
        workers = pods[1:]
        ports = allocate_ports(len(workers))
        temp_dir = Path(tempfile.gettempdir()) / f"tk-{secrets.token_hex(4)}"
        record = {
            "processes": [],
            "temp_dir": temp_dir,
            "dashboard": ports[0]["dashboard-port"],
            "token": token,
            "run_id": run_id,
        }
        with self.lock:
            self.clusters[(namespace, name)] = record
        env = self.ray_env
        gcs = f"127.0.0.1:{ports[0]['port']}"
        base_env = {
            **os.environ,
            # KubeRay sets RAY_ADDRESS in the head and every worker pod to the head's GCS address (KubeRay's docs,
            # "Network-related environment variables"; https://github.com/ray-project/kuberay/pull/388), so nothing
            # in a pod looks for "the" Ray cluster of the machine.
            "RAY_ADDRESS": gcs,
            processes.RUN_MARKER: run_id,
            "PATH": f"{env.bin}{os.pathsep}{os.environ['PATH']}",
            "VIRTUAL_ENV": env.path,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONUNBUFFERED": "1",
            # The emulated nodes have no chips: as on the local platform's hosts (components/platforms/local/
            # cluster.py), torch does not autoload the torch image's torch_tpu into every process that imports it
            # (seconds each); trainers.devices.detect_backend imports torch_tpu itself where chips exist.
            "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
            # A pod's disk is its own; the emulated pods share this machine's, which other work may have filled past
            # Ray's 95% rule: turned off as on the local hosts (components/platforms/local/cluster.py).
            "RAY_local_fs_capacity_threshold": "1",
        }
        base_env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
        ray = str(env.bin / "ray")
        common = [
            "--block",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            f"--object-store-memory={cluster.OBJECT_STORE_BYTES}",
        ]
        logs = self.work_dir / "ray" / name
        head_cpus = head_group.get("rayStartParams", {}).get(
            "num-cpus", head_group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
        )
        head = ports[0]
        cmd = [
            ray,
            "start",
            "--head",
            *common,
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={head_cpus}",
            f"--temp-dir={temp_dir / 'head'}",
            *[f"--{k}={v}" for k, v in head.items()],
        ]
        launches = [(cmd, base_env | envs[pods[0]["metadata"]["name"]], logs / f"{pods[0]['metadata']['name']}.out")]
        for index, (pod, node_ports) in enumerate(zip(workers, ports[1:], strict=True)):
            container = pod["spec"]["containers"][0]
            limits = container["resources"]["limits"]
            resources = {"TPU": int(limits[TPU_RESOURCE])} if TPU_RESOURCE in limits else {}
            group = next(
                g
                for g in obj["spec"]["workerGroupSpecs"]
                if pod["metadata"]["labels"]["ray.io/group"] == g["groupName"]
            )
            resources |= {k: float(v) for k, v in group.get("resources", {}).items()}
            accelerator = pod["spec"].get("nodeSelector", {}).get("cloud.google.com/gke-tpu-accelerator")
            if resources.get("TPU") and accelerator:  # what Ray detects on a real TPU host
                resources[f"accelerator_type:{catalogue.family(accelerator).ray_accelerator_type}"] = 1
            host_labels = {"tpupipe/host": pod["metadata"]["name"]}
            webhook_env = self._tpu_webhook_env(pod, group) if resources.get("TPU") else {}
            cmd = [
                ray,
                "start",
                f"--address={gcs}",
                *common,
                f"--num-cpus={limits['cpu']}",
                f"--resources={json.dumps(resources)}",
                f"--labels={json.dumps(host_labels)}",
                f"--temp-dir={temp_dir / f'w{index}'}",
                *[f"--{k}={v}" for k, v in node_ports.items()],
            ]
            launches.append(
                (cmd, base_env | envs[pod["metadata"]["name"]] | webhook_env, logs / f"{pod['metadata']['name']}.out")
            )
        record["launches"], record["head_port"] = launches, head["port"]
        self._launch(record)
        self._watch_ready(namespace, name, len(workers) + 1, deadline=time.monotonic() + 240)

    def _launch(self, record: dict) -> None:
        """Start the pods' Ray: the head (until its GCS port opens), then the workers."""
        from components.platforms.local import processes

        (head, *workers) = record["launches"]
        record["processes"] = [processes.spawn(*head)]
        deadline = time.monotonic() + 120
        while not self._port_open(record["head_port"]) and time.monotonic() < deadline:
            time.sleep(0.5)
        record["processes"] += [processes.spawn(*worker) for worker in workers]

    def _recreate_ended_pods(self, record: dict) -> bool:
        """Whether a Ray pod's container had ended before the cluster was ready (``ray start`` gives up when the GCS
        answers too slowly on a loaded machine), and so was started again: KubeRay deletes a Ray pod whose container
        has terminated and creates it again (``shouldDeletePod``, https://github.com/ray-project/kuberay/pull/1386).
        The head's: the workers, which cannot join without it, start again with it; a worker's: that pod alone."""
        from components.platforms import procs
        from components.platforms.local import processes

        pids = record["processes"]
        head_ended = not procs.alive(pids[0])
        ended = range(len(pids)) if head_ended else [i for i, pid in enumerate(pids) if i and not procs.alive(pid)]
        if not ended:
            return False
        for index in ended:
            procs.signal_group(pids[index], signal.SIGKILL)
            if not head_ended:
                pids[index] = processes.spawn(*record["launches"][index])
        if head_ended:
            self._launch(record)
        record["restarts"] = record.get("restarts", 0) + 1
        return True

    @staticmethod
    def _tpu_webhook_env(pod: dict, group: dict) -> dict[str, str]:
        """What the KubeRay TPU webhook injects into a TPU worker pod (Ray reads it to label the host with its
        slice, worker id, topology and pod type). The chips are emulated: the raylet computes on CPU."""
        selector = pod["spec"].get("nodeSelector", {})
        topology = selector.get("cloud.google.com/gke-tpu-topology", "")
        version = selector.get("cloud.google.com/gke-tpu-accelerator", "").removeprefix("tpu-").split("-")[0]
        chips = 1
        for dim in topology.split("x"):
            chips *= int(dim)
        _, _, replica, host = pod["metadata"]["name"].rsplit("-", 3)
        slice_name = f"{pod['metadata']['labels']['ray.io/cluster']}-{group['groupName']}-{replica}"
        injected = {
            "TPU_ACCELERATOR_TYPE": f"{version}-{chips}",
            "TPU_TOPOLOGY": topology,
            "TPU_WORKER_ID": host,
            "TPU_NAME": slice_name,
            "TPU_WORKER_HOSTNAMES": ",".join(["127.0.0.1"] * group.get("numOfHosts", 1)),
        }
        # The multislice rule: a container whose spec names MEGASCALE_NUM_SLICES also gets its replica as
        # MEGASCALE_SLICE_ID, worker 0 of replica 0 as MEGASCALE_COORDINATOR_ADDRESS and port 8081, each unless set;
        # without it, no MEGASCALE_* at all (``mutatePod``, https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/
        # main/main.go, ``megascalePortBase``).
        spec_env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}
        if "MEGASCALE_NUM_SLICES" in spec_env:
            multislice = {"MEGASCALE_SLICE_ID": replica, "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1"}
            injected |= {k: v for k, v in (multislice | {"MEGASCALE_PORT": "8081"}).items() if not spec_env.get(k)}
        return injected

    @staticmethod
    def _port_open(port: int) -> bool:
        import socket

        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    def _alive_nodes(self, record: dict) -> int:
        import requests

        headers = {"Authorization": f"Bearer {record['token']}"} if record["token"] else {}
        try:
            r = requests.get(f"http://127.0.0.1:{record['dashboard']}/nodes?view=summary", headers=headers, timeout=5)
            nodes = r.json()["data"]["summary"]
        except Exception:  # noqa: BLE001 - a dashboard not answering has no live nodes
            return 0
        return sum(1 for n in nodes if n.get("raylet", {}).get("state") == "ALIVE")

    def _watch_ready(self, namespace: str, name: str, want: int, deadline: float) -> None:

        while time.monotonic() < deadline:
            with self.lock:
                record = self.clusters.get((namespace, name))
            if record is None:
                return
            if self._alive_nodes(record) >= want:
                break
            if record.get("restarts", 0) < POD_RESTARTS and self._recreate_ended_pods(record):
                deadline = time.monotonic() + 240
            time.sleep(1.0)
        else:
            return
        time.sleep(self.ready_delay_s)
        self._mark_ready(namespace, name, want)

    def _mark_ready(self, namespace: str, name: str, want: int) -> None:
        """KubeRay's report of a RayCluster whose ``want`` pods (the head and the workers) all run and are ready."""
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, name))
            if obj is None:
                return
            for (plural, ns, _), pod in self.objects.items():
                if plural == "pods" and ns == namespace and pod["metadata"]["labels"].get("ray.io/cluster") == name:
                    pod["status"] = {
                        "phase": "Running",
                        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                        "containerStatuses": [_running(c) for c in pod["spec"]["containers"]],
                    }
            status = obj["status"]
            status.update(
                {
                    "state": "ready",
                    "readyWorkerReplicas": want - 1,
                    "availableWorkerReplicas": want - 1,
                    "head": {"serviceName": f"{name}-head-svc", "podName": f"{name}-head"},
                    "conditions": [
                        {
                            "type": "HeadPodReady",
                            "status": "True",
                            "reason": "HeadPodRunningAndReady",
                            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        },
                        {
                            "type": "RayClusterProvisioned",
                            "status": "True",
                            "reason": "AllPodRunningAndReadyFirstTime",
                            "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        },
                    ],
                }
            )

    def delete_run(self, run_id: str) -> None:
        """What a deleted cluster takes with it, where this one API server stands for each of the project's clusters:
        the objects labelled with the cluster's run, their Ray clusters' pods and processes."""
        from components.spec import names

        with self.lock:
            labelled = [k for k, o in self.objects.items() if _labels(o).get(names.RUN_LABEL) == run_id]
            for key in labelled:  # a Ray cluster's pods may have gone with it already
                if self.objects.pop(key, None) is not None and key[0] == "rayclusters":
                    self._delete_raycluster(key[1], key[2])

    def _delete_raycluster(self, namespace: str, name: str) -> None:
        """A RayCluster deleted: its pods and services, and what garbage collection deletes with it (what it owns: the
        token Secret KubeRay 1.5 makes, Kueue's Workload)."""
        owned = [{"kind": "RayCluster", "name": name}]
        for key in [
            k
            for k, o in self.objects.items()
            if k[1] == namespace
            and [{"kind": r["kind"], "name": r["name"]} for r in o["metadata"].get("ownerReferences", [])] == owned
        ]:
            self.objects.pop(key)
        self.stop_pods(namespace, name)

    def stop_pods(self, namespace: str, name: str) -> None:
        """The RayCluster's pods and services gone (deleted, or suspended: KubeRay makes no pods for a suspended
        RayCluster), its local Ray processes stopped."""
        for key in [
            k
            for k, o in self.objects.items()
            if k[0] in ("pods", "services")
            and k[1] == namespace
            and o["metadata"].get("labels", {}).get("ray.io/cluster") == name
        ]:
            self.objects.pop(key)
        with self.lock:  # at once: a RayCluster admitted again (Kueue) starts a Ray of its own, not stopped by this
            record = self.clusters.pop((namespace, name), None)
        stopping = threading.Thread(target=self._stop_record, args=(record,), daemon=True)
        self._stopping[(namespace, name)] = stopping
        stopping.start()

    def _stop_ray(self, key: tuple[str, str]) -> None:
        with self.lock:
            record = self.clusters.pop(key, None)
        self._stop_record(record)

    def _stop_record(self, record: dict | None) -> None:
        import shutil
        import signal

        from components.platforms import procs
        from components.platforms.local import processes

        if not record:
            return
        for pid in reversed(record["processes"]):
            procs.signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + processes.GRACE_S
        while time.monotonic() < deadline and processes.run_processes(record["run_id"]):
            time.sleep(0.2)
        for pid in record["processes"]:
            procs.signal_group(pid, signal.SIGKILL)
        for pid in processes.run_processes(record["run_id"]):
            procs.signal_process(pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and processes.run_processes(record["run_id"]):
            time.sleep(0.2)
        shutil.rmtree(record["temp_dir"], ignore_errors=True)

    def job_status(self, submission_id: str) -> str:
        """A Ray job's status (``RUNNING``, say) as the Jobs API of the local Ray cluster running it reports it; ''
        while no cluster knows the job."""
        import requests

        with self.lock:
            records = list(self.clusters.values())
        for record in records:
            headers = {"Authorization": f"Bearer {record['token']}"} if record["token"] else {}
            url = f"http://127.0.0.1:{record['dashboard']}/api/jobs/{submission_id}"
            try:
                r = requests.get(url, headers=headers, timeout=5)
            except requests.RequestException:
                continue
            if r.ok:
                return r.json().get("status", "")
        return ""

    # ------------------------------------------------------------------ another workload of the cluster
    def create(self, plural: str, namespace: str, body: dict) -> dict:
        """What a POST of ``body`` does (another team's workload, say): validated, created, handed to the operators
        (KubeRay, Kueue); the object, or an AssertionError with the API server's refusal."""
        code, obj = self._object("POST", plural, namespace, "", {}, json.dumps(body).encode(), "application/json")
        assert code == 201, obj
        return obj

    def delete(self, plural: str, namespace: str, name: str) -> None:
        """What a DELETE does: the object gone, and what its deletion takes with it."""
        code, obj = self._object("DELETE", plural, namespace, name, {}, b"", "application/json")
        assert code == 200, obj

    # ------------------------------------------------------------------ a host lost mid-run
    def lose_pod(self, namespace: str, name: str, grace_s: float = 0.5) -> None:
        """A host lost while the run runs (its node preempted or shut down): the pod is terminated with the
        kubelet's words for a node shutdown (status.reason Terminated, "Pod was terminated in response to imminent
        node shutdown.": https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/) and is being
        deleted for ``grace_s``, then it is gone and KubeRay makes another in its place (same name, a new uid), as
        it keeps a worker group's replicas."""
        with self.lock:
            pod = self.objects[("pods", namespace, name)]
            pod["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            pod["status"].update(
                phase="Failed",
                reason="Terminated",
                message="Pod was terminated in response to imminent node shutdown.",
            )
            for cs in pod["status"].get("containerStatuses") or []:
                cs["state"] = {"terminated": {"exitCode": 137, "reason": "Error"}}

        def replaced() -> None:
            with self.lock:
                old = self.objects.pop(("pods", namespace, name), None)
                if old is None:
                    return
                fresh = copy.deepcopy(old)
                fresh["metadata"] = {k: v for k, v in old["metadata"].items() if k != "deletionTimestamp"}
                fresh["metadata"]["uid"] = secrets.token_hex(8)
                fresh["status"] = {
                    "phase": "Running",
                    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
                    "containerStatuses": [_running(c) for c in fresh["spec"]["containers"]],
                }
                self.objects[("pods", namespace, name)] = fresh

        timer = threading.Timer(grace_s, replaced)
        timer.daemon = True
        timer.start()

    # ------------------------------------------------------------------ a pod's log
    def _pod_log(self, namespace: str, name: str, query: dict) -> tuple[int, object]:
        """``GET /api/v1/namespaces/{ns}/pods/{name}/log``: the container's output, as the kubelet keeps it; its
        parameters ``container`` (needed when the pod has several), ``previous``, ``tailLines`` and ``limitBytes``
        (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#read-log-of-the-specified-pod).
        An emulated Ray pod's container is its ``ray start --block`` process, whose output is the pod's log. A
        container name missing or wrong is a 400 with the API server's message (kubernetes/kubernetes,
        pkg/registry/core/pod/strategy.go, ``LogLocation``); a container not yet started, or a ``previous`` one that
        never ended, a 400 with the kubelet's (pkg/kubelet/kubelet_pods.go, ``validateContainerLogStatus``)."""
        with self.lock:
            pod = self.objects.get(("pods", namespace, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = query.get("container") or (containers[0] if len(containers) == 1 else "")
        if container not in containers:
            message = f"a container name must be specified for pod {name}, choose one of: {containers}"
            if query.get("container"):
                message = f"container {container} is not valid for pod {name}"
            return 400, _status(400, "BadRequest", message)
        status = next((c for c in pod["status"].get("containerStatuses") or [] if c["name"] == container), {})
        state = status.get("state") or {}
        if query.get("previous") == "true":
            if not status.get("restartCount"):
                return 400, _status(
                    400, "BadRequest", f'previous terminated container "{container}" in pod "{name}" not found'
                )
            return 200, b""  # the emulated pods restart in place: the output before is in the one file
        if not (state.get("running") or state.get("terminated")):
            reason = (state.get("waiting") or {}).get("reason", "ContainerCreating")
            return 400, _status(
                400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        out = self.work_dir / "ray" / pod["metadata"]["labels"]["ray.io/cluster"] / f"{name}.out"
        data = out.read_bytes() if out.exists() else b""
        if query.get("tailLines"):
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
        if query.get("limitBytes"):
            data = data[: int(query["limitBytes"])]
        return 200, data

    # ------------------------------------------------------------------ the service proxy
    def _proxy(self, h, method: str, namespace: str, service: str, path: str, query: str, body: bytes) -> None:
        import requests

        cluster = service.removesuffix("-head-svc")
        with self.lock:
            record = self.clusters.get((namespace, cluster))
            known = ("services", namespace, service) in self.objects
        if not known or record is None:
            return self._send(
                h, 503, _status(503, "ServiceUnavailable", f'no endpoints available for service "{service}"')
            )
        if h.headers.get("Upgrade"):  # a WebSocket (the Jobs API's log tailing): this proxy passes plain requests only
            return self._send(h, 400, _status(400, "BadRequest", "the emulated service proxy passes no upgrades"))
        headers = {
            k: v
            for k, v in h.headers.items()
            if k.lower() not in ("authorization", "host", "content-length", "connection")
        }
        url = f"http://127.0.0.1:{record['dashboard']}{path}" + (f"?{query}" if query else "")
        mounts = self._fuse_mounts(namespace, cluster)
        try:
            r = requests.request(method, url, data=_into_pods(body, mounts) or None, headers=headers, timeout=60)
        except requests.RequestException as exc:
            return self._send(h, 503, _status(503, "ServiceUnavailable", f"error trying to reach service: {exc}"))
        content = _from_pods(r.content, mounts)
        self._send(h, r.status_code, content, r.headers.get("Content-Type", "application/json"))

    def _fuse_mounts(self, namespace: str, cluster: str) -> dict[str, Path]:
        """Where the RayCluster's head pod mounts Cloud Storage FUSE volumes (CSI ephemeral volumes of the
        ``gcsfuse.csi.storage.gke.io`` driver, https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-
        volumes/cloud-storage-fuse-csi-driver), each mount path (no trailing ``/``) -> the directory here that plays
        it: the bucket's directory (``bucket_dir(volumeAttributes.bucketName)``), or, with the ``only-dir=D`` mount
        option (``volumeAttributes.mountOptions``, comma-separated), its ``D``: "mount only a specific directory
        within a bucket" (https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options, --only-dir). Empty
        when it mounts none, or no ``bucket_dir`` plays them."""
        if self.bucket_dir is None:
            return {}
        with self.lock:
            obj = self.objects.get(("rayclusters", namespace, cluster)) or {}
        pod = obj.get("spec", {}).get("headGroupSpec", {}).get("template", {}).get("spec", {})
        volumes = {
            v["name"]: v["csi"].get("volumeAttributes", {})
            for v in pod.get("volumes", [])
            if v.get("csi", {}).get("driver") == GCSFUSE_DRIVER
        }
        mounts = {}
        for mount in (m for c in pod.get("containers", []) for m in c.get("volumeMounts", [])):
            attributes = volumes.get(mount["name"])
            if attributes is None:
                continue
            options = dict(o.strip().partition("=")[::2] for o in attributes.get("mountOptions", "").split(","))
            only = [part for part in options.get("only-dir", "").split("/") if part]
            here = self.bucket_dir(attributes["bucketName"]).joinpath(*only)
            here.mkdir(parents=True, exist_ok=True)  # a mount point is there, objects under it or not
            mounts[mount["mountPath"].rstrip("/")] = here
        return mounts


def _labels(obj: dict) -> dict:
    return obj.get("metadata", {}).get("labels", {})
