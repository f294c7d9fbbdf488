"""A BigQuery table as a run's data (components/data/bigquery.py) against the emulated BigQuery
(tests/emulators/bigquery.py), through the real client: the snapshot pins the rows in time, ``after`` reads only the
newer ones, every bad input is a SpecError naming its field before anything is spent, and the rows come page by
page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV
from components.data import bigquery as data
from components.spec import InfraError, SpecError
from tests.emulators.bigquery import BigQueryEmulator

PROJECT, TOKEN = "tpupipe-data", "t0ken"
TABLE = f"{PROJECT}.examples.dolly"
FIELD = "train.dataset"
SCHEMA = [("instruction", "STRING"), ("response", "STRING"), ("category", "STRING"), ("ingested", "TIMESTAMP")]
NOW = datetime.now(UTC)
HOUR = timedelta(hours=1)


class Clock:
    """The emulator's clock: now, moved by the tests."""

    def __init__(self):
        self.offset = timedelta(0)

    def __call__(self) -> float:
        return (datetime.now(UTC) + self.offset).timestamp()


@pytest.fixture
def bq(monkeypatch):
    emulator = BigQueryEmulator(token=TOKEN, clock=Clock())
    monkeypatch.setenv(data.EMULATOR_HOST_ENV, emulator.start())
    monkeypatch.setenv(EMULATOR_HOST_ENV, emulator.endpoint)  # credentials(): the emulators' static token
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, TOKEN)
    emulator.create_table(TABLE, SCHEMA, at=NOW - 48 * HOUR)
    emulator.insert(TABLE, [example(n, NOW - 24 * HOUR) for n in range(10)], at=NOW - 24 * HOUR)
    yield emulator
    emulator.stop()


def example(n: int, ingested: datetime, **fields) -> dict:
    category = "math" if n % 2 else "words"
    return {"instruction": f"Say {n}.", "response": str(n), "category": category, "ingested": ingested, **fields}


def snap(**kwargs) -> dict:
    return data.snapshot(TABLE, field=FIELD, at=kwargs.pop("at", datetime.now(UTC)), **kwargs)


def read(snapshot: dict, **kwargs) -> list[dict]:
    return list(data.rows(snapshot, field=FIELD, **kwargs))


@pytest.mark.parametrize(
    ("uri", "table"),
    [
        ("bq://tpupipe-data.examples.dolly", "tpupipe-data.examples.dolly"),
        ("bq://example.com:my-project.Data_2.table with spaces-1", "example.com:my-project.Data_2.table with spaces-1"),
        ("bq://bigquery-public-data.samples.shakespeare", "bigquery-public-data.samples.shakespeare"),
        ("bq://tpupipe-data.examples.données", "tpupipe-data.examples.données"),
    ],
)
def test_a_table_uri_names_project_dataset_and_table(uri, table):
    assert data.parse_table(uri, FIELD) == table


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("tpupipe-data.examples.dolly", "not a BigQuery table URI"),
        ("bq://examples.dolly", "not a BigQuery table URI"),
        ("bq://Tpupipe.examples.dolly", "not a Google Cloud project id"),
        ("bq://tpupipe-data.exam-ples.dolly", "not a BigQuery dataset name"),
        ("bq://tpupipe-data.examples.dol/ly", "not a BigQuery table name"),
        ("bq://tpupipe-data.examples.", "not a BigQuery table name"),
        ("bq://tpupipe-data.examples." + "t" * 1025, "not a BigQuery table name"),
    ],
)
def test_a_malformed_table_uri_is_a_spec_error_naming_the_field(uri, error):
    with pytest.raises(SpecError, match=error) as raised:
        data.parse_table(uri, FIELD)
    assert raised.value.field == FIELD


