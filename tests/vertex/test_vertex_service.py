"""``pipelines.backends.vertex.jobs`` (what ``tpupipe submit | schedule | runs`` do) against the emulated Vertex AI,
with a tiny
pipeline of the same parameters as tpupipe's: no Ray cluster, no training, seconds. Its one task waits for a file the
test writes, so a run stays active as long as the test needs. (No ``from __future__ import annotations`` here: KFP
reads the components' real annotations.)"""

import re
import secrets
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from kfp import compiler, dsl

from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV, VERTEX_ENDPOINT_ENV
from components.cloud.iam import RESOURCE_MANAGER_EMULATOR_HOST_ENV
from pipelines.backends.vertex import jobs as vertex
from pipelines.backends.vertex import schedules
from pipelines.pipeline import compile_pipeline
from tests.emulators.artifactregistry import ArtifactRegistryEmulator
from tests.emulators.resourcemanager import ResourceManagerEmulator
from tests.emulators.storage import StorageEmulator
from tests.emulators.vertex import TERMINAL, VertexEmulator
from tests.helpers import wait_until

PROJECT, REGION = "tpupipe-emulated", "us-east5"
IMAGE = "us-east5-docker.pkg.dev/tpupipe-emulated/tpupipe/pipeline:tiny"
PRESET = "gemma4-e2b-v6e-16"
FAILING = "llama3-8b-v6e-16x2"  # a job of this preset fails in the tiny pipeline


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def hold(preset: str) -> str:
    """Wait until the file named by $RELEASE exists (the test's gate), then succeed."""
    import os
    import signal
    import time

    print("run labels:", os.environ.get("VERTEX_AI_PIPELINES_RUN_LABELS"))
    if os.environ.get("IGNORE_SIGTERM"):  # a task that does not end on SIGTERM: the grace period's SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.environ["IGNORE_SIGTERM"], "a").close()  # said once it holds
    if os.environ.get("HEAR_SIGTERM"):  # a task that stops what it started on SIGTERM, as tpupipe's stages do

        def heard(signum, frame):
            open(os.environ["HEAR_SIGTERM"] + ".heard", "a").close()
            os._exit(0)

        signal.signal(signal.SIGTERM, heard)
        open(os.environ["HEAR_SIGTERM"], "a").close()
    while not os.path.exists(os.environ["RELEASE"]):
        time.sleep(0.1)
    return preset


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def boom(preset: str) -> str:
    raise RuntimeError(f"no capacity for {preset}")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def clean() -> str:
    return "cleaned"


@dsl.pipeline(name="tiny")
def tiny(preset: str = PRESET, overrides: str = "", run_id: str = ""):
    """tpupipe's parameters and shape: stages inside an exit handler named "run", one under a condition (it runs, and
    fails, for the preset FAILING), the exit task outside.

    Args:
        preset: The preset.
        overrides: Spec overrides.
        run_id: The run id.
    """
    end = clean().set_display_name("teardown")
    with dsl.ExitHandler(end, name="run"):
        first = hold(preset=preset).set_retry(2, backoff_duration="30s", backoff_factor=2.0)
        with dsl.If(first.output == FAILING, name="gate-promotes"):
            boom(preset=preset)


@pytest.fixture
def service(tmp_path, monkeypatch):
    """Vertex AI Pipelines, its tasks released by ``service.release``; the template is ``service.template``."""
    token = secrets.token_hex(12)
    registry = ArtifactRegistryEmulator()
    registry.push(IMAGE, "sha256:" + "ab" * 32)
    release = tmp_path / "release"
    emulator = VertexEmulator(
        None,
        registry,
        {"RELEASE": str(release)},
        python_bin=Path(sys.executable).parent,
        workdir=tmp_path,
        token=token,
    )
    endpoint = emulator.start()
    for key, value in (
        (VERTEX_ENDPOINT_ENV, endpoint),
        (EMULATOR_HOST_ENV, endpoint),
        (EMULATOR_TOKEN_ENV, token),
        ("TPUPIPE_ARTIFACT_REGISTRY_EMULATOR_HOST", registry.start()),
    ):
        monkeypatch.setenv(key, value)
    emulator.registry_server = registry
    emulator.template = str(tmp_path / "tiny.yaml")
    compile_pipeline(emulator.template, pipeline=tiny)  # as tpupipe compiles: each task's stage is its first process
    emulator.release = release
    vertex.init(PROJECT, REGION)
    yield emulator
    release.touch()
    emulator.stop()
    registry.stop()


