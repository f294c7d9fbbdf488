"""components.data.gcs against the Cloud Storage emulator (tests/emulators/storage.py), through the real
google-cloud-storage client: a dataset URI resolved to its pinned objects (a prefix, a glob, one object; every page of
the listing), reads of the pinned generation, the server-side copy into the run's prefix and its retry, each error a
SpecError naming the field, and the read permissions a caller lacks."""

from __future__ import annotations

import pytest
from google.cloud import storage as gcs_client
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account

from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV
from components.data import gcs
from components.spec import InfraError, SpecError
from tests.emulators.storage import StorageEmulator

PROJECT, NUMBER, TOKEN = "tpupipe-emulated", "123456789012", "t0ken"
DATA, RUNS = "tpupipe-datasets", "tpupipe-runs"
FIELD = "train.dataset"
POOL = f"locations/global/workloadIdentityPools/{PROJECT}.svc.id.goog/subject/ns/tpupipe/sa"
READER = f"principal://iam.googleapis.com/projects/{NUMBER}/{POOL}/reader"
STRANGER = f"principal://iam.googleapis.com/projects/{NUMBER}/{POOL}/stranger"
FILES = {
    "data/a.jsonl": b'{"text": "a"}\n',
    "data/b.json": b'[{"text": "b"}]',
    "data/c.parquet": b"PAR1",
    "data/_SUCCESS": b"",
    "data/readme.txt": b"not data",
    "data/sub/d.jsonl": b'{"text": "d"}\n',
    "other/e.jsonl": b'{"text": "e"}\n',
    "notes/readme.md": b"# notes",
}


@pytest.fixture
def storage(monkeypatch):
    """The emulator with the dataset bucket (FILES) and the runs' bucket; the project's credentials its owner's."""
    emulator = StorageEmulator({PROJECT: NUMBER}, token=TOKEN)
    endpoint = emulator.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    monkeypatch.setenv(EMULATOR_HOST_ENV, endpoint)  # credentials(): the emulators' static token
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, TOKEN)
    for bucket in (DATA, RUNS):
        owner().create_bucket(bucket)
    for name, data in FILES.items():
        emulator.put(DATA, name, data)
    yield emulator
    emulator.stop()


def owner() -> gcs_client.Client:
    """A client of the project's owner (the emulator's static token)."""
    return gcs_client.Client(project=PROJECT, credentials=user_credentials.Credentials(token=TOKEN))


def act_as(storage: StorageEmulator, monkeypatch, member: str) -> None:
    """The project's credentials become ``member``'s token (as Workload Identity hands one to a pod)."""
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, storage.token_for(member))


def grant(bucket: str, role: str, member: str) -> None:
    """Add a binding to the bucket's IAM policy, as its owner."""
    policy = owner().bucket(bucket).get_iam_policy()
    policy.bindings.append({"role": role, "members": {member}})
    owner().bucket(bucket).set_iam_policy(policy)


def names(objects: list[dict]) -> list[str]:
    return [o["uri"].removeprefix(f"gs://{DATA}/") for o in objects]


def test_parse_the_three_forms():
    assert gcs.parse(f"gs://{DATA}/data/", FIELD) == (DATA, "data/", "")
    assert gcs.parse(f"gs://{DATA}", FIELD) == (DATA, "", "")
    assert gcs.parse(f"gs://{DATA}/data/*.jsonl", FIELD) == (DATA, "data/", "data/*.jsonl")
    assert gcs.parse(f"gs://{DATA}/data/part-??/**.parquet", FIELD) == (DATA, "data/part-", "data/part-??/**.parquet")
    assert gcs.parse(f"gs://{DATA}/data/a.jsonl", FIELD) == (DATA, "data/a.jsonl", "")
    assert gcs.parse("gs://a.b-c_d/x/", FIELD) == ("a.b-c_d", "x/", "")
    assert gcs.parse("gs://" + ".".join(["a" * 60] * 3) + "/x", FIELD)[0] == ".".join(["a" * 60] * 3)


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("/data/train.jsonl", "not a Cloud Storage URI"),
        ("s3://bucket/train.jsonl", "not a Cloud Storage URI"),
        ("gs:///train.jsonl", "no bucket name"),
        ("gs://My-Bucket/x/", "lower case"),
        ("gs://-bucket/x/", "starting and ending"),
        ("gs://bucket-/x/", "starting and ending"),
        ("gs://ab/x/", "3 to 63"),
        ("gs://" + "a" * 64 + "/x/", "3 to 63"),
        ("gs://" + "a" * 64 + ".b/x/", "each dotted part at most 63"),
        ("gs://192.168.5.4/x/", "no IP address"),
        ("gs://goog-data/x/", '"goog"'),
        ("gs://my-g00gle-data/x/", '"google"'),
        ("gs://bucket/x\ny.jsonl", "line breaks"),
        ("gs://bucket/" + "x" * 1025, "1024 bytes"),
        ("gs://bucket/part-[0-9]*.jsonl", "*, ** and ?"),
    ],
)
def test_a_malformed_uri_is_a_spec_error_naming_the_field(uri, says):
    with pytest.raises(SpecError) as raised:
        gcs.parse(uri, FIELD)
    assert raised.value.field == FIELD and says in str(raised.value)