def test_a_snapshot_counts_the_rows_and_reads_them_back_as_json(bq):
    at = datetime.now(UTC)
    got = snap(at=at, time_column="ingested")
    assert got == {
        "table": TABLE,
        "project": PROJECT,
        "snapshot_time": at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "num_rows": 10,
        "fields": ["instruction", "response", "category", "ingested"],
        "filter": "",
        "filter_types": {},
        "time_column": "ingested",
        "time_type": "TIMESTAMP",
        "after": None,
        "max_time": (NOW - 24 * HOUR).isoformat().replace("+00:00", "Z"),
    }
    assert bq.calls == ["tables.get", "jobs.query"]
    rows = read(got)
    assert rows[3] == {
        "instruction": "Say 3.",
        "response": "3",
        "category": "math",
        "ingested": (NOW - 24 * HOUR).isoformat().replace("+00:00", "Z"),
    }
    assert [r["response"] for r in rows] == [str(n) for n in range(10)]
    filtered = snap(filter="category=math")
    assert filtered["num_rows"] == 5 and [r["response"] for r in read(filtered)] == ["1", "3", "5", "7", "9"]
    both = snap(filter="category=math, response=3")  # every pair must hold
    assert both["num_rows"] == 1 and [r["response"] for r in read(both)] == ["3"]
    # The values are query parameters, not SQL: a value that reads as SQL is only a value no row has.
    for value in ("math' OR 'a'='a", "x'; DELETE FROM t; --"):
        with pytest.raises(SpecError, match="has no rows matching"):
            snap(filter=f"category={value}")


def test_a_snapshot_read_later_yields_the_rows_it_counted(bq):
    pinned = snap(time_column="ingested")
    bq.insert(TABLE, [example(n, datetime.now(UTC)) for n in range(10, 15)])
    bq.update(TABLE, lambda r: r["response"] == "1", {"response": "one"})
    bq.delete(TABLE, lambda r: r["response"] == "2")
    assert [r["response"] for r in read(pinned)] == [str(n) for n in range(10)]
    assert snap()["num_rows"] == 14  # the table now


def test_after_counts_and_reads_only_the_newer_rows(bq):
    first = snap(time_column="ingested")
    nothing_new = snap(time_column="ingested", after=first["max_time"])
    assert nothing_new["num_rows"] == 0 and nothing_new["max_time"] is None  # no error: the caller skips the run
    assert read(nothing_new) == []
    later = NOW - HOUR
    bq.insert(TABLE, [example(n, later) for n in range(10, 13)], at=later)
    second = snap(time_column="ingested", after=first["max_time"])
    assert second["num_rows"] == 3 and second["after"] == first["max_time"]
    assert second["max_time"] == later.isoformat().replace("+00:00", "Z")
    assert [r["response"] for r in read(second)] == ["10", "11", "12"]
    only_math = snap(time_column="ingested", after=first["max_time"], filter="category=math")
    assert [r["response"] for r in read(only_math)] == ["11"]


@pytest.mark.parametrize("kind", ["DATETIME", "DATE", "INT64"])
def test_after_reads_any_ingestion_column_type(bq, kind):
    table = f"{PROJECT}.examples.by_{kind.lower()}"
    values = {
        "DATETIME": [datetime(2026, 1, d, 12) for d in (1, 2, 3)],
        "DATE": [datetime(2026, 1, d).date() for d in (1, 2, 3)],
        "INT64": [100, 200, 300],
    }[kind]
    bq.create_table(table, [("instruction", "STRING"), ("response", "STRING"), ("seq", kind)], at=NOW - 2 * HOUR)
    bq.insert(table, [{"instruction": "i", "response": "r", "seq": v} for v in values[:2]], at=NOW - HOUR)
    first = data.snapshot(table, field=FIELD, at=datetime.now(UTC), time_column="seq")
    assert first["time_type"] == kind and first["max_time"] == str(data._jsonable(values[1]))
    bq.insert(table, [{"instruction": "i", "response": "new", "seq": values[2]}])
    second = data.snapshot(table, field=FIELD, at=datetime.now(UTC), time_column="seq", after=first["max_time"])
    assert second["num_rows"] == 1 and [r["response"] for r in read(second)] == ["new"]


