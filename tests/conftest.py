import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# google-cloud-storage looks a bucket up in the background for its OpenTelemetry spans when OpenTelemetry is installed
# (google-cloud-aiplatform brings it): calls no test asked for, which the emulators' call lists would count.
os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")

# The longest test files of the e2e tier, longest first (minutes of one file on a 2-core machine, measured with
# `make test-e2e`'s --durations): with two processes (--dist loadfile --no-loadscope-reorder, the Makefile's XDIST), a
# long file handed out last would run alone at the end.
LONGEST_FIRST = (
    "tests/e2e/test_local_maxtext.py",  # 13 to 15: two MaxText runs, a lost host then a drain
    "tests/vertex/test_vertex_pipeline.py",  # 6.6: two Vertex AI jobs, each task its own process
    "tests/vertex/test_submit_schedule.py",  # 6.5
    "tests/e2e/test_local_pipeline.py",  # 5.5
    "tests/e2e/test_local_gate.py",  # 4.5: `make run`'s run, then a run from its champion
    "tests/gke/test_gke_pipeline.py",  # 4.2
    "tests/e2e/test_local_drain.py",  # 2.5: an FSDP drain
    "tests/kfp/test_kfp_pipeline.py",  # 3.4 to 4.3 on a loaded 2-core machine: one Kubeflow Pipelines run
    "tests/e2e/test_local_interrupts.py",  # 3.7
    "tests/e2e/test_local_data_loop.py",  # 1.5 to 2: three runs, one skipped
    "tests/vertex/test_stop_between_tasks.py",  # 1.5 to 2
    "tests/gke/test_failover_pipeline.py",  # 1.5 to 2
)


def pytest_collection_modifyitems(config, items):
    """The longest files first, every other test in its collection order (a stable sort)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def project_factory(tmp_path, monkeypatch):
    """``make(**kwargs)``: an emulated project (tests/emulators/project.py), its environment set for this test;
    every project made is stopped afterwards."""
    from tests.emulators.project import start_project

    started = []

    def make(**kwargs):
        project = start_project(tmp_path, **kwargs)
        for key, value in project.env.items():
            monkeypatch.setenv(key, value)
        started.append(project)
        return project

    yield make
    for project in started:
        project.stop()


@pytest.fixture
def vertex(monkeypatch):
    """The emulated Vertex AI Model Registry (ModelService, tests/emulators/models.py) alone, and the environment that
    points tpupipe's clients at it."""
    import secrets

    from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV, VERTEX_ENDPOINT_ENV
    from tests.emulators.models import ModelServiceEmulator

    token = secrets.token_hex(12)
    emulator = ModelServiceEmulator(token=token)
    endpoint = emulator.start()
    monkeypatch.setenv(VERTEX_ENDPOINT_ENV, endpoint)
    monkeypatch.setenv(EMULATOR_HOST_ENV, endpoint)  # credentials(): the emulators' static token
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, token)
    yield emulator
    emulator.stop()


@pytest.fixture(autouse=True)
def _no_driver_left_behind(monkeypatch):
    """A test that runs ``tpupipe run`` in this process leaves the driver's pid in os.environ (the driver sets it for
    its stages, components/platforms/interrupts.DRIVER_ENV): unset it before each test and again after it, so a later
    test's stage never claims a run id as that long-gone driver."""
    from components.platforms.interrupts import DRIVER_ENV

    monkeypatch.setenv(DRIVER_ENV, "")
    monkeypatch.delenv(DRIVER_ENV)
