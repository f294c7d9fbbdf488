"""A BigQuery table as a run's data (``train.dataset=bq://PROJECT.DATASET.TABLE``), pinned in time.

A run reads its table as it was at one moment, never twice as it may have changed: :func:`snapshot` (before anything
is spent) checks the table (tables.get: it exists, its schema) and opens one read session of the BigQuery Storage
Read API (https://cloud.google.com/bigquery/docs/reference/storage) on it as of a time ``at``, and :func:`rows` then
streams that session's rows, and no others, as they come: the session's ``table_modifiers.snapshot_time`` is ``at``
(``TableModifiers``: "The snapshot time of the table. If not set, interpreted as now.", google/cloud/bigquery/storage/
v1/stream.proto), so what was inserted, updated or deleted after ``at`` changes nothing. A snapshot time reaches back
over the dataset's time travel window only (7 days by default: https://cloud.google.com/bigquery/docs/time-travel),
so the rows are read within it. The session is one read of the table: no query, no result table and its size
limit, no second scan; its rows come in Arrow record batches (``data_format`` ARROW: the session's
``arrow_schema.serialized_schema``, each ReadRowsResponse's ``arrow_record_batch.serialized_record_batch``, Arrow IPC
messages: google/cloud/bigquery/storage/v1/arrow.proto), parsed with pyarrow, from its streams
(``ReadSession.streams``, each read with ``ReadRows``: google/cloud/bigquery/storage/v1/storage.proto), read in
parallel and yielded in stream order (:func:`_stream_rows`).

Two optional fields narrow the rows, named after the dataset's field (``field`` ``train.dataset``:
``train.dataset_filter``, ``train.dataset_time_column``):

- ``<field>_filter``: ``COLUMN=VALUE[,COLUMN=VALUE...]``, the values the rows' columns must have; each becomes
  ``COLUMN = LITERAL`` in the session's ``read_options.row_restriction`` ("SQL text filtering statement, similar to a
  WHERE clause in a query", ``TableReadOptions``, stream.proto), the column a quoted name the table's schema has, the
  value a literal of the column's type built here from the parsed value (a string quoted with every quote, backslash
  and control character escaped; a number written by Python; any other type ``CAST('...' AS TYPE)``, the form the
  field's own examples use), so no filter can read another table, call a function or change the statement's shape;
- ``<field>_time_column``: a TIMESTAMP, DATETIME, DATE or INT64 column that grows with each new row (its ingestion
  time): the rows' largest value is recorded as they are read, ``max_time``, and a later snapshot with
  ``after=max_time`` reads only the rows past it (strictly greater: a row that arrives later with a time not past
  ``max_time`` is never read; docs/recurring.md).

With ``since`` (the champion's snapshot of the same table with the same filter, ``train.data_since=champion``) the
new rows are those *committed* after the champion's snapshot time, whatever their time column says: BigQuery's
change history, ``APPENDS(TABLE t, start, end)`` (https://cloud.google.com/bigquery/docs/change-history,
https://cloud.google.com/bigquery/docs/reference/standard-sql/time-series-functions#appends), read by one query job
whose result table is read through a read session (no result pages: :func:`_appended`). That table is a named one
in a dataset the run owns, never the query's anonymous result table, which BigQuery caps at its maximum response size
("Maximum response size", https://cloud.google.com/bigquery/quotas#query_jobs; JobConfigurationQuery.allowLargeResults:
"For GoogleSQL queries, this flag is ignored and large results are always allowed. However, you must still set
destinationTable when result size exceeds the allowed maximum response size",
https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery; beyond it the error
``responseTooLarge``, https://cloud.google.com/bigquery/docs/error-messages), so a window of any size is read whole (a
table truncated and reloaded, a large backfill), and under the domain-restricted sharing organization policy too,
where no query result goes to a temporary table (same page). The results dataset, in the project the query is billed
in, is the one ``train.bigquery_results_dataset`` names (``RESULTS_FIELD``), a team's, made in advance and used as it
is (absent, a SpecError naming the field says how to make it); else the run identity's own, one per location and
identity, ``tpupipe_results_<location>_<the first 8 hex digits of the SHA-256 of the identity's e-mail>``
(:func:`results_dataset_name`; the e-mail, ``caller_email``, that of the identity the read runs as), so each
identity (a person previewing with `tpupipe data`, the pipeline's service account) reads and writes a dataset of
its own: none holds another's rows, and none made by one identity's run shuts out another's. An identity with no
e-mail (a federated principal that impersonates no service account) has none: a SpecError naming the field says to
name a dataset made in advance. It is looked up (datasets.get) before the query and refused (a SpecError naming the
field, before any query) when it is in another location than the table ("When you write query results to a
permanent table, the tables you're querying must be in the same location as the dataset that contains the
destination table": https://cloud.google.com/bigquery/docs/writing-results), when it has no default table
expiration (a result table would outlive a run killed before its own expiration is set: tables.patch is a call of
its own, and ``destinationTableProperties.expirationTime`` is "Internal use only", JobConfigurationQuery), and when
its access list lets others than named identities read or write its tables (the project's viewers or editors, as
BigQuery's default list does, anyone signed in, anyone: :func:`open_access`), the advice the ``bq show``/``bq update
--source`` steps that replace it (``ACCESS_DOCS``); a domain or a Google group in its list (a team may share on
purpose), any other entry than its identity in an identity's own, and a default table expiration longer than
``RESULTS_DEFAULT_EXPIRATION`` are each a warning line. The identity's own, absent, is created (datasets.insert,
``Client.create_dataset``) in the table's location with a default table expiration of ``RESULTS_DEFAULT_EXPIRATION``,
the shortest time travel window, ``RESULTS_TRAVEL_HOURS``, the label ``RESULTS_LABELS`` and an access list of one
entry, the identity as OWNER (:func:`results_access`), never BigQuery's default, which would let every viewer of the
project read the training rows and every editor write them, where an anonymous result was its query's creator's
alone (the comment above ``OPEN_GROUPS``). Each read writes its own table there, ``appends_<hex>`` (its job's id
starts ``tpupipe_appends_<hex>_``), with ``WRITE_EMPTY`` on that fresh name
(https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery, ``writeDisposition``), recorded
in ``snap["appends_table"]``; once written it gets an ``expirationTime`` ``RESULTS_TABLE_LIFE`` ahead (tables.patch,
``Client.update_table``: "If not present, the table will persist indefinitely. Expired tables will be deleted and
their storage reclaimed", https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table.FIELDS.expiration_time),
is read as it then is (no snapshot time: :func:`_appended` says why) and counted against the rows the job wrote (an
InfraError otherwise), and is deleted (tables.delete, ``Client.delete_table``) as soon as its rows are read or
their reader stops early or fails; a delete refused after a whole read is a warning line, the table left to expire.
A deleted or expired table is not gone at once: it can be restored for its dataset's time travel window and is kept
7 days more in fail-safe storage (https://cloud.google.com/bigquery/docs/time-travel). What that costs besides the
query: the table's storage ("If you write query results to a new table, you are charged for storing the data":
writing-results; https://cloud.google.com/bigquery/pricing#storage) while it lives, and under physical storage
billing for its time travel and fail-safe days too (time-travel); no second scan (the read session reads the table
the query wrote).
Its window is ``start`` inclusive ("the earliest time at which a change is included") and ``end`` exclusive (the
latest time at which a change is included, exclusive), while a snapshot as of ``t`` holds what was committed at ``t``
too: a run reads ``[champion's time + 1 µs, its own time + 1 µs)`` (BigQuery's timestamps count microseconds), so
one run's window starts where its champion's snapshot ended, neither overlapping nor leaving a gap. Where APPENDS
cannot answer for the window, the run takes the column mode (``after``) with one warning line saying why and what a
late row costs there: the champion read another table or filter; its time is past the dataset's time travel window
(``maxTimeTravelHours``: "An error is returned if the time specified is earlier than allowed by time travel"); the
table was created after it (recreated or replaced: APPENDS then starts at the new table's creation, "If the table
was created after the start_timestamp value, the actual table creation time is used instead", and would read again
what the champion had). A view or a materialized view is refused before anything is read (a SpecError naming the
field: the Storage Read API reads tables only, ``NOT_READ``): materialise it into a table; so is an external table
(``UNPINNED``: no time travel, so no read of it is pinned to a time); a table snapshot is read as a table.

Bad input is a :class:`SpecError` naming its field: a malformed URI, a table that tables.get does not find (a
``NoDrop``: with a dated table and ``train.data_since``, the caller's day without a drop), no permission to read it,
to open a read session or to run a query, a filter BigQuery refuses, no rows (unless the read is of what is new,
``incremental``, ``after`` or ``since``: then none new is an answer, ``num_rows`` 0), a column the trainer's formatter
needs (``instruction``, ``response``) missing from the table or NULL or empty in some row (named when the row is
read), a time column that is missing or of another type, a results dataset in another location than the table,
without a default table expiration, with an open access list, named yet absent, the caller's own when it has no
e-mail to name it after, or one the caller may not create or whose tables it may not write or read (naming
``train.bigquery_results_dataset``). A NotFound after
tables.get found the table (the read session, a stream, the APPENDS query) is an InfraError: the table went away, or
the session expired, while it was read; so is a result table that holds other rows than its job wrote.

Where it is billed: a read session is created in, and billed to, one project (CreateReadSessionRequest's
``parent``, ``projects/{project_id}``, "The request project that owns the session", storage.proto), where the caller
needs ``bigquery.readsessions.create`` (roles/bigquery.readSessionUser, roles/bigquery.user, roles/bigquery.admin:
https://cloud.google.com/bigquery/docs/reference/storage, "Permissions"; https://cloud.google.com/bigquery/docs/access-control),
and a query is a job created in, and billed to, one project (jobs.insert's ``projectId``: "Project ID of project
that will be billed for the job": https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/insert), where the
caller needs ``bigquery.jobs.create`` (roles/bigquery.jobUser), while reading the table needs
``bigquery.tables.getData`` on it or its dataset (roles/bigquery.dataViewer:
https://cloud.google.com/bigquery/docs/running-queries, "Required roles"). Both go to ``project``
(``train.bigquery_project``, else the run's ``gke.project``), so a table in another project (a data project where
the run's identity only reads, a public dataset such as ``bigquery-public-data``) is read and billed where the run
is; without one, to the table's own project. The results dataset is in that project too: creating it takes
``bigquery.datasets.create`` there (roles/bigquery.user, roles/bigquery.dataEditor, roles/bigquery.admin), and its
creator is its OWNER, alone (its access list names it: :func:`results_access`), which holds what its tables take
("because the bigquery.user role has bigquery.datasets.create permissions, a user assigned to the bigquery.user role
can create tables in any dataset that user creates": writing-results): ``bigquery.tables.create`` and
``bigquery.tables.updateData`` for the query to write one (same page, "Required permissions"),
``bigquery.tables.update`` to set its expiration, ``bigquery.tables.getData`` to read it and
``bigquery.tables.delete`` to delete it (all roles/bigquery.dataEditor's, WRITER in an access list, on a dataset
someone else made: https://cloud.google.com/bigquery/docs/access-control, https://cloud.google.com/bigquery/docs/datasets,
"Required permissions"). A refusal of any of them is a SpecError naming ``train.bigquery_results_dataset`` and the
permission. Project-level BigQuery data roles (roles/bigquery.dataViewer, dataEditor, dataOwner, admin granted on
the project) still reach every dataset of it, this one too: the access list adds to them, never takes away.

The clients: ``google.cloud.bigquery.Client`` (tables.get, datasets.get, the APPENDS query through
``Client.query``, the results dataset's and table's calls) and ``google.cloud.bigquery_storage_v1.BigQueryReadClient``
(the read session), with the Google credentials of ``components.cloud.credentials``, at Google's endpoints, or at
the emulators the tests start: ``$TPUPIPE_BIGQUERY_EMULATOR_HOST`` (``http://host:port``) for the REST API,
``$TPUPIPE_BIGQUERY_STORAGE_EMULATOR_HOST`` (``host:port``, plaintext gRPC: no Google credentials go there, only the
emulators' own static token, in each call's ``authorization`` metadata, as Google's endpoints get a token over TLS).
The client libraries are imported inside the functions.
"""

