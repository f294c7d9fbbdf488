"""A BigQuery table as a run's data (``train.dataset=bq://PROJECT.DATASET.TABLE``), pinned in time.

A run reads its table as it was at one moment, never twice as it may have changed: :func:`snapshot` (before anything
is spent) checks the table and counts its rows as of a time ``at``, and :func:`rows` later reads those rows, and no
others, with BigQuery time travel (``FOR SYSTEM_TIME AS OF``, https://cloud.google.com/bigquery/docs/time-travel):
what was inserted, updated or deleted after ``at`` changes nothing. Time travel reaches back over the dataset's time
travel window only (7 days by default), so the rows must be read within it.

Two optional fields narrow the rows, named after the dataset's field (``field`` ``train.dataset``:
``train.dataset_filter``, ``train.dataset_time_column``):

- ``<field>_filter``: ``COLUMN=VALUE[,COLUMN=VALUE...]``, the values the rows' columns must have; each becomes
  ``COLUMN = @fN`` in the query's WHERE clause, the column a quoted name the table's schema has, the value a query
  parameter of the column's type (https://cloud.google.com/bigquery/docs/parameterized-queries: a parameter stands
  for a value and is never read as query text), so no filter can read another table (``EXISTS(SELECT ...)``), call a
  function or change the query's shape;
- ``<field>_time_column``: a TIMESTAMP, DATETIME, DATE or INT64 column that grows with each new row (its ingestion
  time): the snapshot records its largest value, ``max_time``, and a later snapshot with ``after=max_time`` counts and
  reads only the rows past it (strictly greater: a row that arrives later with a time not past ``max_time`` is never
  read).

Bad input is a :class:`SpecError` naming its field: a malformed URI, a table or dataset that does not exist, no
permission to read it or to run a query, a filter BigQuery refuses, no rows (unless ``after`` is given: then none
new is an answer, ``num_rows`` 0), a column the trainer's formatter needs (``instruction``, ``response``) missing from
the table or NULL or empty in some row, a time column that is missing or of another type.

Where the jobs run: every query is a job created in, and billed to, one project (jobs.insert's ``projectId``, "Project
ID of project that will be billed for the job": https://cloud.google.com/bigquery/docs/reference/rest/v2/jobs/insert;
https://cloud.google.com/bigquery/docs/jobs-overview, "Pricing"), where the caller needs ``bigquery.jobs.create``
(roles/bigquery.jobUser), while reading the table needs ``bigquery.tables.getData`` on it or its dataset
(roles/bigquery.dataViewer: https://cloud.google.com/bigquery/docs/running-queries, "Required roles"). The run's
jobs go to ``project`` (``train.bigquery_project``, else the run's ``gke.project``), so a table in another project
(a data project where the run's identity only reads, a public dataset such as ``bigquery-public-data``) is read and
billed where the run is; without one, to the table's own project.

The client: ``google.cloud.bigquery.Client`` with the Google credentials of ``components.cloud.credentials``, at
Google's endpoint, or at ``$TPUPIPE_BIGQUERY_EMULATOR_HOST`` (``http://host:port``) when the tests set it. Queries go
through ``Client.query_and_wait`` (jobs.query, then jobs.get and jobs.getQueryResults page by page when the rows do
not fit one answer). The client library is imported inside the functions.
"""

from __future__ import annotations

import base64
import decimal
import json
import re
import unicodedata
from collections.abc import Iterator
from datetime import UTC, date, datetime, time
from typing import Any, NamedTuple

from components.cloud.credentials import access_error, credentials, google_client
from components.spec import InfraError, SpecError
from components.spec.datasets import row_filter
from components.spec.names import PROJECT_ID_PATTERN