def test_a_prefix_lists_its_data_objects_pinned(storage):
    objects = gcs.list_objects(f"gs://{DATA}/data/", field=FIELD)
    assert names(objects) == ["data/a.jsonl", "data/b.json", "data/c.parquet", "data/sub/d.jsonl"]  # no _SUCCESS, txt
    for entry in objects:
        stored = storage.object(DATA, entry["uri"].removeprefix(f"gs://{DATA}/"))
        assert entry == {
            "uri": entry["uri"],
            "generation": stored["generation"],
            "size": int(stored["size"]),
            "crc32c": stored["crc32c"],
            "updated": stored["updated"],
        }
    assert names(gcs.list_objects(f"gs://{DATA}", field=FIELD)) == [
        *names(objects),
        "other/e.jsonl",
    ]  # the whole bucket


def test_a_glob_lists_what_matches_through_match_glob(storage):
    assert names(gcs.list_objects(f"gs://{DATA}/data/*.jsonl", field=FIELD)) == ["data/a.jsonl"]
    assert names(gcs.list_objects(f"gs://{DATA}/data/**.jsonl", field=FIELD)) == ["data/a.jsonl", "data/sub/d.jsonl"]
    assert names(gcs.list_objects(f"gs://{DATA}/*/?.jsonl", field=FIELD)) == ["data/a.jsonl", "other/e.jsonl"]
    assert names(gcs.list_objects(f"gs://{DATA}/data/*", field=FIELD)) == [
        "data/a.jsonl",
        "data/b.json",
        "data/c.parquet",
    ]


def test_one_object(storage):
    (entry,) = gcs.list_objects(f"gs://{DATA}/data/b.json", field=FIELD)
    assert entry["uri"] == f"gs://{DATA}/data/b.json" and entry["size"] == len(FILES["data/b.json"])
    assert gcs.read(entry) == FILES["data/b.json"]


def test_every_page_is_read(storage):
    for i in range(2500):
        storage.put(DATA, f"many/{i:05d}.jsonl", b"{}\n")
    storage.put(DATA, "many/zz.txt", b"")
    before = storage.state.calls.count("objects.list")
    objects = gcs.list_objects(f"gs://{DATA}/many/", field=FIELD)
    assert names(objects) == [f"many/{i:05d}.jsonl" for i in range(2500)]
    assert storage.state.calls.count("objects.list") - before == 3  # pages of at most 1,000


def test_a_pinned_generation_is_what_is_read_and_copied(storage):
    logged: list[str] = []
    pinned = gcs.list_objects(f"gs://{DATA}/data/", field=FIELD)
    copies = gcs.copy_into(pinned, f"gs://{RUNS}/runs/r1/data/train", log=logged.append)
    assert copies == [
        f"gs://{RUNS}/runs/r1/data/train/00000-a.jsonl",
        f"gs://{RUNS}/runs/r1/data/train/00001-b.json",
        f"gs://{RUNS}/runs/r1/data/train/00002-c.parquet",
        f"gs://{RUNS}/runs/r1/data/train/00003-d.jsonl",
    ]
    assert logged == [f"copied 4 object(s) (0.0 MiB) into gs://{RUNS}/runs/r1/data/train"]

    storage.put(DATA, "data/a.jsonl", b'{"text": "replaced"}\n')  # a new generation, during the run
    with pytest.raises(gcs.SnapshotChanged, match=rf"gs://{DATA}/data/a.jsonl changed since the run's snapshot"):
        gcs.read(pinned[0])
    assert gcs.read(pinned[1]) == FILES["data/b.json"]  # unchanged: its pinned generation is the live one
    assert storage.data(RUNS, "runs/r1/data/train/00000-a.jsonl") == FILES["data/a.jsonl"]  # the copy keeps the pin
    with pytest.raises(gcs.SnapshotChanged, match="data/a.jsonl changed since the run's snapshot"):
        gcs.copy_into(pinned, f"gs://{RUNS}/runs/r2/data/train", log=logged.append)  # never the live generation
    assert storage.data(RUNS, "runs/r2/data/train/00000-a.jsonl") is None
    (fresh,) = gcs.list_objects(f"gs://{DATA}/data/a.jsonl", field=FIELD)  # a new snapshot sees the new data
    assert int(fresh["generation"]) > int(pinned[0]["generation"]) and gcs.read(fresh) == b'{"text": "replaced"}\n'