def _submission(service, **fields) -> vertex.Submission:
    given = {
        "preset": PRESET,
        "overrides": "gke.allow_default_identities=true",  # the refusal's own tests leave it out
        "project": PROJECT,
        "region": REGION,
        "pipeline_root": f"gs://{PROJECT}-tpupipe/pipeline-root",
        "template": service.template,
    }
    return vertex.Submission(**{**given, **fields})


def test_a_schedule_limits_the_runs_not_yet_finished_not_the_runs_started(service):
    """``max_concurrent_active_run_count`` (runs in a non-terminal state), not ``max_concurrent_run_count`` (runs
    being started): a run due while one is still running is skipped."""
    schedules.schedule_create(_submission(service), "weekly", "0 3 * * 1", max_concurrent=1)
    (schedule,) = service.schedules.values()
    assert schedule.resource["maxConcurrentActiveRunCount"] == "1"
    week = timedelta(days=7)
    first = service.advance(service.clock + week)
    assert len(first) == 1
    assert service.advance(service.clock + week) == [] and schedule.skipped == 1  # the first still runs
    service.release.touch()
    assert service.wait(first[0], timeout_s=120)["state"] == "PIPELINE_STATE_SUCCEEDED"
    second = service.advance(service.clock + week)
    assert len(second) == 1 and second != first


def test_without_an_active_run_limit_scheduled_runs_overlap(service):
    """The emulator reads the fields as documented: ``max_concurrent_run_count`` alone limits starts, not runs."""
    from google.cloud import aiplatform

    schedule = aiplatform.PipelineJobSchedule(
        pipeline_job=aiplatform.PipelineJob(
            display_name="tiny",
            template_path=service.template,
            pipeline_root=f"gs://{PROJECT}-tpupipe/pipeline-root",
        ),
        display_name="overlapping",
    )
    schedule.create(cron="0 3 * * 1", max_concurrent_run_count=1)
    week = timedelta(days=7)
    first, second = service.advance(service.clock + week), service.advance(service.clock + week)
    assert len(first) == len(second) == 1
    assert all(service.job(n).resource["state"] not in TERMINAL for n in first + second)


def _create(service, sub: vertex.Submission, job_id: str) -> str:
    """Create the job ``submit`` would (``pipelines.backends.vertex.jobs.pipeline_job``) with the PipelineService
    client: ``submit``'s
    SDK call would first get or create the pipeline root's bucket in Cloud Storage."""
    from google.cloud import aiplatform_v1

    from components.cloud.credentials import credentials

    client = aiplatform_v1.PipelineServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": service.endpoint}
    )
    job = vertex.pipeline_job(sub, job_id)
    created = client.create_pipeline_job(
        parent=f"projects/{PROJECT}/locations/{REGION}", pipeline_job=job._gca_resource, pipeline_job_id=job.job_id
    )
    return created.name


def test_runs_lists_only_tpupipe_jobs_newest_first_in_the_simple_view(service):
    from google.cloud import aiplatform

    other = aiplatform.PipelineJob(
        display_name="not-ours", template_path=service.template, pipeline_root=f"gs://{PROJECT}-other/root"
    )
    ours = [
        _create(service, _submission(service), vertex.new_job_id(PRESET)),
        _create(service, _submission(service, preset=FAILING), vertex.new_job_id(FAILING)),
    ]
    other.api_client.create_pipeline_job(
        parent=f"projects/{PROJECT}/locations/{REGION}", pipeline_job=other._gca_resource, pipeline_job_id="not-ours"
    )
    listed = vertex.runs()
    assert [j["name"] for j in listed] == ours[::-1]  # newest first; the job without the label is not listed
    assert all("root" not in j["pipelineSpec"] and "taskDetails" not in j.get("jobDetail", {}) for j in listed)
    query = service.list_queries[-1]
    assert query["filter"] == ["labels.tpupipe-preset:*"] and query["readMask"]
    assert [j["name"] for j in vertex.runs(preset=FAILING)] == ours[1:]
    assert vertex.runs(state="succeeded") == []
    service.release.touch()
    for name in ours:
        service.wait(name, timeout_s=120)
    assert [j["name"] for j in vertex.runs(preset=PRESET, state="succeeded")] == ours[:1]


def test_job_ids_are_unique_per_submit_start_with_a_letter_and_match_the_documented_example():
    from google.cloud.aiplatform.constants.pipeline import _VALID_NAME_PATTERN

    from pipelines.cli.vertex import EXAMPLES
    from tests.emulators.vertex import JOB_ID

    ids = [vertex.new_job_id("llama3-8b-v6e-16x2") for _ in range(20)]  # all within a second or two
    assert len(set(ids)) == len(ids)
    for job_id in ids:
        assert vertex.JOB_ID.match(job_id) and JOB_ID.match(job_id) and _VALID_NAME_PATTERN.match(job_id), job_id
    documented = Path(__file__).parents[2].joinpath("docs", "vertex.md").read_text()
    examples = [m for text in (EXAMPLES, documented) for m in re.findall(r"tpupipe-llama3[a-z0-9-]*", text)]
    assert examples and all(vertex.JOB_ID.match(e) for e in examples), examples


