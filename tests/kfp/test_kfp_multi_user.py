"""`tpupipe submit`, `schedule create` and `runs list` against a multi-user Kubeflow Pipelines server
(tests/emulators/kfp.py with ``multi_user``: each request on a namespace authenticated by a TokenReview-checked
bearer token or the user id header, then authorized in the namespace): with ``--kfp-auth token`` (or ``--kfp-auth
userid --kfp-user``) and a namespace its user may use, the run and the recurring run are created there; without a
token, exit 2 naming ``--kfp-auth`` before anything is created; a token for another audience, or a namespace its user
may not use, one line naming the flag to check, and no run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kfp.conftest import start_kfp
from tests.kfp.test_kfp_backend import OVERRIDES, _fail_at_preflight

USER, NAMESPACE = "alice@example.com", "team-a"


@pytest.fixture
def multi_user(project_factory, tmp_path):
    kfp = start_kfp(project_factory(polls_to_done=1), tmp_path)
    kfp.server.multi_user = True
    kfp.server.grant(USER, NAMESPACE)
    _fail_at_preflight(kfp.project)
    return kfp


def token_file(kfp, tmp_path, **audiences) -> str:
    path = tmp_path / "kfp-token"
    path.write_text(kfp.server.token_for(USER, **audiences) + "\n")
    path.chmod(0o600)
    return str(path)


def test_submit_and_schedule_with_a_token_are_created_in_the_users_namespace(multi_user, tmp_path, tpupipe):
    kfp = multi_user
    place = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE]
    place += ["--kfp-auth", "token", "--kfp-token-file", token_file(kfp, tmp_path)]
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *place)
    assert code == 0, out + err
    kfp_run = out.split("submitted run ", 1)[1].split()[0]
    (experiment,) = kfp.server.experiments.values()
    assert experiment["namespace"] == NAMESPACE and kfp.server.run(kfp_run).resource["namespace"] == NAMESPACE
    code, out, err = tpupipe(
        "schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", "0 3 * * *", *place
    )
    assert code == 0, out + err
    (recurring,) = kfp.server.recurring.values()
    assert recurring.resource["namespace"] == NAMESPACE
    code, out, err = tpupipe("runs", "list", *place)
    assert code == 0 and kfp_run in out, out + err
    kfp.server.wait(kfp_run, timeout_s=300)


def test_without_a_user_identity_or_in_a_namespace_not_its_users_no_run_is_created(multi_user, tmp_path, tpupipe):
    kfp = multi_user
    host = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE]
    for command in (["submit", "local-fsdp"], ["schedule", "create", "nightly", "local-fsdp", "--cron", "0 3 * * *"]):
        code, out, err = tpupipe(*command, "--set", OVERRIDES, *host)
        assert code == 2, out + err
        (error,) = [line for line in err.splitlines() if line.startswith("tpupipe: error:")]
        assert (
            error.startswith("tpupipe: error: --kfp-auth: the Kubeflow Pipelines server at") and "multi-user" in error
        )
        assert kfp.server.pipelines == {} and kfp.server.experiments == {}  # nothing was uploaded or made

    other = token_file(kfp, tmp_path, audiences=("https://kubernetes.default.svc",))  # a token for another audience
    code, out, err = tpupipe(
        "submit", "local-fsdp", "--set", OVERRIDES, *host, "--kfp-auth", "token", "--kfp-token-file", other
    )
    assert code == 1 and "User identity is empty" in err and "(check --kfp-auth)" in err, out + err

    mine = token_file(kfp, tmp_path)
    elsewhere = ["--kfp-host", kfp.host, "--kfp-namespace", "kubeflow", "--kfp-auth", "token", "--kfp-token-file", mine]
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *elsewhere)
    assert code == 1 and f"User '{USER}' is not authorized" in err and "check --kfp-namespace" in err, out + err
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *host, "--kfp-auth", "token")
    assert code == 2 and "--kfp-token-file: --kfp-auth token reads its bearer token from this file" in err, out + err
    Path(mine).chmod(0o644)  # as `kubectl create token > FILE` leaves it under umask 022
    code, out, err = tpupipe(
        "submit", "local-fsdp", "--set", OVERRIDES, *host, "--kfp-auth", "token", "--kfp-token-file", mine
    )
    assert code == 2 and f"--kfp-token-file: {mine} is open to other users of this machine (mode 644)" in err, out + err
    assert f"chmod 600 {mine}" in err
    assert kfp.server.jobs == {} and kfp.server.recurring == {} and kfp.server.experiments == {}
    assert kfp.server.pipelines == {}  # nothing uploaded with a token refused or a namespace not the user's


def _client_of(kfp, tmp_path, user: str, namespace: str):
    """A kfp.Client of ``user``, who may act in ``namespace``, as another tenant of the server makes one."""
    from pipelines.backends.kfp import jobs as kfp_backend

    kfp.server.grant(user, namespace)
    path = tmp_path / f"{user}-token"
    path.write_text(kfp.server.token_for(user))
    path.chmod(0o600)
    place = kfp_backend.Place(kfp.host, namespace=namespace, auth="token", token_file=str(path))
    return kfp_backend.client(place)


def _tampered(spec: dict, tmp_path) -> str:
    """``spec`` with every task's command replaced: what another user would have a victim's runner run."""
    import copy

    import yaml

    evil = copy.deepcopy(spec)
    for executor in evil["deploymentSpec"]["executors"].values():
        executor["container"]["command"] = ["sh", "-c", "echo exfiltrate"]
    path = tmp_path / "tampered.yaml"
    path.write_text(yaml.safe_dump(evil))
    return str(path)


def test_a_version_another_user_uploaded_under_the_same_name_is_never_run(multi_user, tmp_path, tpupipe):
    """The pipeline is uploaded to and looked up in --kfp-namespace: a shared pipeline ``tpupipe`` whose version bears
    this compile's name, uploaded by a user of another namespace (which a multi-user server lets anyone do), is not the
    one run; and a version of that name in the namespace holding another spec (one of its contributors replaced it) is
    refused before any run is created."""
    kfp = multi_user
    place = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE]
    place += ["--kfp-auth", "token", "--kfp-token-file", token_file(kfp, tmp_path)]
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *place)
    assert code == 0, out + err
    (ours,) = kfp.server.pipelines.values()
    assert ours["namespace"] == NAMESPACE
    (mine,) = [v for v in kfp.server.versions.values() if v["display_name"] != "tpupipe"]
    evil = _tampered(mine["pipeline_spec"], tmp_path)

    bob = _client_of(kfp, tmp_path, "bob@example.com", "team-b")
    shared = bob.upload_pipeline(evil, "tpupipe").pipeline_id  # no namespace: a shared pipeline
    bobs = bob.upload_pipeline_version(evil, mine["display_name"], shared).pipeline_version_id
    assert kfp.server.pipelines[shared]["namespace"] == ""
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *place)
    assert code == 0, out + err
    run = kfp.server.run(out.split("submitted run ", 1)[1].split()[0])
    assert run.resource["pipeline_version_reference"]["pipeline_version_id"] == mine["pipeline_version_id"] != bobs
    assert run.spec == mine["pipeline_spec"]

    carol = _client_of(kfp, tmp_path, "carol@example.com", NAMESPACE)  # a contributor of the namespace
    carol.delete_pipeline_version(ours["pipeline_id"], mine["pipeline_version_id"])
    carol.upload_pipeline_version(evil, mine["display_name"], ours["pipeline_id"])
    runs = set(kfp.server.jobs)
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *place)
    assert code == 1 and f"version {mine['display_name']} in namespace {NAMESPACE} holds another pipeline spec" in err
    assert set(kfp.server.jobs) == runs  # nothing run


def test_a_token_renewed_in_its_file_is_what_a_client_made_before_sends(multi_user, tmp_path):
    """``--kfp-auth token`` reads the file for each request: a client kept for a whole run (``submit --follow``) goes
    on after the token it started with expires, once the file holds a new one."""
    from components.spec import InfraError
    from pipelines.backends.kfp import jobs as kfp_backend

    kfp = multi_user
    path = token_file(kfp, tmp_path)
    place = kfp_backend.Place(kfp.host, namespace=NAMESPACE, auth="token", token_file=path)
    made = kfp_backend.client(place)
    assert kfp_backend.runs(made, place) == []
    kfp.server.expire(Path(path).read_text().strip())
    with pytest.raises(InfraError, match=r"Review.Status.Authenticated is false.*check --kfp-auth"):
        kfp_backend.runs(made, place)
    Path(path).write_text(kfp.server.token_for(USER) + "\n")  # renewed, as `kubectl create token` again
    assert kfp_backend.runs(made, place) == []


def test_with_the_user_id_header_every_request_is_the_users_and_the_runs_are_made_in_its_namespace(multi_user, tpupipe):
    """``--kfp-auth userid --kfp-user``: every request of the client (the health check, pipelines, experiments, runs,
    recurring runs) carries ``kubeflow-userid``, which the server reads the user from; the run and the recurring run
    are created and listed in the user's namespace."""
    kfp = multi_user
    place = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE, "--kfp-auth", "userid", "--kfp-user", USER]
    code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *place)
    assert code == 0, out + err
    kfp_run = out.split("submitted run ", 1)[1].split()[0]
    assert kfp.server.run(kfp_run).resource["namespace"] == NAMESPACE
    code, out, err = tpupipe(
        "schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", "0 3 * * *", *place
    )
    assert code == 0, out + err
    (recurring,) = kfp.server.recurring.values()
    assert recurring.resource["namespace"] == NAMESPACE
    code, out, err = tpupipe("runs", "list", *place)
    assert code == 0 and kfp_run in out, out + err
    code, out, err = tpupipe("schedule", "list", *place)
    assert code == 0 and "nightly" in out, out + err
    asked = {call.split("/")[0].split()[1] for call, _ in kfp.server.identities}
    assert {"healthz", "pipelines", "experiments", "runs", "recurringruns"} <= asked, asked
    assert {user for _, user in kfp.server.identities} == {USER}
    kfp.server.wait(kfp_run, timeout_s=300)


