"""BigQuery read where the data is, billed where the run is (components/data/bigquery.py, snapshot.py) against the
emulated BigQuery's rules (tests/emulators/bigquery.py, bigquery_storage.py: a read session needs
``bigquery.readsessions.create`` in the project it is created in, which is billed, as a job needs
``bigquery.jobs.create``; reading a table needs ``bigquery.tables.getData`` on it, its dataset or its project;
``allAuthenticatedUsers`` as a public dataset is shared): a table in another project and a public-dataset-shaped one
are read with sessions in the run's project; sessions billed in the data project, where the run's identity may not
create them, are refused as BigQuery refuses them. And a fixed evaluation set read from BigQuery on two days is one
set."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from components.cloud.credentials import EMULATOR_TOKEN_ENV
from components.data import bigquery, snapshot
from components.platforms.store import LocalStore, write_json
from components.spec import SpecError
from components.stages import dataset
from components.workload import resolve
from tests.emulators.bigquery_storage import start_bigquery, stop_bigquery
from tests.unit.test_data_snapshot import _champion, _ctx

RUN, DATA, PUBLIC = "tpupipe-run-1", "acme-data-1", "bigquery-public-data"
TABLE, SHARED = f"{DATA}.sft.examples", f"{PUBLIC}.samples.instructions"
PIPELINE = "serviceAccount:pipeline@tpupipe-run-1.iam.gserviceaccount.com"
SCHEMA = [("instruction", "STRING"), ("response", "STRING"), ("ingested", "TIMESTAMP")]
NOW = datetime.now(UTC)
HOUR = timedelta(hours=1)


def example(n: int) -> dict:
    return {"instruction": f"Say {n}.", "response": str(n), "ingested": NOW - 40 * HOUR}


@pytest.fixture
def bq(monkeypatch):
    """Two projects' tables and a public one; the run's identity (the pipeline's service account) may create jobs in
    the run's project only, and read the data project's dataset; the public dataset is everyone's to read."""
    emulator = start_bigquery(monkeypatch, "t0ken", "owner@example.com")
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, emulator.token_for(PIPELINE))
    for table in (TABLE, SHARED, f"{DATA}.sft.eval"):
        emulator.create_table(table, SCHEMA, at=NOW - 48 * HOUR)
        emulator.insert(table, [example(n) for n in range(20)], at=NOW - 40 * HOUR)
    emulator.grant(PIPELINE, "roles/bigquery.jobUser", RUN)
    emulator.grant(PIPELINE, "roles/bigquery.readSessionUser", RUN)
    emulator.grant(PIPELINE, "roles/bigquery.dataViewer", f"{DATA}.sft")
    emulator.grant("allAuthenticatedUsers", "roles/bigquery.dataViewer", f"{PUBLIC}.samples")
    yield emulator
    stop_bigquery(emulator)


def sessions(bq) -> list[tuple[str, str]]:
    """(parent, table) of each read session the emulator created."""
    return [(s.parent, s.table) for s in bq.storage.sessions.values()]


def test_a_table_in_another_project_is_read_with_a_session_billed_in_the_runs_project(bq):
    spec = resolve("local-fsdp", f"gke.project={RUN} train.dataset=bq://{TABLE}")
    assert snapshot.job_project(spec) == RUN
    manifest, train, heldout = snapshot.take(spec, NOW - HOUR, log=lambda line: None)
    assert manifest["train"]["table"]["project"] == RUN and len(train) + len(heldout) == 20
    assert sessions(bq) == [(RUN, TABLE)] and bq.jobs == {}  # the data project's table, the run's project's session


def test_a_public_dataset_is_read_with_a_session_billed_in_the_runs_project(bq):
    """A public dataset: readable by all, no job or session rights there."""
    spec = resolve("local-fsdp", f"train.dataset=bq://{SHARED} train.bigquery_project={RUN}")
    manifest, train, heldout = snapshot.take(spec, NOW - HOUR, log=lambda line: None)
    assert len(train) + len(heldout) == 20 and sessions(bq) == [(RUN, SHARED)] and bq.jobs == {}