def test_the_emulator_refuses_a_job_id_vertex_refuses(service):
    """The SDK refuses such an id before any call; the service does too (a client of the API alone)."""
    import yaml
    from google.api_core import exceptions
    from google.cloud import aiplatform_v1

    from components.cloud.credentials import credentials

    client = aiplatform_v1.PipelineServiceClient(
        credentials=credentials(), transport="rest", client_options={"api_endpoint": service.endpoint}
    )
    job = aiplatform_v1.PipelineJob(
        pipeline_spec=yaml.safe_load(Path(service.template).read_text()),
        runtime_config={"gcs_output_directory": f"gs://{PROJECT}-tpupipe/root"},
    )
    with pytest.raises(exceptions.BadRequest, match="Invalid pipeline job id '1-starts-with-a-digit'"):
        client.create_pipeline_job(
            parent=f"projects/{PROJECT}/locations/{REGION}", pipeline_job=job, pipeline_job_id="1-starts-with-a-digit"
        )


def test_every_task_gets_the_run_labels_as_vertex_gives_them(service):
    import json

    name = _create(service, _submission(service, labels={"team": "ml"}), vertex.new_job_id(PRESET))
    service.release.touch()
    service.wait(name, timeout_s=120)
    (line,) = [ln for ln in service.job(name).logs["hold"].splitlines() if ln.startswith("run labels:")]
    labels = json.loads(line.removeprefix("run labels:"))
    assert labels["tpupipe-preset"] == PRESET and labels["team"] == "ml"
    assert labels["vertex-ai-pipelines-run-billing-id"].isdigit()


def test_failing_stage_and_show_read_the_component_tasks_not_the_dag_tasks(service):
    """Vertex lists the DAG-level tasks too (the root named after the job, "run", "gate-promotes"), and they fail
    with the component: the failing stage is the component."""
    from google.cloud import aiplatform

    service.release.touch()
    job_id = vertex.new_job_id(FAILING)
    name = _create(service, _submission(service, preset=FAILING), job_id)
    service.wait(name, timeout_s=120)
    details = {t["taskName"]: t for t in service.job(name).resource["jobDetail"]["taskDetails"]}
    assert {n: d["state"] for n, d in details.items()} == {
        job_id: "FAILED",
        "run": "FAILED",
        "hold": "SUCCEEDED",
        "gate-promotes": "FAILED",
        "boom": "FAILED",
        "teardown": "SUCCEEDED",
    }
    assert "parentTaskId" not in details[job_id]
    assert details["boom"]["parentTaskId"] == details["gate-promotes"]["taskId"]
    assert details["gate-promotes"]["parentTaskId"] == details["run"]["taskId"] == "2"
    job = aiplatform.PipelineJob.get(name).to_dict()
    assert vertex.failing_stage(job) == "boom: RuntimeError: no capacity for " + FAILING
    shown = vertex.show(name)
    assert shown["stages"] == [("hold", "SUCCEEDED"), ("boom", "FAILED"), ("teardown", "SUCCEEDED")]


