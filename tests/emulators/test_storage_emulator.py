"""The Cloud Storage emulator through the real google-cloud-storage client (JSON API over HTTP, found through
STORAGE_EMULATOR_HOST): buckets and their IAM policies, objects (uploaded, read, downloaded, deleted, copied), Cloud
Storage's validation and error shapes, injected faults, and which calls the client retries by itself; each test with
the objects kept in memory and kept as files (``root``), and the files that a writer outside the API (a pod, through
its Cloud Storage FUSE mount) writes as objects."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re

import pytest
from google.api_core import exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import storage
from google.oauth2.credentials import Credentials

from tests.emulators import iam
from tests.emulators.storage import StorageEmulator
from tests.helpers import wait_until

PROJECT, NUMBER, OTHER, TOKEN = "tpupipe-emulated", "123456789012", "tpupipe-other", "t0ken"
ROLE = "roles/storage.objectUser"
POOL = f"locations/global/workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/tpupipe/sa/ray"
MEMBER = f"principal://iam.googleapis.com/projects/{NUMBER}/{POOL}"


@pytest.fixture(params=["memory", "files"])
def gcs(request, monkeypatch, tmp_path):
    root = tmp_path / "buckets" if request.param == "files" else None
    emulator = StorageEmulator({PROJECT: NUMBER, OTHER: "210987654321"}, token=TOKEN, root=root)
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


def test_a_bucket_has_hierarchical_namespace_only_from_its_creation_and_only_with_uniform_access(gcs):
    gcs_client = client()
    create(gcs_client, "tpupipe-hns", hierarchical_namespace_enabled=True)
    create(gcs_client, "tpupipe-flat")
    assert gcs_client.get_bucket("tpupipe-hns").hierarchical_namespace_enabled is True
    assert not gcs_client.get_bucket("tpupipe-flat").hierarchical_namespace_enabled
    fine_grained = gcs_client.bucket("tpupipe-acl")
    fine_grained.hierarchical_namespace_enabled = True
    with pytest.raises(exceptions.BadRequest, match="requires uniform bucket-level access"):
        gcs_client.create_bucket(fine_grained, location="us-east5")
    assert "tpupipe-acl" not in gcs.state.buckets


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
    stored = gcs.object("tpupipe-ckpt", CONTEXT)
    assert gcs.data("tpupipe-ckpt", CONTEXT) == data and stored["size"] == str(len(data))
    assert stored["contentType"] == "application/x-tar"  # guessed by the client from the file name
    assert stored["md5Hash"] == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert blob.generation == int(stored["generation"]) and blob.size == len(data) and blob.crc32c

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
    assert not second.exists() and CONTEXT not in gcs.objects_of("tpupipe-ckpt")
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
    assert blob.size == len(data) and gcs.data("tpupipe-ckpt", "runs/r1/big.bin") == data
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
    assert list(gcs.objects_of("tpupipe-ckpt")) == ["runs/r1/a.txt"]


def test_object_faults_and_retries(gcs):
    bucket = create(client())
    gcs.state.calls.clear()
    gcs.fail("objects.insert", 503, message="backend unavailable")
    with pytest.raises(exceptions.ServiceUnavailable, match="backend unavailable"):
        bucket.blob("runs/r1/a.txt").upload_from_string(b"data", retry=None)
    assert gcs.state.calls == ["objects.insert"] and not gcs.objects_of("tpupipe-ckpt")
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


def test_a_listing_is_flat_and_by_name_hidden_names_included(gcs):
    """objects.list answers every object under the prefix, "ordered in the list lexicographically by name", in a
    flat namespace: a writer's ``_temporary/`` attempts and ``_SUCCESS`` are objects like any other, so what is
    data is the reader's to decide (components/data/drops.py)."""
    c = client()
    bucket = create(c, "tpupipe-drops")
    for name in (
        "d/part-1.jsonl",
        "d/_temporary/0/part-9.jsonl",
        "d/_SUCCESS",
        "d/.part-1.jsonl.crc",
        "d/part-0.jsonl",
    ):
        bucket.blob(name).upload_from_string(b"{}")
    assert [b.name for b in c.list_blobs("tpupipe-drops", prefix="d/")] == [
        "d/.part-1.jsonl.crc",
        "d/_SUCCESS",
        "d/_temporary/0/part-9.jsonl",
        "d/part-0.jsonl",
        "d/part-1.jsonl",
    ]
    assert [b.name for b in c.list_blobs("tpupipe-drops", prefix="e/")] == []  # no drop: an empty listing, no error