@pytest.mark.parametrize("table", [TABLE, SHARED])
def test_sessions_billed_where_the_data_is_are_refused_as_bigquery_refuses_them(bq, table):
    """The old layout, billed in the table's project: the run's identity holds no bigquery.readsessions.create
    there."""
    with pytest.raises(SpecError) as raised:
        bigquery.snapshot(table, field="train.dataset", at=NOW - HOUR)  # no project: the table's own
    project = table.split(".")[0]
    assert raised.value.field == "train.dataset"
    assert f"may not open BigQuery read sessions in project {project}, where the run reads the table and is billed" in (
        str(raised.value)
    )
    # BigQuery's own words
    assert f"the user does not have 'bigquery.readsessions.create' permission for 'projects/{project}'" in str(
        raised.value
    )
    assert any("train.bigquery_project=PROJECT" in hint for hint in raised.value.valid)
    assert bq.storage.sessions == {} and bq.jobs == {}


def test_rows_committed_since_the_champion_are_read_with_a_job_billed_in_the_runs_project(bq, tmp_path):
    """train.data_since=champion by commit time: the APPENDS query is a job of the run's project, reading the data
    project's table, and writing its result to a dataset of the run's project, the run identity's own of the table's
    location (tpupipe_results_eu_HASH). An identity that may run jobs but not create that dataset
    (roles/bigquery.jobUser alone) is refused naming train.bigquery_results_dataset and bigquery.datasets.create,
    before any job; with roles/bigquery.user it creates the dataset, in the table's location, as its one OWNER (its
    address, which the UserInfo endpoint gives, in the access list it creates the dataset with), so it writes, reads
    and deletes its result table there with no other grant."""
    (tmp_path / "e.jsonl").write_text('{"instruction": "Say e.", "response": "e"}\n')
    bq.create_dataset(f"{DATA}.eu", location="EU", at=NOW - 48 * HOUR)
    eu = f"{DATA}.eu.examples"
    bq.create_table(eu, SCHEMA, at=NOW - 48 * HOUR)
    bq.insert(eu, [example(n) for n in range(20)], at=NOW - 40 * HOUR)
    bq.grant(PIPELINE, "roles/bigquery.dataViewer", f"{DATA}.eu")
    sets = f"gke.project={RUN} train.dataset=bq://{eu} train.dataset_time_column=ingested "
    spec = resolve(
        "local-fsdp", sets + f"train.data_since=champion train.init_from=champion train.eval_dataset={tmp_path}/e.jsonl"
    )
    first, _, _ = snapshot.take(spec, datetime.now(UTC), log=lambda line: None)
    pinned = datetime.fromisoformat(first["train"]["table"]["snapshot_time"])
    bq.insert(eu, [example(20)], at=pinned + timedelta(microseconds=1))
    own = f"tpupipe_results_eu_{hashlib.sha256(PIPELINE.split(':')[1].encode()).hexdigest()[:8]}"
    with pytest.raises(SpecError) as raised:
        snapshot.take(spec, datetime.now(UTC), first, "m@1", log=lambda line: None)
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"may not create the dataset {RUN}.{own} (it lacks bigquery.datasets.create in project {RUN})" in (
        str(raised.value)
    )
    assert f"User does not have bigquery.datasets.create permission in project {RUN}" in str(raised.value)  # BigQuery's
    assert any(f"roles/bigquery.user on the project {RUN}" in hint for hint in raised.value.valid)
    assert bq.jobs == {} and (RUN, own) not in bq.datasets
    bq.grant(PIPELINE, "roles/bigquery.user", RUN)
    later, train, _ = snapshot.take(spec, datetime.now(UTC), first, "m@1", log=lambda line: None)
    assert [e["instruction"] for e in train] == ["Say 20."] and {job.project for job in bq.jobs.values()} == {RUN}
    results = bq.datasets[(RUN, own)]
    assert results.location == "EU" and results.labels == bigquery.RESULTS_LABELS and results.tables == {}
    assert results.default_expiration_ms == bigquery.RESULTS_DEFAULT_EXPIRATION.total_seconds() * 1000
    entries = bigquery.dataset_access(bigquery.client(RUN), f"{RUN}.{own}")
    assert {(e.role, e.entity_id) for e in entries} == {("OWNER", PIPELINE.split(":")[1])}
    assert later["train"]["table"]["appends_table"].startswith(f"{RUN}.{own}.appends_")


