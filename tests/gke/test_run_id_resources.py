"""A gke run's id is claimed beside the resources named from it (``components.stages.claims.claim_resources``): at
``gs://<gke.bucket>/state/_claims/<run id>.json``, created with ``ifGenerationMatch=0`` on the emulated Cloud Storage,
so a second run under the same id is refused (exit 2) at its first task even when its ``output_root`` (where its
ledger is claimed) is another, before it creates anything; the holder's tasks, retried, go on. A registered copy
under ``models/<model>/<run id>/`` is created object by object with ``ifGenerationMatch=0``: another run's copy there
is refused, never replaced."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from components.platforms import interrupts
from components.spec import SpecError
from components.stages.runner import run_stage
from tests.emulators.project import ONE_SLICE
from tests.gke.test_isolation import BUCKET, context

CLAIM = "state/_claims/shared.json"


def test_a_second_run_of_an_id_under_another_output_root_is_refused_at_its_first_task(
    tmp_path, project_factory, monkeypatch, capsys
):
    project = project_factory()
    monkeypatch.delenv(interrupts.DRIVER_ENV, raising=False)
    _bucket()  # the project's bucket, as after its first run (and as a gs:// output_root in it needs)
    first, second = f"gs://{BUCKET}/state/team-a", f"gs://{BUCKET}/state/team-b"

    def stage(name: str, job: str, root: str) -> None:
        run_stage(name, "local-fsdp", "gke", ONE_SLICE, "shared", job, root)

    stage("snapshot_data", "workflow-a", first)
    assert json.loads(project.storage.data(BUCKET, CLAIM))["claim"]["job"] == "workflow-a"
    stage("snapshot_data", "workflow-a", first)  # the holder's task, retried: goes on
    before = project.storage.objects_of(BUCKET, "state/team-a/")
    for name in ("snapshot_data", "provision"):  # its first task, and any later one
        with pytest.raises(SystemExit) as ended:
            stage(name, "workflow-b", second)
        assert ended.value.code == 2
        out = capsys.readouterr().out
        assert f"{name}: refused: run_id: run id 'shared' is held by workflow-a" in out
        assert f"gs://{BUCKET}/{CLAIM}" in out
    assert json.loads(project.storage.data(BUCKET, CLAIM))["claim"]["job"] == "workflow-a"
    assert project.storage.objects_of(BUCKET, "state/team-a/") == before  # the holder's state untouched
    assert project.clusters("shared") == [] and project.pools("shared") == []  # nothing created
    assert not project.storage.objects_of(BUCKET, "runs/shared/")


def test_a_registered_copy_is_created_never_replaced(tmp_path, project_factory):
    project = project_factory()
    register = _registration(project, tmp_path, "reused")
    # Another run's copy under this id (one from before the id was claimed beside its resources).
    project.storage.put(BUCKET, "models/local-fsdp/reused/model.safetensors", b"the registered weights")
    with pytest.raises(SpecError, match="already holds other bytes") as refused:
        register()
    assert refused.value.field == "run_id" and refused.value.exit_code == 2
    assert project.storage.data(BUCKET, "models/local-fsdp/reused/model.safetensors") == b"the registered weights"
    # The same bytes there (a retried register): kept, no new copy.
    project.storage.put(BUCKET, "models/local-fsdp/reused/model.safetensors", b"this run's weights")
    assert register() == f"gs://{BUCKET}/models/local-fsdp/reused"


def test_a_registered_copy_whose_reply_was_lost_is_this_runs_own(tmp_path, project_factory):
    """The first rewrite of a create-only copy takes effect and its reply is lost: the client asks again, and the
    retry's ifGenerationMatch=0 fails (412) on the object its first try made. Its bytes are the source's: this run's
    copy, registered, not another run's refused."""
    project = project_factory()
    register = _registration(project, tmp_path, "lostcopy")
    project.storage.lose("objects.rewrite")
    assert register() == f"gs://{BUCKET}/models/local-fsdp/lostcopy"
    assert project.storage.state.calls.count("objects.rewrite") == 2  # the lost one, and the retry refused
    assert project.storage.data(BUCKET, "models/local-fsdp/lostcopy/model.safetensors") == b"this run's weights"


def test_another_runs_composite_copy_of_the_same_size_is_refused_not_taken_for_this_runs(tmp_path, project_factory):
    """Composite objects carry no MD5, so two of one size with other bytes differ only by their CRC32C: the copy is
    not skipped as done, and the object there is refused."""
    from google.cloud import storage

    from components.cloud.credentials import credentials
    from tests.emulators.project import PROJECT

    project = project_factory()
    register = _registration(project, tmp_path, "composite", weights=None)
    bucket = storage.Client(project=PROJECT, credentials=credentials()).bucket(BUCKET)

    def composite(name: str, *parts: bytes) -> None:
        blobs = [bucket.blob(f"parts/{name}/{i}") for i in range(len(parts))]
        for blob, data in zip(blobs, parts, strict=True):
            blob.upload_from_string(data)
        bucket.blob(name).compose(blobs)

    composite("runs/composite/train/checkpoint_000001/model.safetensors", b"this run's", b" weights")
    composite("models/local-fsdp/composite/model.safetensors", b"another's w", b"eights!")  # the same size
    with pytest.raises(SpecError, match="already holds other bytes"):
        register()
    assert project.storage.data(BUCKET, "models/local-fsdp/composite/model.safetensors") == b"another's weights!"


def _registration(project, tmp_path, run_id: str, weights: bytes | None = b"this run's weights") -> Callable[[], str]:
    """The register of run ``run_id``'s trained checkpoint in the project's bucket (created here), whose
    model.safetensors holds ``weights`` (None: the test writes it): ``keep_registered`` of its generations then."""
    from components.platforms.gke import GkePlatform

    _bucket()
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, run_id, ONE_SLICE)
    trained = f"gs://{BUCKET}/runs/{run_id}/train/checkpoint_000001"
    if weights is not None:
        project.storage.put(BUCKET, f"runs/{run_id}/train/checkpoint_000001/model.safetensors", weights)
    return lambda: gke.keep_registered(ctx, trained, "local-fsdp", gke.checkpoint_versions(ctx, trained))


def _bucket() -> None:
    from google.cloud import storage

    from components.cloud.credentials import credentials
    from tests.emulators.project import PROJECT

    storage.Client(project=PROJECT, credentials=credentials()).create_bucket(BUCKET)
