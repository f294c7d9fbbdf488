"""The platform interface every stage runs against, and the run context the stages share.

A platform turns the stages into real resources: ``local`` (a multi-node Ray cluster of processes on this
machine) now, ``gke`` (GKE + KubeRay) behind the same methods. Every resource a run creates is named from the
run id, so teardown can find it without any other stage's output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from components.spec import RunSpec, SpecError

RUN_ID_MAX = 40
TRAINER_IMAGES = {"fsdp": "torch", "maxtext": "maxtext"}  # workload -> images/<name>


def trainer_image(spec: RunSpec) -> str:
    return TRAINER_IMAGES[spec.train.workload]


def run_id_from(explicit: str, job_name: str) -> str:
    """The run id: the explicit one if given, else derived from the pipeline job name. A DNS-1035 label
    (lowercase letters, digits, '-'; starts with a letter; at most 40 characters) so every resource name
    derived from it is valid everywhere."""
    raw = explicit or job_name
    rid = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")
    if not rid:
        raise SpecError("run_id", "empty: give a run id or run inside a pipeline job")
    if not rid[0].isalpha():
        rid = "r-" + rid
    if len(rid) > RUN_ID_MAX:
        import hashlib

        digest = hashlib.sha256(raw.encode()).hexdigest()[:6]
        rid = rid[: RUN_ID_MAX - 7].rstrip("-") + "-" + digest
    if explicit and rid != explicit:
        raise SpecError("run_id", f"{explicit!r} is not a DNS-1035 label of at most {RUN_ID_MAX} characters; "
                                  f"for example {rid!r}")
    return rid


@dataclass(frozen=True)
class RunContext:
    spec: RunSpec
    run_id: str
    run_dir: Path
    platform: str

    @property
    def stages_dir(self) -> Path:
        return self.run_dir / "stages"

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"


class Platform(Protocol):
    name: str

    def check(self, ctx: RunContext) -> None:
        """Platform-specific spec checks; raise SpecError before anything is created."""

    def provision(self, ctx: RunContext) -> dict[str, Any]: ...

    def build_image(self, ctx: RunContext) -> dict[str, Any]: ...

    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]: ...

    def job_client(self, ctx: RunContext):
        """A ``ray.job_submission.JobSubmissionClient`` for the run's cluster."""

    def job_output_dir(self, ctx: RunContext) -> str:
        """Where the cluster's jobs write checkpoints and data (a path the cluster sees)."""

    def teardown(self, ctx: RunContext) -> dict[str, Any]: ...


PLATFORMS = ("local", "gke")


def get_platform(name: str) -> Platform:
    if name == "local":
        from components.local import LocalPlatform

        return LocalPlatform()
    if name == "gke":
        from components.gke import GkePlatform

        return GkePlatform()
    raise SpecError("platform", f"unknown platform {name!r}", PLATFORMS)
