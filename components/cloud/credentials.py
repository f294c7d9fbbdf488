"""Google credentials for everything that calls Google Cloud (the gke platform, the run store in Cloud Storage,
Vertex AI): Application Default Credentials (the pipeline's service account on Vertex, ``gcloud auth
application-default login`` on a workstation), or, when the emulators are in use, their static token; and the one
factory of the Google API clients, :func:`google_client`: to an emulator when its variable is set, else to Google.

What a user fixes before any cloud call can succeed — no credentials, credentials refused, a project that does not
exist or cannot be reached, an API not enabled, a permission denied — is one :class:`AccessError` (exit 2): one line
naming what is missing and the command or role that fixes it (``access_error``), never a traceback."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Literal

from components.spec import TpupipeError

if TYPE_CHECKING:  # google-auth is imported where called
    from google.auth.credentials import Credentials
    from google.cloud.storage import Client as StorageClient  # no type information: Any to mypy

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
EMULATOR_HOST_ENV = "TPUPIPE_GKE_EMULATOR_HOST"  # set when the tests point the clients at the emulators
EMULATOR_TOKEN_ENV = "TPUPIPE_GKE_EMULATOR_TOKEN"  # a static token (an emulator started alone)
# With the emulators: the emulated OAuth 2.0 token endpoint, where user credentials (Application Default Credentials
# of type authorized_user) refresh, as the emulator host variables redirect the APIs.
EMULATOR_TOKEN_URI_ENV = "TPUPIPE_GKE_EMULATOR_TOKEN_URI"
EMULATED_CLIENT_ID = "tpupipe-emulated.apps.googleusercontent.com"  # the emulated project's OAuth client
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Vertex AI's endpoint (http://host:port, REST) with the emulators; unset, the SDK's default for the region.
VERTEX_ENDPOINT_ENV = "TPUPIPE_VERTEX_ENDPOINT"
STORAGE_EMULATOR_HOST_ENV = "STORAGE_EMULATOR_HOST"  # google-cloud-storage's own (it reads it itself)
LOGIN = "gcloud auth application-default login"


class AccessError(TpupipeError):
    """The caller cannot reach Google Cloud as the run needs: nothing was created. Exit 2, as for bad input. ``whole``:
    nothing the command does can succeed (no credentials, no such project), as against one API or permission."""

    exit_code = 2

    def __init__(self, message: str, whole: bool = True):
        super().__init__(message)
        self.whole = whole


def emulator_token() -> str | None:
    """The emulators' own static token (``$TPUPIPE_GKE_EMULATOR_TOKEN`` while ``$TPUPIPE_GKE_EMULATOR_HOST`` is set),
    the one token that may go to an emulator over a plaintext channel; None otherwise (the credentials are Google's)."""
    token = os.environ.get(EMULATOR_TOKEN_ENV)
    return token if token and os.environ.get(EMULATOR_HOST_ENV) else None


def credentials() -> Credentials:
    token = emulator_token()
    if token:
        from google.oauth2 import credentials as oauth2

        return oauth2.Credentials(token=token)  # type: ignore[no-untyped-call]  # google-auth's __init__ is untyped
    import google.auth
    from google.auth import exceptions

    try:
        creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except exceptions.DefaultCredentialsError:
        raise AccessError(
            "no Google Cloud credentials: Application Default Credentials were not found "
            f"(no GOOGLE_APPLICATION_CREDENTIALS, no gcloud login, no metadata server); run `{LOGIN}`"
        ) from None
    token_uri = os.environ.get(EMULATOR_TOKEN_URI_ENV)
    if token_uri and os.environ.get(EMULATOR_HOST_ENV) and _emulated(creds) and hasattr(creds, "with_token_uri"):
        if _loopback(token_uri):
            creds = creds.with_token_uri(token_uri)
    return creds


def _emulated(creds: Any, token_uri: str | None = None) -> bool:
    """Whether ``creds`` are the emulated project's own login (its OAuth client, ``EMULATED_CLIENT_ID``) and, with
    ``token_uri``, refresh there, on this machine: only such credentials are refreshed at, or sent to, an emulator.
    A user's own login, found while emulator variables are left set, keeps Google's token endpoint: its refresh token
    and client secret never go to a plain-HTTP address."""
    if getattr(creds, "client_id", None) != EMULATED_CLIENT_ID:
        return False
    return token_uri is None or (getattr(creds, "token_uri", None) == token_uri and _loopback(token_uri))


def _loopback(uri: str) -> bool:
    from urllib.parse import urlsplit

    return urlsplit(uri).hostname in LOOPBACK


def emulator_credentials(creds: Any = None) -> Credentials:
    """What a client sends to an emulator's plaintext ``http://`` endpoint: the emulators' static token
    (:func:`emulator_token`); else ``creds`` (or Application Default Credentials) only when they refresh at the
    emulated token endpoint (``$TPUPIPE_GKE_EMULATOR_TOKEN_URI``), so their tokens are the emulator's own; else
    anonymous credentials (no ``Authorization`` header). A real Google credential never goes over plain HTTP."""
    from google.auth.credentials import AnonymousCredentials

    token = emulator_token()
    if token:
        from google.oauth2 import credentials as oauth2

        return oauth2.Credentials(token=token)  # type: ignore[no-untyped-call]  # google-auth's __init__ is untyped
    token_uri = os.environ.get(EMULATOR_TOKEN_URI_ENV)
    if token_uri and os.environ.get(EMULATOR_HOST_ENV):
        try:
            creds = creds or credentials()
        except AccessError:  # no credentials at all: none to send
            creds = None
        if creds is not None and _emulated(creds, token_uri):
            emulated: Credentials = creds
            return emulated
    return AnonymousCredentials()  # type: ignore[no-untyped-call]  # google-auth's __init__ is untyped


def google_client[C](
    cls: type[C],
    emulator_env: str,
    *,
    endpoint: str | None = None,
    transport: str | None = None,
    emulator_transport: Literal["grpc", "rest"] | None = None,
    creds: Any = None,
    **kwargs: Any,
) -> C:
    """A ``cls`` (a Google API client class) to the emulator named by ``$emulator_env`` when it is set, else to Google
    with ``creds`` or Application Default Credentials (:func:`credentials`), at ``endpoint`` (its ``api_endpoint``;
    None: the library's default) over ``transport`` (a GAPIC client's, ``"grpc"`` or ``"rest"``; None: the library's
    default). ``kwargs`` go to ``cls`` as they are (``project=``).

    ``emulator_transport`` says how the emulator is reached (None: as Google is, ``transport``; else gRPC for a client
    with a gRPC transport, REST for one without): ``"grpc"``, the variable is ``host:port`` of a gRPC server in
    plaintext, as Google's own emulators are found (``PUBSUB_EMULATOR_HOST``): the client gets an insecure channel on
    its gRPC transport, and no credentials; ``"rest"``, the variable is the emulator's URL (``http://host:port``, as
    ``STORAGE_EMULATOR_HOST``): it is the client's ``api_endpoint``, with :func:`emulator_credentials` (never
    Google's, over plaintext HTTP), and a GAPIC client (one that takes a transport) speaks REST to it."""
    host = os.environ.get(emulator_env)
    grpc_transport = _grpc_transport(cls)
    if host and (emulator_transport or transport or ("grpc" if grpc_transport else "rest")) == "grpc":
        import grpc

        # ``cls`` is any client class to mypy; one with a gRPC transport (a GAPIC client's) takes ``transport``.
        return cls(transport=grpc_transport(channel=grpc.insecure_channel(host)), **kwargs)  # type: ignore[call-arg]
    if host:
        endpoint = host
        transport = "rest" if hasattr(cls, "get_transport_class") else None
        creds = emulator_credentials(creds)
    options: dict[str, Any] = {"credentials": creds or credentials(), **kwargs}
    if endpoint:
        options["client_options"] = {"api_endpoint": endpoint}
    if transport:
        options["transport"] = transport
    return cls(**options)


def storage_client(project: str | None = None, creds: Credentials | None = None) -> StorageClient:
    """A Cloud Storage ``Client``: to the emulator named by $STORAGE_EMULATOR_HOST (google-cloud-storage's own), else
    to Google. The one Cloud Storage client of the project (the run store, the data snapshot, the bucket adapter).
    ``project``: the project the client bills and creates buckets in (None: reads bill the buckets' own)."""
    from google.cloud.storage import Client

    return google_client(Client, STORAGE_EMULATOR_HOST_ENV, creds=creds, project=project)


def _grpc_transport(cls: type) -> Any:
    """The gRPC transport class of a GAPIC client class; None for a client without one (compute_v1's, Cloud
    Storage's, BigQuery's)."""
    transports = getattr(cls, "get_transport_class", None)
    try:
        return transports("grpc") if transports else None
    except KeyError:  # a GAPIC client with REST alone
        return None


# Google's OpenID Connect UserInfo endpoint (the discovery document's ``userinfo_endpoint``:
# https://accounts.google.com/.well-known/openid-configuration, https://developers.google.com/identity/openid-connect/reference):
# whose a valid access token is, its ``email`` and ``email_verified`` among it when the token carries the e-mail scope
# ("Provided only if you included the email scope in your request":
# https://developers.google.com/identity/openid-connect/openid-connect). The token goes in the ``Authorization``
# header, as Google's guide says to send it ("Add your access token to the authorization header and make an HTTPS GET
# request to the userinfo endpoint": same page, "Obtaining user profile information"), never in the URL, which
# clients log (urllib3 logs each request's path) and which "Bearer tokens SHOULD NOT be passed in" (RFC 6750 section
# 5.3, https://www.rfc-editor.org/rfc/rfc6750#section-5.3). With the emulators, the emulated token issuer's
# ``/userinfo``, on the host of its token endpoint.
USERINFO_URI = "https://openidconnect.googleapis.com/v1/userinfo"
# The scope that lets the UserInfo endpoint say a token's account's e-mail address; `gcloud auth application-default
# login` asks for it by default ("--scopes": "By default openid, https://www.googleapis.com/auth/userinfo.email,
# https://www.googleapis.com/auth/cloud-platform, https://www.googleapis.com/auth/sqlservice.login scopes are used":
# https://cloud.google.com/sdk/gcloud/reference/auth/application-default/login), so a user's refresh token may ask
# for it alone
EMAIL_SCOPE = "https://www.googleapis.com/auth/userinfo.email"


def caller_email(creds: Any) -> str:
    """The e-mail address of the account ``creds`` act as, "" where it cannot be learned. A service account's
    credentials carry it: a key's and an impersonated account's (``service_account_email``, ``signer_email``), and the
    metadata server's (Compute Engine, GKE Workload Identity, Vertex AI) once refreshed, which reads it from the
    metadata server (``compute_engine.Credentials.refresh``, google/auth/compute_engine/credentials.py at google-auth
    2.63.0); a user's login may name it (``account``). Else the token says: the UserInfo endpoint (``USERINFO_URI``),
    asked with it in the ``Authorization`` header, for a user's login a token its refresh token is asked for with
    ``EMAIL_SCOPE`` alone. Only a verified address counts (``email_verified``). An error of the endpoint or of the
    refresh is "". A caller with no Google account behind it (Workload Identity Federation, workforce identity
    federation or GKE Workload Identity without a service account to impersonate: a principal identifier, not an
    e-mail, https://cloud.google.com/iam/docs/principal-identifiers) has none to say: ""."""
    email = named_email(creds)
    if email:
        return email
    import json

    import google.auth.transport.requests
    from google.auth import exceptions

    request = google.auth.transport.requests.Request()
    try:
        if getattr(creds, "service_account_email", None) == "default":  # the metadata server's, before a refresh
            creds.refresh(request)
            return named_email(creds)
        where = _userinfo_uri(creds)
        token = _email_token(creds, request) if where else ""
        if not token:
            return ""
        response = request(url=where, method="GET", headers={"Authorization": f"Bearer {token}"})
        info = json.loads(response.data) if response.status == 200 else {}
    except (exceptions.GoogleAuthError, ValueError):
        return ""
    verified = str(info.get("email_verified", "")).lower() == "true"
    email = info.get("email", "") if verified else ""
    return email if isinstance(email, str) and "@" in email else ""


def named_email(creds: Any) -> str:
    """The e-mail address the credentials' own attributes name: a service account's, a user's login's."""
    for attribute in ("service_account_email", "signer_email", "account"):
        value = getattr(creds, attribute, None)
        if isinstance(value, str) and "@" in value:
            return value
    return ""


def _userinfo_uri(creds: Any) -> str:
    """Where the token of ``creds`` is asked about: with the emulators, the emulated token issuer's host (beside
    ``$TPUPIPE_GKE_EMULATOR_TOKEN_URI``, on this machine), and only for their own tokens (the static one, or
    credentials that refresh there: ``_emulated``), "" when there is none; else Google's ``USERINFO_URI``."""
    from urllib.parse import urljoin

    token_uri = os.environ.get(EMULATOR_TOKEN_URI_ENV, "")
    emulated = bool(token_uri and os.environ.get(EMULATOR_HOST_ENV) and _loopback(token_uri))
    own = emulator_token()
    if own is not None and getattr(creds, "token", None) == own:
        return urljoin(token_uri, "userinfo") if emulated else ""
    if emulated and _emulated(creds, token_uri):
        return urljoin(token_uri, "userinfo")
    return USERINFO_URI


def _email_token(creds: Any, request: Any) -> str:
    """An access token of ``creds`` whose UserInfo may carry the account's e-mail: for a user's login (a refresh
    token), one asked for with ``EMAIL_SCOPE`` alone (the credentials' own tokens are asked for with
    ``CLOUD_PLATFORM_SCOPE``: :func:`credentials`); else their own, refreshed when no longer valid."""
    from google.oauth2 import credentials as oauth2

    if isinstance(creds, oauth2.Credentials) and creds.refresh_token:
        scoped = oauth2.Credentials(  # type: ignore[no-untyped-call]  # google-auth's __init__ is untyped
            None,
            refresh_token=creds.refresh_token,
            token_uri=creds.token_uri,
            client_id=creds.client_id,
            client_secret=creds.client_secret,
            scopes=[EMAIL_SCOPE],
        )
        scoped.refresh(request)  # type: ignore[no-untyped-call]
        return str(scoped.token or "")
    if not creds.valid:
        creds.refresh(request)
    return str(creds.token or "")


class AccessToken:
    """A Google OAuth access token that stays valid, for the clients that take a bare token (the Kubernetes client's
    bearer token, the Ray job client's ``Authorization`` header): ``token()`` refreshes ``creds`` first when google-auth
    says they are no longer valid (``Credentials.valid``: expired, or within its refresh threshold of ``expiry``),
    ``token(fresh=True)`` always (after a 401). An access token lives at most an hour, less when the metadata server
    hands out one it has cached (https://cloud.google.com/docs/authentication/token-types#access-tokens); a run waits
    longer than that."""

    def __init__(self, creds: Credentials) -> None:
        self.creds = creds
        self._lock = threading.Lock()

    def __call__(self, fresh: bool = False) -> str:
        with self._lock:
            if fresh or not self.creds.valid:
                import google.auth.transport.requests

                request = google.auth.transport.requests.Request()
                self.creds.refresh(request)  # type: ignore[no-untyped-call]  # google-auth's refresh is untyped
            # google-auth leaves ``token`` unannotated: a str once refreshed, and ``valid`` only with one
            token: str = self.creds.token
            return token


def access_error(exc: BaseException) -> AccessError | None:
    """The one-line :class:`AccessError` of a Google Cloud error the user fixes (credentials, project, API,
    permission), or None for any other error. The reasons are ``google.rpc.ErrorInfo.reason`` values of the
    ``googleapis.com`` domain as ``google/api/error_reason.proto`` (googleapis-common-protos) defines them, with the
    service and the consumer project in the ErrorInfo's metadata."""
    if isinstance(exc, AccessError):
        return exc
    if not type(exc).__module__.startswith("google."):  # no Google library raised it (and none need be installed)
        return None
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth

    if isinstance(exc, auth.RefreshError | auth.DefaultCredentialsError) or isinstance(exc, gexc.Unauthenticated):
        return AccessError(f"the Google Cloud credentials were refused ({_first_line(exc)}); run `{LOGIN}`")
    if not isinstance(exc, gexc.GoogleAPICallError):
        return None
    reason, meta = exc.reason or "", exc.metadata or {}
    service = meta.get("service", "")
    project = meta.get("consumer", "").removeprefix("projects/")
    if reason == "SERVICE_DISABLED":
        return AccessError(
            f"the API {service} is not enabled in project {project}: run "
            f"`gcloud services enable {service} --project {project}`",
            whole=False,
        )
    if reason in ("CONSUMER_INVALID", "USER_PROJECT_DENIED", "CONSUMER_SUSPENDED", "RESOURCE_PROJECT_INVALID"):
        return AccessError(
            f"project {project or '(as named)'} does not exist or cannot be reached with these credentials "
            f"({reason}): check the project id (--project, gke.project) with `gcloud projects describe "
            f"{project or 'PROJECT'}`"
        )
    if reason in ("ACCESS_TOKEN_EXPIRED", "CREDENTIALS_MISSING"):
        return AccessError(f"the Google Cloud credentials were refused ({reason}); run `{LOGIN}`")
    if reason == "IAM_PERMISSION_DENIED" or isinstance(exc, gexc.PermissionDenied | gexc.Forbidden):
        permission = meta.get("permission", "")
        resource = meta.get("resource", "")
        what = f"{permission} on {resource}" if permission else _first_line(exc)
        return AccessError(
            f'permission denied: {what}; grant the caller a role that holds it (docs/gke.md, "IAM roles": '
            "`gcloud projects add-iam-policy-binding PROJECT --member=user:YOU --role=ROLE`)",
            whole=False,
        )
    return None


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def pipeline_job_state(name: str, timeout_s: float | None = None) -> tuple[str | None, str]:
    """A Vertex AI pipeline job's state (``PIPELINE_STATE_...``), by its full resource name
    (``projects/P/locations/L/pipelineJobs/ID``, asked of its region's endpoint), or None and why it cannot be read.
    ``timeout_s``: how long the call may take (None: the library's default)."""
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    region = name.split("/")[3] if name.count("/") >= 5 else ""
    if not region:
        return None, f"{name!r} is not a pipeline job's resource name (projects/P/locations/L/pipelineJobs/ID)"
    client = google_client(
        aiplatform_v1.PipelineServiceClient,
        VERTEX_ENDPOINT_ENV,
        endpoint=f"{region}-aiplatform.googleapis.com",
        emulator_transport="rest",
    )
    try:
        job = client.get_pipeline_job(name=name, timeout=timeout_s)
    except exceptions.GoogleAPICallError as exc:
        return None, f"{type(exc).__name__}: {exc.message}"
    except Exception as exc:  # noqa: BLE001 - no credentials, a timeout: the state is unknown, and why is said
        return None, f"{type(exc).__name__}: {exc}"
    return aiplatform_v1.PipelineState(job.state).name, ""
