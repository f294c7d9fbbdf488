"""A BigQuery table as a run's data (components/data/bigquery.py) against the emulated BigQuery
(tests/emulators/bigquery.py), through the real client: the snapshot pins the rows in time, ``after`` reads only the
newer ones, every bad input is a SpecError naming its field before anything is spent, and the rows come a record batch
at a time, from the streams read in parallel, in stream order."""

from __future__ import annotations

import hashlib
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from google.api_core import exceptions
from google.cloud import bigquery
from google.oauth2.credentials import Credentials

from components.cloud.credentials import EMULATOR_TOKEN_ENV, EMULATOR_TOKEN_URI_ENV
from components.data import bigquery as data
from components.spec import InfraError, SpecError
from components.spec.run_spec import TrainSpec
from tests.emulators.bigquery_storage import Fault, start_bigquery, stop_bigquery

PROJECT, TOKEN = "tpupipe-data", "t0ken"
OWNER = "owner@example.com"  # whose the static token is
TABLE = f"{PROJECT}.examples.dolly"
FIELD = "train.dataset"
SCHEMA = [("instruction", "STRING"), ("response", "STRING"), ("category", "STRING"), ("ingested", "TIMESTAMP")]
NOW = datetime.now(UTC)
HOUR = timedelta(hours=1)
MILLISECOND = timedelta(milliseconds=1)  # a snapshot time is whole milliseconds (time travel's precision)


class Clock:
    """The emulator's clock: now, moved by the tests."""

    def __init__(self):
        self.offset = timedelta(0)

    def __call__(self) -> float:
        return (datetime.now(UTC) + self.offset).timestamp()


@pytest.fixture
def bq(monkeypatch):
    """The emulated BigQuery and its Storage Read API, the caller the static token's owner (``OWNER``, as its token's
    information says)."""
    emulator = start_bigquery(monkeypatch, TOKEN, OWNER, clock=Clock())
    emulator.create_table(TABLE, SCHEMA, at=NOW - 48 * HOUR)
    emulator.insert(TABLE, [example(n, NOW - 24 * HOUR) for n in range(10)], at=NOW - 24 * HOUR)
    yield emulator
    stop_bigquery(emulator)


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


def session(bq) -> object:
    """The read session the emulator created last (its CreateReadSessionRequest, its parent)."""
    return list(bq.storage.sessions.values())[-1]


def test_a_snapshot_opens_one_read_session_and_streams_its_rows_as_json(bq):
    # a second back: the microseconds set may be ahead of now, which the emulator refuses as a time in the future
    asked = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=123456)
    at = asked.replace(microsecond=123000)  # time travel counts milliseconds: the snapshot time is whole ones
    got = snap(at=asked, time_column="ingested")
    assert {k: v for k, v in got.items() if k not in ("session", "streams", "arrow_schema")} == {
        "table": TABLE,
        "project": PROJECT,
        "snapshot_time": at.isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "num_rows": 0,  # counted as the rows are read
        "fields": ["instruction", "response", "category", "ingested"],
        "filter": "",
        "filter_types": {},
        "time_column": "ingested",
        "time_type": "TIMESTAMP",
        "after": None,
        "max_time": None,
        "incremental": False,
    }
    assert bq.calls == ["tables.get"] and bq.storage.calls == ["CreateReadSession"]  # no query, no scan
    request = session(bq).request
    assert request.parent == f"projects/{PROJECT}" and request.max_stream_count == data.STREAMS
    assert request.read_session.table == "projects/tpupipe-data/datasets/examples/tables/dolly"
    assert request.read_session.table_modifiers.snapshot_time == at
    assert list(request.read_session.read_options.selected_fields) == ["instruction", "response", "ingested"]
    assert got["session"] == session(bq).name and got["streams"] == list(session(bq).streams)
    rows = read(got)
    assert rows[3] == {
        "instruction": "Say 3.",
        "response": "3",
        "ingested": (NOW - 24 * HOUR).isoformat().replace("+00:00", "Z"),
    }
    assert [r["response"] for r in rows] == [str(n) for n in range(10)]
    assert got["num_rows"] == 10 and got["max_time"] == (NOW - 24 * HOUR).isoformat().replace("+00:00", "Z")
    assert bq.calls == ["tables.get"]
    filtered = snap(filter="category=math")
    assert [r["response"] for r in read(filtered)] == ["1", "3", "5", "7", "9"] and filtered["num_rows"] == 5
    assert session(bq).request.read_session.read_options.row_restriction == '`category` = "math"'
    both = snap(filter="category=math, response=3")  # every pair must hold
    assert [r["response"] for r in read(both)] == ["3"]
    assert session(bq).request.read_session.read_options.row_restriction == '`category` = "math" AND `response` = "3"'
    # A value is a quoted literal, never SQL: a value that reads as SQL is only a value no row has.
    for value in ("math' OR 'a'='a", 'math" OR "a"="a', "x'; DELETE FROM t; --", "math\\"):
        with pytest.raises(SpecError, match="has no rows matching") as raised:
            read(snap(filter=f"category={value}"))
        assert raised.value.field == FIELD


def test_a_filter_value_is_a_literal_of_its_columns_type(bq):
    """Each type a filter compares is sent as a literal of it, quotes, backslashes and line breaks escaped, and
    matches the row that holds that value, and only it."""
    typed = f"{PROJECT}.examples.typed_filters"
    schema = [("instruction", "STRING"), ("response", "STRING"), ("n", "INT64"), ("x", "FLOAT64"), ("ok", "BOOL"),
              ("day", "DATE"), ("at", "TIMESTAMP"), ("local", "DATETIME")]  # fmt: skip
    bq.create_table(typed, schema, at=NOW - 2 * HOUR)
    odd = 'a "quoted" \\ back\nslash'
    rows = [
        {"instruction": "i", "response": odd, "n": 7, "x": 2.5, "ok": True, "day": datetime(2026, 1, 2).date(),
         "at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "local": datetime(2026, 1, 2, 3, 4, 5)},
        {"instruction": "i", "response": "other", "n": 8, "x": 3.5, "ok": False, "day": datetime(2026, 1, 3).date(),
         "at": datetime(2026, 1, 3, tzinfo=UTC), "local": datetime(2026, 1, 3)},
    ]  # fmt: skip
    bq.insert(typed, rows, at=NOW - HOUR)
    for pair in ("n=7", "x=2.5", "ok=true", "day=2026-01-02", "at=2026-01-02T03:04:05Z", "local=2026-01-02T03:04:05"):
        pinned = data.snapshot(typed, field=FIELD, at=datetime.now(UTC), filter=pair)
        assert [r["response"] for r in read(pinned)] == [odd], pair
    assert session(bq).request.read_session.read_options.row_restriction == (
        '`local` = CAST("2026-01-02 03:04:05" AS DATETIME)'
    )
    quoted = data.snapshot(typed, field=FIELD, at=datetime.now(UTC), filter=f"response={odd}")
    assert [r["response"] for r in read(quoted)] == [odd]
    assert session(bq).request.read_session.read_options.row_restriction == (
        '`response` = "a \\"quoted\\" \\\\ back\\u000aslash"'
    )


def test_a_snapshot_read_later_yields_the_rows_as_of_its_time(bq):
    pinned = snap(time_column="ingested")
    bq.insert(TABLE, [example(n, datetime.now(UTC)) for n in range(10, 15)])
    bq.update(TABLE, lambda r: r["response"] == "1", {"response": "one"})
    bq.delete(TABLE, lambda r: r["response"] == "2")
    assert [r["response"] for r in read(pinned)] == [str(n) for n in range(10)]
    assert len(read(snap())) == 14  # the table now


def test_after_reads_only_the_newer_rows(bq):
    first = snap(time_column="ingested")
    read(first)
    nothing_new = snap(time_column="ingested", after=first["max_time"])
    assert read(nothing_new) == []  # no error: the caller skips the run
    assert nothing_new["num_rows"] == 0 and nothing_new["max_time"] is None
    later = NOW - HOUR
    bq.insert(TABLE, [example(n, later) for n in range(10, 13)], at=later)
    second = snap(time_column="ingested", after=first["max_time"])
    assert [r["response"] for r in read(second)] == ["10", "11", "12"]
    assert second["num_rows"] == 3 and second["after"] == first["max_time"]
    assert second["max_time"] == later.isoformat().replace("+00:00", "Z")
    assert session(bq).request.read_session.read_options.row_restriction == (
        f'`ingested` > CAST("{(NOW - 24 * HOUR).isoformat(sep=" ")}" AS TIMESTAMP)'
    )
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
    read(first)
    assert first["time_type"] == kind and first["max_time"] == str(data._jsonable(values[1]))
    bq.insert(table, [{"instruction": "i", "response": "new", "seq": values[2]}], at=datetime.now(UTC) - MILLISECOND)
    second = data.snapshot(table, field=FIELD, at=datetime.now(UTC), time_column="seq", after=first["max_time"])
    assert [r["response"] for r in read(second)] == ["new"] and second["num_rows"] == 1


def reader_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith(data.READER_THREAD)]


def wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_streams_are_read_in_parallel_and_their_rows_come_in_stream_order(bq):
    """Every stream is open at once (the emulator holds each after its first response: a sequential read would
    wait on the first stream forever), the rows come as they come (the first before the streams are read), and all
    of them in stream order, stream 0's, then stream 1's, ..."""
    bq.insert(TABLE, [example(n, NOW - 2 * HOUR) for n in range(10, 2500)], at=NOW - 2 * HOUR)
    bq.storage.batch_rows = 200
    bq.storage.hold = threading.Event()
    pinned = snap()
    assert len(pinned["streams"]) == data.STREAMS
    rows = data.rows(pinned, field=FIELD)
    assert next(rows)["response"] == "0"  # stream 0's first batch, while every stream is held after its first
    assert wait_for(lambda: len(bq.storage.reads) == data.STREAMS)
    assert sorted(r.stream for r in bq.storage.reads) == pinned["streams"]
    assert all(r.ended is None for r in bq.storage.reads)  # all four calls open at the same time
    bq.storage.hold.set()
    assert [r["response"] for r in rows] == [str(n) for n in range(1, 2500)]
    assert bq.storage.calls == ["CreateReadSession"] + ["ReadRows"] * data.STREAMS and bq.jobs == {}
    assert [r.responses for r in bq.storage.reads] == [4] * data.STREAMS  # 625 rows a stream, 200 a batch
    assert reader_threads() == []


def test_a_failing_stream_fails_the_read_in_its_turn_with_the_sequential_reads_error(bq):
    """Stream 1 refused (NOT_FOUND, as a read session expired): stream 0's rows come first, then the InfraError that
    reading the streams one after the other raised, and no reader thread is left."""
    import grpc

    from components.spec import InfraError

    bq.storage.batch_rows = 2
    pinned = snap()
    stream1 = pinned["streams"][1]
    bq.storage.faults.append(
        Fault(
            "ReadRows",
            grpc.StatusCode.NOT_FOUND,
            f"Not found: Stream {stream1}",
            when=lambda r: r.read_stream == stream1,
        )
    )
    got = []
    with pytest.raises(InfraError) as raised:
        for row in data.rows(pinned, field=FIELD):
            got.append(row["response"])
    assert got == ["0", "1", "2"]  # stream 0's share of the 10 rows (3 a stream), and nothing after stream 1's turn
    assert str(raised.value).startswith(f"{FIELD}: {TABLE} was there when the run looked it up, and then not")
    assert f"Not found: Stream {stream1}" in str(raised.value)
    assert reader_threads() == []


@pytest.mark.parametrize("held", [True, False])
def test_a_consumer_that_stops_early_leaves_no_reader_thread(bq, held):
    """Closed after its first row, the read stops and joins every stream's thread: held mid-stream by the service
    (its call cancelled: the emulator sees every call end) or waiting for room in its full queue."""
    bq.insert(TABLE, [example(n, NOW - 2 * HOUR) for n in range(10, 2500)], at=NOW - 2 * HOUR)
    bq.storage.batch_rows = 10
    bq.storage.hold = threading.Event() if held else None
    rows = data.rows(snap(), field=FIELD)
    assert next(rows)["response"] == "0"
    assert wait_for(lambda: len(bq.storage.reads) == data.STREAMS) and reader_threads()
    rows.close()
    assert reader_threads() == []
    if held:
        assert wait_for(lambda: all(r.ended is not None for r in bq.storage.reads))
        assert all(r.responses == 1 for r in bq.storage.reads)


def test_only_the_emulators_own_token_goes_to_the_storage_emulator(bq, monkeypatch):
    """Over the emulator's plaintext channel the read client sends the emulators' static token, and never a token of
    Google credentials: without the static token it sends none (as every gRPC emulator is reached)."""
    from google.oauth2.credentials import Credentials

    real = Credentials(token="ya29.a-real-looking-google-token")  # a made-up value
    request = {"parent": f"projects/{PROJECT}", "read_session": {"table": data._table_path(TABLE)}}
    request["read_session"]["data_format"] = "ARROW"
    data.read_client(real).create_read_session(**request)
    assert bq.storage.authorizations[-1] == f"Bearer {TOKEN}"
    monkeypatch.delenv(EMULATOR_TOKEN_ENV)
    bq.token = ""  # an emulator that lets anyone in, so the call goes through and shows what it carried
    data.read_client(real).create_read_session(**request)
    assert bq.storage.authorizations[-1] is None
    assert not any("ya29" in (auth or "") for auth in bq.storage.authorizations)


@pytest.mark.parametrize("kind", ["VIEW", "MATERIALIZED_VIEW"])
def test_a_view_is_refused_naming_the_field_before_any_session(bq, kind):
    """The Storage Read API reads tables only; tables.get's ``type`` tells a view or a materialized view up front,
    refused naming the field (train.dataset, train.eval_dataset) with what to read instead; the emulated service
    refuses a session on one as the real one does."""
    name = f"{PROJECT}.examples.shared"
    bq.create_table(name, SCHEMA, at=NOW - 48 * HOUR, table_type=kind)
    for field in (FIELD, "train.eval_dataset"):
        with pytest.raises(SpecError, match=f"{name} is a {kind}, which the BigQuery Storage Read API does not read"):
            data.snapshot(name, field=field, at=datetime.now(UTC))
    assert raised_field(name) == "train.eval_dataset" and bq.storage.calls == []
    request = {"parent": f"projects/{PROJECT}", "read_session": {"table": data._table_path(name), "data_format": 3}}
    with pytest.raises(Exception, match="non-table entities cannot be read with the storage API"):
        data.read_client(None).create_read_session(**request)


def test_an_external_table_is_refused_for_its_lack_of_time_travel_and_a_table_snapshot_is_read(bq):
    """An external table (BigLake's included, which the Storage Read API reads) has no time travel: refused naming
    that reason, before any session. A table snapshot is read-only and read as a table."""
    name = f"{PROJECT}.examples.outside"
    bq.create_table(name, SCHEMA, at=NOW - 48 * HOUR, table_type="EXTERNAL")
    with pytest.raises(SpecError, match="is an EXTERNAL table: .* no time travel") as raised:
        data.snapshot(name, field=FIELD, at=datetime.now(UTC))
    assert raised.value.field == FIELD and "Storage Read API does not read" not in str(raised.value)
    assert bq.storage.calls == []
    kept = f"{PROJECT}.examples.kept"
    bq.create_table(kept, SCHEMA, at=NOW - 48 * HOUR, table_type="SNAPSHOT")
    bq.insert(kept, [example(n, NOW - 24 * HOUR) for n in range(3)], at=NOW - 47 * HOUR)
    assert [r["response"] for r in read(data.snapshot(kept, field=FIELD, at=datetime.now(UTC)))] == ["0", "1", "2"]


def raised_field(table: str) -> str:
    try:
        data.snapshot(table, field="train.eval_dataset", at=datetime.now(UTC))
    except SpecError as exc:
        assert any("materialise the view into a table" in v for v in exc.valid)
        return exc.field
    return ""


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
    assert any("roles/bigquery.readSessionUser and roles/bigquery.jobUser on the project tpupipe-data" in v
               for v in raised.value.valid)  # fmt: skip
    bq.grant(member, "roles/bigquery.metadataViewer", f"{PROJECT}.examples")
    with pytest.raises(SpecError, match="may not open BigQuery read sessions in project tpupipe-data") as raised:
        snap()  # the schema read, the session refused: no bigquery.readsessions.create where it is billed
    assert "'bigquery.readsessions.create' permission for 'projects/tpupipe-data'" in str(raised.value)
    assert any("roles/bigquery.readSessionUser on the project tpupipe-data" in v for v in raised.value.valid)
    bq.grant(member, "roles/bigquery.readSessionUser", PROJECT)
    with pytest.raises(SpecError, match="may not read .*Permission bigquery.tables.getData denied"):
        snap()
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    assert len(read(snap())) == 10 and bq.jobs == {}