@pytest.mark.parametrize("template", ["", "missing"])
def test_submit_refuses_a_tree_whose_image_was_never_published_naming_tpupipe_publish(
    service, tmp_path, capsys, template
):
    """The image the compiled tree (or the template given) names is not in Artifact Registry: exit 2 naming the
    command that publishes it, before any Vertex AI call."""
    from pipelines.cli.main import main

    args = ["submit", PRESET, "--project", PROJECT, "--region", REGION, "--allow-default-identities"]
    if template:
        path = tmp_path / "missing.yaml"
        path.write_text(Path(service.template).read_text().replace(":tiny", ":never-built"))
        args += ["--template", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: image: " in err and "is not in Artifact Registry" in err
    assert f"tpupipe publish --project {PROJECT} --region {REGION} (or add --publish)" in err
    assert service.calls == []
    if template:  # --publish publishes this source tree: with another template it is refused
        assert main([*args, "--publish"]) == 2
        assert "error: --publish: publishes this source tree's image" in capsys.readouterr().err


def test_submit_of_a_template_whose_image_is_published_creates_the_job(service, monkeypatch):
    from components.cloud.iam import RESOURCE_MANAGER_EMULATOR_HOST_ENV
    from tests.emulators.resourcemanager import ResourceManagerEmulator
    from tests.emulators.storage import StorageEmulator

    storage = StorageEmulator({PROJECT: "123456789012"})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.start())
    projects = ResourceManagerEmulator({PROJECT: "123456789012"})  # submit reads the pipeline account's roles
    monkeypatch.setenv(RESOURCE_MANAGER_EMULATOR_HOST_ENV, projects.start())
    try:
        sub = _submission(service, service_account=f"pipelines@{PROJECT}.iam.gserviceaccount.com")
        name = vertex.submit(sub, log=lambda m: None)
    finally:
        storage.stop()
        projects.stop()
    assert vertex.JOB_ID.match(name.rsplit("/", 1)[-1]) and service.calls == ["CreatePipelineJob"]
    # The job's tasks name the image by the digest its tag names now (a tag pushed again cannot change what runs);
    # the template file given is left as it was.
    executors = service.job(name.rsplit("/", 1)[-1]).spec["deploymentSpec"]["executors"].values()
    assert {e["container"]["image"] for e in executors} == {f"{IMAGE}@sha256:{'ab' * 32}"}
    assert "@sha256:" not in Path(service.template).read_text()


def test_a_job_whose_image_is_missing_is_created_and_its_task_fails_at_image_pull(service, tmp_path):
    """Vertex AI does not look at the images when it creates a job: the task fails when it starts."""
    path = tmp_path / "missing.yaml"
    path.write_text(Path(service.template).read_text().replace(":tiny", ":never-built"))
    name = _create(service, _submission(service, template=str(path)), vertex.new_job_id(PRESET))
    resource = service.wait(name, timeout_s=60)
    assert resource["state"] == "PIPELINE_STATE_FAILED"
    (hold,) = [t for t in resource["jobDetail"]["taskDetails"] if t["taskName"] == "hold"]
    assert hold["state"] == "FAILED" and "failed to pull image" in hold["error"]["message"]


def test_a_cancelled_run_cancels_its_exit_task_too(service):
    """Cancelling "cancels all the remaining tasks in the pipeline"
    (https://cloud.google.com/vertex-ai/docs/pipelines/cancel-pipeline-runs): the exit handler's task is one of them,
    so a pipeline's own teardown does not run after a Stop."""
    from google.cloud import aiplatform

    name = _create(service, _submission(service), vertex.new_job_id(PRESET))
    wait_until(lambda: service.job(name).attempts.get("hold"), 60, "hold to start")
    aiplatform.PipelineJob.get(name).cancel()
    resource = service.wait(name, timeout_s=60)
    states = {t["taskName"]: t["state"] for t in resource["jobDetail"]["taskDetails"]}
    assert resource["state"] == "PIPELINE_STATE_CANCELLED"
    assert states["hold"] == states["teardown"] == states["run"] == "CANCELLED", states
    assert "teardown" not in service.job(name).logs  # never started


def test_a_task_killed_mid_way_is_retried_as_its_retry_policy_says(service):
    """``set_retry(2, backoff_duration="30s", backoff_factor=2.0)`` on hold: its first attempt is killed (SIGKILL, as a
    lost machine), the emulator waits the policy's backoff (scaled to the tests' clock) and runs it again, which
    succeeds; the failed attempt stays in the task's status history."""
    service.backoff_scale = 0.01
    service.kill_first_attempt("hold", when=lambda: True)
    name = _create(service, _submission(service), vertex.new_job_id(PRESET))
    wait_until(lambda: service.job(name).attempts.get("hold") == 2, 60, "hold's second attempt")
    service.release.touch()
    resource = service.wait(name, timeout_s=60)
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED"
    job = service.job(name)
    assert job.attempts == {"hold": 2, "teardown": 1} and job.backoffs == {"hold": [30.0]}
    (hold,) = [t for t in resource["jobDetail"]["taskDetails"] if t["taskName"] == "hold"]
    assert hold["state"] == "SUCCEEDED" and "error" not in hold
    (failed,) = hold["pipelineTaskStatus"]  # an error in a non-final state: "a system-error being retried"
    assert failed["state"] == "RUNNING" and "exited with code -9" in failed["error"]["message"]


