"""The shared Cloud Storage adapter's server-side copy (``Storage.copy_prefix``, components/cloud/storage.py) against
the emulated Cloud Storage: a copy keeps its source's metadata, and what it kept rather than wrote (another writer's
copy of the same bytes) is there when it returns, and stays there: the copy claims it (a metadata patch)."""

from __future__ import annotations

import pytest
from google.api_core import exceptions

from components.cloud.storage import COPY_NONCE, Storage, storage_client
from tests.emulators.project import PROJECT

BUCKET = f"{PROJECT}-copies"


def storage() -> Storage:
    adapter = Storage(storage_client(PROJECT), log=lambda line: None, sleep=lambda s: None)
    adapter.ensure_bucket(BUCKET, "us-east5")
    return adapter


def test_a_copied_object_keeps_its_sources_content_type_and_other_metadata(project_factory):
    """The rewrite's body carries this copy's nonce in the custom metadata, and a body that gives metadata replaces
    the source's: the body carries the source's contentType, cacheControl, contentEncoding, contentDisposition and
    contentLanguage too."""
    project = project_factory()
    adapter = storage()
    fields = {
        "cacheControl": "no-store",
        "contentEncoding": "gzip",
        "contentDisposition": "attachment",
        "contentLanguage": "en",
        "metadata": {"step": "100"},
    }
    project.storage.put(BUCKET, "src/config.json", b"\x1f\x8b", "application/json", **fields)
    assert adapter.copy_prefix(BUCKET, "src", "dst") == (1, 1, 2)
    copied = project.storage.object(BUCKET, "dst/config.json")
    assert copied is not None and copied["contentType"] == "application/json"
    assert {key: copied.get(key) for key in fields if key != "metadata"} == {
        key: value for key, value in fields.items() if key != "metadata"
    }
    assert copied["metadata"]["step"] == "100" and copied["metadata"][COPY_NONCE]


def test_another_writers_copy_that_vanishes_before_the_copy_ends_is_copied_again(project_factory):
    """Another writer puts the same bytes at the first target just before this create-only copy rewrites it (412:
    kept as that writer's), then deletes it (its own copy failed and was undone) while this copy writes the next
    object: the copy lists what it kept again at the end, finds it gone, and writes it."""
    project = project_factory()
    adapter = storage()
    project.storage.put(BUCKET, "src/a.bin", b"aaa")
    project.storage.put(BUCKET, "src/b.bin", b"bbb")
    project.storage.meanwhile(
        "objects.rewrite",
        lambda: project.storage.put(BUCKET, "dst/a.bin", b"aaa"),
        when=lambda request: request["object"] == "src/a.bin",
    )
    project.storage.meanwhile(
        "objects.rewrite",
        lambda: project.storage.remove(BUCKET, "dst/a.bin"),
        when=lambda request: request["object"] == "src/b.bin",
    )
    copied, total, _ = adapter.copy_prefix(BUCKET, "src", "dst", create_only=True)
    assert project.storage.objects_of(BUCKET, "dst/") == {"dst/a.bin": b"aaa", "dst/b.bin": b"bbb"}
    assert (copied, total) == (2, 2)
    assert COPY_NONCE in project.storage.object(BUCKET, "dst/a.bin")["metadata"]  # this copy's own now


def test_an_object_without_a_content_type_is_copied_as_application_octet_stream(project_factory):
    """A source stored without a Content-Type: the rewrite's body, which gives metadata (the nonce), must give a
    content type too (400 otherwise), and gives the one such an object is served as."""
    project = project_factory()
    adapter = storage()
    project.storage.put(BUCKET, "src/weights.bin", b"w", None, metadata={"step": "1"})
    assert "contentType" not in project.storage.object(BUCKET, "src/weights.bin")
    assert adapter.copy_prefix(BUCKET, "src", "dst", create_only=True) == (1, 1, 1)
    copied = project.storage.object(BUCKET, "dst/weights.bin")
    assert copied["contentType"] == "application/octet-stream" and copied["metadata"]["step"] == "1"


