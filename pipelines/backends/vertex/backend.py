"""The Vertex AI Pipelines backend behind the ``Backend`` interface: pipeline jobs (``jobs``), schedules
(``schedules``) and the cancel that tears a run down (``stopping``), their answers in the interface's shape."""

from __future__ import annotations

from pipelines.backends.base import Backend, Outcome, RunRow, ScheduleRow, Shown, Submission, Submitted
from pipelines.backends.vertex import jobs, schedules

PREFIX = "PIPELINE_STATE_"  # a job's state is PIPELINE_STATE_<STATE> (google.cloud.aiplatform_v1.types.PipelineState)


class VertexBackend(Backend):
    name = "vertex"

    def __init__(self, project: str, region: str):
        self.project, self.region = project, region
        self._ready = False

    def _init(self) -> None:
        """The project checked and the SDK set up for it, once, before the first call that is not a submission
        (which checks its own)."""
        if not self._ready:
            jobs.check_place(self.project)
            jobs.init(self.project, self.region)
            self._ready = True

    def submit(self, sub: Submission, publish_first: bool = False) -> Submitted:
        name = jobs.submit(sub, publish_first=publish_first)
        return Submitted(handle=name, url=jobs.console_url(name), named=name)

    def follow(self, run: Submitted) -> Outcome:
        job = jobs.follow(run.handle)
        return Outcome(
            state=job["state"].removeprefix(PREFIX).lower(),
            succeeded=job["state"] == jobs.STATES["succeeded"],
            failing=jobs.failing_stage(job),
        )

    def schedule_create(
        self, sub: Submission, name: str, cron: str, max_concurrent: int, start: str, end: str, max_runs: int
    ) -> tuple[str, str]:
        return schedules.schedule_create(sub, name, cron, max_concurrent, start, end, max_runs), cron

    def schedules(self) -> list[ScheduleRow]:
        self._init()
        return [
            ScheduleRow(s["displayName"], s["state"], s.get("cron", ""), int(s.get("startedRunCount", 0)))
            for s in schedules.schedules()
        ]

    def schedule_action(self, name: str, action: str) -> None:
        self._init()
        schedules.schedule_action(name, action)

    def runs(self, preset: str = "", state: str = "") -> list[RunRow]:
        self._init()
        return [
            RunRow(
                id=job["name"].rsplit("/", 1)[-1],
                state=job.get("state", "").removeprefix(PREFIX),
                created=job.get("createTime", "")[:19],
                preset=job.get("labels", {}).get(jobs.PRESET_LABEL, ""),
            )
            for job in jobs.runs(preset, state)
        ]

    def show(self, run: str) -> Shown:
        self._init()
        shown = jobs.show(jobs.job_name(run, self.project, self.region))
        return Shown(
            name=shown["name"],
            state=shown["state"],
            preset=shown["preset"],
            url=shown["console"],
            stages=shown["stages"],
            metrics=shown["metrics"],
            cost=shown["cost"],
        )

    def cancel(self, run: str, timeout_s: float) -> int:
        from pipelines.backends.vertex import stopping

        self._init()
        return stopping.cancel(jobs.job_name(run, self.project, self.region), timeout_s)
