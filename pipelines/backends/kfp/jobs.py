"""Runs on Kubeflow Pipelines (open source, ``--kfp-host``), through the official ``kfp.Client`` alone: what
``tpupipe submit``, ``tpupipe schedule``, ``tpupipe runs`` and ``tpupipe publish`` do there.

The pipeline is the one Vertex AI runs: one compile (``vertex.published_template``: every task's image pinned to its
digest in Artifact Registry), uploaded as a version of the pipeline ``tpupipe`` named after the source version and
the compiled file's digest, so a run names exactly what it ran. Runs and recurring runs are created in the
experiment ``tpupipe`` of the namespace. A submitted run is given its run id (the ``run_id`` parameter: from its
display name, as a Vertex AI job's derives from its job id), so ``runs cancel`` and the janitor find its resources.
A recurring run passes no run id: KFP substitutes no ``[[RunUUID]]``-style macro into a v2 pipeline's parameters
(``schedule_create``), so each of its runs' tasks derives the run id from what KFP's v2 driver does resolve, the run's
Argo Workflow name (``components.spec.names.run_id_from``), which is also that run's display name (``cancel``).

Authentication is what ``kfp.Client`` supports: none (a port-forward, or a server without auth), the pod's
projected service account token (``kfp.client.ServiceAccountTokenVolumeCredentials``, in-cluster), a Kubernetes
token from a file (``--kfp-auth token --kfp-token-file``: a multi-user server from outside the cluster), a Google
ID token for an endpoint behind Identity-Aware Proxy (its OAuth client id as the audience, sent as the bearer token:
https://cloud.google.com/iap/docs/authentication-howto), or a user's e-mail in the user id header (``--kfp-auth
userid --kfp-user``: ``USERID_HEADER``, set on the client's one ``ApiClient``, so every API sends it). The header is
no credential: the server takes the user it names at its word (``singlePrefixedHeaderFromMetadata`` in
backend/src/apiserver/auth/util.go at 2.15.0 and 2.17.0 checks its count and prefix, nothing else), and only
Kubeflow's Istio policy keeps others from sending it (manifests/kustomize/base/installs/multi-user/
istio-authorization-config.yaml at 2.17.0; where such a policy is missing, anyone is anyone:
https://github.com/kubeflow/kubeflow/pull/7032). So ``userid`` goes only to a loopback host, a ``kubectl
port-forward`` to the API server (whoever may port-forward there is trusted already), unless
``--kfp-trust-user-header`` says the network path to another host is trusted (``check_place``); ``token`` is the way
from outside the cluster. A multi-user server (its healthz says ``multi_user``)
authenticates every request on a namespace: a ``kubeflow-userid`` header, which its Istio policy accepts only from
Kubeflow's own services, or a bearer token that the Kubernetes TokenReview API authenticates for the audience
``pipelines.kubeflow.org`` (``GetAuthenticators``, backend/src/apiserver/auth/auth.go in kubeflow/pipelines at 2.15.0
and 2.17.0), then authorizes it in the namespace (``IsAuthorized``, backend/src/apiserver/resource/
resource_manager.go): with ``--kfp-auth none`` there, nothing is created (exit 2, naming ``--kfp-auth``).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from components.cloud.kfp import ENDED as TERMINAL
from components.cloud.kfp import SA_TOKEN_PATH
from components.spec import InfraError, SpecError
from pipelines import run_ids
from pipelines.backends.vertex import jobs as vertex

if TYPE_CHECKING:  # kfp ships no type information: its client and what it answers are Any to mypy
    from kfp.client import Client

PIPELINE = "tpupipe"
EXPERIMENT = "tpupipe"
JANITOR_PIPELINE = "tpupipe-janitor"
AUTHS = ("none", "sa-token", "token", "iap", "userid")
# The header a multi-user server reads the user from, and the prefix it strips from its value: the API server's
# KUBEFLOW_USERID_HEADER and KUBEFLOW_USERID_PREFIX (``GetKubeflowUserIDHeader``/``GetKubeflowUserIDPrefix`` in
# backend/src/apiserver/common/config.go, read by ``NewHTTPHeaderAuthenticator`` in backend/src/apiserver/auth/auth.go,
# kubeflow/pipelines at 2.15.0 and 2.17.0), which the multi-user install sets to ``kubeflow-userid`` and ""
# (manifests/kustomize/base/installs/multi-user/api-service/deployment-patch.yaml at 2.15.0;
# manifests/kustomize/base/installs/generic/pipeline-install-config.yaml, USERID_HEADER and USERID_PREFIX, at 2.17.0):
# the one pair ``--kfp-auth userid`` sends. A server where they are unset reads Google IAP's
# ``x-goog-authenticated-user-email`` with the prefix ``accounts.google.com:`` instead (GoogleIAPUserIdentityHeader,
# GoogleIAPUserIdentityPrefix in common/const.go), and its gateway passes no other header on (``grpcCustomMatcher``
# in backend/src/apiserver/main.go): ``--kfp-auth token`` reaches it.
USERID_HEADER = "kubeflow-userid"
# An e-mail address as Kubeflow names a profile's owner and contributors (a Profile's spec.owner name, the
# contributors' user e-mails: https://www.kubeflow.org/docs/components/central-dash/profiles/).
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
# The audience a multi-user server's TokenReview asks a bearer token to be for (DefaultTokenReviewAudience,
# backend/src/apiserver/common/const.go in kubeflow/pipelines at 2.15.0 and 2.17.0).
TOKEN_AUDIENCE = "pipelines.kubeflow.org"
# A Kubernetes namespace is a DNS-1123 label (https://kubernetes.io/docs/concepts/overview/working-with-objects/names/).
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
STATES = {"succeeded": "SUCCEEDED", "failed": "FAILED", "cancelled": "CANCELED", "running": "RUNNING"}
# The first KFP release whose v2 driver fills {{$.pipeline_job_schedule_time_utc}} (kubeflow/pipelines#13474: 2.15
# passes it verbatim, 2.16 empty; backend/src/v2/driver/resolve.go and backend/src/v2/cmd/driver/main.go at each tag).
SCHEDULE_TIME_FROM = (2, 17)


@dataclass(frozen=True)
class Place:
    """Where the runs are: the KFP API server, the namespace, and how to authenticate."""

    host: str
    namespace: str = "kubeflow"
    auth: str = "none"
    iap_client_id: str = ""
    token_path: str = SA_TOKEN_PATH
    insecure: bool = False  # --insecure: a token may go to a plain-HTTP host that is not this machine
    token_file: str = ""  # --kfp-token-file: the bearer token of --kfp-auth token
    user: str = ""  # --kfp-user: the user --kfp-auth userid names in the user id header
    trust_user_header: bool = False  # --kfp-trust-user-header: userid may go to a host that is not this machine


# The loopback names: a plain-HTTP request to one of them never leaves this machine (a `kubectl port-forward` carries
# it on to the cluster inside the API server's TLS connection).
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def check_place(place: Place) -> None:
    """Bad input, before any call: a URL, a namespace, an auth method and what it needs; a bearer token over plain
    HTTP to another machine."""
    import ipaddress

    url = urlparse(place.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SpecError("--kfp-host", f"{place.host!r} is not a URL", ["http://localhost:8888", "https://KFP_HOST"])
    try:
        loopback = url.hostname in LOOPBACK or ipaddress.ip_address(url.hostname).is_loopback
    except ValueError:  # a name, not an address
        loopback = False
    if place.auth == "userid" and not loopback and not place.trust_user_header:
        raise SpecError(
            "--kfp-auth",
            f"userid sends a user id header that {place.host} would take at its word, which is safe only where "
            "nothing but Kubeflow's own services can reach the API server with it: a kubectl port-forward to "
            "localhost, or a network path you trust (docs/kubeflow.md)",
            [
                f"--kfp-auth token --kfp-token-file FILE (a token for the audience {TOKEN_AUDIENCE}: recommended)",
                "--kfp-host http://localhost:PORT through kubectl port-forward -n kubeflow svc/ml-pipeline PORT:8888",
                "--kfp-trust-user-header",
            ],
        )
    # sa-token and iap send a bearer token with every request, which whoever reads the request may replay: "Clients
    # MUST always use TLS (https) or equivalent transport security when making requests with bearer tokens"
    # (RFC 6750, section 5.3: https://www.rfc-editor.org/rfc/rfc6750#section-5.3).
    if url.scheme == "http" and place.auth != "none" and not loopback and not place.insecure:
        sent = "the user id header, which acts as that user," if place.auth == "userid" else "its bearer token"
        raise SpecError(
            "--kfp-host",
            f"--kfp-auth {place.auth} would send {sent} in clear text to {place.host}",
            [f"https://{url.netloc}", "http://localhost:PORT through kubectl port-forward", "--insecure"],
        )
    if not NAMESPACE.match(place.namespace):
        raise SpecError("--kfp-namespace", f"{place.namespace!r} is not a Kubernetes namespace (a DNS-1123 label)")
    if place.auth not in AUTHS:
        raise SpecError("--kfp-auth", f"unknown method {place.auth!r}", list(AUTHS))
    if place.auth == "userid" and not EMAIL.match(place.user):
        raise SpecError(
            "--kfp-user",
            "--kfp-auth userid sends this user's e-mail in the kubeflow-userid header: "
            + (f"{place.user!r} is not an e-mail address" if place.user else "none is given"),
            ["--kfp-user alice@example.com"],
        )
    if place.auth != "userid" and (place.user or place.trust_user_header):
        flag = "--kfp-user" if place.user else "--kfp-trust-user-header"
        raise SpecError(flag, f"is for --kfp-auth userid, not --kfp-auth {place.auth}", ["--kfp-auth userid"])
    if place.auth == "iap" and not place.iap_client_id:
        raise SpecError("--kfp-iap-client-id", "--kfp-auth iap needs the OAuth client id of the endpoint's IAP")
    if place.auth == "token" and not (place.token_file and Path(place.token_file).is_file()):
        raise SpecError(
            "--kfp-token-file",
            "--kfp-auth token reads its bearer token from this file: "
            + (f"{place.token_file} is not a file" if place.token_file else "none is given"),
            [f"(umask 077; kubectl create token default-editor -n {place.namespace} --audience {TOKEN_AUDIENCE} > F)"],
        )
    if place.auth == "token" and Path(place.token_file).stat().st_mode & 0o077:
        # A bearer token is its holder's identity (RFC 6750, section 5.2: "Bearer tokens MUST NOT be stored in
        # cleartext" where others may read them): a file other users may read or write is refused, as ssh refuses a
        # private key others may read.
        mode = Path(place.token_file).stat().st_mode & 0o777
        raise SpecError(
            "--kfp-token-file",
            f"{place.token_file} is open to other users of this machine (mode {mode:o}), and its token acts as you",
            [f"chmod 600 {place.token_file}"],
        )
    if place.auth == "sa-token" and not Path(place.token_path).is_file():
        raise SpecError(
            "--kfp-auth",
            f"sa-token reads the pod's projected token at {place.token_path}, and there is none: run in a pod that "
            "mounts it, or choose none or iap",
        )


def client(place: Place) -> Client:
    """The ``kfp.Client`` of the place, its API server answering (an unreachable one is an InfraError, exit 1)."""
    from kfp.client import ServiceAccountTokenVolumeCredentials

    from components.cloud import kfp as kfp_runs

    check_place(place)
    # A token from a file is read again for each request (the credentials' refresh_api_key_hook, which
    # kfp_server_api's Configuration calls before every call): a projected token the kubelet rotates, or a
    # ``kubectl create token`` one (an hour by default) that the user renews while ``submit --follow`` goes on.
    path = {"sa-token": place.token_path, "token": place.token_file}.get(place.auth)
    if place.auth == "token":
        _file_token(place)  # an empty file is bad input, before any call
    credentials = ServiceAccountTokenVolumeCredentials(path=path) if path else None
    token = _iap_token(place) if place.auth == "iap" else None
    try:
        made, health = kfp_runs.connect(place.host, place.namespace, credentials, token, userid(place))
        multi_user = bool(health.multi_user)
    except Exception as exc:  # noqa: BLE001 - unreachable or refusing: one line, exit 1
        raise InfraError(f"cannot reach the Kubeflow Pipelines API at {place.host}: {_reason(exc)}") from None
    if multi_user and place.auth == "none":
        raise SpecError(
            "--kfp-auth",
            f"the Kubeflow Pipelines server at {place.host} is multi-user: it takes a request on a namespace only "
            f"with a user's identity, and --kfp-auth none sends none; nothing was created",
            [
                f"--kfp-auth token --kfp-token-file FILE (a token for the audience {TOKEN_AUDIENCE}: `(umask 077; "
                f"kubectl create token default-editor -n {place.namespace} --audience {TOKEN_AUDIENCE} > FILE)`)",
                "--kfp-auth sa-token, in a pod that mounts KFP's projected token",
                "--kfp-auth userid --kfp-user EMAIL, through a port-forward to the API server (docs/kubeflow.md)",
            ],
        )
    return made


def userid(place: Place) -> dict[str, str]:
    """The user id header of ``--kfp-auth userid`` (``USERID_HEADER``: the user's e-mail, with no prefix, as the
    multi-user install reads it); {} for the other methods."""
    return {USERID_HEADER: place.user} if place.auth == "userid" else {}


def _file_token(place: Place) -> str:
    token = Path(place.token_file).read_text().strip()
    if not token:
        raise SpecError("--kfp-token-file", f"{place.token_file} is empty")
    return token


# A Google ID token is valid for one hour (https://cloud.google.com/docs/authentication/token-types#id); one fetched
# is reused by the same process (the client and the release read) for a little less than that.
IAP_TOKEN_REUSE_S = 50 * 60
_iap_tokens: dict[str, tuple[float, str]] = {}  # audience -> (when fetched, token)


def _iap_token(place: Place) -> str:
    """A Google ID token for the endpoint's IAP (its OAuth client id as the audience), fetched once a process while
    it is fresh (``IAP_TOKEN_REUSE_S``)."""
    import time

    import google.auth.transport.requests
    from google.oauth2 import id_token

    fetched, token = _iap_tokens.get(place.iap_client_id, (0.0, ""))
    if token and time.monotonic() - fetched < IAP_TOKEN_REUSE_S:
        return token
    try:
        # google-auth's fetch_id_token is unannotated
        fetched_now: str = id_token.fetch_id_token(  # type: ignore[no-untyped-call]
            google.auth.transport.requests.Request(), place.iap_client_id
        )
    except Exception as exc:  # noqa: BLE001 - any failure to get a token is one line
        raise InfraError(f"--kfp-auth iap: no Google ID token for {place.iap_client_id}: {exc}") from None
    _iap_tokens[place.iap_client_id] = (time.monotonic(), fetched_now)
    return fetched_now


def auth_headers(place: Place) -> dict[str, str]:
    """The headers ``kfp.Client`` sends for the place's auth method: none; the projected token, read from its file as
    ``ServiceAccountTokenVolumeCredentials`` reads it; the IAP ID token; the token of --kfp-token-file; the user id
    header."""
    if place.auth == "userid":
        return userid(place)
    if place.auth == "sa-token":
        return {"Authorization": "Bearer " + Path(place.token_path).read_text().strip()}
    if place.auth == "iap":
        return {"Authorization": "Bearer " + _iap_token(place)}
    if place.auth == "token":
        return {"Authorization": "Bearer " + _file_token(place)}
    return {}


def _reason(exc: Exception) -> str:
    """An API error as one line: its status and the server's message."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else ""
    except ValueError:
        message = ""
    status = getattr(exc, "status", "")
    return f"{status} {message}".strip() or str(exc).splitlines()[0]


