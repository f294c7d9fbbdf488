"""``components.cloud.credentials.google_client``, the one factory of the Google API clients, over real client
objects of each shape the project makes (or will): a GAPIC client over gRPC, a GAPIC client over REST alone
(compute_v1), a GAPIC client over gRPC at Google whose emulator speaks REST (Vertex AI's pipelines), one over REST at
both (Vertex AI's models), and the REST clients that are not GAPIC (Cloud Storage, BigQuery). With the emulator's
variable set the client's endpoint is the emulator; unset, it is Google's. The gRPC emulator is reached for real: a
call to the in-process Resource Manager, with no credentials anywhere."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform_v1, bigquery, compute_v1, container_v1, resourcemanager_v3, storage

from components.cloud.credentials import AccessError, google_client

ENV = "TPUPIPE_TEST_EMULATOR_HOST"
EMULATOR = "http://127.0.0.1:8089"
VERTEX = "us-east5-aiplatform.googleapis.com"


def endpoint(client) -> str:
    """Where a client sends its calls, as the client library says it."""
    if isinstance(client, bigquery.Client):  # BigQuery's client names its endpoint on its connection alone
        return client._connection.API_BASE_URL
    return client.api_endpoint


def kind(client) -> str | None:
    """The GAPIC transport a client speaks (``grpc``, ``rest``); None for a client that is not GAPIC (REST alone)."""
    return client.transport.kind if hasattr(client, "transport") else None


# class, the factory's arguments, Google's endpoint and transport, the emulator's transport
SHAPES = {
    "gRPC": (container_v1.ClusterManagerClient, {}, "container.googleapis.com", "grpc", None),
    "REST alone": (compute_v1.NetworksClient, {}, "compute.googleapis.com", "rest", "rest"),
    "gRPC, REST emulator": (
        aiplatform_v1.PipelineServiceClient,
        {"endpoint": VERTEX, "emulator_transport": "rest"},
        VERTEX,
        "grpc",
        "rest",
    ),
    "REST": (aiplatform_v1.ModelServiceClient, {"endpoint": VERTEX, "transport": "rest"}, VERTEX, "rest", "rest"),
    "storage": (storage.Client, {"project": "p"}, "https://storage.googleapis.com", None, None),
    "bigquery": (bigquery.Client, {"project": "p"}, "https://bigquery.googleapis.com", None, None),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_without_the_variable_the_client_goes_to_google(shape, monkeypatch):
    cls, args, google, transport, _ = SHAPES[shape]
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    client = google_client(cls, ENV, creds=AnonymousCredentials(), **args)
    assert isinstance(client, cls)
    assert endpoint(client).removeprefix("https://") == google.removeprefix("https://")
    assert kind(client) == transport


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "gRPC"])
def test_with_a_rest_emulator_its_url_is_the_endpoint(shape, monkeypatch):
    cls, args, _, _, transport = SHAPES[shape]
    monkeypatch.setenv(ENV, EMULATOR)
    client = google_client(cls, ENV, creds=AnonymousCredentials(), **args)
    assert endpoint(client) == EMULATOR
    assert kind(client) == transport


def test_with_a_grpc_emulator_the_calls_reach_it_in_plaintext_without_credentials(monkeypatch, tmp_path):
    from tests.emulators.resourcemanager import ResourceManagerEmulator

    emulator = ResourceManagerEmulator({"tpupipe-emulated": "123456789012"})
    host = emulator.start()
    try:
        # No credentials to be found: Application Default Credentials would raise (AccessError) if they were asked.
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
        monkeypatch.delenv(ENV, raising=False)
        with pytest.raises(AccessError):
            google_client(resourcemanager_v3.ProjectsClient, ENV)
        monkeypatch.setenv(ENV, host)
        client = google_client(resourcemanager_v3.ProjectsClient, ENV)
        assert client.transport.kind == "grpc"
        assert client.get_project(name="projects/tpupipe-emulated").name == "projects/123456789012"
    finally:
        emulator.stop()


@pytest.mark.parametrize("service", ["bigquery", "storage"])
def test_a_rest_emulator_over_plain_http_never_receives_a_google_credential(service, monkeypatch):
    """With a real-looking Google credential at hand (given, or as Application Default Credentials would be) and no
    emulator token, a REST client to an ``http://`` emulator sends no ``Authorization`` header at all; with the
    emulators' static token, that token alone."""
    from google.api_core.exceptions import NotFound
    from google.oauth2.credentials import Credentials

    from components.cloud import credentials as cloud
    from tests.emulators.bigquery import BigQueryEmulator
    from tests.emulators.storage import StorageEmulator

    real = Credentials(token="ya29.a-real-looking-google-token")  # a made-up value
    monkeypatch.setattr("google.auth.default", lambda **kwargs: (real, "p"))  # what ADC would find
    emulator = BigQueryEmulator() if service == "bigquery" else StorageEmulator({"p": "123"})
    host = emulator.start()
    try:
        monkeypatch.setenv(ENV, host)
        monkeypatch.setenv(cloud.EMULATOR_HOST_ENV, host)
        monkeypatch.delenv(cloud.EMULATOR_TOKEN_ENV, raising=False)
        monkeypatch.delenv(cloud.EMULATOR_TOKEN_URI_ENV, raising=False)
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)

        def call() -> None:
            for creds in (real, None):  # given, and found by credentials()
                if service == "bigquery":
                    with pytest.raises(NotFound):  # the call reaches the emulator, which has no such dataset
                        google_client(bigquery.Client, ENV, creds=creds, project="p").get_dataset("p.d")
                else:
                    with pytest.raises(NotFound):
                        google_client(storage.Client, ENV, creds=creds, project="p").get_bucket("b")

        call()
        assert emulator.authorizations and set(emulator.authorizations) == {None}
        monkeypatch.setenv(cloud.EMULATOR_TOKEN_ENV, "t0ken")
        emulator.authorizations.clear()
        call()
        assert set(emulator.authorizations) == {"Bearer t0ken"}
    finally:
        emulator.stop()


