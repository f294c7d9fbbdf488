"""The Kubernetes API server of the emulator, over HTTPS on 127.0.0.1, enough for the gke platform's kubernetes client;
the controllers and nodes behind it are its parts (``kuberay``, ``kubelet``, ``ray``; ``provisioning``'s queued
provisioning; ``kueue`` when installed):

- namespaces, secrets, service accounts, pods, services and events (core v1), and the namespaced objects of any API
  group by the same generic paths (ResourceClaimTemplates of resource.k8s.io/v1, NetworkPolicies of
  networking.k8s.io/v1, RayClusters of ray.io/v1): create (409 when it exists), get, list by ``labelSelector``,
  delete (404 when missing), server-side apply (``application/apply-patch+yaml``); a pod's log (``pods/log``, the
  kubelet's); SelfSubjectAccessReviews (``ACCESS_REVIEW_PATH``);
- RayCluster objects are validated against the KubeRay CRD schema (422 with the reasons), as the API
  server does with strict field validation;
- ProvisioningRequests and PodTemplates (``provisioning``), handed to the cluster autoscaler's queued provisioning;
- the RayCluster CRD is served (``apiextensions.k8s.io/v1``) as the KubeRay release ``kuberay_version`` installs it:
  the vendored v1.7.0 CRD, less the fields added after an older release (``FIELDS_SINCE``), which the API
  server then drops from RayClusters without a word, as a real one prunes fields its CRD lacks;
- every request needs ``Authorization: Bearer <token>``: the static ``token``, or one the emulated token issuer
  (``tests/emulators/tokens.py``) minted that has not expired; 401 otherwise, as the API server answers a request it
  cannot authenticate (https://kubernetes.io/docs/reference/access-authn-authz/authentication/);
- ``/api/v1/namespaces/{ns}/services/{svc}:{port}/proxy/...`` is forwarded to that cluster's dashboard (``ray``), with
  the ``Authorization`` header removed as the API server does after authenticating the caller, and the paths under
  the pods' Cloud Storage FUSE mounts mapped both ways (``kubelet.into_pods``, ``kubelet.from_pods``); plain requests
  only (a WebSocket upgrade is refused with 400, so the stages' fallback of reading a job's whole log is what runs
  here);
- core/v1 Events are listed with a ``fieldSelector`` (``involvedObject.kind=Pod,involvedObject.name=...``, the
  event fields the API server selects on).

``kueue``: Kueue installed (``tests/emulators/kueue.py``: its objects, validated against its CRDs, and its controller's
part for RayClusters labelled with a queue); None (the default): no Kueue, its CRDs and objects not served.

``denied``: the (verb, group, resource, subresource) a SelfSubjectAccessReview answers not allowed (the caller's
IAM and RBAC lack it); every other is allowed.

``unavailable(times, when)``: a burst of 503s — the next ``times`` requests that ``when(method, path)`` selects are
answered ``503 ServiceUnavailable`` with ``Retry-After``, as while GKE upgrades a zonal cluster's single control
plane (https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-upgrades); the Kubernetes API conventions
tell the client to retry a 503 with exponential backoff
(https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#error-codes).
It is an injected fault of the shape every HTTP emulator takes (``tests.emulators.http.Fault``, ``take_fault``).
"""

from __future__ import annotations

import copy
import datetime
import functools
import ipaddress
import json
import re
import ssl
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.emulators import kube_schema, kueue, provisioning, take_fault
from tests.emulators.http import Fault
from tests.emulators.kube.kubelet import Kubelet, from_pods, into_pods
from tests.emulators.kube.kuberay import KubeRay
from tests.emulators.kube.objects import Objects, labels, now, status
from tests.emulators.kube.ray import Ray
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
# SelfSubjectAccessReview (authorization.k8s.io/v1): "can I", answered for the caller; 201 with ``status.allowed``
# (https://kubernetes.io/docs/reference/kubernetes-api/authorization-resources/self-subject-access-review-v1/).
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
CRD_PATH = re.compile(r"^/apis/apiextensions\.k8s\.io/v1/customresourcedefinitions/([^/]+)$")
CRD_KINDS = {"rayclusters": "RayCluster"}
# The API server's faults are not per API method: each may hit any request, its ``when`` picking which.
EVERY_REQUEST = "request"


