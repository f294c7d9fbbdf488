"""Ray's token authentication is verified, never trusted: after deploy a request through the API server's service
proxy that carries no Ray token must be refused (401), else the run fails closed before any job is sent; and the job
client is never made without the cluster's token. Against the emulated project (the cluster's Jobs API emulated
behind the proxy), through the real kubernetes client and Ray's JobSubmissionClient."""

from __future__ import annotations

import pytest

from components.platforms import RunContext
from components.platforms.gke.platform import GkePlatform
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
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = _context(tmp_path, "open")
    gke.provision(ctx)
    with pytest.raises(InfraError, match="^RayCluster open answered a request without its Ray token with HTTP 200"):
        gke.deploy_raycluster(ctx)
    assert project.kube.jobs.calls == ["GET /api/jobs"]  # the probe alone: nothing submitted
    gke.teardown(ctx)
    assert project.leftovers("open") == {}


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