def test_without_the_header_or_on_a_server_left_at_its_defaults_the_server_refuses(multi_user, tmp_path, tpupipe):
    """A request with no identity is the server's 401 with each authenticator's reason. A server whose user id header
    and prefix are left unset reads Google IAP's pair, ``x-goog-authenticated-user-email`` and
    ``accounts.google.com:``, and its gateway passes no other header on: ``kubeflow-userid`` is no identity there
    (401, "there is no user identity header"), and ``--kfp-auth token`` reaches it."""
    from components.cloud import kfp as kfp_cloud
    from components.spec import InfraError
    from pipelines.backends.kfp import jobs as kfp_backend
    from tests.emulators.kfp import SERVER_DEFAULT

    kfp = multi_user
    place = kfp_backend.Place(kfp.host, namespace=NAMESPACE)
    empty = (
        "the Kubeflow Pipelines API refused: 401 Failed to check authorization. User identity is empty in the request "
        "header: [Request header error: there is no user identity header., Request header error: there is no user "
        "identity header.] (check --kfp-auth)"
    )
    with pytest.raises(InfraError) as raised:
        kfp_backend.runs(kfp_cloud.client(kfp.host, NAMESPACE), place)
    assert empty in str(raised.value)

    kfp.server.userid = SERVER_DEFAULT
    host = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE]
    code, out, err = tpupipe("runs", "list", *host, "--kfp-auth", "userid", "--kfp-user", USER)
    assert code == 1 and empty.removeprefix("the Kubeflow Pipelines API refused: ") in err, out + err
    token = ["--kfp-auth", "token", "--kfp-token-file", token_file(kfp, tmp_path)]
    code, out, err = tpupipe("runs", "list", *host, *token)
    assert code == 0, out + err
    assert kfp.server.jobs == {} and kfp.server.pipelines == {}