EMULATOR_HOST_ENV = "TPUPIPE_BIGQUERY_EMULATOR_HOST"
SCHEME = "bq://"
REQUIRED = ("instruction", "response")  # what the trainer's formatter reads of each row (trainers/data.py)
# A project id, or a domain-scoped one ("example.com:project"): https://cloud.google.com/resource-manager/docs/creating-managing-projects
PROJECT = re.compile(rf"(?:[a-z0-9][a-z0-9.-]*[a-z0-9]:)?{PROJECT_ID_PATTERN}")
# A dataset name: letters, digits and underscores, at most 1,024 (https://cloud.google.com/bigquery/docs/datasets#dataset-naming)
DATASET = re.compile(r"[A-Za-z0-9_]{1,1024}")
# A table name: at most 1,024 UTF-8 bytes of Unicode letters, marks, numbers, connectors, dashes and spaces (categories
# L, M, N, Pc, Pd, Zs: https://cloud.google.com/bigquery/docs/tables#table_naming)
TABLE_CATEGORIES = ("L", "M", "N", "Pc", "Pd", "Zs")
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


def client(project: str, creds=None):
    """A ``bigquery.Client`` whose jobs run (and are billed) in ``project``: at $TPUPIPE_BIGQUERY_EMULATOR_HOST when
    set, else at Google's endpoint, with the Google credentials (``components.cloud.credentials``)."""
    from google.cloud import bigquery

    return google_client(bigquery.Client, EMULATOR_HOST_ENV, creds=creds, project=project)


def snapshot(
    table: str,
    *,
    field: str,
    at: datetime,
    filter: str = "",
    time_column: str = "",
    after: str | None = None,
    required: tuple[str, ...] = REQUIRED,
    project: str = "",
) -> dict:
    """The table (``PROJECT.DATASET.TABLE``) as of ``at`` (time-zone aware, not in the future), checked: a JSON-able
    dict that :func:`rows` reads back, ``{"table", "project" (where the queries run: ``project``, else the table's),
    "snapshot_time" (``at`` in UTC, ISO 8601 with ``Z``), "num_rows", "fields" (the schema's column names), "filter",
    "time_column", "time_type", "after", "max_time" (the largest ``time_column`` among the rows, as text; None when
    there are none or no time column)}``. Makes two calls (tables.get, one query), three when some row lacks a
    ``required`` column. ``after`` (a ``max_time`` of an earlier snapshot) counts only the rows past it, and then no
    rows is no error."""
    if at.tzinfo is None:
        raise ValueError(f"snapshot time {at!r} has no time zone")
    filter_field, time_field = f"{field}_filter", f"{field}_time_column"
    pairs = row_filter(filter, filter_field)
    if after is not None and not time_column:
        raise SpecError(time_field, f"reading only the rows after {after!r} needs the column they are ordered by")
    billing = project or table.rsplit(".", 2)[0]
    creds = credentials()
    bq = client(billing, creds)
    try:
        schema = {f.name: f.field_type for f in bq.get_table(table).schema}
    except _failures() as exc:
        raise _refusal(exc, field, table, billing, creds, filter_field, filter) from None
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
    snap: dict[str, Any] = {
        "table": table,
        "project": billing,
        "snapshot_time": at.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "num_rows": 0,
        "fields": list(schema),
        "filter": filter,
        "filter_types": {column: schema[column] for column, _ in pairs},
        "time_column": time_column,
        "time_type": time_type,
        "after": after,
        "max_time": None,
    }
    lacking = [f"{_quoted(name)} IS NULL OR {_quoted(name)} = ''" for name in required]
    items = ["COUNT(*) AS num_rows", *(f"COUNTIF({cond}) AS lacking_{i}" for i, cond in enumerate(lacking))]
    if time_column:
        items.append(f"MAX({_quoted(time_column)}) AS max_time")
    where, params = _where(snap, time_field)
    try:
        (counts,) = list(_query(bq, f"SELECT {', '.join(items)} FROM {_source(snap)}{where}", params))
        snap["num_rows"], snap["max_time"] = counts["num_rows"], _text(counts.get("max_time"))
        short = {name: counts[f"lacking_{i}"] for i, name in enumerate(required) if counts[f"lacking_{i}"]}
        example = None
        if short:
            joined = " OR ".join(f"({cond})" for cond in lacking)
            first = f"SELECT * FROM {_source(snap)}{where or ' WHERE TRUE'} AND ({joined}) LIMIT 1"
            example = next(iter(_query(bq, first, params)), None)
    except _failures() as exc:
        raise _refusal(exc, field, table, billing, creds, filter_field, filter) from None
    matching = f" matching {filter_field} {filter!r}" if filter else ""
    if snap["num_rows"] == 0 and after is None:
        raise SpecError(field, f"{table} has no rows{matching} as of {snap['snapshot_time']}")
    if short:
        counted = ", ".join(f"{name} in {n}" for name, n in short.items())
        shown = json.dumps({k: _jsonable(v) for k, v in dict(example or {}).items()}, ensure_ascii=False)
        raise SpecError(
            field,
            f"{table}{matching}: of its {snap['num_rows']} rows, some lack a column the trainer's formatter needs "
            f"(NULL or empty): {counted}; the first found: {shown[:400]}",
        )
    return snap