def test_a_retried_copy_copies_only_what_is_missing(storage):
    logged: list[str] = []
    pinned = gcs.list_objects(f"gs://{DATA}/data/", field=FIELD)
    destination = f"gs://{RUNS}/runs/r1/data/train"
    first = gcs.copy_into(pinned, destination, log=logged.append)
    generations = {n: storage.object(RUNS, n)["generation"] for n in storage.objects_of(RUNS)}
    rewrites = storage.state.calls.count("objects.rewrite")
    assert gcs.copy_into(pinned, destination + "/", log=logged.append) == first  # a retried stage re-attaches
    assert storage.state.calls.count("objects.rewrite") == rewrites
    assert {n: storage.object(RUNS, n)["generation"] for n in storage.objects_of(RUNS)} == generations
    assert logged[-1] == f"copied 0 object(s) (0.0 MiB) into {destination}/; 4 already there"

    storage.put(RUNS, "runs/r1/data/train/00001-b.json", b"torn")  # not the pinned data: copied again
    owner().bucket(RUNS).blob("runs/r1/data/train/00002-c.parquet").delete()
    gcs.copy_into(pinned, destination, log=logged.append)
    assert storage.state.calls.count("objects.rewrite") == rewrites + 2
    assert logged[-1] == f"copied 2 object(s) (0.0 MiB) into {destination}; 2 already there"
    assert storage.objects_of(RUNS, "runs/r1/") == {
        "runs/r1/data/train/00000-a.jsonl": FILES["data/a.jsonl"],
        "runs/r1/data/train/00001-b.json": FILES["data/b.json"],
        "runs/r1/data/train/00002-c.parquet": FILES["data/c.parquet"],
        "runs/r1/data/train/00003-d.jsonl": FILES["data/sub/d.jsonl"],
    }


def test_many_objects_copy_with_progress(storage):
    for i in range(1200):
        storage.put(DATA, f"many/{i:05d}.jsonl", b"{}\n")
    logged: list[str] = []
    pinned = gcs.list_objects(f"gs://{DATA}/many/", field=FIELD)
    copies = gcs.copy_into(pinned, f"gs://{RUNS}/runs/r1/data/train", log=logged.append)
    assert len(copies) == 1200 and copies[-1] == f"gs://{RUNS}/runs/r1/data/train/01199-01199.jsonl"
    assert f"copying the dataset: 1000 of 1200 objects into gs://{RUNS}/runs/r1/data/train" in logged
    assert logged[-1].startswith("copied 1200 object(s)")


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("gs://no-such-bucket/data/", "the bucket no-such-bucket does not exist"),
        ("gs://no-such-bucket/data/a.jsonl", "the bucket no-such-bucket does not exist"),
        (f"gs://{DATA}/empty/", f"no .jsonl/.json/.parquet/.jsonl.gz object under gs://{DATA}/empty/"),
        (f"gs://{DATA}/notes/", "(1 other object(s): notes/readme.md)"),
        (f"gs://{DATA}/data/*.csv", "no .jsonl/.json/.parquet/.jsonl.gz object matches the glob data/*.csv"),
        (f"gs://{DATA}/data/missing.jsonl", f"no such object in the bucket {DATA}"),
        (f"gs://{DATA}/data", f"objects are under the prefix gs://{DATA}/data/ (with the trailing /)"),
        (f"gs://{DATA}/data/readme.txt", "not a .jsonl/.json/.parquet/.jsonl.gz object"),
    ],
)
def test_what_names_no_data_is_a_spec_error_naming_the_field(storage, uri, says):
    with pytest.raises(SpecError) as raised:
        gcs.list_objects(uri, field="train.eval_dataset")
    assert raised.value.field == "train.eval_dataset" and says in str(raised.value)