OVERRIDE_ROLE = f"projects/{PROJECT}/roles/timeTravelOverride"  # a custom role: the one permission


def test_a_table_with_row_access_policies_is_read_as_of_a_past_time_with_the_override_alone(bq, monkeypatch):
    """Every read of a run is as of a past time (its snapshot time); on a table that has or had row access policies
    that takes bigquery.rowAccessPolicies.overrideTimeTravelRestrictions: the refusal, in BigQuery's words, names a
    custom role holding that one permission and the TRUE filter, never roles/bigquery.admin, nor the read roles the
    caller already holds; a custom role holding it alone is enough."""
    from tests.emulators import bigquery as emulated

    monkeypatch.setitem(emulated.ROLES, OVERRIDE_ROLE, frozenset({emulated.OVERRIDE_TIME_TRAVEL}))
    member = "serviceAccount:pipeline@tpupipe-data.iam.gserviceaccount.com"
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(member))
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    bq.grant(member, "roles/bigquery.readSessionUser", PROJECT)
    bq.add_row_access_policy(TABLE)
    with pytest.raises(SpecError, match="may not read .* as of a past time") as raised:
        snap(at=datetime.now(UTC) - timedelta(minutes=1))
    assert "is forbidden as it has (or has had) row access policies" in str(raised.value)
    assert raised.value.field == FIELD and "bigquery.rowAccessPolicies.overrideTimeTravelRestrictions" in str(
        raised.value
    )
    assert any("custom role holding only" in v and "FILTER USING (TRUE)" in v for v in raised.value.valid)
    assert not any("admin" in v or "dataViewer" in v for v in raised.value.valid)
    bq.grant(member, OVERRIDE_ROLE, TABLE)
    assert len(read(snap(at=datetime.now(UTC) - timedelta(minutes=1)))) == 10


def test_the_appends_query_on_a_table_with_row_access_policies_is_refused_as_a_row_policy_matter(bq, monkeypatch):
    """APPENDS reads the table's past too: its query's refusal (REST, accessDenied) gets the same row-policy message,
    not the read roles' advice."""
    from tests.emulators import bigquery as emulated

    monkeypatch.setitem(emulated.ROLES, OVERRIDE_ROLE, frozenset({emulated.OVERRIDE_TIME_TRAVEL}))
    champion = snap(at=datetime.now(UTC) - timedelta(minutes=1))
    since = {"table": TABLE, "filter": "", "snapshot_time": champion["snapshot_time"]}
    member = "serviceAccount:pipeline@tpupipe-data.iam.gserviceaccount.com"
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(member))
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    bq.grant(member, "roles/bigquery.user", PROJECT)
    bq.add_row_access_policy(TABLE)
    with pytest.raises(SpecError, match="may not read .* as of a past time") as raised:
        read(snap(since=since))
    assert f"Time travel on table {PROJECT}:examples.dolly is forbidden" in str(raised.value)
    assert any("custom role holding only" in v for v in raised.value.valid) and len(bq.jobs) == 1
    bq.grant(member, OVERRIDE_ROLE, TABLE)
    assert read(snap(since=since)) == []


def tag(email: str) -> str:
    """The first 8 hex digits of the SHA-256 of an e-mail in lower case: what names an identity's results dataset."""
    return hashlib.sha256(email.lower().encode()).hexdigest()[:8]


# the results dataset by default: the caller's own (OWNER's) of the table's location, in the billing project
RESULTS = f"{PROJECT}.tpupipe_results_us_{tag(OWNER)}"
DAY_MS = 24 * 3600 * 1000  # a default table expiration of a day, in milliseconds
ACCOUNT = "pipeline@tpupipe-data.iam.gserviceaccount.com"  # train.bigquery_service_account
MINE = [{"role": "OWNER", "userByEmail": OWNER}]  # a dataset's access list with no one but the caller


def since_then(bq, table: str, rows: list[dict]) -> dict:
    """A champion's snapshot of ``table`` as of a minute ago (what ``since`` names of it), and ``rows`` committed
    just after it: what a read by commit time reads."""
    champion = data.snapshot(table, field=FIELD, at=datetime.now(UTC) - timedelta(minutes=1))
    bq.insert(table, rows, at=datetime.fromisoformat(champion["snapshot_time"]) + timedelta(microseconds=1))
    return {"table": table, "filter": "", "snapshot_time": champion["snapshot_time"]}


def tables_of(bq, dataset: str = RESULTS) -> dict:
    project, name = dataset.rsplit(".", 1)
    return bq.datasets[(project, name)].tables


def client_as(bq, member: str):
    """A BigQuery client of the emulator's acting as ``member``: what that member may read, asked directly."""
    creds = Credentials(token=bq.token_for(member))
    return bigquery.Client(project=PROJECT, credentials=creds, client_options={"api_endpoint": bq.endpoint})


def job_end(bq) -> datetime:
    """The last job's ``statistics.endTime`` (milliseconds since the epoch)."""
    job = list(bq.jobs.values())[-1]
    return datetime.fromtimestamp(int(job.resource["statistics"]["endTime"]) / 1000, UTC)


def test_the_results_datasets_name_is_the_settings_else_one_of_the_tables_location_and_the_identity():
    """One dataset per location and identity: the first 8 hex digits of the SHA-256 of its e-mail, whatever its case;
    a setting is used as it is."""
    assert TrainSpec.bigquery_results_dataset == ""
    person, pipeline = "Alice@Example.com", "pipeline@tpupipe-data.iam.gserviceaccount.com"
    assert data.results_dataset_name("", "US", person) == f"tpupipe_results_us_{tag('alice@example.com')}"
    assert data.results_dataset_name("", "europe-west4", pipeline) == f"tpupipe_results_europe_west4_{tag(pipeline)}"
    assert data.results_dataset_name("", "US", person) != data.results_dataset_name("", "US", pipeline)
    assert data.results_dataset_name("mine", "europe-west4", person) == "mine"
    with pytest.raises(ValueError):
        data.results_dataset_name("", "US")


def test_an_appends_window_over_a_query_responses_cap_is_read_whole_through_a_table_of_its_own(bq):
    """300 rows committed since the champion, far over the emulator's maximum response size (an anonymous result
    that size fails with responseTooLarge: tests/emulators/test_bigquery_emulator.py): the APPENDS query writes them
    to a table of its own in the results dataset (WRITE_EMPTY, a name of its own, its job's id naming it), which gets
    an expiration once written, is read through a read session as of the job's end, and is deleted once read."""
    since = since_then(bq, TABLE, [example(n, NOW - 30 * HOUR) for n in range(100, 400)])
    bq.max_response_bytes = 2_000  # a few rows' worth
    got = snap(since=since)
    assert got["results_dataset"] == RESULTS and "session" not in got
    before = datetime.now(UTC)
    rows = read(got)
    after = datetime.now(UTC)
    assert sorted(int(r["response"]) for r in rows) == list(range(100, 400)) and got["num_rows"] == 300
    (job,) = bq.jobs.values()
    config = job.resource["configuration"]["query"]
    project, dataset, name = got["appends_table"].rsplit(".", 2)
    assert f"{project}.{dataset}" == RESULTS and name.startswith("appends_")
    assert config["destinationTable"] == {"projectId": project, "datasetId": dataset, "tableId": name}
    assert config["writeDisposition"] == "WRITE_EMPTY" and config["createDisposition"] == "CREATE_IF_NEEDED"
    assert got["appends_job"] == job.job_id and job.job_id.startswith(f"tpupipe_{name}_") and not job.error
    request = session(bq).request.read_session
    assert request.table == data._table_path(got["appends_table"])
    assert "table_modifiers" not in request  # read as it is, checked by count
    (patch,) = [body for method, _, body in bq.bodies if method == "tables.patch"]
    expires = datetime.fromtimestamp(int(patch["expirationTime"]) / 1000, UTC)
    assert before - MILLISECOND + data.RESULTS_TABLE_LIFE <= expires <= after + data.RESULTS_TABLE_LIFE
    assert tables_of(bq) == {} and bq.calls[-1] == "tables.delete"


