"""Where a compiled pipeline runs: ``local`` (kfp.local on this machine: ``tpupipe run``), ``vertex`` (Vertex AI
Pipelines) and ``kfp`` (open-source Kubeflow Pipelines, ``--kfp-host``). Each submits runs, schedules them, lists them
and cancels them behind one interface (``Backend``, in ``base``), made by name here (``get_backend``): the command line
reaches a backend through these alone, and no backend imports another's modules but those its rule names
(tests/unit/test_architecture.py)."""

from __future__ import annotations

import importlib
from typing import Any

from components.spec import SpecError
from pipelines.backends.base import Backend, Outcome, RunRow, ScheduleRow, Shown, Submission, Submitted

# What the command line's flags name of the backends: the KFP place (its auth methods, the runner's default account)
# and the run states `tpupipe runs list --state` takes.
from pipelines.backends.kfp.identity import DEFAULT_RUNNER as KFP_RUNNER
from pipelines.backends.kfp.identity import MULTI_USER_RUNNER as KFP_MULTI_USER_RUNNER
from pipelines.backends.kfp.jobs import AUTHS as KFP_AUTHS
from pipelines.backends.kfp.jobs import Place as KfpPlace
from pipelines.backends.vertex.jobs import STATES as VERTEX_STATES

REGISTRY = {
    "local": "pipelines.backends.local.backend:LocalBackend",
    "vertex": "pipelines.backends.vertex.backend:VertexBackend",
    "kfp": "pipelines.backends.kfp.backend:KfpBackend",
}
BACKENDS = tuple(REGISTRY)

__all__ = [
    "BACKENDS",
    "KFP_AUTHS",
    "KFP_MULTI_USER_RUNNER",
    "KFP_RUNNER",
    "VERTEX_STATES",
    "Backend",
    "KfpPlace",
    "Outcome",
    "RunRow",
    "ScheduleRow",
    "Shown",
    "Submission",
    "Submitted",
    "get_backend",
]


def backend_class(name: str) -> type[Backend]:
    if name not in REGISTRY:
        raise SpecError("backend", f"unknown backend {name!r}", BACKENDS)
    module, _, cls = REGISTRY[name].partition(":")
    found: type[Backend] = getattr(importlib.import_module(module), cls)
    return found


def get_backend(name: str, **place: Any) -> Backend:
    """The backend ``name``, made for ``place`` (its constructor's arguments: a Vertex AI project and region; a KFP
    API server's place and the runner's identity), which it checks before any call."""
    return backend_class(name)(**place)
