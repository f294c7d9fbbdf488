"""The BigQuery emulator (tests/emulators/bigquery.py) through the real google-cloud-bigquery client: tables.get,
queries by jobs.query (``query_and_wait``) and by jobs.insert (``query``), their pages, time travel, the SQL subset
and its errors as BigQuery words them, identities and their roles, injected faults."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from google.api_core import exceptions
from google.cloud import bigquery
from google.oauth2.credentials import Credentials

from tests.emulators.bigquery import BigQueryEmulator

PROJECT, TOKEN = "tpupipe-data", "t0ken"
TABLE = f"{PROJECT}.examples.dolly"
SCHEMA = [("instruction", "STRING", "REQUIRED"), ("response", "STRING"), ("n", "INT64"), ("ts", "TIMESTAMP")]
NOW = datetime.now(UTC)
DAY = timedelta(days=1)
ALICE = "user:alice@example.com"


@pytest.fixture
def bq():
    emulator = BigQueryEmulator(token=TOKEN)
    emulator.start()
    emulator.create_table(TABLE, SCHEMA, at=NOW - 3 * DAY)
    emulator.insert(TABLE, [_row(n, NOW - 2 * DAY) for n in range(5)], at=NOW - 2 * DAY)
    yield emulator
    emulator.stop()


def _row(n: int, ts: datetime) -> dict:
    return {"instruction": f"say {n}", "response": str(n), "n": n, "ts": ts}


def client(bq: BigQueryEmulator, token: str = TOKEN, project: str = PROJECT) -> bigquery.Client:
    return bigquery.Client(
        project=project, credentials=Credentials(token=token), client_options={"api_endpoint": bq.endpoint}
    )


def query(bq, sql: str, token: str = TOKEN, page_size: int | None = None, **params) -> list[dict]:
    config = bigquery.QueryJobConfig(query_parameters=[bigquery.ScalarQueryParameter(k, *v) for k, v in params.items()])
    return [dict(r) for r in client(bq, token).query_and_wait(sql, job_config=config, page_size=page_size)]


def test_tables_get_answers_the_schema_and_bigquerys_not_found(bq):
    table = client(bq).get_table(TABLE)
    assert [(f.name, f.field_type, f.mode) for f in table.schema] == [
        ("instruction", "STRING", "REQUIRED"),
        ("response", "STRING", "NULLABLE"),
        ("n", "INTEGER", "NULLABLE"),  # the REST API's legacy name
        ("ts", "TIMESTAMP", "NULLABLE"),
    ]
    assert table.num_rows == 5 and table.location == "US" and table.table_type == "TABLE"
    with pytest.raises(exceptions.NotFound, match=f"Not found: Table {PROJECT}:examples.nope"):
        client(bq).get_table(f"{PROJECT}.examples.nope")
    with pytest.raises(exceptions.NotFound, match=f"Not found: Dataset {PROJECT}:nope$"):
        client(bq).get_table(f"{PROJECT}.nope.dolly")
    assert bq.calls == ["tables.get"] * 3


def test_a_query_runs_by_jobs_query_with_named_parameters(bq):
    found = query(
        bq,
        "SELECT COUNT(*) AS rows, MAX(`ts`) AS newest, MIN(n), COUNTIF(n >= 3) FROM `tpupipe-data.examples.dolly` "
        "WHERE instruction != 'say 0' AND (n IN (1, 2, 3) OR response IS NULL) AND ts <= @now",
        now=("TIMESTAMP", NOW),
    )
    assert found == [{"rows": 3, "newest": NOW - 2 * DAY, "f0_": 1, "f1_": 1}]
    assert bq.calls == ["jobs.query"]  # one page: the answer holds it
    (_, _, body) = bq.bodies[0]
    assert body["useLegacySql"] is False and body["parameterMode"] == "NAMED"
    assert body["queryParameters"][0]["parameterType"] == {"type": "TIMESTAMP"}
    rows = query(bq, "SELECT * FROM `tpupipe-data.examples.dolly` WHERE n > 3")
    assert rows == [{"instruction": "say 4", "response": "4", "n": 4, "ts": NOW - 2 * DAY}]
    assert query(bq, "SELECT n FROM `tpupipe-data`.examples.dolly WHERE n < 2 LIMIT 1") == [{"n": 0}]
    with pytest.raises(exceptions.NotFound, match=f"Dataset {PROJECT}:examples was not found in location EU"):
        client(bq).query_and_wait(f"SELECT * FROM `{TABLE}`", location="EU")  # a job runs where its data is


def test_the_pages_of_a_query_come_by_jobs_get_and_jobs_get_query_results(bq):
    bq.insert(TABLE, [_row(n, NOW - DAY) for n in range(5, 2500)], at=NOW - DAY)
    rows = query(bq, f"SELECT * FROM `{TABLE}`", page_size=1000)
    assert [r["n"] for r in rows] == list(range(2500))
    assert bq.calls == ["jobs.query", "jobs.get", "jobs.getQueryResults", "jobs.getQueryResults"]
    pages = [q for m, q, _ in bq.bodies if m == "jobs.getQueryResults"]
    assert all(q["maxResults"] == "1000" and q["pageToken"] for q in pages)

    bq.calls.clear()  # jobs.insert (Client.query's default), then a page per getQueryResults
    job = client(bq).query(f"SELECT n FROM `{TABLE}` WHERE n < 10")
    assert [r["n"] for r in job.result(page_size=4)] == list(range(10))
    assert bq.calls == ["jobs.insert", *["jobs.getQueryResults"] * 3]

    bq.calls.clear()  # without maxResults a page is what fits in page_bytes
    bq.page_bytes = 20_000
    assert len(query(bq, f"SELECT * FROM `{TABLE}`")) == 2500
    assert bq.calls.count("jobs.getQueryResults") > 3


def test_for_system_time_as_of_reads_the_table_as_it_was(bq):
    before = NOW - DAY
    bq.insert(TABLE, [_row(9, NOW)], at=NOW - timedelta(hours=1))
    assert bq.update(TABLE, lambda r: r["n"] == 1, {"response": "one"}, at=NOW - timedelta(hours=1)) == 1
    assert bq.delete(TABLE, lambda r: r["n"] == 2, at=NOW - timedelta(hours=1)) == 1
    sql = f"SELECT n, response FROM `{TABLE}` FOR SYSTEM_TIME AS OF @at"
    then = query(bq, sql, at=("TIMESTAMP", before))
    assert then == [{"n": n, "response": str(n)} for n in range(5)]
    now = query(bq, f"SELECT n, response FROM `{TABLE}`")
    assert now == [{"n": 0, "response": "0"}, {"n": 3, "response": "3"}, {"n": 4, "response": "4"}] + [
        {"n": 9, "response": "9"},
        {"n": 1, "response": "one"},
    ]
    literal = f"SELECT COUNT(*) AS c FROM `{TABLE}` FOR SYSTEM_TIME AS OF TIMESTAMP '{before.isoformat()}'"
    assert query(bq, literal) == [{"c": 5}]


def test_time_travel_ends_at_the_window_and_the_tables_creation(bq):
    sql = f"SELECT COUNT(*) FROM `{TABLE}` FOR SYSTEM_TIME AS OF @at"
    created_ms = int((NOW - 3 * DAY).timestamp() * 1000)
    early = NOW - 4 * DAY
    with pytest.raises(
        exceptions.BadRequest, match=rf"Invalid snapshot time \d+ for table {PROJECT}:examples.dolly@\d+"
    ):
        query(bq, sql, at=("TIMESTAMP", early))
    with pytest.raises(exceptions.BadRequest, match=f"Cannot read before {created_ms}"):
        query(bq, sql, at=("TIMESTAMP", early))
    bq.create_table(f"{PROJECT}.old.t", SCHEMA, at=NOW - 30 * DAY)
    bq.create_dataset(f"{PROJECT}.short", max_time_travel_hours=48, at=NOW - 30 * DAY)
    bq.create_table(f"{PROJECT}.short.t", SCHEMA, at=NOW - 30 * DAY)
    old = f"SELECT COUNT(*) AS c FROM `{PROJECT}.old.t` FOR SYSTEM_TIME AS OF @at"
    assert query(bq, old, at=("TIMESTAMP", NOW - 6 * DAY)) == [{"c": 0}]  # within the default 7 days
    with pytest.raises(exceptions.BadRequest, match="Invalid snapshot time"):
        query(bq, old, at=("TIMESTAMP", NOW - 8 * DAY))
    with pytest.raises(exceptions.BadRequest, match="Invalid snapshot time"):  # a 2-day window
        query(bq, old.replace(".old.", ".short."), at=("TIMESTAMP", NOW - 3 * DAY))
    with pytest.raises(exceptions.BadRequest, match="in the future"):
        query(bq, sql, at=("TIMESTAMP", NOW + DAY))
    bq.drop_table(TABLE)  # a dropped table is not found, at any time
    with pytest.raises(exceptions.NotFound, match=f"Table {PROJECT}:examples.dolly was not found in location US"):
        query(bq, sql, at=("TIMESTAMP", NOW - DAY))
    with pytest.raises(ValueError, match="48 to 168"):
        bq.create_dataset(f"{PROJECT}.odd", max_time_travel_hours=50)


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        (f"SELECT nope FROM `{TABLE}`", r"Unrecognized name: nope at \[1:8\]"),
        (f"SELECT * FROM `{TABLE}`\nWHERE (\nnope = 1\n)", r"Unrecognized name: nope at \[3:1\]"),
        (f"SELECT * FROM `{TABLE}` WHERE ts > @after", r"Query parameter 'after' not found at \[1:\d+\]"),
        (
            f"SELECT * FROM `{TABLE}` WHERE n = 'x'",
            "No matching signature for operator = for argument types: INT64, STRING",
        ),
        (f"SELECT * FROM `{TABLE}` WHERE ts > 'soon'", 'Could not cast literal "soon" to type TIMESTAMP'),
        (f"SELECT * FROM `{TABLE}` WHERE response", "WHERE clause should return type BOOL, but returns STRING"),
        (f"SELECT * FROM `{TABLE}` WHERE n =", r"Syntax error: Unexpected end of script at \[1:\d+\]"),
        (f"SELECT * FROM `{TABLE}` WHERE response = 'x", "Syntax error: Unclosed string literal"),
        (f"SELECT * FROM `{TABLE}` WHERE n = 1)", r'Syntax error: Unexpected "\)"'),
        (f"SELECT n, COUNT(*) FROM `{TABLE}`", "SELECT list expression references column n which is neither grouped"),
        (f"SELECT * FROM `{TABLE}` WHERE LOWER(response) = 'x'", "'LOWER' here is not supported by the emulator"),
        (f"SELECT * FROM `{TABLE}` WHERE n + 1 = 2", "'\\+' is not supported by the emulator"),
        (f"SELECT * FROM `{TABLE}` ORDER BY n", "'ORDER' here is not supported by the emulator"),
        (f"SELECT * FROM `{TABLE}`; SELECT 1", "'SELECT' here is not supported by the emulator"),
        (f"SELECT * FROM `{PROJECT}.nope.t`", f"Not found: Dataset {PROJECT}:nope was not found in location US"),
    ],
)
def test_query_errors_are_bigquerys_or_the_emulators_refusal(bq, sql, error):
    with pytest.raises((exceptions.BadRequest, exceptions.NotFound), match=error):
        query(bq, sql)


def test_legacy_sql_and_unknown_request_fields_are_refused(bq):
    config = bigquery.QueryJobConfig(use_legacy_sql=True)
    with pytest.raises(exceptions.BadRequest, match="Legacy SQL is not supported by the emulator"):
        client(bq).query_and_wait(f"SELECT * FROM [{TABLE}]", job_config=config)
    with pytest.raises(exceptions.BadRequest, match=r"QueryRequest fields \['dryRun'\]"):
        _post(bq, "queries", {"query": "SELECT 1", "dryRun": True})


def _post(bq, path: str, body: dict, token: str = TOKEN) -> dict:
    request = urllib.request.Request(
        f"{bq.endpoint}/bigquery/v2/projects/{PROJECT}/{path}",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as e:
        raise exceptions.from_http_status(e.code, json.loads(e.read())["error"]["message"]) from None


def test_a_repeated_request_id_answers_the_same_job(bq):
    body = {"query": f"SELECT COUNT(*) FROM `{TABLE}`", "useLegacySql": False, "requestId": "r-1"}
    first, again = _post(bq, "queries", body), _post(bq, "queries", body)
    assert first["jobReference"] == again["jobReference"] and len(bq.jobs) == 1
    assert first["kind"] == "bigquery#queryResponse" and first["rows"] == [{"f": [{"v": "5"}]}]


def test_members_need_bigquerys_roles_and_unknown_tokens_are_refused(bq):
    alice = bq.token_for(ALICE)
    sql = f"SELECT COUNT(*) AS c FROM `{TABLE}`"
    with pytest.raises(
        exceptions.Forbidden, match=f"Permission bigquery.tables.get denied on table {PROJECT}:examples"
    ):
        client(bq, alice).get_table(TABLE)
    with pytest.raises(
        exceptions.Forbidden, match=f"User does not have bigquery.jobs.create permission in project {PROJECT}"
    ):
        query(bq, sql, alice)
    bq.grant(ALICE, "roles/bigquery.jobUser", PROJECT)
    with pytest.raises(exceptions.Forbidden, match="User does not have permission to query table"):
        query(bq, sql, alice)
    bq.grant(ALICE, "roles/bigquery.metadataViewer", f"{PROJECT}.examples")  # the schema, not the data
    assert client(bq, alice).get_table(TABLE).num_rows == 5
    with pytest.raises(exceptions.Forbidden, match="User does not have permission to query table"):
        query(bq, sql, alice)
    bq.grant(ALICE, "roles/bigquery.dataViewer", TABLE)
    assert query(bq, sql, alice) == [{"c": 5}]
    (job,) = [j for j in bq.jobs.values() if j.member == ALICE and not j.error]
    assert job.resource["user_email"] == "alice@example.com"
    bob = bq.token_for("user:bob@example.com")
    with pytest.raises(exceptions.Forbidden, match="bigquery.jobs.get permission"):  # alice's job is hers
        client(bq, bob).get_job(job.job_id, location="US")
    assert client(bq).get_job(job.job_id, location="US").state == "DONE"  # the owner's
    assert client(bq).cancel_job(job.job_id, location="US").state == "DONE"  # a done job stays done
    with pytest.raises(exceptions.Unauthorized, match="invalid authentication credentials"):
        _post(bq, "queries", {"query": "SELECT 1"}, token="forged")
    with pytest.raises(ValueError, match="knows"):
        bq.grant(ALICE, "roles/bigquery.everything", PROJECT)


def test_injected_faults_and_what_the_client_retries(bq):
    bq.insert(TABLE, [_row(n, NOW - DAY) for n in range(5, 30)], at=NOW - DAY)
    bq.fail("jobs.getQueryResults", 503, times=1)  # backendError: retried by the client (its DEFAULT_RETRY)
    assert len(query(bq, f"SELECT n FROM `{TABLE}`", page_size=10)) == 30
    assert bq.calls.count("jobs.getQueryResults") == 3
    bq.fail("tables.get", 404, message="Not found: Table gone")  # notFound: not retried
    with pytest.raises(exceptions.NotFound, match="gone"):
        client(bq).get_table(TABLE)
    bq.fail("jobs.query", 403, message="Quota exceeded", reason="quotaExceeded")
    with pytest.raises(exceptions.Forbidden, match="Quota exceeded") as raised:
        query(bq, f"SELECT n FROM `{TABLE}`")
    assert raised.value.errors[0]["reason"] == "quotaExceeded"


def test_rows_are_checked_against_the_schema_when_the_tests_write_them(bq):
    with pytest.raises(ValueError, match="no such columns"):
        bq.insert(TABLE, [{"instruction": "x", "extra": 1}])
    with pytest.raises(ValueError, match="instruction is REQUIRED"):
        bq.insert(TABLE, [{"response": "x"}])
    with pytest.raises(ValueError, match="not a INT64 value"):
        bq.insert(TABLE, [{"instruction": "x", "n": "many"}])
    with pytest.raises(ValueError, match="created after"):
        bq.insert(TABLE, [{"instruction": "x"}], at=NOW - 5 * DAY)
    with pytest.raises(ValueError, match="NULLABLE or REQUIRED"):
        bq.create_table(f"{PROJECT}.examples.nested", [("r", "RECORD")])


def test_datasets_get_answers_conditional_access_entries_as_access_policy_version_says(bq):
    """datasets.get at accessPolicyVersion=3 lists an entry with its condition; unset, 0 or 1 without it, the role
    suffixed with a hash; another version is refused. A conditional grant allows nothing here."""
    from components.data.bigquery import dataset_access

    viewer = f"serviceAccount:reader@{PROJECT}.iam.gserviceaccount.com"
    office = {"title": "office-hours", "expression": "request.time.getHours('Europe/Berlin') < 18"}
    bq.grant(viewer, "roles/bigquery.dataViewer", f"{PROJECT}.examples", condition=office)
    (entry,) = [e for e in dataset_access(client(bq), f"{PROJECT}.examples") if e.entity_id == viewer.split(":")[1]]
    assert entry.role == "READER" and (entry.condition.title, entry.condition.expression) == tuple(office.values())
    (plain,) = [
        e for e in client(bq).get_dataset(f"{PROJECT}.examples").access_entries if e.entity_id.startswith("reader@")
    ]
    assert plain.condition is None and plain.role.startswith("roles/bigquery.dataViewer_with_conditionalbinding_")
    url = f"{bq.endpoint}/bigquery/v2/projects/{PROJECT}/datasets/examples?accessPolicyVersion=2"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 400 and "access policy version 2" in json.load(refused.value)["error"]["message"]
    with pytest.raises(exceptions.Forbidden):
        client(bq, bq.token_for(viewer)).get_table(TABLE)


def test_appends_returns_the_rows_inserted_in_its_window_by_commit_time(bq):
    """APPENDS: start inclusive, end exclusive, NULL the table's creation and the query's start; a row inserted then
    deleted is still there, an update adds none; _CHANGE_TYPE and _CHANGE_TIMESTAMP are its columns; a start past the
    dataset's time travel window is refused; a table created after the start starts at its creation."""
    first, second = NOW - DAY, NOW - DAY / 2
    bq.insert(TABLE, [_row(10, NOW - 9 * DAY)], at=first)  # committed late with an old ts
    bq.insert(TABLE, [_row(11, NOW)], at=second)
    bq.delete(TABLE, lambda r: r["n"] == 11, at=NOW - DAY / 4)
    bq.update(TABLE, lambda r: r["n"] == 0, {"response": "zero"}, at=NOW - DAY / 4)
    sql = f"SELECT n, _CHANGE_TYPE, _CHANGE_TIMESTAMP FROM APPENDS(TABLE `{TABLE}`, @start, @end)"
    window = query(bq, sql, start=("TIMESTAMP", first), end=("TIMESTAMP", second))
    assert window == [{"n": 10, "_CHANGE_TYPE": "INSERT", "_CHANGE_TIMESTAMP": first}]  # second: excluded
    after = query(bq, sql, start=("TIMESTAMP", first + timedelta(microseconds=1)), end=("TIMESTAMP", None))
    assert [r["n"] for r in after] == [11]  # deleted since, still an append; the update is none
    everything = query(bq, f"SELECT n FROM APPENDS(TABLE `{TABLE}`, NULL, NULL) WHERE n < @m", m=("INT64", 11))
    assert [r["n"] for r in everything] == [0, 1, 2, 3, 4, 10]
    with pytest.raises(exceptions.BadRequest, match="cannot read changes before .* time travel window"):
        query(bq, sql, start=("TIMESTAMP", NOW - 8 * DAY), end=("TIMESTAMP", None))
    bq.drop_table(TABLE)
    bq.create_table(TABLE, SCHEMA, at=NOW - DAY / 8)
    bq.insert(TABLE, [_row(20, NOW)], at=NOW - DAY / 8)
    assert [r["n"] for r in query(bq, sql, start=("TIMESTAMP", first), end=("TIMESTAMP", None))] == [20]


