"""A recurring run on Kubeflow Pipelines 2.15, 2.16 and 2.17, as each release's v2 backend runs it
(tests/emulators/kfp.py: no macro substituted into a pinned v2 pipeline's parameters, kubeflow/pipelines#12494; the
schedule time verbatim, empty or filled, kubeflow/pipelines#13474): each run starts, derives a valid run id from its
Argo Workflow's name, and reads the drop of the day docs/kubeflow.md says ``{date}`` is on that release."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from components.spec import datasets
from components.spec.names import run_id_from
from tests.emulators.project import PROJECT
from tests.kfp.conftest import start_kfp
from tests.kfp.test_kfp_backend import OVERRIDES, _fail_at_preflight

DROPS = "gs://acme-sft/drops/{date}/"


@pytest.mark.parametrize("version", ["2.15.0", "2.16.0", "2.17.0"])
def test_a_scheduled_run_starts_with_a_valid_run_id_and_its_date_as_documented(
    project_factory, tmp_path, tpupipe, version
):
    from google.cloud import storage

    from components.cloud.credentials import credentials

    kfp = start_kfp(project_factory(polls_to_done=1), tmp_path, version=version)
    _fail_at_preflight(kfp.project)
    for bucket in ("acme-sft", f"{PROJECT}-tpupipe"):  # the data's, and the runs' (`tpupipe publish` makes it)
        storage.Client(project=PROJECT, credentials=credentials()).create_bucket(bucket)
    today = datetime.now(UTC)
    due = (today - timedelta(days=3)).replace(hour=3, minute=0, second=0, microsecond=0)
    for day, count in ((due, 24), (today, 31)):  # the schedule's day and the day the run starts: told apart by size
        # the same instructions whatever the date: 4 and 10 fall in the 10% held out by digest
        rows = "".join(f'{{"instruction": "Say {i}.", "response": "{i}"}}\n' for i in range(count))
        kfp.project.storage.put("acme-sft", f"drops/{day:%Y-%m-%d}/a.jsonl", rows.encode())

    code, out, err = tpupipe(
        *("schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--kfp-host", kfp.host),
        *("--cron", "0 3 * * *", "--dataset", DROPS),
    )
    assert code == 0, out + err
    warned = [line for line in err.splitlines() if "schedule time" in line]
    if version == "2.17.0":
        assert warned == [], err
    else:  # the server cannot fill the schedule time: said once, with what {date} will mean
        (line,) = warned
        assert f"({version})" in line and "the day its snapshot_data task starts" in line, err

    (recurring,) = kfp.server.recurring.values()
    kfp.server.clock = due  # the schedule fires for 03:00 three days ago; the run itself starts now
    fired = kfp.server.fire(recurring.resource["recurring_run_id"])
    run = kfp.server.wait(fired, timeout_s=300)
    workflow = kfp.server.run(fired).resource["workflow"]
    run_id = run_id_from("", workflow)
    # It started: its first task ran under the run id its workflow's name gives, and so did its exit handler.
    assert run["display_name"] == workflow and workflow.startswith("nightly")
    tasks = {t["taskName"]: t["state"] for t in kfp.server.run(fired).tasks}
    assert tasks["snapshot-data"] == "SUCCEEDED" and tasks["teardown"] == "SUCCEEDED", [
        (t["taskName"], t.get("error")) for t in kfp.server.run(fired).tasks
    ]
    states = kfp.project.storage.objects_of(f"{PROJECT}-tpupipe", f"state/{run_id}/stages/")
    assert {key.rsplit("/", 1)[-1] for key in states} >= {"snapshot_data.json", "teardown.json"}
    (manifest,) = [
        json.loads(data)
        for key, data in kfp.project.storage.objects_of(f"{PROJECT}-tpupipe", "state/").items()
        if key.endswith("/data/manifest.json")
    ]
    taken = datetime.fromisoformat(manifest["taken"])
    log = kfp.server.run(fired).logs["snapshot-data"]
    if version == "2.17.0":  # the schedule's day
        assert taken == due and manifest["dataset"] == f"gs://acme-sft/drops/{due:%Y-%m-%d}/"
        assert f"{{date}} is {due:%Y-%m-%d}, from the schedule time" in log
        assert manifest["num_train_examples"] + manifest["num_heldout_examples"] == 24
    else:  # neither time filled: the day the task started
        assert abs(taken - today) < timedelta(minutes=10) and manifest["dataset"].endswith(f"/{taken:%Y-%m-%d}/")
        assert "from this task's start (the runner gave neither a schedule nor a create time)" in log
        if taken.date() == today.date():
            assert manifest["num_train_examples"] + manifest["num_heldout_examples"] == 31


@pytest.mark.parametrize(("version", "expected"), [("2.15.0", None), ("2.16.0", ""), ("2.17.0", "created")])
def test_a_run_no_schedule_started_takes_its_date_from_the_create_time_where_filled(
    project_factory, tmp_path, tpupipe, version, expected
):
    """`submit --kfp-host` with ``{date}``: on 2.17 the job's create time (KFP gives the schedule-time placeholder the
    create time too); before, neither is filled and the task's start is the date, never an empty or verbatim time."""
    from google.cloud import storage

    from components.cloud.credentials import credentials

    kfp = start_kfp(project_factory(polls_to_done=1), tmp_path, version=version)
    _fail_at_preflight(kfp.project)
    for bucket in ("acme-sft", f"{PROJECT}-tpupipe"):  # the data's, and the runs' (`tpupipe publish` makes it)
        storage.Client(project=PROJECT, credentials=credentials()).create_bucket(bucket)
    today = datetime.now(UTC)
    rows = "".join(f'{{"instruction": "Say {i}.", "response": "{i}"}}\n' for i in range(20))
    kfp.project.storage.put("acme-sft", f"drops/{today:%Y-%m-%d}/a.jsonl", rows.encode())
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, "--kfp-host", kfp.host, "--dataset", DROPS)
    assert code == 0, out + err
    kfp_run = out.split("submitted run ", 1)[1].split()[0]
    kfp.server.wait(kfp_run, timeout_s=300)
    log = kfp.server.run(kfp_run).logs["snapshot-data"]
    source = "the schedule time" if expected else "this task's start"
    assert f"{{date}} is {today:%Y-%m-%d}, from {source}" in log, log


def test_a_schedule_of_the_days_own_table_is_created_with_a_warning_line(project_factory, tmp_path, tpupipe):
    """``events_{date:%Y%m%d}`` is the schedule's own day's table, likely still being written when the run reads it:
    the schedule is created, and one warning line says so; ``events_{date-1:%Y%m%d}`` earns none."""
    kfp = start_kfp(project_factory(polls_to_done=1), tmp_path, version="2.17.0")
    tables = (("today", "events_{date:%Y%m%d}", True), ("day-before", "events_{date-1:%Y%m%d}", False))
    for name, table, warned in tables:
        dataset = f"bq://{PROJECT}.events.{table}"
        code, out, err = tpupipe(
            *("schedule", "create", name, "local-fsdp", "--set", OVERRIDES, "--kfp-host", kfp.host),
            *("--cron", "0 3 * * *", "--dataset", dataset, "--data-since", "champion"),  # the project: gke.project
            "--set", "train.dataset_time_column=ingested",
        )  # fmt: skip
        assert code == 0 and f"recurring run {name} created" in out, out + err
        lines = [line for line in err.splitlines() if "the schedule's own day" in line]
        said = datasets.same_day_table(dataset)
        assert said.startswith(f"train.dataset {dataset} is the table of the schedule's own day") == warned
        assert lines == ([f"tpupipe: warning: {said}"] if warned else []), err