def test_the_results_dataset_is_made_in_the_tables_location_once_and_one_elsewhere_or_never_expiring_refused(bq):
    """A table in EU: a results dataset in US is refused naming train.bigquery_results_dataset, before any job, as
    is one in EU without a default table expiration (a result table of it would outlive a run killed before its own
    expiration is set); the default one, the caller's own of EU, absent, is created in EU with its default table
    expiration, the shortest time travel window and its label, and reused by the next read; one the user made in EU
    with a default table expiration and a closed access list is used as it is."""
    eu = f"{PROJECT}.europe.dolly"
    bq.create_dataset(f"{PROJECT}.europe", location="EU", at=NOW - 48 * HOUR)
    bq.create_table(eu, SCHEMA, at=NOW - 48 * HOUR)
    bq.insert(eu, [example(n, NOW - 24 * HOUR) for n in range(3)], at=NOW - 24 * HOUR)
    since = since_then(bq, eu, [example(7, NOW - HOUR)])
    bq.create_dataset(f"{PROJECT}.us_results", location="US", default_table_expiration_ms=DAY_MS)
    with pytest.raises(SpecError) as raised:
        data.snapshot(eu, field=FIELD, at=datetime.now(UTC), since=since, results_dataset="us_results")
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"the dataset {PROJECT}.us_results, where the APPENDS query" in str(raised.value)
    assert f"is in US, and {eu} in EU" in str(raised.value)
    assert any(
        "train.bigquery_results_dataset=NAME of a dataset of project tpupipe-data in EU" in v
        for v in raised.value.valid
    )
    bq.create_dataset(f"{PROJECT}.forever", location="EU")  # no default table expiration
    with pytest.raises(SpecError) as raised:
        data.snapshot(eu, field=FIELD, at=datetime.now(UTC), since=since, results_dataset="forever")
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"the dataset {PROJECT}.forever, where the APPENDS query" in str(raised.value)
    assert "has no default table expiration" in str(raised.value)
    assert any(f"`bq update --default_table_expiration 86400 {PROJECT}:forever`" in v for v in raised.value.valid)
    assert bq.jobs == {} and "datasets.insert" not in bq.calls
    for _ in range(2):
        got = data.snapshot(eu, field=FIELD, at=datetime.now(UTC), since=since)
        assert [r["response"] for r in read(got)] == ["7"]
    made = bq.datasets[(PROJECT, f"tpupipe_results_eu_{tag(OWNER)}")]
    assert made.location == "EU" and made.labels == {"created-by": "tpupipe"} and made.tables == {}
    assert made.default_expiration_ms == DAY_MS and made.travel_hours == data.RESULTS_TRAVEL_HOURS == 48
    assert bq.calls.count("datasets.insert") == 1 and len(bq.jobs) == 2  # made once, used twice
    bq.create_dataset(f"{PROJECT}.mine", location="EU", default_table_expiration_ms=DAY_MS, access=MINE)
    got = data.snapshot(eu, field=FIELD, at=datetime.now(UTC), since=since, results_dataset="mine")
    rows = data.rows(got, field=FIELD)
    assert next(rows)["response"] == "7"
    assert bq._table_of(got["appends_table"]).expires is not None  # while it is read: its own expiration
    assert list(rows) == [] and tables_of(bq, f"{PROJECT}.mine") == {}
    assert bq.calls.count("datasets.insert") == 1


def test_the_results_dataset_the_run_creates_is_its_identitys_alone(bq, monkeypatch):
    """BigQuery's default access list (a dataset created without one) lets a viewer of the project read its tables;
    the caller's own results dataset is created with its own: the caller (whose address the UserInfo endpoint gives)
    as OWNER and no one else, so a project viewer may not read the result table while the run reads it. Credentials
    whose address cannot be learned have no dataset of their own: the run is refused naming
    train.bigquery_results_dataset, with how to make one and name it, before any job."""
    viewer = "user:viewer@example.com"
    bq.grant(viewer, "roles/viewer", PROJECT)  # a basic role: it runs jobs, and reads what its special group may
    peek = client_as(bq, viewer)
    data.client(PROJECT).create_dataset(bigquery.Dataset(f"{PROJECT}.open"))  # BigQuery's default access list
    bq.create_table(f"{PROJECT}.open.copy", SCHEMA)
    bq.insert(f"{PROJECT}.open.copy", [example(1, NOW)])
    assert [r["response"] for r in peek.query_and_wait(f"SELECT * FROM `{PROJECT}.open.copy`")] == ["1"]
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])
    got = data.snapshot(TABLE, field=FIELD, at=datetime.now(UTC), since=since)
    rows = data.rows(got, field=FIELD)
    assert next(rows)["response"] == "100"  # its result table there, being read
    with pytest.raises(exceptions.Forbidden, match="User does not have permission to query table"):
        peek.query_and_wait(f"SELECT * FROM `{got['appends_table']}`")
    entries = {(e.role, e.entity_type, e.entity_id) for e in data.dataset_access(data.client(PROJECT), RESULTS)}
    assert entries == {("OWNER", "userByEmail", OWNER)}
    assert list(rows) == [] and tables_of(bq) == {}
    monkeypatch.delenv(EMULATOR_TOKEN_URI_ENV)  # no UserInfo endpoint to ask: whose the token is, unknown
    jobs, datasets = len(bq.jobs), set(bq.datasets)
    with pytest.raises(SpecError) as raised:
        data.snapshot(TABLE, field=FIELD, at=datetime.now(UTC), since=since)
    assert raised.value.field == "train.bigquery_results_dataset"
    assert "named after the e-mail of the identity it runs as" in str(raised.value)
    assert "these credentials say no e-mail" in str(raised.value) and "principal identifier" in str(raised.value)
    (make, _) = raised.value.valid
    assert (
        f"`bq mk --dataset --location=US --default_table_expiration 86400 --max_time_travel_hours 48 {PROJECT}:NAME`"
        in make
    )
    assert f"`bq update --source acl.json {PROJECT}:NAME`" in make and "`iamMember` entry" in make
    assert set(bq.datasets) == datasets and len(bq.jobs) == jobs


def test_a_persons_preview_and_the_pipelines_run_each_use_a_results_dataset_of_their_own(bq, monkeypatch):
    """A person previews with `tpupipe data` (as themselves), then the pipeline's service account runs: each creates,
    and alone owns, its own results dataset (named after its e-mail), so the person's preview never shuts the account
    out, and neither reads the other's result tables: the person, a reader of the data and a user of the project, is
    refused the account's table while the account reads it."""
    person, pipeline = "user:alice@example.com", f"serviceAccount:{ACCOUNT}"
    for member in (person, pipeline):
        bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
        bq.grant(member, "roles/bigquery.user", PROJECT)
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(person))
    theirs = snap(since=since)
    assert [r["response"] for r in read(theirs)] == ["100"]
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(pipeline))
    got = snap(since=since)
    rows = data.rows(got, field=FIELD)
    assert next(rows)["response"] == "100"  # the account's result table, being read
    with pytest.raises(exceptions.Forbidden, match="User does not have permission to query table"):
        client_as(bq, person).query_and_wait(f"SELECT * FROM `{got['appends_table']}`")
    assert list(rows) == []
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, TOKEN)
    made = {
        f"{PROJECT}.tpupipe_results_us_{tag('alice@example.com')}": "alice@example.com",
        f"{PROJECT}.tpupipe_results_us_{tag(ACCOUNT)}": ACCOUNT,
    }
    assert [theirs["results_dataset"], got["results_dataset"]] == list(made)
    for dataset, email in made.items():
        entries = {(e.role, e.entity_type, e.entity_id) for e in data.dataset_access(data.client(PROJECT), dataset)}
        assert entries == {("OWNER", "userByEmail", email)}


