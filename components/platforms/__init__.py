"""Platforms: where a run's stages create real resources, behind one interface.

Owns the :class:`Platform` interface every stage runs against, the :class:`RunContext` the stages share, the
registry of platforms (``local``: a multi-node Ray cluster of processes on this machine; ``gke``: GKE + KubeRay),
the one ledger both use to record what a run created (``ledger``), waiting with a deadline (``waiting``), and what
SIGINT and SIGTERM do to a stage (``interrupts``).
A platform package imports ``spec``, ``tpu``, ``workload`` and this package, never another platform.
"""

from __future__ import annotations

import functools
import importlib
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from components.platforms.store import GcsStore, RunStore
from components.spec import InfraError, RunSpec, SpecError

if TYPE_CHECKING:
    from ray.job_submission import JobDetails, JobStatus

    from components.workload.budget import Limits
    from components.workload.cache_trust import Places

# Vertex AI Pipelines gives every task the run's labels as JSON in this variable, its reserved
# vertex-ai-pipelines-run-billing-id among them, for a component to put on the resources it creates, so that they show
# in the run's cost ("Resources generated from user-defined components",
# https://cloud.google.com/vertex-ai/docs/pipelines/gcpc-label-propagation); kfp's own executor reads it to know it
# runs on Vertex AI (kfp/dsl/executor.py).
VERTEX_TASK_ENV = "VERTEX_AI_PIPELINES_RUN_LABELS"
# A Google Cloud label: a key of a lowercase letter then up to 62 lowercase letters, digits, '_' or '-'; a value of up
# to 63 of those (https://cloud.google.com/resource-manager/docs/labels-overview#requirements).
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def vertex_run_labels(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The labels of the Vertex AI pipeline run this process is a task of (none elsewhere), those that are valid
    Google Cloud labels."""
    import json
    import os

    raw = (os.environ if environ is None else environ).get(VERTEX_TASK_ENV) or "{}"
    try:
        given = json.loads(raw)
    except ValueError:
        return {}
    return {
        str(k): str(v)
        for k, v in (given.items() if isinstance(given, dict) else [])
        if _LABEL_KEY.fullmatch(str(k)) and _LABEL_VALUE.fullmatch(str(v))
    }


@dataclass(frozen=True)
class RunContext:
    spec: RunSpec
    run_id: str
    store: RunStore  # where the run's state lives (a local directory, or Cloud Storage): every task sees it
    platform: str

    @functools.cached_property
    def run_dir(self) -> Path:
        """A directory on this machine for this task's own files: the run's directory when the run lives here, else
        a temporary one (nothing a later task needs goes there)."""
        return self.store.local() or Path(tempfile.mkdtemp(prefix=f"tpupipe-{self.run_id}-"))


class RayJobs(Protocol):
    """The calls of the Ray Jobs API the stages make of the run's cluster, as ``ray.job_submission.JobSubmissionClient``
    has them (https://docs.ray.io/en/latest/cluster/running-applications/job-submission/jobs-package-ref.html): what
    :meth:`Platform.job_client` returns."""

    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str | None = None,
        runtime_env: dict[str, Any] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str: ...

    def get_job_info(self, job_id: str) -> JobDetails: ...

    def get_job_status(self, job_id: str) -> JobStatus: ...

    def get_job_logs(self, job_id: str) -> str: ...

    def stop_job(self, job_id: str) -> bool: ...

    def tail_job_logs(self, job_id: str) -> AsyncIterator[str]: ...


class Platform(ABC):
    """What every stage runs against. A platform subclasses it and implements every abstract method (a platform that
    lacks one cannot be instantiated); ``dry_run`` and ``limits`` answer here for a platform that has no dry run or
    bills nothing."""

    name: str

    @abstractmethod
    def check(self, ctx: RunContext) -> None:
        """Platform-specific spec checks; raise SpecError before anything is created."""

    @abstractmethod
    def check_access(self, ctx: RunContext) -> None:
        """The credentials the stages will call the cloud with, found before anything is started (no call made);
        an ``AccessError`` (exit 2) names what is missing. Nothing to find on a platform that calls no cloud."""

    def preflight(self, ctx: RunContext) -> object:
        """Everything of the cloud the run's creations depend on (quota, permissions, APIs...), checked before anything
        is created: what was found, or an error naming every problem. Here: a platform that calls no cloud checks
        nothing more than ``check`` did (None)."""
        return None

    @abstractmethod
    def provision(self, ctx: RunContext) -> dict[str, Any]: ...

    @abstractmethod
    def build_image(self, ctx: RunContext) -> dict[str, Any]: ...

    @abstractmethod
    def deploy_raycluster(self, ctx: RunContext) -> dict[str, Any]: ...

    @abstractmethod
    def job_client(self, ctx: RunContext, deadline: float | None = None) -> RayJobs:
        """A client of the run's cluster's Ray Jobs API with the calls of ``ray.job_submission.JobSubmissionClient``
        the stages make; where the platform retries transient errors, never past ``deadline`` (``time.monotonic()``)."""

    @abstractmethod
    def job_output_dir(self, ctx: RunContext) -> str:
        """Where the cluster's jobs write checkpoints and data (a path the cluster sees)."""

    @abstractmethod
    def compile_cache_root(self, ctx: RunContext) -> str:
        """Where the cluster's jobs keep what outlives a run, compiled programs first (a path the cluster sees,
        ``components.workload.cache``); empty: nothing is kept across runs."""

    def run_cache_root(self, ctx: RunContext) -> str:
        """Where the run's own jobs keep what they produce for the caches, and read the entries staged for them (a
        path the cluster sees, under the run's own directory: ``components.workload.cache_trust``); empty when the
        platform keeps no cache."""
        return ""

    def compile_job_root(self, ctx: RunContext) -> str:
        """Where the run's compile job writes the programs the cache records (a path the cluster sees, under the
        run's own directory: ``components.workload.cache_trust``); empty when the platform keeps no cache."""
        return ""

    def claims_store(self, ctx: RunContext) -> GcsStore | None:
        """Where the run id is claimed beside the resources named from it (``components.stages.claims
        .claim_resources``), when those are named within a place other than the run's output root; None when the
        run's ledger is the only claim it needs."""
        return None

    def cache_places(self, ctx: RunContext) -> Places | None:
        """The compile cache as the pipeline's side reaches it (``components.workload.cache_trust.Places``): the
        cache kept across runs, the training job's directory (``run_cache_root``), the trusted manifests and the
        compile job's directory (``compile_job_root``); None when the platform keeps no cache."""
        return None

    @abstractmethod
    def checkpoint_uri(self, ctx: RunContext, path: str) -> str:
        """Where a path the jobs wrote lives for everyone else (a local path, or gs://BUCKET/...)."""

    @abstractmethod
    def checkpoint_path(self, ctx: RunContext, uri: str) -> str:
        """The inverse of ``checkpoint_uri``: a checkpoint's path as the cluster's jobs see it (a registered version
        the run starts from or measures); SpecError when the cluster cannot read it."""

    @abstractmethod
    def checkpoint_versions(self, ctx: RunContext, uri: str) -> dict[str, str]:
        """Every file of the checkpoint ``uri`` (its name under it) and what pins the bytes it holds now: its
        object generation on Cloud Storage, its sha256 on this machine. What the evaluate stage records of the
        checkpoint it measured, and what ``keep_registered`` copies exactly."""

    @abstractmethod
    def keep_registered(self, ctx: RunContext, uri: str, model: str, versions: dict[str, str]) -> str:
        """A copy of the trained checkpoint ``uri`` (under the run's own prefix, which its pods write) where no run's
        pods can write, made by the pipeline's side before the version is registered: the copy's uri, what the
        registry's ``artifact_uri`` names. The copy holds exactly the files of ``versions`` with exactly those
        versions (``checkpoint_versions`` as the evaluate stage read them): a file changed or gone since is an
        :class:`InfraError` naming it, and nothing is registered. The same copy again for a retried register."""

    @abstractmethod
    def registry_place(self, ctx: RunContext) -> dict[str, str]:
        """Where the run's models are registered: ``components.registry.open_registry``'s arguments (a local
        directory's root, or a Google Cloud project and region)."""

    @abstractmethod
    def hosts_lost(self, ctx: RunContext) -> int | None:
        """Hosts the run lost and had replaced while it ran (preempted or failed), or None when the platform does
        not count them."""

    def hub_token(self, ctx: RunContext) -> str | None:
        """The Hugging Face token the platform keeps for the run's pods, as this process may read it (a gke run's
        Secret Manager secret, ``gke.hf_token_secret``); None where the platform keeps none (the local platform's
        jobs read this process's environment)."""
        return None

    def no_internet(self, ctx: RunContext) -> str | None:
        """Why the run's jobs cannot reach the internet (a gke cluster the run creates with private nodes and no Cloud
        NAT), None where they may. Here: they may."""
        return None

    def evicted(self, ctx: RunContext) -> str | None:
        """Why the run's cluster was taken from it while its jobs ran, to be given back when capacity frees again (on
        gke, with ``gke.queue``: Kueue evicted its RayCluster; Kueue's reason), the jobs on it gone; None where that
        does not happen, or did not. Here: never."""
        return None

    def wait_to_run_again(self, ctx: RunContext) -> dict[str, Any]:
        """After ``evicted``: wait until the run's cluster is given back and ready, within the run's deadline
        (``run.deadline_h``; an InfraError naming it when the deadline passes first). Returns its waits, not billed:
        ``queue_wait`` and ``capacity_wait`` ((since, until) epoch seconds, or None), and ``ready_at``. Only a platform
        whose ``evicted`` answers has it."""
        raise InfraError(f"the {self.name} platform never takes a run's cluster back: nothing to wait for")

    def limits(self, ctx: RunContext) -> Limits:
        """The budget and deadline the run is held to while it waits on its jobs (``components.workload.budget``): the
        spec's, else this platform's defaults, with the hourly price its spending is counted at. Here: the spec's
        alone, nothing billed; a platform that bills overrides it."""
        from components.workload import budget

        return budget.limits(ctx.spec, None)

    @abstractmethod
    def teardown(self, ctx: RunContext) -> dict[str, Any]:
        """Delete what the run created, found from its ledger and its labels; safe to run again."""

    def release(self, ctx: RunContext) -> list[str]:
        """Start deleting what bills by the hour (a cancelled run's, whose teardown task never runs) without waiting
        for it to go; what was started. Nothing on a platform where nothing bills."""
        return []

    @abstractmethod
    def remaining(self, ctx: RunContext) -> list[str]:
        """What of the run may still exist, as its ledger (and, locally, /proc) says; no cloud call."""

    def dry_run(self, ctx: RunContext, entrypoint: Callable[[str], str]) -> list[str]:
        """The calls the run would make, in order, one line each, creating nothing (``entrypoint(mode)``: the command
        of each job it submits). Only the gke platform has one: elsewhere a SpecError (exit 2) says so."""
        raise SpecError(
            "--dry-run",
            f"the {self.name} platform has no dry run; it creates only processes on this machine (try --platform gke)",
        )


def changed_since_evaluated(uri: str, changed: list[str]) -> InfraError:
    """The refusal to register checkpoint ``uri`` whose files ``changed`` (rewritten, gone) since the evaluate stage
    measured it (``Platform.keep_registered``): its figures are not of the bytes there now."""
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return InfraError(
        f"register: checkpoint {uri} changed after the evaluate stage measured it ({shown}: rewritten or gone since); "
        "nothing registered, its figures are not of the bytes there now: run the pipeline again under a new run id"
    )


# name -> "module:class"; imported on first use so `components` stays cheap to import.
REGISTRY = {
    "local": "components.platforms.local.platform:LocalPlatform",
    "gke": "components.platforms.gke:GkePlatform",
}
PLATFORMS = tuple(REGISTRY)


def get_platform(name: str) -> Platform:
    if name not in REGISTRY:
        raise SpecError("platform", f"unknown platform {name!r}", PLATFORMS)
    module, _, cls = REGISTRY[name].partition(":")
    platform: Platform = getattr(importlib.import_module(module), cls)()  # a class of REGISTRY: a Platform
    return platform
