"""An emulated project (tests/emulators/project.py) with the emulated Kubeflow Pipelines API server beside it
(tests/emulators/kfp.py), this tree's components image in its Artifact Registry, and ``tpupipe`` to call in this
process (``main``: its exit code, stdout and stderr)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.emulators.project import PROJECT, REGION

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Kfp:
    project: object
    server: object  # the KfpEmulator

    @property
    def host(self) -> str:
        return self.server.endpoint


def start_kfp(project, tmp_path: Path, python_bin: Path | None = None, published: bool = True):
    """The KFP API server of the project: its tasks get the project's emulators in their environment and run in
    ``python_bin`` (default: this interpreter's environment); with ``published``, the components image of this tree
    is in Artifact Registry, as after `tpupipe publish` (which also makes the run bucket: without it, a test
    publishes)."""
    from components.cloud.build import image_tag
    from pipelines.pipeline import PIPELINE_IMAGE, Target
    from tests.emulators.kfp import KfpEmulator

    if published:
        project.registry.push(
            Target(project=PROJECT, region=REGION).image(image_tag(PIPELINE_IMAGE)), "sha256:" + "cd" * 32
        )
    # The tasks import this source tree's components, as its components image holds them (an environment built
    # elsewhere may hold another tree's).
    env = {**project.env, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}
    server = KfpEmulator(project.storage, project.registry, env, python_bin or Path(sys.executable).parent, tmp_path)
    server.backoff_scale = 0.01
    server.grace_s = 5.0
    server.start()
    project.extras.append(server)
    return Kfp(project, server)


@pytest.fixture
def kfp(project_factory, tmp_path):
    return start_kfp(project_factory(polls_to_done=1), tmp_path)


@pytest.fixture
def tpupipe(capsys):
    """``tpupipe(*args)``: (exit code, stdout, stderr) of the command line run in this process."""
    from pipelines.cli.main import main

    def call(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        out = capsys.readouterr()
        return code, out.out, out.err

    return call
