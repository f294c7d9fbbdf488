"""Drops as teams write them (components/data/drops.py, snapshot.py, gcs.py) against the Cloud Storage emulator, and
on local disk: a missing drop under ``train.data_since=champion`` is a skipped run, a drop is read only once its
``train.dataset_ready`` marker is there, hidden ``_temporary/`` and ``.``/``_`` paths are never read, ``.jsonl.gz`` is
read, an empty shard is skipped with a warning. And a fixed evaluation set is its content: the same examples on
another day, or an object uploaded again byte for byte, are the same set; another set is refused naming what
changed."""

from __future__ import annotations

import gzip
import json
import time
from datetime import UTC, datetime

import pytest

from components.data import drops, gcs, snapshot
from components.platforms.ledger import CLAIM_KEYS
from components.platforms.store import LocalStore, read_json, write_json
from components.spec import SpecError
from components.stages import dataset
from components.workload import resolve
from tests.unit.test_data_gcs import DATA, storage  # noqa: F401 - the Cloud Storage emulator's fixture
from tests.unit.test_data_snapshot import _champion, _ctx

DAY1 = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
DAY2 = datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def rows(seed: int, count: int = 20) -> bytes:
    lines = [{"instruction": f"Echo s{seed}n{i}.", "response": f"s{seed}n{i}"} for i in range(count)]
    return "".join(json.dumps(r) + "\n" for r in lines).encode()


def take(overrides: str, when=DAY1, since=None, ref=""):
    lines: list[str] = []
    manifest, train, heldout = snapshot.take(resolve("local-fsdp", overrides), when, since, ref, log=lines.append)
    return manifest, train, heldout, lines


def names(manifest) -> list[str]:
    return [item["uri"].split("/drops/", 1)[1] for item in manifest["train"]["items"]]


def names_of(manifest) -> list[str]:
    return [item["uri"].removeprefix(f"gs://{DATA}/") for item in manifest["train"]["items"]]


# ---------------------------------------------------------------- Cloud Storage drops


def test_hidden_temporary_and_dot_paths_are_never_read(storage):  # noqa: F811
    """A Spark job's drop while and after it commits: its attempts under ``_temporary/``, its ``_SUCCESS`` and
    ``.crc`` files are the writer's own; only the committed part files are listed and read."""
    storage.put(DATA, "drops/2026-12-01/_temporary/0/_temporary/attempt_1/part-00009.jsonl", rows(9))
    storage.put(DATA, "drops/2026-12-01/.part-00000.jsonl.crc", b"crc")
    storage.put(DATA, "drops/2026-12-01/.staging.jsonl", rows(8))
    storage.put(DATA, "drops/2026-12-01/part-00000.jsonl", rows(1))
    storage.put(DATA, "drops/2026-12-01/_SUCCESS", b"")
    manifest, train, heldout, lines = take(f"train.dataset=gs://{DATA}/drops/{{date}}/")
    assert names(manifest) == ["2026-12-01/part-00000.jsonl"]
    assert len(train) + len(heldout) == 20
    assert any("4 hidden object(s) not read" in line for line in lines)


def test_a_drop_is_read_only_once_its_marker_is_there(storage):  # noqa: F811
    storage.put(DATA, "drops/2026-12-01/part-00000.jsonl", rows(1))
    sets = f"train.dataset=gs://{DATA}/drops/{{date}}/ train.dataset_ready=_SUCCESS"
    with pytest.raises(drops.NotReady) as raised:
        take(sets)
    assert raised.value.field == "train.dataset"
    assert f"gs://{DATA}/drops/2026-12-01/_SUCCESS (train.dataset_ready) is not there" in str(raised.value)
    # with data_since too: a drop its writer has not finished is a late or failed writer, not a day without data
    with pytest.raises(drops.NotReady, match="_SUCCESS \\(train.dataset_ready\\) is not there"):
        take(f"{sets} train.data_since=champion train.init_from=champion")
    storage.put(DATA, "drops/2026-12-01/part-00001.jsonl", rows(2))
    storage.put(DATA, "drops/2026-12-01/_SUCCESS", b"")  # the writer's last object
    manifest, train, heldout, _ = take(sets)
    assert names(manifest) == ["2026-12-01/part-00000.jsonl", "2026-12-01/part-00001.jsonl"]
    assert len(train) + len(heldout) == 40