def test_objects_are_listed_in_pages(gcs):
    c = client()
    create(c, "tpupipe-runs")
    names = [f"runs/{i:04d}.json" for i in range(2345)]
    for name in names:
        gcs.put("tpupipe-runs", name, b"{}")
    gcs.state.calls.clear()
    assert [b.name for b in c.list_blobs("tpupipe-runs")] == names  # the client follows nextPageToken
    assert gcs.state.calls == ["objects.list"] * 3  # at most 1,000 a page, whatever maxResults asks
    pages = list(c.list_blobs("tpupipe-runs", page_size=5000).pages)
    assert [page.num_items for page in pages] == [1000, 1000, 345]
    pages = list(c.list_blobs("tpupipe-runs", page_size=1000).pages)  # no empty page after an exact fit
    assert [page.num_items for page in pages] == [1000, 1000, 345]

    for name in ("dirs/a/1", "dirs/a/2", "dirs/a/3", "dirs/b/1", "dirs/c", "dirs/d/1/x", "dirs/e"):
        gcs.put("tpupipe-runs", name, b"{}")
    # with a delimiter, a page holds maxResults entries, items and prefixes together, each prefix once
    listing = c.list_blobs("tpupipe-runs", prefix="dirs/", delimiter="/", page_size=2)
    seen = [(sorted(b.name for b in page), sorted(page.prefixes)) for page in listing.pages]
    assert seen == [([], ["dirs/a/", "dirs/b/"]), (["dirs/c"], ["dirs/d/"]), (["dirs/e"], [])]
    with pytest.raises(exceptions.BadRequest, match="maxResults"):
        list(c.list_blobs("tpupipe-runs", page_size=0))
    with pytest.raises(exceptions.BadRequest, match="Invalid page token"):
        list(c.list_blobs("tpupipe-runs", page_token="not-a-token"))


# ---------------------------------------------------------------------- IAM for members other than the owner
BUCKET = "tpupipe-ckpt"


def objects_under(prefix: str) -> str:
    """The condition that holds for the bucket's objects whose names start with ``prefix``."""
    return f'resource.name.startsWith("projects/_/buckets/{BUCKET}/objects/{prefix}")'


RUN_A = objects_under("runs/a/")
LISTER = RUN_A + ' || resource.type == "storage.googleapis.com/Bucket"'  # the objects of runs/a/, and the bucket


NOUNS = {
    "object": "Google Cloud Storage object",
    "bucket": "Google Cloud Storage bucket",
    "project": "Google Cloud project",
}


def refusal(permission: str, kind: str, member: str = MEMBER) -> str:
    """Cloud Storage's message for a permission refused on a resource of ``kind``, as a pattern."""
    return re.escape(
        f"{member} does not have {permission} access to the {NOUNS[kind]}. "
        f"Permission '{permission}' denied on resource (or it may not exist)."
    )


def grant(bucket: storage.Bucket, role: str, member: str = MEMBER, expression: str = "") -> None:
    """Add a binding (conditioned on ``expression`` when given) to the bucket's policy, as its owner."""
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    binding = {"role": role, "members": {member}}
    if expression:
        binding["condition"] = {"title": "run a", "expression": expression}
    policy.bindings.append(binding)
    bucket.set_iam_policy(policy)


def as_member(gcs: StorageEmulator, member: str = MEMBER) -> storage.Client:
    """A client whose credentials are ``member``'s token (what a pod gets through Workload Identity Federation)."""
    return client(token=gcs.token_for(member))


def test_a_gke_pod_is_granted_by_any_identifier_iam_knows_it_by_and_a_uid_names_one_service_account(gcs):
    """A pod's federated identity (``token_for_pod``) is granted by a binding to its ServiceAccount by name (in any
    cluster of the pool: "Identity sameness"), by its UID, to its namespace or to its cluster; a binding by UID grants
    no namesake (another cluster's ServiceAccount of the same namespace and name, or one made again)."""
    owner = create(client())
    cluster = f"projects/{PROJECT}/locations/us-east5-b/clusters/"
    pool = (
        f"principal://iam.googleapis.com/projects/{NUMBER}/locations/global/workloadIdentityPools/{PROJECT}.svc.id.goog"
    )
    pods = {
        "the run's": (cluster + "run", "uid-run"),
        "another cluster's namesake": (cluster + "other", "uid-other"),
        "the run's cluster's namesake, made again": (cluster + "run", "uid-again"),  # as ``again`` below
    }
    clients = {who: client(token=gcs.token_for_pod(c, "tpupipe", "ray", uid)) for who, (c, uid) in pods.items()}
    owner.blob("runs/a/x").upload_from_string(b"x")
    sets = f"principalSet://{pool[len('principal://') :]}"
    again = "the run's cluster's namesake, made again"
    for member, allowed in (
        (f"{pool}/subject/ns/tpupipe/sa/ray", set(pods)),  # the name form: every namesake in the pool
        (f"{pool}/kubernetes.serviceaccount.uid/uid-run", {"the run's"}),
        (f"{sets}/namespace/tpupipe", set(pods)),
        (f"{sets}/kubernetes.cluster/https://container.googleapis.com/v1/{cluster}run", {"the run's", again}),
    ):
        policy = owner.get_iam_policy(requested_policy_version=3)
        policy.bindings[:] = [b for b in policy.bindings if b["role"] != "roles/storage.objectViewer"]
        owner.set_iam_policy(policy)
        grant(owner, "roles/storage.objectViewer", member)
        for who, gcs_client in clients.items():
            if who in allowed:
                assert gcs_client.bucket(BUCKET).blob("runs/a/x").download_as_bytes() == b"x", (member, who)
            else:
                with pytest.raises(exceptions.Forbidden, match="storage.objects.get"):
                    gcs_client.bucket(BUCKET).blob("runs/a/x").download_as_bytes()


