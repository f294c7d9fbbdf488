"""Schedules on Vertex AI Pipelines (``tpupipe schedule``): a PipelineJobSchedule of the same job ``tpupipe submit``
makes (``pipelines.backends.vertex.jobs``), its cron checked before any call, one run at a time by default.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from components.spec import SpecError
from pipelines.backends.vertex import jobs as vertex
from pipelines.backends.vertex import service_account

if TYPE_CHECKING:
    from google.cloud import aiplatform

CRON = re.compile(r"^((CRON_)?TZ=(?P<tz>[A-Za-z0-9_+\-/]+) )?(?P<fields>\S+( \S+){4})$")
CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$")
CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,127}$")


def check_cron(cron: str) -> None:
    """A Vertex schedule's cron: optional ``TZ=`` / ``CRON_TZ=`` with an IANA zone, then five fields in range."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    match = CRON.match(cron.strip())
    if not match:
        raise SpecError("--cron", f"{cron!r} is not a cron expression", ["TZ=Europe/Paris 0 3 * * 1", "0 3 * * *"])
    if match["tz"]:
        try:
            ZoneInfo(match["tz"])
        except (ZoneInfoNotFoundError, ValueError):
            raise SpecError("--cron", f"unknown time zone {match['tz']!r}", ["an IANA zone: Europe/Paris"]) from None
    for text, (low, high) in zip(match["fields"].split(), CRON_RANGES, strict=True):
        numbers = [int(n) for n in re.findall(r"\d+", re.sub(r"/\d+", "", text))]
        if not CRON_FIELD.match(text) or any(not low <= n <= high for n in numbers):
            raise SpecError("--cron", f"field {text!r} of {cron!r} is out of range {low}-{high}")


def schedule_create(
    sub: vertex.Submission,
    name: str,
    cron: str,
    max_concurrent: int = 1,
    start: str = "",
    end: str = "",
    max_runs: int = 0,
) -> str:
    spec = vertex.check(sub, scheduled=True)
    service_account.refuse_default(sub.service_account, spec.gke.allow_default_identities)
    check_cron(cron)
    if not SCHEDULE_NAME.match(name):
        raise SpecError("NAME", f"{name!r} is not a schedule name (letters, digits, ' ', '_', '.', '-')")
    if max_concurrent < 1:
        raise SpecError("--max-concurrent", f"must be at least 1, got {max_concurrent}")
    template = vertex.published_template(sub)
    vertex.init(sub.project, sub.region)
    # Imported after the checks and the credentials: bad input is answered without the SDK's seconds of import.
    from google.cloud import aiplatform

    if find(name) is not None:
        raise SpecError("NAME", f"a schedule named {name!r} exists already", ["another name"])
    service_account.warn(sub.project, sub.service_account)
    schedule = aiplatform.PipelineJobSchedule(
        pipeline_job=vertex.pipeline_job(sub, template=template), display_name=name
    )
    # max_concurrent_active_run_count limits the runs "in a non-terminal state"; max_concurrent_run_count (required)
    # only the runs being *started* at once (the field docs of google.cloud.aiplatform_v1.types.Schedule): one
    # fine-tune at a time needs the first.
    schedule.create(
        cron=cron,
        max_concurrent_run_count=max_concurrent,
        max_concurrent_active_run_count=max_concurrent,
        start_time=start or None,
        end_time=end or None,
        max_run_count=max_runs or None,
        service_account=sub.service_account or None,
        network=sub.network or None,
    )
    return schedule.resource_name


def find(name: str) -> aiplatform.PipelineJobSchedule | None:
    """The schedule named ``name``, or None."""
    from google.cloud import aiplatform

    found = [s for s in aiplatform.PipelineJobSchedule.list() if s.display_name == name]
    return found[0] if found else None


def schedules() -> list[dict[str, Any]]:
    from google.cloud import aiplatform

    return [s.to_dict() for s in aiplatform.PipelineJobSchedule.list()]


def schedule_action(name: str, action: str) -> None:
    schedule = find(name)
    if schedule is None:
        raise SpecError("NAME", f"no schedule named {name!r}")
    {"pause": schedule.pause, "resume": schedule.resume, "delete": schedule.delete}[action]()