def rows(snap: dict, *, field: str, page_size: int | None = None) -> Iterator[dict]:
    """Every row of the snapshot ``snap`` (:func:`snapshot`'s answer), each a dict of JSON-able values (times as ISO
    8601 text, NUMERIC as text, BYTES as base64), read as of its time with its filter and ``after``: paged by the
    client (``page_size`` rows a page at most, else as many as BigQuery sends in one answer, 10 MB). An InfraError
    before the first row when BigQuery counts other rows than the snapshot did."""
    creds = credentials()
    bq = client(snap["project"], creds)
    where, params = _where(snap, f"{field}_time_column")
    try:
        found = _query(bq, f"SELECT * FROM {_source(snap)}{where}", params, page_size)
        if found.total_rows != snap["num_rows"]:
            raise InfraError(
                f"{snap['table']} as of {snap['snapshot_time']} has {found.total_rows} rows now and had "
                f"{snap['num_rows']} when the run's snapshot counted them"
            )
        for row in found:
            yield {k: _jsonable(v) for k, v in row.items()}
    except _failures() as exc:
        raise _refusal(exc, field, snap["table"], snap["project"], creds, f"{field}_filter", snap["filter"]) from None


READ_PERMISSIONS = ("bigquery.tables.get", "bigquery.tables.getData")  # roles/bigquery.dataViewer's, on the table
JOB_PERMISSION = "bigquery.jobs.create"  # roles/bigquery.jobUser's, on the project the jobs run in
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


# The roles that hold bigquery.jobs.create on a project: the predefined ones the jobs overview names
# (https://cloud.google.com/bigquery/docs/jobs-overview, "Required permissions") and the basic ones, each of which
# "can start a job in the project" (https://cloud.google.com/bigquery/docs/access-control-basic-roles).
JOB_ROLES = (
    "roles/bigquery.jobUser", "roles/bigquery.user", "roles/bigquery.admin", "roles/viewer", "roles/editor",
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


class AccountRoles(NamedTuple):
    """What :func:`account_roles` found of a service account's roles for reading a table with jobs in a project."""

    on_project: set[str]  # on the jobs' project, unconditionally
    reading: set[str]  # on the table's dataset or its project, unconditionally
    unread: list[str]  # the policies and access lists the caller could not read
    # role -> the titles of the IAM conditions it is granted under (``cloud.iam``: not counted as held)
    on_project_conditional: dict[str, set[str]]
    reading_conditional: dict[str, set[str]]


def account_roles(table: str, project: str, account: str, creds=None) -> AccountRoles:
    """The roles the service account ``account`` (an email) holds on ``project`` and those that may read ``table``'s
    rows (on its dataset and its project): from the project IAM policies (Resource Manager's projects.getIamPolicy)
    and the dataset's access list (:func:`dataset_access`, where an account is ``userByEmail`` or an ``iamMember``,
    ``allAuthenticatedUsers`` a ``specialGroup`` that includes it, and ``projectReaders``/``projectWriters``/
    ``projectOwners`` those that include it by its basic role on the dataset's project: ``PROJECT_GROUPS``). A
    binding or access entry with a condition grants only where the condition holds (``cloud.iam``): kept apart, by
    the condition's title. Read as the caller, who may lack the permission to read a policy: each such read is
    named, not guessed."""
    from components.cloud import iam as cloud_iam

    member, unread = f"serviceAccount:{account}", []
    data_project, dataset = table.rsplit(".", 2)[0], table.rsplit(".", 1)[0]
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
        for entry in dataset_access(client(project, creds), dataset):
            group = PROJECT_GROUPS.get(entry.entity_id, "")
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


def dataset_access(bq, dataset: str) -> list:
    """The dataset's access list (``PROJECT.DATASET``) as ``AccessEntry`` objects, read with datasets.get at
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
    return list(Dataset.from_api_repr(resource).access_entries)


def _failures() -> tuple[type[Exception], ...]:
    """What a call to BigQuery raises: an API error, or google-auth's about the credentials."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPICallError, GoogleAuthError


def _query(bq, sql: str, params: list, page_size: int | None = None):
    from google.cloud import bigquery

    config = bigquery.QueryJobConfig(query_parameters=params)
    return bq.query_and_wait(sql, job_config=config, page_size=page_size)


def _source(snap: dict) -> str:
    return f"`{snap['table']}` FOR SYSTEM_TIME AS OF @at"


def _where(snap: dict, time_field: str) -> tuple[str, list]:
    """The query's WHERE clause (empty, or with a leading space) and its parameters: ``@at``, and ``@after`` with
    the time column's type."""
    from google.cloud import bigquery

    at = datetime.fromisoformat(snap["snapshot_time"])
    params = [bigquery.ScalarQueryParameter("at", "TIMESTAMP", at)]
    conditions = []
    types = snap.get("filter_types") or {}
    filter_field = time_field.removesuffix("_time_column") + "_filter"
    for i, (column, value) in enumerate(row_filter(snap["filter"], filter_field)):
        kind = PARAMETER_TYPES.get(types[column], types[column])
        params.append(bigquery.ScalarQueryParameter(f"f{i}", kind, _typed(kind, value, filter_field, column)))
        conditions.append(f"{_quoted(column)} = @f{i}")
    if snap["after"] is not None:
        kind = snap["time_type"]
        params.append(bigquery.ScalarQueryParameter("after", kind, _typed(kind, snap["after"], time_field)))
        conditions.append(f"{_quoted(snap['time_column'])} > @after")
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), params


