"""The emulated Kubeflow Pipelines API server (tests/emulators/kfp.py) through the official kfp.Client: a pipeline
and its versions uploaded, a run of a version in an experiment executed task by task, KFP's placeholders filled in
as its driver fills them, a terminate as KFP's Argo backend does it (the exit handler fails past the deadline, its
command never run), a recurring run fired by its cron on the test clock, one at a time. (No ``from __future__ import
annotations`` here: KFP reads the components' real annotations.)"""

import sys
import warnings
from datetime import timedelta
from pathlib import Path

import pytest
from kfp import compiler, dsl

from tests.emulators.artifactregistry import ArtifactRegistryEmulator
from tests.emulators.kfp import EXIT_DEADLINE, KfpEmulator
from tests.helpers import wait_until

IMAGE = "us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/pipeline:tiny"
ROOT = "gs://tpupipe-emulated-pipeline-root/kfp"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def work(seconds: int, workflow: str, run: str, note: str, scheduled: str) -> str:
    import time

    time.sleep(seconds)
    return f"{workflow} {run} {note} {scheduled}"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def cleanup() -> str:
    return "cleaned up"


@dsl.pipeline(name="tiny")
def tiny(seconds: int = 0, note: str = ""):
    end = cleanup()
    with dsl.ExitHandler(end, name="run"):
        work(
            seconds=seconds,
            workflow=dsl.PIPELINE_JOB_RESOURCE_NAME_PLACEHOLDER,
            run=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
            note=note,
            scheduled=dsl.PIPELINE_JOB_SCHEDULE_TIME_UTC_PLACEHOLDER,
        ).set_caching_options(False)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def point(uri: str, data: dsl.Output[dsl.Dataset]):
    if uri:  # the executor output carries the artifact's uri as the component left it
        data.uri = uri


@dsl.pipeline(name="pointing")
def pointing(uri: str = ""):
    point(uri=uri).set_caching_options(False)