@pytest.mark.parametrize("uri", [f"gs://{DATA}/data/", f"gs://{DATA}/data/*.jsonl", f"gs://{DATA}/data/a.jsonl"])
def test_a_caller_who_may_not_read_is_told_the_role_on_the_bucket(storage, monkeypatch, uri):
    act_as(storage, monkeypatch, STRANGER)
    with pytest.raises(SpecError) as raised:
        gcs.list_objects(uri, field=FIELD)
    message = str(raised.value)
    assert raised.value.field == FIELD and STRANGER in message  # Cloud Storage's refusal names the member
    assert (
        f"grant roles/storage.objectViewer on gs://{DATA}" in message and "--role=roles/storage.objectViewer" in message
    )

    grant(DATA, "roles/storage.objectViewer", STRANGER)
    assert gcs.list_objects(uri, field=FIELD)


def test_the_caller_named_from_its_credentials():
    key = service_account.Credentials(
        signer=None, service_account_email="pipeline@p.iam.gserviceaccount.com", token_uri="https://x"
    )
    assert gcs.caller(key) == "serviceAccount:pipeline@p.iam.gserviceaccount.com"
    assert gcs.caller(user_credentials.Credentials(token="t", account="me@example.com")) == "user:me@example.com"
    assert gcs.caller(user_credentials.Credentials(token="t")) == "" and gcs.caller(None) == ""
    assert "--member=serviceAccount:pipeline@p" in gcs.read_hint(DATA, gcs.caller(key))


def test_missing_read_permissions(storage, monkeypatch):
    assert gcs.missing_read(DATA) == []  # the project's owner
    act_as(storage, monkeypatch, STRANGER)
    assert gcs.missing_read(DATA) == ["storage.objects.list", "storage.objects.get"]
    grant(DATA, "roles/storage.legacyObjectReader", STRANGER)  # get, not list
    assert gcs.missing_read(DATA) == ["storage.objects.list"]
    act_as(storage, monkeypatch, READER)
    grant(DATA, "roles/storage.objectViewer", READER)
    assert gcs.missing_read(DATA) == [] and gcs.missing_read(RUNS) == list(gcs.READ_PERMISSIONS)
    with pytest.raises(SpecError, match="train.dataset: the bucket no-such-bucket does not exist"):
        gcs.missing_read("no-such-bucket")