@pytest.mark.parametrize(
    ("client_id", "token_uri", "redirected"),
    [
        ("12345.apps.googleusercontent.com", "http://127.0.0.1:9/token", False),  # the user's own login
        ("tpupipe-emulated.apps.googleusercontent.com", "http://127.0.0.1:9/token", True),  # the emulated project's
        ("tpupipe-emulated.apps.googleusercontent.com", "http://tokens.example.com/token", False),  # not this machine
    ],
)
def test_only_the_emulated_login_is_refreshed_at_an_emulated_token_endpoint(
    client_id, token_uri, redirected, monkeypatch
):
    """Emulator variables left set in a shell must not send a user's refresh token and client secret to the emulated
    token endpoint over plain HTTP: only the emulated project's own OAuth client is refreshed there (and only on this
    machine); anything else keeps Google's token endpoint and reaches an emulator anonymously."""
    from google.oauth2.credentials import Credentials

    from components.cloud import credentials as cloud

    found = Credentials(  # type: ignore[no-untyped-call]
        token=None,
        refresh_token="r",
        client_id=client_id,
        client_secret="s",
        token_uri="https://oauth2.googleapis.com/token",
    )
    monkeypatch.setattr("google.auth.default", lambda **kwargs: (found, "p"))
    monkeypatch.setenv(cloud.EMULATOR_HOST_ENV, "http://127.0.0.1:9")
    monkeypatch.setenv(cloud.EMULATOR_TOKEN_URI_ENV, token_uri)
    monkeypatch.delenv(cloud.EMULATOR_TOKEN_ENV, raising=False)
    creds = cloud.credentials()
    sent = cloud.emulator_credentials()
    if redirected:
        assert creds.token_uri == token_uri and sent is not None and getattr(sent, "client_id", None) == client_id
    else:
        assert creds.token_uri == "https://oauth2.googleapis.com/token"
        assert isinstance(sent, AnonymousCredentials)