def test_an_open_results_dataset_is_refused_and_a_shared_or_long_lived_one_warned(bq):
    """A named results dataset whose access list grants the project's viewers or editors (BigQuery's default, as
    `bq mk` makes it), or anyone, is refused naming train.bigquery_results_dataset, with the bq show / bq update
    --source steps, before any job. A domain or a Google group in one's list, another account in an identity's own,
    and a default table expiration over a day, are each a warning line naming them, and the dataset is used."""
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])
    bq.create_dataset(f"{PROJECT}.team", default_table_expiration_ms=DAY_MS)  # BigQuery's default access list
    with pytest.raises(SpecError) as raised:
        snap(since=since, results_dataset="team")
    assert raised.value.field == "train.bigquery_results_dataset"
    assert (
        f"the dataset {PROJECT}.team, where the APPENDS query of the rows committed since the champion writes its "
        "result, grants READER to projectReaders (the viewers of its project), WRITER to projectWriters (the editors "
        "of its project): the training rows its result tables hold would be theirs to read"
    ) in str(raised.value)
    steps = (
        f"`bq show --format=prettyjson {PROJECT}:team > acl.json`, edit its `access` list, then `bq update --source "
        f"acl.json {PROJECT}:team`"
    )
    assert any(steps in hint for hint in raised.value.valid)
    everyone = [*MINE, {"role": "READER", "iamMember": "allUsers"}]
    bq.create_dataset(f"{PROJECT}.public", default_table_expiration_ms=DAY_MS, access=everyone)
    with pytest.raises(SpecError, match="grants READER to allUsers [(]anyone[)]"):
        snap(since=since, results_dataset="public")
    assert bq.jobs == {}
    shared = [*MINE, {"role": "READER", "domain": "example.com"}, {"role": "WRITER", "groupByEmail": "ml@example.com"}]
    bq.create_dataset(f"{PROJECT}.shared", default_table_expiration_ms=7 * DAY_MS, access=shared)
    logs: list[str] = []
    assert [r["response"] for r in read(snap(since=since, results_dataset="shared", log=logs.append))] == ["100"]
    (longer, grants) = logs
    assert longer.startswith(
        f"snapshot: warning: train.bigquery_results_dataset: the dataset {PROJECT}.shared, where the APPENDS query of "
        "the rows committed since the champion writes its result, has a default table expiration of 168 hours, more "
        "than 24: "
    ) and longer.endswith(f"`bq update --default_table_expiration 86400 {PROJECT}:shared`")
    assert (
        "grants READER to domain example.com (everyone signed in with an account of the domain), WRITER to "
        "groupByEmail ml@example.com (the group's members): the training rows its result tables hold are theirs to "
        "read (or write) while they last; unless that is meant, remove them: `bq show --format=prettyjson"
    ) in grants
    another = [*MINE, {"role": "READER", "userByEmail": "bob@example.com"}]
    bq.create_dataset(RESULTS, default_table_expiration_ms=DAY_MS, access=another)
    logs.clear()
    assert [r["response"] for r in read(snap(since=since, log=logs.append))] == ["100"]
    (line,) = logs
    assert f"the dataset {RESULTS}, where the APPENDS query" in line and "grants READER to bob@example.com: " in line


def test_a_named_results_dataset_is_used_as_it_is_and_never_created(bq):
    """A dataset named in train.bigquery_results_dataset is a team's, made in advance: absent, the run is refused
    naming the field, with how to make it (bq mk, then its access list replaced), and creates nothing."""
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])
    with pytest.raises(SpecError) as raised:
        snap(since=since, results_dataset="team_results")
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"the dataset {PROJECT}.team_results, named for the APPENDS query's result tables, does not exist" in (
        str(raised.value)
    )
    (make, default) = raised.value.valid
    assert f"--max_time_travel_hours 48 {PROJECT}:team_results`, then replace the access list" in make
    assert f"`bq update --source acl.json {PROJECT}:team_results`" in make
    assert default.startswith('train.bigquery_results_dataset=""')
    assert "datasets.insert" not in bq.calls and bq.jobs == {}


def test_the_result_table_is_read_as_it_is_and_must_hold_what_the_job_wrote(bq):
    """The result table is read with no snapshot time: one whose creation is stamped after its job's end (its commit
    later in the same millisecond, which nothing documented rules out) is read whole, where a read as of the job's end
    would be refused ("Cannot read before"); a row another writer adds between the job and the read makes the table
    hold more rows than the job wrote (its totalRows): an InfraError naming the table, which is deleted all the
    same."""
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])

    def table(request) -> str:
        _, project, _, dataset, _, name = request.read_session.table.split("/")
        return f"{project}.{dataset}.{name}"

    def committed_later(request) -> None:
        bq._table_of(table(request)).created = int(job_end(bq).timestamp() * 1_000_000) + 500

    bq.storage.before_session = committed_later
    got = snap(since=since)
    assert [r["response"] for r in read(got)] == ["100"]
    assert "table_modifiers" not in session(bq).request.read_session
    injected = {"instruction": "Say x.", "response": "x"}  # the result table's columns
    bq.storage.before_session = lambda request: bq.insert(table(request), [injected])
    got = snap(since=since)
    with pytest.raises(InfraError) as raised:
        read(got)
    assert (
        f"the APPENDS query's result table {got['appends_table']} held 2 rows when read, and the job "
        f"{got['appends_job']} wrote 1 (its totalRows)"
    ) in str(raised.value)
    assert tables_of(bq) == {}


def test_a_result_table_read_whole_that_may_not_be_deleted_is_a_warning_and_left_to_expire(bq):
    """A refused tables.delete after every row is read fails nothing: the rows are the run's, the table expires by
    itself, and one warning line says so with BigQuery's words."""
    since = since_then(bq, TABLE, [example(n, NOW - HOUR) for n in (100, 101)])
    got, logs = snap(since=since), []
    rows = data.rows(got, field=FIELD, log=logs.append)
    first = next(rows)  # the query has written its table
    name = got["appends_table"].rsplit(".", 1)[1]
    refusal = (
        f"Access Denied: Table {PROJECT}:{RESULTS.split('.')[1]}.{name}: Permission bigquery.tables.delete denied on "
        f"table {PROJECT}:{RESULTS.split('.')[1]}.{name} (or it may not exist)."
    )
    bq.fail("tables.delete", 403, "accessDenied", refusal)
    assert [r["response"] for r in [first, *rows]] == ["100", "101"]
    (line,) = logs
    assert line.startswith(f"snapshot: warning: train.bigquery_results_dataset: the table {got['appends_table']}, ")
    assert "read whole, was not deleted (" in line and "lacks bigquery.tables.delete" in line and refusal in line
    assert "it expires by itself, at most 6 hours after it was written" in line
    assert bq._table_of(got["appends_table"]).expires is not None


def test_no_results_table_is_left_by_a_read_closed_early_or_failing(bq):
    """Closed after its first row, or failing on a row the formatter cannot take, the read deletes its results
    table (and stops its streams) all the same."""
    since = since_then(bq, TABLE, [example(n, NOW - HOUR) for n in range(100, 150)])
    bq.storage.batch_rows = 5
    got = snap(since=since)
    rows = data.rows(got, field=FIELD)
    assert next(rows)["response"] == "100"
    assert got["appends_table"].rsplit(".", 1)[1] in tables_of(bq)
    rows.close()
    assert tables_of(bq) == {} and reader_threads() == []
    since = since_then(bq, TABLE, [example(200, NOW - HOUR, response="")])
    with pytest.raises(SpecError, match="lacks a column the trainer's formatter needs"):
        read(snap(since=since))
    assert tables_of(bq) == {} and bq.calls.count("tables.delete") == 2


