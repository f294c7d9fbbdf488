"""The shared Cloud Storage adapter's server-side copy (``Storage.copy_prefix``, components/cloud/storage.py) against
the emulated Cloud Storage: a copy keeps its source's metadata, and what it kept rather than wrote (another writer's
copy of the same bytes) is there when it returns."""

from __future__ import annotations

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
