"""The gke platform: GKE, KubeRay and Cloud Build, in four layers; a module's folder says whether it makes calls.

- ``plan/``: what a run creates, derived from the run spec with no call made: where it goes (``target``), the API
  bodies (``resources``, ``compute_resources``, ``manifests``), their records in creation order (``records``,
  ``k8s_records``), the plan with its cost (``document``), what it needs of the project (``needs``), the dry run.
- ``cloud/``: the calls only GKE needs, one adapter per API (``cluster``, ``compute``, ``kube``, ``kueue``,
  ``ray_jobs``), the control-plane endpoint, transient errors, and a run's clients (``clients``); the adapters other
  platforms and backends share (Storage, Cloud Build, IAM, Secret Manager) are ``components.cloud``.
- ``checks/``: read-only checks before anything is spent: ``preflight``, what the location offers, Kubernetes access.
- ``run/``: the stages as walks of the plan (``platform``, ``walk``, ``handlers``, ``deploy``), the RayCluster's
  readiness, ``teardown`` and the ``janitor``.

Imports point down that list's reverse order only: ``run`` may import ``checks``, ``cloud`` and ``plan``; ``checks``
``cloud`` and ``plan``; ``cloud`` ``plan``; ``plan`` none of them (``tests/unit/test_architecture.py``).

The platform itself is :class:`GkePlatform` (``components.platforms.gke.GkePlatform``), imported on first use so that
importing a module of ``plan`` imports no call.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "GkePlatform":
        from components.platforms.gke.run.platform import GkePlatform

        return GkePlatform
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
