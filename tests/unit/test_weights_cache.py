"""Base weights cached once per model revision (``components.workload.weights``), against the hub emulator
(``tests/emulators/hfhub.py``) on this machine: the first run copies and verifies, a later one reads the copy with
the hub stopped and no token, a damaged file is copied again with a warning, a new revision is a new copy, and a
copy cut short is never used."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from components.spec import InfraError
from components.workload import cache_trust, weights
from tests.emulators.hfhub import HubEmulator

REPO = "google/tiny-gemma"
FILES = {
    "config.json": b'{"model_type": "gemma4"}',
    "model.safetensors": bytes(range(256)) * 64,  # an LFS file: checked by its sha256
    "tokenizer.json": b'{"version": "1.0"}',
}


@pytest.fixture
def hub():
    emulator = HubEmulator()
    emulator.repo(REPO).push(FILES)
    emulator.start()
    yield emulator
    emulator.stop()


def local(root: Path) -> tuple[weights.LocalCache, cache_trust.LocalPlace]:
    """The cache and the trusted manifests' place on this machine, as the local platform keeps them."""
    return weights.LocalCache(root / "cache"), cache_trust.LocalPlace(root / cache_trust.MANIFESTS_PREFIX)


def run(places, hub_url, token=None, revision="main"):
    lines: list[str] = []
    out = weights.ensure(*places, REPO, revision, token, lines.append, hub=hub_url)
    return out, lines


def trusted_manifest(root: Path, commit: str) -> dict:
    return json.loads((root / cache_trust.MANIFESTS_PREFIX / weights.manifest_key(REPO, commit)).read_text())


def copied(root: Path, commit: str) -> dict[str, bytes]:
    files = Path(weights.files_dir(str(root), REPO, commit))
    return {p.name: p.read_bytes() for p in files.iterdir()}


def test_first_run_copies_and_verifies_the_second_reads_the_copy_without_the_hub(tmp_path, hub):
    cache = local(tmp_path)
    first, _ = run(cache, hub.url)
    assert first["hit"] is False and first["files"] == 3
    assert first["commit"] == hub.repos[REPO].refs["main"]
    assert copied(tmp_path / "cache", first["commit"]) == FILES
    manifest = trusted_manifest(tmp_path, first["commit"])
    lfs = next(e for e in manifest["files"] if e["name"] == "model.safetensors")
    assert "sha256" in lfs and "git_sha1" not in lfs
    assert len(hub.downloads) == 3

    url = hub.url
    hub.stop()  # no hub, no token: the copy serves
    second, lines = run(cache, url)
    assert second == {"commit": first["commit"], "hit": True, "recopied": [], "files": 3, "entries": first["entries"]}
    assert any("did not answer" in line for line in lines)
    assert len(hub.downloads) == 3


def test_a_reachable_hub_is_asked_only_for_the_revision_and_nothing_is_downloaded_again(tmp_path, hub):
    cache = local(tmp_path)
    run(cache, hub.url)
    before = len(hub.requests)
    again, _ = run(cache, hub.url)
    assert again["hit"] is True
    assert [path.split("?")[0] for _, path in hub.requests[before:]] == [f"/api/models/{REPO}/revision/main"]


def test_a_damaged_cached_file_is_copied_again_with_a_warning(tmp_path, hub):
    cache = local(tmp_path)
    first, _ = run(cache, hub.url)
    target = Path(weights.files_dir(str(tmp_path / "cache"), REPO, first["commit"])) / "model.safetensors"
    target.write_bytes(b"\0" * len(FILES["model.safetensors"]))  # same size, other bytes: only the hash tells
    again, lines = run(cache, hub.url)
    assert again["hit"] is False and again["recopied"] == ["model.safetensors"]
    assert any(line.startswith("WARNING") and "model.safetensors" in line for line in lines)
    assert copied(tmp_path / "cache", first["commit"]) == FILES
    assert hub.downloads[-1].endswith("/model.safetensors") and len(hub.downloads) == 4


