"""The BigQuery Storage Read API emulator (tests/emulators/bigquery_storage.py) through the real
google-cloud-bigquery-storage client: a read session as of a snapshot time over the REST emulator's tables, its
row restriction and selected fields, its streams' Arrow record batches, and the refusals as the service answers them
(NOT_FOUND, PERMISSION_DENIED, INVALID_ARGUMENT, UNAUTHENTICATED)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pyarrow as pa
import pytest
from google.api_core import exceptions
from google.cloud.bigquery_storage_v1 import BigQueryReadClient, types
from google.cloud.bigquery_storage_v1.services.big_query_read.transports import BigQueryReadGrpcTransport
from google.oauth2.credentials import Credentials

from tests.emulators.bigquery import BigQueryEmulator
from tests.emulators.bigquery_storage import BigQueryStorageEmulator

PROJECT, BILLING, TOKEN = "tpupipe-data", "tpupipe-run", "t0ken"
TABLE = f"{PROJECT}.examples.dolly"
PATH = "projects/tpupipe-data/datasets/examples/tables/dolly"
SCHEMA = [("instruction", "STRING"), ("n", "INT64"), ("x", "FLOAT64"), ("ok", "BOOL"), ("day", "DATE"),
          ("local", "DATETIME"), ("ts", "TIMESTAMP")]  # fmt: skip
NOW = datetime.now(UTC)
HOUR = timedelta(hours=1)
MEMBER = "serviceAccount:pipeline@tpupipe-run.iam.gserviceaccount.com"


def _row(n: int) -> dict:
    return {"instruction": f"say {n}", "n": n, "x": n / 2, "ok": n % 2 == 0, "day": datetime(2026, 1, n + 1).date(),
            "local": datetime(2026, 1, 1, n), "ts": NOW - 40 * HOUR}  # fmt: skip


@pytest.fixture
def storage():
    tables = BigQueryEmulator(token=TOKEN)
    tables.start()
    tables.create_table(TABLE, SCHEMA, at=NOW - 48 * HOUR)
    tables.insert(TABLE, [_row(n) for n in range(6)], at=NOW - 40 * HOUR)
    emulator = BigQueryStorageEmulator(tables, batch_rows=2)
    emulator.start()
    yield emulator
    emulator.stop()
    tables.stop()


def reader(storage) -> BigQueryReadClient:
    return BigQueryReadClient(transport=BigQueryReadGrpcTransport(channel=grpc.insecure_channel(storage.address)))


def create(storage, token: str = TOKEN, parent: str = BILLING, table: str = PATH, **options):
    at = options.pop("at", None)
    session = {"table": table, "data_format": types.DataFormat.ARROW, "read_options": options}
    if at is not None:
        session["table_modifiers"] = {"snapshot_time": at}
    return reader(storage).create_read_session(
        parent=f"projects/{parent}", read_session=session, max_stream_count=2,
        metadata=[("authorization", f"Bearer {token}")],
    )  # fmt: skip


def rows(storage, session, token: str = TOKEN) -> list[dict]:
    out = []
    for stream in session.streams:
        read = reader(storage).read_rows(stream.name, metadata=[("authorization", f"Bearer {token}")])
        out += read.to_arrow(session).to_pylist()
    return out


def test_a_session_reads_the_table_as_of_its_snapshot_time_in_arrow_batches(storage):
    at = datetime.now(UTC)
    storage.tables.insert(TABLE, [_row(9)])  # after the snapshot time: not read
    storage.tables.delete(TABLE, lambda r: r["n"] == 0)
    session = create(storage, at=at - timedelta(seconds=1))
    assert session.name.startswith(f"projects/{BILLING}/locations/us/sessions/") and len(session.streams) == 2
    assert session.estimated_row_count == 6 and storage.sessions[session.name].parent == BILLING
    schema = pa.ipc.read_schema(pa.py_buffer(session.arrow_schema.serialized_schema))
    assert [(f.name, str(f.type)) for f in schema] == [
        ("instruction", "string"), ("n", "int64"), ("x", "double"), ("ok", "bool"), ("day", "date32[day]"),
        ("local", "timestamp[us]"), ("ts", "timestamp[us, tz=UTC]"),
    ]  # fmt: skip
    got = rows(storage, session)
    assert [r["n"] for r in got] == [0, 1, 2, 3, 4, 5]
    assert got[1] == {k: v for k, v in _row(1).items()}
    responses = list(
        reader(storage).read_rows(session.streams[0].name, metadata=[("authorization", f"Bearer {TOKEN}")])
    )
    assert [r.row_count for r in responses] == [2, 1] and "arrow_schema" in responses[0]
    assert "arrow_schema" not in responses[1]
    now = create(storage)
    assert [r["n"] for r in rows(storage, now)] == [1, 2, 3, 4, 5, 9]


def test_the_row_restriction_and_the_selected_fields(storage):
    cases = {
        "n = 3": [3],
        "n > 1 AND ok = TRUE": [2, 4],
        'instruction = "say 5"': [5],
        'day = CAST("2026-01-03" AS DATE)': [2],
        "local = CAST('2026-01-01 04:00:00' AS DATETIME)": [4],
        "x = 2.5": [5],
        "": [0, 1, 2, 3, 4, 5],
    }
    for restriction, wanted in cases.items():
        session = create(storage, row_restriction=restriction, selected_fields=["n"])
        got = rows(storage, session)
        assert [r["n"] for r in got] == wanted, restriction
        assert all(list(r) == ["n"] for r in got)
    with pytest.raises(exceptions.InvalidArgument, match="Unrecognized name: nope"):
        create(storage, row_restriction="nope = 1")
    with pytest.raises(exceptions.InvalidArgument, match='Could not cast literal "soon" to type DATE'):
        create(storage, row_restriction="day = CAST('soon' AS DATE)")
    with pytest.raises(exceptions.InvalidArgument, match="do not exist in the table schema"):
        create(storage, selected_fields=["nope"])


def test_refusals_are_the_services(storage):
    with pytest.raises(exceptions.NotFound, match="Not found: Table tpupipe-data:examples.nope"):
        create(storage, table=PATH.replace("dolly", "nope"))
    with pytest.raises(exceptions.NotFound, match="Not found: Dataset tpupipe-data:nope"):
        create(storage, table=PATH.replace("examples", "nope"))
    with pytest.raises(exceptions.InvalidArgument, match="Invalid snapshot time .* Cannot read before"):
        create(storage, at=NOW - 49 * HOUR)  # before the table's creation
    with pytest.raises(exceptions.Unauthenticated):
        create(storage, token="wrong")
    token = storage.tables.token_for(MEMBER)
    with pytest.raises(
        exceptions.PermissionDenied, match="does not have 'bigquery.readsessions.create' permission for 'projects/"
    ):
        create(storage, token=token)
    storage.tables.grant(MEMBER, "roles/bigquery.readSessionUser", BILLING)
    with pytest.raises(exceptions.PermissionDenied, match="Permission bigquery.tables.getData denied on table"):
        create(storage, token=token)
    storage.tables.grant("allAuthenticatedUsers", "roles/bigquery.dataViewer", f"{PROJECT}.examples")  # public
    session = create(storage, token=token)
    assert len(rows(storage, session, token)) == 6 and storage.sessions[session.name].member == MEMBER
    other = storage.tables.token_for("user:someone@example.com")
    with pytest.raises(exceptions.PermissionDenied, match="bigquery.readsessions.getData"):
        rows(storage, session, other)
    with pytest.raises(exceptions.NotFound, match="Not found: Stream"):
        list(reader(storage).read_rows(f"{session.name}/streams/9", metadata=[("authorization", f"Bearer {TOKEN}")]))


def test_a_querys_result_table_is_its_creators_and_a_named_one_its_datasets_readers(storage):
    """A query's anonymous result table is read by the job's creator alone; a named destination table by whoever
    may read its dataset (its creator, who owns the dataset it made, does; a member with no grant there does not),
    as of its job's end time too; a table past its expirationTime is not found."""
    from google.cloud import bigquery

    tables = storage.tables
    bq = bigquery.Client(
        project=BILLING, credentials=Credentials(token=TOKEN), client_options={"api_endpoint": tables.endpoint}
    )
    token = tables.token_for(MEMBER)
    member = bigquery.Client(
        project=BILLING, credentials=Credentials(token=token), client_options={"api_endpoint": tables.endpoint}
    )
    tables.grant(MEMBER, "roles/bigquery.user", BILLING)
    tables.grant(MEMBER, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    sql = f"SELECT n FROM `{TABLE}`"
    anonymous = member.query(sql).destination
    assert len(rows(storage, create(storage, token, table=_path(anonymous)), token)) == 6
    someone = tables.token_for("user:someone@example.com")
    tables.grant("user:someone@example.com", "roles/bigquery.readSessionUser", BILLING)
    with pytest.raises(exceptions.PermissionDenied, match="Permission bigquery.tables.getData denied"):
        create(storage, someone, table=_path(anonymous))
    member.create_dataset(f"{BILLING}.results")
    config = bigquery.QueryJobConfig(destination=f"{BILLING}.results.t")
    job = member.query(sql, job_config=config)
    named, ended = job.destination, job.ended  # its end: whole milliseconds, by which its rows are committed
    assert _path(named) == f"projects/{BILLING}/datasets/results/tables/t"
    assert [r["n"] for r in rows(storage, create(storage, token, table=_path(named)), token)] == list(range(6))
    as_written = create(storage, token, table=_path(named), at=ended)
    assert [r["n"] for r in rows(storage, as_written, token)] == list(range(6))
    with pytest.raises(exceptions.PermissionDenied, match="Permission bigquery.tables.getData denied"):
        create(storage, someone, table=_path(named))
    table = bigquery.Table(f"{BILLING}.results.t")
    table.expires = NOW + HOUR
    bq.update_table(table, ["expires"])
    tables.clock = lambda: (datetime.now(UTC) + 2 * HOUR).timestamp()
    with pytest.raises(exceptions.NotFound, match=f"Not found: Table {BILLING}:results.t"):
        create(storage, token, table=_path(named))


def _path(reference) -> str:
    return f"projects/{reference.project}/datasets/{reference.dataset_id}/tables/{reference.table_id}"