def test_a_prefix_grant_confines_a_workload_identity_to_its_prefix(gcs):
    owner = create(client())
    owner.blob("state/a/ledger.json").upload_from_string(b"{}")
    owner.blob("runs/b/ckpt").upload_from_string(b"b")
    grant(owner, ROLE, expression=LISTER)
    policy = owner.get_iam_policy(requested_policy_version=3)
    pod_client = as_member(gcs)
    pod = pod_client.bucket(BUCKET)

    pod.blob("runs/a/x").upload_from_string(b"one")  # create
    assert pod.blob("runs/a/x").download_as_bytes() == b"one" and pod.get_blob("runs/a/x").size == 3  # read
    pod.blob("runs/a/x").upload_from_string(b"two")  # overwrite: create and delete
    pod.blob("runs/a/big", chunk_size=256 * 1024).upload_from_file(io.BytesIO(os.urandom(300 * 1024)))  # resumable
    assert [b.name for b in pod_client.list_blobs(BUCKET, prefix="runs/a/")] == ["runs/a/big", "runs/a/x"]
    # the bucket clause allows listing the whole bucket: listing is checked on the bucket, not on the names listed
    assert [b.name for b in pod_client.list_blobs(BUCKET, prefix="state/")] == ["state/a/ledger.json"]
    assert pod.get_blob("runs/a/missing") is None  # allowed, then not found
    pod.blob("runs/a/x").delete()
    assert gcs.data(BUCKET, "runs/a/x") is None

    refused = [
        ("storage.objects.create", "object", lambda: pod.blob("runs/b/ledger.json").upload_from_string(b"{}")),
        ("storage.objects.create", "object", lambda: pod.blob("runs/b/big").upload_from_file(io.BytesIO(b"x"))),
        ("storage.objects.get", "object", lambda: pod.blob("state/a/ledger.json").download_as_bytes()),
        ("storage.objects.get", "object", lambda: pod.get_blob("state/a/ledger.json")),
        ("storage.objects.delete", "object", lambda: pod.blob("runs/b/ckpt").delete()),
        ("storage.buckets.get", "bucket", lambda: pod_client.get_bucket(BUCKET)),  # objectUser has no buckets.*
        ("storage.buckets.getIamPolicy", "bucket", lambda: pod.get_iam_policy(requested_policy_version=3)),
        (
            "storage.buckets.setIamPolicy",
            "bucket",
            lambda: pod.set_iam_policy(policy),
        ),
    ]
    for permission, kind, call in refused:
        with pytest.raises(exceptions.Forbidden, match=refusal(permission, kind)):
            call()
    assert list(gcs.objects_of(BUCKET)) == ["runs/a/big", "runs/b/ckpt", "state/a/ledger.json"]


def test_a_prefix_grant_alone_does_not_allow_listing(gcs):
    owner = create(client())
    grant(owner, ROLE, expression=RUN_A)  # no bucket clause: objects.list, checked on the bucket, is not granted
    pod_client = as_member(gcs)
    pod_client.bucket(BUCKET).blob("runs/a/x").upload_from_string(b"x")
    assert pod_client.bucket(BUCKET).blob("runs/a/x").download_as_bytes() == b"x"
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.list", "bucket")):
        list(pod_client.list_blobs(BUCKET, prefix="runs/a/"))


def test_viewer_and_creator_roles(gcs):
    owner = create(client())
    owner.blob("runs/a/x").upload_from_string(b"x")
    viewer, creator = MEMBER.replace("sa/ray", "sa/viewer"), MEMBER.replace("sa/ray", "sa/creator")
    grant(owner, "roles/storage.objectViewer", viewer, RUN_A)
    grant(owner, "roles/storage.objectCreator", creator, RUN_A)
    read_only = as_member(gcs, viewer).bucket(BUCKET)
    assert read_only.blob("runs/a/x").download_as_bytes() == b"x"
    for name in ("runs/a/new", "runs/a/x"):  # neither create nor overwrite
        with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.create", "object", viewer)):
            read_only.blob(name).upload_from_string(b"y")

    write_only = as_member(gcs, creator).bucket(BUCKET)
    write_only.blob("runs/a/new").upload_from_string(b"new")
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.delete", "object", creator)):
        write_only.blob("runs/a/new").upload_from_string(b"again")  # overwriting needs delete, which it lacks
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.get", "object", creator)):
        write_only.blob("runs/a/new").download_as_bytes()
    assert gcs.data(BUCKET, "runs/a/x") == b"x" and gcs.data(BUCKET, "runs/a/new") == b"new"


def test_a_member_without_a_binding_is_refused_everything(gcs):
    owner = create(client())
    owner.blob("runs/a/x").upload_from_string(b"x")
    grant(owner, "roles/storage.admin", MEMBER.replace("sa/ray", "sa/admin"))  # someone else's binding
    policy = owner.get_iam_policy(requested_policy_version=3)
    stranger = as_member(gcs)
    bucket = stranger.bucket(BUCKET)
    refused = [
        ("storage.buckets.get", "bucket", lambda: stranger.get_bucket(BUCKET)),
        ("storage.buckets.get", "bucket", lambda: stranger.get_bucket("no-such-bucket")),  # 403, not 404
        ("storage.objects.list", "bucket", lambda: list(stranger.list_blobs(BUCKET))),
        ("storage.objects.create", "object", lambda: bucket.blob("runs/a/y").upload_from_string(b"y")),
        ("storage.objects.get", "object", lambda: bucket.blob("runs/a/x").download_as_bytes()),
        ("storage.objects.delete", "object", lambda: bucket.blob("runs/a/x").delete()),
        ("storage.buckets.getIamPolicy", "bucket", lambda: bucket.get_iam_policy()),
        ("storage.buckets.setIamPolicy", "bucket", lambda: bucket.set_iam_policy(policy)),
        ("storage.buckets.create", "project", lambda: create(stranger, "stranger-bucket")),
    ]
    for permission, kind, call in refused:
        with pytest.raises(exceptions.Forbidden, match=refusal(permission, kind)):
            call()
    assert sorted(gcs.state.buckets) == [BUCKET] and gcs.data(BUCKET, "runs/a/x") == b"x"