def test_a_new_revision_is_a_new_copy_under_its_own_key(tmp_path, hub):
    cache = local(tmp_path)
    first, _ = run(cache, hub.url)
    newer = {**FILES, "config.json": b'{"model_type": "gemma4", "layers": 2}'}
    commit = hub.repos[REPO].push(newer)
    second, _ = run(cache, hub.url)
    assert second["commit"] == commit != first["commit"] and second["hit"] is False
    assert weights.key(REPO, commit) != weights.key(REPO, first["commit"])
    assert copied(tmp_path / "cache", commit) == newer and copied(tmp_path / "cache", first["commit"]) == FILES
    pinned, _ = run(cache, hub.url, revision=first["commit"])  # a commit as the revision: the old copy, as it is
    assert pinned["commit"] == first["commit"] and pinned["hit"] is True


def test_a_copy_cut_short_is_never_used(tmp_path, hub):
    cache = local(tmp_path)
    broken = hub.repos[REPO].refs["main"]
    original = hub._resolve

    def corrupt(repo_id, revision, name, method, headers):  # the weights arrive cut short; the listing is right
        status, out, body = original(repo_id, revision, name, method, headers)
        return status, out, body[:-3] if name == "model.safetensors" else body

    hub._resolve = corrupt  # type: ignore[method-assign]
    with pytest.raises(InfraError, match="does not match the hub's hash"):
        run(cache, hub.url)
    assert weights.lookup(cache[1], REPO, "main") is None
    assert not (tmp_path / cache_trust.MANIFESTS_PREFIX / weights.manifest_key(REPO, broken)).exists()
    hub.stop()
    with pytest.raises(InfraError, match="neither cached nor on the hub"):
        run(cache, "http://127.0.0.1:9")


def test_a_gated_model_needs_the_token_only_for_the_first_copy(tmp_path, hub):
    """The hub lists a gated model to anyone and refuses its files (401 without a token, 403 to an account without
    access): nothing of it is cached then, the one case the workers may read the hub themselves (NoTrustedCopy)."""
    hub.repos[REPO].gated = True
    cache = local(tmp_path)
    with pytest.raises(weights.NoTrustedCopy, match=r"no trusted copy of .* is cached, .*answered 401 \(no Hugging"):
        run(cache, hub.url)
    assert any("/api/models/" in path for _, path in hub.requests) and not hub.authorized  # listed without a token
    with pytest.raises(weights.NoTrustedCopy, match=r"answered 403 \(.* of an account not granted access") as err:
        run(cache, hub.url, token="hf_someone_else")
    assert "gke.hf_token_secret" in str(err.value) and "$HF_TOKEN" in str(err.value)
    first, _ = run(cache, hub.url, token=hub.token)
    assert first["hit"] is False
    second, lines = run(cache, hub.url)  # no token: the listing answers, the files are the copy's
    assert second["hit"] is True and second["commit"] == first["commit"]
    # a damaged copy the hub will not give again to this side stops the run: never the file used
    path = Path(weights.files_dir(str(tmp_path / "cache"), REPO, first["commit"]), "model.safetensors")
    path.write_bytes(b"not the weights")
    with pytest.raises(InfraError, match=r"cached copy of .* is damaged \(model\.safetensors .*refuses") as err:
        run(cache, hub.url)
    assert not isinstance(err.value, weights.NoTrustedCopy)


def test_an_unknown_model_or_revision_is_named():
    hub = HubEmulator()
    hub.start()
    try:
        with pytest.raises(InfraError, match="train.model_id: google/nope at 'main' is not on the hub"):
            weights.ensure(*local(Path("/nonexistent")), "google/nope", "main", None, print, hub=hub.url)
    finally:
        hub.stop()


@pytest.mark.parametrize(
    ("model_id", "hub_name"),
    [("google/gemma-4-E2B-it", True), ("scratch:gemma4-tiny", False), ("/models/gemma", False), ("a/b/c", False)],
)
def test_which_model_ids_are_hub_names(model_id, hub_name):
    assert weights.is_hub_name(model_id) is hub_name