def test_a_missing_drop_under_data_since_is_a_skipped_day_and_without_it_an_error(storage):  # noqa: F811
    storage.put(DATA, "drops/2026-12-01/part-00000.jsonl", rows(1))
    sets = f"train.dataset=gs://{DATA}/drops/{{date}}/"
    manifest, train, heldout, _ = take(f"{sets} train.data_since=champion train.init_from=champion", when=DAY2)
    assert manifest["skip"] == f"nothing to read: gs://{DATA}/drops/2026-12-02/: no .jsonl/.json/.parquet/.jsonl.gz " \
        f"object under gs://{DATA}/drops/2026-12-02/"  # fmt: skip
    assert (train, heldout) == ([], [])
    for extra in ("", " train.dataset_ready=_SUCCESS"):  # with a marker: nothing at all there is still no drop
        manifest, _, _, _ = take(f"{sets} train.data_since=champion train.init_from=champion{extra}", when=DAY2)
        assert "2026-12-02" in manifest["skip"]
    with pytest.raises(drops.NoDrop) as raised:  # a run that is not incremental has nothing to train on: exit 2
        take(sets, when=DAY2)
    assert raised.value.field == "train.dataset"
    with pytest.raises(SpecError, match="the bucket no-such-bucket does not exist"):  # a wrong bucket stays an error
        take("train.dataset=gs://no-such-bucket/drops/{date}/ train.data_since=champion train.init_from=champion")


def test_a_partition_of_the_day_before_is_read_and_its_absence_is_a_skipped_day(storage):  # noqa: F811
    """``{date-1}`` and ``{date-1:%Y/%m/%d}``: a run scheduled on 2 December reads the partition its writer closed on
    1 December; a day later, with none written for 2 December, a run with data_since is a day without a drop."""
    storage.put(DATA, "drops/day=2026-12-01/part-00000.jsonl", rows(1))
    storage.put(DATA, "drops/day=2026-12-02/part-00000.jsonl", rows(2))  # the schedule's own day: not read
    storage.put(DATA, "daily/2026/12/01/part-00000.jsonl", rows(3))
    manifest, train, heldout, _ = take(f"train.dataset=gs://{DATA}/drops/day={{date-1}}/", when=DAY2)
    assert manifest["dataset"] == f"gs://{DATA}/drops/day=2026-12-01/"
    assert names(manifest) == ["day=2026-12-01/part-00000.jsonl"] and len(train) + len(heldout) == 20
    manifest, _, _, _ = take(f"train.dataset=gs://{DATA}/daily/{{date-1:%Y/%m/%d}}/", when=DAY2)
    assert names_of(manifest) == ["daily/2026/12/01/part-00000.jsonl"]
    since = "train.data_since=champion train.init_from=champion"
    day4 = datetime(2026, 12, 4, 6, 0, tzinfo=UTC)  # the day before it, 3 December, has no drop
    for uri, absent in (
        (f"gs://{DATA}/drops/day={{date-1}}/", f"gs://{DATA}/drops/day=2026-12-03/"),
        (f"gs://{DATA}/daily/{{date-1:%Y/%m/%d}}/", f"gs://{DATA}/daily/2026/12/03/"),
    ):
        manifest, _, _, _ = take(f"train.dataset={uri} {since}", when=day4)
        assert manifest["skip"].startswith(f"nothing to read: {absent}: no .jsonl"), manifest["skip"]
        with pytest.raises(drops.NoDrop):  # without data_since, a run with nothing to train on
            take(f"train.dataset={uri}", when=day4)