def test_test_iam_permissions_answers_what_the_caller_holds_on_the_bucket(gcs):
    owner = create(client())
    read = ["storage.objects.list", "storage.objects.get", "storage.objects.create"]
    assert owner.test_iam_permissions(read) == read  # the owner's token holds everything
    stranger = as_member(gcs).bucket(BUCKET)
    assert stranger.test_iam_permissions(read) == []  # no permission needed to ask
    grant(owner, "roles/storage.objectViewer")
    assert stranger.test_iam_permissions(read) == ["storage.objects.list", "storage.objects.get"]
    viewer = MEMBER.replace("sa/ray", "sa/viewer")
    grant(owner, "roles/storage.objectViewer", viewer, RUN_A)  # objects of runs/a/ only: not the bucket's
    assert as_member(gcs, viewer).bucket(BUCKET).test_iam_permissions(read) == []
    with pytest.raises(exceptions.BadRequest, match="storage.buckets.list"):
        stranger.test_iam_permissions(["storage.buckets.list"])
    with pytest.raises(exceptions.NotFound, match="bucket does not exist"):
        as_member(gcs).bucket("no-such-bucket").test_iam_permissions(read)
    assert gcs.state.calls.count("buckets.testIamPermissions") == 6


def test_an_unconditional_admin_and_a_negated_condition(gcs):
    owner = create(client())
    owner.blob("runs/a/x").upload_from_string(b"x")
    admin = MEMBER.replace("sa/ray", "sa/admin")
    grant(owner, "roles/storage.admin", admin)
    admin_client = as_member(gcs, admin)
    assert admin_client.get_bucket(BUCKET).name == BUCKET
    grant(admin_client.bucket(BUCKET), "roles/storage.objectViewer", expression=f"!({objects_under('runs/secret/')})")
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.buckets.create", "project", admin)):
        create(admin_client, "admin-bucket")  # a project permission: a bucket's policy cannot grant it

    owner.blob("runs/secret/key").upload_from_string(b"k")
    reader = as_member(gcs).bucket(BUCKET)
    assert reader.blob("runs/a/x").download_as_bytes() == b"x"
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.get", "object")):
        reader.blob("runs/secret/key").download_as_bytes()


def test_a_condition_outside_the_subset_is_refused(gcs):
    bucket = create(client())
    for expression in (
        'resource.name.endsWith(".json")',
        'request.time < timestamp("2030-01-01T00:00:00Z")',
        'resource.service == "storage.googleapis.com"',
        '!resource.name == "x"',  # CEL reads it (!resource.name) == "x": ! of a string
        "resource.name",  # a string, not a condition
        'resource.name.startsWith("runs/"',
        'resource.name.startsWith("a") &&',
        'resource.name.startsWith("a\\nb")',
        'resource.type != "storage.googleapis.com/Bucket"',
    ):
        with pytest.raises(exceptions.BadRequest, match="The emulator cannot evaluate the condition"):
            grant(bucket, ROLE, expression=expression)
    assert gcs.members(BUCKET, ROLE) == [] and client().get_bucket(BUCKET).metageneration == 1


@pytest.mark.parametrize(
    ("expression", "holds_for_object", "holds_for_bucket"),
    [
        (RUN_A, True, False),
        (LISTER, True, True),
        (f"!{RUN_A}", False, True),
        ('resource.type == "storage.googleapis.com/Object" && !(resource.name == "x")', True, False),
        (f'({RUN_A} || resource.name == "x") && resource.type == "storage.googleapis.com/Bucket"', False, False),
        (f"'projects/_/buckets/{BUCKET}' == resource.name", False, True),
        ("resource.name.startsWith('projects/_/buckets/' + 'x')", None, None),  # + is outside the subset
    ],
)
def test_condition_evaluation(expression, holds_for_object, holds_for_bucket):
    bucket = {"resource.name": f"projects/_/buckets/{BUCKET}", "resource.type": iam.BUCKET_TYPE}
    obj = {"resource.name": f"projects/_/buckets/{BUCKET}/objects/runs/a/x", "resource.type": iam.OBJECT_TYPE}
    if holds_for_object is None:
        with pytest.raises(iam.UnsupportedCondition):
            iam.condition(expression)
        return
    assert (iam.condition(expression)(obj), iam.condition(expression)(bucket)) == (holds_for_object, holds_for_bucket)


def test_the_owners_token_is_not_checked(gcs):
    owner_client = client()
    owner = create(owner_client)
    policy = owner.get_iam_policy(requested_policy_version=3)
    policy.version = 3
    policy.bindings = [{"role": ROLE, "members": {MEMBER}, "condition": {"title": "a", "expression": RUN_A}}]
    owner.set_iam_policy(policy)  # the owner is in no binding now
    owner.blob("state/x").upload_from_string(b"x")
    owner.blob("state/x").upload_from_string(b"y")
    assert owner.blob("state/x").download_as_bytes() == b"y" and [b.name for b in owner_client.list_blobs(BUCKET)]
    owner.blob("state/x").delete()
    assert owner_client.get_bucket(BUCKET).metageneration == 2 and create(owner_client, "another-bucket")
    owner.set_iam_policy(owner.get_iam_policy(requested_policy_version=3))
    with pytest.raises(ValueError, match="not a principal"):
        gcs.token_for(f"projectOwner:{PROJECT}")  # a convenience value, not an identity


