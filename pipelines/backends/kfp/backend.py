"""The open-source Kubeflow Pipelines backend behind the ``Backend`` interface: runs and recurring runs through
``kfp.Client`` (``jobs``), the runner's Google identity checked before a run is created (``identity``), their answers
in the interface's shape. Bad input exits 2 before any call; an API server that cannot be reached or refuses exits 1,
in one line."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from components.spec import SpecError
from components.spec.names import EXAMPLE_PROJECT
from pipelines.backends.base import Backend, Outcome, RunRow, ScheduleRow, Shown, Submission, Submitted
from pipelines.backends.kfp import identity, jobs
from pipelines.backends.vertex import jobs as vertex

if TYPE_CHECKING:
    from kfp.client import Client  # no type information: Any to mypy


def _cron(recurring_run: dict[str, Any]) -> str:
    cron: str = ((recurring_run.get("trigger") or {}).get("cron_schedule") or {}).get("cron", "")
    return cron


def warn(message: str) -> None:
    print(f"tpupipe: warning: {message}", file=sys.stderr)


class KfpBackend(Backend):
    name = "kfp"
    schedule_noun = "recurring run"

    def __init__(self, place: jobs.Place, service_account: str = "", runner: str = "") -> None:
        """``service_account``: the Google service account the KFP runner acts as by Workload Identity (checked
        before a run is created when named); ``runner``: that runner's Kubernetes service account ("": the run's
        ``--service-account``, else the server's default runner: ``identity.runner``)."""
        jobs.check_place(place)  # bad input, before any call
        self.place, self.service_account, self.runner = place, service_account, runner
        self._client: Client | None = None

    def client(self) -> Client:
        if self._client is None:
            self._client = jobs.client(self.place)
        return self._client

    def run_project(self, given: str, preset: str, overrides: str) -> str:
        """--project, else the spec's gke.project (``--set gke.project=...``)."""
        if given and given != EXAMPLE_PROJECT:
            return given
        from components.workload import resolve

        project = resolve(preset, overrides).gke.project
        if not project:
            raise SpecError("--project", "required with --kfp-host: --project PROJECT or --set gke.project=PROJECT")
        return project

    def _checked(self, sub: Submission, scheduled: bool = False) -> None:
        """The input (``--service-account`` is the Kubernetes service account the run's pods run as), then the KFP
        runner's Google identity when named (else a warning that it is not checked)."""
        vertex.check(sub, scheduled)
        runner = identity.runner(sub.service_account, self.runner)
        if not self.service_account:
            warn("the KFP runner's Google identity is not checked: name it with --kfp-service-account")
            return
        if not runner:  # the server's default runner: on a multi-user server, the profile's
            multi_user = bool(self.client().get_kfp_healthz(sleep_duration=0).multi_user)
            runner = identity.MULTI_USER_RUNNER if multi_user else identity.DEFAULT_RUNNER
        identity.check(sub.project, self.service_account, self.place.namespace, runner, warn)

    def submit(self, sub: Submission, publish_first: bool = False) -> Submitted:
        self._checked(sub)
        kfp_run, run_id = jobs.submit(sub, self.place, publish_first=publish_first)
        return Submitted(
            handle=kfp_run, url=jobs.run_url(self.place, kfp_run), named=f"run {kfp_run}", detail=f"(run id {run_id})"
        )

    def follow(self, run: Submitted) -> Outcome:
        job = jobs.follow(self.client(), run.handle)
        return Outcome(
            state=str(job["state"]).lower(),
            succeeded=job["state"] == jobs.STATES["succeeded"],
            failing=vertex.failing_stage(job),
        )

    def schedule_create(
        self, sub: Submission, name: str, cron: str, max_concurrent: int, start: str, end: str, max_runs: int
    ) -> tuple[str, str]:
        if max_runs:
            raise SpecError("--max-runs", "Kubeflow Pipelines' recurring runs take no run count: use --end")
        self._checked(sub, scheduled=True)
        made = jobs.schedule_create(sub, self.place, name, cron, max_concurrent, start, end)
        return made, jobs.kfp_cron(cron)

    def schedules(self) -> list[ScheduleRow]:
        return [
            ScheduleRow(r["display_name"], r.get("status", ""), _cron(r))
            for r in jobs.recurring_runs(self.client(), self.place)
        ]

    def schedule_action(self, name: str, action: str) -> None:
        jobs.schedule_action(self.client(), self.place, name, action)

    def runs(self, preset: str = "", state: str = "") -> list[RunRow]:
        return [
            RunRow(
                id=run["run_id"],
                state=run.get("state", ""),
                created=str(run.get("created_at") or "")[:19],
                preset=((run.get("runtime_config") or {}).get("parameters") or {}).get("preset", ""),
                display_name=run.get("display_name", ""),
            )
            for run in jobs.runs(self.client(), self.place, preset, state)
        ]

    def show(self, run: str) -> Shown:
        shown = jobs.show(self.client(), run)
        return Shown(
            name=shown["name"],
            display_name=shown["display_name"],
            state=shown["state"],
            preset=shown["preset"],
            url=jobs.run_url(self.place, shown["name"]),
            stages=shown["stages"],
        )

    def cancel(self, run: str, timeout_s: float) -> int:
        return jobs.cancel(self.client(), run, timeout_s)