def test_only_a_dated_drop_whose_directory_exists_is_a_skipped_day(storage, tmp_path):  # noqa: F811
    """A missing drop is skipped only when the dataset has ``{date}`` and the directory its dated part is in holds
    something: a mistyped directory, or a URI without ``{date}``, is an error naming train.dataset, even with
    data_since."""
    storage.put(DATA, "drops/2026-12-01/part-00000.jsonl", rows(1))
    since = "train.data_since=champion train.init_from=champion"
    with pytest.raises(SpecError) as raised:
        take(f"train.dataset=gs://{DATA}/dorps/{{date}}/ {since}", when=DAY2)
    assert raised.value.field == "train.dataset"
    assert f"nothing is under gs://{DATA}/dorps/, where the dated drops are" in str(raised.value)
    with pytest.raises(drops.NoDrop):  # no {date}: the same URI every day, so nothing there is never a day's absence
        take(f"train.dataset=gs://{DATA}/drops/2026-12-02/ {since}")
    manifest, _, _, _ = take(f"train.dataset=gs://{DATA}/drops/day={{date}}/ {since}", when=DAY2)
    assert manifest["skip"].startswith("nothing to read: ")  # drops/ is there: day=2026-12-02/ is a day without one
    (tmp_path / "sft").mkdir()
    manifest, _, _, _ = take(f"train.dataset={tmp_path}/sft/{{date}}.jsonl {since}", when=DAY2)
    assert "file not found" in manifest["skip"]
    with pytest.raises(SpecError, match=f"nothing is under {tmp_path}/sfd/"):
        take(f"train.dataset={tmp_path}/sfd/{{date}}.jsonl {since}", when=DAY2)


def test_every_directory_with_data_needs_its_marker_and_objects_written_after_it_are_not_read(storage):  # noqa: F811
    """Hadoop's committer writes ``_SUCCESS`` in each job's output directory: under a stable prefix of several jobs'
    outputs, each directory with data needs its own (or one above it, as a partitioned output's job marker): one
    without it is a job still writing, left out with a warning naming its marker while the complete ones are read;
    with none complete, the drop is not ready. An object updated after its directory's marker is not the committed
    job's, left out with a warning."""
    import time

    storage.put(DATA, "stable/2026-12-03/part-00000.jsonl", rows(4))  # a job still writing
    with pytest.raises(drops.NotReady) as raised:  # nothing complete yet
        take(f"train.dataset=gs://{DATA}/stable/ train.dataset_ready=_SUCCESS")
    assert f"gs://{DATA}/stable/2026-12-03/_SUCCESS (train.dataset_ready) is not there" in str(raised.value)
    storage.put(DATA, "stable/2026-12-01/part-00000.jsonl", rows(1))
    storage.put(DATA, "stable/2026-12-01/_SUCCESS", b"")
    storage.put(DATA, "stable/2026-12-02/lang=en/part-00000.jsonl", rows(2))  # partitioned: the job's one marker
    storage.put(DATA, "stable/2026-12-02/lang=fr/part-00000.jsonl", rows(3))
    storage.put(DATA, "stable/2026-12-02/_SUCCESS", b"")
    for uri in (f"gs://{DATA}/stable/", f"gs://{DATA}/stable/**/part-*.jsonl"):
        manifest, train, heldout, lines = take(f"train.dataset={uri} train.dataset_ready=_SUCCESS")
        assert sorted(names_of(manifest)) == [
            "stable/2026-12-01/part-00000.jsonl",
            "stable/2026-12-02/lang=en/part-00000.jsonl",
            "stable/2026-12-02/lang=fr/part-00000.jsonl",
        ]
        assert len(train) + len(heldout) == 60
        warned = [line for line in lines if "warning" in line]
        missing = f"gs://{DATA}/stable/2026-12-03/_SUCCESS (train.dataset_ready) is not there yet: 1 data file(s)"
        assert len(warned) == 1 and f"{missing} there not read (still being written)" in warned[0]
        assert "2026-12-01/_SUCCESS" not in warned[0] and "lang=en/_SUCCESS" not in warned[0]
    storage.put(DATA, "stable/2026-12-03/_SUCCESS", b"")
    time.sleep(0.01)
    storage.put(DATA, "stable/2026-12-01/part-00001.jsonl", rows(5))  # another writer, after the commit
    for uri in (f"gs://{DATA}/stable/", f"gs://{DATA}/stable/**.jsonl"):
        manifest, train, heldout, lines = take(f"train.dataset={uri} train.dataset_ready=_SUCCESS")
        assert len(names_of(manifest)) == 4 and "stable/2026-12-01/part-00001.jsonl" not in names_of(manifest)
        assert len(train) + len(heldout) == 80
        late = f"gs://{DATA}/stable/2026-12-01/part-00001.jsonl"
        assert f"snapshot: warning: {uri}: 1 object(s) updated after their _SUCCESS (train.dataset_ready) not " \
            f"read: {late}" in lines  # fmt: skip
    one = f"gs://{DATA}/stable/2026-12-01/part-00001.jsonl"
    with pytest.raises(drops.NotReady, match="every data object was updated after its _SUCCESS"):
        take(f"train.dataset={one} train.dataset_ready=_SUCCESS")


