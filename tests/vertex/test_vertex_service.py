"""``pipelines.vertex`` (what ``tpupipe submit | schedule | runs`` do) against the emulated Vertex AI, with a tiny
pipeline of the same parameters as tpupipe's: no Ray cluster, no training, seconds. Its one task waits for a file the
test writes, so a run stays active as long as the test needs. (No ``from __future__ import annotations`` here: KFP
reads the components' real annotations.)"""

import secrets
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from kfp import compiler, dsl

from components.platforms.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV, VERTEX_ENDPOINT_ENV
from pipelines import vertex
from tests.emulators.artifactregistry import ArtifactRegistryEmulator
from tests.emulators.vertex import TERMINAL, VertexEmulator

PROJECT, REGION = "tpupipe-emulated", "us-east5"
IMAGE = "us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/pipeline:tiny"
PRESET = "gemma4-e2b-v6e-16"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def hold(preset: str) -> str:
    """Wait until the file named by $RELEASE exists (the test's gate), then succeed."""
    import os
    import time

    while not os.path.exists(os.environ["RELEASE"]):
        time.sleep(0.1)
    return preset


@dsl.pipeline(name="tiny")
def tiny(preset: str = PRESET, overrides: str = "", run_id: str = ""):
    """A pipeline of tpupipe's parameters.

    Args:
        preset: The preset.
        overrides: Spec overrides.
        run_id: The run id.
    """
    hold(preset=preset)


@pytest.fixture
def service(tmp_path, monkeypatch):
    """Vertex AI Pipelines, its tasks released by ``service.release``; the template is ``service.template``."""
    token = secrets.token_hex(12)
    registry = ArtifactRegistryEmulator()
    registry.push(IMAGE, "sha256:" + "ab" * 32)
    release = tmp_path / "release"
    emulator = VertexEmulator(
        None,
        registry,
        {"RELEASE": str(release)},
        python_bin=Path(sys.executable).parent,
        workdir=tmp_path,
        token=token,
    )
    endpoint = emulator.start()
    for key, value in ((VERTEX_ENDPOINT_ENV, endpoint), (EMULATOR_HOST_ENV, endpoint), (EMULATOR_TOKEN_ENV, token)):
        monkeypatch.setenv(key, value)
    emulator.template = str(tmp_path / "tiny.yaml")
    compiler.Compiler().compile(tiny, emulator.template)
    emulator.release = release
    vertex.init(PROJECT, REGION)
    yield emulator
    release.touch()
    emulator.stop()


def _submission(service, **fields) -> vertex.Submission:
    return vertex.Submission(
        preset=PRESET,
        overrides="",
        project=PROJECT,
        region=REGION,
        pipeline_root=f"gs://{PROJECT}-tpupipe/pipeline-root",
        template=service.template,
        **fields,
    )


def test_a_schedule_limits_the_runs_not_yet_finished_not_the_runs_started(service):
    """``max_concurrent_active_run_count`` (runs in a non-terminal state), not ``max_concurrent_run_count`` (runs
    being started): a run due while one is still running is skipped."""
    vertex.schedule_create(_submission(service), "weekly", "0 3 * * 1", max_concurrent=1)
    (schedule,) = service.schedules.values()
    assert schedule.resource["maxConcurrentActiveRunCount"] == "1"
    week = timedelta(days=7)
    first = service.advance(service.clock + week)
    assert len(first) == 1
    assert service.advance(service.clock + week) == [] and schedule.skipped == 1  # the first still runs
    service.release.touch()
    assert service.wait(first[0], timeout_s=120)["state"] == "PIPELINE_STATE_SUCCEEDED"
    second = service.advance(service.clock + week)
    assert len(second) == 1 and second != first


def test_without_an_active_run_limit_scheduled_runs_overlap(service):
    """The emulator reads the fields as documented: ``max_concurrent_run_count`` alone limits starts, not runs."""
    from google.cloud import aiplatform

    schedule = aiplatform.PipelineJobSchedule(
        pipeline_job=aiplatform.PipelineJob(
            display_name="tiny",
            template_path=service.template,
            pipeline_root=f"gs://{PROJECT}-tpupipe/pipeline-root",
        ),
        display_name="overlapping",
    )
    schedule.create(cron="0 3 * * 1", max_concurrent_run_count=1)
    week = timedelta(days=7)
    first, second = service.advance(service.clock + week), service.advance(service.clock + week)
    assert len(first) == len(second) == 1
    assert all(service.job(n).resource["state"] not in TERMINAL for n in first + second)
