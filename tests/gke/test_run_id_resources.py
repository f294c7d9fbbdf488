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

from components.cloud.storage import COPY_NONCE
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
    retry's ifGenerationMatch=0 fails (412) on the object its first try made. It carries this copy's nonce: this run's
    copy, registered, not another run's refused."""
    project = project_factory()
    register = _registration(project, tmp_path, "lostcopy")
    project.storage.lose("objects.rewrite")
    assert register() == f"gs://{BUCKET}/models/local-fsdp/lostcopy"
    assert project.storage.state.calls.count("objects.rewrite") == 2  # the lost one, and the retry refused
    assert project.storage.data(BUCKET, "models/local-fsdp/lostcopy/model.safetensors") == b"this run's weights"
    copied = project.storage.object(BUCKET, "models/local-fsdp/lostcopy/model.safetensors")
    assert copied is not None and copied["metadata"][COPY_NONCE]


def test_a_failed_copy_deletes_its_own_object_whose_reply_was_lost(tmp_path, project_factory):
    """The first object's rewrite takes effect and its reply is lost (its retry's 412 finds this copy's nonce there),
    then the second object's copy is refused: the copy is undone, its own first object included."""
    from google.api_core import exceptions

    project = project_factory()
    register = _registration(project, tmp_path, "lostundo")
    project.storage.put(BUCKET, "runs/lostundo/train/checkpoint_000001/config.json", b"{}")
    project.storage.lose("objects.rewrite", when=lambda request: request["object"].endswith("config.json"))
    project.storage.fail("objects.rewrite", 403, when=lambda request: request["object"].endswith("model.safetensors"))
    with pytest.raises(exceptions.Forbidden):
        register()
    assert project.storage.state.calls.count("objects.rewrite") == 3  # config.json lost, its retry, the refused one
    assert project.storage.objects_of(BUCKET, "models/local-fsdp/lostundo/") == {}


def test_another_writers_copy_of_the_same_bytes_is_kept_and_never_undone(tmp_path, project_factory):
    """Another writer (a second register under this run id) writes the same bytes to a target after this copy listed
    its destination and before it rewrites the object: the create-only rewrite is refused (412), and the object there
    carries no nonce of this copy. It is kept, and when the copy's next object is refused, the undo leaves it alone."""
    from google.api_core import exceptions

    project = project_factory()
    register = _registration(project, tmp_path, "twowriters")
    project.storage.put(BUCKET, "runs/twowriters/train/checkpoint_000001/config.json", b"{}")
    theirs = "models/local-fsdp/twowriters/config.json"
    project.storage.meanwhile(
        "objects.rewrite",
        lambda: project.storage.put(BUCKET, theirs, b"{}"),
        when=lambda request: request["object"].endswith("config.json"),
    )
    project.storage.fail("objects.rewrite", 403, when=lambda request: request["object"].endswith("model.safetensors"))
    with pytest.raises(exceptions.Forbidden):
        register()
    assert project.storage.objects_of(BUCKET, "models/local-fsdp/twowriters/") == {theirs: b"{}"}
    assert COPY_NONCE not in (project.storage.object(BUCKET, theirs) or {}).get("metadata", {})


def test_another_runs_object_of_the_same_size_and_crc32c_is_told_apart_by_its_md5(tmp_path, project_factory):
    """CRC32C is linear: other bytes of the same size can be given the same CRC32C (here four bytes chosen for it).
    Where both objects have an MD5 (neither is composite) that is compared: the copy is not skipped as done, and the
    object there is refused."""
    import google_crc32c

    project = project_factory()
    register = _registration(project, tmp_path, "forged")
    forged = _same_crc32c(b"this run's weights", b"another run's")
    assert len(forged) == len(b"this run's weights") and forged != b"this run's weights"
    assert google_crc32c.value(forged) == google_crc32c.value(b"this run's weights")
    project.storage.put(BUCKET, "models/local-fsdp/forged/model.safetensors", forged)
    with pytest.raises(SpecError, match="already holds other bytes"):
        register()
    assert project.storage.data(BUCKET, "models/local-fsdp/forged/model.safetensors") == forged


def _same_crc32c(data: bytes, prefix: bytes) -> bytes:
    """``prefix`` and four bytes after it, padded to the length of ``data``, with the CRC32C of ``data``: CRC32C of a
    fixed length is affine in the bits of its input, so the last four bytes' 32 bits solve a linear system over GF(2)
    (RFC 3385 names CRC32C's polynomial; its linearity is that of any CRC)."""
    import google_crc32c

    head = prefix.ljust(len(data) - 4, b" ")
    base = google_crc32c.value(head + bytes(4))
    columns = [google_crc32c.value(head + (1 << bit).to_bytes(4, "little")) ^ base for bit in range(32)]
    rows = [(column, 1 << bit) for bit, column in enumerate(columns)]  # (crc difference, the bits that make it)
    basis: dict[int, tuple[int, int]] = {}  # leading bit -> (difference, bits), Gaussian elimination
    for difference, bits in rows:
        for lead in sorted(basis, reverse=True):
            if difference >> lead & 1:
                difference, bits = difference ^ basis[lead][0], bits ^ basis[lead][1]
        if difference:
            basis[difference.bit_length() - 1] = (difference, bits)
    want, chosen = google_crc32c.value(data) ^ base, 0
    for lead in sorted(basis, reverse=True):
        if want >> lead & 1:
            want, chosen = want ^ basis[lead][0], chosen ^ basis[lead][1]
    assert want == 0, "the last four bytes span every CRC32C"
    return head + chosen.to_bytes(4, "little")


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
