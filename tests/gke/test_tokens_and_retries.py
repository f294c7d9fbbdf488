"""Credentials that expire and an API server that is briefly unavailable, in the fast tier: the gke platform's
Kubernetes and Ray job clients against the emulated project, no Ray cluster. The emulated token issuer
(tests/emulators/tokens.py) mints tokens that live five minutes of a clock that time-machine moves by five minutes at
every read of the train job's log, so the train job of three such periods outlives every token it starts with; the
RayCluster's dashboard is the emulated Jobs API (tests/emulators/rayjobs.py) behind the API server's service proxy.
Bursts of 503s are injected at the emulated API server (``KubeEmulator.unavailable``)."""

from __future__ import annotations

import time

import pytest
import time_machine
from kubernetes.client.exceptions import ApiException
from ray.exceptions import AuthenticationError

from components.platforms.gke import GkePlatform
from components.platforms.gke.cloud import kube as gke_kube
from components.platforms.gke.cloud import ray_jobs
from components.platforms.gke.cloud.control_plane import control_plane
from components.platforms.gke.cloud.transient import Backoff
from components.spec import names, protocol
from components.stages import jobs
from tests.emulators.rayjobs import RayJobsEmulator
from tests.gke.test_gke_platform import context

FIVE_MINUTES = 300.0
RESULT = {"final_loss": 1.25, "steps": 3}


def _played(env: dict[str, str]) -> str:
    """What the train job prints: its result record, with the nonce its environment gives it."""
    return protocol.line("result", RESULT, env[protocol.NONCE_ENV]) + "\n"


FAST = Backoff(initial_s=0.05, maximum_s=0.2, budget_s=30.0)


@pytest.fixture
def deployed(tmp_path, project_factory, monkeypatch):
    """(project, ctx, platform): a provisioned run whose RayCluster is ready, its dashboard the emulated Jobs API
    whose train job runs three token lifetimes, tokens that live five minutes."""

    def make(run_id: str, backoff: Backoff = FAST):
        project = project_factory()
        project.kube.ready_without_ray = True
        project.kube.jobs = RayJobsEmulator(duration_s=3 * FIVE_MINUTES, log=_played)
        project.kube.jobs.start()
        project.extras.append(project.kube.jobs)
        project.tokens.lifetime_s = FIVE_MINUTES
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        ctx = context(tmp_path, run_id)
        gke = GkePlatform(log=lambda m: None, poll_s=0.05, backoff=backoff)
        gke.provision(ctx)
        gke.deploy_raycluster(ctx)
        return project, ctx, gke

    return make


def _bearers(project) -> set[str]:
    with project.kube.lock:
        return {h.get("Authorization", "") for _, path, h in project.kube.requests if "/proxy/" in path}


def test_a_train_job_of_three_token_lifetimes_succeeds_with_the_tokens_refreshed(deployed):
    """Each read of the log comes five minutes after the last: every token the run holds has expired by then."""
    project, ctx, _ = deployed("expiring")
    before = len(project.kube.statuses)  # deploy's own 401: the Ray cluster refusing a request without its token
    with time_machine.travel(time.time(), tick=True) as clock:
        done = jobs.run_job(ctx, "train", "python -m trainers.train", 600, sleep=lambda s: clock.shift(FIVE_MINUTES))
    assert done["result"] == RESULT
    assert project.kube.jobs.jobs[names.job_submission_id(ctx.run_id, "train")]["status"] == "SUCCEEDED"
    assert len(_bearers(project)) >= 4  # a new token for each period, and the first
    with project.kube.lock:
        assert not [s for s in project.kube.statuses[before:] if s[2] == 401]
        # The Ray job client too goes through the cluster's DNS-based endpoint (tests/gke/test_control_plane.py).
        assert {h.get("Host") for _, _, h in project.kube.requests} == {project.kube.dns_endpoint}


