"""The one interface every backend implements: what ``tpupipe submit``, ``tpupipe schedule …`` and ``tpupipe runs …``
ask of the place a compiled pipeline runs, in one shape whatever the backend, so the command line formats one result
and never asks which backend it holds.

The model is kfp.local's task handler interface (``kfp/local/task_handler_interface.py`` of kfp 2.17.3, the version
pinned, https://pypi.org/project/kfp/2.17.3/; ``sdk/python/kfp/local/`` in kubeflow/pipelines): one class per
runner behind one abstract base, chosen once by the caller (kfp.local's ``task_dispatcher`` maps the runner to its
handler; here ``pipelines.backends.get_backend`` maps a name to its backend), each answering in the interface's own
terms (a ``Status`` there; ``Outcome``, ``RunRow``, ``ScheduleRow``, ``Shown`` here).

An operation a backend does not have is answered by the interface itself: a ``SpecError`` (exit 2, before any call)
naming the backend and what it does instead, so no caller asks with ``hasattr``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.spec import SpecError


@dataclass(frozen=True)
class Submission:
    """What a run is made of, on every backend (the run form's values and where it runs), checked before any call."""

    preset: str
    overrides: str
    project: str
    region: str
    pipeline_root: str
    template: str = ""  # a compiled file or an Artifact Registry template URL; empty: compile now
    service_account: str = ""
    network: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    run_id: str = ""
    dataset: str = ""  # the run form's dataset parameter: the examples instead of the preset's; "" for the preset's

    @property
    def resolved_overrides(self) -> str:
        """The overrides every task resolves the spec with: the run form's dataset last, as the components apply it
        (``components.stages.component.with_target``)."""
        from components.stages.component import with_target

        return with_target(self.overrides, "", "", self.dataset)


@dataclass(frozen=True)
class Submitted:
    """A submitted run: ``handle`` is what ``follow``, ``show`` and ``cancel`` take (a Vertex AI job's resource name, a
    KFP run's id); ``named`` how the output names it; ``detail`` what follows its name once, when submitted."""

    handle: str
    url: str
    named: str
    detail: str = ""


@dataclass(frozen=True)
class Outcome:
    """How a run ended: its state in lower case, whether it succeeded, its first failing stage with its error."""

    state: str
    succeeded: bool
    failing: str = ""


@dataclass(frozen=True)
class RunRow:
    """One run of ``tpupipe runs list``; ``display_name`` where the backend's run id is not the job id (KFP)."""

    id: str
    state: str
    created: str  # UTC, to the second
    preset: str
    display_name: str | None = None


@dataclass(frozen=True)
class ScheduleRow:
    """One schedule of ``tpupipe schedule list``; ``runs`` where the backend counts the runs it started."""

    name: str
    state: str
    cron: str
    runs: int | None = None


@dataclass(frozen=True)
class Shown:
    """A run as ``tpupipe runs show`` prints it; ``metrics`` and ``cost`` where the backend reads them."""

    name: str
    state: str
    preset: str
    url: str
    stages: list[tuple[str, str]]
    display_name: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # the metrics artifacts' metadata, as the run wrote them
    cost: dict[str, Any] | None = None


class Backend:
    """Where a compiled pipeline runs. Every method is the interface's answer for a backend that lacks it (a
    ``SpecError`` naming the backend): a backend defines each one it has (tests/unit/test_backend_interface.py)."""

    name: ClassVar[str] = ""
    schedule_noun: ClassVar[str] = "schedule"  # what the backend calls a schedule, as the output names it
    instead: ClassVar[str] = ""  # what to use instead of an operation the backend lacks

    def _lacks(self, what: str) -> SpecError:
        return SpecError(self.name, f"the {self.name} backend has no {what}: {self.instead}")

    def run_project(self, given: str, preset: str, overrides: str) -> str:
        """The project a run of ``preset`` is billed to and keeps its state in, ``given`` by --project."""
        return given

    def submit(self, sub: Submission, publish_first: bool = False) -> Submitted:
        """Submit one run of the submission (its components image published first with ``publish_first``)."""
        raise self._lacks("submission")

    def follow(self, run: Submitted) -> Outcome:
        """Print each stage's state as it changes until the run ends; how it ended."""
        raise self._lacks("run to follow")

    def schedule_create(
        self, sub: Submission, name: str, cron: str, max_concurrent: int, start: str, end: str, max_runs: int
    ) -> tuple[str, str]:
        """A schedule ``name`` of the submission on ``cron``: (its resource name or id, the cron as the backend
        keeps it)."""
        raise self._lacks("schedules")

    def schedules(self) -> list[ScheduleRow]:
        raise self._lacks("schedules")

    def schedule_action(self, name: str, action: str) -> None:
        """pause, resume or delete the schedule ``name``."""
        raise self._lacks("schedules")

    def runs(self, preset: str = "", state: str = "") -> list[RunRow]:
        """tpupipe's runs, newest first, of one preset, in one state."""
        raise self._lacks("runs to list")

    def show(self, run: str) -> Shown:
        raise self._lacks("runs to show")

    def cancel(self, run: str, timeout_s: float) -> int:
        """Stop the run, wait for it to end, tear it down from its ledger; 0 when nothing of it is left."""
        raise self._lacks("runs to cancel")