# ---------------------------------------------------------------------- objects as files (root)
@pytest.fixture
def files(monkeypatch, tmp_path):
    """An emulator that keeps the buckets' objects as files under ``tmp_path / "buckets"``."""
    emulator = StorageEmulator({PROJECT: NUMBER}, token=TOKEN, root=tmp_path / "buckets")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.start())
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "1")
    yield emulator
    emulator.stop()


def test_an_uploaded_object_is_a_file_in_the_buckets_directory(files):
    bucket = create(client())
    directory = files.bucket_dir("tpupipe-ckpt")
    assert directory.is_dir() and not any(directory.iterdir())  # made with the bucket, empty
    bucket.blob("runs/r1/notes.txt").upload_from_string("héllo", content_type="text/plain")
    bucket.blob("runs/r1/big.bin", chunk_size=256 * 1024).upload_from_file(io.BytesIO(b"b" * 300 * 1024))
    assert (directory / "runs/r1/notes.txt").read_text() == "héllo"
    assert (directory / "runs/r1/big.bin").read_bytes() == b"b" * 300 * 1024
    assert bucket.get_blob("runs/r1/notes.txt").content_type == "text/plain"  # the metadata is the emulator's
    bucket.blob("runs/r1/notes.txt").delete()
    assert not (directory / "runs/r1/notes.txt").exists()
    assert files.objects_of("tpupipe-ckpt") == {"runs/r1/big.bin": b"b" * 300 * 1024}
    for name in ("runs//x", "runs/r1/big.bin/under", "runs/r1", "runs/./x"):  # no file can hold these
        with pytest.raises(exceptions.BadRequest, match="no file can hold"):
            bucket.blob(name).upload_from_string(b"x")
    with pytest.raises(ValueError, match="in memory"):
        StorageEmulator({PROJECT: NUMBER}).bucket_dir("tpupipe-ckpt")


def test_a_file_written_outside_the_api_is_an_object(files):
    c = client()
    bucket = create(c)
    file = files.bucket_dir("tpupipe-ckpt") / "runs" / "r1" / "ckpt" / "model.bin"
    file.parent.mkdir(parents=True)
    data = os.urandom(70_000)
    file.write_bytes(data)  # as a pod writes it through its mount
    (file.parent / "empty-dir").mkdir()  # a directory is no object
    assert [b.name for b in c.list_blobs("tpupipe-ckpt", prefix="runs/")] == ["runs/r1/ckpt/model.bin"]
    listing = c.list_blobs("tpupipe-ckpt", prefix="runs/r1/", delimiter="/")
    assert list(listing) == [] and listing.prefixes == {"runs/r1/ckpt/"}
    assert [b.name for b in c.list_blobs("tpupipe-ckpt", match_glob="**/*.bin")] == ["runs/r1/ckpt/model.bin"]
    blob = bucket.get_blob("runs/r1/ckpt/model.bin")
    assert blob.size == len(data) and blob.content_type == "application/octet-stream"
    assert blob.md5_hash == base64.b64encode(hashlib.md5(data).digest()).decode()
    assert blob.download_as_bytes() == data  # checked by the client against x-goog-hash (crc32c and md5)
    assert bucket.blob("runs/r1/ckpt/model.bin").download_as_bytes(checksum="md5") == data
    assert bucket.blob("runs/r1/ckpt/model.bin").download_as_bytes(start=5, end=9) == data[5:10]
    assert bucket.get_blob("runs/r1/ckpt/model.bin").generation == blob.generation  # unchanged file, same object

    file.write_bytes(b"rewritten")  # rewritten by the pod: a new generation
    again = bucket.get_blob("runs/r1/ckpt/model.bin")
    assert again.generation > blob.generation and again.size == 9 and again.download_as_bytes() == b"rewritten"
    with pytest.raises(exceptions.PreconditionFailed):  # against the generation the file had before
        bucket.blob("runs/r1/ckpt/model.bin").upload_from_string(b"api", if_generation_match=blob.generation)
    bucket.blob("runs/r1/ckpt/model.bin").upload_from_string(b"api", if_generation_match=again.generation)
    assert file.read_bytes() == b"api"

    bucket.blob("runs/r1/ckpt/model.bin").delete()  # through the API: the file goes
    assert not file.exists() and files.data("tpupipe-ckpt", "runs/r1/ckpt/model.bin") is None
    (file.parent / "log.txt").write_text("one")
    assert files.objects_of("tpupipe-ckpt", "runs/") == {"runs/r1/ckpt/log.txt": b"one"}
    (file.parent / "log.txt").unlink()  # deleted by the pod: the object is gone
    assert bucket.get_blob("runs/r1/ckpt/log.txt") is None and list(c.list_blobs("tpupipe-ckpt")) == []


def test_a_members_requests_are_authorized_on_files_as_on_objects(files):
    owner = create(client())
    grant(owner, "roles/storage.objectCreator", expression=RUN_A)
    directory = files.bucket_dir(BUCKET)
    (directory / "runs" / "a").mkdir(parents=True)
    (directory / "runs" / "a" / "x").write_bytes(b"from a pod")
    pod = as_member(files).bucket(BUCKET)
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.delete", "object")):
        pod.blob("runs/a/x").upload_from_string(b"y")  # the file is an object: writing it is an overwrite
    pod.blob("runs/a/new").upload_from_string(b"new")
    assert files.data(BUCKET, "runs/a/new") == b"new"


