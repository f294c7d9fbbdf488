"""A Google Cloud the caller cannot reach as a command needs is one line naming the fix, exit 2, never a traceback:
no credentials at all (every command that calls Google Cloud, run with an empty environment), and the errors Google's
APIs answer with for a project that does not exist, an API not enabled and a permission denied (Google's error
shape, parsed by google-api-core as it parses a real response; and through the real Compute client against the
emulator: an API off is a problem in preflight's report, a project that cannot be reached one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from google.api_core import exceptions as gexc

from components.cloud.credentials import LOGIN, access_error
from pipelines.cli import main as cli
from tests.emulators.project import PROJECT
from tests.gke.test_preflight import V5E_ONE_SLICE, preflight_cli

ROOT = Path(__file__).resolve().parents[2]
# A project id like any other: the placeholder my-project is refused before any call (tests/unit/test_cli_place.py).
# The default identities are allowed: their refusal, bad input before any call too, has tests of its own.
COMMANDS = {
    "preflight": ["preflight", "llama3-8b-v6e-16x2", "--set", f"gke.project={PROJECT}", "--allow-default-identities"],
    "publish": ["publish", "--project", PROJECT, "--allow-default-identities"],
    "submit": ["submit", "llama3-8b-v6e-16x2", "--project", PROJECT, "--allow-default-identities"],
    "schedule": [
        *("schedule", "create", "weekly", "llama3-8b-v6e-16x2", "--cron", "0 3 * * 1", "--project", PROJECT),
        "--allow-default-identities",
    ],
    "runs": ["runs", "list", "--project", PROJECT],
    "janitor": ["janitor", "--project", PROJECT],
    "run": [
        "run",
        "llama3-8b-v6e-16x2",
        "--platform",
        "gke",
        "--set",
        f"gke.project={PROJECT}",
        "--allow-default-identities",
    ],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cloud_command_without_credentials_is_one_line_and_exit_2(command, tmp_path):
    # An empty environment: no GOOGLE_APPLICATION_CREDENTIALS, a HOME and gcloud config with no login, and
    # google-auth told there is no metadata server (its NO_GCE_CHECK) rather than waiting for one.
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "NO_GCE_CHECK": "true",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli.main", *COMMANDS[command]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpupipe: error: no Google Cloud credentials"), done.stderr
    assert f"`{LOGIN}`" in lines[0]


def _google_error(status: int, message: str, reason: str, metadata: dict[str, str]) -> gexc.GoogleAPICallError:
    """The exception google-api-core makes of Google's JSON error (https://cloud.google.com/apis/design/errors)."""
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "status": "PERMISSION_DENIED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": reason,
                        "domain": "googleapis.com",
                        "metadata": metadata,
                    }
                ],
            }
        }
    ).encode()
    response.request = requests.Request("GET", "https://compute.googleapis.com/x").prepare()
    return gexc.from_http_response(response)


@pytest.mark.parametrize(
    "reason, metadata, needles",
    [
        (
            "SERVICE_DISABLED",
            {"service": "compute.googleapis.com", "consumer": "projects/my-project"},
            [
                "the API compute.googleapis.com is not enabled in project my-project",
                "`gcloud services enable compute.googleapis.com --project my-project`",
            ],
        ),
        (
            "CONSUMER_INVALID",
            {"service": "container.googleapis.com", "consumer": "projects/no-such-project"},
            ["project no-such-project does not exist or cannot be reached", "gcloud projects describe no-such-project"],
        ),
        (
            "IAM_PERMISSION_DENIED",
            {"permission": "container.clusters.create", "resource": "projects/my-project"},
            ["permission denied: container.clusters.create on projects/my-project", "--role=ROLE"],
        ),
        ("ACCESS_TOKEN_EXPIRED", {"service": "storage.googleapis.com"}, [f"`{LOGIN}`"]),
    ],
)
def test_google_access_errors_name_what_is_missing_and_the_fix(reason, metadata, needles):
    error = access_error(_google_error(403, "denied", reason, metadata))
    assert error is not None and error.exit_code == 2
    assert "\n" not in str(error)
    for needle in needles:
        assert needle in str(error)


def test_other_errors_are_not_access_errors():
    assert access_error(gexc.ServiceUnavailable("try again")) is None
    assert access_error(ValueError("x")) is None


def test_preflight_in_a_project_that_cannot_be_reached_is_one_line_and_an_api_off_is_a_problem(project_factory, capsys):
    project = project_factory()
    disabled = {"reason": "SERVICE_DISABLED", "domain": "googleapis.com"}
    disabled["metadata"] = {"service": "compute.googleapis.com", "consumer": f"projects/{PROJECT}"}
    project.compute.fail("regions.get", 403, message="Compute Engine API has not been used", info=disabled)
    code, text = preflight_cli(V5E_ONE_SLICE, capsys)
    assert code == 2 and "Traceback" not in text
    assert f"quota: could not be checked: the API compute.googleapis.com is not enabled in project {PROJECT}" in text

    invalid = {"reason": "CONSUMER_INVALID", "domain": "googleapis.com"}
    invalid["metadata"] = {"service": "compute.googleapis.com", "consumer": f"projects/{PROJECT}"}
    project.compute.fail("regions.get", 403, message="Permission denied on resource project", info=invalid)
    code = cli.main(["preflight", "local-fsdp", "--set", V5E_ONE_SLICE, "--run-id", "pre"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"project {PROJECT} does not exist or cannot be reached" in err
    assert project.mutations() == []