@pytest.fixture
def server(tmp_path):
    """The emulator (its tasks in this interpreter's environment), a kfp.Client of it, the pipeline, its experiment."""
    import kfp

    registry = ArtifactRegistryEmulator()
    registry.push(IMAGE, "sha256:" + "ab" * 32)
    emulator = KfpEmulator(None, registry, {}, python_bin=Path(sys.executable).parent, workdir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = kfp.Client(host=emulator.start())
    package = tmp_path / "tiny.yaml"
    compiler.Compiler().compile(tiny, str(package))
    pipeline = client.upload_pipeline(str(package), "tiny")
    version = client.upload_pipeline_version(str(package), "v2", pipeline_id=pipeline.pipeline_id)
    experiment = client.create_experiment("tpupipe", namespace="kubeflow")
    yield emulator, client, (pipeline.pipeline_id, version.pipeline_version_id), experiment.experiment_id
    emulator.stop()


def _run(client, version, experiment, seconds: int):
    return client.run_pipeline(
        experiment_id=experiment,
        job_name="tiny-run",
        params={"seconds": seconds},
        pipeline_id=version[0],
        version_id=version[1],
        pipeline_root=ROOT,
    )


def test_a_run_of_a_version_executes_and_its_tasks_see_the_workflow_name_and_run_id(server):
    emulator, client, version, experiment = server
    assert client.get_pipeline_id("tiny") == version[0]
    names = [v.display_name for v in client.list_pipeline_versions(version[0]).pipeline_versions]
    assert names == ["tiny", "v2"]  # the upload's first version is named as the pipeline
    run = _run(client, version, experiment, 0)
    ended = emulator.wait(run.run_id, timeout_s=120)
    assert ended["state"] == "SUCCEEDED" and ended["pipeline_version_reference"]["pipeline_version_id"] == version[1]
    states = {d.display_name: d.state for d in client.get_run(run.run_id).run_details.task_details}
    assert states == {run.run_id: "SUCCEEDED", "run": "SUCCEEDED", "work": "SUCCEEDED", "cleanup": "SUCCEEDED"}
    workflow = emulator.run(run.run_id).resource["workflow"]
    assert workflow.startswith("tiny-") and len(workflow) == len("tiny-") + 5
    log = emulator.run(run.run_id).logs["work"]  # the executor input it was given, as the KFP executor logs it
    assert f'"workflow": "{workflow}"' in log and f'"run": "{run.run_id}"' in log, log
    listed = client.list_runs(experiment_id=experiment, namespace="kubeflow").runs
    assert [r.run_id for r in listed] == [run.run_id]


def test_terminate_stops_the_running_task_and_the_exit_handler_fails_past_the_deadline_unrun(server):
    emulator, client, version, experiment = server
    emulator.grace_s = 2.0
    run = _run(client, version, experiment, 60)
    wait_until(lambda: emulator.run(run.run_id).running, 60, "the work task to start", 0.2)
    client.terminate_run(run.run_id)
    assert client.get_run(run.run_id).state in ("CANCELING", "CANCELED")
    ended = emulator.wait(run.run_id, timeout_s=60)
    assert ended["state"] == "CANCELED"
    details = {d.display_name: d for d in client.get_run(run.run_id).run_details.task_details}
    assert details["work"].state == "CANCELED" and [t for t, _ in emulator.terminated] == ["work"]
    assert details["cleanup"].state == "FAILED" and details["cleanup"].error.message == EXIT_DEADLINE
    assert "cleanup" not in emulator.run(run.run_id).logs  # its command never ran
    with pytest.raises(Exception, match="400"):
        client.terminate_run(run.run_id)  # it has ended


def test_a_recurring_run_fires_on_its_cron_one_at_a_time_and_can_be_disabled(server):
    emulator, client, version, experiment = server
    recurring = client.create_recurring_run(
        experiment,
        "nightly",
        cron_expression="0 0 3 * * *",
        params={"seconds": 30},
        pipeline_id=version[0],
        version_id=version[1],
        pipeline_root=ROOT,
    )
    assert client.get_recurring_run(recurring.recurring_run_id).status == "ENABLED"
    started = emulator.advance(emulator.clock + timedelta(days=2))  # two 03:00s: the second finds the first active
    assert len(started) == 1 and emulator.recurring[recurring.recurring_run_id].skipped == 1
    assert emulator.run(started[0]).resource["recurring_run_id"] == recurring.recurring_run_id
    emulator.grace_s = 2.0
    wait_until(lambda: emulator.run(started[0]).running, 60, "the fired run's task to start", 0.2)
    client.terminate_run(started[0])
    emulator.wait(started[0], timeout_s=60)
    client.disable_recurring_run(recurring.recurring_run_id)
    assert emulator.advance(emulator.clock + timedelta(days=1)) == []
    client.enable_recurring_run(recurring.recurring_run_id)
    fired = emulator.fire(recurring.recurring_run_id)
    assert emulator.run(fired).scheduled  # the schedule time its tasks' placeholder reads
    wait_until(lambda: emulator.run(fired).running, 60, "the fired run's task to start", 0.2)
    client.terminate_run(fired)
    emulator.wait(fired, timeout_s=60)


@pytest.mark.parametrize(
    ("release", "scheduled"),
    [("2.15.0", "{{$.pipeline_job_schedule_time_utc}}"), ("2.16.0", ""), ("2.17.0", "2026-12-01T03:00:00Z")],
)
def test_a_recurring_runs_run_gets_its_parameters_unformatted_and_the_schedule_time_of_its_release(
    server, release, scheduled
):
    """A v2 pipeline pinned to a version: [[RunUUID]] reaches the task as text (kubeflow/pipelines#12494); the run is
    displayed as its workflow, ``<ScheduledWorkflow>-<index>-<FNV-32a>``; the schedule-time placeholder is verbatim on
    2.15, empty on 2.16, the schedule's time on 2.17; healthz says the release."""
    from datetime import UTC, datetime

    from pipelines.backends.kfp import jobs as kfp_backend

    emulator, client, version, experiment = server
    emulator.version = release
    assert kfp_backend.server_version(kfp_backend.Place(emulator.endpoint)) == tuple(map(int, release.split(".")))
    recurring = client.create_recurring_run(
        experiment,
        "Nightly Run",
        cron_expression="0 0 3 * * *",
        params={"note": "r-[[RunUUID]]"},
        pipeline_id=version[0],
        version_id=version[1],
        pipeline_root=ROOT,
    )
    emulator.clock = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    fired = emulator.fire(recurring.recurring_run_id)
    emulator.wait(fired, timeout_s=60)
    workflow = emulator.run(fired).resource["workflow"]
    swf, index, fnv = workflow.rsplit("-", 2)
    assert swf.startswith("nightlyrun") and len(swf) == len("nightlyrun") + 5 and index == "1" and fnv.isdigit()
    assert client.get_run(fired).display_name == workflow
    log = emulator.run(fired).logs["work"]
    assert '"note": "r-[[RunUUID]]"' in log and f'"scheduled": "{scheduled}"' in log, log


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("", ""),
        (f"{ROOT}/elsewhere/data", ""),
        (
            "gs://acme-data/runs/r1/data",
            f'URI "gs://acme-data/runs/r1/data" does not have expected bucket prefix "{ROOT}"',
        ),
        (ROOT + "/", f'URI "{ROOT}/" has empty key given prefixed bucket "{ROOT}"'),
        ("https://example.com/data", ""),  # no bucket's: not uploaded, a warning only
    ],
)
def test_an_output_artifact_whose_uri_is_outside_the_pipeline_root_fails_its_task_as_the_launcher_fails_it(
    server, tmp_path, uri, error
):
    """KFP's launcher uploads each output artifact under the pipeline root (``uploadOutputArtifacts``,
    ``KeyFromURI``): a uri a component moved out of it fails the task once its command has succeeded."""
    emulator, client, _, experiment = server
    package = tmp_path / "pointing.yaml"
    compiler.Compiler().compile(pointing, str(package))
    run = client.create_run_from_pipeline_package(
        str(package), arguments={"uri": uri}, experiment_id=experiment, pipeline_root=ROOT
    )
    ended = emulator.wait(run.run_id, timeout_s=120)
    assert ended["state"] == ("FAILED" if error else "SUCCEEDED")
    (task,) = [d for d in client.get_run(run.run_id).run_details.task_details if d.display_name == "point"]
    if error:
        assert task.state == "FAILED"
        assert task.error.message == f'The task point failed: failed to upload output artifact "data": {error}'


