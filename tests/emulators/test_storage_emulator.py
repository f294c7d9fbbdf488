"""The Cloud Storage emulator through the real google-cloud-storage client (JSON API over HTTP, found through
STORAGE_EMULATOR_HOST): buckets and their IAM policies, objects (uploaded, read, downloaded, deleted), Cloud Storage's
validation and error shapes, injected faults, and which calls the client retries by itself."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os

import pytest
from google.api_core import exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import storage
from google.oauth2.credentials import Credentials

from tests.emulators.storage import StorageEmulator
from tests.helpers import wait_until

PROJECT, NUMBER, OTHER, TOKEN = "tpupipe-emulated", "123456789012", "tpupipe-other", "t0ken"
ROLE = "roles/storage.objectUser"
POOL = f"locations/global/workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/tpupipe/sa/ray"
MEMBER = f"principal://iam.googleapis.com/projects/{NUMBER}/{POOL}"


@pytest.fixture
def gcs(monkeypatch):
    emulator = StorageEmulator({PROJECT: NUMBER, OTHER: "210987654321"}, token=TOKEN)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.start())
    # the client's bucket-metadata cache fetches unseen buckets in the background (an extra buckets.get); off here,
    # so that calls and faults are the test's own (test_background_metadata_fetch shows it on)
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "1")
    yield emulator
    emulator.stop()


def client(project: str = PROJECT, token: str | None = TOKEN) -> storage.Client:
    return storage.Client(project=project, credentials=Credentials(token=token) if token else None)


def create(gcs_client: storage.Client, name: str = "tpupipe-ckpt", **fields) -> storage.Bucket:
    bucket = gcs_client.bucket(name)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    for key, value in fields.items():
        setattr(bucket, key, value)
    return gcs_client.create_bucket(bucket, location="us-east5")


def test_bucket_create_get_and_conflicts(gcs):
    gcs_client = client()
    created = create(gcs_client, labels={"tpupipe-run": "r1"})
    assert created.project_number == int(NUMBER) and created.location == "US-EAST5"
    bucket = gcs_client.get_bucket("tpupipe-ckpt")
    assert bucket.project_number == int(NUMBER) and bucket.location == "US-EAST5" and bucket.location_type == "region"
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled and bucket.storage_class == "STANDARD"
    assert bucket.labels == {"tpupipe-run": "r1"} and bucket.metageneration == 1 and bucket.time_created
    assert gcs.state.buckets["tpupipe-ckpt"]["projectNumber"] == NUMBER
    assert gcs_client.create_bucket("plain-bucket").location == "US"

    with pytest.raises(exceptions.Conflict, match="you already own it"):
        create(gcs_client)
    with pytest.raises(exceptions.Conflict, match="not available"):
        create(client(OTHER))
    with pytest.raises(exceptions.NotFound, match="bucket does not exist"):
        gcs_client.get_bucket("no-such-bucket")
    for name in ("Upper-Case", "ab", "a..b", "goog-bucket", "white space", "a" * 64):  # the client checks the ends
        with pytest.raises(exceptions.BadRequest, match="Invalid bucket name"):
            gcs_client.create_bucket(name)
    with pytest.raises(exceptions.BadRequest, match="Unknown project id: no-such-project"):
        client("no-such-project").create_bucket("orphan-bucket")
    odd = gcs_client.bucket("odd-bucket")
    odd._patch_property("bogusField", 1)
    with pytest.raises(exceptions.BadRequest, match="bogusField"):
        gcs_client.create_bucket(odd)
    assert sorted(gcs.state.buckets) == ["plain-bucket", "tpupipe-ckpt"]


def test_iam_policy_bindings(gcs):
    bucket = create(client())
    policy = bucket.get_iam_policy(requested_policy_version=3)
    assert policy.version == 1 and policy.etag == "CAE="  # no conditions: answered at version 1
    assert {b["role"]: b["members"] for b in policy.bindings} == {
        "roles/storage.legacyBucketOwner": {f"projectEditor:{PROJECT}", f"projectOwner:{PROJECT}"},
        "roles/storage.legacyBucketReader": {f"projectViewer:{PROJECT}"},
    }

    policy.bindings.append({"role": ROLE, "members": {MEMBER}})
    assert bucket.set_iam_policy(policy).etag == "CAI="
    assert gcs.members("tpupipe-ckpt", ROLE) == [MEMBER]
    assert client().get_bucket("tpupipe-ckpt").metageneration == 2  # the policy is bucket metadata
    with pytest.raises(exceptions.PreconditionFailed):  # policy still carries the etag it was read with
        bucket.set_iam_policy(policy)

    current = bucket.get_iam_policy(requested_policy_version=3)
    assert {"role": ROLE, "members": {MEMBER}} in current.bindings
    current.bindings = [b for b in current.bindings if b["role"] != ROLE]
    bucket.set_iam_policy(current)
    assert gcs.members("tpupipe-ckpt", ROLE) == []
    assert gcs.members("tpupipe-ckpt", "roles/storage.legacyBucketOwner") == [
        f"projectEditor:{PROJECT}",
        f"projectOwner:{PROJECT}",
    ]

    unresolved = f"principal://iam.googleapis.com/projects/{PROJECT}/{POOL}"  # project id where the number goes
    for role, member in ((ROLE, unresolved), (ROLE, "ray@example.com"), ("storage.objectUser", MEMBER)):
        policy = bucket.get_iam_policy(requested_policy_version=3)
        policy.bindings.append({"role": role, "members": {member}})
        with pytest.raises(exceptions.BadRequest) as raised:
            bucket.set_iam_policy(policy)
        assert (member if role == ROLE else role) in raised.value.message
    assert gcs.state.policies["tpupipe-ckpt"]["bindings"] == current.to_api_repr()["bindings"]
    with pytest.raises(exceptions.NotFound):
        client().bucket("no-such-bucket").get_iam_policy()


def test_default_retries_of_503(gcs):
    gcs_client = client()
    gcs.fail("buckets.insert", 503)
    bucket = create(gcs_client)  # retried by default (DEFAULT_RETRY)
    gcs.fail("buckets.get", 503, when=lambda request: request["bucket"] == "tpupipe-ckpt")
    gcs_client.get_bucket("tpupipe-ckpt")  # retried
    gcs.fail("buckets.getIamPolicy", 503)
    policy = bucket.get_iam_policy(requested_policy_version=3)  # retried
    gcs.fail("buckets.setIamPolicy", 503)
    policy = bucket.set_iam_policy(policy)  # retried: the body carries an etag (DEFAULT_RETRY_IF_ETAG_IN_JSON)
    assert (
        gcs.state.calls
        == ["buckets.insert"] * 2 + ["buckets.get"] * 2 + ["buckets.getIamPolicy"] * 2 + ["buckets.setIamPolicy"] * 2
    )

    gcs.state.calls.clear()
    policy.etag = None
    gcs.fail("buckets.setIamPolicy", 503, message="backend unavailable")
    with pytest.raises(exceptions.ServiceUnavailable, match="backend unavailable"):
        bucket.set_iam_policy(policy)  # without an etag a set is not retried
    assert gcs.state.calls == ["buckets.setIamPolicy"]
    # one 404, then the bucket: a retried get would answer it, so the NotFound shows the 404 was not retried. (After a
    # 404 the client also checks, in a background thread, whether a bucket it has cached still exists: an extra
    # buckets.get at a time of its own, so the calls are not counted here.)
    gcs.fail("buckets.get", 404)
    with pytest.raises(exceptions.NotFound):  # not retryable
        gcs_client.get_bucket("tpupipe-ckpt")


def test_credentials_and_token(gcs):
    with pytest.raises(auth_exceptions.RefreshError):  # the 401 makes the session refresh a bare token: it can't
        client(token="wrong-token").get_bucket("any-bucket")
    anonymous = client(token=None)  # no credentials under STORAGE_EMULATOR_HOST: anonymous, no Authorization header
    assert type(anonymous._credentials).__name__ == "AnonymousCredentials"
    with pytest.raises(auth_exceptions.InvalidOperation, match="Anonymous credentials cannot be refreshed"):
        anonymous.get_bucket("any-bucket")
    assert gcs.state.calls == ["buckets.get", "buckets.get"] and not gcs.state.buckets
    open_gcs = StorageEmulator({PROJECT: NUMBER})  # no token: anyone
    try:
        endpoint = open_gcs.start()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("STORAGE_EMULATOR_HOST", endpoint)
            assert client(token=None).create_bucket("open-bucket").project_number == int(NUMBER)
    finally:
        open_gcs.stop()


def test_background_metadata_fetch(gcs, monkeypatch):
    create(client())
    monkeypatch.delenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA")
    gcs.state.calls.clear()
    client().bucket("tpupipe-ckpt").get_iam_policy()  # a fresh client has not seen the bucket
    wait_until(lambda: "buckets.get" in gcs.state.calls, 5, "the background buckets.get", 0.02)
    assert sorted(gcs.state.calls) == ["buckets.get", "buckets.getIamPolicy"]


# ---------------------------------------------------------------------- objects
CONTEXT = "runs/r1/build/context.tar.gz"


def test_object_upload_get_download_delete(gcs, tmp_path):
    bucket = create(client())
    data = gzip.compress(b"FROM python:3.12\n" * 50) + bytes(range(256))  # binary, not UTF-8
    path = tmp_path / "context.tar.gz"
    path.write_bytes(data)
    blob = bucket.blob(CONTEXT)
    blob.upload_from_filename(path)  # small: one multipart upload
    assert gcs.state.calls[-1] == "objects.insert"
    stored = gcs.state.objects[("tpupipe-ckpt", CONTEXT)]
    assert stored["data"] == data and stored["metadata"]["size"] == str(len(data))
    assert stored["metadata"]["contentType"] == "application/x-tar"  # guessed by the client from the file name
    assert stored["metadata"]["md5Hash"] == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert blob.generation == int(stored["metadata"]["generation"]) and blob.size == len(data) and blob.crc32c

    assert blob.exists() and not bucket.blob("runs/r1/other").exists()
    got = client().bucket("tpupipe-ckpt").get_blob(CONTEXT)  # the name's "/" travel URL-encoded
    assert (got.size, got.md5_hash, got.crc32c, got.generation) == (
        len(data),
        blob.md5_hash,
        blob.crc32c,
        blob.generation,
    )
    assert got.time_created and got.metageneration == 1 and got.storage_class == "STANDARD"
    assert client().bucket("tpupipe-ckpt").get_blob("runs/r1/missing") is None
    assert got.download_as_bytes() == data  # through mediaLink, the client checking the x-goog-hash it is sent
    assert bucket.blob(CONTEXT).download_as_bytes() == data  # through /download/storage/v1/..., found by name
    assert bucket.blob(CONTEXT).download_as_bytes(start=10, end=19) == data[10:20]  # a Range: 206
    target = tmp_path / "downloaded"
    got.download_to_filename(target)
    assert target.read_bytes() == data

    text = bucket.blob("runs/r1/notes.txt")
    text.upload_from_string("héllo", content_type="text/plain")
    assert text.download_as_text() == "héllo" and bucket.get_blob("runs/r1/notes.txt").content_type == "text/plain"
    second = bucket.blob(CONTEXT)
    second.upload_from_string(b"v2")  # a new generation replaces the object
    assert second.generation > blob.generation and bucket.blob(CONTEXT).download_as_bytes() == b"v2"
    with pytest.raises(exceptions.NotFound):  # the old generation is gone
        bucket.blob(CONTEXT, generation=blob.generation).download_as_bytes()

    second.delete()
    assert not second.exists() and ("tpupipe-ckpt", CONTEXT) not in gcs.state.objects
    with pytest.raises(exceptions.NotFound, match=f"No such object: tpupipe-ckpt/{CONTEXT}"):
        second.delete()
    with pytest.raises(exceptions.NotFound):
        second.download_as_bytes()
    with pytest.raises(exceptions.NotFound, match="bucket does not exist"):
        client().bucket("no-such-bucket").blob("x").upload_from_string(b"data")


def test_resumable_upload(gcs):
    bucket = create(client())
    data = os.urandom(600 * 1024)
    blob = bucket.blob("runs/r1/big.bin", chunk_size=256 * 1024)
    gcs.state.calls.clear()
    blob.upload_from_file(io.BytesIO(data))  # a stream of unknown size (or over 8 MiB) is uploaded resumably
    assert gcs.state.calls == ["objects.insert"] * 4  # the start and three chunks
    assert blob.size == len(data) and gcs.state.objects[("tpupipe-ckpt", "runs/r1/big.bin")]["data"] == data
    assert bucket.blob("runs/r1/big.bin").download_as_bytes() == data
    assert not any(session["data"] for session in gcs.state.uploads.values())
    with pytest.raises(exceptions.NotFound):
        client().bucket("no-such-bucket").blob("x").upload_from_file(io.BytesIO(data))


def test_object_checks(gcs):
    bucket = create(client())
    blob = bucket.blob("runs/r1/a.txt")
    blob.md5_hash = base64.b64encode(hashlib.md5(b"other").digest()).decode()  # sent with the data, and wrong
    with pytest.raises(exceptions.BadRequest, match="Provided MD5 hash"):
        blob.upload_from_string(b"data")
    bucket.blob("runs/r1/a.txt").upload_from_string(b"data", if_generation_match=0)  # only if there is none
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("runs/r1/a.txt").upload_from_string(b"data", if_generation_match=0)
    assert sorted(name for _, name in gcs.state.objects) == ["runs/r1/a.txt"]


def test_object_faults_and_retries(gcs):
    bucket = create(client())
    gcs.state.calls.clear()
    gcs.fail("objects.insert", 503, message="backend unavailable")
    with pytest.raises(exceptions.ServiceUnavailable, match="backend unavailable"):
        bucket.blob("runs/r1/a.txt").upload_from_string(b"data", retry=None)
    assert gcs.state.calls == ["objects.insert"] and not gcs.state.objects
    gcs.fail("objects.insert", 503, when=lambda request: request["object"] == "runs/r1/a.txt")
    bucket.blob("runs/r1/a.txt").upload_from_string(b"data")  # uploads are retried by default (DEFAULT_RETRY)
    gcs.fail("objects.get", 503)
    assert bucket.get_blob("runs/r1/a.txt").size == 4  # retried
    gcs.fail("objects.get", 503, when=lambda request: request["query"].get("alt") == "media")
    assert bucket.blob("runs/r1/a.txt").download_as_bytes() == b"data"  # retried
    assert gcs.state.calls == ["objects.insert"] * 3 + ["objects.get"] * 4
    gcs.fail("objects.get", 403, times=2)
    with pytest.raises(exceptions.Forbidden):  # not retryable
        bucket.blob("runs/r1/a.txt").download_as_bytes()
    assert gcs.faults[-1].times == 1


def test_objects_are_listed_by_prefix_delimiter_and_match_glob(gcs):
    c = client()
    bucket = create(c, "tpupipe-runs")
    for name in (
        "runs/a/ledger.json",
        "runs/a/stages/train.json",
        "runs/b/ledger.json",
        "runs/b/ckpt/ledger.json",
        "other/c/ledger.json",
    ):
        bucket.blob(name).upload_from_string(b"{}")
    globbed = c.list_blobs("tpupipe-runs", prefix="runs/", match_glob="runs/*/ledger.json")
    assert [b.name for b in globbed] == ["runs/a/ledger.json", "runs/b/ledger.json"]  # * stays in one segment
    deep = c.list_blobs("tpupipe-runs", prefix="runs/", match_glob="runs/**/ledger.json")
    assert [b.name for b in deep] == ["runs/a/ledger.json", "runs/b/ckpt/ledger.json", "runs/b/ledger.json"]
    listing = c.list_blobs("tpupipe-runs", prefix="runs/", delimiter="/")
    assert list(listing) == [] and listing.prefixes == {"runs/a/", "runs/b/"}
    with pytest.raises(exceptions.NotFound):
        list(c.list_blobs("no-such-bucket"))
