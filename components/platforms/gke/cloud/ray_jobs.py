"""The Ray Jobs API (and the dashboard's State API) of a run's RayCluster head, reached through the Kubernetes API
server's service proxy with the cluster's credentials and the Ray token: the client the train, evaluate and
check_slice stages submit and follow their jobs with, kept valid as its Google token expires and retried on transient
errors (``transient``), and teardown's reads of the head's State API.

``ray`` and ``requests`` are imported inside functions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from components.platforms.gke.cloud import transient
from components.platforms.gke.cloud.control_plane import ControlPlane
from components.platforms.gke.cloud.transient import Retrying

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient


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
    the endpoint's CA (written in ``ca_dir``) or the public roots trusted, as by
    :func:`components.platforms.gke.cloud.kube.api_client`."""
    from ray.job_submission import JobSubmissionClient

    from components.spec import InfraError

    if not ray_token:
        raise InfraError(
            f"no Ray token for RayCluster {raycluster} in namespace {namespace} (its Secret is missing or empty): "
            "the jobs are never sent to a Ray cluster unauthenticated"
        )
    address = proxy_address(plane.host, namespace, f"{raycluster}-head-svc")
    verify = plane.ca_file(ca_dir) or True  # True: requests' own roots (certifi's)

    def make(token: str) -> JobSubmissionClient:
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

    def get(path: str, params: list[tuple[str, str]]) -> Any:
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

    def __init__(
        self, make: Callable[[str], JobSubmissionClient], token: Callable[..., str], retrying: Retrying
    ) -> None:
        self._make, self._token, self.retrying = make, token, retrying
        self._client: JobSubmissionClient | None = None
        self._made_with = ""

    def until(self, deadline: float) -> None:
        self.retrying.until = deadline

    def _current(self, fresh: bool = False) -> JobSubmissionClient:
        token = self._token(fresh=True) if fresh else self._token()
        if self._client is None or token != self._made_with:
            client: JobSubmissionClient = self.retrying.call("connect to the Ray dashboard", self._make, token)
            self._client, self._made_with = client, token
        return self._client

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from ray.exceptions import AuthenticationError

        tries = []

        def once() -> Any:
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

    def submit_job(self, **kwargs: Any) -> str:
        return cast(str, self._call("submit_job", **kwargs))

    def get_job_info(self, job_id: str) -> JobDetails:
        return cast("JobDetails", self._call("get_job_info", job_id))

    def get_job_status(self, job_id: str) -> JobStatus:
        return cast("JobStatus", self._call("get_job_status", job_id))

    def get_job_logs(self, job_id: str) -> str:
        return cast(str, self._call("get_job_logs", job_id))

    def stop_job(self, job_id: str) -> bool:
        return cast(bool, self._call("stop_job", job_id))

    def tail_job_logs(self, job_id: str) -> AsyncIterator[str]:
        """The job's log as Ray streams it (a WebSocket, opened with the current token): not retried, the stages
        read the whole log instead when the stream breaks."""
        return self._current().tail_job_logs(job_id)