def test_a_kept_object_is_claimed_so_its_writers_undo_leaves_it(project_factory):
    """Writer B (an earlier register still running) copies a.bin, then its copy of b.bin is refused and it undoes
    what it wrote. Writer A (the register retried) runs its whole copy between B's refusal and B's delete of a.bin: A
    keeps B's a.bin (the same bytes) and, at its end, claims it: a metadata patch of A's nonce at B's generation and
    metageneration, which keeps the generation and raises the metageneration. B's delete, conditioned on the
    generation and metageneration B wrote, is refused (412) and B leaves a.bin: when both are done, A's copy is
    whole, and a.bin is still the generation B wrote."""
    project = project_factory()
    theirs, ours = storage(), storage()
    lines: list[str] = []
    theirs.log = lines.append
    project.storage.put(BUCKET, "src/a.bin", b"aaa")
    project.storage.put(BUCKET, "src/b.bin", b"bbb")
    project.storage.fail("objects.rewrite", 403, when=lambda request: request["object"] == "src/b.bin")
    done: list[object] = []

    def the_retried_copy() -> None:
        done.append(project.storage.object(BUCKET, "dst/a.bin"))  # B's
        done.append(ours.copy_prefix(BUCKET, "src", "dst", create_only=True))

    project.storage.meanwhile("objects.delete", the_retried_copy, when=lambda r: r["object"] == "dst/a.bin")
    with pytest.raises(exceptions.Forbidden):
        theirs.copy_prefix(BUCKET, "src", "dst", create_only=True)
    assert done[1] == (1, 2, 3)  # b.bin written, a.bin kept (B's, claimed)
    assert project.storage.objects_of(BUCKET, "dst/") == {"dst/a.bin": b"aaa", "dst/b.bin": b"bbb"}
    b_wrote, now = done[0], project.storage.object(BUCKET, "dst/a.bin")
    assert isinstance(b_wrote, dict) and now is not None
    assert now["metadata"][COPY_NONCE] != b_wrote["metadata"][COPY_NONCE]  # A's now
    assert (now["generation"], now["metageneration"]) == (b_wrote["generation"], "2")  # patched, not rewritten
    assert any("dst/a.bin: another writer's since" in line for line in lines)


def test_a_kept_object_under_its_writers_hold_is_claimed_as_it_is(project_factory):
    """A registered copy is under a temporary hold (``gate.hold_registered``): no one can delete it, nor replace it,
    but its metadata may change ("you can edit the metadata" of a held object:
    https://cloud.google.com/storage/docs/object-holds). A copy of the same bytes again keeps it and claims it by a
    metadata patch: the same generation, still held."""
    project = project_factory()
    adapter = storage()
    project.storage.put(BUCKET, "src/a.bin", b"aaa")
    assert adapter.copy_prefix(BUCKET, "src", "dst", create_only=True) == (1, 1, 3)
    assert adapter.hold_prefix(BUCKET, "dst") == 1
    held = project.storage.object(BUCKET, "dst/a.bin")
    assert adapter.copy_prefix(BUCKET, "src", "dst", create_only=True) == (0, 1, 0)
    now = project.storage.object(BUCKET, "dst/a.bin")
    assert now["generation"] == held["generation"] and now["temporaryHold"] is True
    assert now["metadata"][COPY_NONCE] != held["metadata"][COPY_NONCE]  # the second copy's


def test_a_retried_copy_to_a_bucket_with_a_retention_policy_copies_nothing_again(project_factory):
    """A bucket with a retention policy refuses to replace or delete an object younger than its period (403:
    https://cloud.google.com/storage/docs/bucket-lock). A retried register's copy keeps what the first one wrote and
    claims it by a metadata patch, which that policy allows: it succeeds, copies nothing, and every object keeps its
    generation."""
    project = project_factory()
    adapter = Storage(storage_client(PROJECT), log=lambda line: None, sleep=lambda s: None)
    locked = f"{PROJECT}-retained"
    bucket = adapter.client.bucket(locked)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.retention_period = 86400
    adapter.client.create_bucket(bucket, location="us-east5")
    project.storage.put(locked, "src/a.bin", b"aaa")
    project.storage.put(locked, "src/b.bin", b"bbb")
    assert adapter.copy_prefix(locked, "src", "dst", create_only=True) == (2, 2, 6)
    first = {name: project.storage.object(locked, name)["generation"] for name in ("dst/a.bin", "dst/b.bin")}
    assert adapter.copy_prefix(locked, "src", "dst", create_only=True) == (0, 2, 0)
    assert {name: project.storage.object(locked, name)["generation"] for name in first} == first


def test_a_claim_whose_reply_was_lost_is_recognised_by_its_nonce(project_factory):
    """The claim's patch takes effect and its reply is lost: the retry, at the metageneration listed, is refused
    (412), and the object, which carries this copy's nonce, is this copy's. The copy succeeds and copies nothing."""
    project = project_factory()
    adapter = storage()
    project.storage.put(BUCKET, "src/a.bin", b"aaa")
    project.storage.put(BUCKET, "dst/a.bin", b"aaa")  # another writer's copy of the same bytes
    before = project.storage.object(BUCKET, "dst/a.bin")
    project.storage.lose("objects.patch")
    assert adapter.copy_prefix(BUCKET, "src", "dst", create_only=True) == (0, 1, 0)
    now = project.storage.object(BUCKET, "dst/a.bin")
    assert now["generation"] == before["generation"] and now["metageneration"] == "2"
    assert COPY_NONCE in now["metadata"]
    assert project.storage.state.calls.count("objects.patch") == 2  # the claim, and its refused retry