def test_the_rows_come_page_by_page(bq):
    bq.insert(TABLE, [example(n, NOW - 2 * HOUR) for n in range(10, 2500)], at=NOW - 2 * HOUR)
    pinned = snap()
    bq.calls.clear()
    rows = read(pinned, page_size=1000)
    assert [r["response"] for r in rows] == [str(n) for n in range(2500)]
    assert bq.calls == ["jobs.query", "jobs.get", "jobs.getQueryResults", "jobs.getQueryResults"]


def test_a_missing_table_or_dataset_is_a_spec_error(bq):
    for table, said in [(f"{PROJECT}.examples.nope", "Not found: Table"), (f"{PROJECT}.nope.t", "Not found: Dataset")]:
        with pytest.raises(SpecError, match=f"{table} does not exist.*{said}") as raised:
            data.snapshot(table, field=FIELD, at=datetime.now(UTC))
        assert raised.value.field == FIELD


def test_no_permission_names_the_roles(bq, monkeypatch):
    member = "serviceAccount:pipeline@tpupipe-data.iam.gserviceaccount.com"
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(member))
    with pytest.raises(SpecError, match="may not read") as raised:
        snap()
    assert raised.value.field == FIELD
    assert any("roles/bigquery.dataViewer on the dataset tpupipe-data.examples" in v for v in raised.value.valid)
    assert any("roles/bigquery.jobUser on the project tpupipe-data" in v for v in raised.value.valid)
    bq.grant(member, "roles/bigquery.metadataViewer", f"{PROJECT}.examples")
    with pytest.raises(SpecError, match="may not run BigQuery jobs in project tpupipe-data") as raised:
        snap()  # the schema read, the query refused: no bigquery.jobs.create where it runs
    assert any("roles/bigquery.jobUser on the project tpupipe-data" in v for v in raised.value.valid)
    bq.grant(member, "roles/bigquery.jobUser", PROJECT)
    with pytest.raises(SpecError, match="permission to query table"):
        snap()
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    assert snap()["num_rows"] == 10


def test_no_rows_is_a_spec_error_unless_reading_after_a_time(bq):
    with pytest.raises(SpecError, match="has no rows matching train.dataset_filter 'category=none'") as raised:
        snap(filter="category=none")
    assert raised.value.field == FIELD
    empty = f"{PROJECT}.examples.empty"
    bq.create_table(empty, SCHEMA, at=NOW - HOUR)
    with pytest.raises(SpecError, match="has no rows as of"):
        data.snapshot(empty, field=FIELD, at=datetime.now(UTC))
    assert (
        data.snapshot(empty, field=FIELD, at=datetime.now(UTC), time_column="ingested", after="2026-01-01T00:00:00Z")[
            "num_rows"
        ]
        == 0
    )


def test_rows_without_what_the_formatter_needs_are_named(bq):
    odd = f"{PROJECT}.examples.odd"
    bq.create_table(odd, [("prompt", "STRING"), ("response", "STRING")], at=NOW - HOUR)
    with pytest.raises(
        SpecError, match="has no column instruction, which the trainer's formatter needs; it has prompt"
    ):
        data.snapshot(odd, field=FIELD, at=datetime.now(UTC))
    typed = f"{PROJECT}.examples.typed"
    bq.create_table(typed, [("instruction", "STRING"), ("response", "INT64")], at=NOW - HOUR)
    with pytest.raises(SpecError, match="response is INTEGER; the formatter's columns must be STRING"):
        data.snapshot(typed, field=FIELD, at=datetime.now(UTC))
    bq.insert(
        TABLE, [example(10, NOW, response=None), example(11, NOW, response=""), example(12, NOW, instruction=None)]
    )
    with pytest.raises(SpecError) as raised:
        snap()
    assert raised.value.field == FIELD
    assert "of its 13 rows, some lack a column the trainer's formatter needs (NULL or empty)" in str(raised.value)
    assert "(NULL or empty): instruction in 1, response in 2; the first found" in str(raised.value)
    assert 'the first found: {"instruction": "Say 10.", "response": null' in str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "key", "error"),
    [
        ({"filter": "nope=x"}, "train.dataset_filter", "has no column nope; it has instruction, response"),
        (
            {"filter": "ingested=soon"},
            "train.dataset_filter",
            "'soon' is not a TIMESTAMP value for the column ingested",
        ),
        ({"filter": "category IS NOT NULL"}, "train.dataset_filter", "is not COLUMN=VALUE"),
        ({"filter": "EXISTS(SELECT 1 FROM `p.d.secrets`)"}, "train.dataset_filter", "is not COLUMN=VALUE"),
        ({"filter": "category IN (SELECT c FROM `p.d.t`)"}, "train.dataset_filter", "is not COLUMN=VALUE"),
        ({"filter": "category=a,category=b"}, "train.dataset_filter", "column 'category' named twice"),
        ({"time_column": "nope"}, "train.dataset_time_column", "has no column 'nope'"),
        ({"time_column": "category"}, "train.dataset_time_column", "category is STRING: an ingestion time is"),
        ({"after": "2026-01-01T00:00:00Z"}, "train.dataset_time_column", "needs the column they are ordered by"),
        ({"time_column": "ingested", "after": "soon"}, "train.dataset_time_column", "'soon' is not a TIMESTAMP"),
    ],
)
def test_a_bad_filter_or_time_column_names_its_field(bq, kwargs, key, error):
    with pytest.raises(SpecError, match=error) as raised:
        snap(**kwargs)
    assert raised.value.field == key


