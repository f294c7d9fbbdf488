"""The smaller hardening items: the Cloud Build docker step by digest, a bearer token never sent over plain HTTP to
another machine (`--kfp-host`), and the secrets a run's logs and post-mortem may print redacted before they are kept."""

from __future__ import annotations

import base64
import json

import pytest

from components.platforms import postmortem, redaction
from components.platforms.store import LocalStore
from components.spec import SpecError
from components.spec.images import DOCKER_BUILDER, IMAGE_WITH_DIGEST
from pipelines.backends.kfp.jobs import Place, check_place


def test_every_cloud_build_runs_the_docker_builder_by_digest():
    from components.platforms.gke.plan import resources
    from components.platforms.gke.plan import target as tg
    from components.workload import resolve
    from pipelines.pipeline import Target
    from pipelines.publish.vertex import build_body

    assert DOCKER_BUILDER.startswith("gcr.io/cloud-builders/docker@sha256:") and IMAGE_WITH_DIGEST.match(DOCKER_BUILDER)
    spec = resolve("smoke", "gke.project=my-project")
    trainer = resources.cloud_build(spec, tg.target(spec, "r1"))
    components = build_body(Target(project="my-project", region="us-east5"), "IMAGE", "tag")
    for build in (trainer, components):
        assert [step["name"] for step in build["steps"]] == [DOCKER_BUILDER], build["steps"]


@pytest.mark.parametrize(
    ("host", "auth", "insecure", "refused"),
    [
        ("http://kfp.example.com:8888", "iap", False, True),  # a token in clear text over the network
        ("http://10.0.0.7:8888", "iap", False, True),
        ("http://kfp.example.com:8888", "iap", True, False),  # --insecure: the user's choice, said so
        ("https://kfp.example.com", "iap", False, False),
        ("http://kfp.example.com:8888", "none", False, False),  # no token to leak
        ("http://localhost:8888", "iap", False, False),  # loopback: a port-forward, never on the network
        ("http://127.0.0.1:8888", "iap", False, False),
        ("http://127.8.9.10:8888", "iap", False, False),
        ("http://[::1]:8888", "iap", False, False),
        ("http://localhost:8888", "userid", False, False),  # a port-forward: what userid is for
        ("http://kfp.example.com:8888", "userid", False, True),  # trusted, yet the user id header in clear text
        ("http://kfp.example.com:8888", "userid", True, False),
    ],
)
def test_a_bearer_token_goes_over_plain_http_only_to_this_machine_or_with_insecure(host, auth, insecure, refused):
    user = "alice@example.com" if auth == "userid" else ""
    place = Place(
        host, auth=auth, iap_client_id="client.apps.googleusercontent.com", insecure=insecure, user=user,
        trust_user_header=auth == "userid",
    )  # fmt: skip
    if not refused:
        check_place(place)
        return
    sent = "the user id header, which acts as that user," if auth == "userid" else "its bearer token"
    with pytest.raises(SpecError, match=f"would send {sent} in clear text") as raised:
        check_place(place)
    assert raised.value.field == "--kfp-host" and "--insecure" in raised.value.valid


@pytest.mark.parametrize(
    ("host", "trusted", "refused"),
    [
        ("http://localhost:8888", False, False),  # a kubectl port-forward to the API server
        ("http://127.0.0.1:8888", False, False),
        ("http://[::1]:8888", False, False),
        ("https://kfp.example.com", False, True),  # the header reaches whatever the network lets reach the server
        ("http://10.0.0.7:8888", False, True),
        ("https://kfp.example.com", True, False),  # --kfp-trust-user-header: the user vouches for the path
    ],
)
def test_the_user_id_header_goes_only_to_this_machine_unless_the_path_is_trusted(host, trusted, refused):
    """The server takes the user id header at its word (kubeflow/pipelines backend/src/apiserver/auth/util.go), so
    ``--kfp-auth userid`` is refused, naming ``--kfp-auth`` and pointing to ``token``, before any call to a host that
    is not this machine, unless ``--kfp-trust-user-header`` says the path there is trusted; the flag goes with
    ``userid`` alone."""
    place = Place(host, auth="userid", user="alice@example.com", insecure=True, trust_user_header=trusted)
    if not refused:
        check_place(place)
        return
    with pytest.raises(SpecError, match="userid sends a user id header that .* would take at its word") as raised:
        check_place(place)
    assert raised.value.field == "--kfp-auth" and "--kfp-trust-user-header" in raised.value.valid
    assert raised.value.valid[0].startswith("--kfp-auth token --kfp-token-file FILE")
    with pytest.raises(SpecError, match="is for --kfp-auth userid, not --kfp-auth none") as raised:
        check_place(Place("https://kfp.example.com", trust_user_header=True))
    assert raised.value.field == "--kfp-trust-user-header"


HF = "hf_SENTINEL0123456789abcdefTOKEN"
RAY = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978"  # as new_ray_token makes one: 48 hex digits
OAUTH = "ya29.a0AfB_byC-sentinel-access-token_0123456789"


def _leaky(name: str) -> str:
    """A log as a pod, Ray or a library may write it: each secret in the forms it is seen in."""
    return (
        f"{name}: starting\nHF_TOKEN={HF}\nrequest headers: {{'Authorization': 'Bearer {OAUTH}', "
        f"'X-Ray-Authorization': 'Bearer {RAY}'}}\nsecret data: {base64.b64encode(RAY.encode()).decode()}\n"
        "the rest of the log\n"
    )