def test_an_evicted_task_gets_sigterm_then_sigkill_after_its_grace_period_and_is_retried(service):
    """A pod ended under a running job (evicted, its node drained): SIGTERM, then SIGKILL once the grace period is over
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination); the job goes on, and the
    task's retry policy runs it again."""
    service.backoff_scale, service.grace_s = 0.01, 1.0
    ignoring = service.workdir / "ignoring"
    service.env["IGNORE_SIGTERM"] = str(ignoring)
    service.terminate_first_attempt("hold", when=ignoring.exists)
    name = _create(service, _submission(service), vertex.new_job_id(PRESET))
    wait_until(lambda: service.job(name).attempts.get("hold") == 2, 60, "hold's second attempt")
    assert service.job(name).resource["state"] == "PIPELINE_STATE_RUNNING"
    service.release.touch()
    resource = service.wait(name, timeout_s=60)
    assert resource["state"] == "PIPELINE_STATE_SUCCEEDED"
    ((task, _),) = service.terminated
    (hold,) = [t for t in resource["jobDetail"]["taskDetails"] if t["taskName"] == "hold"]
    (failed,) = hold["pipelineTaskStatus"]
    assert task == "hold" and "exited with code -9" in failed["error"]["message"]
    # SIGTERM ignored by the executor: the grace period's SIGKILL ends it
    assert service.forced == ["hold"]


def test_a_cancel_sets_the_job_cancelling_then_ends_its_tasks_as_kubernetes_ends_pods(service):
    """A cancel: the job is CANCELLING while its running task gets SIGTERM, then SIGKILL after the grace period
    when it has not ended; the job ends CANCELLED."""
    from google.cloud import aiplatform

    service.grace_s = 1.0
    ignoring = service.workdir / "ignoring"
    service.env["IGNORE_SIGTERM"] = str(ignoring)
    name = _create(service, _submission(service), vertex.new_job_id(PRESET))
    wait_until(ignoring.exists, 60, "hold to start")
    aiplatform.PipelineJob.get(name).cancel()
    # CANCELLING while its running task was signalled
    assert service.job(name).cancels == [("PIPELINE_STATE_CANCELLING", ["hold"])]
    assert [t for t, _ in service.terminated] == ["hold"]
    resource = service.wait(name, timeout_s=60)
    assert resource["state"] == "PIPELINE_STATE_CANCELLED"
    wait_until(lambda: service.forced == ["hold"], 10, "the grace period's SIGKILL")


@pytest.mark.parametrize("compiled_as", ["kfp", "tpupipe"])
def test_a_stop_reaches_the_stage_only_when_the_shell_execs_it(service, compiled_as):
    """kfp's own command keeps its shell as the task's first process, and the SIGTERM of a Stop goes to that process
    alone: the stage never hears it. tpupipe's compile execs the stage, which then hears it and stops what it
    started (pipelines.pipeline.exec_executor)."""
    from google.cloud import aiplatform

    if compiled_as == "kfp":
        compiler.Compiler().compile(tiny, service.template)
    service.grace_s = 2.0
    listening = service.workdir / "listening"
    service.env["HEAR_SIGTERM"] = str(listening)
    name = _create(service, _submission(service), vertex.new_job_id(PRESET))
    wait_until(listening.exists, 60, "hold to listen")
    aiplatform.PipelineJob.get(name).cancel()
    assert service.wait(name, timeout_s=60)["state"] == "PIPELINE_STATE_CANCELLED"
    assert Path(f"{listening}.heard").exists() == (compiled_as == "tpupipe")


@pytest.mark.parametrize(
    ("state", "stops"),
    [
        ("PIPELINE_STATE_RUNNING", False),
        ("PIPELINE_STATE_CANCELLING", True),
        ("PIPELINE_STATE_CANCELLED", True),
        (None, False),  # no such job: its state is unknown
    ],
)
def test_on_vertex_a_sigterm_stops_a_stage_only_when_its_pipeline_job_is_being_cancelled(
    service, monkeypatch, state, stops
):
    """A stage on Vertex AI asks for its pipeline job's state (by the resource name every task is given) when SIGTERM
    comes: a job being cancelled is a stop (what the stage started is stopped); a job that goes on is not (a pod
    evicted: the task ends and its retry re-attaches). SIGINT always stops; off Vertex AI SIGTERM always stops."""
    import os
    import signal

    from components.platforms import interrupts
    from components.stages import vertex_task

    parent = f"projects/{PROJECT}/locations/{REGION}"
    name = service.add_job(parent, "job-1", state) if state else f"{parent}/pipelineJobs/gone"
    said: list[str] = []

    def stopped_by(signum: int, on_vertex: bool) -> list[int]:
        stopped: list[int] = []
        environ = {vertex_task.VERTEX_TASK_ENV: "{}"} if on_vertex else {}
        vertex_task.watch(name, environ)
        judge = interrupts.sigterm_judged_by(lambda: vertex_task.sigterm_stops(said.append))
        with judge, pytest.raises(interrupts.Interrupted), interrupts.on_interrupt(stopped.append, log=said.append):
            os.kill(os.getpid(), signum)
        return stopped

    assert stopped_by(signal.SIGTERM, on_vertex=True) == ([signal.SIGTERM] if stops else [])
    assert vertex_task.cancelling() is stops
    assert said[0].startswith("SIGTERM: pipeline job job-1 is " if state else "SIGTERM: pipeline job gone is unknown")
    assert ("not a stop of the run" in said[0]) is not stops
    assert stopped_by(signal.SIGINT, on_vertex=True) == [signal.SIGINT]
    assert stopped_by(signal.SIGTERM, on_vertex=False) == [signal.SIGTERM]
    assert vertex_task.job_id(name) == name.rsplit("/", 1)[-1] and vertex_task.job_id("job-1") == "job-1"


