import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# google-cloud-storage looks a bucket up in the background for its OpenTelemetry spans when OpenTelemetry is installed
# (google-cloud-aiplatform brings it): calls no test asked for, which the emulators' call lists would count.
os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")


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