def test_reading_needs_read_on_the_tables_dataset_wherever_the_jobs_run(bq):
    other = f"{DATA}.private.secrets"
    bq.create_table(other, SCHEMA, at=NOW - 48 * HOUR)
    bq.insert(other, [example(1)], at=NOW - 40 * HOUR)
    with pytest.raises(SpecError, match="may not read"):
        bigquery.snapshot(other, field="train.dataset", at=NOW - HOUR, project=RUN)
    assert bigquery.missing_read(other, RUN) == list(bigquery.READ_PERMISSIONS)
    assert bigquery.missing_read(TABLE, RUN) == [] and bigquery.missing_read(SHARED, RUN) == []
    with pytest.raises(SpecError, match="does not exist"):
        bigquery.missing_read(f"{DATA}.sft.nope", RUN)


def test_the_same_bigquery_rows_on_two_days_are_the_same_evaluation_set(bq, tmp_path):
    """A schedule's second day: the evaluation table read at another snapshot time, its rows unchanged, is the
    champion's set, so the run goes on to be judged (promoted or rejected) instead of refused; a row more is another
    set, refused naming what changed."""
    (tmp_path / "a.jsonl").write_text('{"instruction": "Say a.", "response": "a"}\n')
    root = tmp_path / "runs"
    sets = f"gke.project={RUN} train.dataset={tmp_path}/a.jsonl train.eval_dataset=bq://{DATA}.sft.eval"
    first = dataset.snapshot_data(_ctx(root, sets, "day1"), schedule_time=(NOW - 26 * HOUR).isoformat())
    manifest = LocalStore(root / "day1").read_text("data/manifest.json")
    assert manifest and first["eval_snapshot"].startswith("sha256:")
    write_json(LocalStore(root / "r0"), "data/manifest.json", json.loads(manifest))
    _champion(root, data_manifest=str(root / "r0" / "data" / "manifest.json"), eval_snapshot=first["eval_snapshot"])
    second = dataset.snapshot_data(_ctx(root, sets, "day2"), schedule_time=(NOW - 2 * HOUR).isoformat())
    assert second["proceed"] == "train" and second["eval_snapshot"] == first["eval_snapshot"]
    bq.insert(f"{DATA}.sft.eval", [example(99)], at=NOW - HOUR)
    with pytest.raises(SpecError) as raised:
        dataset.snapshot_data(_ctx(root, sets, "day3"))
    assert raised.value.field == "train.eval_dataset" and "20 examples then, 21 now" in str(raised.value)


def test_a_champion_of_manifest_version_1_judged_on_a_bigquery_set_matches_by_its_own_copys_content(
    bq, tmp_path, capsys
):
    """A champion registered before content digests recorded its BigQuery evaluation set's digest with the snapshot
    time in it, which no later run reads again: the content digest of its run's own copy of those examples
    (``data/heldout.jsonl``) is compared instead, said in one line; a set whose rows changed since is still refused."""
    (tmp_path / "a.jsonl").write_text('{"instruction": "Say a.", "response": "a"}\n')
    root = tmp_path / "runs"
    sets = f"gke.project={RUN} train.dataset={tmp_path}/a.jsonl train.eval_dataset=bq://{DATA}.sft.eval"
    dataset.snapshot_data(_ctx(root, sets, "r0"), schedule_time=(NOW - 26 * HOUR).isoformat())
    store = LocalStore(root / "r0")
    manifest = json.loads(store.read_text("data/manifest.json") or "{}")
    # as version 1 wrote it: the set's digest was that of what it pinned (the table, its snapshot time, ...)
    manifest["version"], manifest["eval"]["digest"] = 1, manifest["eval"].pop("pinned")
    write_json(store, "data/manifest.json", manifest)
    _champion(root, data_manifest=str(root / "r0" / "data" / "manifest.json"), eval_snapshot=manifest["eval"]["digest"])
    capsys.readouterr()
    second = dataset.snapshot_data(_ctx(root, sets, "day2"), schedule_time=(NOW - 2 * HOUR).isoformat())
    assert second["proceed"] == "train" and second["eval_snapshot"] != manifest["eval"]["digest"]
    out = capsys.readouterr().out
    assert f"recorded its evaluation set as it pinned it ({manifest['eval']['digest']}, before content digests)" in out
    bq.insert(f"{DATA}.sft.eval", [example(99)], at=NOW - HOUR)
    with pytest.raises(SpecError, match="20 examples then, 21 now"):
        dataset.snapshot_data(_ctx(root, sets, "day3"))