def test_datasets_get_answers_the_time_travel_window(bq):
    """An int64 in the REST API's JSON is a string; the client hands it on as it is."""
    bq.create_dataset(f"{PROJECT}.short", max_time_travel_hours=48)
    assert client(bq).get_dataset(f"{PROJECT}.short").max_time_travel_hours == "48"
    assert client(bq).get_dataset(f"{PROJECT}.examples").max_time_travel_hours == "168"


def test_a_result_over_the_maximum_response_size_needs_a_destination_table(bq):
    """Without a destination table a query's result is capped (``max_response_bytes``): past it the job fails with
    responseTooLarge, by jobs.query and by jobs.insert alike. The same query with a destination table writes it
    whole there: WRITE_EMPTY onto a table with rows is a duplicate, WRITE_TRUNCATE replaces them, CREATE_NEVER finds
    no table to write."""
    bq.insert(TABLE, [_row(n, NOW - DAY) for n in range(5, 200)], at=NOW - DAY)
    bq.max_response_bytes = 1_000
    sql = f"SELECT n, response FROM `{TABLE}`"
    with pytest.raises(exceptions.Forbidden, match="Response too large to return. Consider specifying a destination"):
        query(bq, sql)
    with pytest.raises(exceptions.Forbidden) as raised:
        client(bq).query(sql).result()
    assert raised.value.errors[0]["reason"] == "responseTooLarge"
    assert query(bq, f"SELECT COUNT(*) AS c FROM `{TABLE}`") == [{"c": 200}]  # a small result is answered
    bq.create_dataset(f"{PROJECT}.results")
    target = f"{PROJECT}.results.all"

    def into(write: str = "WRITE_EMPTY", create: str = "CREATE_IF_NEEDED", where: str = "") -> bigquery.QueryJob:
        config = bigquery.QueryJobConfig(destination=target, write_disposition=write, create_disposition=create)
        return client(bq).query(sql + where, job_config=config)

    job = into()
    job.result(max_results=0)
    assert job.destination.table_id == "all" and job.destination.dataset_id == "results"
    written = client(bq).get_table(target)
    assert written.num_rows == 200 and [f.name for f in written.schema] == ["n", "response"]
    assert written.expires is None  # its dataset has no default table expiration
    with pytest.raises(exceptions.Conflict, match=f"Already Exists: Table {PROJECT}:results.all"):
        into().result()
    into("WRITE_TRUNCATE", where=" WHERE n < 3").result()
    assert client(bq).get_table(target).num_rows == 3
    with pytest.raises(exceptions.NotFound, match=f"Not found: Table {PROJECT}:results.other"):
        config = bigquery.QueryJobConfig(destination=f"{PROJECT}.results.other", create_disposition="CREATE_NEVER")
        client(bq).query(sql, job_config=config).result()


