"""Secret Manager: the Hugging Face token a gated model needs, read by deploy_raycluster into the run's Kubernetes
Secret (labelled with the run, deleted by its teardown). The value is returned to the caller and nothing else: never
logged, never a pipeline parameter, never written to the run's state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.cloud.credentials import google_client

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import secretmanager_v1

EMULATOR_HOST_ENV = "TPUPIPE_SECRET_MANAGER_EMULATOR_HOST"


def client(creds: Credentials | None = None) -> secretmanager_v1.SecretManagerServiceClient:
    """A ``SecretManagerServiceClient``: to the emulator named by $TPUPIPE_SECRET_MANAGER_EMULATOR_HOST, else Google."""
    from google.cloud import secretmanager_v1

    return google_client(secretmanager_v1.SecretManagerServiceClient, EMULATOR_HOST_ENV, creds=creds)


def read(name: str, creds: Credentials | None = None) -> bytes:
    """The data of ``projects/P/secrets/NAME[/versions/V]`` (its latest version when none is named)."""
    from google.api_core import exceptions as gexc

    from components.spec import SpecError

    version = name if "/versions/" in name else f"{name}/versions/latest"
    try:
        return client(creds).access_secret_version(name=version).payload.data
    except (gexc.NotFound, gexc.PermissionDenied) as exc:
        raise SpecError(
            "gke.hf_token_secret",
            f"cannot read {version}: {exc.message}",
            ["a secret the pipeline's service account can access (roles/secretmanager.secretAccessor)"],
        ) from None
