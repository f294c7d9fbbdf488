"""`tpupipe submit`, `schedule`, `runs` and their errors with ``--kfp-host``, against the emulated Kubeflow Pipelines
API server (tests/emulators/kfp.py) through the official kfp.Client, in an emulated project."""

from __future__ import annotations

import pytest
import yaml

from components.spec.names import run_id_from
from pipelines.backends.kfp import jobs as kfp_backend
from tests.emulators.project import LEAN, ONE_SLICE, PROJECT
from tests.helpers import assert_no_secret, wait_until

BASE = "gke.torch_tpu_base=us-docker.pkg.dev/tpupipe-emulated/base/tt:2"
OVERRIDES = ONE_SLICE.replace("gke.image=local/torch", BASE) + " gke.hf_secret= train.epochs=2" + LEAN
SENTINEL = "hf_KFPCANCEL0123456789abcdefSENTINEL"


def _fail_at_preflight(project) -> None:
    """Every attempt of provision fails in preflight, before it creates anything: these tests are about the runs."""
    import grpc

    project.gke.fail("GetServerConfig", grpc.StatusCode.PERMISSION_DENIED, "container.clusters.list denied", 1_000)


def test_submit_uploads_the_version_and_runs_it_in_the_experiment_then_list_show_and_cancel(kfp, tpupipe, monkeypatch):
    """The run's project from gke.project (no --project); the pipeline uploaded once as a version named after the
    source version, the very file a Vertex AI job of the same submission runs (one compile); the run in the experiment
    with its run id; `runs list`, `runs show`; `runs cancel` terminates it, the exit handler fails unrun past the
    deadline as on KFP's Argo backend, and the cancel tears the run down itself. The secret sentinel on the KFP
    cancel path: the Hugging Face token of the submitting process is in no output, task log or stored object."""
    from pipelines.backends.vertex import jobs as vertex

    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    _fail_at_preflight(kfp.project)
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, "--kfp-host", kfp.host)
    said = out + err
    assert code == 0, out + err
    kfp_run = out.split("submitted run ", 1)[1].split()[0]
    run_id = out.split("(run id ", 1)[1].split(")")[0]
    assert f"{kfp.host}/#/runs/details/{kfp_run}" in out
    (pipeline,) = kfp.server.pipelines.values()
    (version,) = [v for v in kfp.server.versions.values() if v["display_name"] != "tpupipe"]
    run = kfp.server.run(kfp_run).resource
    (experiment,) = kfp.server.experiments.values()
    assert pipeline["display_name"] == "tpupipe" and experiment["display_name"] == "tpupipe"
    assert run["experiment_id"] == experiment["experiment_id"] and experiment["namespace"] == "kubeflow"
    assert run["pipeline_version_reference"]["pipeline_version_id"] == version["pipeline_version_id"]
    assert run["runtime_config"]["parameters"]["run_id"] == run_id and run_id.startswith("tpupipe-local-fsdp")
    # One compile serves both: what a Vertex AI job of the same submission would run is the version uploaded.
    sub = vertex.Submission("local-fsdp", OVERRIDES, PROJECT, "us-east5", f"gs://{PROJECT}-tpupipe/pipeline-root")
    template = vertex.published_template(sub)
    assert yaml.safe_load(open(template).read()) == version["pipeline_spec"]
    assert version["display_name"] == kfp_backend.version_name(template)

    code, out, err = tpupipe("runs", "list", "--kfp-host", kfp.host, "--preset", "local-fsdp")
    assert code == 0 and kfp_run in out, out + err
    code, out, err = tpupipe("runs", "show", kfp_run, "--kfp-host", kfp.host)
    assert code == 0 and "preset local-fsdp" in out and "snapshot-data" in out, out + err
    said += out + err

    code, out, err = tpupipe("runs", "cancel", kfp_run, "--kfp-host", kfp.host, "--timeout", "120")
    assert code == 0, out + err
    ended = kfp.server.run(kfp_run)
    assert ended.resource["state"] == "CANCELED"
    teardown = [t for t in ended.tasks if t["taskName"] == "teardown"]
    assert teardown and teardown[0]["state"] == "FAILED" and "teardown" not in ended.logs  # never ran on KFP
    assert "tearing" in out or "teardown" in out
    assert kfp.project.clusters(run_id) == [] and kfp.project.gke.state.clusters == {}
    storage = kfp.project.storage
    stored = b"\n".join(data for bucket in storage.state.buckets for data in storage.objects_of(bucket).values())
    logs = "\n".join(ended.logs.values())
    assert_no_secret([SENTINEL], output=said + out + err, task_logs=logs, bucket=stored.decode(errors="replace"))


