"""Google credentials for everything that calls Google Cloud (the gke platform, the run store in Cloud Storage,
Vertex AI): Application Default Credentials (the pipeline's service account on Vertex, ``gcloud auth
application-default login`` on a workstation), or, when the emulators are in use, their static token."""

from __future__ import annotations

import os

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
EMULATOR_HOST_ENV = "TPUPIPE_GKE_EMULATOR_HOST"  # set when the tests point the clients at the emulators
EMULATOR_TOKEN_ENV = "TPUPIPE_GKE_EMULATOR_TOKEN"
# Vertex AI's endpoint (http://host:port, REST) with the emulators; unset, the SDK's default for the region.
VERTEX_ENDPOINT_ENV = "TPUPIPE_VERTEX_ENDPOINT"


def credentials():
    token = os.environ.get(EMULATOR_TOKEN_ENV)
    if token and os.environ.get(EMULATOR_HOST_ENV):
        from google.oauth2.credentials import Credentials

        return Credentials(token=token)
    import google.auth

    creds, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    return creds
