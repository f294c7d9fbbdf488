"""Ray's token authentication is verified, never trusted: after deploy a request through the API server's service
proxy that carries no Ray token must be refused (401), else the run fails closed before any job is sent; and the job
client is never made without the cluster's token. Against the emulated project (the cluster's Jobs API emulated
behind the proxy), through the real kubernetes client and Ray's JobSubmissionClient."""

from __future__ import annotations

import base64
import json

import pytest

from components.platforms import RunContext
from components.platforms.gke import GkePlatform
from components.platforms.store import LocalStore
from components.spec import InfraError, names
from components.workload import resolve
from tests.emulators.project import ONE_SLICE

OVERRIDES = ONE_SLICE + " cluster.ready_timeout_s=30"


def _context(tmp_path, run_id: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", OVERRIDES), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _proxied(project, run_id: str) -> list[tuple[str, int]]:
    """(path, status) of the requests to the run's head through the service proxy."""
    prefix = f"/api/v1/namespaces/tpupipe/services/{run_id}-head-svc:dashboard/proxy"
    return [(p.removeprefix(prefix), s) for _, p, s in project.kube.statuses if p.startswith(prefix)]


def secret_values(project, run_id: str) -> dict[str, str]:
    """The run's Secrets as created (name -> the one value each holds, decoded), and so the bodies they came in."""
    found = {}
    for method, path, body in project.kube.bodies:
        if method == "POST" and path.endswith("/secrets") and run_id in body:
            found[json.loads(body)["metadata"]["name"]] = secret_text(body)
    return found


def assert_only_in_their_secrets(project, run_id: str, tokens: list[str], *elsewhere: str) -> None:
    """Each token in one Secret's creation, and, plain or as a Secret's data carries it (base64), in no other request
    to the cluster nor in ``elsewhere`` (logs, the run's records, errors)."""
    created = [b for m, p, b in project.kube.bodies if m == "POST" and p.endswith("/secrets") and run_id in b]
    others = [b for _, _, b in project.kube.bodies if b not in created]
    for token in tokens:
        assert len([b for b in created if token in secret_text(b)]) == 1, "the token's Secret: not once"
        for form in (token, base64.b64encode(token.encode()).decode()):
            assert not [text for text in (*others, *elsewhere) if form in text], f"a token outside its Secret: {form}"


def secret_text(body: str) -> str:
    """A Secret's values, decoded."""
    return "".join(base64.b64decode(v).decode() for v in json.loads(body)["data"].values())


def test_a_cluster_that_refuses_a_request_without_its_token_is_deployed(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    logs = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    ctx = _context(tmp_path, "authed")
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    assert _proxied(project, "authed") == [("/api/jobs/", 401)]
    assert "RayCluster authed: a request without the Ray token is refused (401): token authentication on" in logs
    gke.teardown(ctx)


def test_a_cluster_that_answers_without_its_token_fails_the_run_at_deploy_and_gets_no_job(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.ray_auth_off = True  # the image's Ray runs with token authentication off
    monkeypatch.setenv("HF_TOKEN", "hf_SENTINEL0123456789")
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    ctx = _context(tmp_path, "open")
    gke.provision(ctx)
    refused = "^RayCluster open answered a request without its Ray token with HTTP 200"
    with pytest.raises(InfraError, match=refused) as e:
        gke.deploy_raycluster(ctx)
    assert project.kube.jobs.calls == ["GET /api/jobs"]  # the probe alone: nothing submitted
    gke.teardown(ctx)
    assert project.leftovers("open") == {}
    # The failure path keeps both tokens where they belong: the Hugging Face token and the cluster's Ray token are
    # each in their own Secret (deleted by teardown) and nowhere else.
    secrets = secret_values(project, "open")
    tokens = [secrets[names.hf_token_secret("open")], secrets[names.ray_token_secret("open")]]
    assert tokens[0] == "hf_SENTINEL0123456789" and len(tokens[1]) >= 32
    records = [p.read_text(errors="replace") for p in (tmp_path / "open").rglob("*") if p.is_file()]
    assert_only_in_their_secrets(project, "open", tokens, str(e.value), *logs, *records)


def test_the_job_client_is_never_made_without_the_ray_token(tmp_path, project_factory, monkeypatch):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = _context(tmp_path, "tokenless")
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    client = gke.job_client(ctx)  # with its token: made, and the cluster takes its requests
    assert client.submit_job(entrypoint="true", submission_id="tokenless-probe") == "tokenless-probe"
    kube, _, _ = gke.clients.kube(ctx)
    kube.core.delete_namespaced_secret(names.ray_token_secret("tokenless"), "tpupipe")
    with pytest.raises(InfraError, match="no Ray token for RayCluster tokenless in namespace tpupipe"):
        gke.job_client(ctx)
    gke.teardown(ctx)
    assert project.leftovers("tokenless") == {}


def test_on_kuberay_1_5_the_run_reads_the_token_from_the_secret_kuberay_generates(
    tmp_path, project_factory, monkeypatch
):
    """KubeRay 1.5.1 (the Ray Operator add-on of an older GKE) has authOptions but no secretName: deploy names no
    Secret in the RayCluster and makes no token Secret of its own; KubeRay generates one named after the RayCluster
    and owned by it, which the job client reads. Token authentication is still verified (401 without it), and
    teardown leaves nothing: the generated Secret goes with its RayCluster."""
    project = project_factory()
    project.kube.ready_without_ray = True
    project.kube.kuberay_version = "1.5.1"
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    ctx = _context(tmp_path, "kuberay15")
    gke.provision(ctx)
    gke.deploy_raycluster(ctx)
    assert project.kube.objects[("rayclusters", "tpupipe", "kuberay15")]["spec"]["authOptions"] == {"mode": "token"}
    assert ("secrets", "tpupipe", names.ray_token_secret("kuberay15")) not in project.kube.objects
    generated = project.kube.objects[("secrets", "tpupipe", "kuberay15")]
    assert generated["metadata"]["ownerReferences"][0]["kind"] == "RayCluster"
    assert "KubeRay 1.5 generates the Ray token in Secret kuberay15 with the RayCluster: the run reads it there" in logs
    assert _proxied(project, "kuberay15") == [("/api/jobs/", 401)]
    client = gke.job_client(ctx)  # with the generated token: the cluster takes its requests
    assert client.submit_job(entrypoint="true", submission_id="kuberay15-probe") == "kuberay15-probe"
    gke.teardown(ctx)
    assert project.leftovers("kuberay15") == {}
    assert ("secrets", "tpupipe", "kuberay15") not in project.kube.objects


def test_the_generated_secret_is_named_as_kuberay_shortens_names():
    from components.platforms.gke.cloud.kube import generated_token_secret

    assert generated_token_secret("run-1") == "run-1"
    long = "a" * 3 + "b" * 50
    assert generated_token_secret(long) == "b" * 50  # the last 50 characters
    assert generated_token_secret("x" * 3 + "1" + "c" * 49) == "r" + "c" * 49  # not starting with a digit
    assert generated_token_secret("x" * 3 + "-" + "c" * 49) == "r" + "c" * 49  # nor with punctuation