def test_a_task_without_a_retry_policy_is_not_retried_and_backoff_grows_by_the_factor(service):
    from tests.emulators.pipeline_runner import _backoff

    service.release.touch()
    name = _create(service, _submission(service, preset=FAILING), vertex.new_job_id(FAILING))
    service.wait(name, timeout_s=60)
    assert service.job(name).attempts["boom"] == 1  # no set_retry: failed once, not run again
    policy = {"maxRetryCount": 3, "backoffDuration": "60s", "backoffFactor": 2.0, "backoffMaxDuration": "200s"}
    assert [_backoff(policy, n) for n in (1, 2, 3)] == [60.0, 120.0, 200.0]
    assert _backoff({"maxRetryCount": 1}, 1) == 0.0


def test_runs_cancel_finds_the_run_a_job_ran_as_its_tasks_do():
    """The run id is the job's ``run_id`` parameter, else derived from its job id (what every task derives it from);
    the output root and the rest are the job's values, else the compiled defaults."""
    from components.spec.names import run_id_from
    from pipelines.backends.vertex.stopping import run_of

    spec = {
        "root": {
            "inputDefinitions": {
                "parameters": {
                    "run_id": {"defaultValue": ""},
                    "output_root": {"defaultValue": "gs://b/runs"},
                    "preset": {"defaultValue": PRESET},
                }
            }
        }
    }
    job_id = vertex.new_job_id(PRESET)
    job = {"name": f"projects/{PROJECT}/locations/{REGION}/pipelineJobs/{job_id}", "pipelineSpec": spec}
    assert run_of(job)["run_id"] == run_id_from("", job_id) and run_of(job)["output_root"] == "gs://b/runs"
    job["runtimeConfig"] = {"parameterValues": {"run_id": "mine", "output_root": "gs://other/runs"}}
    run = run_of(job)
    assert (run["run_id"], run["output_root"], run["preset"]) == ("mine", "gs://other/runs", PRESET)


def test_a_submit_whose_run_id_is_in_use_exits_2_and_creates_nothing(service, monkeypatch, capsys):
    """A run id another job runs under (its label), or that has had a ledger under the output root (torn down or
    not), or whose driver's heartbeat there is fresh, is refused before the job is created: a second job under it
    would resume the first one's ledger and checkpoints, write under its prefix, and tear its live cluster down. A
    fresh run id goes through, and the job carries it in its label."""
    from google.cloud import storage as gcs

    from components.cloud.credentials import credentials
    from components.cloud.iam import RESOURCE_MANAGER_EMULATOR_HOST_ENV
    from components.platforms import heartbeat
    from components.platforms import ledger as ledgers
    from components.platforms.store import GcsStore
    from pipelines.cli.main import main
    from tests.emulators.resourcemanager import ResourceManagerEmulator
    from tests.emulators.storage import StorageEmulator

    storage = StorageEmulator({PROJECT: "123456789012"})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.start())
    # The SDK checks the pipeline root's bucket is the project's (its project number) before it creates a job.
    projects = ResourceManagerEmulator({PROJECT: "123456789012"})
    monkeypatch.setenv(RESOURCE_MANAGER_EMULATOR_HOST_ENV, projects.start())
    try:
        gcs.Client(project=PROJECT, credentials=credentials()).create_bucket(f"{PROJECT}-tpupipe")
        parent = f"projects/{PROJECT}/locations/{REGION}"
        busy = "tpupipe-x-20261201000000-aaaaaa"
        service.add_job(parent, busy, "PIPELINE_STATE_RUNNING", {"tpupipe-run": "busy"})
        service.add_job(parent, "tpupipe-x-20261201000000-bbbbbb", "PIPELINE_STATE_SUCCEEDED", {"tpupipe-run": "old"})
        ledgers.replace(
            GcsStore(f"{PROJECT}-tpupipe", "state/held"), {"run_id": "held", "platform": "gke", "created": []}
        )
        heartbeat.beat(GcsStore(f"{PROJECT}-tpupipe", "state/beating"), "train")
        ledgers.replace(
            GcsStore(f"{PROJECT}-tpupipe", "state/old"),
            {"run_id": "old", "platform": "gke", "created": [], "torn_down": True},
        )
        args = ["submit", PRESET, "--project", PROJECT, "--region", REGION, "--template", service.template]
        args.append("--allow-default-identities")
        for run_id, why in (
            ("busy", re.escape(f"is in use: pipeline job {parent}/pipelineJobs/{busy} runs under it (running)")),
            ("held", re.escape(f"was used already: a run under it has a ledger (gs://{PROJECT}-tpupipe/state/held/")),
            ("beating", f"is in use: its driver's heartbeat in gs://{PROJECT}-tpupipe/state/beating is \\d+ s old"),
            # torn down: still used once, ever (its prefix may hold a registered model's checkpoint)
            ("old", re.escape(f"was used already: a run under it has a ledger (gs://{PROJECT}-tpupipe/state/old/")),
        ):
            assert main([*args, "--run-id", run_id]) == 2
            err = capsys.readouterr().err
            assert re.search(f"error: --run-id: '{run_id}' {why}", err), err
        assert "CreatePipelineJob" not in service.calls
        assert main([*args, "--run-id", "fresh"]) == 0, capsys.readouterr().err
    finally:
        storage.stop()
        projects.stop()
    (created,) = [j for j in service.jobs.values() if j.resource["labels"].get("tpupipe-run") == "fresh" and j.spec]
    assert created.resource["runtimeConfig"]["parameterValues"]["run_id"] == "fresh"