def test_a_results_dataset_the_identity_may_not_write_to_is_refused_naming_the_field_and_permission(bq, monkeypatch):
    """A results dataset someone else made, where the run's identity may only read: the query's refusal to write
    its table there names train.bigquery_results_dataset, the permission and roles/bigquery.dataEditor; granted it,
    the read goes through and its table is gone after it."""
    since = since_then(bq, TABLE, [example(100, NOW - HOUR)])
    bq.create_dataset(f"{PROJECT}.shared_results", default_table_expiration_ms=DAY_MS, access=MINE)
    member = "serviceAccount:pipeline@tpupipe-data.iam.gserviceaccount.com"
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(member))
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    bq.grant(member, "roles/bigquery.user", PROJECT)
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.shared_results")
    at = datetime.now(UTC)
    with pytest.raises(SpecError) as raised:
        read(data.snapshot(TABLE, field=FIELD, at=at, since=since, results_dataset="shared_results"))
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"lacks bigquery.tables.create on the dataset {PROJECT}.shared_results" in str(raised.value)
    assert f"Permission bigquery.tables.create denied on dataset {PROJECT}:shared_results" in str(raised.value)
    assert any(f"roles/bigquery.dataEditor on the dataset {PROJECT}.shared_results" in v for v in raised.value.valid)
    bq.grant(member, "roles/bigquery.dataEditor", f"{PROJECT}.shared_results")
    got = data.snapshot(TABLE, field=FIELD, at=at, since=since, results_dataset="shared_results")
    assert [r["response"] for r in read(got)] == ["100"] and tables_of(bq, f"{PROJECT}.shared_results") == {}
    # a custom role that writes tables there but does not read them: the read session's refusal names the field too
    from tests.emulators import bigquery as emulated

    write_only = f"projects/{PROJECT}/roles/writeOnly"
    held = {"bigquery.datasets.get", *data.RESULTS_PERMISSIONS} - {"bigquery.tables.getData"}
    monkeypatch.setitem(emulated.ROLES, write_only, frozenset(held))
    bq.create_dataset(f"{PROJECT}.write_only", default_table_expiration_ms=DAY_MS, access=MINE)
    bq.grant(member, write_only, f"{PROJECT}.write_only")
    with pytest.raises(SpecError) as raised:
        read(data.snapshot(TABLE, field=FIELD, at=at, since=since, results_dataset="write_only"))
    assert raised.value.field == "train.bigquery_results_dataset"
    assert f"lacks bigquery.tables.getData on the dataset {PROJECT}.write_only" in str(raised.value)
    assert tables_of(bq, f"{PROJECT}.write_only") == {}  # deleted all the same


def test_a_read_session_without_get_data_names_that_permission_not_row_policies(bq, monkeypatch):
    """A custom role may hold bigquery.readsessions.create without bigquery.readsessions.getData: the streams are
    refused, and the refusal names that permission and roles/bigquery.readSessionUser."""
    from tests.emulators import bigquery as emulated

    sessions_only = f"projects/{PROJECT}/roles/sessionsOnly"
    monkeypatch.setitem(emulated.ROLES, sessions_only, frozenset({"bigquery.readsessions.create"}))
    member = "serviceAccount:pipeline@tpupipe-data.iam.gserviceaccount.com"
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, bq.token_for(member))
    bq.grant(member, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    bq.grant(member, sessions_only, PROJECT)
    with pytest.raises(SpecError, match="yet not read their streams") as raised:
        read(snap())
    assert "bigquery.readsessions.getData" in str(raised.value) and "row access" not in str(raised.value)
    assert any("roles/bigquery.readSessionUser on the project" in v for v in raised.value.valid)


def test_no_rows_is_a_spec_error_unless_reading_after_a_time(bq):
    with pytest.raises(SpecError, match="has no rows matching train.dataset_filter 'category=none'") as raised:
        read(snap(filter="category=none"))
    assert raised.value.field == FIELD
    empty = f"{PROJECT}.examples.empty"
    bq.create_table(empty, SCHEMA, at=NOW - HOUR)
    with pytest.raises(SpecError, match="has no rows as of"):
        read(data.snapshot(empty, field=FIELD, at=datetime.now(UTC)))
    after = data.snapshot(
        empty, field=FIELD, at=datetime.now(UTC), time_column="ingested", after="2026-01-01T00:00:00Z"
    )
    assert read(after) == [] and after["num_rows"] == 0


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
        TABLE,
        [example(10, NOW, response=None), example(11, NOW, response=""), example(12, NOW, instruction=None)],
        at=datetime.now(UTC) - MILLISECOND,  # before a snapshot time of whole milliseconds taken at once
    )
    with pytest.raises(SpecError) as raised:
        read(snap())
    assert raised.value.field == FIELD
    assert "row 11 lacks a column the trainer's formatter needs (NULL or empty): response" in str(raised.value)
    assert '{"instruction": "Say 10.", "response": null' in str(raised.value)


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
    bq.clock.offset = timedelta(days=8)  # BigQuery's now: the run's time is past the 7 days' window
    with pytest.raises(SpecError, match="outside the table's time travel window .*Invalid snapshot time") as raised:
        snap()
    assert raised.value.field == FIELD
    bq.clock.offset = timedelta(0)
    with pytest.raises(SpecError, match="Cannot read before"):
        snap(at=datetime.now(UTC) - timedelta(days=3))  # before the table was created


def test_the_session_is_billed_in_the_billing_project(bq):
    got = snap(project="tpupipe-billing")
    assert got["project"] == "tpupipe-billing" and got["session"].startswith("projects/tpupipe-billing/")
    assert len(read(got)) == 10
    assert [s.parent for s in bq.storage.sessions.values()] == ["tpupipe-billing"] and bq.jobs == {}


def run_spec(tmp_path, table: str = TABLE, extra: str = ""):
    """A run that reads ``table`` with ``train.data_since=champion``, judged on a fixed local set."""
    from components.workload import resolve

    (tmp_path / "eval.jsonl").write_text('{"instruction": "Say 99.", "response": "99"}\n')
    return resolve(
        "local-fsdp",
        f"train.dataset=bq://{table} train.dataset_time_column=ingested train.data_since=champion "
        f"train.init_from=champion train.eval_dataset={tmp_path}/eval.jsonl {extra}",
    )


def test_a_runs_snapshot_reads_the_table_as_of_its_time_and_then_what_was_committed_since(bq, tmp_path):
    """The run's snapshot (components.data.snapshot) of a table with ``train.data_since=champion``: the rows as of
    its time; against that manifest, the rows committed since its snapshot time (APPENDS), whatever their time column
    says: a row that arrives late with an old ingestion time is read, where the column's comparison never would;
    nothing committed since is a run that ends after its snapshot; and the next run's window starts where this one's
    ended, so no row is read twice or missed."""
    from components.data import snapshot

    spec, logs = run_spec(tmp_path), []
    first, train, heldout = snapshot.take(spec, datetime.now(UTC), log=logs.append)
    assert first["train"]["table"]["num_rows"] == 10 and len(train) == 10 and len(heldout) == 1
    assert first["max_time"] == (NOW - 24 * HOUR).isoformat().replace("+00:00", "Z")
    pinned = datetime.fromisoformat(first["train"]["table"]["snapshot_time"])
    nothing, train, _ = snapshot.take(spec, datetime.now(UTC), first, "local-fsdp@1", log=logs.append)
    assert nothing["skip"].startswith("no examples since champion local-fsdp@1") and train == []
    assert nothing["train"]["table"]["appended_after"] == first["train"]["table"]["snapshot_time"]
    (job,) = bq.jobs.values()  # the APPENDS query, billed where the run is
    sql = job.resource["configuration"]["query"]["query"]
    assert "FROM APPENDS(TABLE `tpupipe-data.examples.dolly`, @start, @end)" in sql and job.project == PROJECT
    # its result read as a table through the Storage Read API, in a session billed where the run is, not in pages
    destination = job.resource["configuration"]["query"]["destinationTable"]
    result = session(bq)
    assert result.request.read_session.table == data._table_path(
        f"{destination['projectId']}.{destination['datasetId']}.{destination['tableId']}"
    )
    assert result.parent == PROJECT and "table_modifiers" not in result.request.read_session
    waits = [query for method, query, _ in bq.bodies if method == "jobs.getQueryResults"]
    assert waits and all(query.get("maxResults") == "0" for query in waits)  # the job waited for, no rows paged
    bq.insert(TABLE, [example(10, NOW - 30 * HOUR)], at=pinned)  # committed with the champion's snapshot: its own
    late = pinned + timedelta(microseconds=1)
    bq.insert(TABLE, [example(11, NOW - 30 * HOUR), example(12, NOW - HOUR)], at=late)  # one late, one new
    later, train, _ = snapshot.take(spec, datetime.now(UTC), first, "local-fsdp@1", log=logs.append)
    assert sorted(e["instruction"] for e in train) == ["Say 11.", "Say 12."]
    assert later["max_time"] == (NOW - HOUR).isoformat().replace("+00:00", "Z") and later["digest"] != first["digest"]
    again, train, _ = snapshot.take(spec, datetime.now(UTC), later, "local-fsdp@2", log=logs.append)
    assert train == [] and again["skip"]  # the windows chain: what `later` read is not read again
    assert logs == [] or not any("warning" in line for line in logs)


