"""The emulated project of tests/gke, with Vertex AI Pipelines and the KFP template registry on top
(``project_factory(vertex=True)``)."""

from tests.gke.conftest import project_factory  # noqa: F401 - the fixture, shared