def test_a_runs_snapshot_of_a_prefix_pins_each_objects_generation_and_reads_it(storage):
    """The run's snapshot (components.data.snapshot) of a gs:// prefix: every data object with its generation, every
    example read from that generation; an object replaced afterwards is another generation, and a later read of the
    pinned one fails naming it instead of reading the new bytes."""
    from datetime import UTC, datetime

    from components.data import snapshot
    from components.workload import resolve

    rows = "".join(f'{{"instruction": "Repeat x{i} twice.", "response": "x{i} x{i}"}}\n' for i in range(30)).encode()
    storage.put(DATA, "drops/2026-12-01/a.jsonl", rows)
    storage.put(DATA, "drops/2026-12-01/_SUCCESS", b"")
    spec = resolve("local-fsdp", f"train.dataset=gs://{DATA}/drops/{{date}}/")
    manifest, train, heldout = snapshot.take(spec, datetime(2026, 12, 1, tzinfo=UTC), log=lambda line: None)
    (item,) = manifest["train"]["items"]
    assert item["uri"] == f"gs://{DATA}/drops/2026-12-01/a.jsonl" and item["num_examples"] == 30
    assert item["generation"] == str(storage.object(DATA, "drops/2026-12-01/a.jsonl")["generation"])
    assert len(train) + len(heldout) == 30
    storage.put(DATA, "drops/2026-12-01/a.jsonl", rows + rows)  # replaced after the snapshot
    with pytest.raises(gcs.SnapshotChanged, match="changed since the run's snapshot"):
        gcs.read(item)
    again, _, _ = snapshot.take(spec, datetime(2026, 12, 1, tzinfo=UTC), log=lambda line: None)
    assert again["digest"] != manifest["digest"]  # a new generation is a new snapshot


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ("gs://no-such-bucket/drops/", "train.dataset: "),
        (f"gs://{DATA}/nothing-here/", "train.dataset: "),
        (f"gs://{DATA}/data/a.jsonl", "train.dataset: gs://tpupipe-datasets/data/a.jsonl, line 1: the example lacks"),
    ],
)
def test_tpupipe_data_exits_2_naming_the_field_for_bad_cloud_storage_data(storage, capsys, dataset, message):
    from pipelines.cli.main import main

    assert main(["data", "local-fsdp", "--set", f"train.dataset={dataset}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_snapshots_reads_are_of_the_pinned_generation_and_checked_against_its_crc32c(storage):
    """``Downloads`` (the snapshot's many reads: a media download each over a kept connection) reads the pinned
    generation: a replaced one is SnapshotChanged; bytes that do not match the CRC32C the listing gave are refused;
    each thread keeps one connection for all its reads."""
    pinned = gcs.list_objects(f"gs://{DATA}/data/", field=FIELD)
    downloads = gcs.Downloads()
    assert [downloads.read(entry) for entry in pinned] == [FILES[name] for name in names(pinned)]
    assert downloads.read(pinned[0]) == FILES["data/a.jsonl"]  # again, on the same connection
    storage.put(DATA, "data/a.jsonl", b'{"text": "replaced"}\n')
    with pytest.raises(gcs.SnapshotChanged, match=rf"gs://{DATA}/data/a.jsonl changed since the run's snapshot"):
        downloads.read(pinned[0])
    damaged = {**pinned[1], "crc32c": "AAAAAA=="}  # what the listing said differs from what comes
    with pytest.raises(InfraError, match=r"data/b.json \(generation \d+\): the bytes read do not match the CRC32C"):
        downloads.read(damaged)


def test_an_object_larger_than_the_read_ahead_is_parsed_as_it_downloads(storage, monkeypatch):
    """A JSON Lines object above ``snapshot.STREAMED`` is parsed a line at a time from its download (and its CRC32C
    checked at the end): the same examples as a whole read, in the same order, gzip too."""
    import gzip
    from datetime import UTC, datetime

    from components.data import snapshot
    from components.workload import resolve

    rows = "".join(f'{{"instruction": "Repeat s{i} twice.", "response": "s{i} s{i}"}}\n' for i in range(300)).encode()
    storage.put(DATA, "big/a.jsonl", rows)
    storage.put(DATA, "big/b.jsonl.gz", gzip.compress(rows.replace(b"Repeat", b"Echo")))
    spec = resolve("local-fsdp", f"train.dataset=gs://{DATA}/big/")
    when = datetime(2026, 12, 1, tzinfo=UTC)
    whole, train, heldout = snapshot.take(spec, when, log=lambda line: None)
    monkeypatch.setattr(snapshot, "STREAMED", 100)  # both objects now stream
    streamed, train2, heldout2 = snapshot.take(spec, when, log=lambda line: None)
    assert [i["num_examples"] for i in streamed["train"]["items"]] == [300, 300]
    assert list(train2) == list(train) and list(heldout2) == list(heldout) and len(train) + len(heldout) == 600
    pinned = gcs.list_objects(f"gs://{DATA}/big/a.jsonl", field=FIELD)
    with pytest.raises(InfraError, match="the bytes read do not match the CRC32C"):  # checked when the stream ends
        list(snapshot.read_items("gcs", [{**pinned[0], "crc32c": "AAAAAA=="}], FIELD, lambda line: None))


def test_a_snapshot_read_the_caller_may_not_make_names_the_field_and_the_role(storage, monkeypatch):
    pinned = gcs.list_objects(f"gs://{DATA}/data/a.jsonl", field=FIELD)  # listed by someone who may
    act_as(storage, monkeypatch, STRANGER)
    with pytest.raises(SpecError) as raised:
        gcs.Downloads("train.eval_dataset").read(pinned[0])
    assert raised.value.field == "train.eval_dataset" and STRANGER in str(raised.value)
    assert f"grant roles/storage.objectViewer on gs://{DATA}" in str(raised.value)


ROWS = "".join(f'{{"instruction": "Repeat s{i} twice.", "response": "s{i} s{i}"}}\n' for i in range(6000)).encode()


def resumed_from(storage: StorageEmulator, name: str) -> list[int]:
    """The first byte each download of ``name`` the emulator served asked for (its Range's; 0 for none), in order."""
    return [int(asked[6:-1] or 0) for _, object_, asked, _ in storage.state.downloads if object_ == name]


def test_a_download_that_breaks_off_is_resumed_from_the_byte_it_reached_and_its_whole_crc32c_checked(storage):
    """The bucket resets the connection twice mid-body: the read goes on with a Range request for the rest of the same
    generation each time, and the bytes are the object's; a CRC32C that the whole does not match is still refused."""
    storage.put(DATA, "big/a.jsonl", ROWS)
    (pinned,) = gcs.list_objects(f"gs://{DATA}/big/a.jsonl", field=FIELD)
    storage.cut(100_000, times=2)
    assert gcs.Downloads().read(pinned) == ROWS
    assert resumed_from(storage, "big/a.jsonl") == [0, 100_000, 200_000]
    assert {accepted for *_, accepted in storage.state.downloads} == {"gzip"}  # the object as stored, never transcoded
    storage.cut(100_000)
    with pytest.raises(InfraError, match=r"big/a.jsonl \(generation \d+\): the bytes read do not match the CRC32C"):
        gcs.Downloads().read({**pinned, "crc32c": "AAAAAA=="})
    assert resumed_from(storage, "big/a.jsonl")[3:] == [0, 100_000]


def test_a_download_that_keeps_breaking_without_progress_names_the_object_and_the_byte(storage, monkeypatch):
    monkeypatch.setattr(gcs, "RETRY", gcs.Retry(initial_s=0.001, maximum_s=0.01, deadline_s=1.0))
    storage.put(DATA, "big/a.jsonl", ROWS)
    (pinned,) = gcs.list_objects(f"gs://{DATA}/big/a.jsonl", field=FIELD)
    storage.cut(50_000)
    storage.cut(0, times=10_000)  # each resume brings nothing
    with pytest.raises(
        InfraError,
        match=r"big/a.jsonl \(generation \d+\): the download broke off at byte 50000 of "
        rf"{len(ROWS)} and tries to resume it for 1s brought nothing",
    ):
        gcs.Downloads().read(pinned)
    assert len(resumed_from(storage, "big/a.jsonl")) > 10  # retried for the whole budget, not a count of tries


def test_the_retry_budget_is_google_cloud_storages_default_retry(monkeypatch):
    """1 s, doubling to at most 60 s, each wait a random part of its bound, no wait that would end past 120 s from
    the first failure (google-cloud-storage's DEFAULT_RETRY, api_core's Retry defaults); a Retry-After is waited."""
    import random

    from google.cloud.storage.retry import DEFAULT_RETRY

    assert (gcs.RETRY.initial_s, gcs.RETRY.multiplier, gcs.RETRY.maximum_s, gcs.RETRY.deadline_s) == (
        DEFAULT_RETRY._initial,
        DEFAULT_RETRY._multiplier,
        DEFAULT_RETRY._maximum,
        DEFAULT_RETRY._timeout,
    )
    now, waits = [0.0], []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    monkeypatch.setattr(random, "uniform", lambda low, high: high)  # each wait its bound
    backoff = gcs.RETRY.start(clock=lambda: now[0])
    backoff.sleep = sleep
    while backoff.wait():
        pass
    assert waits == [1, 2, 4, 8, 16, 32]  # then 60 would end at 123 s
    backoff = gcs.RETRY.start(clock=lambda: now[0])
    backoff.sleep = sleep
    assert backoff.wait("7") and waits[-1] == 7.0
    assert backoff.wait() and waits[-1] == 2  # the bound went on growing
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    assert backoff.wait() and waits[-1] == 0  # full jitter: anywhere from 0
    assert not backoff.wait("200")  # past the deadline: no more tries


def test_a_resume_answered_with_the_whole_object_skips_to_its_offset_without_holding_it(storage, monkeypatch):
    """A 200 to a Range request (a proxy that drops the Range, as HTTP allows) is read on from the offset, the bytes
    before it dropped as they come, and the whole object's CRC32C still checked; one that breaks off before the
    offset is retried."""
    monkeypatch.setattr(gcs, "RETRY", gcs.Retry(initial_s=0.001, deadline_s=5.0))
    storage.put(DATA, "big/a.jsonl", ROWS)
    (pinned,) = gcs.list_objects(f"gs://{DATA}/big/a.jsonl", field=FIELD)
    storage.cut(100_000)
    storage.whole()
    assert gcs.Downloads().read(pinned) == ROWS
    assert resumed_from(storage, "big/a.jsonl") == [0, 100_000]
    storage.cut(100_000)
    storage.whole(times=2)
    storage.cut(50_000)  # the whole answer breaks off before the offset: retried
    assert gcs.Downloads().read(pinned) == ROWS
    with pytest.raises(InfraError, match="the bytes read do not match the CRC32C"):
        storage.cut(100_000)
        storage.whole()
        gcs.Downloads().read({**pinned, "crc32c": "AAAAAA=="})


def test_a_gzip_drop_cut_off_on_the_way_is_read_whole_and_one_written_truncated_is_named_so(storage, monkeypatch):
    """A .jsonl.gz object whose download breaks off (read whole, and parsed as it downloads) gives every example; one
    stored cut short is refused as truncated, not as "not gzip"; an object stored gzip-encoded (Content-Encoding:
    gzip) is read as stored, its CRC32C checked, and inflated here."""
    import gzip
    from datetime import UTC, datetime

    from components.data import snapshot
    from components.workload import resolve

    packed = gzip.compress(ROWS)
    storage.put(DATA, "drop/a.jsonl.gz", packed)
    spec = resolve("local-fsdp", f"train.dataset=gs://{DATA}/drop/")
    when = datetime(2026, 12, 1, tzinfo=UTC)
    for streamed in (snapshot.STREAMED, 1000):  # read whole ahead of the parse, then parsed as it downloads
        monkeypatch.setattr(snapshot, "STREAMED", streamed)
        storage.cut(len(packed) // 3)
        manifest, train, heldout = snapshot.take(spec, when, log=lambda line: None)
        assert manifest["train"]["items"][0]["num_examples"] == 6000 and len(train) + len(heldout) == 6000
        assert resumed_from(storage, "drop/a.jsonl.gz")[-2:] == [0, len(packed) // 3]

    storage.put(DATA, "cut/a.jsonl.gz", packed[: len(packed) // 2])
    with pytest.raises(SpecError, match=r"^train.dataset: gs://.*/cut/a.jsonl.gz: truncated: the gzip stream ends"):
        snapshot.take(resolve("local-fsdp", f"train.dataset=gs://{DATA}/cut/"), when, log=lambda line: None)

    storage.put(DATA, "encoded/a.jsonl", packed, contentEncoding="gzip")
    (pinned,) = gcs.list_objects(f"gs://{DATA}/encoded/", field=FIELD)
    storage.cut(len(packed) // 2)
    assert gcs.Downloads().read(pinned) == ROWS
    assert resumed_from(storage, "encoded/a.jsonl") == [0, len(packed) // 2]
    with pytest.raises(InfraError, match="the bytes read do not match the CRC32C"):
        gcs.Downloads().read({**pinned, "crc32c": "AAAAAA=="})


def test_the_snapshots_downloads_go_where_the_storage_client_goes_its_endpoint_and_its_proxy(storage, monkeypatch):
    """Downloads take the endpoint (a ``client_options`` api_endpoint over STORAGE_EMULATOR_HOST) and the HTTP
    settings (here the environment's proxy, as requests merges it into the session's) from the Cloud Storage
    client."""
    (pinned,) = gcs.list_objects(f"gs://{DATA}/data/a.jsonl", field=FIELD)
    creds = user_credentials.Credentials(token=TOKEN)
    monkeypatch.setattr(gcs, "RETRY", gcs.Retry(initial_s=0.001, deadline_s=0.5))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(InfraError, match="reading gs://"):
        gcs.Downloads().read(pinned)
    custom = gcs_client.Client(project=PROJECT, credentials=creds, client_options={"api_endpoint": storage.endpoint})
    assert gcs.Downloads(client=custom).read(pinned) == FILES["data/a.jsonl"]

    for name in ("NO_PROXY", "no_proxy", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", storage.endpoint)  # the emulator answers the proxied request itself
    proxied = gcs_client.Client(
        project=PROJECT, credentials=creds, client_options={"api_endpoint": "http://storage.tpupipe.invalid"}
    )
    served = len(storage.state.downloads)
    assert gcs.Downloads(client=proxied).read(pinned) == FILES["data/a.jsonl"]
    assert len(storage.state.downloads) == served + 1