def test_a_table_truncated_and_reloaded_trains_only_on_its_new_row(bq, tmp_path):
    """A reload that truncates the table (or deletes a day and inserts it again) commits every row anew: APPENDS
    returns them all (change history keeps inserts, never deletions), and each is dropped as an example the
    champion's lineage has already seen (its key file), counted; only the one new row is trained on."""
    from components.data import snapshot

    spec = run_spec(tmp_path)
    first, train, _ = snapshot.take(spec, datetime.now(UTC), log=lambda line: None)
    snapshot.lineage(None, train, str(tmp_path / "keys.bin"))
    seen = snapshot.Keys((tmp_path / "keys.bin").read_bytes())
    assert len(seen) == 10
    pinned = datetime.fromisoformat(first["train"]["table"]["snapshot_time"])
    bq.delete(TABLE, lambda row: True, at=pinned + timedelta(microseconds=1))  # the truncate, after the champion's
    reloaded = [example(n, NOW - 24 * HOUR) for n in range(10)] + [example(10, NOW - HOUR)]
    bq.insert(TABLE, reloaded, at=pinned + timedelta(microseconds=2))
    logs: list[str] = []
    later, train, _ = snapshot.take(spec, datetime.now(UTC), first, "m@1", log=logs.append, seen_keys=seen)
    assert later["train"]["table"]["appended_after"] == first["train"]["table"]["snapshot_time"]  # by commit time
    assert [e["instruction"] for e in train] == ["Say 10."]
    assert later["champion_duplicates"] == 10 and later["train"]["num_examples"] == 11
    assert any("10 example(s) the champion's lineage already saw dropped" in line for line in logs)


def test_commit_time_falls_back_to_the_time_column_saying_why(bq, tmp_path):
    """Where APPENDS cannot answer for the window since the champion (another filter; a champion's time past the
    dataset's time travel window; a table recreated since), the run reads the rows past the champion's max_time,
    with one warning line saying why and what a late row costs."""
    from components.data import snapshot

    first, _, _ = snapshot.take(run_spec(tmp_path), datetime.now(UTC), log=lambda line: None)
    logs: list[str] = []
    bq.insert(TABLE, [example(n, NOW - 20 * HOUR) for n in (10, 11)], at=NOW - 2 * HOUR)
    filtered, train, _ = snapshot.take(
        run_spec(tmp_path, extra="train.dataset_filter=category=math"), datetime.now(UTC), first, "m@1", log=logs.append
    )
    assert [e["instruction"] for e in train] == ["Say 11."] and filtered["train"]["table"]["after"] == first["max_time"]
    (line,) = [line for line in logs if "warning" in line]
    assert "new rows by their ingested, not by commit time: the champion read tpupipe-data.examples.dolly with " in line
    assert (
        f"a row committed after the champion's snapshot with ingested not past {first['max_time']} is never read"
        in line
    )

    short = f"{PROJECT}.recent.dolly"  # a dataset whose time travel window is 48 hours
    bq.create_dataset(f"{PROJECT}.recent", max_time_travel_hours=48, at=NOW - 100 * HOUR)
    bq.create_table(short, SCHEMA, at=NOW - 100 * HOUR)
    bq.insert(short, [example(n, NOW - 90 * HOUR) for n in range(3)], at=NOW - 90 * HOUR)
    old, _, _ = snapshot.take(run_spec(tmp_path, short), datetime.now(UTC), log=lambda line: None)
    old["train"]["table"]["snapshot_time"] = (NOW - 60 * HOUR).isoformat().replace("+00:00", "Z")  # a champion then
    bq.insert(short, [example(5, NOW - HOUR)], at=NOW - 2 * HOUR)
    logs.clear()
    expired, train, _ = snapshot.take(run_spec(tmp_path, short), datetime.now(UTC), old, "m@1", log=logs.append)
    assert [e["instruction"] for e in train] == ["Say 5."] and "appended_after" not in expired["train"]["table"]
    assert any("is past the table's time travel window of 48 hours" in line for line in logs), logs

    first["train"]["table"]["snapshot_time"] = (NOW - 3 * HOUR).isoformat().replace("+00:00", "Z")
    bq.drop_table(TABLE)  # replaced by a table of the same name, after the champion's snapshot
    bq.create_table(TABLE, SCHEMA, at=NOW - HOUR)
    bq.insert(TABLE, [example(n, NOW - 24 * HOUR) for n in range(10)] + [example(20, NOW - HOUR)], at=NOW - HOUR)
    logs.clear()
    replaced, train, _ = snapshot.take(run_spec(tmp_path), datetime.now(UTC), first, "m@1", log=logs.append)
    assert [e["instruction"] for e in train] == ["Say 20."]
    assert any("after the champion's snapshot at" in line and "(recreated or replaced)" in line for line in logs)


def test_a_dated_table_is_the_days_table_and_a_missing_one_a_day_without_a_drop(bq):
    """``bq://P.D.events_{date:%Y%m%d}``, a table a day as teams shard them: a run scheduled on a day reads that day's
    table (``{date-1:...}``: the day before's); with ``train.data_since=champion`` a day whose table is not there is a
    run with nothing new, in a dataset that is; without it, or with no such dataset, an error naming train.dataset."""
    from components.data import snapshot
    from components.workload import resolve

    day = (NOW - 24 * HOUR).replace(hour=0, minute=0, second=0, microsecond=0)
    for offset, first in ((0, 100), (1, 200)):
        shard = f"{PROJECT}.examples.events_{day - offset * 24 * HOUR:%Y%m%d}"
        bq.create_table(shard, SCHEMA, at=NOW - 72 * HOUR)
        bq.insert(shard, [example(n, NOW - 71 * HOUR) for n in range(first, first + 20)], at=NOW - 71 * HOUR)
    since = "train.data_since=champion train.init_from=champion train.dataset_time_column=ingested"

    def take(dataset: str, when: datetime, extra: str = "") -> tuple[dict, list]:
        manifest, train, heldout = snapshot.take(resolve("local-fsdp", f"train.dataset={dataset} {extra}"), when)
        return manifest, sorted(int(e["response"]) for e in [*train, *heldout])

    manifest, read = take(f"bq://{PROJECT}.examples.events_{{date:%Y%m%d}}", day + 6 * HOUR)
    assert manifest["train"]["table"]["table"] == f"{PROJECT}.examples.events_{day:%Y%m%d}"
    assert read == list(range(100, 120))
    manifest, read = take(f"bq://{PROJECT}.examples.events_{{date-1:%Y%m%d}}", day + 6 * HOUR)
    assert read == list(range(200, 220))
    tomorrow = day + 30 * HOUR  # no table for it yet
    manifest, read = take(f"bq://{PROJECT}.examples.events_{{date:%Y%m%d}}", tomorrow, since)
    assert manifest["skip"].startswith(f"nothing to read: {PROJECT}.examples.events_{tomorrow:%Y%m%d} does not exist")
    assert read == []
    with pytest.raises(SpecError, match=f"events_{tomorrow:%Y%m%d} does not exist") as raised:
        take(f"bq://{PROJECT}.examples.events_{{date:%Y%m%d}}", tomorrow)
    assert raised.value.field == FIELD
    with pytest.raises(SpecError, match="the dataset tpupipe-data.exmaples, where the dated tables are, does not") as e:
        take(f"bq://{PROJECT}.exmaples.events_{{date:%Y%m%d}}", tomorrow, since)
    assert e.value.field == FIELD
    with pytest.raises(SpecError, match="does not exist"):  # an undated table not there is never a day's absence
        take(f"bq://{PROJECT}.examples.events_19990101", tomorrow, since)


def dated_days(bq) -> tuple[datetime, datetime]:
    """Two days' tables, ``events_DAY1`` and ``events_DAY2`` (yesterday's and the day before's): day 1's 10 rows
    ingested up to its mark, day 2's 20 rows all ingested at or below that mark (a re-export, a table a source
    updates for days, another time zone's clock)."""
    day2 = (NOW - 24 * HOUR).replace(hour=0, minute=0, second=0, microsecond=0)
    day1 = day2 - 24 * HOUR
    mark = day1 + 5 * HOUR
    bq.create_table(f"{PROJECT}.examples.events_{day1:%Y%m%d}", SCHEMA, at=day1)
    bq.insert(
        f"{PROJECT}.examples.events_{day1:%Y%m%d}",
        [example(n, mark - n * HOUR) for n in range(10)],
        at=day1 + 5 * HOUR,
    )
    bq.create_table(f"{PROJECT}.examples.events_{day2:%Y%m%d}", SCHEMA, at=day2)
    bq.insert(
        f"{PROJECT}.examples.events_{day2:%Y%m%d}",
        [example(n, mark - (n % 7) * HOUR) for n in range(100, 120)],
        at=day2 + HOUR,
    )
    return day1, day2