def test_a_snapshot_past_the_time_travel_window_cannot_be_read(bq):
    pinned = snap()
    bq.clock.offset = timedelta(days=8)
    with pytest.raises(SpecError, match="outside the table's time travel window .*Invalid snapshot time") as raised:
        read(pinned)
    assert raised.value.field == FIELD
    with pytest.raises(SpecError, match="Cannot read before"):
        snap(at=datetime.now(UTC) - timedelta(days=3))  # before the table was created


def test_rows_refuse_a_snapshot_that_counts_other_rows(bq):
    pinned = {**snap(), "num_rows": 11}
    with pytest.raises(InfraError, match="has 10 rows now and had 11"):
        read(pinned)


def test_the_queries_run_in_the_billing_project(bq):
    got = snap(project="tpupipe-billing")
    assert got["project"] == "tpupipe-billing"
    assert [j.project for j in bq.jobs.values()] == ["tpupipe-billing"]
    read(got)
    assert {j.project for j in bq.jobs.values()} == {"tpupipe-billing"}


def test_a_runs_snapshot_reads_the_table_as_of_its_time_and_then_only_what_is_new(bq, tmp_path):
    """The run's snapshot (components.data.snapshot) of a table with ``train.data_since=champion``: the rows as of
    its time; against that manifest, nothing new is a run that ends after its snapshot; rows ingested later are the
    next run's, and only they."""
    from components.data import snapshot
    from components.workload import resolve

    (tmp_path / "eval.jsonl").write_text('{"instruction": "Say 99.", "response": "99"}\n')
    spec = resolve(
        "local-fsdp",
        f"train.dataset=bq://{TABLE} train.dataset_time_column=ingested train.data_since=champion "
        "train.init_from=champion "
        f"train.eval_dataset={tmp_path}/eval.jsonl",
    )
    first, train, heldout = snapshot.take(spec, NOW, log=lambda line: None)
    assert first["train"]["table"]["num_rows"] == 10 and len(train) == 10 and len(heldout) == 1
    assert first["max_time"] and first["digest"].startswith("sha256:")
    nothing, train, _ = snapshot.take(spec, NOW, first, "local-fsdp@1", log=lambda line: None)
    assert nothing["skip"].startswith("no examples since champion local-fsdp@1") and train == []
    bq.insert(TABLE, [example(n, NOW - 2 * HOUR) for n in range(10, 15)], at=NOW - 2 * HOUR)
    later, train, _ = snapshot.take(spec, NOW, first, "local-fsdp@1", log=lambda line: None)
    assert sorted(e["instruction"] for e in train) == [f"Say {n}." for n in range(10, 15)]
    assert later["max_time"] > first["max_time"] and later["digest"] != first["digest"]