def test_copy_and_rewrite(gcs):
    c = client()
    bucket = create(c)
    other = create(c, "tpupipe-models")
    source = other.blob("models/m1/ckpt/model.bin")
    source.metadata = {"step": "100"}
    source.upload_from_string(b"weights", content_type="application/x-weights")
    copied = other.copy_blob(source, bucket, "runs/r1/model/model.bin")
    assert gcs.state.calls.count("objects.copy") == 1
    assert copied.generation != source.generation and copied.size == 7 and copied.md5_hash == source.md5_hash
    assert (copied.content_type, copied.metadata) == ("application/x-weights", {"step": "100"})  # the source's
    assert bucket.blob("runs/r1/model/model.bin").download_as_bytes() == b"weights"
    with pytest.raises(exceptions.PreconditionFailed):  # the destination's precondition
        other.copy_blob(source, bucket, "runs/r1/model/model.bin", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):  # the source's
        other.copy_blob(source, bucket, "runs/r1/b", if_source_generation_match=source.generation + 1)
    with pytest.raises(exceptions.NotFound):
        other.copy_blob(other.blob("models/missing"), bucket, "runs/r1/c")
    with pytest.raises(exceptions.NotFound):
        other.copy_blob(source, c.bucket("no-such-bucket"), "runs/r1/c")

    destination = bucket.blob("runs/r1/model/rewritten.bin")
    token, rewritten, total = destination.rewrite(source)
    assert (token, rewritten, total) == (None, 7, 7) and gcs.state.calls.count("objects.rewrite") == 1
    assert destination.generation and destination.download_as_bytes() == b"weights"
    source.upload_from_string(b"v2")
    bucket.blob("runs/r1/model/model.bin").rewrite(source, if_generation_match=copied.generation)  # overwrites
    assert gcs.data("tpupipe-ckpt", "runs/r1/model/model.bin") == b"v2"
    with pytest.raises(exceptions.NotFound):
        bucket.blob("runs/r1/d").rewrite(other.blob("models/missing"))
    gcs.fail("objects.copy", 503, when=lambda request: request["destination"]["object"] == "runs/r1/e")
    with pytest.raises(exceptions.ServiceUnavailable):
        other.copy_blob(source, bucket, "runs/r1/e", retry=None)
    assert list(gcs.objects_of("tpupipe-ckpt")) == ["runs/r1/model/model.bin", "runs/r1/model/rewritten.bin"]


def test_a_copy_needs_get_on_the_source_and_create_on_the_destination(gcs):
    owner_client = client()
    owner = create(owner_client)
    owner.blob("models/m1/model.bin").upload_from_string(b"weights")
    owner.blob("runs/a/existing").upload_from_string(b"old")
    grant(owner, "roles/storage.objectCreator", expression=RUN_A)  # create under runs/a/, nothing to read
    pod = as_member(gcs).bucket(BUCKET)
    source = pod.blob("models/m1/model.bin")
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.get", "object")):
        pod.copy_blob(source, pod, "runs/a/model.bin")
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.get", "object")):
        pod.blob("runs/a/model.bin").rewrite(source)
    grant(owner, "roles/storage.objectViewer", expression=objects_under("models/"))
    pod.copy_blob(source, pod, "runs/a/model.bin")
    assert gcs.data(BUCKET, "runs/a/model.bin") == b"weights"
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.create", "object")):
        pod.copy_blob(source, pod, "runs/b/model.bin")  # outside its prefix
    with pytest.raises(exceptions.Forbidden, match=refusal("storage.objects.delete", "object")):
        pod.blob("runs/a/existing").rewrite(source)  # an overwrite needs delete, which objectCreator lacks
    assert gcs.data(BUCKET, "runs/a/existing") == b"old" and gcs.data(BUCKET, "runs/b/model.bin") is None


def test_a_held_object_cannot_be_deleted_or_replaced_until_its_hold_is_released(gcs):
    """Object holds (https://cloud.google.com/storage/docs/object-holds): objects.patch sets and releases a temporary
    or event-based hold (a new metageneration, the same generation); while either holds, a delete, an upload over it
    and a copy over it are refused (403) and the object is as it was; its metadata may still change."""
    bucket = create(client())
    bucket.blob("models/m/r/weights").upload_from_string(b"kept")
    source = bucket.blob("runs/r/weights")
    source.upload_from_string(b"other")
    for hold in ("temporary_hold", "event_based_hold"):
        held = bucket.get_blob("models/m/r/weights")
        generation, metageneration = held.generation, held.metageneration
        setattr(held, hold, True)
        held.patch()
        assert getattr(held, hold) is True and held.generation == generation
        assert held.metageneration == metageneration + 1
        kind = "Temporary" if hold == "temporary_hold" else "Event-Based"
        for call in (
            held.delete,
            lambda: bucket.blob("models/m/r/weights").upload_from_string(b"replaced"),
            lambda: bucket.copy_blob(source, bucket, "models/m/r/weights"),
        ):
            with pytest.raises(exceptions.Forbidden, match=f"under active {kind} hold"):
                call()
        held.metadata = {"note": "still editable"}
        held.patch()
        assert gcs.data(BUCKET, "models/m/r/weights") == b"kept"
        setattr(held, hold, False)
        held.patch()
    bucket.blob("models/m/r/weights").upload_from_string(b"replaced")  # released: an ordinary object again
    bucket.blob("models/m/r/weights").delete()
    assert gcs.data(BUCKET, "models/m/r/weights") is None