def test_a_marker_of_any_name_is_found_on_cloud_storage_and_a_metadata_change_keeps_an_object(storage):  # noqa: F811
    """A marker need not be hidden (``DONE``); an object whose metadata changed after the marker (its ``updated``
    moves, its ``timeCreated`` does not) is still the committed job's."""
    storage.put(DATA, "done/2026-12-01/part-00000.jsonl", rows(1))
    storage.put(DATA, "done/2026-12-01/DONE", b"")
    time.sleep(0.01)
    blob = gcs._client().bucket(DATA).get_blob("done/2026-12-01/part-00000.jsonl")
    blob.metadata = {"reviewed": "yes"}
    blob.patch()  # its metadata changed after the marker: its bytes did not
    assert blob.updated > blob.time_created
    manifest, train, heldout, lines = take(f"train.dataset=gs://{DATA}/done/ train.dataset_ready=DONE")
    assert names_of(manifest) == ["done/2026-12-01/part-00000.jsonl"]
    assert len(train) + len(heldout) == 20 and not [line for line in lines if "warning" in line]


def test_gzip_json_lines_are_read_and_an_empty_shard_is_skipped_with_a_warning(storage):  # noqa: F811
    storage.put(DATA, "drops/2026-12-01/part-00000.jsonl.gz", gzip.compress(rows(1)))
    storage.put(DATA, "drops/2026-12-01/part-00001.jsonl", b"")  # a task that had no rows
    storage.put(DATA, "drops/2026-12-01/part-00002.jsonl", rows(2))
    manifest, train, heldout, lines = take(f"train.dataset=gs://{DATA}/drops/{{date}}/")
    counts = {item["uri"].rsplit("/", 1)[1]: item["num_examples"] for item in manifest["train"]["items"]}
    assert counts == {"part-00000.jsonl.gz": 20, "part-00001.jsonl": 0, "part-00002.jsonl": 20}
    assert len(train) + len(heldout) == 40
    assert f"snapshot: warning: gs://{DATA}/drops/2026-12-01/part-00001.jsonl: no examples, skipped" in lines
    storage.put(DATA, "eval/empty.jsonl", b"")  # an evaluation set of nothing measures nothing: refused
    with pytest.raises(SpecError, match=r"^train.eval_dataset: gs://.*/eval/empty.jsonl: no examples"):
        take(f"train.dataset=gs://{DATA}/drops/{{date}}/ train.eval_dataset=gs://{DATA}/eval/empty.jsonl")
    storage.put(DATA, "bad/x.jsonl.gz", b"\x1f\x8bnot gzip at all")
    with pytest.raises(SpecError, match=r"^train.dataset: gs://.*/bad/x.jsonl.gz: not gzip"):
        take(f"train.dataset=gs://{DATA}/bad/")


def test_a_cloud_storage_evaluation_object_uploaded_again_byte_for_byte_is_the_same_set(storage, tmp_path):  # noqa: F811
    storage.put(DATA, "eval/v1.jsonl", rows(7, count=12))
    (tmp_path / "a.jsonl").write_bytes(rows(1))
    sets = f"train.dataset={tmp_path}/a.jsonl train.eval_dataset=gs://{DATA}/eval/v1.jsonl"
    first, _, _, _ = take(sets)
    generation = storage.object(DATA, "eval/v1.jsonl")["generation"]
    storage.put(DATA, "eval/v1.jsonl", rows(7, count=12))  # the same bytes, a new generation
    assert storage.object(DATA, "eval/v1.jsonl")["generation"] != generation
    again, _, _, _ = take(sets, when=DAY2)
    assert again["eval"]["digest"] == first["eval"]["digest"]
    assert again["eval"]["pinned"] != first["eval"]["pinned"]  # what it read it as did change


# ---------------------------------------------------------------- local drops, and a whole run