def _typed(kind: str, text: str, field: str, column: str = "") -> Any:
    """``text`` as the Python value of a query parameter of type ``kind`` (a schema type, legacy names too): ``after``
    (the text :func:`_text` wrote) or a filter's value for ``column``; a SpecError naming ``field`` otherwise."""
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


def _refusal(exc: Exception, field: str, table: str, project: str, creds, filter_field: str, filter: str) -> Exception:
    """What to raise for ``exc``, a failed call about ``table``: a SpecError naming the field at fault when the input
    is, the AccessError of credentials refused or an API not enabled, else ``exc`` itself."""
    from google.api_core import exceptions as gexc

    if not isinstance(exc, gexc.GoogleAPICallError):  # google-auth's: the credentials
        return access_error(exc) or exc
    first = next((e for e in exc.errors or [] if isinstance(e, dict)), {})
    said = (first.get("message") or exc.message or str(exc)).strip().splitlines()[0]
    reason = first.get("reason", "")
    if isinstance(exc, gexc.NotFound):
        return SpecError(field, f"{table} does not exist or is not visible to the caller: {said}", [TABLE_RULE])
    if isinstance(exc, gexc.Forbidden) and reason == "accessDenied" and "bigquery.jobs.create" in said:
        who = _identity(creds)
        return SpecError(
            field,
            f"{who or 'the caller'} may not run BigQuery jobs in project {project}, where the run's queries run and "
            f"are billed: {said}",
            [f"roles/bigquery.jobUser on the project {project}, granted to {who or 'the pipeline service account'}",
             "train.bigquery_project=PROJECT (a project where it may; default: gke.project)"],
        )  # fmt: skip
    if isinstance(exc, gexc.Forbidden) and reason == "accessDenied":
        who = _identity(creds)
        dataset = table.rsplit(".", 1)[0]
        return SpecError(
            field,
            f"{who or 'the caller'} may not read {table}: {said}",
            [f"roles/bigquery.dataViewer on the dataset {dataset} (or the table) and roles/bigquery.jobUser on the "
             f"project {project}, granted to {who or 'the pipeline service account'}"],
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


def _identity(creds) -> str:
    """The account the credentials act as, when they say (a service account's e-mail, a user's account)."""
    for attribute in ("service_account_email", "signer_email", "account"):
        value = getattr(creds, attribute, None)
        if isinstance(value, str) and "@" in value:
            return value
    return ""