def call[T](what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """A kfp.Client call whose refusal is an InfraError of one line naming what was asked."""
    import contextlib
    import io

    from kfp_server_api.exceptions import ApiException

    try:
        with contextlib.redirect_stdout(io.StringIO()):  # kfp prints a UI link after each experiment and run made
            return fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status == 401:
            raise InfraError(f"{what}: the Kubeflow Pipelines API refused: {_reason(exc)} (check --kfp-auth)") from None
        if exc.status == 403:  # authenticated, not allowed there (a multi-user server's SubjectAccessReview)
            raise InfraError(
                f"{what}: the Kubeflow Pipelines API refused: {_reason(exc)} (check --kfp-namespace, and that "
                "--kfp-auth's identity may use it)"
            ) from None
        raise InfraError(f"{what}: {_reason(exc)}") from None


def experiment_id(kfp_client: Client, place: Place) -> str:
    experiment = call(
        f"the experiment {EXPERIMENT} in namespace {place.namespace}",
        kfp_client.create_experiment,
        EXPERIMENT,
        description="tpupipe runs",
        namespace=place.namespace,
    )
    found: str = experiment.experiment_id
    return found


def version_name(template: str) -> str:
    """The version of this compiled pipeline: the source version (git commit) and the file's digest."""
    from pipelines.pipeline import source_version

    digest = hashlib.sha256(Path(template).read_bytes()).hexdigest()[:12]
    return f"{source_version()[:12] or 'unversioned'}-{digest}"


def upload(kfp_client: Client, template: str, namespace: str, pipeline: str = PIPELINE) -> tuple[str, str]:
    """The pipeline and its version for this compiled file, uploaded unless there: (pipeline id, version id).

    The pipeline is the namespace's own, not a shared one: on a multi-user server anyone may upload a version of a
    shared pipeline (``canUploadVersionedPipeline`` in backend/src/apiserver/server/pipeline_upload_server.go L366-L368
    at 2.15.0, L401-L403 at 2.17.0), and before 2.17 delete one too ("Skip authentication if the namespace is empty
    to enable shared pipelines", ``canAccessPipeline`` in pipeline_server.go L1095-L1098 at 2.15.0), so another
    namespace's user could put their spec under this version's name; in the namespace only its contributors can. A
    single-user server ignores the namespace (``ReplaceNamespace`` in backend/src/apiserver/resource/
    resource_manager.go). A version found by name is used only if it holds this file's spec (``_same_spec``)."""
    name = version_name(template)
    where = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": pipeline}]})
    listed = call(
        f"the pipeline {pipeline} in namespace {namespace}",
        kfp_client.list_pipelines,
        filter=where,
        namespace=namespace,
    ).pipelines
    if listed:
        pipeline_id = listed[0].pipeline_id
    else:
        pipeline_id = call(
            f"upload of {pipeline}", kfp_client.upload_pipeline, template, pipeline, namespace=namespace
        ).pipeline_id
    where = json.dumps({"predicates": [{"operation": 1, "key": "display_name", "stringValue": name}]})
    found = call("its versions", kfp_client.list_pipeline_versions, pipeline_id, filter=where).pipeline_versions
    if found:
        if not _same_spec(found[0].pipeline_spec or {}, template):
            raise InfraError(
                f"the pipeline {pipeline} version {name} in namespace {namespace} holds another pipeline spec than "
                f"this compile ({template}), so it is not run: someone who may write there uploaded it. Delete that "
                "version (the KFP UI, or kfp.Client().delete_pipeline_version) and check who can write pipelines in "
                "the namespace"
            )
        return pipeline_id, found[0].pipeline_version_id
    version = call(
        f"upload of {pipeline} version {name}", kfp_client.upload_pipeline_version, template, name, pipeline_id
    )
    return pipeline_id, version.pipeline_version_id


def _same_spec(stored: dict[str, Any], template: str) -> bool:
    """Whether a version's ``pipeline_spec``, as the server returns it, is the compiled file's. The server keeps the
    spec as the PipelineSpec proto writes it (``V2Spec.Bytes``, backend/src/apiserver/template/v2_template.go: fields
    at their defaults left out, int64s as strings) and returns it as a Struct, nested under ``pipeline_spec`` and
    ``platform_spec`` when the file has a platform spec (``YamlStringToPipelineSpecStruct``,
    backend/src/apiserver/server/api_util.go at 2.15.0 and 2.17.0); so both sides are compared as protos. A field this
    client's proto does not know makes them differ."""
    import yaml
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2 as pb

    docs = [doc for doc in yaml.safe_load_all(Path(template).read_text()) if doc]
    local = [d for d in docs if "platforms" not in d] + [d for d in docs if "platforms" in d]
    theirs = [stored] if len(local) == 1 else [stored.get("pipeline_spec"), stored.get("platform_spec")]
    try:
        return len(local) == len(theirs) and all(
            json_format.ParseDict(mine, kind()) == json_format.ParseDict(other, kind())
            for mine, other, kind in zip(local, theirs, (pb.PipelineSpec, pb.PlatformSpec), strict=False)
        )
    except (json_format.ParseError, TypeError, AttributeError):
        return False


def parameters(sub: vertex.Submission, run_id: str = "") -> dict[str, Any]:
    values = {"preset": sub.preset, "overrides": sub.overrides}
    return values | ({"run_id": run_id} if run_id else {}) | ({"dataset": sub.dataset} if sub.dataset else {})


def submit(
    sub: vertex.Submission, place: Place, publish_first: bool = False, log: Callable[[str], None] = print
) -> tuple[str, str]:
    """Submit one run: (its KFP run id, tpupipe's run id)."""
    from components.spec.names import run_id_from

    vertex.check(sub)
    check_place(place)
    template = vertex.published_template(sub, publish_first, log)
    if sub.run_id:  # a run id is used once: refused (exit 2) before anything is uploaded or run
        run_ids.check_unused(sub.run_id, run_ids.output_root(template, sub.project))
    kfp_client = client(place)
    pipeline_id, version_id = upload(kfp_client, template, place.namespace)
    display = vertex.new_job_id(sub.preset)
    run_id = sub.run_id or run_id_from("", display)
    run = call(
        "the run",
        kfp_client.run_pipeline,
        experiment_id=experiment_id(kfp_client, place),
        job_name=display,
        params=parameters(sub, run_id),
        pipeline_id=pipeline_id,
        version_id=version_id,
        pipeline_root=sub.pipeline_root,
        service_account=sub.service_account or None,
    )
    return run.run_id, run_id


def run_url(place: Place, run_id: str) -> str:
    return f"{place.host.rstrip('/')}/#/runs/details/{run_id}"


def get(kfp_client: Client, run_id: str) -> dict[str, Any]:
    """The run as a dict of its API fields (``V2beta1Run.to_dict``)."""
    run: dict[str, Any] = call(f"run {run_id}", kfp_client.get_run, run_id).to_dict()
    return run


def spec_of(kfp_client: Client, run: dict[str, Any]) -> dict[str, Any]:
    """The pipeline spec the run ran: its own, else its version's."""
    own: dict[str, Any] = run.get("pipeline_spec") or {}
    if own:
        return own
    ref = run.get("pipeline_version_reference") or {}
    if not ref.get("pipeline_version_id"):
        return {}
    version = call(
        "its pipeline version", kfp_client.get_pipeline_version, ref["pipeline_id"], ref["pipeline_version_id"]
    )
    spec: dict[str, Any] = version.pipeline_spec or {}
    return spec


def as_job(run: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The run in the shape of a Vertex AI pipeline job's dict, for what reads both (``vertex.stages``,
    ``stopping.run_of``): its name, parameters, spec and task details (their errors with them)."""
    details = (run.get("run_details") or {}).get("task_details") or []
    return {
        "name": f"runs/{run['run_id']}",
        "state": run.get("state"),
        "pipelineSpec": spec,
        "runtimeConfig": {"parameterValues": (run.get("runtime_config") or {}).get("parameters") or {}},
        "jobDetail": {
            "taskDetails": [
                {"taskName": d["display_name"], "state": d["state"], "error": d.get("error") or {}} for d in details
            ]
        },
    }


def follow(
    kfp_client: Client,
    run_id: str,
    log: Callable[[str], None] = print,
    poll_s: float = 5.0,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Print each stage's state as it changes until the run ends; the run as a Vertex-shaped job (``as_job``)."""
    seen: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    spec: dict[str, Any] = {}
    while True:
        run = get(kfp_client, run_id)
        spec = spec or spec_of(kfp_client, run)
        job = as_job(run, spec)
        vertex.log_stage_changes(job, seen, log)
        if run.get("state") in TERMINAL:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise InfraError(f"run {run_id} is still {str(run.get('state')).lower()} after {timeout_s:.0f}s")
        time.sleep(poll_s)


def runs(kfp_client: Client, place: Place, preset: str = "", state: str = "") -> list[dict[str, Any]]:
    """tpupipe's runs in the namespace's experiment, newest first, of one preset, in one state."""
    if state and state not in STATES:
        raise SpecError("--state", f"unknown state {state!r}", list(STATES))
    listed = call(
        "the runs",
        kfp_client.list_runs,
        page_size=100,
        sort_by="created_at desc",
        experiment_id=experiment_id(kfp_client, place),
        namespace=place.namespace,
    )
    found = [r.to_dict() for r in listed.runs or []]
    found = [
        r for r in found if not preset or as_job(r, {})["runtimeConfig"]["parameterValues"].get("preset") == preset
    ]
    return [r for r in found if not state or r.get("state") == STATES[state]]


def cancel(kfp_client: Client, run_id: str, timeout_s: float, log: Callable[[str], None] = print) -> int:
    """Terminate the run (unless it has ended), wait for it to end, then tear its run down from its ledger, as
    ``tpupipe runs cancel`` does on Vertex AI: on KFP's Argo backend a terminated run's exit handler fails past the
    workflow's deadline without running (kubeflow/pipelines#6101), so its teardown is done here."""
    from pipelines.backends.vertex import stopping

    run = get(kfp_client, run_id)
    if run.get("state") not in TERMINAL:
        if run.get("state") != "CANCELING":
            call(f"terminate run {run_id}", kfp_client.terminate_run, run_id)
        log(f"run {run_id}: terminate requested; waiting at most {timeout_s:.0f}s for its tasks to stop")
        follow(kfp_client, run_id, log, poll_s=2.0, timeout_s=timeout_s)
        run = get(kfp_client, run_id)
    job = as_job(run, spec_of(kfp_client, run))
    log(f"run {run_id}: {str(run.get('state')).lower()}; its exit handler's teardown does not run after a terminate")
    if not job["runtimeConfig"]["parameterValues"].get("run_id") and run.get("recurring_run_id"):
        # A recurring run's run is named, and displayed, as its Argo Workflow (DisplayName and K8SName are the
        # workflow's name: ReportWorkflowResource in backend/src/apiserver/resource/resource_manager.go), which is the
        # job name its tasks derived the run id from (names.run_id_from).
        job["runtimeConfig"]["parameterValues"]["run_id"] = scheduled_run_id(run)
    if not job["runtimeConfig"]["parameterValues"].get("run_id"):
        log(
            f"run {run_id} has no run_id parameter (it was started elsewhere, from the UI say): its run id derives "
            "from its Argo workflow's name, which the KFP API does not return; `tpupipe teardown RUN_ID --platform "
            "gke` (RUN_ID is in its tasks' logs) or the janitor's age limit removes what it left"
        )
        return 1
    return stopping.teardown_after(job, run.get("state") == "CANCELED", f"run {run_id}", log)


def scheduled_run_id(run: dict[str, Any]) -> str:
    """The run id the tasks of a recurring run's run derive: from its workflow's name, which is its display name."""
    from components.spec.names import run_id_from

    return run_id_from("", run.get("display_name") or "")


# Where the API server says its health: HealthzService.GetHealthz, ``get: "/apis/v2beta1/healthz"``
# (https://github.com/kubeflow/pipelines/blob/2.15.0/backend/api/v2beta1/healthz.proto), and the v1beta1 one before it
# (backend/api/v1beta1/healthz.proto at the same tag). Its GetHealthzResponse declares ``multi_user`` alone: the
# ``tag_name`` the server's handler adds (newHealthzResponse in backend/src/apiserver/main.go, its deployment's
# TAG_NAME) is not part of the API, so a server may leave it out, or say "unknown".
HEALTHZ_PATHS = ("/apis/v2beta1/healthz", "/apis/v1beta1/healthz")


def server_version(place: Place, log: Callable[[str], None] | None = None) -> tuple[int, ...] | None:
    """The API server's release, from its healthz answer's ``tag_name`` (``HEALTHZ_PATHS``), read with ``requests``
    and the place's own authentication (``auth_headers``); None, with one line to ``log``, when it does not say one (no
    tag, "unknown", a development build) or cannot be asked."""
    import requests

    tag, said = "", ""
    try:
        for path in HEALTHZ_PATHS:
            answer = requests.get(place.host.rstrip("/") + path, headers=auth_headers(place), timeout=30)
            if answer.status_code != 404:
                answer.raise_for_status()
                tag = str(answer.json().get("tag_name") or "")
                break
    except (requests.RequestException, ValueError, OSError, InfraError) as exc:
        said = f"its healthz could not be read ({type(exc).__name__})"
    found = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", tag)
    if found:
        return tuple(int(part) for part in found.groups() if part is not None)
    if log:
        said = said or (f"its healthz says tag_name {tag!r}" if tag else "its healthz names no release (tag_name)")
        log(f"tpupipe: the Kubeflow Pipelines server's release is unknown: {said}")
    return None


def schedule_time_note(version: tuple[int, ...] | None) -> str:
    """What ``{date}`` means on a server of ``version``: '' where its v2 driver fills the schedule time (2.17 on); where
    the release is unknown (a server built from source reports ``unknown``: ``ARG TAG_NAME=unknown`` in
    kubeflow/pipelines' backend Dockerfile at 2.15.0), what it means on either side of 2.17; else the warning
    ``tpupipe schedule create`` prints."""
    late = (
        "a run's {date} will be the day its snapshot_data task starts (UTC), not the day it was scheduled for, so a "
        "queued or late run reads that day's drop"
    )
    if version is None:
        return f"note: unless this Kubeflow Pipelines server is 2.17 or later (kubeflow/pipelines#13474), {late}"
    if version[:2] >= SCHEDULE_TIME_FROM:
        return ""
    release = ".".join(map(str, version))
    how = "gives it empty" if version[:2] == (2, 16) else "passes it as text, unresolved"
    return (
        f"warning: this Kubeflow Pipelines server ({release}) {how} for the pipeline's schedule time "
        f"({{{{$.pipeline_job_schedule_time_utc}}}}, filled from KFP 2.17: kubeflow/pipelines#13474): {late}"
    )


def show(kfp_client: Client, run_id: str) -> dict[str, Any]:
    """A run's stages (its figures are its tasks' Metrics artifacts, in the KFP UI)."""
    run = get(kfp_client, run_id)
    job = as_job(run, spec_of(kfp_client, run))
    return {
        "name": run_id,
        "display_name": run.get("display_name"),
        "state": run.get("state"),
        "preset": job["runtimeConfig"]["parameterValues"].get("preset"),
        "stages": [(t["taskName"], t["state"]) for t in vertex.stages(job)],
    }


# ---------------------------------------------------------------- recurring runs


def kfp_cron(cron: str) -> str:
    """A 5-field cron as KFP's 6 fields ("using 6 space-separated fields", seconds first: the create_recurring_run
    docstring, kfp/client/client.py). A time zone is refused: KFP's cron schedule documents none (its runs fire in
    the controller's zone)."""
    if cron.startswith(("TZ=", "CRON_TZ=")):
        raise SpecError("--cron", "Kubeflow Pipelines takes no time zone in a cron: write it in UTC", ["0 3 * * 1"])
    if len(cron.split()) != 5:
        raise SpecError("--cron", f"{cron!r} is not 5 cron fields", ["0 3 * * 1"])
    return "0 " + cron


def schedule_create(
    sub: vertex.Submission, place: Place, name: str, cron: str, max_concurrent: int, start: str = "", end: str = ""
) -> str:
    """A recurring run NAME of the submission in the experiment; its id."""
    vertex.check(sub, scheduled=True)
    check_place(place)
    cron6 = kfp_cron(cron)
    if not 1 <= max_concurrent <= 10:
        # "Specifies how many runs can be executed concurrently. Range [1-10]" (V2beta1RecurringRun.max_concurrency)
        raise SpecError("--max-concurrent", f"{max_concurrent} is not between 1 and 10 (KFP's range)")
    template = vertex.published_template(sub)
    kfp_client = client(place)
    note = (
        schedule_time_note(server_version(place, lambda line: print(line, file=sys.stderr, flush=True)))
        if _dated(sub)
        else ""
    )
    if note:
        print(f"tpupipe: {note}", file=sys.stderr, flush=True)
    pipeline_id, version_id = upload(kfp_client, template, place.namespace)
    created = call(
        f"the recurring run {name}",
        kfp_client.create_recurring_run,
        experiment_id=experiment_id(kfp_client, place),
        job_name=name,
        start_time=start or None,
        end_time=end or None,
        cron_expression=cron6,
        max_concurrency=max_concurrent,
        no_catchup=True,  # runs due while it was disabled are not caught up, as on Vertex AI
        # No run id: KFP formats a recurring run's [[RunUUID]]-style macros only in the Argo Workflow's
        # spec.arguments.parameters (FormatWorkflowParameters in NewWorkflow,
        # backend/src/crd/controller/scheduledworkflow/util/scheduled_workflow.go), while a v2 pipeline's parameters
        # travel in the root driver's runtime-config input (paramRuntimeConfig, backend/src/v2/compiler/argocompiler/
        # argo.go), embedded when the recurring run pins a version (CreateJob in
        # backend/src/apiserver/resource/resource_manager.go): a macro reaches the tasks verbatim
        # (kubeflow/pipelines#12494). Each run's tasks derive its id from its workflow's name instead.
        params=parameters(sub),
        pipeline_id=pipeline_id,
        version_id=version_id,
        pipeline_root=sub.pipeline_root,
        service_account=sub.service_account or None,
    )
    made: str = created.recurring_run_id
    return made


def _dated(sub: vertex.Submission) -> bool:
    """Whether the submission's dataset names the schedule's date (a date form: ``{date}``, ``{date-1}``, ...)."""
    from components.spec import datasets
    from components.workload import resolve

    return datasets.dated(resolve(sub.preset, sub.resolved_overrides).train.dataset)


def recurring_runs(kfp_client: Client, place: Place) -> list[dict[str, Any]]:
    listed = call(
        "the recurring runs",
        kfp_client.list_recurring_runs,
        page_size=100,
        experiment_id=experiment_id(kfp_client, place),
        namespace=place.namespace,
    )
    return [r.to_dict() for r in listed.recurring_runs or []]


def schedule_action(kfp_client: Client, place: Place, name: str, action: str) -> None:
    """pause, resume or delete the recurring run NAME."""
    found = next((r for r in recurring_runs(kfp_client, place) if r["display_name"] == name), None)
    if found is None:
        raise SpecError("name", f"no recurring run {name!r} in the experiment {EXPERIMENT} of {place.namespace}")
    verb = {"pause": "disable_recurring_run", "resume": "enable_recurring_run", "delete": "delete_recurring_run"}
    call(f"{action} {name}", getattr(kfp_client, verb[action]), found["recurring_run_id"])