from __future__ import annotations

import base64
import decimal
import hashlib
import json
import math
import os
import queue
import re
import threading
import unicodedata
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import closing
from datetime import UTC, date, datetime, time, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from components.cloud.credentials import (
    USERINFO_URI,
    access_error,
    caller_email,
    credentials,
    emulator_token,
    google_client,
    named_email,
)
from components.data.drops import NoDrop
from components.data.records import TableSnapshot
from components.spec import InfraError, SpecError
from components.spec.datasets import TABLE_CATEGORIES, row_filter
from components.spec.names import PROJECT_ID_PATTERN
from components.spec.run_spec import TrainSpec

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import bigquery
    from google.cloud.bigquery_storage_v1 import BigQueryReadClient
    from google.cloud.bigquery_storage_v1.types import ReadRowsResponse

EMULATOR_HOST_ENV = "TPUPIPE_BIGQUERY_EMULATOR_HOST"
STORAGE_EMULATOR_HOST_ENV = "TPUPIPE_BIGQUERY_STORAGE_EMULATOR_HOST"
# A read session's initial streams at most (CreateReadSessionRequest.max_stream_count; the service may make fewer),
# read in parallel, a thread each (_stream_rows).
STREAMS = 4
JOIN_S = 10  # how long a closed read waits for each reader thread to end
BATCHES = 2  # decoded record batches a stream's reader thread queues ahead of the rows' consumer, at most
STOP_POLL = 0.1  # seconds between a reader thread's looks at whether to stop, while its queue is full
READER_THREAD = "bigquery ReadRows"  # a stream's reader thread's name, before the stream's index
# A read session's life: "Read sessions automatically expire 6 hours after they are created"
# (https://cloud.google.com/bigquery/docs/reference/storage, "Limitations"); a stream read later is not found.
SESSION_HOURS = 6
# A dataset's time travel window when it sets none: 168 hours (maxTimeTravelHours,
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.max_time_travel_hours)
DEFAULT_TRAVEL_HOURS = 168
TRAVEL_MARGIN = timedelta(hours=1)  # APPENDS' start kept this far inside the window: clocks, and the time to query
RESULTS_FIELD = "train.bigquery_results_dataset"  # the dataset the APPENDS query writes its result tables to
# Its name when the setting is "": this, "_", the table's location in lower case (each run of other characters an
# "_"), "_" and the first IDENTITY_HEX hex digits of the SHA-256 of the run identity's e-mail in lower case
# (tpupipe_results_us_1a2b3c4d): one dataset per location, as a query writes only to a dataset of the location of
# what it reads (https://cloud.google.com/bigquery/docs/writing-results), and per identity, whose alone it is
# (``results_dataset_name``). A dataset name holds letters, digits and underscores only
# (https://cloud.google.com/bigquery/docs/datasets#dataset-naming), which an e-mail is not: hence its hash, a name,
# not a secret.
RESULTS_PREFIX = "tpupipe_results"
IDENTITY_HEX = 8
# A results dataset the run creates: its tables' default life (defaultTableExpirationMs, at least an hour: "The minimum
# lifetime value is 3600000 milliseconds (one hour)",
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.default_table_expiration_ms), and
# the label that says who made it (labels: https://cloud.google.com/bigquery/docs/labels-intro); a dataset whose
# default is longer keeps the rows of a run killed before its table's own expiration that much longer: a warning
RESULTS_DEFAULT_EXPIRATION = timedelta(days=1)
RESULTS_LABELS = {"created-by": "tpupipe"}
# Its time travel window, the shortest there is: "The value can be from 48 to 168 hours (2 to 7 days)"
# (Dataset.maxTimeTravelHours, https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.max_time_travel_hours):
# a deleted or expired table can be restored for that window, and is kept 7 days more in fail-safe storage
# (https://cloud.google.com/bigquery/docs/time-travel), billed under physical storage billing (same page)
RESULTS_TRAVEL_HOURS = 48
# Its access list is one entry, never BigQuery's default, which lets every viewer of the project read its tables and
# every editor write them (Dataset.access: "If unspecified at dataset creation time, BigQuery adds default dataset
# access for ... projectReaders ... READER, projectWriters ... WRITER",
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access; "The roles you specify at
# dataset creation override the defaults": https://cloud.google.com/bigquery/docs/access-control-basic-roles), where
# an anonymous result table was its query's creator's alone ("Access to the temporary table data is restricted to the
# user or service account that created the query job": https://cloud.google.com/bigquery/docs/writing-results): the
# identity it is named after, its creator, as OWNER ("A dataset must have at least one entity with the OWNER role":
# access-control-basic-roles), and no one else: not the project's owners, who "can delete any dataset in the project"
# anyway (same page), nor ``train.bigquery_service_account``, which has a dataset of its own (``results_access``).
# The entries of an access list that let others than named identities read or write a results dataset's tables: the
# project's viewers and editors (BigQuery's default, `bq mk`'s too), anyone signed in, anyone; a results dataset that
# has one is refused (``open_access``)
OPEN_GROUPS = {
    "projectReaders": "the viewers of its project",
    "projectWriters": "the editors of its project",
    "allAuthenticatedUsers": "anyone signed in to a Google account",
    "allUsers": "anyone",
}
# The entries that share a results dataset's tables with a whole domain or a Google group (Dataset.access's
# ``domain``, "Any users signed in with the domain specified will be granted the specified access", and
# ``groupByEmail``), which a team may mean: said in a warning (``shared_access``)
SHARED_ENTITIES = {"domain": "everyone signed in with an account of the domain", "groupByEmail": "the group's members"}
# Replacing a dataset's access list: "bq show --format=prettyjson PROJECT_ID:DATASET > PATH_TO_FILE", edit its
# ``access``, "bq update --source PATH_TO_FILE PROJECT_ID:DATASET"
# (https://cloud.google.com/bigquery/docs/control-access-to-resources-iam, "Grant access to a dataset" and "Revoke
# access to a dataset", bq): ``acl_steps``
ACCESS_DOCS = "https://cloud.google.com/bigquery/docs/control-access-to-resources-iam"
# The roles that create tables in a dataset: its WRITER and OWNER entries (roles/bigquery.dataEditor and dataOwner
# in their legacy names), those roles and roles/bigquery.admin granted on the dataset or its project
# (https://cloud.google.com/bigquery/docs/access-control)
TABLE_CREATE_ROLES = (
    "WRITER", "OWNER", "roles/bigquery.dataEditor", "roles/bigquery.dataOwner", "roles/bigquery.admin",
)  # fmt: skip
# A results table's expirationTime, from when it is written: as long as a read session of it lives (SESSION_HOURS)
RESULTS_TABLE_LIFE = timedelta(hours=SESSION_HOURS)
DATASET_CREATE_PERMISSION = "bigquery.datasets.create"  # on the project a dataset is created in
# What the results tables take on their dataset: the query writes one (create, updateData), the run sets its
# expiration (update), reads it (getData) and deletes it (delete): roles/bigquery.dataEditor's, and its creator's
# (OWNER) (https://cloud.google.com/bigquery/docs/writing-results; https://cloud.google.com/bigquery/docs/access-control)
RESULTS_PERMISSIONS = (
    "bigquery.tables.create", "bigquery.tables.updateData", "bigquery.tables.update", "bigquery.tables.getData",
    "bigquery.tables.delete",
)  # fmt: skip
SCHEME = "bq://"
# What tables.get's ``type`` says of an entity no read session reads: the Storage Read API reads BigQuery storage, and
# a view or a materialized view is none ("Limitations", https://cloud.google.com/bigquery/docs/reference/storage; the
# service's refusal, "non-table entities cannot be read with the storage API", as
# https://github.com/coiled/dask-bigquery/issues/41 quotes it). Table types:
# https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table.FIELDS.type
NOT_READ = ("VIEW", "MATERIALIZED_VIEW")
NOT_READ_SOURCE = "https://cloud.google.com/bigquery/docs/reference/storage, Limitations"
# An external table's rows live outside BigQuery storage: a BigLake table is read by the Storage Read API
# (https://cloud.google.com/bigquery/docs/query-cloud-storage-using-biglake), yet no external table has time travel
# (time travel is of data in BigQuery storage: https://cloud.google.com/bigquery/docs/time-travel), and BigQuery does
# not guarantee its consistency while it is read (https://cloud.google.com/bigquery/docs/external-tables,
# "Limitations"): no read can be pinned to the run's snapshot time, so none is made. A table snapshot (SNAPSHOT) is
# read as a table: "You can query a table snapshot as you would a standard table. Table snapshots are read-only"
# (https://cloud.google.com/bigquery/docs/table-snapshots-intro); it never changes, so every read of it is the same.
UNPINNED = ("EXTERNAL",)
UNPINNED_SOURCE = (
    "https://cloud.google.com/bigquery/docs/time-travel; https://cloud.google.com/bigquery/docs/external-tables"
)
REQUIRED = ("instruction", "response")  # what the trainer's formatter reads of each row (trainers/data.py)
# A project id, or a domain-scoped one ("example.com:project"): https://cloud.google.com/resource-manager/docs/creating-managing-projects
PROJECT = re.compile(rf"(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?{PROJECT_ID_PATTERN}")
# A dataset name: letters, digits and underscores, at most 1,024 (https://cloud.google.com/bigquery/docs/datasets#dataset-naming)
DATASET = re.compile(r"[A-Za-z0-9_]{1,1024}")
TABLE_RULE = "bq://PROJECT.DATASET.TABLE"
# the time column's schema type -> the query parameter type ``after`` is sent as (legacy and GoogleSQL names:
# https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#TableFieldSchema)
TIME_TYPES = {"TIMESTAMP": "TIMESTAMP", "DATETIME": "DATETIME", "DATE": "DATE", "INTEGER": "INT64", "INT64": "INT64"}
TIME_WINDOW = "https://cloud.google.com/bigquery/docs/time-travel"
# The scalar types a filter's value may have, each schema type (tables.get answers the legacy names) with the query
# parameter type it is sent as (GoogleSQL data types: https://cloud.google.com/bigquery/docs/reference/standard-sql/data-types).
PARAMETER_TYPES = {
    "STRING": "STRING",
    "INTEGER": "INT64",
    "INT64": "INT64",
    "FLOAT": "FLOAT64",
    "FLOAT64": "FLOAT64",
    "NUMERIC": "NUMERIC",
    "BIGNUMERIC": "BIGNUMERIC",
    "BOOLEAN": "BOOL",
    "BOOL": "BOOL",
    "DATE": "DATE",
    "DATETIME": "DATETIME",
    "TIMESTAMP": "TIMESTAMP",
}