def make_certificates(directory: Path) -> tuple[bytes, Path, Path]:
    """A CA and a server certificate signed by it for 127.0.0.1 (the cluster's IP endpoint) and ``localhost`` (its
    DNS-based endpoint, which clients reach by name and check the name of): (CA PEM, cert file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    issued = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpupipe emulator CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(issued - datetime.timedelta(minutes=5))
        .not_valid_after(issued + datetime.timedelta(days=1))
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
        .not_valid_before(issued - datetime.timedelta(minutes=5))
        .not_valid_after(issued + datetime.timedelta(days=1))
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


def _older(version: str, than: str) -> bool:
    return tuple(int(x) for x in version.split(".")) < tuple(int(x) for x in than.split("."))


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


class ApiServer:
    """The API server over ``objects`` (guarded by ``lock``, which its parts share): it stores and serves them, and
    tells its parts what changed: ``kuberay`` of RayClusters made and deleted, ``provisioner`` of
    ProvisioningRequests, ``kueue`` (when installed) of its objects; ``kubelet`` answers a pod's log and maps the
    pods' mounts at the service proxy, which forwards to ``ray``'s dashboards. ``start()`` serves on 127.0.0.1;
    ``stop()`` also stops every local Ray cluster."""

    def __init__(
        self,
        work_dir: Path,
        token: str,
        crd_validator,
        objects: Objects,
        lock,
        provisioner: provisioning.Provisioner,
        kubelet: Kubelet,
        kuberay: KubeRay,
        ray: Ray,
    ):
        self.work_dir = Path(work_dir)
        self.token = token
        self.crds = crd_validator
        self.objects = objects  # (plural, namespace, name) -> object
        self.lock = lock
        self.provisioner = provisioner  # ProvisioningRequests (queued)
        self.kubelet, self.kuberay, self.ray = kubelet, kuberay, ray
        self.kuberay_version = "1.7.0"  # the KubeRay release whose CRD is served (an older one lacks newer fields)
        self.kueue: kueue.Kueue | None = None  # Kueue installed (tests/emulators/kueue.py): its objects and controller
        self.denied: set[tuple[str, str, str, str]] = set()  # (verb, group, resource, subresource) the caller may not
        self.reviews: list[tuple[str, str, str, str]] = []  # the SelfSubjectAccessReviews asked, in order
        self.faults: list[Fault] = []  # unavailable(): the 503 bursts injected
        self.faulted: list[tuple[str, str]] = []  # (method, path) of every request a fault answered
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers) of every request
        self.statuses: list[tuple[str, str, int]] = []  # (method, path, status) of every answer
        self.bodies: list[tuple[str, str, str]] = []  # (method, path, body text) of every request
        self.ca_pem, self._cert, self._key = make_certificates(self.work_dir / "pki")
        self._server = None
        self.endpoint = ""  # 127.0.0.1:PORT, the cluster's IP endpoint
        self.dns_endpoint = ""  # localhost:PORT, the same server by name: the cluster's DNS-based endpoint

    # ------------------------------------------------------------------ serving
    def start(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                server._handle(self, "GET")

            def do_POST(self):
                server._handle(self, "POST")

            def do_PATCH(self):
                server._handle(self, "PATCH")

            def do_PUT(self):
                server._handle(self, "PUT")

            def do_DELETE(self):
                server._handle(self, "DELETE")

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
        self.ray.stop_all()
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
        fault = Fault(
            EVERY_REQUEST,
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            times,
            lambda request: when(request["method"], request["path"]),
        )
        with self.lock:
            self.faults.append(fault)

    @property
    def burst(self) -> dict:
        """The 503 bursts: how many requests they have yet to answer (``times``), how many they answered."""
        with self.lock:
            return {"times": sum(f.times for f in self.faults), "answered": len(self.faulted)}

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
            fault = take_fault(self.faults, self.lock, EVERY_REQUEST, {"method": method, "path": url.path})
            if fault is not None:
                self.faulted.append((method, url.path))
        if fault is not None:
            return self._send(h, fault.status, status(fault.status, fault.reason, fault.message))
        if not authorized(self.token, h.headers.get("Authorization")):
            return self._send(h, 401, status(401, "Unauthorized", "Unauthorized"))
        if url.path == ACCESS_REVIEW_PATH and method == "POST":
            return self._send(h, 201, self._access_review(json.loads(body or b"{}")))
        crd = CRD_PATH.match(url.path)
        if crd and method == "GET":
            found = self.served_crd(crd.group(1))
            if found is None:
                return self._send(
                    h,
                    404,
                    status(
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
            code, out = self.kubelet.pod_log(pod_log.group(1), pod_log.group(2), query)
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
            return self._send(h, 404, status(404, "NotFound", f"the server could not find {url.path}"))
        try:
            code, out = self._object(method, plural, namespace, name, query, body, h.headers.get("Content-Type", ""))
        except Exception as exc:  # noqa: BLE001 - an emulator bug shows as a 500 with its message
            code, out = 500, status(500, "InternalError", repr(exc))
        self._send(h, code, out)

    # ------------------------------------------------------------------ objects
    def _object(self, method, plural, namespace, name, query, body, content_type):
        key = (plural, namespace, name)
        with self.lock:
            if method == "GET" and not name:
                fields = query.get("fieldSelector", "")
                unknown = _unselectable(plural, fields)
                if unknown:
                    return 400, status(
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
                    return 404, status(404, "NotFound", f'{plural} "{name}" not found')
                return 200, self.objects[key]
            if method == "DELETE":
                if key not in self.objects:
                    return 404, status(404, "NotFound", f'{plural} "{name}" not found')
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
                    return 409, status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            elif method == "PATCH" and content_type != "application/apply-patch+yaml":
                return 415, status(415, "UnsupportedMediaType", f"only server-side apply here, not {content_type}")
            if plural == "rayclusters":
                self._prune(obj)
            errors = self._validate(plural, namespace, obj)
            if errors:
                kind = CRD_KINDS.get(plural) or obj.get("kind") or plural
                return 422, status(422, "Invalid", f'{kind} "{name}" is invalid: ' + "; ".join(errors))
            existed = key in self.objects
            meta = obj.setdefault("metadata", {})
            if namespace:
                meta["namespace"] = namespace
            # the API server sets both, never the client ("Populated by the system. Read-only", uid and
            # creationTimestamp: https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/);
            # an apply to an existing object keeps them
            kept = self.objects[key]["metadata"] if existed else {}
            meta["uid"] = kept.get("uid") or str(uuid.uuid4())
            meta["creationTimestamp"] = kept.get("creationTimestamp") or now()
            if existed and "status" in self.objects[key]:
                obj["status"] = self.objects[key]["status"]
            self.objects[key] = obj
            if plural == "rayclusters" and not existed:
                held = self.kueue is not None and self.kueue.raycluster_created(namespace, obj)
                if not held:
                    self.kuberay.created(namespace, obj)
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

    def delete_run(self, run_id: str) -> None:
        """What a deleted cluster takes with it, where this one API server stands for each of the project's clusters:
        the objects labelled with the cluster's run, their Ray clusters' pods and processes."""
        from components.spec import names

        with self.lock:
            labelled = [k for k, o in self.objects.items() if labels(o).get(names.RUN_LABEL) == run_id]
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
        self.kuberay.stop_pods(namespace, name)

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

    # ------------------------------------------------------------------ the service proxy
    def _proxy(self, h, method: str, namespace: str, service: str, path: str, query: str, body: bytes) -> None:
        import requests

        cluster = service.removesuffix("-head-svc")
        with self.lock:
            dashboard = self.ray.dashboard((namespace, cluster))
            known = ("services", namespace, service) in self.objects
        if not known or dashboard is None:
            return self._send(
                h, 503, status(503, "ServiceUnavailable", f'no endpoints available for service "{service}"')
            )
        if h.headers.get("Upgrade"):  # a WebSocket (the Jobs API's log tailing): this proxy passes plain requests only
            return self._send(h, 400, status(400, "BadRequest", "the emulated service proxy passes no upgrades"))
        headers = {
            k: v
            for k, v in h.headers.items()
            if k.lower() not in ("authorization", "host", "content-length", "connection")
        }
        url = f"http://127.0.0.1:{dashboard}{path}" + (f"?{query}" if query else "")
        mounts = self.kubelet.fuse_mounts(namespace, cluster)
        try:
            r = requests.request(method, url, data=into_pods(body, mounts) or None, headers=headers, timeout=60)
        except requests.RequestException as exc:
            return self._send(h, 503, status(503, "ServiceUnavailable", f"error trying to reach service: {exc}"))
        content = from_pods(r.content, mounts)
        self._send(h, r.status_code, content, r.headers.get("Content-Type", "application/json"))