def test_the_train_stage_records_the_copy_and_every_job_gets_its_directory(tmp_path, hub, monkeypatch):
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.stages import base_weights, jobs
    from components.workload import resolve

    def ctx(model_id: str) -> RunContext:
        spec = resolve("local-fsdp", {"model_id": model_id})
        return RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path / "r"), platform="local")

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    lines: list[str] = []
    record = base_weights.prepare(ctx(REPO), lines.append)
    assert record is not None and record["hit"] is False
    assert record["dir"] == weights.files_dir(str(tmp_path / "cache"), REPO, hub.repos[REPO].refs["main"])
    assert Path(record["dir"], "config.json").read_bytes() == FILES["config.json"]
    assert jobs.runtime_env(ctx(REPO))["env_vars"][weights.WEIGHTS_DIR_ENV] == record["dir"]
    # a scratch model reads no weights: no copy, no directory in its jobs
    assert base_weights.prepare(ctx("scratch:gemma4-tiny"), lines.append) is None
    assert weights.WEIGHTS_DIR_ENV not in jobs.runtime_env(ctx("scratch:gemma4-tiny"))["env_vars"]


def test_without_a_copy_or_the_hub_the_run_goes_on_reading_the_hub_with_a_warning(tmp_path, monkeypatch):
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.stages import base_weights, jobs
    from components.workload import resolve

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    ctx = RunContext(
        spec=resolve("local-fsdp", {"model_id": REPO}), run_id="r", store=LocalStore(tmp_path / "r"), platform="local"
    )
    lines: list[str] = []
    assert base_weights.prepare(ctx, lines.append) is None
    assert lines[-1].startswith("WARNING: base weights not cached") and REPO in lines[-1]
    assert weights.WEIGHTS_DIR_ENV not in jobs.runtime_env(ctx)["env_vars"]


def test_in_cloud_storage_a_copy_is_checked_by_the_objects_md5_and_a_damaged_one_copied_again(hub, monkeypatch):
    """The bucket's ``cache/`` through the real google-cloud-storage client, against the storage emulator: the second
    run reads nothing of the weights (the objects' md5Hash against the manifest's), a replaced object is caught."""
    from google.cloud import storage as gcs
    from google.oauth2 import credentials as user_credentials

    from tests.emulators.storage import StorageEmulator

    project, token, bucket = "tpupipe-emulated", "t0ken", "tpupipe-runs"
    storage = StorageEmulator({project: "123456789012"}, token=token)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", storage.start())
    try:
        client = gcs.Client(project=project, credentials=user_credentials.Credentials(token=token))
        client.create_bucket(bucket)
        cache = weights.GcsCache(bucket, "cache", client), cache_trust.GcsPlace(bucket, "state/_cache", client)
        first, _ = run(cache, hub.url)
        base = f"cache/{weights.key(REPO, first['commit'])}"
        manifest = f"state/_cache/{weights.manifest_key(REPO, first['commit'])}"
        assert first["hit"] is False and client.bucket(bucket).blob(manifest).exists()
        assert (
            client.bucket(bucket).blob(f"{base}/files/model.safetensors").download_as_bytes()
            == FILES["model.safetensors"]
        )
        second, _ = run(cache, hub.url)
        assert second["hit"] is True and len(hub.downloads) == 3
        storage.put(bucket, f"{base}/files/model.safetensors", b"\0" * len(FILES["model.safetensors"]))
        third, lines = run(cache, hub.url)
        assert third["recopied"] == ["model.safetensors"] and any(line.startswith("WARNING") for line in lines)
        assert (
            client.bucket(bucket).blob(f"{base}/files/model.safetensors").download_as_bytes()
            == FILES["model.safetensors"]
        )
    finally:
        storage.stop()


def test_the_token_goes_to_the_hub_alone_not_to_the_storage_a_download_is_redirected_to(tmp_path, hub):
    hub.repos[REPO].gated = True
    hub.lfs_redirect = True
    first, _ = run(local(tmp_path), hub.url, token=hub.token)
    assert copied(tmp_path / "cache", first["commit"]) == FILES
    stored = [path for _, path in hub.requests if path.startswith("/storage/")]
    assert len(stored) == 1 and stored[0] not in hub.authorized
    assert all(path in hub.authorized for _, path in hub.requests if not path.startswith("/storage/"))


GCS_PROJECT, GCS_NUMBER, GCS_TOKEN, GCS_BUCKET = "tpupipe-emulated", "123456789012", "t0ken", "tpupipe-runs"