# ---------------------------------------------------------------- the pipeline's service account
# The pipeline's service account on Vertex AI (``--service-account``): ``tpupipe submit`` and ``tpupipe schedule
# create`` warn on stderr, and go on, when the pipeline runs as the Compute Engine default account (none given, or
# given by name) or as one the project's IAM policy grants a basic role; against the emulated Vertex AI and Resource
# Manager, with at most one getIamPolicy per submit.

NUMBER = "123456789012"
DEDICATED = f"pipelines@{PROJECT}.iam.gserviceaccount.com"
DEFAULT = f"{NUMBER}-compute@developer.gserviceaccount.com"
VERTEX_DOC = "https://cloud.google.com/vertex-ai/docs/pipelines/configure-project#service-account"


@pytest.fixture
def projects(service, monkeypatch):
    """The emulated Resource Manager (the project's IAM policy) and Cloud Storage (the pipeline root's bucket)."""
    storage = StorageEmulator({PROJECT: NUMBER})
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.start())
    emulator = ResourceManagerEmulator({PROJECT: NUMBER})
    monkeypatch.setenv(RESOURCE_MANAGER_EMULATOR_HOST_ENV, emulator.start())
    yield emulator
    emulator.stop()
    storage.stop()


def _submit(service, capsys, account: str = "") -> list[str]:
    """The warnings a submit as ``account`` prints on stderr; the job is created all the same."""
    name = vertex.submit(_submission(service, service_account=account), log=lambda m: None)
    assert service.job(name.rsplit("/", 1)[-1]).resource.get("serviceAccount", "") == account
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("tpupipe: warning: ")]


def test_a_submit_without_a_service_account_warns_that_vertex_runs_it_as_the_default_one(
    service,
    projects,
    capsys,
):
    (warning,) = _submit(service, capsys)
    assert warning.startswith(
        "tpupipe: warning: --service-account not given: Vertex AI runs the pipeline's tasks (which provision, build "
        "and tear down) as PROJECT_NUMBER-compute@developer.gserviceaccount.com, the project's Compute Engine default "
        "service account, which in many projects holds the basic Editor role on the whole project"
    )
    assert VERTEX_DOC in warning and "pass --service-account with a dedicated account" in warning
    assert "GetIamPolicy" not in projects.calls  # nothing to read: the default account is the risk


@pytest.mark.parametrize("account", ["", DEFAULT])
def test_the_default_pipeline_account_is_refused_before_any_call_unless_allowed(service, projects, capsys, account):
    """No --service-account, or the Compute Engine default one named: exit 2 naming --service-account and the fix,
    before any Vertex AI or IAM call; --allow-default-identities lets it through."""
    from pipelines.cli.main import main

    args = ["submit", PRESET, "--project", PROJECT, "--region", REGION, "--template", service.template]
    args += ["--service-account", account] if account else []
    before = len(service.calls)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: --service-account: " in err and "--allow-default-identities" in err
    assert "a default account of the project" in err and "pass --service-account with a dedicated account" in err
    assert len(service.calls) == before and projects.calls == []  # nothing asked, nothing created
    assert main([*args, "--allow-default-identities"]) == 0
    assert "tpupipe: warning: --service-account" in capsys.readouterr().err  # accepted, and still said