def test_a_destination_is_written_in_its_jobs_location_by_who_may_write_its_dataset(bq):
    """The destination's dataset must exist and be where the job runs (the tables it reads); writing there takes
    bigquery.tables.create and bigquery.tables.updateData on it, refused in BigQuery's words."""
    sql = f"SELECT n FROM `{TABLE}`"
    bq.create_dataset(f"{PROJECT}.europe", location="EU")
    for dataset in ("europe", "nope"):
        config = bigquery.QueryJobConfig(destination=f"{PROJECT}.{dataset}.t")
        with pytest.raises(exceptions.NotFound, match=f"Not found: Dataset {PROJECT}:{dataset} was not found in "):
            client(bq).query(sql, job_config=config).result()
    bq.create_dataset(f"{PROJECT}.results")
    alice = bq.token_for(ALICE)
    bq.grant(ALICE, "roles/bigquery.jobUser", PROJECT)
    bq.grant(ALICE, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    bq.grant(ALICE, "roles/bigquery.dataViewer", f"{PROJECT}.results")
    config = bigquery.QueryJobConfig(destination=f"{PROJECT}.results.t")
    with pytest.raises(exceptions.Forbidden, match=f"Permission bigquery.tables.create denied on dataset {PROJECT}:"):
        client(bq, alice).query(sql, job_config=config).result()
    bq.grant(ALICE, "roles/bigquery.dataEditor", f"{PROJECT}.results")
    client(bq, alice).query(sql, job_config=config).result()
    assert client(bq, alice).get_table(f"{PROJECT}.results.t").num_rows == 5


def test_datasets_insert_makes_a_dataset_its_creator_owns_with_a_default_table_expiration(bq):
    """datasets.insert needs bigquery.datasets.create on the project; the dataset is in the location it names, with
    its labels and default table expiration (at least an hour), which every table written in it then gets; its
    creator is its OWNER, and may write, change and delete its tables; one that exists is a Conflict."""
    alice = bq.token_for(ALICE)
    made = bigquery.Dataset(f"{PROJECT}.mine")
    made.location, made.labels, made.default_table_expiration_ms = "EU", {"created-by": "tests"}, 2 * 3_600_000
    refusal = f"User does not have bigquery.datasets.create permission in project {PROJECT}"
    with pytest.raises(exceptions.Forbidden, match=refusal):
        client(bq, alice).create_dataset(made)
    bq.grant(ALICE, "roles/bigquery.user", PROJECT)
    got = client(bq, alice).create_dataset(made)
    assert got.location == "EU" and got.labels == {"created-by": "tests"}
    assert got.default_table_expiration_ms == 2 * 3_600_000
    assert {(e.role, e.entity_id) for e in got.access_entries} >= {("OWNER", "alice@example.com")}
    with pytest.raises(exceptions.Conflict, match=f"Already Exists: Dataset {PROJECT}:mine"):
        client(bq).create_dataset(made)
    short = bigquery.Dataset(f"{PROJECT}.short_lived")
    short.default_table_expiration_ms = 60_000
    with pytest.raises(exceptions.BadRequest, match="below 3600000"):
        client(bq).create_dataset(short)
    bq.create_dataset(f"{PROJECT}.europe", location="EU")
    bq.create_table(f"{PROJECT}.europe.src", SCHEMA, at=NOW - DAY)
    bq.grant(ALICE, "roles/bigquery.dataViewer", f"{PROJECT}.europe")
    config = bigquery.QueryJobConfig(destination=f"{PROJECT}.mine.t")
    life, before = timedelta(hours=2), datetime.now(UTC) - timedelta(milliseconds=1)
    client(bq, alice).query(f"SELECT * FROM `{PROJECT}.europe.src`", job_config=config).result()
    expires = client(bq, alice).get_table(f"{PROJECT}.mine.t").expires
    assert before + life <= expires <= datetime.now(UTC) + life  # written at the job's time, plus the default
    table = bigquery.Table(f"{PROJECT}.mine.t")
    table.expires = later = (NOW + DAY).replace(microsecond=0)
    assert client(bq, alice).update_table(table, ["expires"]).expires == later
    client(bq, alice).delete_table(f"{PROJECT}.mine.t")
    with pytest.raises(exceptions.NotFound):
        client(bq, alice).get_table(f"{PROJECT}.mine.t")
    client(bq, alice).delete_table(f"{PROJECT}.mine.t", not_found_ok=True)


def test_a_dataset_made_without_an_access_list_is_the_projects_viewers_and_one_made_with_one_keeps_it(bq):
    """datasets.insert without ``access`` gets BigQuery's defaults, the project's viewers READER, editors WRITER,
    owners OWNER, and its creator OWNER, so a viewer of the project (a basic role: it runs jobs) reads its tables;
    with ``access`` it keeps exactly that list (a predefined role in its legacy name), and the viewer may not read
    them, while the entries' members may; a domain's entry holds for the accounts at that domain, a group's for no
    one (the emulator knows no group's members), and both are listed back. A time travel window off BigQuery's steps
    is refused; one in its steps is kept."""
    viewer, bot = "user:viewer@example.com", "bot@p.iam.gserviceaccount.com"
    bq.grant(viewer, "roles/viewer", PROJECT)
    bq.grant(ALICE, "roles/bigquery.user", PROJECT)
    alice, peek = bq.token_for(ALICE), bq.token_for(viewer)
    client(bq, alice).create_dataset(bigquery.Dataset(f"{PROJECT}.open"))
    assert {(e.role, e.entity_type, e.entity_id) for e in client(bq).get_dataset(f"{PROJECT}.open").access_entries} == {
        ("READER", "specialGroup", "projectReaders"), ("WRITER", "specialGroup", "projectWriters"),
        ("OWNER", "specialGroup", "projectOwners"), ("OWNER", "userByEmail", "alice@example.com"),
    }  # fmt: skip
    kept = bigquery.Dataset(f"{PROJECT}.kept")
    kept.access_entries = [
        bigquery.AccessEntry("OWNER", "userByEmail", "alice@example.com"),
        bigquery.AccessEntry("roles/bigquery.dataEditor", "userByEmail", bot),
    ]
    kept.max_time_travel_hours = 48
    got = client(bq, alice).create_dataset(kept)
    assert {(e.role, e.entity_type, e.entity_id) for e in got.access_entries} == {
        ("OWNER", "userByEmail", "alice@example.com"), ("WRITER", "userByEmail", bot),
    }  # fmt: skip
    assert int(got.max_time_travel_hours) == 48 and bq.datasets[(PROJECT, "kept")].travel_hours == 48
    for name in ("open", "kept"):
        bq.create_table(f"{PROJECT}.{name}.t", SCHEMA, at=NOW - DAY)
        bq.insert(f"{PROJECT}.{name}.t", [_row(1, NOW - DAY)], at=NOW - DAY)
    assert query(bq, f"SELECT n FROM `{PROJECT}.open.t`", token=peek) == [{"n": 1}]
    with pytest.raises(exceptions.Forbidden, match=f"User does not have permission to query table {PROJECT}:kept.t"):
        query(bq, f"SELECT n FROM `{PROJECT}.kept.t`", token=peek)
    assert query(bq, f"SELECT n FROM `{PROJECT}.kept.t`", token=alice) == [{"n": 1}]
    bq.grant(f"serviceAccount:{bot}", "roles/bigquery.jobUser", PROJECT)
    assert query(bq, f"SELECT n FROM `{PROJECT}.kept.t`", token=bq.token_for(f"serviceAccount:{bot}")) == [{"n": 1}]
    team = bigquery.Dataset(f"{PROJECT}.team")
    team.access_entries = [
        bigquery.AccessEntry("OWNER", "userByEmail", "alice@example.com"),
        bigquery.AccessEntry("READER", "domain", "example.com"),
        bigquery.AccessEntry("WRITER", "groupByEmail", "ml@other.org"),
    ]
    got = client(bq, alice).create_dataset(team)
    assert {(e.role, e.entity_type, e.entity_id) for e in got.access_entries} == {
        ("OWNER", "userByEmail", "alice@example.com"), ("READER", "domain", "example.com"),
        ("WRITER", "groupByEmail", "ml@other.org"),
    }  # fmt: skip
    bq.create_table(f"{PROJECT}.team.t", SCHEMA, at=NOW - DAY)
    bq.insert(f"{PROJECT}.team.t", [_row(1, NOW - DAY)], at=NOW - DAY)
    assert query(bq, f"SELECT n FROM `{PROJECT}.team.t`", token=peek) == [{"n": 1}]  # at example.com
    carol = "user:carol@other.org"
    bq.grant(carol, "roles/bigquery.jobUser", PROJECT)
    with pytest.raises(exceptions.Forbidden, match=f"User does not have permission to query table {PROJECT}:team.t"):
        query(bq, f"SELECT n FROM `{PROJECT}.team.t`", token=bq.token_for(carol))  # no group's members are known
    odd = bigquery.Dataset(f"{PROJECT}.odd")
    odd._properties["maxTimeTravelHours"] = 50  # the client's own setter refuses it first
    with pytest.raises(exceptions.BadRequest, match="maxTimeTravelHours 50 is not 48 to 168"):
        client(bq, alice).create_dataset(odd)
    with pytest.raises(ValueError, match="basic role, granted on a project"):
        bq.grant(viewer, "roles/viewer", f"{PROJECT}.open")


def test_changing_or_deleting_a_table_takes_its_permission_and_an_expired_table_is_gone(bq):
    """tables.patch needs bigquery.tables.update, tables.delete bigquery.tables.delete (a reader holds neither); a
    table whose expirationTime has passed on the emulator's clock is not found."""
    bob = "user:bob@example.com"
    bq.grant(bob, "roles/bigquery.dataViewer", f"{PROJECT}.examples")
    table = bigquery.Table(TABLE)
    table.expires = NOW + timedelta(hours=6)
    with pytest.raises(exceptions.Forbidden, match="Permission bigquery.tables.update denied on table"):
        client(bq, bq.token_for(bob)).update_table(table, ["expires"])
    with pytest.raises(exceptions.Forbidden, match="Permission bigquery.tables.delete denied on table"):
        client(bq, bq.token_for(bob)).delete_table(TABLE)
    assert client(bq).update_table(table, ["expires"]).expires is not None
    assert client(bq).get_table(TABLE).num_rows == 5  # not yet
    bq.clock = lambda: (datetime.now(UTC) + timedelta(hours=7)).timestamp()
    with pytest.raises(exceptions.NotFound, match=f"Not found: Table {PROJECT}:examples.dolly"):
        client(bq).get_table(TABLE)
    assert "dolly" not in bq.datasets[(PROJECT, "examples")].tables