def test_with_the_refresh_disabled_the_same_job_is_refused_401_once_its_token_expires(deployed):
    """The clients as they were (one token, taken once): the API server refuses it five minutes on."""
    project, ctx, gke = deployed("static")
    kube, cluster, token = gke.clients.kube(ctx)
    kube.api.configuration.refresh_api_key_hook = None  # the bearer token as set when the client was made
    first = token()
    ray_token = kube.secret(names.ray_token_secret(ctx.run_id))[gke_kube.RAY_TOKEN_KEY]
    client = ray_jobs.job_client(
        control_plane(cluster),
        ctx.run_dir / "gke",
        kube.namespace,
        names.raycluster(ctx.run_id),
        lambda fresh=False: first,  # never refreshed
        ray_token,
        log=lambda m: None,
        backoff=FAST,
    )
    with time_machine.travel(time.time(), tick=True) as clock:
        submission_id = jobs.submit_or_attach(client, ctx, "train", "python -m trainers.train")
        with pytest.raises(AuthenticationError, match="Authentication required"):
            jobs._poll(
                client,
                submission_id,
                "train",
                jobs._Follow(),
                ctx,
                None,
                time.monotonic() + 600,
                sleep=lambda s: clock.shift(FIVE_MINUTES),
            )
        with pytest.raises(ApiException) as refused:
            kube.get("RayCluster", names.raycluster(ctx.run_id))
    assert refused.value.status == 401
    assert "expired" in project.tokens.refused
    with project.kube.lock:
        assert [s for s in project.kube.statuses if s[2] == 401]


def test_the_kubernetes_client_refreshes_its_token_through_its_hook(deployed):
    project, ctx, gke = deployed("hook")
    kube, _, _ = gke.clients.kube(ctx)
    name = names.raycluster(ctx.run_id)
    seen = set()
    with time_machine.travel(time.time(), tick=True) as clock:
        for _ in range(3):
            clock.shift(FIVE_MINUTES)
            assert kube.get("RayCluster", name)["status"]["state"] == "ready"
            seen.add(kube.api.configuration.api_key["authorization"])
    assert len(seen) == 3 and "expired" not in project.tokens.refused


def test_a_burst_of_503s_during_readiness_is_retried_and_the_cluster_becomes_ready(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    ctx = context(tmp_path, "burst")
    logs = []
    gke = GkePlatform(log=logs.append, poll_s=0.05, backoff=FAST)
    gke.provision(ctx)
    project.kube.unavailable(
        4,
        when=lambda method, path: (
            method == "GET" and path.endswith(("/rayclusters/" + names.raycluster(ctx.run_id), "/pods"))
        ),
    )
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    assert project.kube.burst["answered"] == 4
    assert any("ApiException 503" in line and "retrying with backoff" in line for line in logs)
    gke.teardown(ctx)
    assert project.leftovers("burst") == {}


def test_a_burst_of_503s_while_train_polls_the_job_is_retried_and_the_job_succeeds(deployed):
    project, ctx, _ = deployed("pollburst")
    logs = f"/api/jobs/{names.job_submission_id(ctx.run_id, 'train')}/logs"
    project.kube.unavailable(2, when=lambda method, path: path.endswith(logs))
    with time_machine.travel(time.time(), tick=True) as clock:
        done = jobs.run_job(ctx, "train", "python -m trainers.train", 600, sleep=lambda s: clock.shift(FIVE_MINUTES))
    assert done["result"] == RESULT
    assert project.kube.burst["answered"] == 2


def test_past_the_deadline_a_transient_error_is_one_clear_error(deployed):
    project, ctx, gke = deployed("down", backoff=Backoff(initial_s=0.05, maximum_s=0.1, budget_s=0.5))
    kube, _, _ = gke.clients.kube(ctx)
    project.kube.unavailable(1000)
    started = time.monotonic()
    with pytest.raises(Exception, match=r"still failing after \d+s of retries: ApiException 503"):
        kube.get("RayCluster", names.raycluster(ctx.run_id))
    assert time.monotonic() - started < 5


def test_a_submission_whose_answer_was_lost_is_retried_and_attaches_to_the_job_it_made(deployed):
    project, ctx, _ = deployed("lost")
    project.kube.jobs.lost_answers = 1
    with time_machine.travel(time.time(), tick=True) as clock:
        done = jobs.run_job(ctx, "train", "python -m trainers.train", 600, sleep=lambda s: clock.shift(FIVE_MINUTES))
    assert done["result"] == RESULT
    assert project.kube.jobs.calls.count("POST /api/jobs") == 2 and len(project.kube.jobs.jobs) == 1
