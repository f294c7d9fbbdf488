"""An in-process BigQuery Storage Read API: the ``google.cloud.bigquery.storage.v1.BigQueryRead`` gRPC service
(google/cloud/bigquery/storage/v1/storage.proto) over the tables of a :class:`BigQueryEmulator` (its datasets, row
versions, grants, tokens and clock are this one's too), served in plaintext so that the real
``google.cloud.bigquery_storage_v1.BigQueryReadClient`` talks to it:

- CreateReadSession: a session of ``read_session.table`` (``projects/P/datasets/D/tables/T``) created in, and billed
  to, ``parent`` (``projects/P``: "The request project that owns the session, in the form of
  projects/{project_id}"), each recorded in ``sessions`` with its parent. Its rows are the table's as of
  ``table_modifiers.snapshot_time`` ("The snapshot time of the table. If not set, interpreted as now.",
  google/cloud/bigquery/storage/v1/stream.proto), from the same row versions as the REST emulator's time travel,
  with the same window: a time before the table's creation or its dataset's time travel window is
  ``INVALID_ARGUMENT`` with BigQuery's ``Invalid snapshot time ...`` (the REST emulator's words), one in the
  future too (the emulator's refusal); ``read_options.row_restriction`` ("SQL text filtering statement, similar to a
  WHERE clause in a query") is read by the REST emulator's WHERE parser, its errors ``INVALID_ARGUMENT``;
  ``read_options.selected_fields`` are the columns sent ("Names of the fields in the table that should be read. If
  empty, all fields will be read"), one the table lacks ``INVALID_ARGUMENT``. The rows go to at most
  ``max_stream_count`` streams ("Max initial number of streams. If unset or zero, the server will provide a value of
  streams"; "At least one stream is created with the session", stream.proto's ReadSession.streams), contiguous
  shares of them. ``data_format`` must be ARROW (Avro is not emulated).
- ReadRows: a stream's rows from ``offset``, in Arrow record batches of at most ``batch_rows`` rows: each
  ReadRowsResponse's ``arrow_record_batch.serialized_record_batch`` is an Arrow IPC record batch message, the
  schema's IPC message is the session's ``arrow_schema.serialized_schema`` and the first response's
  (google/cloud/bigquery/storage/v1/arrow.proto; ReadRowsResponse.arrow_schema). The Arrow types are BigQuery's
  (https://cloud.google.com/bigquery/docs/reference/storage#arrow_schema_details): STRING utf8, INT64 int64,
  FLOAT64 float64, BOOL boolean, DATE date32, DATETIME timestamp in microseconds without a time zone, TIMESTAMP in
  microseconds in UTC.

Permissions, as the REST emulator grants them (``BigQueryEmulator.grant``, its ``ROLES``): creating a session needs
``bigquery.readsessions.create`` on the parent project and ``bigquery.tables.getData`` on the table
(https://cloud.google.com/bigquery/docs/reference/storage, "Permissions"); reading a stream
``bigquery.readsessions.getData`` on the session's project. A query's anonymous result table is its job creator's
alone to read ("Access to the temporary table data is restricted to the user or service account that created the
query job": https://cloud.google.com/bigquery/docs/writing-results; the REST emulator's ``readers``); a query's named
destination table, as any table, is read by whoever holds ``bigquery.tables.getData`` on it, its dataset or its
project (its dataset's creator, its OWNER, does). A table past its ``expirationTime`` is not found
(``BigQueryEmulator._sweep``). A refusal is ``PERMISSION_DENIED`` with BigQuery's message (``request failed: the
user does not have 'bigquery.readsessions.create' permission for 'projects/P'``, and the REST API's ``Access Denied:
Table ...`` for the table); an unknown dataset, table or stream ``NOT_FOUND``
(``Not found: Table P:D.T``); a call without the emulator's token, or a member's, ``UNAUTHENTICATED``. The caller's
token comes in the ``authorization`` metadata, as Google's endpoints get it.

What the tests look at besides: ``reads``, each ReadRows call's stream, when it started and ended (the last response
sent, or the call cancelled) and how many responses it sent, so a test sees streams read at once; ``hold``, an Event
that, while unset, keeps every ReadRows after its first response (a slow service, held still while a test looks:
a call cancelled meanwhile ends); ``before_session``, called with each CreateReadSessionRequest before it takes
effect, where a test changes a table as another writer would between its caller's last call and this one.

Faults are injected per method ("CreateReadSession", "ReadRows": a :class:`Fault` added to ``faults``): the next N
matching calls answer a gRPC status before they take effect (a ReadRows before its first response).

Pointing the client here: ``$TPUPIPE_BIGQUERY_STORAGE_EMULATOR_HOST`` (``host:port``) for tpupipe
(components/data/bigquery.py).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pyarrow as pa
from google.cloud.bigquery_storage_v1 import types

from tests.emulators import serve_grpc, take_fault
from tests.emulators.bigquery import (
    OVERRIDE_TIME_TRAVEL,
    BigQueryEmulator,
    BigQueryError,
    Compiled,
    Query,
    _datetime,
    _iso,
    _micros,
    time_travel_forbidden,
)
from tests.emulators.tokens import authorized

SERVICE = "google.cloud.bigquery.storage.v1.BigQueryRead"
PARENT = re.compile(r"projects/(?P<project>[^/]+)")
TABLE = re.compile(r"projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/]+)")
SESSION_HOURS = 6  # a session's expire_time: "Read sessions automatically expire 6 hours after they are created"
# (https://cloud.google.com/bigquery/docs/reference/storage, "Limitations")
ARROW_TYPES = {
    "STRING": pa.string(),
    "INT64": pa.int64(),
    "FLOAT64": pa.float64(),
    "BOOL": pa.bool_(),
    "DATE": pa.date32(),
    "DATETIME": pa.timestamp("us"),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
}


@dataclass
class Session:
    name: str
    parent: str  # the project that owns it and is billed
    table: str  # P.D.T
    member: str | None
    schema: pa.Schema
    streams: dict[str, list[list]] = field(default_factory=dict)  # stream name -> its rows (values in schema order)
    request: Any = None  # the CreateReadSessionRequest


@dataclass
class Read:
    """A ReadRows call: its stream, when it started and ended (``time.monotonic()``; None while it runs), the
    responses it handed to gRPC to send."""

    stream: str
    started: float
    ended: float | None = None
    responses: int = 0


@dataclass
class Fault:
    """The next ``times`` calls of ``method`` whose request matches ``when`` answer ``code`` with ``message``."""

    method: str
    code: grpc.StatusCode
    message: str
    times: int = 1
    when: Callable[[Any], bool] = lambda request: True


class BigQueryStorageEmulator:
    def __init__(self, tables: BigQueryEmulator, batch_rows: int = 1000):
        self.tables = tables
        self.batch_rows = batch_rows
        self.sessions: dict[str, Session] = {}
        self.calls: list[str] = []
        self.authorizations: list[str | None] = []  # each call's ``authorization`` metadata, as it came (None: none)
        self.faults: list[Fault] = []
        self.reads: list[Read] = []
        self.hold: threading.Event | None = None
        self.before_session: Callable[[Any], None] | None = None
        self._server = None
        self.address = ""

    def start(self) -> str:
        methods = {
            "CreateReadSession": (
                types.CreateReadSessionRequest.deserialize,
                types.ReadSession.serialize,
                self._create_read_session,
            ),
            "ReadRows": (types.ReadRowsRequest.deserialize, types.ReadRowsResponse.serialize, self._read_rows),
        }
        self._server, self.address = serve_grpc({SERVICE: methods}, streaming=frozenset({"ReadRows"}))
        return self.address

    def stop(self) -> None:
        if self._server:
            self._server.stop(grace=None)

    def _fault(self, method: str, request, context) -> None:
        fault = take_fault(self.faults, self.tables._lock, method, request)
        if fault is not None:
            context.abort(fault.code, fault.message)

    # ------------------------------------------------------------------ gRPC
    def _member(self, context) -> str | None:
        auth = dict(context.invocation_metadata()).get("authorization")
        tables = self.tables
        with tables._lock:
            self.authorizations.append(auth)
        member = tables._identities.get((auth or "").removeprefix("Bearer "))
        if member is None and tables.token and not authorized(tables.token, auth):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "Request had invalid authentication credentials.")
        return member

    def _create_read_session(self, request, context):
        member = self._member(context)
        self._fault("CreateReadSession", request, context)
        if self.before_session is not None:
            self.before_session(request)
        with self.tables._lock:
            self.calls.append("CreateReadSession")
            self.tables._sweep()  # a table past its expirationTime is gone, as from the REST API
            try:
                return self._session(request, member)
            except BigQueryError as error:  # the REST emulator's refusals, as gRPC codes
                code = {
                    400: grpc.StatusCode.INVALID_ARGUMENT,
                    403: grpc.StatusCode.PERMISSION_DENIED,
                    404: grpc.StatusCode.NOT_FOUND,
                }.get(error.status, grpc.StatusCode.INTERNAL)
                context.abort(code, error.message)

    def _session(self, request, member: str | None):
        tables = self.tables
        parent = PARENT.fullmatch(request.parent)
        path = TABLE.fullmatch(request.read_session.table)
        if not parent or not path:
            raise BigQueryError(400, f"Invalid parent {request.parent!r} or table {request.read_session.table!r}")
        billing = parent["project"]
        project, dataset, name = path["project"], path["dataset"], path["table"]
        table_name = f"{project}:{dataset}.{name}"
        if not tables._allowed(member, "bigquery.readsessions.create", billing):
            raise BigQueryError(
                403,
                f"request failed: the user does not have 'bigquery.readsessions.create' permission for "
                f"'projects/{billing}'",
            )
        found = tables.datasets.get((project, dataset))
        mine = found is not None and member in getattr(found.tables.get(name), "readers", ())  # a job's result
        if not mine and not tables._allowed(member, "bigquery.tables.getData", project, dataset, name):
            raise BigQueryError(
                403,
                f"Access Denied: Table {table_name}: Permission bigquery.tables.getData denied on table {table_name} "
                "(or it may not exist).",
            )
        d = tables.datasets.get((project, dataset))
        if d is None:
            raise BigQueryError(404, f"Not found: Dataset {project}:{dataset}")
        t = d.tables.get(name)
        if t is None:
            raise BigQueryError(404, f"Not found: Table {table_name}")
        if t.type not in ("TABLE", "SNAPSHOT"):  # a table snapshot is read as a table (table-snapshots-intro)
            # The Storage Read API reads a table's storage: a view, a materialized view or an external table it
            # refuses ("non-table entities cannot be read with the storage API", the service's refusal as
            # https://github.com/coiled/dask-bigquery/issues/41 quotes it; "Limitations",
            # https://cloud.google.com/bigquery/docs/reference/storage)
            raise BigQueryError(
                400,
                f"request failed: {table_name} is a {t.type}: non-table entities cannot be read with the storage API",
            )
        if request.read_session.data_format != types.DataFormat.ARROW:
            raise BigQueryError(400, "Only the ARROW data format is emulated (tests/emulators/bigquery_storage.py)")
        now = _micros(None, tables.clock)
        modifiers = request.read_session.table_modifiers
        at = now
        if "snapshot_time" in modifiers:
            at = _micros(modifiers.snapshot_time, tables.clock)
            earliest = max(t.created, now - d.travel_hours * 3_600_000_000)
            if at < earliest:
                ms = at // 1000
                raise BigQueryError(
                    400,
                    f"Invalid snapshot time {ms} for table {table_name}@{ms}. Cannot read before {earliest // 1000}.",
                )
            if at > now:
                raise BigQueryError(400, f"snapshot_time {_iso(at)} is in the future (the emulator's refusal)")
            if (
                t.row_policies
                and at < now
                and not tables._allowed(member, OVERRIDE_TIME_TRAVEL, project, dataset, name)
            ):
                raise BigQueryError(403, time_travel_forbidden(table_name))  # the rule's source: OVERRIDE_TIME_TRAVEL's
        options = request.read_session.read_options
        columns = {c["name"].lower(): (i, c["type"]) for i, c in enumerate(t.schema)}
        selected = list(options.selected_fields) or [c["name"] for c in t.schema]
        unknown = [f for f in selected if f.lower() not in columns]
        if unknown:
            raise BigQueryError(400, f"The following selected fields do not exist in the table schema: {unknown}")
        q = Query.restriction(options.row_restriction)
        where = Compiled(q, columns, {}).condition(q.where, "WHERE") if q.where is not None else None
        indexes = [columns[f.lower()][0] for f in selected]
        rows = [
            [v.values[i] for i in indexes]
            for v in t.versions
            if v.visible(at) and (where is None or where(v.values) is True)
        ]
        schema = pa.schema([(t.schema[i]["name"], ARROW_TYPES[t.schema[i]["type"]]) for i in indexes])
        session_name = f"projects/{billing}/locations/{d.location.lower()}/sessions/{uuid.uuid4().hex}"
        count = max(1, min(request.max_stream_count or 1, len(rows)))
        share = -(-len(rows) // count) if rows else 0
        session = Session(session_name, billing, f"{project}.{dataset}.{name}", member, schema, request=request)
        for i in range(count):
            session.streams[f"{session_name}/streams/{i}"] = rows[i * share : (i + 1) * share]
        self.sessions[session_name] = session
        return types.ReadSession(
            name=session_name,
            expire_time=_datetime(now) + timedelta(hours=SESSION_HOURS),
            data_format=types.DataFormat.ARROW,
            arrow_schema=types.ArrowSchema(serialized_schema=schema.serialize().to_pybytes()),
            table=request.read_session.table,
            table_modifiers=types.ReadSession.TableModifiers(snapshot_time=_datetime(at)),
            read_options=options,
            streams=[types.ReadStream(name=stream) for stream in session.streams],
            estimated_row_count=len(rows),
        )

    def _read_rows(self, request, context):
        member = self._member(context)
        self._fault("ReadRows", request, context)
        with self.tables._lock:
            self.calls.append("ReadRows")
            session = self.sessions.get(request.read_stream.rsplit("/streams/", 1)[0])
            stream = session.streams.get(request.read_stream) if session else None
            if session is None or stream is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"Not found: Stream {request.read_stream}")
            assert session is not None and stream is not None
            project = session.parent
            if not self.tables._allowed(member, "bigquery.readsessions.getData", project):
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"request failed: the user does not have 'bigquery.readsessions.getData' permission for "
                    f"'projects/{project}'",
                )
            rows = stream[request.offset :]
        schema = types.ArrowSchema(serialized_schema=session.schema.serialize().to_pybytes())
        read = Read(request.read_stream, time.monotonic())
        with self.tables._lock:
            self.reads.append(read)
        try:
            yield from self._responses(read, rows, session, schema, context)
        finally:
            read.ended = time.monotonic()

    def _responses(self, read: Read, rows: list, session: Session, schema, context):
        first = True
        for start in range(0, max(len(rows), 1), self.batch_rows):
            while not first and self.hold is not None and not self.hold.wait(0.05):
                if not context.is_active():  # cancelled while held
                    return
            chunk = rows[start : start + self.batch_rows]
            arrays = [
                pa.array([_arrow_value(f.type, row[i]) for row in chunk], type=f.type)
                for i, f in enumerate(session.schema)
            ]
            batch = pa.RecordBatch.from_arrays(arrays, schema=session.schema)
            response = types.ReadRowsResponse(
                arrow_record_batch=types.ArrowRecordBatch(
                    serialized_record_batch=batch.serialize().to_pybytes(), row_count=len(chunk)
                ),
                row_count=len(chunk),
            )
            if first:
                response.arrow_schema = schema
                first = False
            read.responses += 1
            yield response


def _arrow_value(kind: pa.DataType, value: Any) -> Any:
    """A value as the REST emulator keeps it (TIMESTAMP as microseconds) as pyarrow takes it for ``kind``."""
    if value is not None and pa.types.is_timestamp(kind) and kind.tz:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value)
    return value


def start_bigquery(monkeypatch, token: str, owner: str, clock: Callable[[], float] = time.time) -> BigQueryEmulator:
    """BigQuery's REST API and its Storage Read API over the same tables (the emulator's ``storage``), and the token
    issuer (its ``issuer``) whose token information names ``owner`` (an e-mail) for the static ``token`` and each
    member for its own token (``BigQueryEmulator.token_for``), all started and pointed at with ``monkeypatch``'s
    environment as components/data/bigquery.py and components/cloud/credentials.py find them; the credentials are the
    static token's. :func:`stop_bigquery` stops them."""
    from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV, EMULATOR_TOKEN_URI_ENV
    from components.data.bigquery import EMULATOR_HOST_ENV as BIGQUERY_HOST_ENV
    from components.data.bigquery import STORAGE_EMULATOR_HOST_ENV
    from tests.emulators.tokens import TokenIssuer

    issuer = TokenIssuer(clock=clock)
    issuer.start()
    issuer.identify(token, owner)
    emulator = BigQueryEmulator(token=token, clock=clock, issuer=issuer)
    emulator.storage = BigQueryStorageEmulator(emulator)  # a test's handle on it
    monkeypatch.setenv(BIGQUERY_HOST_ENV, emulator.start())
    monkeypatch.setenv(STORAGE_EMULATOR_HOST_ENV, emulator.storage.start())
    monkeypatch.setenv(EMULATOR_HOST_ENV, emulator.endpoint)  # credentials(): the emulators' static token
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, token)
    monkeypatch.setenv(EMULATOR_TOKEN_URI_ENV, f"{issuer.endpoint}/token")  # its /userinfo beside it
    return emulator


def stop_bigquery(emulator: BigQueryEmulator) -> None:
    emulator.storage.stop()
    emulator.stop()
    if emulator.issuer is not None:
        emulator.issuer.stop()
