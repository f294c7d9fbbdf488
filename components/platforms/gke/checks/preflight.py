"""Preflight: before a gke run spends anything, every reason it would fail for lack of quota, capacity, access or
set-up, found with read-only calls and reported together.

What is checked derives from the run's plan (``plan.resources``), the one source of what the run does, through
``needs`` (what the run needs of the project, no call made):
- the APIs the plan's calls go to are enabled in the project (Service Usage ``BatchGetServices``);
- the caller holds the IAM permissions those calls need (Resource Manager ``projects.testIamPermissions``);
- the region's TPU quota (Compute Engine ``regions.get``) has room for the chips of every slice, for on-demand, spot
  and flex-start capacity (spot and flex-start use the preemptible quota), where Compute Engine reports a metric for
  the family (``resources.QUOTA_METRICS``); a quota it cannot read is a warning in the report, never silence;
- what the location offers (``offers``): the GKE version on the cluster's release channel, the node pools' machine
  types in their zone, the default network a cluster the run creates uses;
- with ``cluster.capacity=reservation``: the reservation exists in the zone (``reservations.get``) and has room for
  the slices: a specific one a VM of the slice's machine type free for every host, an aggregate one enough chips of
  its TPU family, a block (``reservationBlocks.get``) a VM free for every host (``checks.reservations``);
- the nodes' service account (``gke.node_service_account``) holds the roles nodes need on the project
  (``target.node_roles``: logs, metrics, image pulls from this project's Artifact Registry), read from the project's
  IAM policy (Resource Manager ``projects.getIamPolicy``), and where that leaves one missing from the policies it
  inherits, custom roles and groups (``node_account``); from the same policy, warnings (``identities``) when the
  nodes or Cloud Build (``gke.build_service_account``) run as a default account or as one that holds a basic role
  (Owner, Editor) on the project;
- the run's budget (``run.max_cost_usd``, else the default derived from the plan) holds the plan's expected cost
  (``components.workload.budget``); a price the table lacks leaves it unchecked, which is a warning naming the price;
- with ``gke.cluster_name``: the cluster exists and lacks no feature that GKE cannot enable in place (``features``),
  and a warning when its nodes are not private (``network.public_nodes_risk``);
  the ones it can enable, provision enables before it creates any node pool; its Kubernetes API can be reached and
  lets the caller do what the run does in its namespace (``k8s_access``: SelfSubjectAccessReviews); its KubeRay (the
  RayCluster CRD it serves, read through that API) has every field the run sets (``kube.kuberay_refusal``); with
  ``cluster.capacity=queued``, it serves the ProvisioningRequest API (``checks.queued``).

:func:`check` raises :class:`PreflightFailed` listing every problem (exit 2); nothing has been created then.
``provision`` calls it first; ``tpupipe preflight PRESET`` calls it alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from components.platforms.gke.checks import node_account, offers, queued, reservations
from components.platforms.gke.checks.findings import PreflightFailed, Problem, Report
from components.platforms.gke.cloud import compute as gke_compute
from components.platforms.gke.cloud.control_plane import control_plane
from components.platforms.gke.plan import features, identities, k8s_actions, network, paths
from components.platforms.gke.plan.needs import ACT_AS, Needs, needs
from components.platforms.gke.plan.target import DEFAULT_NODE_SERVICE_ACCOUNT
from components.spec import RunSpec
from components.spec.names import STATE_PREFIX
from components.workload import weights
from components.workload.cache import CACHE_PREFIX
from components.workload.cache_trust import MANIFESTS_PREFIX, GcsPlace

if TYPE_CHECKING:
    from google.auth.credentials import Credentials
    from google.cloud import service_usage_v1
    from google.cloud.container_v1 import Cluster

SERVICE_USAGE_EMULATOR_HOST_ENV = "TPUPIPE_SERVICE_USAGE_EMULATOR_HOST"


def check(spec: RunSpec, run_id: str, log: Callable[[str], None] = print, creds: Credentials | None = None) -> Report:
    """Run every check; raise :class:`PreflightFailed` with all the problems, else the report of what was found."""
    n = needs(spec, run_id)
    if creds is None:
        from components.cloud.credentials import credentials

        creds = credentials()
    report = Report()
    _limits(spec, run_id, report)
    steps = (
        _apis,
        _permissions,
        _identities,
        _quota,
        reservations.check,
        _cluster,
        _kubernetes,
        queued.check,
        _kueue,
        offers.version,
        offers.machine_types,
        offers.flex_start,
        offers.default_network,
        _bucket,
        _data,
    )
    for step in steps:
        try:
            step(n, spec, creds, report)
        except Exception as exc:  # a check that cannot be made is itself a problem, reported with all
            from google.api_core import exceptions as gexc

            from components.cloud.credentials import access_error

            if not isinstance(exc, gexc.GoogleAPICallError):
                raise
            why = access_error(exc)
            if why is not None and why.whole:  # no credentials, no such project: no check can be made, one line
                raise why from None
            report.problems.append(Problem(step.__name__.strip("_"), f"could not be checked: {why or exc.message}"))
    for line in report.checked:
        log(f"preflight: {line}")
    for line in report.warnings:
        log(f"preflight: warning: {line}")
    if report.problems:
        raise PreflightFailed(f"preflight of run {run_id} in project {n.project}", report.problems, report.warnings)
    return report


def _bucket(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """An existing bucket (``gke.bucket``) has uniform bucket-level access (``storage.without_uniform_access``) and,
    for a trainer that commits its checkpoints by renaming a directory (MaxText), hierarchical namespace
    (``storage.without_hierarchical_namespace``); one that does not exist yet is created with them at provision."""
    from google.api_core import exceptions as gexc

    from components.cloud import storage

    name = n.bucket
    try:
        bucket = storage.storage_client(n.project, creds).get_bucket(name)
    except gexc.NotFound:
        return
    except gexc.Forbidden as exc:
        refusal = storage.unreadable(name, exc.message)
        report.problems.append(Problem(refusal.field, str(refusal).removeprefix(f"{refusal.field}: ")))
        return
    uniform = storage.without_uniform_access(bucket)
    if uniform:
        report.problems.append(Problem(uniform.field, str(uniform).removeprefix(f"{uniform.field}: ")))
    else:
        report.checked.append(f"bucket gs://{name}: uniform bucket-level access")
    if n.bucket_hierarchical:
        flat = storage.without_hierarchical_namespace(bucket)
        if flat:
            report.problems.append(Problem(flat.field, str(flat).removeprefix(f"{flat.field}: ")))
        else:
            report.checked.append(f"bucket gs://{name}: hierarchical namespace (atomic renames of checkpoint steps)")
    trusted = GcsPlace(name, f"{STATE_PREFIX}/{MANIFESTS_PREFIX}", bucket.client)  # the train stage's records
    where = f"gs://{name}/{CACHE_PREFIX}"
    report.checked += weights.lookup_lines(
        spec.train.model_id, spec.train.workload, where, trusted, spec.train.model_revision
    )


def _data(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """The run's Cloud Storage datasets can be read by the caller, who takes the data snapshot (the pipeline's first
    task runs as the same identity): each permission the bucket denies (``buckets.testIamPermissions``), a problem
    naming the role and the bucket. The pods never read them: the snapshot copies the examples into the run's prefix.
    A BigQuery dataset: ``bigquery.readsessions.create`` and ``bigquery.readsessions.getData`` (and
    ``bigquery.jobs.create`` for the rows committed since the champion, and the dataset their query writes to: one to
    create, or one in the table's location) where it is billed, and read on the table (``_bigquery_data``)."""
    from components.data import gcs
    from components.spec import datasets

    t = spec.train
    for key, value in (("train.dataset", t.dataset), ("train.eval_dataset", t.eval_dataset)):
        if value and datasets.kind(value) == "bigquery":
            _bigquery_data(spec, key, value, creds, report)
        if not value or datasets.kind(value) != "gcs":
            continue
        bucket = gcs.parse(value, key)[0]
        missing = gcs.missing_read(bucket, field=key)
        if missing:
            who = gcs.caller(creds)
            report.problems.append(
                Problem(
                    key,
                    f"the caller{' ' + who if who else ''} may not read gs://{bucket} (it lacks {', '.join(missing)}), "
                    f"which the run's data snapshot reads: {gcs.read_hint(bucket, who)}",
                )
            )
        else:
            report.checked.append(f"{key}: the caller may list and read gs://{bucket}")


def _bigquery_data(spec: RunSpec, key: str, value: str, creds: Credentials, report: Report) -> None:
    """A BigQuery dataset, as the caller: it may create read sessions (the Storage Read API's) in the project they
    are billed in (``snapshot.job_project``: ``train.bigquery_project``, else ``gke.project``; Resource Manager's
    projects.testIamPermissions, as for the run's own permissions), and jobs there too with
    ``train.data_since=champion`` (the APPENDS query of the rows committed since the champion), and may read the
    table (BigQuery's tables.testIamPermissions), wherever its project is; with ``train.data_since=champion``, the
    dataset the APPENDS query writes its result to (``_results_dataset``: with ``train.bigquery_service_account``,
    that account's own, else the caller's, unless one is named). Those test the caller's permissions, while
    on Vertex AI and KFP the snapshot runs as the pipeline's service account: with ``train.bigquery_service_account``
    that account's roles are read too (``_bigquery_account``)."""
    from components.cloud import iam as cloud_iam
    from components.data import bigquery, snapshot
    from components.spec import datasets

    # A dated table (events_{date:%Y%m%d}) has its shape checked as today's; the day's table may not exist yet.
    table = bigquery.parse_table(datasets.render(value, datetime.now(UTC)), key)
    project = snapshot.job_project(spec) or table.rsplit(".", 2)[0]
    field = "train.bigquery_project" if spec.train.bigquery_project else "gke.project"
    who = _caller_named(creds)
    needed = {
        bigquery.READ_SESSION_PERMISSION: ("open BigQuery read sessions", "read session", "readSessionUser"),
        bigquery.READ_STREAM_PERMISSION: ("read BigQuery read sessions' rows", "read session", "readSessionUser"),
    }
    done = {bigquery.READ_STREAM_PERMISSION: "read"}  # what happens there: the session's rows are read (ReadRows)
    if key == "train.dataset" and spec.train.data_since == "champion":
        needed[bigquery.JOB_PERMISSION] = ("run BigQuery jobs", "APPENDS query", "jobUser")
    request = {"resource": f"projects/{project}", "permissions": list(needed)}
    held = set(cloud_iam.projects_client(creds).test_iam_permissions(request=request).permissions)
    for permission, (what, use, role) in needed.items():
        if permission in held:
            report.checked.append(f"{key}: as the caller{who}, may {what} in project {project} (billed there)")
            continue
        report.problems.append(
            Problem(
                field,
                f"the caller{who} lacks {permission} in project {project}, where the data snapshot's BigQuery "
                f"{use} reading {table} is {done.get(permission, 'created')} and billed: grant "
                f"roles/bigquery.{role} on {project}, or name another project in train.bigquery_project",
            )
        )
    if datasets.dated(value):
        _dated_table(key, value, table, project, who, report)
    elif missing := bigquery.missing_read(table, project, field=key):
        report.problems.append(
            Problem(
                key,
                f"the caller{who} may not read {table} (it lacks {', '.join(missing)}): grant "
                f"roles/bigquery.dataViewer on the dataset {table.rsplit('.', 1)[0]} (or the table)",
            )
        )
    else:
        report.checked.append(f"{key}: as the caller{who}, may read {table}")
    # a dated table's day may not exist yet: its row access policies are the snapshot's to meet
    policies = None if datasets.dated(value) else bigquery.row_access_policies(table, project)
    if policies:
        report.warnings.append(
            f"{key}: {table} has {policies} row access polic{'y' if policies == 1 else 'ies'}: the data snapshot reads "
            f"it as of a past time (its snapshot time, APPENDS), which only an identity holding "
            f"{bigquery.OVERRIDE_TIME_TRAVEL} (a custom role holding it alone) and the TRUE filter may "
            f"({bigquery.ROW_POLICIES_SOURCE}; docs/recurring.md)"
        )
    elif policies is None and not datasets.dated(value):
        report.checked.append(f"{key}: {table}'s row access policies not listed (no bigquery.rowAccessPolicies.list)")
    results, absent = "", False
    account = spec.train.bigquery_service_account
    if bigquery.JOB_PERMISSION in needed:  # the APPENDS path: its result tables' dataset
        setting = spec.train.bigquery_results_dataset
        results, absent = _results_dataset(key, table, project, setting, creds, who, account, report)
    if account:
        jobs = bigquery.JOB_PERMISSION in needed
        _bigquery_account(account, key, table, project, creds, report, jobs, results if absent else "")


def _results_dataset(
    key: str, table: str, project: str, setting: str, creds: Credentials, who: str, account: str, report: Report
) -> tuple[str, bool]:
    """The dataset the APPENDS query writes its result tables to, in the jobs' ``project``
    (components/data/bigquery.py): ``train.bigquery_results_dataset``, a team's, else the own one of the identity the
    data snapshot runs as, named after its e-mail and ``table``'s location (``bigquery.results_dataset_name``):
    ``account`` (``train.bigquery_service_account``) when it is named, else the caller (``caller_email``; none, a
    problem). Read as the caller (datasets.get with its access list: ``bigquery.dataset_resource``), a refusal of that
    read a problem and any other failure a warning that it was not checked. Absent: a named one is a problem (it is
    made in advance); an identity's own is created by the data snapshot, which takes ``bigquery.datasets.create`` on
    the project: the caller's asked here (Resource Manager's projects.testIamPermissions), the account's read from the
    IAM policies by ``_bigquery_account``. There: in the location of ``table``'s dataset (a query writes only to a
    dataset of the location of the tables it reads: https://cloud.google.com/bigquery/docs/writing-results), with a
    default table expiration (else a problem: a result table of a run killed before its own expiration would keep its
    rows; one longer than ``bigquery.RESULTS_DEFAULT_EXPIRATION`` a warning), its access list open to no one beyond
    named identities (``bigquery.open_access``: a problem) and shared with no domain, group or other identity
    (``bigquery.shared_access``: a warning); the account holding a role that creates tables in it
    (``_results_account``), or without one, the caller holding what its tables take (``bigquery.RESULTS_PERMISSIONS``)
    by a grant on the project, the one grant an API tests before a table is there (tables.testIamPermissions asks of
    a table), a grant on the dataset itself said to be unchecked. The dataset's name and whether the data snapshot
    would create it."""
    from components.cloud import iam as cloud_iam
    from components.cloud.credentials import caller_email
    from components.data import bigquery

    field = bigquery.RESULTS_FIELD
    try:
        source = bigquery.dataset_location(table.rsplit(".", 1)[0], project, creds) or ""
    except bigquery.failures():
        source = ""  # its dataset not to be seen: the table's own check says so
    identity = "" if setting else account or caller_email(creds)
    if not setting and not identity:
        report.problems.append(
            Problem(
                field,
                f"the caller{who} has no e-mail to name its own dataset for the APPENDS query's result tables after "
                f"({bigquery.RESULTS_PREFIX}_LOCATION_HASH): an identity with no Google account behind it (a "
                "federated principal that impersonates no service account) names one made in advance here; or name "
                "the service account the data snapshot runs as in train.bigquery_service_account",
            )
        )
        return "", False
    if not setting and not source:
        report.checked.append(
            f"{key}: the dataset the APPENDS query writes its result to not checked: its name, "
            f"{bigquery.RESULTS_PREFIX}_LOCATION_HASH, follows the table's location, which the caller{who} may not read"
        )
        return "", False
    results = f"{project}.{bigquery.results_dataset_name(setting, source, identity)}"
    try:
        found = bigquery.dataset_resource(bigquery.client(project, creds), results)
    except bigquery.failures() as exc:
        from google.api_core.exceptions import NotFound

        if not isinstance(exc, NotFound):
            _results_unseen(results, project, who, exc, report)
            return results, False
        found = None
    where = f" in {source}" if source else ""
    projects = cloud_iam.projects_client(creds)
    if found is None and setting:
        steps = bigquery.make_steps(results, source, "each identity that runs with it as WRITER")
        report.problems.append(
            Problem(field, f"the dataset {results}, named for the APPENDS query's result tables, does not exist: make "
                           f"it once, {steps}; or leave {field} empty for each identity's own"),
        )  # fmt: skip
        return results, False
    if found is None and account:
        report.checked.append(
            f"{key}: the dataset {results}, {account}'s own for the APPENDS query's result tables, absent: the data "
            f"snapshot creates it{where}, {account} its one owner"
        )
        return results, True
    if found is None:
        asked = {"resource": f"projects/{project}", "permissions": [bigquery.DATASET_CREATE_PERMISSION]}
        if set(projects.test_iam_permissions(request=asked).permissions):
            report.checked.append(
                f"{key}: as the caller{who}, may create its own dataset {results} for the APPENDS query's result "
                f"tables (absent: the data snapshot creates it{where}, the caller its one owner)"
            )
        else:
            report.problems.append(
                Problem(
                    field,
                    f"the dataset {results}, the caller's own where the data snapshot's APPENDS query writes its "
                    f"result, does not exist, and the caller{who} lacks {bigquery.DATASET_CREATE_PERMISSION} in "
                    f"project {project} to create it: make a dataset{where}, grant roles/bigquery.dataEditor on it "
                    f"alone and name it in {field} (the least privilege), or grant roles/bigquery.user on {project}",
                )
            )
        return results, True
    _results_found(key, table, source, results, found, identity, report)
    if account:
        _results_account(account, key, results, project, found.access_entries, creds, report)
        return results, False
    asked = {"resource": f"projects/{project}", "permissions": list(bigquery.RESULTS_PERMISSIONS)}
    missing = [
        p
        for p in bigquery.RESULTS_PERMISSIONS
        if p not in set(projects.test_iam_permissions(request=asked).permissions)
    ]
    if not missing:
        report.checked.append(
            f"{key}: as the caller{who}, may write, read and delete tables in {results} (granted on project {project})"
        )
    else:
        report.checked.append(
            f"{key}: the caller{who}'s grant on the dataset {results} not checked (on project {project} it lacks "
            f"{', '.join(missing)}; no API tests a dataset's grant before it has a table): the data snapshot's "
            "query names any it lacks"
        )
    return results, False


def _results_found(key: str, table: str, source: str, results: str, found: Any, identity: str, report: Report) -> None:
    """What the results dataset that is there must be, as the data snapshot refuses or warns of it
    (components/data/bigquery.py): in ``source`` (the table's location), with a default table expiration of at most
    ``bigquery.RESULTS_DEFAULT_EXPIRATION``, its access list not open (``bigquery.open_access``) nor shared
    (``bigquery.shared_access``; with ``identity``, the e-mail whose own dataset it is, any other entry)."""
    from components.data import bigquery

    field = bigquery.RESULTS_FIELD
    what = f"the dataset {results}, where the data snapshot's APPENDS query writes its result,"
    there = found.location or ""
    if source and there.lower() != source.lower():
        report.problems.append(
            Problem(
                field,
                f"{what} is in {there}, and {table} in {source}: a query writes to a dataset of the location of the "
                f"tables it reads; name one in {source}, or leave {field} empty (the data snapshot creates its own "
                "there)",
            )
        )
    else:
        report.checked.append(f"{key}: the dataset {results} is in {there}" + (f", as {table}" if source else ""))
    seconds = int(bigquery.RESULTS_DEFAULT_EXPIRATION.total_seconds())
    update = f"`bq update --default_table_expiration {seconds} {bigquery.bq_name(results)}`"
    expiration = int(found.default_table_expiration_ms or 0)
    if not expiration:
        report.problems.append(
            Problem(
                field,
                f"{what} has no default table expiration: a result table of a run killed before its own expiration is "
                f"set would keep its training rows for ever; {update}",
            )
        )
    elif expiration > seconds * 1000:
        report.warnings.append(
            f"{field}: {what} has a default table expiration of {expiration // 3_600_000} hours, more than "
            f"{seconds // 3600}: a result table of a run killed before its own expiration is set keeps its training "
            f"rows that long; {update}"
        )
    opened = bigquery.open_access(found.access_entries)
    if opened:
        report.problems.append(
            Problem(
                field,
                f"{what} grants {', '.join(opened)}: the training rows its result tables hold would be theirs to read "
                f"(or write); remove those entries: {bigquery.acl_steps(results)}",
            )
        )
    shared = bigquery.shared_access(found.access_entries, identity)
    if shared:
        report.warnings.append(
            f"{field}: {what} grants {', '.join(shared)}: the training rows its result tables hold are theirs to read "
            f"(or write) while they last; unless that is meant, remove them: {bigquery.acl_steps(results)}"
        )


def _results_unseen(results: str, project: str, who: str, exc: Exception, report: Report) -> None:
    """datasets.get of the results dataset failed: the caller's refusal (``bigquery.refused``) a problem, any other
    failure (a quota, an outage, the credentials) a warning that the dataset was not checked."""
    from components.data import bigquery

    if bigquery.refused(exc):
        report.problems.append(
            Problem(
                bigquery.RESULTS_FIELD,
                f"the caller{who} may not see the dataset {results}, where the data snapshot's APPENDS query writes "
                f"its result ({type(exc).__name__}): grant roles/bigquery.dataEditor on it (the least privilege), or "
                f"roles/bigquery.user on {project}",
            )
        )
    else:
        report.warnings.append(
            f"{bigquery.RESULTS_FIELD}: the dataset {results}, where the data snapshot's APPENDS query writes its "
            f"result, could not be checked ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
        )


def _results_account(
    account: str, key: str, results: str, project: str, entries: list[Any], creds: Credentials, report: Report
) -> None:
    """Whether ``account`` (``train.bigquery_service_account``, whom the data snapshot runs as) holds a role that
    creates tables in the results dataset that is there (``bigquery.TABLE_CREATE_ROLES``: WRITER or OWNER in its
    access list ``entries``, directly or by its special groups, or a dataset role granted on it or its project:
    ``bigquery.account_roles``): a warning when it holds none, or one only under an IAM condition, as for its other
    roles (``_bigquery_account``). A team's dataset (``train.bigquery_results_dataset``) made by another identity
    grants the account nothing by itself, and the run's query is refused there; the account's own lists it as OWNER."""
    from components.cloud import iam as cloud_iam
    from components.data import bigquery

    found = bigquery.account_roles(results, project, account, creds, entries)
    wanted = bigquery.TABLE_CREATE_ROLES
    under = cloud_iam.under_conditions(found.reading_conditional, wanted)
    _account_may(
        RoleCheck(f"create tables in {results}", "", wanted, found.reading, under, found.unread),
        key,
        account,
        f"roles/bigquery.dataEditor on the dataset {results}",
        report,
        why=", where the data snapshot's APPENDS query writes its result",
    )


def _dated_table(key: str, value: str, table: str, project: str, who: str, report: Report) -> None:
    """A dated table (``events_{date:%Y%m%d}``) is a new table each day, which need not exist before its day: its
    dataset must (datasets.get, which also needs a role that reads its tables), and the day's table is the
    snapshot's to find, a missing one a day without a drop under ``train.data_since=champion``."""
    from components.data import bigquery
    from components.spec import SpecError

    dataset = table.rsplit(".", 1)[0]
    try:
        there = bigquery.dataset_exists(dataset, project, field=key)
    except SpecError as exc:
        report.problems.append(Problem(key, str(exc).removeprefix(f"{key}: ")))
        return
    if there:
        report.checked.append(
            f"{key}: as the caller{who}, may see the dataset {dataset} of the dated table {value} (each day's table "
            "is read by the data snapshot)"
        )
    else:
        report.problems.append(
            Problem(key, f"the dataset {dataset}, where the dated tables of {value} are, does not exist")
        )


def _caller_named(creds: Credentials) -> str:
    """`` (MEMBER)`` of the credentials where they say who they are, else ""."""
    from components.data import gcs

    who = gcs.caller(creds)
    return f" ({who})" if who else ""


def _bigquery_account(
    account: str, key: str, table: str, project: str, creds: Credentials, report: Report, jobs: bool, create: str = ""
) -> None:
    """Whether the pipeline's service account holds a role that opens read sessions in ``project``, one that runs
    jobs there (``jobs``: for ``train.data_since=champion``), one that creates the dataset ``create`` there (the
    APPENDS query's results dataset, when it is absent), and one that reads ``table``
    (``bigquery.account_roles``: the projects' IAM policies and the dataset's access list): a warning for each it
    lacks, since a role through a group, a custom role or an organization's policy is not seen here; a role
    held only under an IAM condition is not counted, and the warning names it and the condition."""
    from components.cloud import iam as cloud_iam
    from components.data import bigquery

    found = bigquery.account_roles(table.rsplit(".", 1)[0], project, account, creds)
    dataset = table.rsplit(".", 1)[0]
    checks = (
        (
            "open BigQuery read sessions",
            found.on_project,
            found.on_project_conditional,
            bigquery.READ_SESSION_ROLES,
            f"in project {project}",
            "roles/bigquery.readSessionUser",
        ),
        (
            "run BigQuery jobs",
            found.on_project,
            found.on_project_conditional,
            bigquery.JOB_ROLES,
            f"in project {project}",
            "roles/bigquery.jobUser",
        ),
        (
            f"create the dataset {create}",
            found.on_project,
            found.on_project_conditional,
            bigquery.DATASET_CREATE_ROLES,
            f"in project {project}",
            "roles/bigquery.user",
        ),
        (
            f"read {table}",
            found.reading,
            found.reading_conditional,
            bigquery.READ_ROLES,
            f"on the dataset {dataset} or its project",
            "roles/bigquery.dataViewer",
        ),
    )
    for what, roles, conditional, wanted, where, grant in checks:
        if (what == "run BigQuery jobs" and not jobs) or (what.startswith("create the dataset") and not create):
            continue
        on_project = where == f"in project {project}"
        unseen = [u for u in found.unread if u.startswith(f"project {project}'s") == on_project]
        under = cloud_iam.under_conditions(conditional, wanted)
        _account_may(RoleCheck(what, where, wanted, roles, under, unseen), key, account, grant, report)


@dataclass(frozen=True)
class RoleCheck:
    """What the data snapshot's account must be able to do (``what``, ``where``: "" when ``what`` says it), the roles
    that let it (``wanted``), and what was found: the roles it holds there (``held``), those it holds only under an
    IAM condition (``under``: ``components.cloud.iam.under_conditions``) and the policies the caller could not read
    (``unread``)."""

    what: str
    where: str
    wanted: tuple[str, ...]
    held: set[str]
    under: list[str]
    unread: list[str]


def _account_may(check: RoleCheck, key: str, account: str, grant: str, report: Report, why: str = "") -> None:
    """One of ``train.bigquery_service_account``'s roles, reported: a role that lets it, checked; one only under an IAM
    condition, a warning naming it and the condition (not counted: preflight does not evaluate conditions); none, a
    warning naming ``grant`` (after ``why`` it is needed), since a role through a group, a custom role or an
    organization's policy is not seen here."""
    field, r = "train.bigquery_service_account", check
    where = f" {r.where}" if r.where else ""
    action = r.what + where
    held = sorted(r.held & set(r.wanted))
    if held:
        report.checked.append(f"{key}: {account} may {r.what} ({', '.join(held)}{where})")
    elif r.under:
        report.warnings.append(
            f"{field}: {account}, whom the data snapshot runs as, may {action} only under an IAM condition: "
            f"{'; '.join(r.under)}: IAM grants it only to the requests the condition holds for, which preflight "
            "does not evaluate; make sure it admits the run's requests (its dataset, its dates)"
        )
    else:
        unseen = f"; not readable as the caller: {', '.join(r.unread)}" if r.unread else ""
        report.warnings.append(
            f"{field}: {account}, whom the data snapshot runs as, holds no role that may {action} "
            f"(of {', '.join(r.wanted)}; its roles there: {', '.join(sorted(r.held)) or 'none'}{unseen}){why}: "
            f"grant {grant}, unless a group, a custom role or the organization gives it"
        )


def _limits(spec: RunSpec, run_id: str, report: Report) -> None:
    """The plan's expected cost against the run's budget (``components.workload.budget``), no call made: over it, a
    problem; a price unknown, a warning naming it (the budget cannot be checked)."""
    from components.platforms.gke.plan import document as plan
    from components.workload import budget

    cost = plan.cost(spec, run_id)
    lim = budget.limits(spec, cost)
    problem, unchecked = budget.plan_check(lim, cost)
    if problem:
        report.problems.append(Problem("run.max_cost_usd", problem))
    if unchecked:
        report.warnings.append(unchecked)
    spend, deadline = budget.describe(lim)
    report.checked.append(f"budget {spend}; deadline {deadline}")


def _apis(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    from google.cloud import service_usage_v1

    response = service_usage_client(creds).batch_get_services(
        request={"parent": f"projects/{n.project}", "names": [f"projects/{n.project}/services/{s}" for s in n.services]}
    )
    disabled = [s.name.rsplit("/", 1)[-1] for s in response.services if s.state != service_usage_v1.State.ENABLED]
    if disabled:
        report.problems.append(
            Problem(
                "apis",
                f"not enabled in project {n.project}: {', '.join(disabled)} (enable "
                "them in the console's API Library, then run again)",
            )
        )
    report.checked.append(f"{len(n.services) - len(disabled)} of {len(n.services)} APIs enabled")


def _permissions(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    from components.cloud import iam as cloud_iam

    held = set(
        cloud_iam.projects_client(creds)
        .test_iam_permissions(request={"resource": f"projects/{n.project}", "permissions": list(n.permissions)})
        .permissions
    )
    lacking = [p for p in n.permissions if p not in held]
    if ACT_AS in lacking:  # not on the project: it may still be granted on each account itself (least privilege)
        lacking.remove(ACT_AS)
        for field, account in n.act_as:
            if "PROJECT_NUMBER" in account:  # the default Compute Engine account, its number looked up
                account = account.replace("PROJECT_NUMBER", cloud_iam.project_number(n.project, creds))
            if cloud_iam.may_act_as(account, creds):
                report.checked.append(f"{ACT_AS} on {account} ({field}), granted on the account")
            else:
                report.problems.append(_act_as(n.project, field, account))
    if lacking:
        report.problems.append(
            Problem(
                "permissions",
                f"the caller lacks on project {n.project}: {', '.join(lacking)} "
                "(grant a role that has them, e.g. roles/container.admin, "
                "roles/compute.networkAdmin, roles/storage.admin)",
            )
        )
    report.checked.append(f"{len(held)} of {len(n.permissions)} permissions held")
    if n.reservation and n.owner_permissions:  # a shared reservation: read in its owner project
        owner = n.reservation.project
        request = {"resource": f"projects/{owner}", "permissions": list(n.owner_permissions)}
        held_there = set(cloud_iam.projects_client(creds).test_iam_permissions(request=request).permissions)
        missing = [p for p in n.owner_permissions if p not in held_there]
        if missing:
            report.problems.append(
                Problem(
                    "cluster.reservation",
                    f"the caller lacks on project {owner}, which owns the shared reservation {n.reservation.name}: "
                    f"{', '.join(missing)} (a shared reservation is read in its owner project; ask its owners for "
                    "roles/compute.viewer there)",
                )
            )
        else:
            report.checked.append(f"{', '.join(n.owner_permissions)} held on project {owner}, the reservation's owner")
    if n.location and "k8s/ResourceClaimTemplate" in n.k8s_kinds:
        report.warnings.append(
            "the run's ResourceClaimTemplate (the DCN NICs) in the cluster it creates: no IAM permission for "
            f"resource.k8s.io objects is documented ({', '.join(k8s_actions.UNMAPPED_GROUPS)}), so whether the caller "
            "may create and delete it is not checked"
        )


# Who refuses a caller that cannot act as the account a field names.
ACTS_AS = {
    "gke.node_service_account": ("the nodes run", "GKE creates no node pool"),
    "gke.build_service_account": ("Cloud Build runs the image build", "Cloud Build starts no build"),
}


def _act_as(project: str, field: str, account: str) -> Problem:
    who, refusal = ACTS_AS[field]
    return Problem(
        field,
        f"the caller lacks {ACT_AS} on project {project} and on {account}: {who} as it, and {refusal} for a "
        "caller that cannot act as it: grant roles/iam.serviceAccountUser on that account (or on the project), or "
        "name an account the caller can act as",
    )


def _identities(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """What the project's IAM policy (one read) grants the nodes' account and Cloud Build's: the roles nodes need
    (problems; ``node_account``: inherited, custom and group grants too), and the risks of the default accounts and
    of basic roles (warnings). The default accounts themselves are problems unless ``gke.allow_default_identities``:
    the nodes as the Compute Engine default one (when the run makes nodes), Cloud Build as the project's default
    build account or the Compute Engine one (when the run builds)."""
    from components.cloud import iam as cloud_iam

    account = n.node_account
    if account == DEFAULT_NODE_SERVICE_ACCOUNT:
        account = account.replace("PROJECT_NUMBER", cloud_iam.project_number(n.project, creds))
    if not spec.gke.allow_default_identities:
        if not spec.gke.queue and identities.is_default(account):
            report.problems.append(Problem("gke.node_service_account", identities.node_refusal(account)))
        if n.builds and (not n.build_account or identities.is_default(n.build_account)):
            report.problems.append(Problem("gke.build_service_account", identities.build_refusal(n.build_account)))
    policy = cloud_iam.project_level(n.project, creds)
    node_account.check(n, account, policy, creds, report)
    if n.builds:
        granted = policy.grants.get(f"serviceAccount:{n.build_account}", set())
        report.warnings += identities.build_risks(n.build_account, granted, n.project)


def _quota(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    if n.quota is None:
        return
    metric, chips = n.quota
    c = spec.cluster
    if not metric:
        report.warnings.append(
            f"TPU quota not checked: Compute Engine's regional quotas have no metric for {c.accelerator} "
            f"(resources.QUOTA_METRICS); the run needs {chips} {c.capacity} {c.accelerator} chips in {n.region} of "
            f"project {n.project}: see the console's Quotas page, else node pool creation fails with a quota error"
        )
        return
    region = gke_compute.client("RegionsClient", creds).get(project=n.project, region=n.region)
    found = {q.metric: q for q in region.quotas}
    if metric not in found:
        report.warnings.append(
            f"TPU quota {metric} not checked: {n.region} of project {n.project} does not list it; the run needs "
            f"{chips} chips"
        )
        return
    free = int(found[metric].limit - found[metric].usage)
    if free < chips:
        report.problems.append(
            Problem(
                "cluster.capacity",
                f"TPU quota {metric} in {n.region} of project {n.project}: "
                f"the run needs {chips} chips, {free} of {found[metric].limit:g} are free "
                f"({spec.cluster.capacity}); request more quota, use fewer slices "
                "(cluster.num_slices), or another capacity type (cluster.capacity)",
            )
        )
    report.checked.append(f"quota {metric} in {n.region}: {free} chips free, {chips} needed")


def _cluster(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    if not n.cluster:
        return
    from components.platforms.gke.cloud.cluster import Gke, cluster_manager

    cluster = Gke(cluster_manager(creds), log=lambda m: None).get_cluster(n.cluster)
    short = n.cluster.rsplit("/", 1)[-1]
    if cluster is None:
        report.problems.append(
            Problem(
                "gke.cluster_name", f"no cluster {short} in {paths.cluster_location(n.cluster)} of project {n.project}"
            )
        )
        return
    if not network.has_private_nodes(cluster):
        report.warnings.append(network.public_nodes_risk(short))
    report.enable += [f.name for f in features.to_enable(spec, cluster, n.project)]
    report.problems += [
        Problem("gke.cluster_name", f"cluster {short} lacks {reason}")
        for reason in features.refusals(spec, cluster, n.project)
    ]
    lacking = features.missing(spec, cluster, n.project)
    has = [f.name for f in features.needed(spec) if f not in lacking]
    report.checked.append(
        f"cluster {short}: has "
        + (", ".join(has) or "none of the features")
        + (f"; provision enables {', '.join(report.enable)}" if report.enable else "")
    )
    if cluster.addons_config.ray_operator_config.enabled:  # else provision enables it, then checks its KubeRay
        _kuberay(cluster, short, spec, creds, report)


def _kuberay(cluster: Cluster, short: str, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """The existing cluster's KubeRay serves every RayCluster field the run sets (its CRD, read through the
    cluster's Kubernetes API); one it cannot be read from is a warning: provision checks it again before any TPU
    node pool."""
    from components.platforms.gke.checks import k8s_access

    try:
        refusal, generates = k8s_access.existing_cluster_kuberay(cluster, creds, spec.gke.namespace)
    except Exception as exc:  # noqa: BLE001 - unreachable, or no access: said, and checked again by provision
        report.warnings.append(
            f"cluster {short}: KubeRay's version could not be read ({type(exc).__name__}: {str(exc)[:200]}); "
            "provision checks it before it creates any TPU node pool"
        )
        return
    if refusal is not None:
        report.problems.append(Problem(refusal.field, str(refusal).removeprefix(f"{refusal.field}: ")))
    elif generates:
        report.checked.append(
            f"cluster {short}: its KubeRay is 1.5 (authOptions without secretName): it generates the Ray token's "
            "Secret, which the run reads"
        )
    else:
        report.checked.append(f"cluster {short}: its KubeRay serves every RayCluster field the run sets")


def _kubernetes(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """An existing cluster's API server can be reached and lets the caller do what the run does (``k8s_access``)."""
    if not n.cluster:
        return
    from components.platforms.gke.checks import k8s_access
    from components.platforms.gke.cloud.cluster import Gke, cluster_manager

    cluster = Gke(cluster_manager(creds), log=lambda m: None).get_cluster(n.cluster)
    if cluster is not None and control_plane(cluster).host:  # no cluster: _cluster's problem
        k8s_access.check(cluster, n.cluster, n.namespace, n.k8s_kinds, creds, report)


def _kueue(n: Needs, spec: RunSpec, creds: Credentials, report: Report) -> None:
    """A run queued in Kueue (gke.queue): Kueue, the queue, its flavors and quota (``kueue``)."""
    if not (n.cluster and spec.gke.queue):
        return
    from kubernetes.client.exceptions import ApiException

    from components.platforms.gke.checks import k8s_access, kueue
    from components.platforms.gke.cloud.cluster import Gke, cluster_manager

    cluster = Gke(cluster_manager(creds), log=lambda m: None).get_cluster(n.cluster)
    if cluster is None or not control_plane(cluster).host:  # no cluster: _cluster's problem
        return
    try:
        with k8s_access.preflight_kube(cluster, creds, n.namespace) as kube:
            kueue.check(kube, spec, report)
    except ApiException as exc:
        report.problems.append(Problem("gke.queue", f"Kueue's objects could not be read: {exc.status} {exc.reason}"))
    except OSError:  # an API server that cannot be reached: k8s_access's problem
        return


# ---------------------------------------------------------------- clients


def service_usage_client(creds: Credentials) -> service_usage_v1.ServiceUsageClient:
    """Service Usage's client: to the emulator named by $TPUPIPE_SERVICE_USAGE_EMULATOR_HOST, else to Google."""
    from google.cloud import service_usage_v1

    from components.cloud.credentials import google_client

    return google_client(service_usage_v1.ServiceUsageClient, SERVICE_USAGE_EMULATOR_HOST_ENV, creds=creds)


def render(spec: RunSpec, run_id: str, report: Report) -> str:
    """The report of a preflight that passed."""
    lines = [f"preflight {spec.name} (run {run_id}): no problem found; nothing was created"]
    lines += [f"  {line}" for line in report.checked]
    lines += [f"  warning: {line}" for line in report.warnings]
    return "\n".join(lines) + "\n"
