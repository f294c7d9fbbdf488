"""A registered checkpoint is out of every run's reach (``GkePlatform.keep_registered``): register copies it,
server-side and with the pipeline's identity, from the run's own prefix to ``models/<model>/<run id>/``, which no
run's pods may write (their bucket binding names ``runs/<run id>/`` alone: the emulated Cloud Storage enforces the
bucket's IAM policy on their token); with ``gate.hold_registered`` every object of the copy is under a temporary
hold, which even the pipeline's identity cannot delete or replace through. A later run under the same id is refused
at its claim, and the copy is unchanged after all of it."""

from __future__ import annotations

import pytest

from components.spec import InfraError, SpecError
from components.stages.claims import claim
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.gke.test_isolation import BUCKET, _two_runs_and_mine_pods_client, context

CHECKPOINT = {"model.safetensors": b"weights", "config.json": b"{}"}


def test_a_registered_checkpoint_is_unchanged_by_a_reused_run_id_and_by_another_runs_pods(tmp_path, project_factory):
    from google.api_core.exceptions import Forbidden
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project = project_factory()
    gke, mine, theirs, pod = _two_runs_and_mine_pods_client(tmp_path, project)
    logs: list[str] = []
    gke.log = logs.append
    for name, data in CHECKPOINT.items():
        project.storage.put(BUCKET, f"runs/theirs/train/checkpoint_000002/{name}", data)
    registering = context(tmp_path, "theirs", ONE_SLICE + " gate.hold_registered=true")
    trained = f"gs://{BUCKET}/runs/theirs/train/checkpoint_000002"
    evaluated = gke.checkpoint_versions(registering, trained)  # what the evaluate stage records
    uri = gke.keep_registered(registering, trained, "local-fsdp", evaluated)
    assert uri == f"gs://{BUCKET}/models/local-fsdp/theirs"
    kept = {f"models/local-fsdp/theirs/{name}": data for name, data in CHECKPOINT.items()}
    assert project.storage.objects_of(BUCKET, "models/") == kept
    assert logs[-1].endswith("2 newly under a temporary hold")
    again = gke.keep_registered(registering, trained + "/", "local-fsdp", evaluated)
    assert again == uri  # a retried register: no new copy
    assert "copied 0 of 2 objects" in logs[-1] and logs[-1].endswith("0 newly under a temporary hold")
    with pytest.raises(InfraError, match="not the run's own"):  # another run's prefix is no checkpoint of this run
        gke.keep_registered(registering, f"gs://{BUCKET}/runs/mine/train/checkpoint_000002", "local-fsdp", evaluated)

    # Another run's pods: no write, no replace, no delete anywhere under models/.
    bucket = pod.bucket(BUCKET)
    for name in (*kept, "models/local-fsdp/theirs/planted.py", "models/local-fsdp/mine/model.safetensors"):
        with pytest.raises(Forbidden, match="storage.objects.create"):
            bucket.blob(name).upload_from_string(b"forged")
    with pytest.raises(Forbidden, match="storage.objects.delete"):
        bucket.blob("models/local-fsdp/theirs/model.safetensors").delete()
    # Held: the pipeline's own identity (the project's owner here) cannot delete or replace it either.
    owner = storage.Client(project=PROJECT, credentials=credentials()).bucket(BUCKET)
    held = owner.get_blob("models/local-fsdp/theirs/model.safetensors")
    assert held.temporary_hold is True
    with pytest.raises(Forbidden, match="under active Temporary hold"):
        held.delete()
    with pytest.raises(Forbidden, match="under active Temporary hold"):
        owner.blob("models/local-fsdp/theirs/model.safetensors").upload_from_string(b"replaced")
    # A later run under the id: refused at its first task's claim (the ledger there is the first run's).
    with pytest.raises(SpecError, match="run id 'theirs'") as refused:
        claim(theirs.store, "theirs", "gke", "a-later-job", first=True, environ={})
    assert refused.value.exit_code == 2
    # The run's own prefix is its pods' to change; the registered copy is not.
    project.storage.put(BUCKET, "runs/theirs/train/checkpoint_000002/model.safetensors", b"changed later")
    assert project.storage.objects_of(BUCKET, "models/") == kept


def test_a_checkpoint_rewritten_after_it_was_evaluated_is_not_registered(tmp_path, project_factory):
    """Register copies exactly the object generations the evaluate stage recorded (``checkpoint_versions``), each
    rewrite with ``ifSourceGenerationMatch``: the run's pods rewriting an object of the checkpoint between evaluate
    and register (their binding lets them write their own prefix) fail the registration with an error naming it,
    whether the rewrite lands before register lists the checkpoint or between its list and its copy (the emulated
    Cloud Storage answers that copy 412), and no part of the failed copy is left under ``models/``; an object added
    after evaluate is not copied."""
    from components.spec import InfraError

    project = project_factory()
    gke, mine, _, pod = _two_runs_and_mine_pods_client(tmp_path, project)
    trained, under = f"gs://{BUCKET}/runs/mine/train/checkpoint_000002", "runs/mine/train/checkpoint_000002"
    bucket = pod.bucket(BUCKET)
    for name, data in CHECKPOINT.items():
        bucket.blob(f"{under}/{name}").upload_from_string(data)
    evaluated = gke.checkpoint_versions(mine, trained)
    assert sorted(evaluated) == sorted(CHECKPOINT)
    bucket.blob(f"{under}/model.safetensors").upload_from_string(b"unevaluated")  # a pod, after evaluate
    changed = r"changed after the evaluate stage measured it \(model.safetensors: rewritten or gone since\)"
    with pytest.raises(InfraError, match=changed):
        gke.keep_registered(mine, trained, "local-fsdp", evaluated)
    assert project.storage.objects_of(BUCKET, "models/") == {}  # refused before anything was copied

    evaluated, raced = gke.checkpoint_versions(mine, trained), []

    def rewritten_meanwhile(request: dict) -> bool:  # a pod's write landing between register's list and its copy
        if request["object"].endswith("/model.safetensors") and not raced:
            raced.append(request["object"])
            project.storage.put(BUCKET, request["object"], b"raced")
        return False  # no fault: the copy meets the object as the pod left it

    project.storage.fail("objects.rewrite", 500, when=rewritten_meanwhile)
    with pytest.raises(InfraError, match=changed):
        gke.keep_registered(mine, trained, "local-fsdp", evaluated)
    assert raced and project.storage.data(BUCKET, "models/local-fsdp/mine/model.safetensors") is None
    assert project.storage.objects_of(BUCKET, "models/") == {}  # config.json, copied before the race: deleted again

    evaluated = gke.checkpoint_versions(mine, trained)  # evaluated again: the bytes there now
    bucket.blob(f"{under}/planted.py").upload_from_string(b"import os")  # added after evaluate
    assert gke.keep_registered(mine, trained, "local-fsdp", evaluated) == f"gs://{BUCKET}/models/local-fsdp/mine"
    assert project.storage.objects_of(BUCKET, "models/") == {
        "models/local-fsdp/mine/config.json": b"{}",
        "models/local-fsdp/mine/model.safetensors": b"raced",
    }