def test_local_drops_follow_the_same_rules(tmp_path):
    day = tmp_path / "sft" / "2026-12-01"
    (day / "_temporary" / "0").mkdir(parents=True)
    (day / "_temporary" / "0" / "part-00009.jsonl").write_bytes(rows(9))
    (day / ".hidden.jsonl").write_bytes(rows(8))
    (day / "part-00000.jsonl.gz").write_bytes(gzip.compress(rows(1)))
    (day / "part-00001.jsonl").write_bytes(b"")
    sets = f"train.dataset={tmp_path}/sft/{{date}}/ train.dataset_ready=_SUCCESS"
    with pytest.raises(drops.NotReady, match="_SUCCESS \\(train.dataset_ready\\) is not there, so the drop"):
        take(sets)
    (day / "_SUCCESS").write_bytes(b"")
    manifest, train, heldout, lines = take(sets)
    assert [item["uri"].rsplit("/", 1)[1] for item in manifest["train"]["items"]] == [
        "part-00000.jsonl.gz",
        "part-00001.jsonl",
    ]
    assert len(train) + len(heldout) == 20 and any("no examples, skipped" in line for line in lines)
    manifest, _, _, _ = take(f"{sets} train.data_since=champion train.init_from=champion", when=DAY2)
    assert manifest["skip"].startswith("nothing to read: ") and "2026-12-02" in manifest["skip"]


