"""An in-process BigQuery: the part of the REST API v2 (``/bigquery/v2``) that google-cloud-bigquery 3.47.0 calls to
read a table's schema and to run a query and page through its results, served over plain HTTP by ``http.server`` so
that the real ``google.cloud.bigquery.Client`` talks to it:

- tables.get, ``GET /projects/P/datasets/D/tables/T`` (``Client.get_table``, google/cloud/bigquery/client.py): the
  table resource (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table);
- jobs.query, ``POST /projects/P/queries`` (``Client.query_and_wait``, and ``Client.query`` with
  ``api_method="QUERY"``: google/cloud/bigquery/_job_helpers.py, ``query_and_wait`` and ``query_jobs_query``): runs
  the query and answers its first page (https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/query);
- jobs.insert, ``POST /projects/P/jobs`` (``Client.query``'s default, ``query_jobs_insert``): the job resource
  (https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/insert), its result written to the
  ``destinationTable`` its configuration names (``writeDisposition``, ``createDisposition``: ``_written``), else to an
  anonymous table, up to the maximum response size (``max_response_bytes``, 10 GB by default as the quotas page
  says; past it ``responseTooLarge``: ``_anonymous``);
- jobs.get, ``GET /projects/P/jobs/J`` (``QueryJob.done`` reloads the job: google/cloud/bigquery/job/base.py) and
  jobs.cancel, ``POST /projects/P/jobs/J/cancel`` (what ``_job_helpers._wait_or_cancel`` sends when waiting fails);
- datasets.get, ``GET /projects/P/datasets/D`` (``Client.get_dataset``): the dataset and its ``access`` list, the
  roles granted on it, those under an IAM condition as its ``accessPolicyVersion`` asks (``_datasets_get``);
- datasets.insert, ``POST /projects/P/datasets`` (``Client.create_dataset``): a dataset with its location, its
  ``defaultTableExpirationMs``, its ``maxTimeTravelHours``, its labels and its ``access`` list: the one the request
  names, kept as it is, else BigQuery's defaults, its creator and the project's basic roles (``_datasets_insert``);
- tables.patch, ``PATCH /projects/P/datasets/D/tables/T`` (``Client.update_table``), of a table's ``expirationTime``,
  and tables.delete, ``DELETE`` of the same path (``Client.delete_table``); a table past its ``expirationTime`` on the
  emulator's clock is deleted, and not found from then on (``_sweep``);
- tables.testIamPermissions, ``POST /projects/P/datasets/D/tables/T:testIamPermissions``
  (``Client.test_iam_permissions``): of the permissions asked, those the caller holds on the table, itself needing none
  (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables/testIamPermissions);
- jobs.getQueryResults, ``GET /projects/P/queries/J`` (``QueryJob.result`` and the ``RowIterator`` it returns: one
  call per page, ``pageToken`` from the previous page, ``maxResults``, ``startIndex``, ``fields``:
  https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/getQueryResults).

A page holds at most ``maxResults`` rows and at most ``page_bytes`` of rows (10 MB, as jobs.query's ``maxResults``
documents: "responses are also limited to 10 MB"); ``pageToken`` is there while rows remain. Rows are
``{"f": [{"v": ...}]}`` with every value a string (TIMESTAMP as microseconds with
``formatOptions.useInt64Timestamp``, else seconds: https://cloud.google.com/bigquery/docs/reference/rest/v2/DataFormatOptions).
Jobs finish at once: every job is DONE when created, and a query that fails is a DONE job with an ``errorResult``
(jobs.insert) or the HTTP error itself (jobs.query, jobs.getQueryResults). A jobs.query repeated with the same
``requestId`` answers the job of the first (QueryRequest.requestId makes the call idempotent). A job runs in its
dataset's location (US unless ``create_dataset`` says otherwise); a request naming another location does not find the
dataset there (``Not found: Dataset P:D was not found in location EU``). A failure of the emulator itself is a 500
with the reason ``emulatorError``, which the client does not retry (google/cloud/bigquery/retry.py).

Tables keep every version of every row: ``insert``, ``update`` and ``delete`` (the tests' own calls) stamp the
row versions they make or end with the emulator's clock (or ``at``), so ``FOR SYSTEM_TIME AS OF t`` reads the table
as it was at ``t`` (https://cloud.google.com/bigquery/docs/time-travel): rows inserted after ``t`` are not there, rows
updated or deleted after ``t`` are as they were. ``t`` before the table's creation or before its dataset's time
travel window (``max_time_travel_hours``, 48 to 168 hours in steps of 24, 168 by default:
https://cloud.google.com/bigquery/docs/time-travel#configure_the_time_travel_window) is BigQuery's ``Invalid
snapshot time T for table P:D.T@T. Cannot read before S.``
(https://cloud.google.com/bigquery/docs/access-historical-data); a dropped table is ``Not found``, as there. A time in
the future is refused with 400 (BigQuery documents no answer for it; the message is the emulator's).

The SQL it reads is a deliberate subset, the shapes ``components/data/bigquery.py`` sends, with no SQL engine behind
it: ``SELECT {* | item, ...} FROM `P.D.T` [FOR SYSTEM_TIME AS OF expr] [WHERE cond] [LIMIT n]`` where an item is a
column, ``COUNT(*)``, ``COUNTIF(cond)``, ``MAX(column)`` or ``MIN(column)`` (``[AS alias]``), and a condition is made
of columns, literals (strings, numbers, TRUE, FALSE, NULL, ``TIMESTAMP '...'``, ``DATE '...'``, ``DATETIME '...'``),
named parameters (``@name``), ``= != <> < <= > >=``, ``IS [NOT] NULL|TRUE|FALSE``, ``[NOT] IN (...)``, ``AND``,
``OR``, ``NOT`` and parentheses, with GoogleSQL's three-valued logic and its literal coercions (a string literal
compared with a TIMESTAMP, DATE or DATETIME is read as one:
https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_rules). Names are resolved as BigQuery does
(``Unrecognized name: x at [1:20]``, ``Query parameter 'x' not found at [1:20]``, ``No matching signature for
operator ...``). Anything else (functions, arithmetic, GROUP BY, ORDER BY, joins, scripts, legacy SQL, ARRAY and
STRUCT parameters) is answered 400 "... is not supported by the emulator", never guessed. Column types: STRING,
INT64, FLOAT64, BOOL, TIMESTAMP, DATE and DATETIME (legacy names too); no RECORD, no REPEATED.

Identities: a request with the emulator's ``token`` (a static token, or the ``TokenIssuer``'s) acts as the projects'
owner. ``token_for(member)`` mints one that acts as ``member``, allowed what ``grant(member, role, resource)`` gave it
on the project, the dataset or the table (a grant on a project or a dataset holds for what is in it:
https://cloud.google.com/bigquery/docs/control-access-to-resources-iam), with the permissions of BigQuery's predefined
roles (``ROLES``, https://cloud.google.com/bigquery/docs/access-control) and of a dataset's ``access`` list: an entry
holds for the member its ``userByEmail`` or ``iamMember`` names, a ``domain`` entry for each member at that domain,
a ``groupByEmail`` entry for none (the emulator knows no group's members), ``allAuthenticatedUsers`` for every
member, and the special groups ``projectReaders``, ``projectWriters`` and ``projectOwners`` for the members granted
the project's basic role Viewer, Editor or Owner (``grant(member, "roles/viewer", "P")``: ``BASIC_ROLES``), each
entry's role (``READER``, ``WRITER``, ``OWNER``) being roles/bigquery.dataViewer's, dataEditor's or dataOwner's on the
dataset (``LEGACY_ROLES``). The basic roles are modelled that far only: on their own they run jobs (Viewer), and create
datasets (Editor, Owner), and read no table. tables.get needs ``bigquery.tables.get`` on
the table, a query ``bigquery.jobs.create`` on the project it runs in (the project in the request's path, which is
billed: not the project of the table it reads) and ``bigquery.tables.getData`` on the table it reads (a grant on the
table, its dataset or its project), and ``bigquery.tables.create`` and ``bigquery.tables.updateData`` on the dataset it
writes to, a dataset ``bigquery.datasets.create`` on its project, changing a table ``bigquery.tables.update``, deleting
it ``bigquery.tables.delete``; a job is read back by whoever created it (or with ``bigquery.jobs.get``). A
grant to ``allAuthenticatedUsers`` holds for every member, as a public dataset's (``bigquery-public-data``) is
shared: https://cloud.google.com/iam/docs/principals-overview#all-authenticated-users. A refusal is 403 ``accessDenied``
with BigQuery's message; an unknown dataset, table or job is 404 ``notFound``; a bad query 400 ``invalidQuery``
(https://cloud.google.com/bigquery/docs/error-messages), in the error shape of Google's JSON APIs with
``errors[].reason``, which the client reads to decide what it retries (google/cloud/bigquery/retry.py).

Faults are injected per method ("tables.get", "jobs.query", "jobs.insert", "jobs.get", "jobs.getQueryResults",
"jobs.cancel", "datasets.insert", "tables.patch", "tables.delete", ...): the next N matching calls answer an HTTP
error before they take effect.

Pointing the client here: ``bigquery.Client(project=..., credentials=..., client_options={"api_endpoint":
endpoint})``; ``$TPUPIPE_BIGQUERY_EMULATOR_HOST`` for tpupipe (components/data/bigquery.py).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import secrets
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from tests.emulators import take_fault
from tests.emulators.http import REASONS, STATUS, Fault, HttpEmulator, HttpError
from tests.emulators.tokens import TokenIssuer, authorized

PREFIX = "/bigquery/v2"  # the client's API_URL_TEMPLATE, google/cloud/bigquery/_http.py
ROUTES = [  # (HTTP method, path under PREFIX, the REST method)
    (
        "POST",
        re.compile(
            r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/:]+):testIamPermissions"
        ),
        "tables.testIamPermissions",
    ),
    (
        "GET",
        re.compile(r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/]+)"),
        "tables.get",
    ),
    (
        "GET",
        re.compile(
            r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/]+)/rowAccessPolicies"
        ),
        "rowAccessPolicies.list",
    ),
    (
        "PATCH",
        re.compile(r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/]+)"),
        "tables.patch",
    ),
    (
        "DELETE",
        re.compile(r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)/tables/(?P<table>[^/]+)"),
        "tables.delete",
    ),
    ("GET", re.compile(r"/projects/(?P<project>[^/]+)/datasets/(?P<dataset>[^/]+)"), "datasets.get"),
    ("POST", re.compile(r"/projects/(?P<project>[^/]+)/datasets"), "datasets.insert"),
    ("POST", re.compile(r"/projects/(?P<project>[^/]+)/queries"), "jobs.query"),
    ("GET", re.compile(r"/projects/(?P<project>[^/]+)/queries/(?P<job>[^/]+)"), "jobs.getQueryResults"),
    ("POST", re.compile(r"/projects/(?P<project>[^/]+)/jobs"), "jobs.insert"),
    ("GET", re.compile(r"/projects/(?P<project>[^/]+)/jobs/(?P<job>[^/]+)"), "jobs.get"),
    ("POST", re.compile(r"/projects/(?P<project>[^/]+)/jobs/(?P<job>[^/]+)/cancel"), "jobs.cancel"),
]
# errors[].reason of each status (https://cloud.google.com/bigquery/docs/error-messages): a refusal is accessDenied
BIGQUERY_REASONS = {**REASONS, 403: "accessDenied"}
PAGE_BYTES = 10 * 1024 * 1024
# A query's result without a destination table is capped: "Maximum response size: 10 GB compressed"
# (https://cloud.google.com/bigquery/quotas#query_jobs); the emulator measures a result as the JSON of its rows as
# the REST API answers them (``_result_row``), not compressed
MAX_RESPONSE_BYTES = 10 * 1000**3
# How long an anonymous query result table lives: "After a query finishes, the temporary table exists for up to 24
# hours" (https://cloud.google.com/bigquery/docs/writing-results)
ANONYMOUS_HOURS = 24
# A dataset's defaultTableExpirationMs: "The minimum lifetime value is 3600000 milliseconds (one hour)"
# (https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.default_table_expiration_ms)
MIN_TABLE_EXPIRATION_MS = 3_600_000
# a dataset id: letters, digits and underscores, at most 1,024 characters (DatasetReference.datasetId,
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#DatasetReference)
DATASET_ID = re.compile(r"[A-Za-z0-9_]{1,1024}")
# what datasets.insert's body may hold here (the Dataset resource's fields the emulator keeps or ignores:
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset)
DATASET_FIELDS = {"kind", "datasetReference", "location", "defaultTableExpirationMs", "labels", "description",
                  "friendlyName", "access", "maxTimeTravelHours"}  # fmt: skip
# Dataset.maxTimeTravelHours: "The value can be from 48 to 168 hours (2 to 7 days). The default value is 168 hours if
# this is not set" (https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.max_time_travel_hours),
# in multiples of 24 (https://cloud.google.com/bigquery/docs/time-travel#configure_the_time_travel_window)
TRAVEL_HOURS = range(48, 169, 24)
ALL_AUTHENTICATED = "allAuthenticatedUsers"
DEFAULT_TRAVEL_HOURS = 168
# a job id: letters, digits, underscores and dashes, at most 1,024 characters
# (https://cloud.google.com/bigquery/docs/running-jobs#generate-jobid)
JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,1024}")
# what jobs.query's body may hold (QueryRequest: https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/query):
# the fields the emulator honours, and the ones that change nothing here (it answers at once, caches nothing)
QUERY_REQUEST = {
    "kind", "query", "maxResults", "timeoutMs", "useLegacySql", "parameterMode", "queryParameters", "location",
    "formatOptions", "requestId", "useQueryCache", "labels", "jobCreationMode", "jobTimeoutMs",
}  # fmt: skip
# what a query job's configuration.query may hold here (JobConfigurationQuery:
# https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery)
QUERY_CONFIG = {
    "query", "useLegacySql", "parameterMode", "queryParameters", "useQueryCache", "priority", "destinationTable",
    "writeDisposition", "createDisposition",
}  # fmt: skip

_VIEWER = frozenset({"bigquery.datasets.get", "bigquery.tables.get", "bigquery.tables.getData", "bigquery.tables.list"})
# the Storage Read API's, on the project a read session is created in (roles/bigquery.readSessionUser's; also in
# roles/bigquery.user and roles/bigquery.admin: https://cloud.google.com/bigquery/docs/access-control)
_READ_SESSIONS = frozenset(
    {"bigquery.readsessions.create", "bigquery.readsessions.getData", "bigquery.readsessions.update"}
)
# roles/bigquery.dataEditor: on a dataset it also creates, changes and deletes its tables; on a project it also creates
# datasets ("When applied to a project or organization, this role can also create new datasets",
# https://cloud.google.com/bigquery/docs/access-control#bigquery.dataEditor)
_EDITOR = _VIEWER | {
    "bigquery.tables.create", "bigquery.tables.update", "bigquery.tables.updateData", "bigquery.tables.delete",
    "bigquery.datasets.create",
}  # fmt: skip
# Dataset.access's ``role`` "will accept any of the above formats, but will return only the legacy format": OWNER for
# roles/bigquery.dataOwner, WRITER for roles/bigquery.dataEditor, READER for roles/bigquery.dataViewer
# (https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access).
LEGACY_ROLES = {
    "roles/bigquery.dataOwner": "OWNER", "roles/bigquery.dataEditor": "WRITER", "roles/bigquery.dataViewer": "READER",
}  # fmt: skip
# "If unspecified at dataset creation time, BigQuery adds default dataset access for the following entities":
# projectReaders READER, projectWriters WRITER, projectOwners OWNER, and the creator as OWNER (Dataset.access,
# https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access); the special groups stand
# for the project's viewers, editors and owners ("If you create a dataset in a project that contains any viewers,
# BigQuery grants those users the bigquery.dataViewer predefined role for the new dataset", and editors dataEditor,
# owners dataOwner: https://cloud.google.com/bigquery/docs/access-control-basic-roles). A dataset made by
# datasets.insert without an access list gets these and its creator's entry (``_datasets_insert``); one the tests
# make (``create_dataset``), these alone.
DEFAULT_ACCESS = (
    {"role": "READER", "specialGroup": "projectReaders"},
    {"role": "WRITER", "specialGroup": "projectWriters"},
    {"role": "OWNER", "specialGroup": "projectOwners"},
)
# The special groups of an access list that stand for a basic role's members on the dataset's project
# (Dataset.access.specialGroup, same page), and the one that stands for everyone signed in
BASIC_GROUPS = {"projectReaders": "roles/viewer", "projectWriters": "roles/editor", "projectOwners": "roles/owner"}
SPECIAL_GROUPS = {*BASIC_GROUPS, "allAuthenticatedUsers"}
# The entities of an access entry the emulator keeps (Dataset.access: "[Pick one]" of them); any other (view,
# routine, dataset: authorized resources) is its refusal. A ``domain`` entry holds for every member whose e-mail is
# at that domain ("Any users signed in with the domain specified will be granted the specified access", same page);
# a ``groupByEmail`` entry is kept and listed, and holds for no member: the emulator knows no group's members.
ACCESS_ENTITIES = ("userByEmail", "specialGroup", "iamMember", "domain", "groupByEmail")
# The basic roles on a project, as far as BigQuery's page says what they do there: Viewer "Can start a job in the
# project. Additional dataset roles are required depending on the job type" and "Can list and get all jobs"; Editor
# "Same as Viewer, plus: Can create a new dataset in the project"; Owner "Same as Editor, plus" what the emulator does
# not model (https://cloud.google.com/bigquery/docs/access-control-basic-roles). The data a basic role reaches is that
# of the datasets whose access list names its special group (``BASIC_GROUPS``): a project's role grants none by itself.
_BASIC_VIEWER = frozenset({"bigquery.jobs.create", "bigquery.jobs.list", "bigquery.jobs.get"})
BASIC_ROLES = {
    "roles/viewer": _BASIC_VIEWER,
    "roles/editor": _BASIC_VIEWER | {"bigquery.datasets.create"},
    "roles/owner": _BASIC_VIEWER | {"bigquery.datasets.create"},
}
# role -> the permissions of it that the emulator checks (https://cloud.google.com/bigquery/docs/access-control)
# A table that has or had row access policies is read as of a past time only by whoever holds this (a table admin):
# https://cloud.google.com/bigquery/docs/change-history, "Required permissions";
# https://cloud.google.com/bigquery/docs/using-row-level-security-with-features, "Time travel"
OVERRIDE_TIME_TRAVEL = "bigquery.rowAccessPolicies.overrideTimeTravelRestrictions"
ROLES: dict[str, frozenset[str]] = {
    "roles/bigquery.dataViewer": _VIEWER,
    "roles/bigquery.metadataViewer": frozenset(
        {"bigquery.datasets.get", "bigquery.tables.get", "bigquery.tables.list"}
    ),
    "roles/bigquery.dataEditor": _EDITOR,
    "roles/bigquery.dataOwner": _EDITOR | {"bigquery.rowAccessPolicies.list"},
    "roles/bigquery.jobUser": frozenset({"bigquery.jobs.create"}),
    "roles/bigquery.readSessionUser": _READ_SESSIONS,
    # "When applied to a dataset, this role provides the ability to read the dataset's metadata and list tables in the
    # dataset. When applied to a project, ... allows the creation of new datasets within the project" (access-control)
    "roles/bigquery.user": _READ_SESSIONS
    | {
        "bigquery.jobs.create",
        "bigquery.jobs.list",
        "bigquery.datasets.create",
        "bigquery.datasets.get",
        "bigquery.tables.list",
    },
    "roles/bigquery.admin": _EDITOR
    | _READ_SESSIONS
    | {
        "bigquery.jobs.create",
        "bigquery.jobs.get",
        "bigquery.rowAccessPolicies.list",
        OVERRIDE_TIME_TRAVEL,
    },
    **BASIC_ROLES,
}


def time_travel_forbidden(table_name: str) -> str:
    """The refusal of a read as of a past time (APPENDS, a snapshot time) of a table that has or had row access
    policies, by a caller without ``OVERRIDE_TIME_TRAVEL``: the query service's wording as Fivetran's troubleshooting
    page quotes it (https://fivetran.com/docs/connectors/databases/bigquery/troubleshooting/time-travel-forbidden-error).
    Google's own pages do not quote it; the Storage Read API's wording for the same refusal is in no public source
    found, and is taken to be the same."""
    return (
        f"Access Denied: BigQuery: Time travel on table {table_name} is forbidden as it has (or has had) "
        "row access policies."
    )


# the column types (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#TableFieldSchema): the legacy
# names the REST API answers with, and the GoogleSQL names
LEGACY = {"INT64": "INTEGER", "FLOAT64": "FLOAT", "BOOL": "BOOLEAN"}
STANDARD = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}
TYPES = {"STRING", "INT64", "FLOAT64", "BOOL", "TIMESTAMP", "DATE", "DATETIME"}
# the columns APPENDS adds to the table's: "_CHANGE_TYPE: a STRING value indicating the type of change that produced
# the row. For APPENDS, the only supported value is INSERT"; "_CHANGE_TIMESTAMP: a TIMESTAMP value indicating the
# commit time of the transaction that made the change"
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/time-series-functions#appends)
CHANGE_COLUMNS = (
    {"name": "_CHANGE_TYPE", "type": "STRING", "mode": "NULLABLE"},
    {"name": "_CHANGE_TIMESTAMP", "type": "TIMESTAMP", "mode": "NULLABLE"},
)
ORDERED = {"STRING", "INT64", "FLOAT64", "BOOL", "TIMESTAMP", "DATE", "DATETIME"}
NUMERIC = {"INT64", "FLOAT64"}
TEMPORAL = {"TIMESTAMP", "DATE", "DATETIME"}


class BigQueryError(HttpError):
    """An error in BigQuery's JSON shape: ``{"error": {"code", "message", "errors": [{"message", "domain",
    "reason"}], "status"}}`` (https://cloud.google.com/bigquery/docs/error-messages)."""

    def body(self) -> dict:
        error = super().body()["error"]
        error["status"] = STATUS.get(self.status, "UNKNOWN")
        return {"error": error}


def _entity(who: str) -> dict[str, str]:
    """A member as a Dataset.access entry names it: ``allAuthenticatedUsers`` a ``specialGroup``, an account by its
    email (``userByEmail``)."""
    return {"specialGroup": who} if who == ALL_AUTHENTICATED else {"userByEmail": who.split(":", 1)[1]}


def _access(entries: Any) -> list[dict]:
    """datasets.insert's ``access`` list as the dataset keeps it: each entry a ``role`` (a legacy name, or the
    predefined role it stands for, returned in the legacy name: ``LEGACY_ROLES``) and one entity the emulator keeps
    (``ACCESS_ENTITIES``; a special group of ``SPECIAL_GROUPS``). What BigQuery answers a list with no OWNER ("A
    dataset must have at least one entity with the OWNER role":
    https://cloud.google.com/bigquery/docs/access-control-basic-roles) is not documented, so the emulator has no rule
    for it: such a list is kept as it is."""
    if not isinstance(entries, list):
        raise BigQueryError(400, "Dataset.access is a list of access entries.", "invalid")
    kept = []
    for entry in entries:
        role = LEGACY_ROLES.get(entry.get("role", ""), entry.get("role", ""))
        entities = [k for k in entry if k != "role"]
        if role not in LEGACY_ROLES.values() or len(entities) != 1:
            raise BigQueryError(400, f"Invalid access entry {entry}: a role and one entity", "invalid")
        (kind,) = entities
        if kind not in ACCESS_ENTITIES:
            raise _unsupported(f"an access entry of {kind}")
        if kind == "specialGroup" and entry[kind] not in SPECIAL_GROUPS:
            raise BigQueryError(400, f"Invalid special group {entry[kind]!r}", "invalid")
        kept.append({"role": role, kind: entry[kind]})
    return kept


def _denied(message: str) -> BigQueryError:
    return BigQueryError(403, message, "accessDenied")


def _not_found(message: str) -> BigQueryError:
    return BigQueryError(404, message, "notFound")


def _invalid(message: str) -> BigQueryError:
    return BigQueryError(400, message, "invalidQuery")


def _unsupported(what: str, where: str = "") -> BigQueryError:
    return _invalid(
        f"{what} is not supported by the emulator{where} (tests/emulators/bigquery.py reads a subset of SQL)"
    )


def _micros(at: datetime | None, clock: Callable[[], float]) -> int:
    if at is None:
        return int(clock() * 1_000_000)
    if at.tzinfo is None:
        raise ValueError(f"{at!r} has no time zone")
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _datetime(micros: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


def _iso(micros: int) -> str:
    return _datetime(micros).isoformat().replace("+00:00", "Z")


# ---------------------------------------------------------------------------------------------------- values
def parse_value(kind: str, value: Any) -> Any:
    """``value`` (a Python value or its string form) as the emulator keeps a ``kind`` value: TIMESTAMP as
    microseconds since the epoch, DATE a date, DATETIME a naive datetime; ValueError when it is not one. Timestamps
    are read in GoogleSQL's canonical form, ``YYYY-MM-DD[( |T)HH:MM:SS[.F]][time zone]``, UTC when none is given
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/data-types#timestamp_type)."""
    if value is None:
        return None
    try:
        converted = _converted(kind, value)
    except (TypeError, ValueError):
        converted = None
    if converted is None:
        raise ValueError(f"{value!r} is not a {kind} value")
    return converted


def _converted(kind: str, value: Any) -> Any:
    if kind == "STRING" and isinstance(value, str):
        return value
    if kind == "INT64" and not isinstance(value, bool | float):
        return int(value)
    if kind == "FLOAT64" and not isinstance(value, bool):
        return float(value)
    if kind == "BOOL":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    if kind == "TIMESTAMP":
        if isinstance(value, str):
            value = datetime.fromisoformat(re.sub(r"\s*UTC$", "+00:00", value.strip()))
        if isinstance(value, datetime):
            return _micros(value if value.tzinfo else value.replace(tzinfo=UTC), time.time)
    if kind == "DATETIME":
        if isinstance(value, str):
            value = datetime.fromisoformat(value.strip())
        if isinstance(value, datetime) and value.tzinfo is None:
            return value
    if kind == "DATE":
        if isinstance(value, str):
            return date.fromisoformat(value.strip())
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
    return None


def encode_cell(kind: str, value: Any, int64_timestamp: bool) -> Any:
    """A value as the REST API answers it in a row (``{"v": ...}``): a string, or None for NULL."""
    if value is None:
        return None
    if kind == "BOOL":
        return "true" if value else "false"
    if kind == "TIMESTAMP":
        return str(value) if int64_timestamp else repr(value / 1_000_000)
    if kind in ("DATE", "DATETIME"):
        return value.isoformat()
    if kind == "FLOAT64":
        return repr(float(value))
    return str(value)


def _result_row(types: list[str], values: list, int64_timestamp: bool) -> dict:
    """A result row as the REST API answers it: ``{"f": [{"v": ...}]}``."""
    return {"f": [{"v": encode_cell(k, v, int64_timestamp)} for k, v in zip(types, values, strict=True)]}


# ---------------------------------------------------------------------------------------------------- SQL
# GoogleSQL's tokens that the subset uses (https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical):
# quoted identifiers in backticks, string literals in single or double quotes with backslash escapes, numbers, named
# query parameters (@name: https://cloud.google.com/bigquery/docs/parameterized-queries), names and operators
_TOKEN = re.compile(
    r"\s*(?:(?P<quoted>`(?:[^`\\]|\\.)+`)|(?P<string>'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")"
    r"|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<param>@[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=|>=|<>|!=|[=<>(),*.;]))"
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "`": "`"}
COMPARISONS = {"=", "!=", "<>", "<", "<=", ">", ">="}


@dataclass
class Token:
    kind: str  # quoted, string, number, param, name, op, end
    text: str
    offset: int

    def word(self) -> str:
        return self.text.upper() if self.kind == "name" else ""


def _unescape(body: str) -> str:
    """A literal's or quoted name's body with its escape sequences read: ``\\uXXXX`` and the single characters
    (https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical#escape_sequences)."""
    return re.sub(
        r"\\(u[0-9A-Fa-f]{4}|.)",
        lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 5 else _ESCAPES.get(m[1], m[1]),
        body,
    )


class Query:
    """One query of the subset, parsed: ``select`` (None for ``*``: [(kind, argument, alias, offset)] otherwise),
    ``table`` (its path and offset), ``as_of``, ``where`` (expressions: nested tuples) and ``limit``."""

    def __init__(self, sql: str):
        self.sql = sql
        self.tokens = self._tokens(sql)
        self.i = 0
        self.appends: tuple | None = None
        self.select = self._select()
        self.table, self.table_offset = self._table()
        self.as_of = self._expression() if self._words("FOR", "SYSTEM_TIME", "AS", "OF") else None
        self.where = self._expression() if self._words("WHERE") else None
        self.limit = self._limit() if self._words("LIMIT") else None
        self._accept("op", ";")
        if self.peek().kind != "end":
            raise self._unexpected(self.peek())

    @classmethod
    def restriction(cls, text: str) -> Query:
        """A read session's ``row_restriction`` ("SQL text filtering statement, similar to a WHERE clause in a query",
        TableReadOptions, google/cloud/bigquery/storage/v1/stream.proto), parsed as a WHERE clause's condition:
        ``where`` (None for an empty one)."""
        q = cls.__new__(cls)
        q.sql, q.tokens, q.i = text, q._tokens(text), 0
        q.select, q.table, q.table_offset, q.as_of, q.appends, q.limit = None, [], 0, None, None, None
        q.where = q._expression() if q.peek().kind != "end" else None
        if q.peek().kind != "end":
            raise q._unexpected(q.peek())
        return q

    def at(self, offset: int) -> str:
        """BigQuery's position of an error: `` at [line:column]``, both from 1."""
        line = self.sql.count("\n", 0, offset) + 1
        return f" at [{line}:{offset - (self.sql.rfind(chr(10), 0, offset) + 1) + 1}]"

    def _tokens(self, sql: str) -> list[Token]:
        tokens, offset = [], 0
        while offset < len(sql):
            m = _TOKEN.match(sql, offset)
            if not m or not m.lastgroup:
                if not sql[offset:].strip():
                    break
                start = len(sql) - len(sql[offset:].lstrip())
                if sql[start] in "'\"":
                    raise _invalid(f"Syntax error: Unclosed string literal{self.at(start)}")
                raise _unsupported(f"{sql[start:].split()[0][:10]!r}", self.at(start))
            tokens.append(Token(m.lastgroup, m[m.lastgroup], m.start(m.lastgroup)))
            offset = m.end()
        return [*tokens, Token("end", "", len(sql))]

    def peek(self) -> Token:
        return self.tokens[self.i]

    def _next(self) -> Token:
        token = self.tokens[self.i]
        if token.kind == "end":
            raise _invalid(f"Syntax error: Unexpected end of script{self.at(token.offset)}")
        self.i += 1
        return token

    def _accept(self, kind: str, text: str) -> bool:
        token = self.peek()
        if token.kind == kind and (token.word() or token.text) == text:
            self.i += 1
            return True
        return False

    def _words(self, *words: str) -> bool:
        if self.peek().word() != words[0]:
            return False
        for word in words:
            token = self._next()
            if token.word() != word:
                raise self._unexpected(token)
        return True

    def _expect(self, text: str) -> None:
        token = self._next()
        if (token.word() or token.text) != text:
            raise self._unexpected(token)

    def _unexpected(self, token: Token) -> BigQueryError:
        if token.kind == "end":
            return _invalid(f"Syntax error: Unexpected end of script{self.at(token.offset)}")
        if token.text == ")":
            return _invalid(f'Syntax error: Unexpected ")"{self.at(token.offset)}')
        return _unsupported(f"{token.text!r} here", self.at(token.offset))

    def _select(self) -> list | None:
        self._expect("SELECT")
        if self._accept("op", "*"):
            self._expect("FROM")
            return None
        items = []
        while True:
            token = self.peek()
            word = token.word()
            if word in ("COUNT", "COUNTIF", "MAX", "MIN") and self.tokens[self.i + 1].text == "(":
                self.i += 2
                if word == "COUNT":
                    self._expect("*")
                    argument = None
                else:
                    argument = self._expression()
                self._expect(")")
                kind = word.lower()
            else:
                argument, kind = self._primary(), "column"
                if argument[0] != "column":
                    raise _unsupported(
                        "a SELECT item other than a column, COUNT(*), COUNTIF, MAX or MIN", self.at(token.offset)
                    )
            alias = self._name().text.strip("`") if self._words("AS") else ""
            items.append((kind, argument, alias, token.offset))
            if not self._accept("op", ","):
                break
        self._expect("FROM")
        return items

    def _name(self) -> Token:
        token = self._next()
        if token.kind not in ("name", "quoted"):
            raise self._unexpected(token)
        return token

    def _table(self) -> tuple[list[str], int]:
        """The FROM's table: a path, or ``APPENDS(TABLE path[, start[, end]])`` (``appends``: its two bounds,
        NULL where left out: https://cloud.google.com/bigquery/docs/reference/standard-sql/time-series-functions#appends,
        "start_timestamp DEFAULT NULL, end_timestamp DEFAULT NULL")."""
        if self.peek().word() != "APPENDS" or self.tokens[self.i + 1].text != "(":
            return self._path()
        self.i += 2
        self._expect("TABLE")
        path, offset = self._path()
        bounds = []
        while len(bounds) < 2 and self._accept("op", ","):
            bounds.append(self._expression())
        self._expect(")")
        null = ("literal", "NULL", None, offset)
        self.appends = (*bounds, null, null)[:2]
        return path, offset

    def _path(self) -> tuple[list[str], int]:
        first = self._name()
        parts = [_unescape(first.text[1:-1]) if first.kind == "quoted" else first.text]
        while self._accept("op", "."):
            token = self._name()
            parts.append(_unescape(token.text[1:-1]) if token.kind == "quoted" else token.text)
        path = ".".join(parts)
        # a domain-scoped project ("example.com:project") holds dots: the table and the dataset are the last parts
        names = path.rsplit(".", 2)
        if len(names) < 2:
            raise _unsupported("a table without its dataset", self.at(first.offset))
        return names, first.offset

    def _limit(self) -> int:
        token = self._next()
        if token.kind != "number" or not token.text.isdigit():
            raise _unsupported("a LIMIT other than an integer literal", self.at(token.offset))
        return int(token.text)

    # expressions: ("or"|"and", left, right), ("not", e), ("cmp", op, left, right, offset), ("is", e, what, negated),
    # ("in", e, [items], negated, offset), ("column", name, offset), ("param", name, offset),
    # ("literal", type, value, offset): the literal's value as written (a string, for a typed literal)
    def _keyword(self, word: str) -> bool:
        if self.peek().word() == word:
            self.i += 1
            return True
        return False

    def _expression(self) -> tuple:
        left = self._conjunction()
        while self._keyword("OR"):
            left = ("or", left, self._conjunction())
        return left

    def _conjunction(self) -> tuple:
        left = self._negation()
        while self._keyword("AND"):
            left = ("and", left, self._negation())
        return left

    def _negation(self) -> tuple:
        return ("not", self._negation()) if self._keyword("NOT") else self._comparison()

    def _comparison(self) -> tuple:
        left = self._primary()
        token = self.peek()
        if token.kind == "op" and token.text in COMPARISONS:
            self.i += 1
            return ("cmp", token.text, left, self._primary(), token.offset)
        if token.word() == "IS":
            self.i += 1
            negated = self.peek().word() == "NOT" and self._words("NOT")
            what = self._next()
            if what.word() not in ("NULL", "TRUE", "FALSE"):
                raise self._unexpected(what)
            return ("is", left, what.word(), negated, token.offset)
        negated = token.word() == "NOT" and self.tokens[self.i + 1].word() == "IN" and self._words("NOT")
        if self.peek().word() == "IN":
            self.i += 1
            self._expect("(")
            items = [self._primary()]
            while self._accept("op", ","):
                items.append(self._primary())
            self._expect(")")
            return ("in", left, items, negated, token.offset)
        return left

    def _primary(self) -> tuple:
        token = self._next()
        word = token.word()
        if token.text == "(" and token.kind == "op":
            inner = self._expression()
            self._expect(")")
            return inner
        if token.kind == "string":
            return ("literal", "STRING", _unescape(token.text[1:-1]), token.offset)
        if token.kind == "number":
            kind = "INT64" if token.text.isdigit() else "FLOAT64"
            return ("literal", kind, int(token.text) if kind == "INT64" else float(token.text), token.offset)
        if token.kind == "param":
            return ("param", token.text[1:], token.offset)
        if word in ("TRUE", "FALSE"):
            return ("literal", "BOOL", word == "TRUE", token.offset)
        if word == "NULL":
            return ("literal", "NULL", None, token.offset)
        if word == "CAST" and self.peek().text == "(":  # CAST('text' AS TYPE), a string literal's only
            # (https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_functions#cast)
            self.i += 1
            literal = self._next()
            if literal.kind != "string":
                raise _unsupported("CAST of anything but a string literal", self.at(literal.offset))
            self._expect("AS")
            name = self._next().text.upper()
            kind = STANDARD.get(name, name)
            self._expect(")")
            if kind not in TYPES:
                raise _unsupported(f"CAST to {name}", self.at(token.offset))
            text = _unescape(literal.text[1:-1])
            try:
                return ("literal", kind, parse_value(kind, text), token.offset)
            except ValueError:
                raise _invalid(f'Could not cast literal "{text}" to type {kind}{self.at(literal.offset)}') from None
        if word in TEMPORAL and self.peek().kind == "string":
            text = _unescape(self._next().text[1:-1])
            try:
                return ("literal", word, parse_value(word, text), token.offset)
            except ValueError:
                raise _invalid(f"Invalid {word} literal{self.at(token.offset)}") from None
        if token.kind in ("name", "quoted") and self.peek().text not in ("(", "."):
            if token.kind == "name" and word in RESERVED:
                raise self._unexpected(token)
            return ("column", _unescape(token.text[1:-1]) if token.kind == "quoted" else token.text, token.offset)
        raise self._unexpected(token)


# GoogleSQL's reserved keywords that the subset could meet where a column is expected
# (https://cloud.google.com/bigquery/docs/reference/standard-sql/lexical#reserved_keywords)
RESERVED = {"SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "IS", "IN", "AS", "FOR", "LIMIT", "NULL", "TRUE", "FALSE"}


class Compiled:
    """A query's expressions resolved against a table's columns (name -> (index, type)) and the parameters (name ->
    (type, value)): ``compile(e)`` gives the expression's type and a function of a row (a list of values) that
    evaluates it, with GoogleSQL's NULL semantics (a comparison with NULL is NULL; AND, OR and NOT are three-valued;
    WHERE keeps the rows where the condition is TRUE)."""

    def __init__(self, query: Query, columns: dict[str, tuple[int, str]], params: dict[str, tuple[str, Any]]):
        self.query, self.columns, self.params = query, columns, params

    def condition(self, expression: tuple, clause: str) -> Callable[[list], Any]:
        kind, fn = self.compile(expression)
        if kind not in ("BOOL", "NULL"):
            raise _invalid(f"{clause} clause should return type BOOL, but returns {kind}")
        return fn

    def compile(self, e: tuple) -> tuple[str, Callable[[list], Any]]:
        at = self.query.at
        if e[0] == "literal":
            value = e[2]
            return e[1], lambda row: value
        if e[0] == "column":
            found = self.columns.get(e[1].lower())
            if found is None:
                raise _invalid(f"Unrecognized name: {e[1]}{at(e[2])}")
            index, kind = found
            return kind, lambda row: row[index]
        if e[0] == "param":
            if e[1].lower() not in self.params:
                raise _invalid(f"Query parameter '{e[1]}' not found{at(e[2])}")
            kind, value = self.params[e[1].lower()]
            return kind, lambda row: value
        if e[0] in ("and", "or"):
            return "BOOL", self._logical(e)
        if e[0] == "not":
            inner = self._boolean(e[1], "NOT")
            return "BOOL", lambda row: None if (v := inner(row)) is None else not v
        if e[0] == "is":
            kind, fn = self.compile(e[1])
            if e[2] != "NULL" and kind not in ("BOOL", "NULL"):
                raise _invalid(f"No matching signature for operator IS {e[2]} for argument types: {kind}{at(e[4])}")
            wanted = {"NULL": None, "TRUE": True, "FALSE": False}[e[2]]
            return "BOOL", lambda row: (fn(row) is wanted) != e[3]
        if e[0] == "cmp":
            return "BOOL", self._comparison(e[1], e[2], e[3], e[4])
        if e[0] == "in":
            tests = [self._comparison("=", e[1], item, e[4]) for item in e[2]]
            return "BOOL", lambda row: self._any(tests, row, e[3])
        raise _unsupported(f"the expression {e[0]}")

    @staticmethod
    def _any(tests: list, row: list, negated: bool) -> bool | None:
        found = [test(row) for test in tests]
        result = True if True in found else None if None in found else False
        return result if result is None or not negated else not result

    def _boolean(self, e: tuple, operator: str) -> Callable[[list], Any]:
        kind, fn = self.compile(e)
        if kind not in ("BOOL", "NULL"):
            raise _invalid(f"No matching signature for operator {operator} for argument types: {kind}")
        return fn

    def _logical(self, e: tuple) -> Callable[[list], Any]:
        left, right = self._boolean(e[1], e[0].upper()), self._boolean(e[2], e[0].upper())
        absorbing = e[0] == "or"  # TRUE decides an OR, FALSE an AND

        def fn(row: list) -> Any:
            values = (left(row), right(row))
            if absorbing in values:
                return absorbing
            return None if None in values else not absorbing

        return fn

    def _comparison(self, op: str, left: tuple, right: tuple, offset: int) -> Callable[[list], Any]:
        (lk, lf), (rk, rf) = self._coerced(left, right), self._coerced(right, left)
        comparable = "NULL" in (lk, rk) or lk == rk or {lk, rk} <= NUMERIC
        if not comparable or (op not in ("=", "!=", "<>") and not {lk, rk} <= ORDERED | {"NULL"}):
            raise _invalid(
                f"No matching signature for operator {op} for argument types: {lk}, {rk}. "
                f"Supported signature: ANY {op} ANY{self.query.at(offset)}"
            )
        compare = {
            "=": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            "<>": lambda a, b: a != b,
            "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b,
            ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b,
        }[op]

        def fn(row: list) -> Any:
            a, b = lf(row), rf(row)
            return None if a is None or b is None else compare(a, b)

        return fn

    def _coerced(self, e: tuple, other: tuple) -> tuple[str, Callable[[list], Any]]:
        """``e`` compiled; a string literal compared with a TIMESTAMP, DATE or DATETIME is read as one (a literal
        coercion: https://cloud.google.com/bigquery/docs/reference/standard-sql/conversion_rules#coercion)."""
        kind, fn = self.compile(e)
        other_kind = self.compile(other)[0]
        if e[0] == "literal" and kind == "STRING" and other_kind in TEMPORAL:
            try:
                value = parse_value(other_kind, e[2])
            except ValueError:
                raise _invalid(f'Could not cast literal "{e[2]}" to type {other_kind}{self.query.at(e[3])}') from None
            return other_kind, lambda row: value
        return kind, fn


def _bound(compiled: Compiled, e: tuple, q: Query) -> int | None:
    """One of APPENDS' bounds: a TIMESTAMP (microseconds) or NULL (None)."""
    kind, fn = compiled.compile(e)
    if kind not in ("TIMESTAMP", "NULL"):
        raise _invalid(f"APPENDS takes a TIMESTAMP, not {kind}{q.at(e[-1])}")
    return fn([])


def _count_true(test: Callable[[list], Any], rows: list[list]) -> int:
    return sum(test(r) is True for r in rows)


def _extreme(pick: Callable, get: Callable[[list], Any], rows: list[list]) -> Any:
    """MAX or MIN of ``get`` over ``rows``, NULLs ignored; NULL when none is left."""
    return pick((v for r in rows if (v := get(r)) is not None), default=None)


# ---------------------------------------------------------------------------------------------------- state
@dataclass
class Version:
    """One version of a row: its values (column order), from ``start`` until ``end`` (microseconds; None: current)."""

    values: list
    start: int
    end: int | None = None
    appended: bool = True  # made by an insert (APPENDS' change history), not by an update

    def visible(self, at: int) -> bool:
        return self.start <= at and (self.end is None or at < self.end)


@dataclass
class Table:
    schema: list[dict]  # [{"name", "type" (GoogleSQL name), "mode"}]
    created: int
    versions: list[Version] = field(default_factory=list)
    modified: int = 0
    # tables.get's ``type``: TABLE, VIEW, MATERIALIZED_VIEW, EXTERNAL, ... ("Output only. Describes the table type",
    # https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table.FIELDS.type); a view's rows here are
    # those its query would give, which only a query reads (the Storage Read API refuses it: bigquery_storage.py)
    type: str = "TABLE"
    # Who may read it besides the grants: a query's destination table is its job's creator's
    # (``BigQueryEmulator._destination``)
    readers: set = field(default_factory=set)
    row_policies: bool = False  # it has or had row access policies (OVERRIDE_TIME_TRAVEL)
    policies: list = field(default_factory=list)  # the ids of its row access policies now
    expires: int | None = None  # its expirationTime (microseconds): past it, it is deleted (``_sweep``)


@dataclass
class Dataset:
    location: str
    travel_hours: int
    created: int
    tables: dict[str, Table] = field(default_factory=dict)
    default_expiration_ms: int | None = None  # defaultTableExpirationMs: a new table's life
    labels: dict[str, str] = field(default_factory=dict)
    # its access list as made (``DEFAULT_ACCESS`` unless datasets.insert named one), each entry's role in its legacy
    # name; ``grant`` adds its grants beside it
    access: list[dict] = field(default_factory=lambda: [dict(entry) for entry in DEFAULT_ACCESS])


@dataclass
class Job:
    project: str
    job_id: str
    location: str
    resource: dict
    member: str | None  # who created it (None: the owner)
    fields: list[dict] = field(default_factory=list)  # the result's schema
    types: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    error: BigQueryError | None = None


class BigQueryEmulator(HttpEmulator):
    def __init__(
        self,
        token: Any = "",
        clock: Callable[[], float] = time.time,
        page_bytes: int = PAGE_BYTES,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        issuer: TokenIssuer | None = None,
    ):
        super().__init__()
        self.token = token  # a static token or a TokenIssuer: the owner's
        # where the members' tokens are known for what they are (``token_for``): ``issuer``, else ``token`` when it
        # is a TokenIssuer
        self.issuer = issuer if issuer is not None else (token if isinstance(token, TokenIssuer) else None)
        self.clock = clock  # seconds since the epoch
        self.page_bytes = page_bytes
        self.max_response_bytes = max_response_bytes  # a result without a destination table, at most (``_anonymous``)
        self.datasets: dict[tuple[str, str], Dataset] = {}
        self.jobs: dict[tuple[str, str], Job] = {}
        self.requests: dict[str, tuple[str, str]] = {}  # jobs.query requestId -> (project, job id)
        self.grants: dict[str, set[tuple[str, str]]] = {}  # member -> {(role, "P" | "P.D" | "P.D.T")}
        # member -> (role, "P.D", {"title", "expression"}) of each grant on a dataset under an IAM condition
        self.conditional_grants: dict[str, list[tuple[str, str, dict[str, str]]]] = {}
        self.calls: list[str] = []  # REST methods, in order
        self.authorizations: list[str | None] = []  # each request's Authorization header (None: none)
        self.bodies: list[tuple[str, dict, dict]] = []  # (method, query string, body) of each call
        self.faults: list[Fault] = []
        self._identities: dict[str, str] = {}  # token -> member
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ the tests' side
    def create_dataset(
        self,
        dataset: str,
        *,
        location: str = "US",
        max_time_travel_hours: int = DEFAULT_TRAVEL_HOURS,
        default_table_expiration_ms: int | None = None,
        access: list[dict] | None = None,
        at=None,
    ) -> None:
        """``P.D``, with BigQuery's default access list but no creator's entry (``DEFAULT_ACCESS``), or ``access``
        (entries as datasets.insert takes them: ``_access``); the time travel window is 48 to 168 hours, a multiple of
        24 (``TRAVEL_HOURS``); ``default_table_expiration_ms`` its ``defaultTableExpirationMs``."""
        if max_time_travel_hours not in TRAVEL_HOURS:
            raise ValueError(f"maxTimeTravelHours {max_time_travel_hours} is not 48 to 168 in steps of 24")
        project, name = dataset.rsplit(".", 1)
        with self._lock:
            self.datasets[(project, name)] = Dataset(
                location,
                max_time_travel_hours,
                _micros(at, self.clock),
                default_expiration_ms=default_table_expiration_ms,
                **({"access": _access(access)} if access is not None else {}),
            )

    def create_table(
        self,
        table: str,
        schema: Sequence[tuple[str, str] | tuple[str, str, str]],
        *,
        at=None,
        table_type: str = "TABLE",
    ) -> None:
        """``P.D.T`` with columns ``(name, type[, mode])`` (mode NULLABLE or REQUIRED); its dataset is created (in
        US) when there is none. ``table_type``: its tables.get ``type`` (``VIEW``, ``MATERIALIZED_VIEW``,
        ``EXTERNAL``)."""
        project, dataset, name = table.rsplit(".", 2)
        fields = []
        for column in schema:
            kind = STANDARD.get(column[1].upper(), column[1].upper())
            mode = column[2] if len(column) > 2 else "NULLABLE"
            if kind not in TYPES or mode not in ("NULLABLE", "REQUIRED"):
                raise ValueError(f"column {column}: the emulator keeps {sorted(TYPES)}, NULLABLE or REQUIRED")
            fields.append({"name": column[0], "type": kind, "mode": mode})
        with self._lock:
            if (project, dataset) not in self.datasets:
                self.create_dataset(f"{project}.{dataset}", at=at)
            created = _micros(at, self.clock)
            self.datasets[(project, dataset)].tables[name] = Table(fields, created, modified=created, type=table_type)

    def add_row_access_policy(self, table: str) -> None:
        """``table`` has (and from now on had) a row access policy: read as of a past time by table admins alone
        (``OVERRIDE_TIME_TRAVEL``). Which rows a policy lets whom read is not emulated."""
        with self._lock:
            t = self._table_of(table)
            t.row_policies = True
            t.policies.append(f"policy_{len(t.policies) + 1}")

    def drop_table(self, table: str) -> None:
        with self._lock:
            project, dataset, name = table.rsplit(".", 2)
            del self.datasets[(project, dataset)].tables[name]

    def insert(self, table: str, rows: Iterable[dict], *, at=None) -> None:
        """New rows, current from ``at`` (now by default)."""
        with self._lock:
            t = self._table_of(table)
            start = _micros(at, self.clock)
            if start < t.created:
                raise ValueError(f"{table} was created after {_iso(start)}")
            t.versions += [Version(self._values(t, row), start) for row in rows]
            t.modified = max(t.modified, start)

    def update(self, table: str, where: Callable[[dict], bool], changes: dict, *, at=None) -> int:
        """The current rows for which ``where(row)`` holds get ``changes`` from ``at``: how many."""
        with self._lock:
            t = self._table_of(table)
            now = _micros(at, self.clock)
            changed = [v for v in t.versions if v.end is None and where(self._row(t, v.values))]
            replaced = self._values(t, changes, partial=True)
            for version in changed:
                version.end = now
                values = [replaced.get(i, value) for i, value in enumerate(version.values)]
                t.versions.append(Version(values, now, appended=False))
            t.modified = max(t.modified, now)
            return len(changed)

    def delete(self, table: str, where: Callable[[dict], bool], *, at=None) -> int:
        """The current rows for which ``where(row)`` holds end at ``at``: how many."""
        with self._lock:
            t = self._table_of(table)
            now = _micros(at, self.clock)
            gone = [v for v in t.versions if v.end is None and where(self._row(t, v.values))]
            for version in gone:
                version.end = now
            t.modified = max(t.modified, now)
            return len(gone)

    def grant(self, member: str, role: str, resource: str, condition: dict[str, str] | None = None) -> None:
        """``member`` gets ``role`` on ``resource``: a project ``P``, a dataset ``P.D`` or a table ``P.D.T`` (a basic
        role, ``BASIC_ROLES``, on a project only: "BigQuery supports IAM basic roles for project-level access",
        https://cloud.google.com/bigquery/docs/access-control-basic-roles). With
        ``condition`` (``{"title", "expression"}``, a dataset only) it is an access entry with that IAM condition
        (Dataset.access's ``condition``: "If CEL expression in this field is true, this access binding will be
        considered", https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access), which
        datasets.get lists and which allows nothing here: the emulator evaluates no BigQuery condition, and refuses
        rather than guess what one grants."""
        if role not in ROLES:
            raise ValueError(f"{role}: the emulator knows {sorted(ROLES)}")
        if role in BASIC_ROLES and "." in resource:
            raise ValueError(f"{role} is a basic role, granted on a project, not {resource}")
        if condition and resource.count(".") != 1:
            raise ValueError(f"{resource}: a conditional grant here is on a dataset, P.D")
        with self._lock:
            if condition:
                self.conditional_grants.setdefault(member, []).append((role, resource, condition))
            else:
                self.grants.setdefault(member, set()).add((role, resource))

    def token_for(self, member: str) -> str:
        """A bearer token that acts as ``member`` (``user:...`` or ``serviceAccount:...``); with an ``issuer``, its
        token information there names the member's e-mail (``TokenIssuer.identify``), as Google's does for an
        account's token."""
        if not re.fullmatch(r"(?:user|serviceAccount):[^@\s]+@\S+", member):
            raise ValueError(f"{member!r} is not a principal a token can act as")
        token = f"ya29.emulated-member-{secrets.token_hex(12)}"
        with self._lock:
            self._identities[token] = member
        if self.issuer is not None:
            self.issuer.identify(token, member.split(":", 1)[1])
        return token

    def fail(
        self,
        method: str,
        status: int,
        reason: str = "",
        message: str = "",
        times: int = 1,
        when: Callable[[dict], bool] = lambda request: True,
    ) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` (given ``{"path": {...}, "query": {...},
        "body": {...}}``) answer HTTP ``status`` with ``errors[0].reason`` ``reason``."""
        reason = reason or BIGQUERY_REASONS.get(status, "error")
        self.faults.append(Fault(method, status, reason, message or f"Injected {status}.", times, when))

    def _table_of(self, table: str) -> Table:
        project, dataset, name = table.rsplit(".", 2)
        return self.datasets[(project, dataset)].tables[name]

    @staticmethod
    def _values(t: Table, row: dict, partial: bool = False) -> Any:
        """``row``'s values in column order (``partial``: {index: value} of the columns it names)."""
        unknown = set(row) - {c["name"] for c in t.schema}
        if unknown:
            raise ValueError(f"no such columns: {sorted(unknown)}")
        values = {}
        for i, column in enumerate(t.schema):
            if partial and column["name"] not in row:
                continue
            values[i] = parse_value(column["type"], row.get(column["name"]))
            if values[i] is None and column["mode"] == "REQUIRED":
                raise ValueError(f"{column['name']} is REQUIRED")
        return values if partial else list(values.values())

    @staticmethod
    def _row(t: Table, values: list) -> dict:
        """A row as the tests' ``where`` sees it: a TIMESTAMP as a datetime in UTC."""
        return {
            c["name"]: _datetime(v) if c["type"] == "TIMESTAMP" and v is not None else v
            for c, v in zip(t.schema, values, strict=True)
        }

    # ------------------------------------------------------------------ HTTP
    def _serve(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple:
        url = urlsplit(http.path)
        path = unquote(url.path)
        for verb, pattern, name in ROUTES:
            m = pattern.fullmatch(path.removeprefix(PREFIX)) if path.startswith(PREFIX) else None
            if m and verb == http.command:
                method, args = name, m.groupdict()
                break
        else:
            raise _not_found(f"Not found: {http.command} {url.path}")
        query = dict(parse_qsl(url.query))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise BigQueryError(400, "Invalid JSON payload received.", "invalid") from None
        auth = http.headers.get("Authorization")
        with self._lock:
            self.calls.append(method)
            self.authorizations.append(auth)
            self.bodies.append((method, query, body))
            member = self._identities.get((auth or "").removeprefix("Bearer "))
        if member is None and self.token and not authorized(self.token, auth):
            # https://cloud.google.com/bigquery/docs/error-messages: authError, "invalid credentials"
            raise BigQueryError(401, "Request had invalid authentication credentials.", "authError")
        fault = take_fault(self.faults, self._lock, method, {"path": args, "query": query, "body": body})
        if fault:
            raise BigQueryError(fault.status, fault.message, fault.reason)
        with self._lock:
            self._sweep()
            handler = getattr(self, "_" + method.replace(".", "_"))
            try:
                answer = handler(member, args, query, body)
                return (204, None) if answer is None else (200, answer)
            except HttpError:
                raise
            except Exception as exc:  # noqa: BLE001 - the emulator's own bug: a reason the client does not retry
                detail = "".join(traceback.format_exception(exc))
                raise BigQueryError(500, f"The emulator failed: {detail}", "emulatorError") from None

    def _sweep(self) -> None:
        """Delete every table whose expirationTime has passed on the emulator's clock, as BigQuery does: "Expired
        tables will be deleted and their storage reclaimed" (Table.expirationTime,
        https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table.FIELDS.expiration_time); from then on
        it is not found. Called with the lock held, before each request (the Storage Read API's too)."""
        now = _micros(None, self.clock)
        for d in self.datasets.values():
            for name in [name for name, t in d.tables.items() if t.expires is not None and t.expires <= now]:
                del d.tables[name]

    def _allowed(self, member: str | None, permission: str, project: str, dataset: str = "", table: str = "") -> bool:
        """The owner is allowed everything; a member what a grant on the resource, or on the dataset or project that
        holds it, gives, or an entry of the dataset's access list that holds for it (``_entry_roles``)."""
        if member is None:
            return True
        scopes = {project, f"{project}.{dataset}", f"{project}.{dataset}.{table}"}
        # allAuthenticatedUsers: "all service accounts and all users on the internet who have signed in with a Google
        # Account" (https://cloud.google.com/iam/docs/principals-overview#all-authenticated-users): every member here
        grants = self.grants.get(member, set()) | self.grants.get(ALL_AUTHENTICATED, set())
        if any(permission in ROLES[role] and scope in scopes for role, scope in grants):
            return True
        d = self.datasets.get((project, dataset)) if dataset else None
        return d is not None and any(permission in ROLES[role] for role in self._entry_roles(member, project, d))

    def _entry_roles(self, member: str, project: str, d: Dataset) -> list[str]:
        """The roles the entries of ``d``'s access list give ``member`` (the module's docstring): its own
        (``userByEmail``, ``iamMember``), its e-mail's domain's (``domain``), everyone's (``allAuthenticatedUsers``),
        and its basic role's on ``project`` (``BASIC_GROUPS``), each as the predefined role its legacy name stands for
        (``LEGACY_ROLES``)."""
        email = member.split(":", 1)[1].lower()
        basic = {role for role, scope in self.grants.get(member, set()) if scope == project and role in BASIC_ROLES}
        legacy = {name: role for role, name in LEGACY_ROLES.items()}
        held = []
        for entry in d.access:
            group = entry.get("specialGroup", "")
            if (
                entry.get("userByEmail", "").lower() == email
                or entry.get("iamMember") == member
                or entry.get("domain", "").lower() == email.rpartition("@")[2]
                or group == ALL_AUTHENTICATED
                or BASIC_GROUPS.get(group) in basic
            ):
                held.append(legacy.get(entry["role"], entry["role"]))
        return held

    def _tables_get(self, member, args, query, body) -> dict:
        return self._table_resource(*self._found(member, "bigquery.tables.get", args), args)

    def _found(self, member, permission: str, args: dict) -> tuple[Dataset, Table]:
        """The dataset and the table ``args`` names, once ``member`` holds ``permission`` on it; BigQuery's refusal
        ("Permission ... denied on table ... (or it may not exist)") or its Not found otherwise."""
        project, dataset, table = args["project"], args["dataset"], args["table"]
        name = f"{project}:{dataset}.{table}"
        if not self._allowed(member, permission, project, dataset, table):
            raise _denied(
                f"Access Denied: Table {name}: Permission {permission} denied on table {name} (or it may not exist)."
            )
        d = self.datasets.get((project, dataset))
        if d is None:
            raise _not_found(f"Not found: Dataset {project}:{dataset}")
        t = d.tables.get(table)
        if t is None:
            raise _not_found(f"Not found: Table {name}")
        return d, t

    def _table_resource(self, d: Dataset, t: Table, args: dict) -> dict:
        """The Table resource (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables#Table), its
        ``expirationTime`` (milliseconds, as a string) when it has one."""
        project, dataset, table = args["project"], args["dataset"], args["table"]
        name = f"{project}:{dataset}.{table}"
        now = _micros(None, self.clock)
        resource = {
            "kind": "bigquery#table",
            "etag": base64.b64encode(str(t.modified).encode()).decode(),
            "id": name,
            "selfLink": f"{self.endpoint}{PREFIX}/projects/{project}/datasets/{dataset}/tables/{table}",
            "tableReference": {"projectId": project, "datasetId": dataset, "tableId": table},
            "schema": {"fields": [{**c, "type": LEGACY.get(c["type"], c["type"])} for c in t.schema]},
            "numRows": str(sum(v.visible(now) for v in t.versions)),
            "creationTime": str(t.created // 1000),
            "lastModifiedTime": str(t.modified // 1000),
            "type": t.type,
            "location": d.location,
        }
        if t.expires is not None:
            resource["expirationTime"] = str(t.expires // 1000)
        return resource

    def _tables_patch(self, member, args, query, body) -> dict:
        """tables.patch of a table's ``expirationTime`` (milliseconds since the epoch; null: never), which needs
        ``bigquery.tables.update`` on it (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables/patch;
        https://cloud.google.com/bigquery/docs/access-control); any other field is the emulator's refusal."""
        d, t = self._found(member, "bigquery.tables.update", args)
        unknown = set(body) - {"expirationTime", "tableReference"}
        if unknown:
            raise _unsupported(f"tables.patch of {sorted(unknown)}")
        if "expirationTime" in body:
            t.expires = None if body["expirationTime"] is None else int(body["expirationTime"]) * 1000
            t.modified = max(t.modified, _micros(None, self.clock))
        return self._table_resource(d, t, args)

    def _tables_delete(self, member, args, query, body) -> None:
        """tables.delete, which needs ``bigquery.tables.delete`` on the table: its rows and its history gone, the
        answer empty (https://cloud.google.com/bigquery/docs/reference/rest/v2/tables/delete); a table that is not
        there is Not found."""
        d, _ = self._found(member, "bigquery.tables.delete", args)
        del d.tables[args["table"]]

    def _datasets_insert(self, member, args, query, body) -> dict:
        """datasets.insert (https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets/insert): a dataset in
        the request's project, which needs ``bigquery.datasets.create`` there (roles/bigquery.user, dataEditor,
        dataOwner, admin: https://cloud.google.com/bigquery/docs/access-control), in its ``location`` (US unless it
        says), with its ``defaultTableExpirationMs`` (the life of every table created in it from then on: "Once this
        property is set, all newly-created tables in the dataset will have an expirationTime property set to the
        creation time plus the value in this property", at least an hour: ``MIN_TABLE_EXPIRATION_MS``), its
        ``maxTimeTravelHours`` (``TRAVEL_HOURS``; 168 unless it says) and its ``labels``. Its ``access`` list is the
        one the request names, kept as it is, each role in its legacy name (``_access``); else BigQuery's default:
        "If unspecified at dataset creation time, BigQuery adds default dataset access for the following entities",
        the project's viewers, editors and owners (``DEFAULT_ACCESS``) and "the dataset creator" as OWNER
        (Dataset.access, https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access), an
        entry of its e-mail (``userByEmail``) here. One that exists is 409 ``duplicate``."""
        project = args["project"]
        reference = body.get("datasetReference") or {}
        name = reference.get("datasetId", "")
        if set(body) - DATASET_FIELDS:
            raise _unsupported(f"Dataset fields {sorted(set(body) - DATASET_FIELDS)}")
        if reference.get("projectId", project) != project:
            raise BigQueryError(400, "The dataset's project is not the request's.", "invalid")
        if not self._allowed(member, "bigquery.datasets.create", project):
            raise _denied(
                f"Access Denied: Project {project}: User does not have bigquery.datasets.create permission in "
                f"project {project}."
            )
        if not DATASET_ID.fullmatch(name):
            raise BigQueryError(400, f'Invalid dataset ID "{name}".', "invalid")
        if (project, name) in self.datasets:
            raise BigQueryError(409, f"Already Exists: Dataset {project}:{name}", "duplicate")
        expiration = body.get("defaultTableExpirationMs")
        if expiration is not None and int(expiration) < MIN_TABLE_EXPIRATION_MS:
            raise BigQueryError(
                400, f"defaultTableExpirationMs {expiration} is below {MIN_TABLE_EXPIRATION_MS} (one hour)", "invalid"
            )
        hours = int(body.get("maxTimeTravelHours") or DEFAULT_TRAVEL_HOURS)
        if hours not in TRAVEL_HOURS:
            raise BigQueryError(400, f"maxTimeTravelHours {hours} is not 48 to 168 in multiples of 24", "invalid")
        if "access" in body:
            access = _access(body["access"])
        else:
            creator = [{"role": "OWNER", "userByEmail": member.split(":", 1)[1]}] if member else []
            access = [dict(entry) for entry in DEFAULT_ACCESS] + creator
        self.datasets[(project, name)] = Dataset(
            body.get("location") or "US",
            hours,
            _micros(None, self.clock),
            default_expiration_ms=None if expiration is None else int(expiration),
            labels=dict(body.get("labels") or {}),
            access=access,
        )
        return self._datasets_get(member, {"project": project, "dataset": name}, {}, {})

    def _datasets_get(self, member, args, query, body) -> dict:
        """The dataset, with its ``access`` list: the entries it was made with (``Dataset.access``), then the roles
        granted on the dataset, one entry per member and role, the three basic
        dataset roles in their legacy names (``LEGACY_ROLES``) (Dataset.access,
        https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.access: a user's or service
        account's email as ``userByEmail``, ``allAuthenticatedUsers`` as a ``specialGroup``), then the entries with an
        IAM condition as ``accessPolicyVersion`` asks (datasets.get,
        https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets/get: "Valid values are 0, 1, and 3.
        Requests specifying an invalid value will be rejected. Requests for conditional access policy binding in
        datasets must specify version 3"): at 3, each with its ``condition``; unset, 0 or 1, without it, the role
        "appended by 'withcond' string followed by a hash value", in the page's own example's form
        ``roles/bigquery.dataViewer_with_conditionalbinding_HASH``.
        Reading it needs ``bigquery.datasets.get`` on the dataset (datasets.get; in roles/bigquery.dataViewer and
        metadataViewer: https://cloud.google.com/bigquery/docs/access-control)."""
        project, dataset = args["project"], args["dataset"]
        version = query.get("accessPolicyVersion", "0")
        if version not in ("0", "1", "3"):
            raise BigQueryError(400, f"Invalid access policy version {version}: valid values are 0, 1 and 3", "invalid")
        if not self._allowed(member, "bigquery.datasets.get", project, dataset):
            raise _denied(f"Access Denied: Dataset {project}:{dataset}: Permission bigquery.datasets.get denied")
        d = self.datasets.get((project, dataset))
        if d is None:
            raise _not_found(f"Not found: Dataset {project}:{dataset}")
        scope = f"{project}.{dataset}"
        access = [dict(entry) for entry in d.access] + [
            {"role": LEGACY_ROLES.get(role, role), **_entity(who)}
            for who, grants in sorted(self.grants.items())
            for role, granted in sorted(grants)
            if granted == scope
        ]
        for who, grants in sorted(self.conditional_grants.items()):
            for role, granted, condition in grants:
                if granted != scope:
                    continue
                if version == "3":
                    access.append({"role": LEGACY_ROLES.get(role, role), **_entity(who), "condition": dict(condition)})
                else:
                    mark = hashlib.sha256(f"{condition['title']}\n{condition['expression']}".encode()).hexdigest()[:10]
                    access.append({"role": f"{role}_with_conditionalbinding_{mark}", **_entity(who)})
        return {
            "kind": "bigquery#dataset",
            "id": f"{project}:{dataset}",
            "datasetReference": {"projectId": project, "datasetId": dataset},
            "location": d.location,
            "access": access,
            # int64 as a string, as the REST API writes int64 (Dataset.maxTimeTravelHours:
            # https://cloud.google.com/bigquery/docs/reference/rest/v2/datasets#Dataset.FIELDS.max_time_travel_hours)
            "maxTimeTravelHours": str(d.travel_hours),
            **({"defaultTableExpirationMs": str(d.default_expiration_ms)} if d.default_expiration_ms else {}),
            **({"labels": dict(d.labels)} if d.labels else {}),
        }

    def _rowAccessPolicies_list(self, member, args, query, body) -> dict:
        """The table's row access policies (rowAccessPolicies.list, which "Requires the
        bigquery.rowAccessPolicies.list permission", held here by dataOwner and admin:
        https://cloud.google.com/bigquery/docs/reference/rest/v2/rowAccessPolicies/list), each a RowAccessPolicy with
        its reference; one page (the emulator's tables have few)."""
        project, dataset, table = args["project"], args["dataset"], args["table"]
        name = f"{project}:{dataset}.{table}"
        if not self._allowed(member, "bigquery.rowAccessPolicies.list", project, dataset, table):
            raise _denied(
                f"Access Denied: Table {name}: Permission bigquery.rowAccessPolicies.list denied on table {name}"
            )
        d = self.datasets.get((project, dataset))
        t = d.tables.get(table) if d else None
        if t is None:
            raise _not_found(f"Not found: Table {name}")
        reference = {"projectId": project, "datasetId": dataset, "tableId": table}
        policies = [{"rowAccessPolicyReference": {**reference, "policyId": p}} for p in t.policies]
        return {"rowAccessPolicies": policies} if policies else {}

    def _tables_testIamPermissions(self, member, args, query, body) -> dict:
        """Of ``body["permissions"]``, those ``member`` holds on the table (no permission needed to ask: IAM's
        testIamPermissions, https://cloud.google.com/bigquery/docs/reference/rest/v2/tables/testIamPermissions); 404
        for a table or dataset that does not exist."""
        project, dataset, table = args["project"], args["dataset"], args["table"]
        d = self.datasets.get((project, dataset))
        if d is None:
            raise _not_found(f"Not found: Dataset {project}:{dataset}")
        if table not in d.tables:
            raise _not_found(f"Not found: Table {project}:{dataset}.{table}")
        asked = body.get("permissions") or []
        held = [p for p in asked if self._allowed(member, p, project, dataset, table)]
        return {"permissions": held} if held else {}

    def _jobs_query(self, member, args, query, body) -> dict:
        unknown = set(body) - QUERY_REQUEST
        if unknown:
            raise _unsupported(f"QueryRequest fields {sorted(unknown)}")
        repeated = self.requests.get(body.get("requestId", ""))
        if repeated:  # the same request again (QueryRequest.requestId): its job's answer
            job = self.jobs[repeated]
        else:
            config = {k: body[k] for k in ("query", "useLegacySql", "parameterMode", "queryParameters") if k in body}
            job = self._run(member, args["project"], body.get("location"), None, config)
            if body.get("requestId"):
                self.requests[body["requestId"]] = (job.project, job.job_id)
        if job.error:
            raise job.error
        return self._results(job, body.get("maxResults"), None, None, body.get("formatOptions", {}), None, "query")

    def _jobs_insert(self, member, args, query, body) -> dict:
        reference = body.get("jobReference", {})
        configuration = body.get("configuration", {})
        if set(configuration) - {"query", "labels", "jobType"} or "query" not in configuration:
            raise _unsupported(f"a job configuration with {sorted(configuration)} (only query jobs)")
        config = configuration["query"]
        if set(config) - QUERY_CONFIG:
            raise _unsupported(f"JobConfigurationQuery fields {sorted(set(config) - QUERY_CONFIG)}")
        if reference.get("projectId", args["project"]) != args["project"]:
            raise BigQueryError(400, "The job's project is not the request's.", "invalid")
        job_id = reference.get("jobId") or str(uuid.uuid4())
        if not JOB_ID.fullmatch(job_id):
            raise BigQueryError(400, f'Invalid job ID "{job_id}".', "invalid")
        return self._run(member, args["project"], reference.get("location"), job_id, config).resource

    def _jobs_get(self, member, args, query, body) -> dict:
        return self._job(member, args["project"], args["job"], query.get("location")).resource

    def _jobs_cancel(self, member, args, query, body) -> dict:
        job = self._job(member, args["project"], args["job"], query.get("location"))
        return {"kind": "bigquery#jobCancelResponse", "job": job.resource}  # done jobs stay as they are

    def _jobs_getQueryResults(self, member, args, query, body) -> dict:
        job = self._job(member, args["project"], args["job"], query.get("location"))
        if job.error:
            raise job.error
        formats = {"useInt64Timestamp": query.get("formatOptions.useInt64Timestamp", "false").lower() in ("true", "1")}
        start = int(query["startIndex"]) if "startIndex" in query else None
        wanted = query.get("fields")
        return self._results(job, query.get("maxResults"), query.get("pageToken"), start, formats, wanted)

    def _job(self, member, project: str, job_id: str, location: str | None) -> Job:
        job = self.jobs.get((project, job_id))
        if job is None or (location and location.upper() != job.location.upper()):
            raise _not_found(f"Not found: Job {project}:{location or 'US'}.{job_id}")
        if job.member != member and not self._allowed(member, "bigquery.jobs.get", project):
            # a job is its creator's to read (bigquery.jobs.create); anyone else needs bigquery.jobs.get
            raise _denied(
                f"Access Denied: Job {project}:{job.location}.{job_id}: User does not have bigquery.jobs.get "
                f"permission for job {project}:{job.location}.{job_id}."
            )
        return job

    def _run(self, member, project: str, location: str | None, job_id: str | None, config: dict) -> Job:
        """Create the query job in ``project`` and run it at once: the job, DONE, with its rows or its error. A
        refusal to create it at all (no bigquery.jobs.create) is raised."""
        # A job is created in the project its request names, which is billed for it: "Project ID of project that will
        # be billed for the job", and it "Requires the bigquery.jobs.create permission on the project resource"
        # (https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/insert); every job, jobs.query's too, "is
        # associated with a specific project that you specify", whose billing account is billed
        # (https://cloud.google.com/bigquery/docs/jobs-overview, "Required permissions" and "Pricing"). Where the
        # tables it reads are plays no part here: that is _execute's bigquery.tables.getData.
        if not self._allowed(member, "bigquery.jobs.create", project):
            raise _denied(
                f"Access Denied: Project {project}: User does not have bigquery.jobs.create permission in "
                f"project {project}."
            )
        job_id = job_id or str(uuid.uuid4())
        if (project, job_id) in self.jobs:
            raise BigQueryError(409, f"Already Exists: Job {project}:{location or 'US'}.{job_id}", "duplicate")
        # A job's times are whole milliseconds (JobStatistics' creationTime, startTime and endTime count them:
        # https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobStatistics), and what it writes is committed
        # by its endTime: here at that very time, so a read as of its endTime reads what it wrote
        now = _micros(None, self.clock) // 1000 * 1000
        job = Job(project, job_id, location or "US", {}, member)
        destination: dict = {}
        try:
            self._execute(job, config, now, location)
            destination = self._destination(job, config, now)
        except BigQueryError as error:
            job.error = error
        status: dict[str, Any] = {"state": "DONE"}
        if job.error:
            status["errorResult"] = {"reason": job.error.reason, "message": job.error.message}
            status["errors"] = [status["errorResult"]]
        millis = str(now // 1000)
        job.resource = {
            "kind": "bigquery#job",
            "etag": base64.b64encode(job_id.encode()).decode()[:16],
            "id": f"{project}:{job.location}.{job_id}",
            "selfLink": f"{self.endpoint}{PREFIX}/projects/{project}/jobs/{job_id}?location={job.location}",
            "jobReference": {"projectId": project, "jobId": job_id, "location": job.location},
            "configuration": {"jobType": "QUERY", "query": {**config, "priority": "INTERACTIVE"}},
            "status": status,
            "statistics": {
                "creationTime": millis,
                "startTime": millis,
                "endTime": millis,
                "totalBytesProcessed": "0",
                "query": {
                    "totalBytesProcessed": "0",
                    "totalBytesBilled": "0",
                    "cacheHit": False,
                    "statementType": "SELECT",
                },
            },
        }
        if member:
            job.resource["user_email"] = member.split(":", 1)[1]
        if not job.error:
            job.resource["configuration"]["query"]["destinationTable"] = destination
        self.jobs[(project, job_id)] = job
        return job

    def _destination(self, job: Job, config: dict, now: int) -> dict:
        """The query's result as a table, as BigQuery writes every query's ("Temporary and permanent tables",
        https://cloud.google.com/bigquery/docs/writing-results), named in the job's
        ``configuration.query.destinationTable`` (JobConfigurationQuery.destinationTable,
        https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery): the one the job names
        (``_written``), else a temporary table in an anonymous dataset of the job's project, which the job's creator
        alone reads (its rows through tabledata.list or the Storage Read API, whose emulator reads it as any table),
        for ``ANONYMOUS_HOURS``, and only up to the maximum response size (``_anonymous``). The anonymous dataset's
        name starts with ``_`` (hidden from datasets.list); both names here are the emulator's."""
        schema = [
            {"name": f["name"], "type": k, "mode": "NULLABLE"} for f, k in zip(job.fields, job.types, strict=True)
        ]
        if config.get("destinationTable"):
            return self._written(job, config, schema, now)
        self._anonymous(job)
        dataset, name = f"_{uuid.uuid5(uuid.NAMESPACE_URL, job.project).hex}", f"anon{job.job_id.replace('-', '')}"
        if (job.project, dataset) not in self.datasets:
            self.datasets[(job.project, dataset)] = Dataset(job.location, DEFAULT_TRAVEL_HOURS, now)
        versions = [Version(list(r), now) for r in job.rows]
        expires = now + ANONYMOUS_HOURS * 3_600_000_000
        table = Table(schema, now, versions, now, readers={job.member}, expires=expires)
        self.datasets[(job.project, dataset)].tables[name] = table
        return {"projectId": job.project, "datasetId": dataset, "tableId": name}

    def _anonymous(self, job: Job) -> None:
        """A result with no destination table is capped at ``max_response_bytes``: "Maximum response size: 10 GB
        compressed" (https://cloud.google.com/bigquery/quotas#query_jobs), and JobConfigurationQuery.allowLargeResults:
        "For GoogleSQL queries, this flag is ignored and large results are always allowed. However, you must still set
        destinationTable when result size exceeds the allowed maximum response size"
        (https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery). Past it the job fails
        with ``responseTooLarge``, HTTP 403 (https://cloud.google.com/bigquery/docs/error-messages), in the words
        below. The size is measured simply: the JSON of the rows as the REST API answers them (``_result_row``), not
        compressed."""
        size = sum(len(json.dumps(_result_row(job.types, values, True))) for values in job.rows)
        if size > self.max_response_bytes:
            raise BigQueryError(
                403,
                "Response too large to return. Consider specifying a destination table in your job configuration.",
                "responseTooLarge",
            )

    def _written(self, job: Job, config: dict, schema: list[dict], now: int) -> dict:
        """The result written to the job's ``destinationTable`` (JobConfigurationQuery,
        https://cloud.google.com/bigquery/docs/reference/rest/v2/Job#JobConfigurationQuery): ``createDisposition``
        CREATE_IF_NEEDED (the default) or CREATE_NEVER (a table that is not there is Not found), ``writeDisposition``
        WRITE_EMPTY (the default for a query job: "If the table already exists and contains data, a 'duplicate' error
        is returned in the job result") or WRITE_TRUNCATE (its rows replaced, committed at the job's time); WRITE_APPEND
        is the emulator's refusal. The member needs ``bigquery.tables.create`` (for a new table) and
        ``bigquery.tables.updateData`` on the dataset ("Required permissions",
        https://cloud.google.com/bigquery/docs/writing-results), refused in BigQuery's words; the dataset must exist
        and be in the job's location ("the tables you're querying must be in the same location as the dataset that
        contains the destination table", same page: the emulator's Not found in that location). A new table takes its
        dataset's defaultTableExpirationMs; it is no temporary table, so whoever may read its dataset reads it (no
        ``readers``)."""
        reference = config["destinationTable"]
        project, dataset, name = reference["projectId"], reference["datasetId"], reference["tableId"]
        create = config.get("createDisposition", "CREATE_IF_NEEDED")
        write = config.get("writeDisposition", "WRITE_EMPTY")
        if create not in ("CREATE_IF_NEEDED", "CREATE_NEVER") or write not in ("WRITE_EMPTY", "WRITE_TRUNCATE"):
            raise _unsupported(f"createDisposition {create} with writeDisposition {write}")
        d = self.datasets.get((project, dataset))
        t = d.tables.get(name) if d else None
        for permission in (
            ("bigquery.tables.updateData",) if t else ("bigquery.tables.create", "bigquery.tables.updateData")
        ):
            if not self._allowed(job.member, permission, project, dataset, name):
                raise _denied(
                    f"Access Denied: Dataset {project}:{dataset}: Permission {permission} denied on dataset "
                    f"{project}:{dataset} (or it may not exist)."
                )
        if d is None or d.location.upper() != job.location.upper():
            raise _not_found(f"Not found: Dataset {project}:{dataset} was not found in location {job.location}")
        versions = [Version(list(r), now) for r in job.rows]
        if t is None:
            if create == "CREATE_NEVER":
                raise _not_found(f"Not found: Table {project}:{dataset}.{name}")
            expires = None if d.default_expiration_ms is None else now + d.default_expiration_ms * 1000
            d.tables[name] = Table(schema, now, versions, now, expires=expires)
        elif write == "WRITE_EMPTY" and any(v.end is None for v in t.versions):
            raise BigQueryError(409, f"Already Exists: Table {project}:{dataset}.{name}", "duplicate")
        else:
            for version in t.versions:
                version.end = now if version.end is None else version.end
            t.schema, t.modified = schema, now
            t.versions += versions
        return {"projectId": project, "datasetId": dataset, "tableId": name}

    def _execute(self, job: Job, config: dict, now: int, location: str | None) -> None:
        """Run the query into ``job``: its result's schema and rows, or a BigQueryError. A job runs where the data
        it reads is; a request naming another location does not find it there."""
        if config.get("useLegacySql", True):  # true unless the request says (QueryRequest, JobConfigurationQuery)
            raise _unsupported("Legacy SQL")
        if config.get("parameterMode", "NAMED") != "NAMED":
            raise _unsupported("positional query parameters")
        params = {}
        for p in config.get("queryParameters", []):
            kind = STANDARD.get(p.get("parameterType", {}).get("type", ""), p.get("parameterType", {}).get("type", ""))
            if kind not in TYPES:
                raise _unsupported(f"a query parameter of type {p.get('parameterType')}")
            raw = p.get("parameterValue", {}).get("value")
            try:
                params[p["name"].lower()] = (kind, parse_value(kind, raw))
            except ValueError:
                raise _invalid(f"Invalid {kind} value for query parameter {p['name']}: {raw!r}") from None
        q = Query(config.get("query", ""))
        path, offset = q.table, q.table_offset
        project, dataset, name = path if len(path) == 3 else (job.project, *path)
        table_name = f"{project}:{dataset}.{name}"
        # Reading a table takes roles/bigquery.dataViewer "on all tables and views that your query references"
        # (https://cloud.google.com/bigquery/docs/running-queries, "Required roles"), granted on the table, its dataset
        # or its project, whichever project the job runs in.
        if not self._allowed(job.member, "bigquery.tables.getData", project, dataset, name):
            raise _denied(
                f"Access Denied: Table {table_name}: User does not have permission to query table {table_name}, "
                "or perhaps it does not exist."
            )
        d = self.datasets.get((project, dataset))
        if d is None or (location and location.upper() != d.location.upper()):
            raise _not_found(f"Not found: Dataset {project}:{dataset} was not found in location {job.location}")
        job.location = d.location
        t = d.tables.get(name)
        if t is None:
            raise _not_found(f"Not found: Table {table_name} was not found in location {d.location}")
        if (
            q.appends is not None
            and t.row_policies
            and not self._allowed(job.member, OVERRIDE_TIME_TRAVEL, project, dataset, name)
        ):  # APPENDS reads the table's past: "Required permissions", https://cloud.google.com/bigquery/docs/change-history
            raise _denied(time_travel_forbidden(table_name))
        schema = [*t.schema, *CHANGE_COLUMNS] if q.appends is not None else t.schema
        columns = {c["name"].lower(): (i, c["type"]) for i, c in enumerate(schema)}
        compiled = Compiled(q, columns, params)
        at = now
        if q.appends is not None:
            if q.as_of is not None:
                raise _unsupported("FOR SYSTEM_TIME AS OF with APPENDS", q.at(offset))
            rows = self._appends(q, Compiled(q, {}, params), t, d, table_name, now)
        if q.as_of is not None:
            kind, fn = Compiled(q, {}, params).compile(q.as_of)
            if kind == "STRING" and q.as_of[0] == "literal":  # a string literal where a TIMESTAMP is expected
                kind, fn = compiled._coerced(q.as_of, ("literal", "TIMESTAMP", 0, 0))
            if kind != "TIMESTAMP" or fn([]) is None:
                raise _invalid(f"FOR SYSTEM_TIME AS OF needs a TIMESTAMP, not {kind}{q.at(offset)}")
            at = fn([])
            earliest = max(t.created, now - d.travel_hours * 3_600_000_000)
            if at < earliest:
                ms = at // 1000
                raise _invalid(
                    f"Invalid snapshot time {ms} for table {table_name}@{ms}. Cannot read before {earliest // 1000}."
                )
            if at > now:
                raise _invalid(f"FOR SYSTEM_TIME AS OF {_iso(at)} is in the future (the emulator's refusal)")
        where = compiled.condition(q.where, "WHERE") if q.where is not None else (lambda row: True)
        if q.appends is None:
            rows = [v.values for v in t.versions if v.visible(at)]
        rows = [r for r in rows if where(r) is True]
        if q.select is None:
            job.fields = [{**c, "type": LEGACY.get(c["type"], c["type"])} for c in schema]
            job.types = [c["type"] for c in schema]
            job.rows = [list(r) for r in rows]
        else:
            self._aggregate(job, q, compiled, rows)
        if q.limit is not None:
            job.rows = job.rows[: q.limit]

    @staticmethod
    def _appends(q: Query, bounds: Compiled, t: Table, d: Dataset, table_name: str, now: int) -> list[list]:
        """APPENDS' rows: each row an insert committed in ``[start, end)``, with ``_CHANGE_TYPE`` and
        ``_CHANGE_TIMESTAMP`` (https://cloud.google.com/bigquery/docs/reference/standard-sql/time-series-functions#appends:
        "start_timestamp: ... the earliest time at which a change is included in the output. If the value is NULL,
        all changes since the table creation are returned. If the table was created after the start_timestamp value,
        the actual table creation time is used instead. An error is returned if the time specified is earlier than
        allowed by time travel, or if the table was created earlier than allowed by time travel if the
        start_timestamp value is NULL"; "end_timestamp: ... the latest time at which a change is included in the
        output, exclusive. If NULL, all changes up to the start of the query are included"). A row inserted then
        deleted is still there; an update adds none ("Records of inserted rows persist even if that data is later
        deleted. Deletions aren't reflected in the APPENDS function. ... If a row is modified due to an UPDATE
        operation, there's no effect": https://cloud.google.com/bigquery/docs/change-history). The refusal's wording
        is the emulator's."""
        assert q.appends is not None
        start, end = (_bound(bounds, e, q) for e in q.appends)
        earliest = now - d.travel_hours * 3_600_000_000
        if (t.created if start is None else start) < earliest:
            raise _invalid(
                f"APPENDS of table {table_name} cannot read changes before {_iso(earliest)}, the start of its time "
                f"travel window ({d.travel_hours} hours)"
            )
        start = t.created if start is None else max(start, t.created)
        end = now if end is None else end
        return [[*v.values, "INSERT", v.start] for v in t.versions if v.appended and start <= v.start < end]

    @staticmethod
    def _aggregate(job: Job, q: Query, compiled: Compiled, rows: list[list]) -> None:
        """The SELECT list's items over ``rows``: one row of aggregates, or the columns of each row."""
        assert q.select is not None
        columns = [item for item in q.select if item[0] == "column"]
        if columns and len(columns) < len(q.select):
            raise _invalid(
                f"SELECT list expression references column {columns[0][1][1]} which is neither grouped nor "
                f"aggregated{q.at(columns[0][3])}"
            )
        names, kinds, fns, anonymous = [], [], [], 0
        for kind, argument, alias, offset in q.select:
            if kind == "count":
                value_kind, fn = "INT64", len
            elif kind == "countif":
                value_kind, fn = "INT64", functools.partial(_count_true, compiled.condition(argument, "COUNTIF"))
            else:
                value_kind, get = compiled.compile(argument)
                if value_kind not in ORDERED:
                    raise _invalid(f"No matching signature for aggregate function {kind.upper()}{q.at(offset)}")
                fn = get if kind == "column" else functools.partial(_extreme, max if kind == "max" else min, get)
            if not alias:  # BigQuery names an unnamed result column f0_, f1_, ...
                alias = argument[1] if kind == "column" else f"f{anonymous}_"
                anonymous += kind != "column"
            names.append(alias)
            kinds.append(value_kind)
            fns.append(fn)
        job.fields = [
            {"name": n, "type": LEGACY.get(k, k), "mode": "NULLABLE"} for n, k in zip(names, kinds, strict=True)
        ]
        job.types = kinds
        job.rows = [[fn(r) for fn in fns] for r in rows] if columns else [[fn(rows) for fn in fns]]

    def _results(
        self, job: Job, max_results, token: str | None, start: int | None, formats: dict, wanted, kind: str = "get"
    ) -> dict:
        """One page of the job's rows: from ``pageToken`` (or ``startIndex``, or the first), at most ``maxResults``
        rows and ``page_bytes`` of them; as jobs.getQueryResults answers it, or (``kind="query"``) jobs.query."""
        offset = start or 0
        if token:
            try:
                token_job, _, at = base64.urlsafe_b64decode(token.encode()).decode().rpartition(":")
                offset = int(at)
            except ValueError:
                token_job = ""
            if token_job != job.job_id:
                raise BigQueryError(400, f"Invalid page token: {token}", "invalid")
        limit = len(job.rows) if max_results is None else int(max_results)
        int64 = bool(formats.get("useInt64Timestamp"))
        page, size = [], 0
        for values in job.rows[offset : offset + limit]:
            row = _result_row(job.types, values, int64)
            size += len(json.dumps(row))
            if page and size > self.page_bytes:
                break
            page.append(row)
        end = offset + len(page)
        answer = {
            "kind": "bigquery#queryResponse" if kind == "query" else "bigquery#getQueryResultsResponse",
            "etag": job.resource["etag"],
            "schema": {"fields": job.fields},
            "jobReference": job.resource["jobReference"],
            "totalRows": str(len(job.rows)),
            "totalBytesProcessed": "0",
            "jobComplete": True,
            "cacheHit": False,
        }
        if page:
            answer["rows"] = page
        if end < len(job.rows):
            answer["pageToken"] = base64.urlsafe_b64encode(f"{job.job_id}:{end}".encode()).decode()
        if wanted:  # a partial response (https://cloud.google.com/bigquery/docs/api-performance#partial-response)
            answer = {k: v for k, v in answer.items() if k in wanted.split(",")}
        return answer