def test_a_retention_policy_refuses_to_delete_or_replace_a_young_object_and_allows_a_metadata_patch(gcs):
    """A bucket's retention policy: "objects in the bucket can only be deleted or replaced once their age is greater
    than the retention period" (https://cloud.google.com/storage/docs/bucket-lock), 403 otherwise; a metadata patch is
    neither, so it is allowed, and it raises the metageneration, the generation kept."""
    bucket = create(client(), retention_period=3600)
    assert client().get_bucket(BUCKET).retention_policy_effective_time is not None
    bucket.blob("models/m/r/weights").upload_from_string(b"kept")
    source = bucket.blob("runs/r/weights")
    source.upload_from_string(b"other")
    kept = bucket.get_blob("models/m/r/weights")
    for call in (
        kept.delete,
        lambda: bucket.blob("models/m/r/weights").upload_from_string(b"replaced"),
        lambda: bucket.blob("models/m/r/weights").rewrite(source),
    ):
        with pytest.raises(exceptions.Forbidden, match="subject to bucket's retention policy"):
            call()
    generation = kept.generation
    kept.metadata = {"note": "editable"}
    kept.patch(if_generation_match=generation, if_metageneration_match=1)
    assert (kept.generation, kept.metageneration, kept.metadata) == (generation, 2, {"note": "editable"})
    assert gcs.data(BUCKET, "models/m/r/weights") == b"kept"


def test_a_delete_or_patch_at_a_stale_metageneration_is_refused(gcs):
    """objects.delete and objects.patch take ``ifMetagenerationMatch`` ("Makes the operation conditional on whether
    the object's current metageneration matches the given value": https://cloud.google.com/storage/docs/json_api/v1/
    objects/delete), and a patch raises it ("The metageneration number is incremented each time there is a metadata
    update": https://cloud.google.com/storage/docs/metadata#generation-number, and with it the etag): after another
    writer's patch, a delete
    at the generation and metageneration first written is refused (412) and leaves the object."""
    bucket = create(client())
    written = bucket.blob("models/m/r/weights")
    written.upload_from_string(b"kept")
    generation, etag = written.generation, written.etag
    theirs = bucket.get_blob("models/m/r/weights")
    theirs.metadata = {"owner": "another copy"}
    theirs.patch(if_generation_match=generation, if_metageneration_match=1)
    assert theirs.etag != etag  # the resource's etag, of its generation and metageneration
    with pytest.raises(exceptions.PreconditionFailed):
        written.delete(if_generation_match=generation, if_metageneration_match=1)
    with pytest.raises(exceptions.PreconditionFailed):
        written.patch(if_generation_match=generation, if_metageneration_match=1)
    assert gcs.data(BUCKET, "models/m/r/weights") == b"kept"
    written.delete(if_generation_match=generation, if_metageneration_match=2)
    assert gcs.data(BUCKET, "models/m/r/weights") is None


def test_a_gzip_encoded_object_is_served_decompressed_unless_gzip_is_accepted_and_a_cut_download_stops_short(gcs):
    """Decompressive transcoding (https://cloud.google.com/storage/docs/transcoding): without ``Accept-Encoding:
    gzip`` the data inflated, no Content-Encoding, a Range ignored; with it the stored bytes, a Range honoured. The
    real client reads the data either way. A ``cut`` download sends part of its body and closes the connection."""
    import urllib3

    gcs_client = client()
    create(gcs_client)
    data = b"".join(b"line %d\n" % i for i in range(5000))
    packed = gzip.compress(data)
    blob = gcs_client.bucket("tpupipe-ckpt").blob("a.txt")
    blob.content_encoding = "gzip"
    blob.upload_from_string(packed)
    assert blob.download_as_bytes() == data
    url = f"{gcs.endpoint}/download/storage/v1/b/tpupipe-ckpt/o/a.txt?alt=media"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    plain = urllib3.request("GET", url, headers={**auth, "Range": "bytes=10-"}, decode_content=False)
    assert plain.status == 200 and plain.data == data and "Content-Encoding" not in plain.headers
    stored = urllib3.request("GET", url, headers={**auth, "Accept-Encoding": "gzip"}, decode_content=False)
    assert stored.data == packed and stored.headers["Content-Encoding"] == "gzip"
    ranged = urllib3.request(
        "GET", url, headers={**auth, "Accept-Encoding": "gzip", "Range": "bytes=10-"}, decode_content=False
    )
    assert ranged.status == 206 and ranged.data == packed[10:]
    assert [(asked, accepted) for _, _, asked, accepted in gcs.state.downloads[-3:]] == [
        ("bytes=10-", "identity"),  # urllib3's own
        ("", "gzip"),
        ("bytes=10-", "gzip"),
    ]

    gcs.cut(100, when=lambda request: request["object"] == "a.txt")
    cut = urllib3.request("GET", url, headers=auth, preload_content=False)
    with pytest.raises(urllib3.exceptions.ProtocolError, match="IncompleteRead"):
        cut.read()
    assert urllib3.request("GET", url, headers=auth).data == data  # the cut was one download's