def test_tpupipe_run_of_a_day_without_its_drop_is_skipped_exit_0_and_creates_nothing(tmp_path, capsys):
    """A schedule's run on a day its drop never came: ``skipped``, exit 0, no cluster (no ledger), no examples
    written; the champion (and what it has seen) is as it was."""
    from pipelines.cli.main import main

    root = tmp_path / "runs"
    (tmp_path / "sft" / "2026-12-01").mkdir(parents=True)
    (tmp_path / "sft" / "2026-12-01" / "a.jsonl").write_bytes(rows(1))
    (tmp_path / "eval.jsonl").write_bytes(rows(7, count=12))
    data = (
        f"train.dataset={tmp_path}/sft/{{date}}/ train.eval_dataset={tmp_path}/eval.jsonl "
        "train.data_since=champion train.init_from=champion"
    )
    earlier, _, _, _ = take(data)  # the champion's own snapshot, of the first day
    store = LocalStore(root / "r0")
    write_json(store, "data/manifest.json", earlier)
    _champion(root, data_manifest=str(root / "r0" / "data" / "manifest.json"), eval_snapshot=earlier["eval"]["digest"])
    (root / "r0" / "train" / "ck").mkdir(parents=True)  # the champion's checkpoint, which init_from starts from
    code = main(["run", "--output-root", str(root), "--run-id", "nodrop", "--set", f"{data} train.init_from=champion"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err[-2000:]
    assert "status: skipped (nothing to read: " in out and "file not found: " in out
    summary = json.loads((root / "nodrop" / "summary.json").read_text())
    assert summary["status"] == "skipped" and "sft/" in summary["skipped"]
    ledger = json.loads((root / "nodrop" / "ledger.json").read_text())
    # the run id claimed (components/stages/claims.py), no cluster recorded: none was started
    assert set(ledger) - set(CLAIM_KEYS) <= {"created", "platform", "run_id"} and not ledger["created"], ledger
    assert not (root / "nodrop" / "data" / "train.jsonl").exists()
    assert "runs were skipped too" not in out
    # a champion whose manifest names no key file of its lineage (this one was taken outside a run): said once
    assert out.count("its manifest names no key file") == 1
    for day in ("nodrop2", "nodrop3", "nodrop4"):  # the fourth skipped run in a row says so
        code = main(["run", "--output-root", str(root), "--run-id", day, "--set", data])
        assert code == 0
    out = capsys.readouterr().out
    warning = "warning: local-fsdp's last 3 runs were skipped too (nodrop, nodrop2, nodrop3): is "
    assert f"\nsnapshot_data: {warning}" in out and out.count(warning) >= 2  # the task's log, and the summary's
    assert f"\n{warning}{tmp_path}/sft/{{date}}/ still written?\n\nstatus: skipped" in out
    assert json.loads((root / "nodrop4" / "summary.json").read_text())["warning"].startswith(warning)
    # a run that reads data ends the streak
    assert dataset.skip_streak(_ctx(root, data, "read"), skipped=False) == ""
    assert read_json(LocalStore(root / dataset.SKIPS), "local-fsdp.skips.json") == {"runs": []}


# ---------------------------------------------------------------- the evaluation set's identity


def test_a_changed_evaluation_set_is_refused_naming_what_changed(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(rows(1))
    (tmp_path / "eval.jsonl").write_bytes(rows(7, count=12))
    root = tmp_path / "runs"
    sets = f"train.dataset={tmp_path}/a.jsonl train.eval_dataset={tmp_path}/eval.jsonl"
    first, _, _, _ = take(sets)
    write_json(LocalStore(root / "r0"), "data/manifest.json", first)
    _champion(root, data_manifest=str(root / "r0" / "data" / "manifest.json"), eval_snapshot=first["eval"]["digest"])
    assert dataset.snapshot_data(_ctx(root, sets, "same"))["eval_snapshot"] == first["eval"]["digest"]
    (tmp_path / "eval.jsonl").write_bytes(rows(7, count=13))  # one example more
    with pytest.raises(SpecError) as raised:
        dataset.snapshot_data(_ctx(root, sets, "more"))
    assert raised.value.field == "train.eval_dataset" and "12 examples then, 13 now" in str(raised.value)
    (tmp_path / "eval.jsonl").write_bytes(rows(6, count=12))  # as many, other examples
    with pytest.raises(SpecError, match=r"the same source and number of examples \(12\), other content"):
        dataset.snapshot_data(_ctx(root, sets, "other"))
    assert read_json(LocalStore(root / "other"), dataset.MANIFEST) is None


def test_a_champion_that_recorded_what_it_pinned_still_matches_the_same_set(tmp_path):
    """A champion registered before content digests recorded the digest of the items it pinned: the same items
    are still its set."""
    (tmp_path / "a.jsonl").write_bytes(rows(1))
    (tmp_path / "eval.jsonl").write_bytes(rows(7, count=12))
    sets = f"train.dataset={tmp_path}/a.jsonl train.eval_dataset={tmp_path}/eval.jsonl"
    first, _, _, _ = take(sets)
    root = tmp_path / "runs"
    _champion(root, eval_snapshot=first["eval"]["pinned"])
    assert dataset.snapshot_data(_ctx(root, sets, "next"))["proceed"] == "train"


def test_the_content_digest_is_the_prompt_fields_of_every_example_in_any_order():
    a = [{"instruction": "x", "response": "1", "ingested": "2026-12-01"}, {"instruction": "y", "response": "2"}]
    b = [{"response": "2", "instruction": "y", "other": 3}, {"instruction": "x", "response": "1"}]
    assert snapshot.content_digest(a) == snapshot.content_digest(b)
    assert snapshot.content_digest(a) != snapshot.content_digest(a + a[:1])  # the same example twice counts twice
    assert snapshot.content_digest(a) != snapshot.content_digest([{**a[0], "response": "3"}, a[1]])


# ---------------------------------------------------------------- the keys


@pytest.mark.parametrize(
    ("sets", "key", "says"),
    [
        ("train.dataset=bq://p-123456.d.t train.dataset_ready=_SUCCESS", "train.dataset_ready", "gs:// or local"),
        ("train.dataset=gs://bucket-1/d/ train.dataset_ready=a/_SUCCESS", "train.dataset_ready", "not a file name"),
        ("train.dataset=gs://bucket-1/d/ train.dataset_ready=..", "train.dataset_ready", "not a file name"),
        ("train.dataset=gs://bucket-1/d/ train.bigquery_project=my-project", "train.bigquery_project", "bq://"),
        ("train.dataset=bq://p-123456.d.t train.bigquery_project=My_Project", "train.bigquery_project", "project id"),
        (
            "train.dataset=gs://bucket-1/d/ train.bigquery_service_account=a@p.iam.gserviceaccount.com",
            "train.bigquery_service_account",
            "bq://",
        ),
        (
            "train.dataset=bq://p-123456.d.t train.bigquery_service_account=me@example.com",
            "train.bigquery_service_account",
            "service account",
        ),
        (
            "train.dataset=bq://p-123456.d.t train.bigquery_results_dataset=my-results",
            "train.bigquery_results_dataset",
            "not a BigQuery dataset name",
        ),
    ],
)
def test_the_new_keys_are_validated_naming_the_key(sets, key, says):
    from components.spec import validate

    with pytest.raises(SpecError) as raised:
        validate(resolve("local-fsdp", sets))
    assert raised.value.field == key and says in str(raised.value)


def test_the_new_keys_validate_where_they_apply():
    from components.spec import validate

    validate(resolve("local-fsdp", "train.dataset=gs://bucket-1/d/{date}/ train.dataset_ready=_SUCCESS"))
    validate(resolve("local-fsdp", "train.dataset=bq://p-123456.d.t train.bigquery_project=example.com:billing-1"))
    validate(resolve("local-fsdp", "train.dataset=bq://p-123456.d.t train.bigquery_results_dataset=Run_Results_2"))


def test_a_gzip_shard_that_inflates_past_the_cap_is_refused_naming_it(storage, monkeypatch):  # noqa: F811
    """A few kilobytes that inflate to far more (a gzip bomb from whoever may write the drop's bucket) are inflated as
    a stream and refused once past ``drops.MAX_INFLATED``, naming the object; a shard under it, in two gzip members,
    is read whole."""
    monkeypatch.setattr(drops, "MAX_INFLATED", 4 * drops.CHUNK)
    storage.put(DATA, "ok/part-00000.jsonl.gz", gzip.compress(rows(1, 10)) + gzip.compress(rows(2, 10)))
    manifest, train, heldout, _ = take(f"train.dataset=gs://{DATA}/ok/")
    assert len(train) + len(heldout) == 20
    bomb = gzip.compress(rows(3) + b" " * (64 * drops.CHUNK))
    assert len(bomb) < 100_000
    storage.put(DATA, "bomb/part-00000.jsonl.gz", bomb)
    with pytest.raises(SpecError) as raised:
        take(f"train.dataset=gs://{DATA}/bomb/")
    assert raised.value.field == "train.dataset"
    assert f"gs://{DATA}/bomb/part-00000.jsonl.gz: inflates to more than {4 * drops.CHUNK} bytes" in str(raised.value)


def test_a_drop_rewritten_with_the_same_examples_trains_only_on_what_the_lineage_has_not_seen(
    storage,  # noqa: F811
    tmp_path,
    capsys,
):
    """Objects written again (a new generation, so read anew) hold examples the champion trained on: each run keeps
    the keys of every training example its lineage has seen beside its examples (``data/keys.bin``, its sha256 in the
    manifest), and the next run drops those and counts them (``champion_duplicates``, its output, the card); a key
    file that is not the one the manifest recorded is said once, and then nothing is dropped against it."""
    root, sets = _stable_drop(storage, tmp_path)
    first = dataset.snapshot_data(_ctx(root, sets, "r0"))  # no champion yet: everything
    manifest = read_json(LocalStore(root / "r0"), dataset.MANIFEST)
    keys = (root / "r0" / "data" / "keys.bin").read_bytes()
    assert first["num_examples"] == 20 and manifest["keys"]["count"] == 20 and len(keys) == 20 * snapshot.KEY_BYTES
    assert manifest["keys"]["digest"] == snapshot.file_digest(keys) and manifest["champion_duplicates"] == 0
    assert list(snapshot.Keys(keys)) == sorted(list(snapshot.Keys(keys)))  # sorted, each once
    _champion(root, data_manifest=first["manifest"], eval_snapshot=manifest["eval"]["digest"])  # before key digests
    new = b'{"instruction": "Echo something new.", "response": "new"}\n'
    storage.put(DATA, "stable/part-00000.jsonl", rows(1) + new)  # rewritten: the same lines and one more
    capsys.readouterr()
    ctx = _ctx(root, sets, "r1")
    second = dataset.snapshot_data(ctx)
    assert (second["num_examples"], second["champion_duplicates"]) == (1, 20)
    out = capsys.readouterr().out
    assert "20 example(s) the champion's lineage already saw dropped (champion_duplicates)" in out
    assert "dropped 0 duplicate example(s), 20 the champion already saw and 0 also in the evaluation set" in out
    assert [json.loads(line)["response"] for line in (root / "r1" / "data" / "train.jsonl").read_text().splitlines()]\
        == ["new"]  # fmt: skip
    theirs = read_json(ctx.store, dataset.MANIFEST)
    assert theirs["champion_duplicates"] == 20 and theirs["keys"]["count"] == 21  # the champion's and its own
    assert "| already seen by the champion's lineage, dropped | 20 |" in (root / "r1" / "data" / "card.md").read_text()
    storage.put(DATA, "stable/part-00000.jsonl", rows(1))  # the same bytes again, yet another generation
    skipped = dataset.snapshot_data(_ctx(root, sets, "r2"))
    assert skipped["proceed"] == "skip" and "(20 read again, every one already seen)" in skipped["reason"]
    (root / "r0" / "data" / "keys.bin").write_bytes(keys[16:])  # not the file the manifest recorded
    storage.put(DATA, "stable/part-00000.jsonl", rows(1))
    capsys.readouterr()
    unchecked = dataset.snapshot_data(_ctx(root, sets, "r3"))  # a champion whose registration recorded no keys
    assert unchecked["num_examples"] == 20 and unchecked["champion_duplicates"] == 0
    assert capsys.readouterr().out.count("is not the file its manifest recorded") == 1


def test_the_champions_key_file_is_checked_against_the_registry_and_any_doubt_stops_the_run(
    storage,  # noqa: F811
    tmp_path,
):
    """The registry records the key file's URI and sha256 at register (gate.provenance: ``data_keys``,
    ``data_keys_digest``); the next run checks the file against that, not the manifest beside it, which the same
    writer could replace too. A file rewritten with its manifest, gone, or named outside the champion's own run store
    stops the run (InfraError, SpecError): a run without it would forget what the lineage saw."""
    from components.spec import InfraError

    root, sets = _stable_drop(storage, tmp_path)
    first = dataset.snapshot_data(_ctx(root, sets, "r0"))
    keys_file = root / "r0" / "data" / "keys.bin"
    keys = keys_file.read_bytes()
    assert first["keys"]["uri"] == f"{root / 'r0'}/{dataset.KEYS}"
    recorded = {
        "data_manifest": first["manifest"],
        "data_keys": first["keys"]["uri"],
        "eval_snapshot": first["eval_snapshot"],
    }
    _champion(root, **recorded, data_keys_digest=first["keys"]["digest"])
    storage.put(DATA, "stable/part-00000.jsonl", rows(1))  # the same examples, a new generation
    assert dataset.snapshot_data(_ctx(root, sets, "r1"))["proceed"] == "skip"  # every one already seen
    # the key file and its manifest's digest rewritten together, as a writer of the run store could
    keys_file.write_bytes(keys[16:])
    manifest = read_json(LocalStore(root / "r0"), dataset.MANIFEST)
    manifest["keys"]["digest"] = snapshot.file_digest(keys[16:])
    write_json(LocalStore(root / "r0"), dataset.MANIFEST, manifest)
    with pytest.raises(InfraError, match="keys.bin is not the file the registry recorded"):
        dataset.snapshot_data(_ctx(root, sets, "r2"))
    keys_file.unlink()
    with pytest.raises(InfraError, match="keys.bin is gone"):
        dataset.snapshot_data(_ctx(root, sets, "r3"))
    assert not (root / "r2" / "data" / "keys.bin").exists() and not (root / "r3" / "data").exists()
    elsewhere = tmp_path / "elsewhere" / "keys.bin"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(keys)
    _champion(root, **recorded | {"data_keys": str(elsewhere)}, data_keys_digest=first["keys"]["digest"])
    with pytest.raises(SpecError, match="not in its own run store") as raised:
        dataset.snapshot_data(_ctx(root, sets, "r4"))
    assert raised.value.field == "train.data_since"


def _stable_drop(storage, tmp_path):  # noqa: F811
    """The run root and settings of a stable-prefix drop (one object) continued from its champion, with a fixed
    evaluation set beside it."""
    storage.put(DATA, "stable/part-00000.jsonl", rows(1))
    (tmp_path / "eval.jsonl").write_bytes(rows(7, count=12))
    sets = (
        f"train.dataset=gs://{DATA}/stable/ train.eval_dataset={tmp_path}/eval.jsonl "
        "train.data_since=champion train.init_from=champion"
    )
    return tmp_path / "runs", sets