class _Cluster:
    """What the post-mortem reads of the API server (pods, their logs and events, the RayCluster), each leaking."""

    def __init__(self):
        self.pod_list = [
            {
                "metadata": {"name": "r-head", "uid": "u-head", "deletionTimestamp": "2026-12-05T00:00:00Z"},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "ray-head", "state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}}
                    ],
                },
            }
        ]

    def pods(self, selector):
        return self.pod_list

    def pod_log(self, name, container, tail_lines=None, previous=False):
        return _leaky(name)

    def pod_events(self):
        return [{"involvedObject": {"name": "r-head"}, "reason": "Failed", "message": f"auth: Bearer {OAUTH}"}]

    def get(self, kind, name):
        return {"status": {"state": "ready", "reason": f"token {RAY}"}}


class _Response:
    def __init__(self, doc=None, content=b""):
        self.doc, self.content = doc, content

    def json(self):
        return self.doc


def _dashboard(path, params):
    """Ray's State API through the head's dashboard, its logs and failed tasks leaking."""
    result = {"data": {"result": {"result": []}}}
    if path == "/api/v0/nodes":
        result = {"data": {"result": {"result": [{"node_id": "n1", "state": "ALIVE", "is_head_node": True}]}}}
    elif path == "/api/v0/tasks":
        result = {"data": {"result": {"result": [{"state": "FAILED", "error_message": _leaky("task")}]}}}
    elif path == "/api/v0/logs":
        result = {"data": {"result": {"n1": ["raylet.out"]}}}
    elif path == "/api/v0/logs/file":
        return _Response(content=_leaky("raylet").encode())
    return _Response(result)


def test_the_post_mortem_keeps_no_secret_the_logs_print(tmp_path, monkeypatch):
    """Every post-mortem writer (pods' logs and events, the RayCluster, Ray's state and logs, a lost pod, the local
    hosts' session logs) with logs that print the Hugging Face token, the Ray token (plain and base64) and a bearer
    token: none of them is kept, the rest of each log is."""
    monkeypatch.setenv("HF_TOKEN", HF)
    redaction.register(RAY)  # as new_ray_token / the kube adapter's secret read register it
    store, cluster = LocalStore(tmp_path / "run"), _Cluster()
    session = tmp_path / "host-0" / "session_latest" / "logs"
    session.mkdir(parents=True)
    (session / "raylet.out").write_text(_leaky("local raylet"))
    postmortem.kubernetes(store, cluster, "tpupipe-run=r", "r")
    postmortem.pod_logs(store, cluster, cluster.pod_list)
    postmortem.ray_state(store, _dashboard)
    postmortem.LostPods(store, cluster).observe(cluster.pod_list)
    postmortem.ray_session_logs(store, {"host-0": tmp_path / "host-0"})
    kept = {
        p.relative_to(tmp_path / "run").as_posix(): p.read_text() for p in (tmp_path / "run").rglob("*") if p.is_file()
    }
    assert {"logs/kubernetes.json", "logs/pods/r-head.log", "logs/ray_state.json", "logs/lost_pods.json"} <= set(kept)
    assert "logs/ray/head/raylet.out" in kept and "logs/ray/host-0/raylet.out" in kept
    encoded = base64.b64encode(RAY.encode()).decode()
    for key, text in kept.items():
        for secret in (HF, RAY, encoded, OAUTH):
            assert secret not in text, (key, secret)
    assert "the rest of the log" in kept["logs/pods/r-head.log"] and "[redacted]" in kept["logs/pods/r-head.log"]
    assert json.loads(kept["logs/kubernetes.json"])["events"][0]["message"] == "auth: Bearer [redacted]"


def test_a_secret_of_several_lines_is_redacted_from_a_log_that_comes_line_by_line(tmp_path):
    from components.platforms import RunContext
    from components.stages import jobs
    from components.workload import resolve

    key = "-----BEGIN KEY-----\nMIIEvQIBADANBgkqhkiG9w0B\nAQEFAASCBKcwggSjAgEAAoIB\n-----END KEY-----"
    redaction.register(key)  # as the kube adapter registers each value of a Secret it reads
    ctx = RunContext(spec=resolve("local-fsdp", ""), run_id="r", store=LocalStore(tmp_path / "r"), platform="local")
    state = jobs._Follow()
    for line in key.splitlines():  # printed by a job, a line a chunk
        jobs._take(f"{line}\n", "train", state, ctx, None)
    saved = (tmp_path / "r" / "logs" / "train.log").read_text()
    assert "MIIEvQIBADANBgkqhkiG9w0B" not in saved and "AQEFAASCBKcwggSjAgEAAoIB" not in saved, saved


def test_redaction_keeps_what_is_not_a_secret():
    text = "hf_hub_download failed: authorization failed for model x; token count 1234; Bearer"
    assert redaction.redact(text) == text
    assert redaction.redact("Authorization: token abcdef123") == "Authorization: token [redacted]"


def test_a_failed_stages_record_keeps_no_secret_its_error_quotes(tmp_path):
    """A stage's error may quote what a job printed (Ray's message of a failed entrypoint carries the job's last
    log lines: ray dashboard/modules/job/job_manager.py): the record of the failure names the error with every known
    secret redacted, whatever its shape (not only ``hf_…``)."""
    from components.stages import runner

    secret = "plain-Secret-value-7f3a9c"
    redaction.register(secret)
    with pytest.raises(SpecError):
        runner.run_stage(
            "snapshot_data",
            "local-fsdp",
            "local",
            f"train.dataset=/nonexistent/{secret}.jsonl",
            "r1",
            "",
            str(tmp_path),
        )
    record = runner.read_json(LocalStore(tmp_path / "r1"), "stages/snapshot_data.json")
    assert record["status"] == "failed" and "[redacted]" in record["error"], record
    assert secret not in json.dumps(record)