def test_a_dedicated_account_with_no_basic_role_is_no_warning_after_one_policy_read(
    service,
    projects,
    capsys,
):
    assert _submit(service, capsys, DEDICATED) == []
    assert projects.calls.count("GetIamPolicy") == 1


@pytest.mark.parametrize("role", ["roles/editor", "roles/owner"])
def test_an_account_with_a_basic_role_is_a_warning_naming_the_role(service, projects, capsys, role):
    projects.grant(PROJECT, role, f"serviceAccount:{DEDICATED}")
    (warning,) = _submit(service, capsys, DEDICATED)
    assert warning.startswith("tpupipe: warning: --service-account: Vertex AI runs the pipeline's tasks")
    assert f"as {DEDICATED}, which holds {role} on project {PROJECT}: whoever compromises it can change anything" in (
        warning
    )


def test_the_default_compute_account_named_is_a_warning(service, projects, capsys):
    (warning,) = _submit(service, capsys, DEFAULT)  # the emulated project's grants it the nodes' roles, no basic one
    assert (
        f"--service-account: Vertex AI runs the pipeline's tasks (which provision, build and tear down) as {DEFAULT}"
        in (warning)
    )
    assert "the project's Compute Engine default service account" in warning


def test_a_policy_the_caller_may_not_read_is_a_warning_and_the_submit_goes_on(service, projects, capsys):
    projects.deny("resourcemanager.projects.getIamPolicy")
    (warning,) = _submit(service, capsys, DEDICATED)
    assert f"--service-account: the IAM policy of project {PROJECT} could not be read" in warning
    assert "resourcemanager.projects.getIamPolicy" in warning
    assert f"whether {DEDICATED} holds roles/owner or roles/editor there was not checked" in warning


def test_a_schedule_warns_as_a_submit_does(service, projects, capsys):
    projects.grant(PROJECT, "roles/editor", f"serviceAccount:{DEDICATED}")
    schedules.schedule_create(_submission(service, service_account=DEDICATED), "weekly", "0 3 * * 1")
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "tpupipe: warning: " in line]
    assert f"{DEDICATED}, which holds roles/editor on project {PROJECT}" in warning
    schedules.schedule_create(_submission(service), "nightly", "0 3 * * *")
    assert "--service-account not given" in capsys.readouterr().err


def test_publish_builds_the_components_image_as_the_account_named_and_refuses_one_that_is_not_an_email():
    import json

    from google.cloud.devtools import cloudbuild_v1

    from components.spec import SpecError
    from pipelines.pipeline import Target
    from pipelines.publish.vertex import build_body, publish

    target = Target(project=PROJECT, region=REGION)
    body = build_body(target, IMAGE, "t", f"builder@{PROJECT}.iam.gserviceaccount.com")
    assert body["serviceAccount"] == f"projects/{PROJECT}/serviceAccounts/builder@{PROJECT}.iam.gserviceaccount.com"
    assert body["options"]["logging"] == "CLOUD_LOGGING_ONLY"  # what a build with its own account must choose
    assert cloudbuild_v1.Build.from_json(json.dumps(body)).service_account == body["serviceAccount"]
    assert "serviceAccount" not in build_body(target, IMAGE, "t")
    with pytest.raises(SpecError, match="--build-service-account"):
        publish(target, "tpupipe-pipelines", "", log=lambda m: None, build_account="builder")  # before any call
    # the project's default build account (none named) or the Compute Engine one: refused, before any call
    for account in ("", f"{NUMBER}-compute@developer.gserviceaccount.com"):
        with pytest.raises(SpecError, match="--build-service-account: .*--allow-default-identities"):
            publish(target, "tpupipe-pipelines", "", log=lambda m: None, build_account=account)


def test_publish_refuses_to_schedule_the_janitor_as_the_default_account_before_any_call(service, projects, capsys):
    """The janitor schedule publish makes by default runs as --service-account: none, or the Compute Engine default,
    is refused (exit 2) before the components image is built or anything published; --no-janitor needs no account."""
    from pipelines.cli.main import main

    args = ["publish", "--project", PROJECT, "--region", REGION, "--build-service-account", DEDICATED]
    before = len(service.calls)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: --service-account: " in err and "--allow-default-identities" in err
    assert len(service.calls) == before and projects.calls == []