def parse_table(uri: str, field: str) -> str:
    """``bq://PROJECT.DATASET.TABLE`` -> ``PROJECT.DATASET.TABLE``; a SpecError naming ``field`` unless each part has
    a shape BigQuery allows."""
    path = uri.removeprefix(SCHEME) if uri.startswith(SCHEME) else ""
    parts = path.rsplit(".", 2)  # a domain-scoped project holds dots, a dataset or a table none
    if len(parts) != 3:
        raise SpecError(field, f"{uri!r} is not a BigQuery table URI", [TABLE_RULE])
    project, dataset, table = parts
    if not PROJECT.fullmatch(project):
        raise SpecError(field, f"{project!r} in {uri!r} is not a Google Cloud project id", [TABLE_RULE])
    if not DATASET.fullmatch(dataset):
        raise SpecError(field, f"{dataset!r} in {uri!r} is not a BigQuery dataset name", ["letters, digits and _"])
    bad = [ch for ch in table if not unicodedata.category(ch).startswith(TABLE_CATEGORIES)]
    if not table or bad or len(table.encode()) > 1024:
        raise SpecError(
            field,
            f"{table!r} in {uri!r} is not a BigQuery table name",
            ["at most 1,024 bytes of letters, marks, digits, connectors (_), dashes and spaces"],
        )
    return path


def client(project: str, creds: Credentials | None = None) -> bigquery.Client:
    """A ``bigquery.Client`` whose jobs run (and are billed) in ``project``: at $TPUPIPE_BIGQUERY_EMULATOR_HOST when
    set, else at Google's endpoint, with the Google credentials (``components.cloud.credentials``)."""
    from google.cloud import bigquery

    return google_client(bigquery.Client, EMULATOR_HOST_ENV, creds=creds, project=project)


def read_client(creds: Credentials | None) -> BigQueryReadClient:
    """A ``BigQueryReadClient`` (the Storage Read API): at Google's endpoint with ``creds``, or at
    $TPUPIPE_BIGQUERY_STORAGE_EMULATOR_HOST when set, over a plaintext channel that carries no Google credentials: as
    every gRPC emulator is reached (``google_client``), with the emulators' own static token alone
    (``emulator_token``) in each call's ``authorization`` metadata when there is one, never a token of ``creds``."""
    from google.cloud import bigquery_storage_v1

    if not os.environ.get(STORAGE_EMULATOR_HOST_ENV):
        # google-cloud-bigquery-storage's BigQueryReadClient.__init__ is unannotated (here and below)
        return bigquery_storage_v1.BigQueryReadClient(credentials=creds)  # type: ignore[no-untyped-call]
    token = emulator_token()
    if not token:
        return google_client(
            bigquery_storage_v1.BigQueryReadClient, STORAGE_EMULATOR_HOST_ENV, emulator_transport="grpc"
        )
    import grpc
    from google.cloud.bigquery_storage_v1.services.big_query_read.transports import BigQueryReadGrpcTransport

    class Details(NamedTuple):  # grpc.ClientCallDetails' fields
        method: str
        timeout: float | None
        metadata: Any
        credentials: Any
        wait_for_ready: Any
        compression: Any

    # grpc ships no type information: its interceptor classes are Any here
    class Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
        def _with_token(self, details: Any) -> Details:
            metadata = [*(details.metadata or ()), ("authorization", f"Bearer {token}")]
            return Details(
                details.method, details.timeout, metadata, details.credentials, details.wait_for_ready,
                getattr(details, "compression", None),
            )  # fmt: skip

        def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._with_token(details), request)

        def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
            return continuation(self._with_token(details), request)

    channel = grpc.intercept_channel(grpc.insecure_channel(os.environ[STORAGE_EMULATOR_HOST_ENV]), Bearer())
    transport = BigQueryReadGrpcTransport(channel=channel)
    return bigquery_storage_v1.BigQueryReadClient(transport=transport)  # type: ignore[no-untyped-call]


