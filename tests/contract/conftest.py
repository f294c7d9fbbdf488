import pytest

from tests.contract.kuberay_schema import CRD_FILES, SCHEMA_ENV, CrdValidator, schema_dir


@pytest.fixture(scope="session")
def crds() -> CrdValidator:
    """The KubeRay CRDs' validator (tests/contract/kuberay_schema.py), read once."""
    directory = schema_dir()
    missing = [f for f in CRD_FILES.values() if not (directory / f).is_file()]
    assert not missing, f"KubeRay CRD schemas not found: {', '.join(missing)} in {directory} ({SCHEMA_ENV})"
    return CrdValidator(directory)