def test_kfp_user_and_kfp_auth_userid_go_together(multi_user, tpupipe):
    kfp = multi_user
    host = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE]
    for extra, said in (
        (["--kfp-user", USER], "--kfp-user: is for --kfp-auth userid, not --kfp-auth none"),
        (["--kfp-auth", "sa-token", "--kfp-trust-user-header"], "--kfp-trust-user-header: is for --kfp-auth userid"),
        (["--kfp-auth", "userid"], "--kfp-user: --kfp-auth userid sends this user's e-mail in the kubeflow-userid "
         "header: none is given"),
        (["--kfp-auth", "userid", "--kfp-user", "alice"], "--kfp-user: --kfp-auth userid sends this user's e-mail in "
         "the kubeflow-userid header: 'alice' is not an e-mail address"),
    ):  # fmt: skip
        code, out, err = tpupipe("submit", "local-fsdp", "--set", OVERRIDES, *host, *extra)
        assert code == 2 and said in err, out + err
    code, out, err = tpupipe(
        "submit", "local-fsdp", "--set", OVERRIDES, "--kfp-host", "https://kfp.example.com", "--kfp-namespace",
        NAMESPACE, "--kfp-auth", "userid", "--kfp-user", USER,
    )  # fmt: skip
    assert code == 2 and "--kfp-auth: userid sends a user id header that https://kfp.example.com would take" in err
    assert "--kfp-auth token --kfp-token-file FILE" in err and "--kfp-trust-user-header" in err, out + err
    assert kfp.server.identities == []  # refused before any call


def test_the_runner_of_a_multi_user_server_is_the_profiles_default_editor(multi_user, tpupipe):
    """The run's pods run in the profile's namespace as its default-editor: the Workload Identity binding checked is
    that one's, unless --service-account (or --kfp-runner) names another Kubernetes service account; a Google service
    account's e-mail there is refused naming the flag."""
    from tests.emulators.project import PROJECT

    kfp = multi_user
    account = f"tpupipe-pipeline@{PROJECT}.iam.gserviceaccount.com"
    place = ["--kfp-host", kfp.host, "--kfp-namespace", NAMESPACE, "--kfp-auth", "userid", "--kfp-user", USER]
    args = ["schedule", "create", "nightly", "local-fsdp", "--set", OVERRIDES, "--cron", "0 3 * * *", *place]
    code, out, err = tpupipe(*args, "--kfp-service-account", account)
    assert code == 2 and f"serviceAccount:{PROJECT}.svc.id.goog[{NAMESPACE}/default-editor]" in err, out + err
    code, out, err = tpupipe(*args, "--kfp-service-account", account, "--service-account", "trainer")
    assert code == 2 and f"serviceAccount:{PROJECT}.svc.id.goog[{NAMESPACE}/trainer]" in err, out + err
    code, out, err = tpupipe(*args, "--service-account", account)
    assert code == 2 and f"--service-account: '{account}' is not a Kubernetes service account name" in err, err
    code, out, err = tpupipe(*args, "--service-account", "trainer", "--kfp-runner", "default-editor")
    assert code == 2 and "--kfp-runner: default-editor is not the run's --service-account trainer" in err, err
    assert kfp.server.recurring == {}