def _emulated_bucket(monkeypatch):
    """The storage emulator, started, with the run's bucket made; its client. The caller stops the emulator."""
    from google.cloud import storage as gcs
    from google.oauth2 import credentials as user_credentials

    from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV
    from tests.emulators.storage import StorageEmulator

    storage = StorageEmulator({GCS_PROJECT: GCS_NUMBER}, token=GCS_TOKEN)
    endpoint = storage.start()
    for name, value in (("STORAGE_EMULATOR_HOST", endpoint), (EMULATOR_HOST_ENV, endpoint)):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(EMULATOR_TOKEN_ENV, GCS_TOKEN)
    client = gcs.Client(project=GCS_PROJECT, credentials=user_credentials.Credentials(token=GCS_TOKEN))
    client.create_bucket(GCS_BUCKET)
    return storage, client


def test_on_gke_without_a_copy_or_the_hub_and_no_cloud_nat_the_stage_stops_naming_the_fix(monkeypatch):
    """A run whose cluster gets no Cloud NAT (the token on this side, the image in Artifact Registry, generated data):
    its workers could not reach the hub either, so going on without the cache would fail later on every host."""
    from components.platforms import RunContext
    from components.platforms.store import GcsStore
    from components.stages import base_weights
    from components.workload import resolve

    storage, client = _emulated_bucket(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    monkeypatch.setenv("HF_TOKEN", "t")
    try:
        overrides = {
            "model_id": REPO,
            "gke.project": GCS_PROJECT,
            "gke.bucket": GCS_BUCKET,
            "gke.hf_token_secret": f"projects/{GCS_PROJECT}/secrets/hf-token",
            "gke.image": f"us-east5-docker.pkg.dev/{GCS_PROJECT}/tpupipe/torch:1",
            "train.dataset": "generated",
        }
        ctx = RunContext(
            spec=resolve("gemma4-e2b-v6e-16", overrides),
            run_id="r",
            store=GcsStore(GCS_BUCKET, "state/r", client),
            platform="gke",
        )
        with pytest.raises(InfraError, match="no Cloud NAT") as err:
            base_weights.prepare(ctx, [].append)
        assert "gke.hf_secret without gke.hf_token_secret" in str(err.value)
        # with the token in the pods alone the run has a NAT: the workers read the hub, with the warning
        ctx = dataclasses.replace(ctx, spec=resolve("gemma4-e2b-v6e-16", {**overrides, "gke.hf_token_secret": ""}))
        lines: list[str] = []
        assert base_weights.prepare(ctx, lines.append) is None
        assert lines[-1].startswith("WARNING: base weights not cached")
    finally:
        storage.stop()


def test_on_gke_a_gated_model_without_the_token_on_this_side_is_read_by_the_pods_through_their_nat(hub, monkeypatch):
    """The hub answers a gated model's listing without a token and refuses its files: with the token in the pods alone
    (``gke.hf_secret``, the default) the plan gave the run a Cloud NAT for it, and the stage goes on with the warning;
    with no token anywhere the run has no NAT and the stage stops naming where the token goes."""
    from components.platforms import RunContext
    from components.platforms.gke.plan import network
    from components.platforms.gke.plan.target import target
    from components.platforms.store import GcsStore
    from components.stages import base_weights
    from components.workload import resolve

    storage, client = _emulated_bucket(monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    hub.repos[REPO].gated = True
    try:
        overrides = {
            "model_id": REPO,
            "gke.project": GCS_PROJECT,
            "gke.bucket": GCS_BUCKET,
            "gke.image": f"us-east5-docker.pkg.dev/{GCS_PROJECT}/tpupipe/torch:1",
        }
        spec = resolve("gemma4-e2b-v6e-16", overrides)
        assert spec.gke.hf_secret and not spec.gke.hf_token_secret
        assert network.cloud_nat(spec, target(spec, "r")) is not None
        ctx = RunContext(spec=spec, run_id="r", store=GcsStore(GCS_BUCKET, "state/r", client), platform="gke")
        lines: list[str] = []
        assert base_weights.prepare(ctx, lines.append) is None
        assert lines[-1].startswith("WARNING: base weights not cached") and "answered 401" in lines[-1]
        spec = resolve("gemma4-e2b-v6e-16", {**overrides, "gke.hf_secret": ""})
        assert network.cloud_nat(spec, target(spec, "r")) is None
        ctx = dataclasses.replace(ctx, spec=spec)
        with pytest.raises(InfraError, match=r"answered 401 .*gke\.hf_token_secret.*\$HF_TOKEN.*no Cloud NAT"):
            base_weights.prepare(ctx, lines.append)
    finally:
        storage.stop()


def test_on_gke_the_stage_copies_into_the_buckets_cache_with_the_token_from_secret_manager(hub, monkeypatch):
    """The gke train stage's side: the run in Cloud Storage, the copy under the bucket's ``cache/`` (the pods'
    ``/cache``), a gated model's token read from ``gke.hf_token_secret`` (no ``$HF_TOKEN``), against the storage and
    Secret Manager emulators through the real clients."""
    from components.cloud.secrets import EMULATOR_HOST_ENV as SECRETS_HOST_ENV
    from components.platforms import RunContext
    from components.platforms.store import GcsStore
    from components.stages import base_weights, jobs
    from components.workload import resolve
    from tests.emulators.secretmanager import SecretManagerEmulator

    project, bucket = GCS_PROJECT, GCS_BUCKET
    storage, client = _emulated_bucket(monkeypatch)
    secrets = SecretManagerEmulator({project: GCS_NUMBER})
    monkeypatch.setenv(SECRETS_HOST_ENV, secrets.start())
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_TOKEN_PATH", raising=False)
    hub.repos[REPO].gated = True
    secrets.add(project, "hf-token", hub.token.encode())
    try:
        spec = resolve(
            "gemma4-e2b-v6e-16",
            {
                "model_id": REPO,
                "gke.project": project,
                "gke.bucket": bucket,
                "gke.hf_token_secret": f"projects/{project}/secrets/hf-token",
            },
        )
        ctx = RunContext(spec=spec, run_id="r", store=GcsStore(bucket, "state/r", client), platform="gke")
        record = base_weights.prepare(ctx, print)
        assert record is not None and record["hit"] is False
        commit = hub.repos[REPO].refs["main"]
        assert record["dir"] == f"/cache/{weights.key(REPO, commit)}/files"
        blob = client.bucket(bucket).blob(f"cache/{weights.key(REPO, commit)}/files/model.safetensors")
        assert blob.download_as_bytes() == FILES["model.safetensors"]
        assert jobs.runtime_env(ctx)["env_vars"][weights.WEIGHTS_DIR_ENV] == record["dir"]
        # the trusted manifest in state/, where no pod's identity reaches; the jobs get its files with their hashes
        manifest = client.bucket(bucket).blob(f"state/_cache/{weights.manifest_key(REPO, commit)}").download_as_bytes()
        env = jobs.runtime_env(ctx)["env_vars"][weights.WEIGHTS_MANIFEST_ENV]
        assert [e["name"] for e in json.loads(env)] == [e["name"] for e in json.loads(manifest)["files"]]
        assert hub.token not in json.dumps(record) and hub.token not in (ctx.store.read_text("weights.json") or "")
    finally:
        storage.stop()
        secrets.stop()


def test_preflight_says_whether_the_bucket_holds_the_runs_base_weights(hub, monkeypatch):
    """``tpupipe preflight`` (it has credentials; the plan has none) looks in the bucket's cache: none yet, then the
    commit ``main`` last resolved to, after a copy; the hub is not asked."""
    from google.cloud import storage as gcs
    from google.oauth2 import credentials as user_credentials

    from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV
    from components.platforms.gke.checks import preflight
    from components.platforms.gke.checks.findings import Report
    from components.platforms.gke.plan.needs import needs
    from components.workload import resolve
    from tests.emulators.storage import StorageEmulator

    project, number, token = "tpupipe-emulated", "123456789012", "t0ken"
    storage = StorageEmulator({project: number}, token=token)
    endpoint = storage.start()
    for name, value in (
        ("STORAGE_EMULATOR_HOST", endpoint),
        (EMULATOR_HOST_ENV, endpoint),
        (EMULATOR_TOKEN_ENV, token),
    ):
        monkeypatch.setenv(name, value)
    try:
        creds = user_credentials.Credentials(token=token)
        spec = resolve("gemma4-e2b-v6e-16", {"model_id": REPO, "gke.project": project})
        n = needs(spec, "pre")
        client = gcs.Client(project=project, credentials=creds)
        client.create_bucket(n.bucket)

        def lines() -> list[str]:
            report = Report()
            preflight._bucket(n, spec, creds, report)
            return [line for line in report.checked if line.startswith("base weights")]

        before = len(hub.requests)
        assert lines() == [
            f"base weights {REPO}@main: not in gs://{n.bucket}/cache yet; the train stage copies them once"
        ]
        places = weights.GcsCache(n.bucket, "cache", client), cache_trust.GcsPlace(n.bucket, "state/_cache", client)
        first, _ = run(places, hub.url)
        before = len(hub.requests)
        assert lines() == [
            f"base weights {REPO}@main: cached in gs://{n.bucket}/cache at commit {first['commit']} (what main last "
            "resolved to; a newer commit on the hub is copied when the run starts)"
        ]
        assert len(hub.requests) == before
    finally:
        storage.stop()


def test_a_damaged_manifest_is_a_copy_made_again_with_a_warning(tmp_path, hub):
    cache = local(tmp_path)
    first, _ = run(cache, hub.url)
    (tmp_path / cache_trust.MANIFESTS_PREFIX / weights.manifest_key(REPO, first["commit"])).write_bytes(
        b'{"files": [tru'
    )
    again, lines = run(cache, hub.url)
    assert again["hit"] is False and len(hub.downloads) == 6
    assert any(line.startswith("WARNING") and weights.manifest_key(REPO, first["commit"]) in line for line in lines)
    assert run(cache, hub.url)[0]["hit"] is True


def test_a_file_named_outside_the_repository_is_refused_before_anything_is_written(tmp_path, hub):
    hub.repo("evil/model").push({"../../escape.json": b"{}"})
    with pytest.raises(InfraError, match="outside the repository"):
        weights.ensure(*local(tmp_path), "evil/model", "main", None, print, hub=hub.url)
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "cache").exists()


def test_train_model_revision_names_the_copy_the_run_reads_and_is_recorded_with_the_model(tmp_path, hub, monkeypatch):
    """A tag, a branch or a commit of the hub: the train stage copies what it resolves to, the run records the
    revision and the commit (the version's provenance), and the plan says which revision it reads."""
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.stages import base_weights, gate
    from components.workload import resolve

    main = hub.repos[REPO].refs["main"]
    tagged = hub.repos[REPO].push({**FILES, "config.json": b'{"model_type": "gemma4", "v": 2}'}, ref="v2")
    hub.repos[REPO].refs["main"] = main  # the tag is not the default branch
    monkeypatch.setenv("HF_ENDPOINT", hub.url)

    def prepared(revision: str, run_id: str) -> dict:
        spec = resolve("local-fsdp", {"model_id": REPO, "model_revision": revision})
        ctx = RunContext(spec=spec, run_id=run_id, store=LocalStore(tmp_path / run_id), platform="local")
        record = base_weights.prepare(ctx, [].append)
        assert record is not None
        return record

    for revision, commit in (("v2", tagged), (tagged, tagged), ("main", main)):
        record = prepared(revision, f"r-{revision[:8]}")
        assert (record["revision"], record["commit"]) == (revision, commit)
        assert record["dir"] == weights.files_dir(str(tmp_path / "cache"), REPO, commit)
    assert Path(prepared("v2", "again")["dir"], "config.json").read_bytes().endswith(b'"v": 2}')
    assert prepared("v2", "hit")["hit"] is True

    spec = resolve("local-fsdp", {"model_id": REPO, "model_revision": "v2"})
    train = {"base_weights": prepared("v2", "prov"), "history": []}
    found = gate.provenance(spec, "prov", {"train": train})
    assert (found["model_revision"], found["model_commit"]) == ("v2", tagged)
    scratch = gate.provenance(resolve("local-fsdp"), "s", {"train": {"history": []}})
    assert (scratch["model_revision"], scratch["model_commit"]) == (None, None)
    entry = weights.plan_entry(REPO, "fsdp", "gs://b/cache", "/cache", "v2", "gs://b/state/_cache")
    assert entry is not None and entry["revision"] == "v2"
    assert entry["manifest"] == "gs://b/state/_cache/weights/google--tiny-gemma/COMMIT.json"
    assert weights.plan_lines(entry)[0].startswith(f"  weights     {REPO}@v2 read from gs://b/cache/")
    assert weights.plan_lines(entry)[1].endswith(f"(trusted manifest {entry['manifest']})")
    # the one case the workers read the hub unchecked is said in the plan
    assert "finds no trusted manifest of the revision and cannot download it" in weights.plan_lines(entry)[2]
    assert "download the model themselves, unchecked" in weights.plan_lines(entry)[2]


def test_a_revision_not_on_the_hub_is_named_and_another_revision_without_a_copy_stops(tmp_path, hub, monkeypatch):
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.stages import base_weights
    from components.workload import resolve

    def ctx(revision: str) -> RunContext:
        spec = resolve("local-fsdp", {"model_id": REPO, "model_revision": revision})
        return RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path / "r"), platform="local")

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(InfraError, match=r"google/tiny-gemma at 'v9' is not on the hub"):
        base_weights.prepare(ctx("v9"), [].append)
    # Without the hub and without a copy the workers would read the default branch: a run naming another revision
    # stops rather than train on other weights.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
    with pytest.raises(InfraError, match=r"train.model_revision=v2: the weights of that revision cannot be copied"):
        base_weights.prepare(ctx("v2"), [].append)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model_revision": ""}, "'' is not a hub revision"),
        ({"model_revision": "v1 .0"}, "is not a hub revision"),
        ({"model_revision": "../main"}, "is not a hub revision"),
        ({"model_revision": "feature/"}, "is not a hub revision"),
        ({"model_revision": "x.lock"}, "is not a hub revision"),
        ({"model_revision": "v2"}, "train.model_id=scratch:gemma4-tiny is no hub model"),
        ({"model_revision": "v2", "model_id": "/models/gemma"}, "is no hub model"),
    ],
)
def test_a_bad_model_revision_is_refused_naming_the_field(overrides, message):
    from components.spec import SpecError
    from components.workload import resolve

    with pytest.raises(SpecError, match=message) as err:
        resolve("local-fsdp", overrides)
    assert err.value.field == "train.model_revision"


