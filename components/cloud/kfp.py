"""Kubeflow Pipelines, through the official ``kfp.Client``: the one client of a KFP API server (``client``), and the
state of each tpupipe run there, by the run id its ``run_id`` parameter gives it (``run_states``), which the janitor
reads to decide whether a run's cluster may be swept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # kfp and kfp_server_api ship no type information: their names are Any to mypy
    from kfp.client import Client, TokenCredentialsBase
    from kfp_server_api import V2beta1GetHealthzResponse

# Where KFP projects the pipeline runner's token into a pod that asks for it (kfp's ServiceAccountTokenVolumeCredentials
# default path, kfp/client/set_volume_credentials.py).
SA_TOKEN_PATH = "/var/run/secrets/kubeflow/pipelines/token"
# V2beta1RuntimeState's ended states (kfp_server_api's v2beta1_runtime_state.py).
ENDED = ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED")


def client(
    host: str, namespace: str, credentials: TokenCredentialsBase | None = None, existing_token: str | None = None
) -> Client:
    """A ``kfp.Client`` of ``host`` whose API server answered its health check (else the client's exception)."""
    return connect(host, namespace, credentials, existing_token)[0]


def connect(
    host: str,
    namespace: str,
    credentials: TokenCredentialsBase | None = None,
    existing_token: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[Client, V2beta1GetHealthzResponse]:
    """(a ``kfp.Client`` of ``host``, its API server's health check answer: ``multi_user`` among it). ``headers`` go
    with every request (``with_headers``), the health check's too."""
    import logging
    import warnings

    import kfp

    logging.getLogger("root").setLevel(logging.WARNING)  # kfp logs each experiment it looks up at INFO
    auth = {"credentials": credentials} if credentials else {"existing_token": existing_token} if existing_token else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "This client only works with KFP v2.0.0-beta.2 and later"
        made = kfp.Client(host=host.rstrip("/"), namespace=namespace, **auth)
    with_headers(made, headers or {})
    return made, made.get_kfp_healthz(sleep_duration=0)


def with_headers(made: Client, headers: dict[str, str]) -> None:
    """Every API of the ``kfp.Client`` ``made`` sends ``headers``: they are default headers of the one
    ``kfp_server_api.ApiClient`` its service APIs share (runs, recurring runs, experiments, pipelines, uploads,
    healthz: ``Client.__init__`` in kfp/client/client.py, kfp 2.17), which adds them to each call's (``ApiClient.
    set_default_header``, ``__call_api`` in kfp_server_api/api_client.py). ``kfp.Client`` takes one such header only
    from the user's KFP context file (``client_authentication_header_name``), so they are set here."""
    shared = {id(api.api_client): api.api_client for api in vars(made).values() if hasattr(api, "api_client")}
    for api_client in shared.values():
        for name, value in headers.items():
            api_client.set_default_header(name, value)


def in_cluster_client(host: str, namespace: str) -> Client:
    """The client a task in the cluster makes: the pod's projected KFP token when it has one, else none."""
    from kfp.client import ServiceAccountTokenVolumeCredentials

    has_token = Path(SA_TOKEN_PATH).is_file()
    return client(host, namespace, ServiceAccountTokenVolumeCredentials(SA_TOKEN_PATH) if has_token else None)


def run_states(kfp_client: Client, namespace: str) -> dict[str, tuple[str, str]]:
    """tpupipe's runs in the namespace, by the run id each was given (its ``run_id`` parameter) or, for a recurring
    run's run, which has none, the one its tasks derived from its Argo workflow's name, which is that run's display
    name (DisplayName is the workflow's name: ReportWorkflowResource in
    backend/src/apiserver/resource/resource_manager.go in kubeflow/pipelines): (its KFP run id, its state). A run
    started from the UI with no run id is not among them: its workflow's name is not its display name."""
    from components.spec import SpecError
    from components.spec.names import run_id_from

    states: dict[str, tuple[str, str]] = {}
    token = ""
    while True:
        page = kfp_client.list_runs(page_token=token, page_size=100, namespace=namespace)
        for run in page.runs or []:
            run_id = ((run.runtime_config and run.runtime_config.parameters) or {}).get("run_id")
            if not run_id and run.recurring_run_id and run.display_name:
                try:
                    run_id = run_id_from("", run.display_name)
                except SpecError:  # not a name a task derived a run id from
                    run_id = ""
            if run_id:
                states.setdefault(run_id, (run.run_id, run.state))
        token = page.next_page_token
        if not token:
            return states