def snapshot(
    table: str,
    *,
    field: str,
    at: datetime,
    filter: str = "",
    time_column: str = "",
    after: str | None = None,
    since: TableSnapshot | None = None,
    incremental: bool = False,
    required: tuple[str, ...] = REQUIRED,
    project: str = "",
    results_dataset: str = TrainSpec.bigquery_results_dataset,
    log: Callable[[str], None] = print,
) -> TableSnapshot:
    """The table (``PROJECT.DATASET.TABLE``) as of ``at`` (time-zone aware, not in the future), checked, with its
    read: a JSON-able dict that :func:`rows` reads, ``{"table", "project" (where the session and the queries are
    billed: ``project``, else the table's), "snapshot_time" (``at`` in UTC, ISO 8601 with ``Z``), "num_rows" (counted
    as :func:`rows` reads them), "fields" (the schema's column names), "filter", "filter_types", "time_column",
    "time_type", "after", "max_time" (the largest ``time_column`` among the rows read, as text; None when there are
    none or no time column), "incremental", "session", "streams"}``; with ``since`` and APPENDS possible (the
    module's docstring), ``"appended_after"`` (the champion's snapshot time) and ``"results_dataset"`` (``PROJECT.``
    and ``results_dataset``, or when it is "" the caller's own, whose name :func:`results_dataset_name` derives from
    the table's location and the caller's e-mail, in the billing project, where the query writes its result:
    :func:`_results_dataset`) instead of a session. Makes two calls (tables.get, CreateReadSession), or for APPENDS
    three or four (tables.get, datasets.get of the table's dataset, datasets.get of the results dataset,
    datasets.insert when the caller's own is absent, after asking whose the credentials are), and :func:`rows` the
    query.
    ``after`` (a ``max_time`` of an earlier snapshot) reads only the rows past it. ``incremental`` (implied by
    ``after`` and ``since``): the read is of what is new since a champion (``train.data_since``), so no rows is an
    answer, not an error. A table that tables.get does not find is a :class:`~components.data.drops.NoDrop` (a dated
    table's day may have none); a NotFound after that lookup is an InfraError (:func:`_refusal`)."""
    from google.api_core import exceptions as gexc

    if at.tzinfo is None:
        raise ValueError(f"snapshot time {at!r} has no time zone")
    # Time travel counts milliseconds (a time decorator is "milliseconds since the epoch":
    # https://cloud.google.com/bigquery/docs/table-decorators#time_decorators; the service's refusal names a snapshot
    # time in them, "Invalid snapshot time 1700000000000"): a snapshot time of whole milliseconds is read as it is
    # written, so the next run's APPENDS, from it + 1 µs, leaves no sub-millisecond gap.
    at = at.replace(microsecond=at.microsecond // 1000 * 1000)
    filter_field, time_field = f"{field}_filter", f"{field}_time_column"
    pairs = row_filter(filter, filter_field)
    if after is not None and not time_column:
        raise SpecError(time_field, f"reading only the rows after {after!r} needs the column they are ordered by")
    billing = project or table.rsplit(".", 2)[0]
    creds = credentials()
    bq = client(billing, creds)
    try:
        found = bq.get_table(table)
    except gexc.NotFound as exc:  # the lookup of the table itself, before anything is read: no such table (yet)
        said = _said(exc)
        raise NoDrop(field, f"{table} does not exist or is not visible to the caller: {said}", [TABLE_RULE]) from None
    except _failures() as exc:
        raise _refusal(exc, field, table, billing, creds, filter_field, filter) from None
    if found.table_type in UNPINNED:
        raise SpecError(
            field,
            f"{table} is an {found.table_type} table: its rows live outside BigQuery storage, with no time travel, so "
            f"no read of it can be pinned to the run's snapshot time ({UNPINNED_SOURCE}): name a table",
            ["load it into a table (a load job or a scheduled query that writes it, e.g. daily) and read that table",
             "bq://PROJECT.DATASET.TABLE of a regular table or a table snapshot"],
        )  # fmt: skip
    if found.table_type in NOT_READ:
        raise SpecError(
            field,
            f"{table} is a {found.table_type}, which the BigQuery Storage Read API does not read (it reads a table's "
            f"storage: {NOT_READ_SOURCE}): name a table",
            ["materialise the view into a table (a scheduled query that writes it, e.g. daily) and read that table",
             "bq://PROJECT.DATASET.TABLE of a regular table"],
        )  # fmt: skip
    schema = {f.name: f.field_type for f in found.schema}
    missing = [name for name in required if name not in schema]
    if missing:
        raise SpecError(
            field,
            f"{table} has no column {', '.join(missing)}, which the trainer's formatter needs; it has "
            f"{', '.join(schema) or 'none'}",
        )
    wrong = [f"{name} is {schema[name]}" for name in required if schema[name] != "STRING"]
    if wrong:
        raise SpecError(field, f"{table}: {', '.join(wrong)}; the formatter's columns must be STRING")
    unknown = [column for column, _ in pairs if column not in schema]
    if unknown:
        raise SpecError(filter_field, f"{table} has no column {', '.join(unknown)}; it has {', '.join(schema)}")
    for column, value in pairs:
        _typed(schema[column], value, filter_field, column)  # a value its column cannot hold: named here
    time_type = ""
    if time_column:
        if time_column not in schema:
            raise SpecError(time_field, f"{table} has no column {time_column!r}; it has {', '.join(schema)}")
        time_type = TIME_TYPES.get(schema[time_column], "")
        if not time_type:
            raise SpecError(
                time_field,
                f"{time_column} is {schema[time_column]}: an ingestion time is TIMESTAMP, DATETIME, DATE or INT64",
            )
    snap: TableSnapshot = {
        "table": table,
        "project": billing,
        "snapshot_time": _stamp(at),
        "num_rows": 0,
        "fields": list(schema),
        "filter": filter,
        "filter_types": {column: schema[column] for column, _ in pairs},
        "time_column": time_column,
        "time_type": time_type,
        "after": after,
        "max_time": None,
        "incremental": incremental or after is not None or since is not None,
    }
    if since is not None:
        refused = _appends_refusal(bq, found, snap, since, creds)
        if not refused:
            results = _results_dataset(bq, billing, results_dataset, found.location or "", table, creds, log)
            snap["after"], snap["appended_after"], snap["results_dataset"] = None, since["snapshot_time"], results
            return snap
        late = f"{time_column} not past {after}" if after else f"an old {time_column}"
        log(
            f"snapshot: warning: {field}: new rows by their {time_column}, not by commit time: {refused}; a row "
            f"committed after the champion's snapshot with {late} is never read"
        )
    selected = list(dict.fromkeys([*required, *([time_column] if time_column else [])]))
    reader = read_client(creds)
    try:
        session = reader.create_read_session(
            parent=f"projects/{billing}",
            # proto-plus takes a message as a dict (its marshal), which the client's annotation does not say
            read_session={  # type: ignore[arg-type]
                "table": _table_path(table),
                "data_format": "ARROW",
                "table_modifiers": {"snapshot_time": at},
                "read_options": {"selected_fields": selected, "row_restriction": _restriction(snap, time_field)},
            },
            max_stream_count=STREAMS,
        )
    except _failures() as exc:
        raise _refusal(exc, field, table, billing, creds, filter_field, filter) from None
    snap["session"], snap["streams"] = session.name, [stream.name for stream in session.streams]
    # the session's Arrow schema (ReadSession.arrow_schema), which each stream's batches are read with: a
    # ReadRowsResponse carries it only "in the first ReadRowsResponse" of a stream, if at all (storage.proto)
    snap["arrow_schema"] = base64.b64encode(session.arrow_schema.serialized_schema).decode()
    if not snap["streams"] and not snap["incremental"]:  # a session over no rows has no stream to read
        raise SpecError(field, f"{table} has no rows{_matching(snap, field)} as of {snap['snapshot_time']}")
    return snap


def rows(snap: TableSnapshot, *, field: str, log: Callable[[str], None] = print) -> Iterator[dict[str, Any]]:
    """Every row of the snapshot ``snap`` (:func:`snapshot`'s answer), each a dict of JSON-able values (times as ISO
    8601 text, NUMERIC as text, BYTES as base64), streamed as they come: its session's streams in stream order (read
    in parallel: :func:`_stream_rows`), an Arrow record batch at a time, or the APPENDS query's result table's, read
    the same way. Counts them into ``snap["num_rows"]`` and their largest time into ``snap["max_time"]``; a row that
    lacks what the formatter needs, or no rows at all (unless ``incremental``), is a SpecError naming ``field``.
    ``log`` says what is worth a warning (a results table read whole that could not be deleted)."""
    creds = credentials()
    source = _appended(snap, field, creds, log) if snap.get("appended_after") else _streamed(snap, creds)
    try:
        with closing(source):  # its streams stopped, and a results table deleted, however this read ends
            yield from _checked(source, snap, field)
    except _failures() as exc:
        raise _refusal(exc, field, snap["table"], snap["project"], creds, f"{field}_filter", snap["filter"]) from None
    if snap["num_rows"] == 0 and not snap["incremental"]:
        raise SpecError(field, f"{snap['table']} has no rows{_matching(snap, field)} as of {snap['snapshot_time']}")


def _checked(source: Iterator[dict[str, Any]], snap: TableSnapshot, field: str) -> Iterator[dict[str, Any]]:
    """``source``'s rows as JSON-able dicts, each checked for what the formatter needs and counted into ``snap``, the
    largest time column's value kept in ``snap["max_time"]`` once they are all read."""
    largest = None
    for row in source:
        snap["num_rows"] += 1
        lacking = [name for name in REQUIRED if row.get(name) in (None, "")]
        if lacking:
            shown = json.dumps({k: _jsonable(v) for k, v in row.items()}, ensure_ascii=False)
            raise SpecError(
                field,
                f"{snap['table']}{_matching(snap, field)}: row {snap['num_rows']} lacks a column the trainer's "
                f"formatter needs (NULL or empty): {', '.join(lacking)}: {shown[:400]}",
            )
        value = row.get(snap["time_column"]) if snap["time_column"] else None
        if value is not None and (largest is None or value > largest):
            largest = value
        yield {k: _jsonable(v) for k, v in row.items()}
    snap["max_time"] = _text(largest)


def latest(snap: TableSnapshot, other: str | None) -> str | None:
    """The later of ``snap``'s ``max_time`` (once its rows are read) and ``other`` (an earlier snapshot's), by the
    time column's type; None when neither is set."""
    times = [t for t in (snap["max_time"], other) if t is not None]
    if not times or not snap["time_type"]:
        return snap["max_time"] or other
    return max(times, key=lambda t: _typed(snap["time_type"], t, "max_time"))


def _streamed(snap: TableSnapshot, creds: Credentials) -> Generator[dict[str, Any], None, None]:
    """The session's rows in stream order (:func:`_stream_rows`), each record batch read with the session's Arrow
    schema (``arrow_schema``, kept from CreateReadSession's answer: arrow.proto's ArrowSchema)."""
    yield from _stream_rows(read_client(creds), snap["streams"], base64.b64decode(snap["arrow_schema"]))


class RowsCall(Protocol):
    """A stream's ``ReadRows`` call as the client answers it (``ReadRowsStream``, google/cloud/bigquery_storage_v1/
    reader.py: unannotated): its responses as they come, and ``cancel``."""

    def __iter__(self) -> Iterator[ReadRowsResponse]: ...

    def cancel(self) -> None: ...


class RowsReader(Protocol):
    """What the streams' readers use of a ``BigQueryReadClient``: its ``read_rows``, unannotated in
    google/cloud/bigquery_storage_v1/client.py."""

    def read_rows(self, name: str) -> RowsCall: ...


def _stream_rows(reader: RowsReader, streams: list[str], serialized_schema: bytes) -> Iterator[dict[str, Any]]:
    """The rows of a read session's ``streams`` in stream order: every row of the first stream, then every row of
    the second, and so on, whatever order the streams' responses come in. The streams are read in parallel, as the
    Storage Read API means them to be ("Multiple Streams": disjoint sets of rows, for "independent consumer threads
    within a single client", https://cloud.google.com/bigquery/docs/reference/storage, "Key features"): a thread a
    stream (:func:`_read_stream`, with ``reader``, a ``BigQueryReadClient``, whose gRPC channel the calls share),
    each putting the record batches it decodes with the session's schema into its own queue of at most ``BATCHES``,
    while this generator drains the first stream's queue to its end, then the second's. Memory: at most
    ``STREAMS × (BATCHES + 1)`` decoded record batches wait (each queue's ``BATCHES``, and the one its thread holds
    until there is room), besides the one whose rows are being yielded and what gRPC buffers of each call.

    A stream's failure (what ``ReadRows`` raised, as reading the streams one after the other raised it) is raised
    here in its turn, after the rows of the streams before it. When this generator ends, is closed early, or fails,
    it stops every thread (a stop event each looks at between batches, and every ``ReadRows`` call cancelled:
    ``ReadRowsStream.cancel``, google/cloud/bigquery_storage_v1/reader.py at google-cloud-bigquery-storage 2.43.0) and
    joins them (each for at most ``JOIN_S``: one still opening its call ends as soon as it has it)."""
    import pyarrow as pa

    schema = pa.ipc.read_schema(pa.py_buffer(serialized_schema))
    stop = threading.Event()
    calls: list[RowsCall] = []  # each stream's ReadRowsStream, once its thread has opened it
    queues: list[queue.Queue[Any]] = [queue.Queue(maxsize=BATCHES) for _ in streams]
    threads = [
        threading.Thread(
            target=_read_stream, args=(reader, stream, schema, out, stop, calls), name=f"{READER_THREAD} {i}",
            daemon=True,
        )
        for i, (stream, out) in enumerate(zip(streams, queues, strict=True))
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    try:
        for out in queues:
            while (item := out.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield from item.to_pylist()
    finally:
        stop.set()
        for call in list(calls):
            call.cancel()
        for thread in threads:
            # A thread still opening its call (read_rows waits for the stream's first response, retrying an
            # unavailable service) cannot be cancelled yet: it is a daemon, and cancels its call once it has it.
            thread.join(timeout=JOIN_S)


_END = object()  # what a stream's reader thread puts after the stream's last record batch


def _read_stream(
    reader: RowsReader, stream: str, schema: Any, out: queue.Queue[Any], stop: threading.Event, calls: list[RowsCall]
) -> None:
    """A stream's reader thread: ``ReadRows`` of ``stream`` (its ReadRowsStream added to ``calls``, for the consumer
    to cancel), each response's record batch (``arrow_record_batch``) decoded with ``schema`` and put into ``out``
    once there is room, then ``_END``; or, in their place, what the read raised. Once ``stop`` is set it puts nothing
    more and cancels its call."""
    import pyarrow as pa

    item: Any = _END
    try:
        read = reader.read_rows(stream)  # the call, and its first response (google-api-core prefetches it)
        calls.append(read)
        for response in read:
            if stop.is_set():
                read.cancel()
                return
            if not response.row_count:
                continue
            batch = pa.ipc.read_record_batch(pa.py_buffer(response.arrow_record_batch.serialized_record_batch), schema)
            if not _put(out, batch, stop):
                read.cancel()
                return
    except BaseException as exc:  # noqa: BLE001 - raised by the consumer, in the stream's turn (_stream_rows)
        item = exc
    _put(out, item, stop)


def _put(out: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Put ``item`` into ``out`` once it has room, unless ``stop`` is set first: whether it was put."""
    while not stop.is_set():
        try:
            out.put(item, timeout=STOP_POLL)
            return True
        except queue.Full:
            continue
    return False


def _appended(
    snap: TableSnapshot, field: str, creds: Credentials, log: Callable[[str], None]
) -> Generator[dict[str, Any], None, None]:
    """The rows committed in ``[appended_after + 1 µs, snapshot_time + 1 µs)``: APPENDS, in a query job billed in
    the snapshot's project, with its filter as query parameters, its result written to a table of its own in the
    results dataset (``snap["results_dataset"]``: the module's docstring), ``appends_<hex>`` with ``WRITE_EMPTY``,
    recorded in ``snap["appends_table"]`` and the job in ``snap["appends_job"]``. Once the job is done the table gets
    its ``expirationTime`` (tables.patch), and its rows are read through the Storage Read API, as a table, in Arrow
    batches, as google-cloud-bigquery's ``RowIterator.to_arrow_iterable(bqstorage_client=...)`` reads a query's
    result (google/cloud/bigquery/_pandas_helpers.py, ``download_arrow_bqstorage``, at 3.47.0): no
    jobs.getQueryResults pages, none of their per-response size. The session is created in, and billed to, the
    snapshot's project too, and reads the table as it is when the session is made (no ``table_modifiers``: "If not
    set, interpreted as now", stream.proto), checked by count instead of pinned in time: the rows read must be as
    many as the job wrote, its result's ``totalRows`` ("The total number of rows in the complete query result set",
    jobs.getQueryResults' answer, which ``QueryJob.result`` asks for:
    https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/getQueryResults), else an InfraError naming the
    table. No snapshot time is both sure to hold the job's rows and safe to ask for: no Google page says when a query
    job's write is committed against its ``statistics.endTime`` or the table's ``creationTime`` and
    ``lastModifiedTime`` (whole milliseconds each; the last one moves with the tables.patch below too), and a time
    before the table's creation is refused ("Invalid snapshot time ... Cannot read before ...":
    https://cloud.google.com/bigquery/docs/access-historical-data), so a pin on any of them could fail every read
    whose commit fell later in the same millisecond. What the count does not see is a row changed or swapped for
    another between the job and the read, which takes a writer of the dataset: in the run identity's own dataset
    that identity alone, and whoever holds a BigQuery data role on the whole project (the module's docstring). The
    table is deleted (:func:`_drop`) however the read ends: its rows all read, the reader closed early, or a
    failure."""
    from google.cloud import bigquery

    tick = timedelta(microseconds=1)
    start = datetime.fromisoformat(snap["appended_after"]) + tick
    end = datetime.fromisoformat(snap["snapshot_time"]) + tick
    params = [
        bigquery.ScalarQueryParameter("start", "TIMESTAMP", start),
        bigquery.ScalarQueryParameter("end", "TIMESTAMP", end),
    ]
    conditions = []
    filter_field = f"{field}_filter"
    for i, (column, value) in enumerate(row_filter(snap["filter"], filter_field)):
        kind = PARAMETER_TYPES.get(snap["filter_types"][column], snap["filter_types"][column])
        params.append(bigquery.ScalarQueryParameter(f"f{i}", kind, _typed(kind, value, filter_field, column)))
        conditions.append(f"{_quoted(column)} = @f{i}")
    columns = dict.fromkeys([*REQUIRED, *([snap["time_column"]] if snap["time_column"] else [])])
    where = " WHERE " + " AND ".join(conditions) if conditions else ""
    sql = f"SELECT {', '.join(map(_quoted, columns))} FROM APPENDS(TABLE {_quoted(snap['table'])}, @start, @end){where}"
    bq, results = client(snap["project"], creds), snap["results_dataset"]
    unique = uuid.uuid4().hex  # a fresh name each read: WRITE_EMPTY never meets another read's rows
    destination = snap["appends_table"] = f"{results}.appends_{unique}"
    config = bigquery.QueryJobConfig(
        query_parameters=params,
        destination=destination,
        create_disposition=bigquery.CreateDisposition.CREATE_IF_NEEDED,
        write_disposition=bigquery.WriteDisposition.WRITE_EMPTY,
    )
    whole = False
    try:
        try:
            job = bq.query(sql, job_config=config, job_id_prefix=f"tpupipe_appends_{unique}_")
            snap["appends_job"] = job.job_id
            # waits for the job (jobs.getQueryResults with no rows: maxResults 0), raising its error
            written_rows = job.result().total_rows
            written = bigquery.Table(destination)
            written.expires = datetime.now(UTC) + RESULTS_TABLE_LIFE
            bq.update_table(written, ["expires"])
            reader = read_client(creds)
            session = reader.create_read_session(  # the session as a dict, as in snapshot
                parent=f"projects/{snap['project']}",
                read_session={"table": _table_path(destination), "data_format": "ARROW"},  # type: ignore[arg-type]
                max_stream_count=STREAMS,
            )
        except _failures() as exc:
            raise _results_refusal(exc, results, creds) or exc from None
        count = 0
        for row in _stream_rows(reader, [s.name for s in session.streams], session.arrow_schema.serialized_schema):
            count += 1
            yield row
        if count != written_rows:
            raise InfraError(
                f"{field}: the APPENDS query's result table {destination} held {count} rows when read, and the job "
                f"{job.job_id} wrote {written_rows} (its totalRows): another writer of the dataset changed it; nothing "
                "of it is used: a new run reads it again"
            )
        whole = True
    finally:
        _drop(bq, destination, results, creds, whole, log)


def _drop(
    bq: bigquery.Client, table: str, results: str, creds: Credentials, whole: bool, log: Callable[[str], None]
) -> None:
    """Delete the results table ``table`` of the dataset ``results`` (tables.delete, ``Client.delete_table``: one the
    job never wrote is not found, which is no error). A failure leaves the table to its ``expirationTime`` (and its
    dataset's default table expiration, which every results dataset has: :func:`_results_dataset`): after a whole
    read (``whole``) it is a warning line (``log``), the rows being read; a read that failed or was closed early ends
    as it did."""
    try:
        bq.delete_table(table, not_found_ok=True)
    except _failures() as exc:
        if whole:
            refused = _results_refusal(exc, results, creds)
            said = str(refused).removeprefix(f"{RESULTS_FIELD}: ") if refused else _said(exc)
            log(
                f"snapshot: warning: {RESULTS_FIELD}: the table {table}, read whole, was not deleted ({said}): it "
                f"expires by itself, at most {_hours(RESULTS_TABLE_LIFE)} hours after it was written"
            )


def results_dataset_name(setting: str, location: str, identity: str = "") -> str:
    """The results dataset's name (``RESULTS_FIELD``): ``setting`` when it names one; when it is "", the one of
    ``location`` (the table's) and ``identity`` (the e-mail of the identity that reads and writes it, whose alone it
    is): ``RESULTS_PREFIX``, the location in lower case with each run of other characters than letters and digits an
    ``_``, and :func:`identity_tag` of the identity, joined by ``_`` (``tpupipe_results_us_1a2b3c4d``). A ValueError
    for neither a setting nor an identity."""
    if setting:
        return setting
    if not identity:
        raise ValueError("a results dataset's name needs a setting or an identity")
    suffix = re.sub(r"[^a-z0-9]+", "_", location.lower()).strip("_")
    return "_".join(part for part in (RESULTS_PREFIX, suffix, identity_tag(identity)) if part)


def identity_tag(email: str) -> str:
    """The first ``IDENTITY_HEX`` hex digits of the SHA-256 of ``email`` in lower case, so that one address written in
    two cases names one dataset."""
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()[:IDENTITY_HEX]


def results_access(owner: str) -> list[bigquery.AccessEntry]:
    """The access list of an identity's own results dataset (the comment above ``OPEN_GROUPS``): ``owner`` (its
    e-mail) as OWNER, alone; an ``AccessEntry`` of ``userByEmail`` ("An email address of a user to grant access to",
    a service account's too: Dataset.access)."""
    from google.cloud.bigquery import AccessEntry

    return [AccessEntry("OWNER", "userByEmail", owner)]


def open_access(entries: list[bigquery.AccessEntry]) -> list[str]:
    """Of a dataset's access entries (``AccessEntry``), each that lets others than named identities read or write its
    tables (``OPEN_GROUPS``), as ``ROLE to GROUP (who they are)``."""
    return [
        f"{entry.role} to {entry.entity_id} ({OPEN_GROUPS[entry.entity_id]})"
        for entry in entries
        if entry.role and entry.entity_type in ("specialGroup", "iamMember") and entry.entity_id in OPEN_GROUPS
    ]


def shared_access(entries: list[bigquery.AccessEntry], owner: str = "") -> list[str]:
    """Of a dataset's access entries (``AccessEntry``), each that shares its tables with a domain or a Google group
    (``SHARED_ENTITIES``), as ``ROLE to KIND NAME (who they are)``; with ``owner`` (the e-mail of the identity whose
    own dataset it is), also each other account or special group that is not open (:func:`open_access` names those),
    as ``ROLE to NAME``: its own dataset is its alone."""
    shared: list[str] = []
    for entry in entries:
        kind = entry.entity_type
        if not entry.role:
            continue
        if kind in SHARED_ENTITIES:
            shared.append(f"{entry.role} to {kind} {entry.entity_id} ({SHARED_ENTITIES[kind]})")
        elif owner and kind in ("userByEmail", "iamMember", "specialGroup") and entry.entity_id not in OPEN_GROUPS:
            if str(entry.entity_id).split(":", 1)[-1].lower() != owner.lower():
                shared.append(f"{entry.role} to {entry.entity_id}")
    return shared


def acl_steps(dataset: str) -> str:
    """The commands that replace the access list of ``dataset`` (``PROJECT.DATASET``), as ``ACCESS_DOCS`` gives them."""
    return (
        f"`bq show --format=prettyjson {bq_name(dataset)} > acl.json`, edit its `access` list, then `bq update "
        f"--source acl.json {bq_name(dataset)}` ({ACCESS_DOCS})"
    )


def make_steps(dataset: str, location: str, users: str) -> str:
    """The commands that make ``dataset`` (``PROJECT.DATASET``) in ``location`` as a results dataset must be (a default
    table expiration, the shortest time travel window), then give it an access list of its OWNER and ``users``
    alone, in place of the one BigQuery gives a dataset made without one (the comment above ``OPEN_GROUPS``)."""
    where = f" --location={location}" if location else ""
    return (
        f"`bq mk --dataset{where} --default_table_expiration {int(RESULTS_DEFAULT_EXPIRATION.total_seconds())} "
        f"--max_time_travel_hours {RESULTS_TRAVEL_HOURS} {bq_name(dataset)}`, then replace the access list BigQuery "
        f"gives it (the project's viewers READER, its editors WRITER) with its OWNER and {users} alone: "
        + acl_steps(dataset)
    )


def _results_dataset(
    bq: bigquery.Client,
    project: str,
    setting: str,
    location: str,
    table: str,
    creds: Credentials,
    log: Callable[[str], None],
) -> str:
    """The results dataset (``PROJECT.DATASET``) of ``project`` (the jobs') where the APPENDS query of ``table`` (in
    ``location``) writes its result, looked up (datasets.get) before any query: ``setting`` when it names one, a
    team's, made in advance (absent: a SpecError naming ``RESULTS_FIELD`` that says how to make it); else the caller's
    own (:func:`results_dataset_name` of its e-mail, ``caller_email``; none to learn is a SpecError naming the field),
    created when it is absent or not to be seen (one that is there after all, a Conflict, is looked up again):
    datasets.insert (``Client.create_dataset``) in ``location``, with ``RESULTS_LABELS``, a default table expiration
    of ``RESULTS_DEFAULT_EXPIRATION``, a time travel window of ``RESULTS_TRAVEL_HOURS`` and the caller alone in its
    access list (:func:`results_access`). Refused, each a SpecError naming ``RESULTS_FIELD`` before any query: one in
    another location than the table; one with no default table expiration (a table of it would outlive a run killed
    between the query and the table's own expiration); one whose access list is open (:func:`open_access`); a refusal
    (:func:`_results_refusal`). Said in a warning line (``log``): a default table expiration longer than
    ``RESULTS_DEFAULT_EXPIRATION``, and the entries that share its tables (:func:`shared_access`)."""
    from google.api_core import exceptions as gexc

    owner = "" if setting else caller_email(creds)
    if not setting and not owner:
        raise _no_identity(project, location)
    dataset = f"{project}.{results_dataset_name(setting, location, owner)}"
    try:
        try:
            found = bq.get_dataset(dataset)
        except (gexc.NotFound, gexc.Forbidden) as missing:
            if isinstance(missing, gexc.Forbidden) and (setting or not _results_refusal(missing, dataset, creds)):
                raise  # a quota, or a named dataset the caller may not see (_results_refusal's to say)
            if setting:
                raise _absent(dataset, location) from None
            # The caller's own, not found, or not to be seen (no bigquery.datasets.get, which "or it may not exist"
            # leaves open): created, which also tells which (one that is there is a Conflict)
            found = _create_results(bq, dataset, location, owner)
    except _failures() as exc:
        raise _results_refusal(exc, dataset, creds) or exc from None
    what = f"the dataset {dataset}, where the APPENDS query of the rows committed since the champion writes its result,"
    there = found.location or ""
    own = f'{RESULTS_FIELD}="" (the run identity\'s own dataset, which the run makes itself)'
    if location and there.lower() != location.lower():
        project, name = dataset.rsplit(".", 1)
        raise SpecError(
            RESULTS_FIELD,
            f"{what} is in {there}, and {table} in {location}: a query writes to a dataset of the location of the "
            "tables it reads (https://cloud.google.com/bigquery/docs/writing-results)",
            [f"{RESULTS_FIELD}=NAME of a dataset of project {project} in {location}", own],
        )
    seconds = int(RESULTS_DEFAULT_EXPIRATION.total_seconds())
    update = f"`bq update --default_table_expiration {seconds} {bq_name(dataset)}`"
    if not found.default_table_expiration_ms:
        raise SpecError(
            RESULTS_FIELD,
            f"{what} has no default table expiration: a result table gets its own expiration only after the query, "
            "so one written by a run killed in between would keep its training rows for ever",
            [f"a default table expiration on it: {update} (seconds; at least 3600)", own],
        )
    opened = open_access(found.access_entries)
    if opened:
        raise SpecError(
            RESULTS_FIELD,
            f"{what} grants {', '.join(opened)}: the training rows its result tables hold would be theirs to read "
            "(or write) while they last, and for its time travel window after",
            [f"remove those entries: {acl_steps(dataset)}", *([own] if setting else [])],
        )
    hours = int(found.default_table_expiration_ms) // 3_600_000
    if int(found.default_table_expiration_ms) > seconds * 1000:
        log(
            f"snapshot: warning: {RESULTS_FIELD}: {what} has a default table expiration of {hours} hours, more than "
            f"{_hours(RESULTS_DEFAULT_EXPIRATION)}: the table of a run killed before its own expiration is set keeps "
            f"its training rows that long; {update}"
        )
    shared = shared_access(found.access_entries, owner)
    if shared:
        log(
            f"snapshot: warning: {RESULTS_FIELD}: {what} grants {', '.join(shared)}: the training rows its result "
            f"tables hold are theirs to read (or write) while they last; unless that is meant, remove them: "
            + acl_steps(dataset)
        )
    return dataset


def bq_name(dataset: str) -> str:
    """``PROJECT.DATASET`` as the bq tool names it, ``PROJECT:DATASET``."""
    project, name = dataset.rsplit(".", 1)
    return f"{project}:{name}"


def _create_results(bq: bigquery.Client, dataset: str, location: str, owner: str) -> bigquery.Dataset:
    """The identity's own results dataset ``dataset``, created (``_results_dataset``), or the one a Conflict says is
    there (another read of the same identity made it since the lookup), looked up."""
    from google.api_core import exceptions as gexc
    from google.cloud import bigquery

    made = bigquery.Dataset(dataset)
    made.location = location or None
    made.default_table_expiration_ms = int(RESULTS_DEFAULT_EXPIRATION.total_seconds() * 1000)
    made.max_time_travel_hours = RESULTS_TRAVEL_HOURS
    made.labels = dict(RESULTS_LABELS)
    made.access_entries = results_access(owner)
    try:
        return bq.create_dataset(made)
    except gexc.Conflict:
        return bq.get_dataset(dataset)


def _no_identity(project: str, location: str) -> SpecError:
    """The refusal of an identity's own results dataset to a caller whose e-mail cannot be learned."""
    where = f" in {location}" if location else ""
    return SpecError(
        RESULTS_FIELD,
        "the run's own dataset for the APPENDS query's result tables is named after the e-mail of the identity it "
        f"runs as ({RESULTS_PREFIX}_LOCATION_HASH) and lists it alone, yet these credentials say no e-mail, nor does "
        f"the UserInfo endpoint ({USERINFO_URI}): an identity with no Google account behind it (Workload Identity "
        "Federation or workforce identity federation, or GKE Workload Identity, without a service account to "
        "impersonate) has a principal identifier, not an e-mail (https://cloud.google.com/iam/docs/principal-identifiers)",
        [f"a dataset made once in project {project}{where} and named here: "
         + make_steps(f"{project}.NAME", location, "the identity as WRITER (an `iamMember` entry of its principal "
                      "identifier)"),
         "credentials that say whose they are: a service account's (the federated identity impersonating one), or "
         "`gcloud auth application-default login`"],
    )  # fmt: skip


def _absent(dataset: str, location: str) -> SpecError:
    """The refusal of a named results dataset that does not exist."""
    return SpecError(
        RESULTS_FIELD,
        f"the dataset {dataset}, named for the APPENDS query's result tables, does not exist: a named results dataset "
        "is a team's, made in advance with the access list the team means; the run creates only an identity's own (the "
        "setting left empty), so that no one identity's run, a person's `tpupipe data` preview say, makes a dataset "
        "that shuts out another's",
        [f"make it once: {make_steps(dataset, location, 'each identity that runs with it as WRITER')}",
         f'{RESULTS_FIELD}="" (each identity\'s own, which the run creates)'],
    )  # fmt: skip


def refused(exc: Exception) -> bool:
    """Whether ``exc`` is BigQuery's refusal of the caller: PERMISSION_DENIED (the Storage Read API's, gRPC), or 403
    with the reason ``accessDenied`` (the REST API's; another 403 is a quota or a rate limit:
    https://cloud.google.com/bigquery/docs/error-messages)."""
    from google.api_core import exceptions as gexc

    first = next((e for e in getattr(exc, "errors", None) or [] if isinstance(e, dict)), {})
    return isinstance(exc, gexc.PermissionDenied) or (
        isinstance(exc, gexc.Forbidden) and first.get("reason") == "accessDenied"
    )


def _results_refusal(exc: Exception, dataset: str, creds: Credentials | None) -> SpecError | None:
    """A SpecError naming ``RESULTS_FIELD`` for ``exc``, a refusal about the results dataset ``dataset``
    (``PROJECT.DATASET``): to create it (``bigquery.datasets.create`` on its project), to see it, or to write, change,
    read or delete a table in it (``RESULTS_PERMISSIONS``), with what BigQuery said; None for any other failure (a
    refusal about the table read, a quota, an outage)."""
    said = _said(exc)
    project, name = dataset.rsplit(".", 1)
    named = f"{project}:{name}" in said or dataset in said or DATASET_CREATE_PERMISSION in said
    if not refused(exc) or not named:
        return None
    who = _identity(creds)
    grantee = who or "the pipeline service account"
    if DATASET_CREATE_PERMISSION in said:
        return SpecError(
            RESULTS_FIELD,
            f"{who or 'the caller'} may not create the dataset {dataset} (it lacks {DATASET_CREATE_PERMISSION} in "
            f"project {project}), where the APPENDS query of the rows committed since the champion writes its "
            f"result: {said}",
            [f"a dataset made once in the table's location, with roles/bigquery.dataEditor on it alone granted to "
             f"{grantee}, named in {RESULTS_FIELD} (the least privilege)",
             f"roles/bigquery.user on the project {project}, granted to {grantee} (it creates its own dataset once, "
             "and owns it alone; it also lists every dataset and table of the project)"],
        )  # fmt: skip
    lacking = next((p for p in (*RESULTS_PERMISSIONS, "bigquery.datasets.get") if p in said), "a permission")
    return SpecError(
        RESULTS_FIELD,
        f"{who or 'the caller'} lacks {lacking} on the dataset {dataset}, where the APPENDS query of the rows "
        f"committed since the champion writes its result, which the run then reads and deletes: {said}",
        [f"roles/bigquery.dataEditor on the dataset {dataset} (it holds {', '.join(RESULTS_PERMISSIONS)} and "
         f"bigquery.datasets.get), granted to {grantee}",
         f'{RESULTS_FIELD}="" (the run identity\'s own dataset, which the run creates, and owns alone)'],
    )  # fmt: skip


def _appends_refusal(
    bq: bigquery.Client, found: bigquery.Table, snap: TableSnapshot, since: TableSnapshot, creds: Credentials
) -> str:
    """Why APPENDS cannot read what was committed since ``since`` (the champion's snapshot): "" when it can."""
    if (since.get("table"), since.get("filter") or "") != (snap["table"], snap["filter"]):
        return (
            f"the champion read {since.get('table')} with the filter {since.get('filter') or ''!r}, not "
            f"{snap['table']} with {snap['filter']!r}"
        )
    if found.table_type != "TABLE":
        return f"{snap['table']} is a {found.table_type}, and APPENDS reads regular tables only"
    start = datetime.fromisoformat(since["snapshot_time"])
    if found.created and found.created > start:
        return (
            f"{snap['table']} was created at {_stamp(found.created)}, after the champion's snapshot at "
            f"{since['snapshot_time']} (recreated or replaced)"
        )
    try:
        hours = bq.get_dataset(snap["table"].rsplit(".", 1)[0]).max_time_travel_hours
    except _failures() as exc:
        return f"its dataset's time travel window could not be read ({type(exc).__name__})"
    window = int(hours or DEFAULT_TRAVEL_HOURS)
    # A margin for the clocks and the time between this check and the query.
    if start < datetime.now(UTC) - timedelta(hours=window) + TRAVEL_MARGIN:
        return (
            f"the champion's snapshot at {since['snapshot_time']} is past the table's time travel window of {window} "
            f"hours ({TIME_WINDOW})"
        )
    return ""


def _hours(span: timedelta) -> int:
    return int(span.total_seconds() // 3600)


def _table_path(table: str) -> str:
    """``PROJECT.DATASET.TABLE`` as the Storage Read API names it: ``projects/P/datasets/D/tables/T``."""
    project, dataset, name = table.rsplit(".", 2)
    return f"projects/{project}/datasets/{dataset}/tables/{name}"


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _matching(snap: TableSnapshot, field: str) -> str:
    return f" matching {field}_filter {snap['filter']!r}" if snap["filter"] else ""


def _restriction(snap: TableSnapshot, time_field: str) -> str:
    """The session's row_restriction: ``COLUMN = LITERAL`` for each pair of the filter, ``TIME > LITERAL`` for
    ``after``, joined by AND; "" for none."""
    conditions = []
    types = snap.get("filter_types") or {}
    filter_field = time_field.removesuffix("_time_column") + "_filter"
    for column, value in row_filter(snap["filter"], filter_field):
        kind = types[column]
        conditions.append(f"{_quoted(column)} = {_literal(kind, _typed(kind, value, filter_field, column))}")
    if snap["after"] is not None:
        kind = snap["time_type"]
        conditions.append(f"{_quoted(snap['time_column'])} > {_literal(kind, _typed(kind, snap['after'], time_field))}")
    return " AND ".join(conditions)


def _literal(kind: str, value: Any) -> str:
    """``value`` (as :func:`_typed` parsed it for a ``kind`` column) as a GoogleSQL literal
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical#literals): a quoted string, an integer,
    TRUE or FALSE, a finite float, else ``CAST('text' AS TYPE)`` (conversion functions:
    https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_functions#cast)."""
    kind = PARAMETER_TYPES.get(kind, kind)
    if kind == "STRING":
        return _string(value)
    if kind == "BOOL":
        return "TRUE" if value else "FALSE"
    if kind == "INT64":
        return str(int(value))
    if kind == "FLOAT64" and math.isfinite(value):
        return repr(float(value))
    if isinstance(value, datetime):
        text = (value.astimezone(UTC) if value.tzinfo else value).isoformat(sep=" ")
    elif isinstance(value, date):
        text = value.isoformat()
    else:
        text = str(value)  # NUMERIC, BIGNUMERIC, a float's inf or nan
    return f"CAST({_string(text)} AS {kind})"


def _string(text: str) -> str:
    """A GoogleSQL double-quoted string literal: a backslash, a quote and every control character escaped (``\\\\``,
    ``\\"``, ``\\uXXXX``: https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical#escape_sequences)."""
    out = []
    for ch in text:
        if ch in '\\"':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


READ_PERMISSIONS = ("bigquery.tables.get", "bigquery.tables.getData")  # roles/bigquery.dataViewer's, on the table
# Reading a table that has or had row access policies as of a past time (time travel, APPENDS) takes this (a custom
# role holding it alone: roles/bigquery.admin would also let the reader delete the policies), and the Storage Read API
# the TRUE filter ("Required permissions", https://cloud.google.com/bigquery/docs/change-history;
# https://cloud.google.com/bigquery/docs/using-row-level-security-with-features, "Time travel")
OVERRIDE_TIME_TRAVEL = "bigquery.rowAccessPolicies.overrideTimeTravelRestrictions"
ROW_POLICIES_SOURCE = "https://cloud.google.com/bigquery/docs/using-row-level-security-with-features"
# BigQuery's refusal of such a read without it: "Access Denied: BigQuery: Time travel on table P:D.T is forbidden as
# it has (or has had) row access policies" (the query service's wording, as Fivetran's troubleshooting page quotes it:
# https://fivetran.com/docs/connectors/databases/bigquery/troubleshooting/time-travel-forbidden-error); a refusal
# that does not say so is not blamed on row access policies.
ROW_POLICY_REFUSAL = re.compile(r"\bhas \(or has had\) row access polic", re.IGNORECASE)
JOB_PERMISSION = "bigquery.jobs.create"  # roles/bigquery.jobUser's, on the project the jobs run in
# roles/bigquery.readSessionUser's, on the project a Storage Read API session is created in and billed to
# (https://cloud.google.com/bigquery/docs/reference/storage, "Permissions")
READ_SESSION_PERMISSION = "bigquery.readsessions.create"
# and reading its streams (ReadRows) takes bigquery.readsessions.getData there: roles/bigquery.readSessionUser holds
# both, with bigquery.readsessions.update (https://cloud.google.com/bigquery/docs/access-control#bigquery.readSessionUser),
# and a custom role may hold the one without the other
READ_STREAM_PERMISSION = "bigquery.readsessions.getData"
ALL_AUTHENTICATED = "allAuthenticatedUsers"  # a specialGroup of a dataset's access list: anyone signed in
# The special groups of a dataset's access list that stand for the members of a basic role on the dataset's project
# (Dataset.access.specialGroup: "projectOwners: Owners of the enclosing project", "projectReaders: Readers of the
# enclosing project", "projectWriters: Writers of the enclosing project",
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access; BigQuery adds all three to
# a dataset created without an access list), by the basic role that makes a member one of them
# (https://cloud.google.com/bigquery/docs/access-control-basic-roles).
PROJECT_GROUPS = {"projectReaders": "roles/viewer", "projectWriters": "roles/editor", "projectOwners": "roles/owner"}


def missing_read(table: str, project: str, *, field: str = "train.dataset") -> list[str]:
    """Of ``READ_PERMISSIONS``, those the caller lacks on ``table`` (``PROJECT.DATASET.TABLE``), asked of BigQuery's
    tables.testIamPermissions (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables/testIamPermissions,
    which needs no permission itself) through a client of ``project`` (the jobs' project: the call is no job).
    SpecError(field) when the table or its dataset does not exist."""
    from google.api_core import exceptions as gexc

    try:
        held = set(client(project).test_iam_permissions(table, list(READ_PERMISSIONS)).get("permissions", []))
    except gexc.NotFound as exc:
        raise SpecError(field, f"{table} does not exist or is not visible to the caller: {exc.message}") from None
    return [p for p in READ_PERMISSIONS if p not in held]


def dataset_exists(dataset: str, project: str, *, field: str = "train.dataset") -> bool:
    """Whether the dataset ``PROJECT.DATASET`` exists (:func:`dataset_location`): where a dated table
    (``events_{date:%Y%m%d}``) will be. No permission to see it is the caller's error, naming ``field``."""
    creds = credentials()
    try:
        return dataset_location(dataset, project, creds) is not None
    except _failures() as exc:
        raise _refusal(exc, field, dataset, project, creds, "", "") from None


def dataset_location(dataset: str, project: str, creds: Credentials | None = None) -> str | None:
    """The location of the dataset ``PROJECT.DATASET`` ("" when it says none), None when it does not exist, asked of
    datasets.get (``Client.get_dataset``, which needs ``bigquery.datasets.get``, held by roles/bigquery.dataViewer,
    every role that reads a table, and roles/bigquery.user:
    https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets/get) through a client of ``project``; a refusal
    is raised as the client raises it."""
    from google.api_core import exceptions as gexc

    try:
        return client(project, creds).get_dataset(dataset).location or ""
    except gexc.NotFound:
        return None


def failures() -> tuple[type[Exception], ...]:
    """What a call to BigQuery raises (an API error, or google-auth's about the credentials), for callers that report
    rather than raise."""
    return _failures()


# The roles that hold bigquery.jobs.create on a project: the predefined ones the jobs overview names
# (https://cloud.google.com/bigquery/docs/jobs-overview, "Required permissions") and the basic ones, each of which
# "can start a job in the project" (https://cloud.google.com/bigquery/docs/access-control-basic-roles).
JOB_ROLES = (
    "roles/bigquery.jobUser", "roles/bigquery.user", "roles/bigquery.admin", "roles/viewer", "roles/editor",
    "roles/owner",
)  # fmt: skip
# The roles that hold bigquery.readsessions.create on a project: the predefined ones that grant it
# (https://cloud.google.com/bigquery/docs/access-control: readSessionUser, user, admin) and the basic ones
# (https://cloud.google.com/bigquery/docs/access-control-basic-roles).
READ_SESSION_ROLES = (
    "roles/bigquery.readSessionUser", "roles/bigquery.user", "roles/bigquery.admin", "roles/viewer", "roles/editor",
    "roles/owner",
)  # fmt: skip
# The roles that hold bigquery.tables.getData on a dataset's tables, granted on the dataset or on its project: the
# predefined ones (https://cloud.google.com/bigquery/docs/access-control: dataViewer, dataEditor, dataOwner, admin)
# and a dataset's basic roles as its access list names them, READER, WRITER and OWNER
# (https://cloud.google.com/bigquery/docs/access-control-basic-roles, "Basic roles for datasets").
READ_ROLES = (
    "roles/bigquery.dataViewer", "roles/bigquery.dataEditor", "roles/bigquery.dataOwner", "roles/bigquery.admin",
    "READER", "WRITER", "OWNER",
)  # fmt: skip
# The roles that hold bigquery.datasets.create on a project: roles/bigquery.user, dataEditor, dataOwner and admin
# (https://cloud.google.com/bigquery/docs/access-control) and the basic Editor and Owner
# (https://cloud.google.com/bigquery/docs/access-control-basic-roles).
DATASET_CREATE_ROLES = (
    "roles/bigquery.user", "roles/bigquery.dataEditor", "roles/bigquery.dataOwner", "roles/bigquery.admin",
    "roles/editor", "roles/owner",
)  # fmt: skip


class AccountRoles(NamedTuple):
    """What :func:`account_roles` found of a service account's roles on a dataset with jobs in a project."""

    on_project: set[str]  # on the jobs' project, unconditionally
    reading: set[str]  # on the dataset or its project, unconditionally
    unread: list[str]  # the policies and access lists the caller could not read
    # role -> the titles of the IAM conditions it is granted under (``cloud.iam``: not counted as held)
    on_project_conditional: dict[str, set[str]]
    reading_conditional: dict[str, set[str]]


def account_roles(
    dataset: str,
    project: str,
    account: str,
    creds: Credentials | None = None,
    entries: list[bigquery.AccessEntry] | None = None,
) -> AccountRoles:
    """The roles the service account ``account`` (an email) holds on ``project`` and those it holds on ``dataset``
    (``PROJECT.DATASET``: a table's, whose rows it reads; the APPENDS query's results dataset, whose tables it
    writes), on the dataset itself or its project: from the project IAM policies (Resource Manager's
    projects.getIamPolicy) and the dataset's access list (``entries`` when the caller has read it, else
    :func:`dataset_access`, where an account is ``userByEmail`` or an ``iamMember``,
    ``allAuthenticatedUsers`` a ``specialGroup`` that includes it, and ``projectReaders``/``projectWriters``/
    ``projectOwners`` those that include it by its basic role on the dataset's project: ``PROJECT_GROUPS``). A
    binding or access entry with a condition grants only where the condition holds (``cloud.iam``): kept apart, by
    the condition's title. Read as the caller, who may lack the permission to read a policy: each such read is
    named, not guessed."""
    from components.cloud import iam as cloud_iam

    member, unread = f"serviceAccount:{account}", []
    data_project = dataset.rsplit(".", 1)[0]
    levels: dict[str, cloud_iam.Level] = {}
    for where in dict.fromkeys((project, data_project)):
        try:
            levels[where] = cloud_iam.project_level(where, creds)
        except _failures() as exc:
            unread.append(f"project {where}'s IAM policy ({type(exc).__name__})")
    none = cloud_iam.Level("", {})

    def held(where: str) -> tuple[set[str], dict[str, set[str]]]:
        level = levels.get(where, none)
        return level.grants.get(member, set()), level.conditional.get(member, {})

    basic, basic_conditional = held(data_project)  # its roles on the dataset's project
    on_dataset: set[str] = set()
    on_dataset_conditional: dict[str, set[str]] = {}
    try:
        mine = (account, member, ALL_AUTHENTICATED)
        for entry in dataset_access(client(project, creds), dataset) if entries is None else entries:
            # an authorized view's, routine's or dataset's entry names it by an object: no account, no group
            group = PROJECT_GROUPS.get(entry.entity_id, "") if isinstance(entry.entity_id, str) else ""
            if not entry.role:
                continue
            if entry.entity_id in mine or group in basic:
                titles: set[str] = set()
            elif group in basic_conditional:  # one of the group only under a condition on the project
                titles = set(basic_conditional[group])
            else:
                continue
            if entry.condition is not None:
                titles.add(entry.condition.title or entry.condition.expression)
            if titles:
                on_dataset_conditional.setdefault(entry.role, set()).update(titles)
            else:
                on_dataset.add(entry.role)
    except _failures() as exc:
        unread.append(f"dataset {dataset}'s access list ({type(exc).__name__})")
    reading_conditional = {role: set(titles) for role, titles in held(data_project)[1].items()}
    for role, titles in on_dataset_conditional.items():
        reading_conditional.setdefault(role, set()).update(titles)
    return AccountRoles(held(project)[0], on_dataset | basic, unread, held(project)[1], reading_conditional)


def dataset_access(bq: bigquery.Client, dataset: str) -> list[bigquery.AccessEntry]:
    """The dataset's access list (``PROJECT.DATASET``) as ``AccessEntry`` objects (:func:`dataset_resource`)."""
    return list(dataset_resource(bq, dataset).access_entries)


def dataset_resource(bq: bigquery.Client, dataset: str) -> bigquery.Dataset:
    """The dataset (``PROJECT.DATASET``) as a ``Dataset``, its access list read with datasets.get at
    ``accessPolicyVersion=3``: "Requests for conditional access policy binding in datasets must specify version 3";
    below it an entry with a condition comes back without it, its role suffixed with ``withcond`` and a hash
    (https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets/get; each entry's ``condition``:
    https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access). google-cloud-bigquery's
    ``Client.get_dataset`` sends ``datasetView`` alone (google/cloud/bigquery/client.py at 3.47.0), so the request is
    made as it makes it, through the client's own ``_call_api`` (its endpoint, credentials and retry), with the
    parameter added."""
    from google.cloud.bigquery import DEFAULT_RETRY, Dataset, DatasetReference

    from components.cloud.iam import IAM_POLICY_VERSION

    path = DatasetReference.from_string(dataset, default_project=bq.project).path
    resource = bq._call_api(
        DEFAULT_RETRY,
        span_name="BigQuery.getDataset",
        span_attributes={"path": path},
        method="GET",
        path=path,
        query_params={"accessPolicyVersion": IAM_POLICY_VERSION},
    )
    return Dataset.from_api_repr(resource)


def row_access_policies(table: str, project: str) -> int | None:
    """How many row access policies ``table`` has now (rowAccessPolicies.list:
    https://cloud.google.com/bigquery/docs/reference/rest/v2/rowAccessPolicies/list, which needs
    ``bigquery.rowAccessPolicies.list``), asked through a client of ``project`` with its own ``_call_api`` (the
    client library has no method for it); None when the caller may not list them. One that had policies and has
    none now is not told."""
    from google.api_core import exceptions as gexc
    from google.cloud.bigquery import DEFAULT_RETRY, TableReference

    bq = client(project)
    path = TableReference.from_string(table).path + "/rowAccessPolicies"
    count, token = 0, None
    try:
        while True:
            page = bq._call_api(
                DEFAULT_RETRY,
                span_name="BigQuery.listRowAccessPolicies",
                span_attributes={"path": path},
                method="GET",
                path=path,
                query_params={"pageToken": token} if token else {},
            )
            count += len(page.get("rowAccessPolicies") or [])
            token = page.get("nextPageToken")
            if not token:
                return count
    except (gexc.Forbidden, gexc.PermissionDenied):
        return None


def _failures() -> tuple[type[Exception], ...]:
    """What a call to BigQuery raises: an API error, or google-auth's about the credentials."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPICallError, GoogleAuthError


def _typed(kind: str, text: str, field: str, column: str = "") -> Any:
    """``text`` as the Python value of a query parameter of type ``kind`` (a schema type, legacy names too): ``after``
    (the text :func:`_text` wrote) or a filter's value for ``column``; a SpecError naming ``field`` otherwise. Its type
    follows ``kind``, a run-time string (str, int, float, Decimal, bool, date or datetime): Any to mypy."""
    kind = PARAMETER_TYPES.get(kind, kind)
    try:
        if kind == "STRING":
            return text
        if kind == "INT64":
            return int(text)
        if kind == "FLOAT64":
            return float(text)
        if kind in ("NUMERIC", "BIGNUMERIC"):
            return decimal.Decimal(text)
        if kind == "BOOL" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind == "DATE":
            return date.fromisoformat(text)
        if kind in ("TIMESTAMP", "DATETIME"):
            value = datetime.fromisoformat(text)
            if kind == "TIMESTAMP":
                return value if value.tzinfo else value.replace(tzinfo=UTC)
            if value.tzinfo is None:
                return value
    except (ValueError, decimal.InvalidOperation):
        pass
    if column and kind not in PARAMETER_TYPES.values():
        kinds = ", ".join(sorted(set(PARAMETER_TYPES.values())))
        raise SpecError(field, f"{column} is {kind}: a filter compares {kinds} columns")
    purpose = f"for the column {column}" if column else "to read the rows after"
    raise SpecError(field, f"{text!r} is not a {kind} value {purpose}")


def _quoted(column: str) -> str:
    """A column name as a GoogleSQL quoted identifier (https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical)."""
    return "`" + column.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _text(value: Any) -> str | None:
    """A time column's value as text that :func:`_typed` reads back."""
    return None if value is None else str(_jsonable(value))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.isoformat()
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _refusal(
    exc: Exception, field: str, table: str, project: str, creds: Credentials | None, filter_field: str, filter: str
) -> Exception:
    """What to raise for ``exc``, a failed call about ``table``: a SpecError naming the field at fault when the input
    is, the AccessError of credentials refused or an API not enabled, else ``exc`` itself."""
    from google.api_core import exceptions as gexc

    if not isinstance(exc, gexc.GoogleAPICallError):  # google-auth's: the credentials
        return access_error(exc) or exc
    first = next((e for e in exc.errors or [] if isinstance(e, dict)), {})
    said = _said(exc)
    reason = first.get("reason", "")
    if isinstance(exc, gexc.NotFound):
        # Only tables.get of the table is asked whether it exists (snapshot: a NoDrop there); a NotFound after it (a
        # read session, a stream, the APPENDS query) is the table or the read going away under the run.
        return InfraError(
            f"{field}: {table} was there when the run looked it up, and then not: {said} (the table dropped or "
            f"replaced while it was read, or its read session expired, {SESSION_HOURS} hours after it was made); "
            "nothing of it is used: a new run reads it again"
        )
    if isinstance(exc, gexc.Forbidden) and reason == "accessDenied" and "bigquery.jobs.create" in said:
        who = _identity(creds)
        return SpecError(
            field,
            f"{who or 'the caller'} may not run BigQuery jobs in project {project}, where the run's queries run and "
            f"are billed: {said}",
            [f"roles/bigquery.jobUser on the project {project}, granted to {who or 'the pipeline service account'}",
             "train.bigquery_project=PROJECT (a project where it may; default: gke.project)"],
        )  # fmt: skip
    denied = isinstance(exc, gexc.PermissionDenied) or (isinstance(exc, gexc.Forbidden) and reason == "accessDenied")
    who = _identity(creds)
    grantee = who or "the pipeline service account"
    if denied and ROW_POLICY_REFUSAL.search(said):  # a snapshot's read session or the APPENDS query
        return SpecError(
            field,
            f"{who or 'the caller'} may not read {table} as of a past time, as every read of the run is (its snapshot "
            f"time, and APPENDS): a table that has or had row-level access policies is read so only with "
            f"{OVERRIDE_TIME_TRAVEL}, and the Storage Read API reads it only with the TRUE filter "
            f"({ROW_POLICIES_SOURCE}, \"Time travel\" and \"The TRUE filter\"): {said}",
            [f"a custom role holding only {OVERRIDE_TIME_TRAVEL} (`gcloud iam roles create ROLE --project "
             f"{table.split('.')[0]} --permissions={OVERRIDE_TIME_TRAVEL}`), granted to {grantee} on the table "
             f"{table}, and a row access policy `FILTER USING (TRUE)` on it granted to {grantee}",
             "a copy of the table without row access policies, read instead"],
        )  # fmt: skip
    if isinstance(exc, gexc.PermissionDenied) and READ_SESSION_PERMISSION in said:
        return SpecError(
            field,
            f"{who or 'the caller'} may not open BigQuery read sessions in project {project}, where the run reads "
            f"the table and is billed: {said}",
            [f"roles/bigquery.readSessionUser on the project {project}, granted to {grantee}",
             "train.bigquery_project=PROJECT (a project where it may; default: gke.project)"],
        )  # fmt: skip
    if isinstance(exc, gexc.PermissionDenied) and READ_STREAM_PERMISSION in said:
        return SpecError(
            field,
            f"{who or 'the caller'} may open BigQuery read sessions in project {project} yet not read their streams "
            f"({READ_STREAM_PERMISSION}): {said}",
            [f"roles/bigquery.readSessionUser on the project {project} (it holds {READ_SESSION_PERMISSION} and "
             f"{READ_STREAM_PERMISSION}), granted to {grantee}",
             "train.bigquery_project=PROJECT (a project where it may; default: gke.project)"],
        )  # fmt: skip
    # PERMISSION_DENIED is the Storage Read API's refusal (gRPC), accessDenied the REST API's.
    if denied:
        dataset = table.rsplit(".", 1)[0]
        if _reads(table, project):  # the rows, yet not this read: what BigQuery said is all there is to go on
            return SpecError(
                field,
                f"{who or 'the caller'} may read {table}, yet BigQuery refused this read of it: {said}",
                ["what BigQuery names: a column's policy tag (fine-grained reader on it), a VPC Service Controls "
                 "perimeter, or an organization policy"],
            )  # fmt: skip
        return SpecError(
            field,
            f"{who or 'the caller'} may not read {table}: {said}",
            [f"roles/bigquery.dataViewer on the dataset {dataset} (or the table) and roles/bigquery.readSessionUser "
             f"and roles/bigquery.jobUser on the project {project}, granted to {grantee}"],
        )  # fmt: skip
    if isinstance(exc, gexc.BadRequest) and "Invalid snapshot time" in said:
        return SpecError(
            field,
            f"{table} cannot be read as of the run's snapshot time, outside the table's time travel window "
            f"(7 days by default: {TIME_WINDOW}): {said}; a new run takes a new snapshot",
        )
    if isinstance(exc, gexc.BadRequest) and filter:
        return SpecError(
            filter_field,
            f"BigQuery refused the query with the filter {filter!r}: {said}",
        )
    if isinstance(exc, gexc.Forbidden) and not exc.reason:  # a quota or a rate limit (errors[].reason), not access
        return exc
    return access_error(exc) or exc


def _reads(table: str, project: str) -> bool:
    """Whether the caller holds what reading ``table`` takes (``READ_PERMISSIONS``): then a read refused is refused
    for another reason than the rows' grant. False when that cannot be asked."""
    try:
        return not missing_read(table, project)
    except SpecError:
        return False
    except _failures():
        return False


def _said(exc: Exception) -> str:
    """The first line of what BigQuery said of a failed call (its first error's message)."""
    errors = getattr(exc, "errors", None) or []
    first = next((e for e in errors if isinstance(e, dict)), {})
    return str(first.get("message") or getattr(exc, "message", "") or exc).strip().splitlines()[0]


def _identity(creds: Credentials | None) -> str:
    """The account the credentials act as, when they say (a service account's e-mail, a user's account), asking no
    one (``named_email``)."""
    return named_email(creds)