@pytest.mark.parametrize(
    ("cron", "status"), [("0 3 * * *", "400"), ("30 0 3 * * *", "501"), ("0 0 3 ? * 1", "501"), ("0 x 3 * * *", "400")]
)
def test_a_cron_it_cannot_read_or_emulate_is_refused(server, cron, status):
    _, client, version, experiment = server
    with pytest.raises(Exception, match=status):
        client.create_recurring_run(
            experiment, "bad", cron_expression=cron, pipeline_id=version[0], version_id=version[1], pipeline_root=ROOT
        )


def test_bad_input_is_refused_as_the_server_refuses_it(server):
    from kfp_server_api.exceptions import ApiException

    emulator, client, version, experiment = server
    with pytest.raises(ApiException) as unknown:
        client.run_pipeline(
            experiment_id=experiment,
            job_name="x",
            params={"nope": 1},
            pipeline_id=version[0],
            version_id=version[1],
            pipeline_root=ROOT,
        )
    assert unknown.value.status == 400 and "nope" in unknown.value.body
    with pytest.raises(ApiException) as namespace:
        client.create_experiment("tpupipe", namespace="elsewhere")
    assert namespace.value.status == 403
    with pytest.raises(ApiException) as twice:
        client.upload_pipeline_version(str(Path(emulator.workdir) / "tiny.yaml"), "v2", pipeline_id=version[0])
    assert twice.value.status == 409


@pytest.mark.parametrize(("tag", "said"), [("", "names no release (tag_name)"), ("unknown", "says tag_name 'unknown'")])
def test_a_server_that_names_no_release_is_of_unknown_release_said_once_without_a_warning(tmp_path, tag, said):
    """healthz read over plain HTTP at /apis/v2beta1/healthz: its release when ``tag_name`` says one; a missing or
    unparseable tag (not part of the API's GetHealthzResponse) is an unknown release, one info line, no warning."""
    from pipelines.backends.kfp import jobs as kfp_backend

    emulator = KfpEmulator(
        None, ArtifactRegistryEmulator(), {}, python_bin=Path(sys.executable).parent, workdir=tmp_path
    )
    place = kfp_backend.Place(emulator.start())
    try:
        emulator.version = "2.16.0"
        assert kfp_backend.server_version(place) == (2, 16, 0)
        assert kfp_backend.schedule_time_note((2, 16, 0)).startswith("warning: this Kubeflow Pipelines server (2.16.0)")
        emulator.tag_name = tag
        lines: list[str] = []
        assert kfp_backend.server_version(place, lines.append) is None
        assert lines == [f"tpupipe: the Kubeflow Pipelines server's release is unknown: its healthz {said}"]
        assert kfp_backend.schedule_time_note(None).startswith("note: unless this Kubeflow Pipelines server is 2.17")
        assert kfp_backend.schedule_time_note((2, 17, 0)) == ""
    finally:
        emulator.stop()