DATED = f"{PROJECT}.examples.events_{{date:%Y%m%d}}"


def test_a_dated_tables_new_day_is_read_whole_and_the_same_table_again_by_commit_time(bq, tmp_path):
    """With ``train.data_since=champion``, the champion's mark (``max_time``) is of the table it read: day 2's table,
    every row of which has a time at or below day 1's mark, is read whole (20 of 20 rows: no APPENDS, no ``after``),
    and its manifest's mark is its own; the same table read again the next run is read by commit time (APPENDS since
    the champion's snapshot), as an undated table is."""
    from components.data import snapshot

    day1, day2 = dated_days(bq)
    spec, logs = run_spec(tmp_path, DATED), []
    first, train, _ = snapshot.take(spec, day1 + 6 * HOUR, log=logs.append)
    assert len(train) == 10 and first["max_time"] == (day1 + 5 * HOUR).isoformat().replace("+00:00", "Z")
    second, train, _ = snapshot.take(spec, day2 + 6 * HOUR, first, "m@1", log=logs.append)
    assert sorted(int(e["response"]) for e in train) == list(range(100, 120))  # 20 of 20
    table = second["train"]["table"]
    assert table["table"] == f"{PROJECT}.examples.events_{day2:%Y%m%d}" and table["num_rows"] == 20
    assert table["after"] is None and "appended_after" not in table and bq.jobs == {}
    assert session(bq).request.read_session.read_options.row_restriction == ""  # no ingestion time past a mark
    said = f"events_{day2:%Y%m%d} is not the table the champion read (bq://{PROJECT}.examples.events_{day1:%Y%m%d})"
    assert said in "\n".join(logs)
    assert second["max_time"] == (day1 + 5 * HOUR).isoformat().replace("+00:00", "Z")  # its own rows' largest

    late = f"{PROJECT}.examples.events_{day2:%Y%m%d}"
    bq.insert(late, [example(150, day1)], at=day2 + 12 * HOUR)  # committed since, with an old ingestion time
    third, train, _ = snapshot.take(spec, day2 + 18 * HOUR, second, "m@2", log=logs.append)
    assert [e["instruction"] for e in train] == ["Say 150."]
    assert third["train"]["table"]["appended_after"] == table["snapshot_time"]
    (job,) = bq.jobs.values()
    assert f"FROM APPENDS(TABLE `{late}`, @start, @end)" in job.resource["configuration"]["query"]["query"]
    assert third["max_time"] == second["max_time"]  # the same table's mark, kept


def test_a_mark_of_another_table_is_never_applied_even_where_appends_cannot_answer(bq, tmp_path):
    """The column mode (``after``) too reads only past the mark of the table it is given: a champion that read day
    1's table and a run of day 2's table with another filter reads day 2's table whole under that filter."""
    from components.data import snapshot

    day1, day2 = dated_days(bq)
    first, _, _ = snapshot.take(run_spec(tmp_path, DATED), day1 + 6 * HOUR, log=lambda line: None)
    filtered = run_spec(tmp_path, DATED, "train.dataset_filter=category=math")
    second, train, _ = snapshot.take(filtered, day2 + 6 * HOUR, first, "m@1", log=lambda line: None)
    assert sorted(int(e["response"]) for e in train) == list(range(101, 120, 2))
    assert second["train"]["table"]["after"] is None


def test_an_empty_table_of_a_new_day_is_a_day_with_nothing_new(bq, tmp_path):
    """Day 2's table there but empty, with a champion of day 1's: nothing new, the run skipped, as a day whose table
    is not there is."""
    from components.data import snapshot

    day2 = (NOW - 24 * HOUR).replace(hour=0, minute=0, second=0, microsecond=0)
    day1 = day2 - 24 * HOUR
    bq.create_table(f"{PROJECT}.examples.events_{day1:%Y%m%d}", SCHEMA, at=day1)
    bq.insert(f"{PROJECT}.examples.events_{day1:%Y%m%d}", [example(1, day1)], at=day1 + HOUR)
    bq.create_table(f"{PROJECT}.examples.events_{day2:%Y%m%d}", SCHEMA, at=day2)
    first, _, _ = snapshot.take(run_spec(tmp_path, DATED), day1 + 6 * HOUR, log=lambda line: None)
    second, train, _ = snapshot.take(run_spec(tmp_path, DATED), day2 + 6 * HOUR, first, "m@1", log=lambda line: None)
    assert second["skip"].startswith("no examples since champion m@1") and train == []


@pytest.mark.parametrize("where", ["CreateReadSession", "the first stream", "a stream after rows", "APPENDS"])
def test_a_not_found_after_the_tables_lookup_is_an_error_never_a_day_without_a_drop(bq, tmp_path, where):
    """Only tables.get's NotFound for the day's table is a day without a drop: a NotFound from the read session, a
    stream (before any row, or after some) or the APPENDS query is an InfraError that names the field and the table,
    never a skipped run, never a half-read manifest."""
    import grpc

    from components.data import snapshot
    from components.spec import InfraError

    day1, day2 = dated_days(bq)
    bq.storage.batch_rows = 5
    spec = run_spec(tmp_path, DATED)
    first, _, _ = snapshot.take(spec, day1 + 6 * HOUR, log=lambda line: None)
    gone = f"Not found: Table {PROJECT}:examples.events_{day2:%Y%m%d}"
    when, champion = day2 + 6 * HOUR, first
    if where == "CreateReadSession":
        bq.storage.faults.append(Fault("CreateReadSession", grpc.StatusCode.NOT_FOUND, gone))
    elif where == "the first stream":
        bq.storage.faults.append(Fault("ReadRows", grpc.StatusCode.NOT_FOUND, "Not found: Stream"))
    elif where == "a stream after rows":
        after_rows = lambda r: r.read_stream.endswith("/streams/1")  # noqa: E731
        bq.storage.faults.append(Fault("ReadRows", grpc.StatusCode.NOT_FOUND, "Not found: Stream", when=after_rows))
    else:  # the same table again: read by APPENDS, whose query finds it gone
        champion, _, _ = snapshot.take(spec, when, first, "m@1", log=lambda line: None)
        when = day2 + 18 * HOUR
        bq.fail("jobs.insert", 404, message=gone)  # Client.query: jobs.insert
    bq.storage.calls.clear()
    bq.storage.reads.clear()
    with pytest.raises(InfraError) as raised:
        snapshot.take(spec, when, champion, "m@1", log=lambda line: None)
    said = str(raised.value)
    assert said.startswith(f"train.dataset: {PROJECT}.examples.events_{day2:%Y%m%d} was there when the run looked")
    assert "a new run reads it again" in said
    if where == "a stream after rows":  # stream 0's five rows were read, in parallel with the others, and then
        assert [r.responses for r in bq.storage.reads if r.stream.endswith("/streams/0")] == [1]  # stream 1 failed


def test_an_access_list_that_authorizes_views_routines_and_datasets_is_read_for_an_account(project_factory):
    """A dataset's access list may authorize a view, a routine or another dataset's views (Dataset.access's ``view``,
    ``routine`` and ``dataset`` entries, each an object where an account's entry has an e-mail, a view's and a
    routine's with no role: https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access):
    none is the account's, none stands for a group of members, and the account's own entry beside them is read."""
    from tests.emulators.project import PROJECT as EMULATED

    project_factory()
    account = f"pipeline@{EMULATED}.iam.gserviceaccount.com"
    elsewhere = {"projectId": "acme-data-1", "datasetId": "curated"}
    entries = [
        bigquery.AccessEntry(None, "view", {**elsewhere, "tableId": "examples_view"}),
        bigquery.AccessEntry(None, "routine", {**elsewhere, "routineId": "clean"}),
        bigquery.AccessEntry("READER", "dataset", {"dataset": elsewhere, "targetTypes": ["VIEWS"]}),
        bigquery.AccessEntry("READER", "userByEmail", account),
    ]
    found = data.account_roles(f"{EMULATED}.sft", EMULATED, account, entries=entries)
    assert found.reading == {"READER"} and found.reading_conditional == {}
    assert found.unread == []  # the projects' IAM policies were read: the roles are the whole answer