def test_good_model_revisions_pass_and_maxtext_reads_none():
    from components.spec import SpecError
    from components.workload import resolve

    for revision in ("main", "v1.0", "refs/pr/3", "a" * 40, "release_2026-12"):
        assert resolve("local-fsdp", {"model_id": REPO, "model_revision": revision}).train.model_revision == revision
    with pytest.raises(SpecError, match="the maxtext workload reads no hub weights") as err:
        resolve("local-maxtext", {"model_revision": "v2"})
    assert err.value.field == "train.model_revision"


def test_only_the_files_a_load_reads_are_downloaded_and_listed(tmp_path, hub):
    extra = {
        "pytorch_model.bin": b"\0" * 512,  # another format of the same weights
        "original/consolidated.pth": b"\1" * 512,  # a subfolder from_pretrained of the directory does not read
        "modeling_gemma.py": b"import os",  # code: never run without trust_remote_code
        "tokenizer.model": b"spm",
        "chat_template.jinja": b"{{ messages }}",
    }
    commit = hub.repos[REPO].push({**FILES, **extra})
    out, _ = run(local(tmp_path), hub.url)
    kept = {**FILES, "tokenizer.model": b"spm", "chat_template.jinja": b"{{ messages }}"}
    assert out["commit"] == commit and copied(tmp_path / "cache", commit) == kept
    assert {e["name"] for e in trusted_manifest(tmp_path, commit)["files"]} == set(kept)
    downloaded = {path.rsplit("/", 1)[-1] for path in hub.downloads}
    assert downloaded == set(kept)


@pytest.mark.parametrize("drop", ["size", "blobId", "lfs"])
def test_a_hub_listing_without_a_files_size_or_hash_is_refused_naming_it(tmp_path, hub, drop):
    original = hub._model_info

    def listing(*args):
        status, headers, body = original(*args)
        info = json.loads(body)
        for sib in info["siblings"]:
            if sib["rfilename"] == ("model.safetensors" if drop == "lfs" else "tokenizer.json"):
                sib.pop(drop, None)
                if drop == "lfs":
                    sib["lfs"] = {"size": len(FILES["model.safetensors"])}  # its sha256 left out
        return status, headers, json.dumps(info).encode()

    hub._model_info = listing  # type: ignore[method-assign]
    name = "model.safetensors" if drop == "lfs" else "tokenizer.json"
    with pytest.raises(InfraError, match=rf"gives {name} without its size or hash"):
        run(local(tmp_path), hub.url)
    assert not hub.downloads and not (tmp_path / "cache").exists()