def test_a_composite_object_has_its_crc32c_and_component_count_and_no_md5_and_so_has_a_copy_of_it(gcs):
    import google_crc32c

    bucket = create(client())
    parts = [bucket.blob(f"parts/{i}") for i in range(2)]
    for part, data in zip(parts, (b"abc", b"def"), strict=True):
        part.upload_from_string(data)
    whole = bucket.blob("whole")
    whole.compose(parts)
    crc32c = base64.b64encode(google_crc32c.value(b"abcdef").to_bytes(4, "big")).decode()
    assert (whole.size, whole.crc32c, whole.md5_hash, whole.component_count) == (6, crc32c, None, 2)
    assert whole.download_as_bytes() == b"abcdef"  # checked by the client against the CRC32C alone
    longer = bucket.blob("longer")
    longer.compose([whole, parts[0]])  # a composite source counts its own components
    assert (longer.component_count, longer.download_as_bytes()) == (3, b"abcdefabc")
    copied = bucket.copy_blob(whole, bucket, "copied")
    rewritten = bucket.blob("rewritten")
    rewritten.rewrite(whole)
    for each in (copied, rewritten):
        assert (each.crc32c, each.md5_hash, each.component_count) == (crc32c, None, 2)
    with pytest.raises(exceptions.PreconditionFailed):  # a source's precondition
        bucket.blob("stale").compose(parts, if_source_generation_match=[parts[0].generation + 1, parts[1].generation])
    with pytest.raises(exceptions.NotFound):
        bucket.blob("missing").compose([bucket.blob("parts/none")])
    with pytest.raises(exceptions.PreconditionFailed):  # the destination's
        whole.compose(parts, if_generation_match=0)
    assert "stale" not in gcs.objects_of("tpupipe-ckpt") and "missing" not in gcs.objects_of("tpupipe-ckpt")


def test_a_lost_reply_took_effect_and_a_retry_with_a_generation_precondition_finds_it(gcs):
    import requests

    bucket = create(client())
    source = bucket.blob("runs/r1/model.bin")
    source.upload_from_string(b"weights")
    gcs.state.calls.clear()
    gcs.lose("objects.rewrite")
    # A rewrite with ifGenerationMatch is retried by the client after a dropped connection
    # (DEFAULT_RETRY_IF_GENERATION_SPECIFIED); the retry finds the first try's object and fails its precondition.
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("models/m1/model.bin").rewrite(source, if_generation_match=0)
    assert gcs.state.calls == ["objects.rewrite"] * 2
    assert gcs.data("tpupipe-ckpt", "models/m1/model.bin") == b"weights"
    gcs.lose("objects.insert")
    with pytest.raises(requests.ConnectionError):  # no precondition: not retried, though it took effect
        bucket.blob("runs/r1/step.txt").upload_from_string(b"1", retry=None)
    assert gcs.data("tpupipe-ckpt", "runs/r1/step.txt") == b"1"


def test_another_writers_change_is_made_just_before_the_matching_call(gcs):
    bucket = create(client())
    source = bucket.blob("runs/r1/model.bin")
    source.upload_from_string(b"weights")
    gcs.meanwhile(
        "objects.rewrite",
        lambda: gcs.put("tpupipe-ckpt", "models/m1/model.bin", b"theirs"),
        when=lambda request: request["destination"]["object"] == "models/m1/model.bin",
    )
    with pytest.raises(exceptions.PreconditionFailed):  # their object came first
        bucket.blob("models/m1/model.bin").rewrite(source, if_generation_match=0)
    assert gcs.data("tpupipe-ckpt", "models/m1/model.bin") == b"theirs"
    bucket.blob("models/m2/model.bin").rewrite(source, if_generation_match=0)  # the change was made once
    assert gcs.data("tpupipe-ckpt", "models/m2/model.bin") == b"weights"


def test_a_rewrite_body_that_gives_metadata_replaces_all_of_the_sources(gcs):
    """objects.rewrite "Optionally overrides metadata" with its body, an object resource: a body that gives any of
    the destination's metadata replaces all of it (https://github.com/googleapis/google-cloud-java/issues/306), so
    what it does not give is not the source's, and it must give a contentType (400 "You must specify the content type
    of the destination object.": https://github.com/googleapis/google-cloud-java/pull/294); a body of the name alone
    (a new Blob's) overrides nothing."""
    bucket = create(client())
    source = bucket.blob("src/model.json")
    source.metadata, source.cache_control = {"step": "100"}, "no-store"
    source.upload_from_string(b"{}", content_type="application/json")
    plain = bucket.blob("dst/plain.json")
    plain.rewrite(source)
    assert (plain.content_type, plain.cache_control, plain.metadata) == (
        "application/json",
        "no-store",
        {"step": "100"},
    )
    custom = bucket.blob("dst/custom.json")
    custom.metadata = {"owner": "me"}
    with pytest.raises(exceptions.BadRequest, match="You must specify the content type of the destination object"):
        custom.rewrite(source)  # metadata without a content type
    assert gcs.object("tpupipe-ckpt", "dst/custom.json") is None
    whole = bucket.blob("dst/whole.json")
    whole.metadata, whole.content_type = {"owner": "me"}, "application/json"
    whole.rewrite(source)
    assert (whole.content_type, whole.metadata, whole.cache_control) == ("application/json", {"owner": "me"}, None)