def test_a_run_id_that_has_had_a_ledger_is_refused_before_anything_is_uploaded(kfp, tpupipe):
    """``--run-id`` of a run that provisioned once (its ledger under the output root the run would write to, torn
    down or not) is refused with exit 2, naming the flag, before the pipeline is uploaded or a run created: a second
    run under it would resume its ledger and checkpoints and write under its prefix."""
    from google.cloud import storage as gcs

    from components.cloud.credentials import credentials
    from components.platforms import ledger as ledgers
    from components.platforms.store import GcsStore

    bucket = f"{PROJECT}-tpupipe"
    client = gcs.Client(project=PROJECT, credentials=credentials())
    if client.lookup_bucket(bucket) is None:
        client.create_bucket(bucket)
    ended = {"run_id": "old", "platform": "gke", "created": [], "torn_down": True}
    ledgers.replace(GcsStore(bucket, "state/old"), ended)
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, "--kfp-host", kfp.host, "--run-id", "old")
    assert code == 2, out + err
    (error,) = [line for line in err.splitlines() if line.startswith("tpupipe: error:")]
    assert f"--run-id: 'old' was used already: a run under it has a ledger (gs://{bucket}/state/old/" in error
    assert kfp.server.jobs == {} and kfp.server.pipelines == {}


def test_a_recurring_run_is_created_in_the_experiment_and_paused_resumed_deleted(kfp, tpupipe):
    _fail_at_preflight(kfp.project)
    host = ["--kfp-host", kfp.host]
    code, out, err = tpupipe(
        "schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", "0 3 * * *", *host
    )
    assert code == 0, out + err
    (recurring,) = kfp.server.recurring.values()
    resource = recurring.resource
    assert resource["display_name"] == "nightly" and resource["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    # No run id: KFP would pass a [[RunUUID]] macro to a v2 pipeline's tasks verbatim; each run derives its own.
    assert "run_id" not in resource["runtime_config"]["parameters"]
    assert resource["no_catchup"] is True and resource["max_concurrency"] == "1"
    code, out, _ = tpupipe("schedule", "list", *host)
    assert code == 0 and "nightly" in out and "ENABLED" in out
    assert tpupipe("schedule", "pause", "nightly", *host)[0] == 0 and resource["status"] == "DISABLED"
    assert tpupipe("schedule", "resume", "nightly", *host)[0] == 0 and resource["status"] == "ENABLED"
    fired = kfp.server.fire(resource["recurring_run_id"])
    workflow = kfp.server.run(fired).resource["workflow"]
    assert kfp.server.run(fired).parameters["run_id"] == ""
    assert kfp.server.run(fired).resource["display_name"] == workflow
    wait_until(lambda: kfp.server.run(fired).running, 60, "the fired run's first task", 0.2)
    code, out, err = tpupipe("runs", "cancel", fired, *host, "--timeout", "120")
    assert code == 0 and kfp.server.run(fired).resource["state"] == "CANCELED", out + err
    assert kfp.project.clusters(run_id_from("", workflow)) == []
    assert tpupipe("schedule", "delete", "nightly", *host)[0] == 0 and kfp.server.recurring == {}


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--kfp-host", "localhost:8888"], 2, "--kfp-host: 'localhost:8888' is not a URL"),
        (["--kfp-namespace", "Team_A"], 2, "--kfp-namespace: 'Team_A' is not a Kubernetes namespace"),
        (["--kfp-auth", "iap"], 2, "--kfp-iap-client-id"),
        (["--kfp-auth", "sa-token"], 2, "sa-token reads the pod's projected token"),
        (
            ["--kfp-host", "http://kfp.example.com:8888", "--kfp-auth", "iap", "--kfp-iap-client-id", "c"],
            2,
            "--kfp-host: --kfp-auth iap would send its bearer token in clear text to http://kfp.example.com:8888",
        ),
        (["--kfp-namespace", "elsewhere"], 1, "namespace 'elsewhere'"),
        (["--cron", "TZ=Europe/Paris 0 3 * * 1"], 2, "--cron: Kubeflow Pipelines takes no time zone"),
    ],
)
def test_bad_input_and_refusals_are_one_line_errors(kfp, tpupipe, args, code, message):
    given = {"--kfp-host": kfp.host, "--cron": "0 3 * * 1"} | dict(zip(args[::2], args[1::2], strict=True))
    schedule = given.pop("--cron")
    argv = ["schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", schedule]
    got, out, err = tpupipe(*argv, *[word for pair in given.items() for word in pair])
    assert got == code, out + err
    errors = [line for line in err.splitlines() if line.startswith("tpupipe: error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err, err
    assert kfp.server.recurring == {}


def test_an_unreachable_server_and_missing_auth_are_one_line_errors_exit_1(kfp, tpupipe):
    got, out, err = tpupipe("runs", "list", "--kfp-host", "http://127.0.0.1:9")
    assert got == 1 and "cannot reach the Kubeflow Pipelines API at http://127.0.0.1:9" in err, out + err
    assert len(err.strip().splitlines()) == 1
    kfp.server.token = "a-token-the-client-does-not-have"
    got, out, err = tpupipe("runs", "list", "--kfp-host", kfp.host)
    assert got == 1 and "check --kfp-auth" in err and len(err.strip().splitlines()) == 1, out + err


def test_publish_uploads_the_pinned_pipeline_and_the_janitors_recurring_run_once(project_factory, tmp_path, tpupipe):
    from tests.kfp.conftest import start_kfp

    kfp = start_kfp(project_factory(vertex=True, polls_to_done=1), tmp_path)
    args = ["publish", "--project", PROJECT, "--kfp-host", kfp.host, "--janitor-schedule", "--allow-default-identities"]
    code, out, err = tpupipe(*args)
    assert code == 0, out + err
    assert {p["display_name"] for p in kfp.server.pipelines.values()} == {"tpupipe", "tpupipe-janitor"}
    (janitor,) = kfp.server.recurring.values()
    resource = janitor.resource
    assert resource["trigger"]["cron_schedule"]["cron"] == "0 */15 * * * *" and resource["max_concurrency"] == "1"
    assert resource["runtime_config"]["parameters"]["kfp_host"] == "http://ml-pipeline.kubeflow:8888"
    images = {e["container"]["image"] for e in janitor.spec["deploymentSpec"]["executors"].values()}
    assert len(images) == 1 and "@sha256:" in images.pop()  # pinned to the digest publish found
    code, out, err = tpupipe(*args)
    assert code == 0 and "exists already" in out + err, out + err
    assert len(kfp.server.recurring) == 1


def test_submit_and_schedule_help_document_the_kfp_host(tpupipe, capsys):
    from pipelines.cli.main import main

    for command in (["submit", "--help"], ["schedule", "--help"], ["schedule", "create", "--help"]):
        with pytest.raises(SystemExit):
            main(command)
        assert "--kfp-host" in capsys.readouterr().out, command


def test_a_run_started_from_the_ui_with_a_run_id_in_use_fails_at_its_first_task_before_creating_anything(kfp):
    """A run created straight through the KFP API (the UI's run form: no submit-time check) with the ``run_id`` of
    another run: its first task finds the ledger claimed by that run's workflow and exits 2 before it writes anything;
    its exit handler's teardown is refused too, so nothing of the holder's is touched or deleted."""
    from google.cloud import storage as gcs

    from components.cloud.credentials import credentials
    from components.platforms import ledger as ledgers
    from components.platforms.store import GcsStore
    from components.stages.claims import claim
    from pipelines.backends.vertex import jobs as vertex

    bucket = f"{PROJECT}-tpupipe"
    client = gcs.Client(project=PROJECT, credentials=credentials())
    if client.lookup_bucket(bucket) is None:
        client.create_bucket(bucket)
    held = GcsStore(bucket, "state/taken")
    claim(held, "taken", "gke", "tpupipe-holder-abcde", first=True, environ={})
    before = held.read_versioned(ledgers.KEY)
    sub = vertex.Submission("local-fsdp", OVERRIDES, PROJECT, "us-east5", f"gs://{bucket}/pipeline-root")
    place = kfp_backend.Place(kfp.host)
    kfp_client = kfp_backend.client(place)
    pipeline_id, version_id = kfp_backend.upload(kfp_client, vertex.published_template(sub), place.namespace)
    run = kfp_client.run_pipeline(
        experiment_id=kfp_backend.experiment_id(kfp_client, place),
        job_name="from-the-ui",
        params=kfp_backend.parameters(sub, "taken"),
        pipeline_id=pipeline_id,
        version_id=version_id,
    )
    wait_until(lambda: kfp.server.run(run.run_id).resource["state"] == "FAILED", 180, "the run to fail", 0.2)
    ended = kfp.server.run(run.run_id)
    states = {t["taskName"]: t["state"] for t in ended.tasks}
    assert states["snapshot-data"] == "FAILED" and "provision" not in states, states
    refusal = "refused: run_id: run id 'taken' is held by tpupipe-holder-abcde"
    assert refusal in ended.logs["snapshot-data"] and refusal in ended.logs["teardown"], ended.logs
    assert held.read_versioned(ledgers.KEY) == before
    assert [b.name for b in client.list_blobs(bucket, prefix="state/taken/")] == [f"state/taken/{ledgers.KEY}"]
    assert kfp.project.clusters("taken") == []
