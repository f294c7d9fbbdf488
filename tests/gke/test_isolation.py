"""Runs that share a cluster and its namespace stay out of each other's way: each run's pods mount a Hugging Face
token Secret of its own, so one run's teardown leaves the Secrets another run uses (and the namespace's own)
alone; and a run's teardown deletes only what derives from its run id, whatever its ledger says. Against the
emulated project, through the real kubernetes client."""

from __future__ import annotations

import base64
import json

import pytest

from components.platforms import RunContext
from components.platforms import ledger as ledgers
from components.platforms.gke import GkePlatform
from components.platforms.gke.plan.target import target
from components.platforms.store import LocalStore
from components.spec import SpecError, names
from components.stages.claims import claim
from components.stages.vertex_task import VERTEX_TASK_ENV
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT, PROJECT_NUMBER

BUCKET = f"{PROJECT}-tpupipe"  # the default bucket of the emulated project
SHARED = ONE_SLICE + " gke.cluster_name=tpupipe-owner cluster.ready_timeout_s=30"
NO_HF = ONE_SLICE + " gke.hf_secret= cluster.ready_timeout_s=30"  # a model that needs no Hugging Face token


def context(tmp_path, run_id: str, overrides: str) -> RunContext:
    return RunContext(
        spec=resolve("local-fsdp", overrides), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="gke"
    )


def _secrets(project) -> dict[str, str]:
    """The namespace's Secrets: name -> the Hugging Face token they hold ('' for another kind)."""
    with project.kube.lock:
        found = {n: o for (p, ns, n), o in project.kube.objects.items() if p == "secrets" and ns == "tpupipe"}
    return {n: base64.b64decode(o.get("data", {}).get("hf_api_token", "")).decode() for n, o in found.items()}


def test_one_runs_teardown_leaves_the_secrets_another_run_in_the_namespace_mounts(
    tmp_path, project_factory, monkeypatch
):
    project = project_factory()
    project.kube.ready_without_ray = True
    monkeypatch.delenv("HF_TOKEN", raising=False)
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    owner = context(tmp_path, "owner", ONE_SLICE)
    gke.provision(owner)
    kube, _, _ = gke.clients.kube(owner)
    kube.ensure_namespace()
    # The namespace's Secret, made by its user (no run label): what gke.hf_secret names by default.
    kube.ensure(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf-secret", "namespace": "tpupipe"},
            "data": {"hf_api_token": base64.b64encode(b"hf_shared").decode()},
        }
    )
    first, second = context(tmp_path, "first", SHARED), context(tmp_path, "second", SHARED)
    for ctx in (first, second):
        gke.provision(ctx)
        assert gke.deploy_raycluster(ctx)["available_workers"] == 1
    own = {run: names.hf_token_secret(run) for run in ("first", "second")}
    held = _secrets(project)
    assert held["hf-secret"] == held[own["first"]] == held[own["second"]] == "hf_shared"
    for run in ("first", "second"):  # each run's pods mount its own copy, as a file
        (cluster,) = [o for (p, _, n), o in project.kube.objects.items() if p == "rayclusters" and n == run]
        volumes = cluster["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
        assert [v["secret"]["secretName"] for v in volumes if "secret" in v] == [own[run]]
    gke.teardown(first)
    held = _secrets(project)
    assert own["first"] not in held and names.ray_token_secret("first") not in held
    assert held["hf-secret"] == held[own["second"]] == "hf_shared"  # the second run's pods can still start
    assert names.ray_token_secret("second") in held
    assert project.rayclusters("second") == ["second"]
    gke.teardown(second)
    assert set(_secrets(project)) == {"hf-secret"}  # the namespace's own Secret: no run's to delete
    gke.teardown(owner)


def test_a_ledger_edited_to_name_another_runs_resources_does_not_make_teardown_delete_them(tmp_path, project_factory):
    """The ledger sits under the output root the run's own pods can write, and teardown runs as the pipeline's
    service account. A run whose ledger is edited to name another run's cluster, node pools and bucket binding as its
    own gets them left alone by its teardown, said in its log, while its own resources are deleted."""
    project = project_factory()
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    victim, tamperer = context(tmp_path, "victim", NO_HF), context(tmp_path, "tamperer", NO_HF)
    for ctx in (victim, tamperer):
        _deployed(gke, project, ctx)
    theirs, mine = ledgers.load(victim.store), ledgers.load(tamperer.store)
    assert {e["kind"] for e in theirs["created"]} >= {"cluster", "node_pool", "iam_binding"}
    forged = {**mine, "cluster": theirs["cluster"], "created": mine["created"] + theirs["created"]}
    ledgers.replace(tamperer.store, forged)
    before = {"clusters": project.clusters("victim"), "pools": project.pools("victim")}
    members = project.storage.members(BUCKET, "roles/storage.objectUser")
    assert before["clusters"] and before["pools"] and len(members) == 2

    gke.teardown(tamperer)
    assert project.leftovers("tamperer") == project.leftovers("no-such-run")  # its own: all gone
    assert {"clusters": project.clusters("victim"), "pools": project.pools("victim")} == before
    (left,) = project.storage.members(BUCKET, "roles/storage.objectUser")
    assert left.endswith(f"/kubernetes.serviceaccount.uid/{_service_account(project, 'victim')['metadata']['uid']}")
    refused = [line for line in logs if line.startswith("teardown: left alone:")]
    # a binding entry names no member teardown removes: it removes the bindings of the run's own conditions
    named = [e for e in theirs["created"] if e["kind"] != "iam_binding"]
    assert len(refused) == len(named) and all("not one run tamperer creates" in line for line in refused)
    gke.teardown(victim)
    assert project.leftovers("victim") == project.leftovers("no-such-run")


def test_a_second_pipeline_job_with_a_run_id_in_use_is_refused_before_it_writes_anything(tmp_path):
    """Two Vertex AI jobs given one ``--run-id``: the first holds it (its ledger names its job); the second's first task
    is refused, and so is its exit handler's teardown, which would otherwise delete the first's cluster; once the
    first is torn down too (a run id is used once: its prefix may hold a registered model's checkpoint)."""
    on_vertex = {VERTEX_TASK_ENV: json.dumps({"tpupipe-run": "shared"})}
    store = LocalStore(tmp_path / "shared")
    claim(store, "shared", "gke", "job-a", first=True, environ=on_vertex)
    ledgers.recorder(store, ledgers.load(store))("cluster", "projects/p/locations/z/clusters/tpupipe-shared")
    held = store.read_versioned(ledgers.KEY)
    for first in (True, False):  # its provision, then its teardown
        with pytest.raises(SpecError) as refused:
            claim(store, "shared", "gke", "job-b", first=first, environ=on_vertex)
        assert refused.value.field == "run_id" and "is held by job-a" in str(refused.value)
    assert store.read_versioned(ledgers.KEY) == held  # nothing written
    claim(store, "shared", "gke", "job-a", first=False, environ=on_vertex)  # the holder's own later tasks go on
    ledgers.update(store, lambda ledger: ledger.update(torn_down=1.0))
    with pytest.raises(SpecError, match="is held by job-a"):  # torn down: still used once, ever
        claim(store, "shared", "gke", "job-b", first=True, environ=on_vertex)
    assert ledgers.load(store)["pipeline_job"]["id"] == "job-a"


def test_a_runs_pods_reach_only_their_own_prefix_never_another_runs_objects_or_the_control_state(
    tmp_path, project_factory
):
    """The run's Kubernetes ServiceAccount, as the emulated Cloud Storage authorizes its token through the bucket's IAM
    policy (the conditional binding deploy made), writes and reads under ``runs/<run id>/`` only: another run's
    objects and ledger, the runs' state (``state/``), the build contexts and the pipeline root are refused; after
    teardown, even its own prefix."""
    from google.api_core.exceptions import Forbidden

    project = project_factory()
    gke, mine, theirs, pod = _two_runs_and_mine_pods_client(tmp_path, project)
    bucket = pod.bucket(BUCKET)
    bucket.blob("runs/mine/checkpoint/model.safetensors").upload_from_string(b"weights")
    bucket.blob("runs/mine/checkpoint/model.safetensors").upload_from_string(b"weights, again")  # overwrite: its own
    project.storage.put(BUCKET, "runs/theirs/checkpoint/model.safetensors", b"theirs")
    assert [b.name for b in pod.list_blobs(BUCKET, prefix="runs/mine/")] == ["runs/mine/checkpoint/model.safetensors"]
    # the cache every run of the bucket shares (components.workload.cache_trust): read by each, written by none
    project.storage.put(BUCKET, "cache/compile/m/v6e-4x4-1-slice/digest/jit_step-cache", b"program")
    assert bucket.blob("cache/compile/m/v6e-4x4-1-slice/digest/jit_step-cache").download_as_bytes() == b"program"
    for name in (
        "cache/compile/m/v6e-4x4-1-slice/digest/jit_step-cache",  # a compiled program, over the promoted one
        "cache/compile/m/v6e-4x4-1-slice/digest/jit_new-cache",  # a new one
        "cache/weights/google--gemma-4-E2B-it/abc/files/model.safetensors",  # base weights
        "cache/weights/google--gemma-4-E2B-it/abc/manifest.json",
        "cache/weights/google--gemma-4-E2B-it/refs/main",
        "state/_cache/compile/m/v6e-4x4-1-slice/digest.json",  # the trusted manifest of the compiled programs
        "state/_cache/weights/google--gemma-4-E2B-it/abc.json",  # the base weights' trusted manifest (the hub's hashes)
        "state/_cache/weights/google--gemma-4-E2B-it/refs/main",  # the commit the revision resolved to
        "runs/theirs/ledger.json",
        "runs/theirs/checkpoint/model.safetensors",
        "state/theirs/ledger.json",
        "state/mine/ledger.json",
        "builds/mine/context.tar.gz",
        "pipeline-root/run/artifact",
    ):
        with pytest.raises(Forbidden, match="storage.objects.create"):
            bucket.blob(name).upload_from_string(b"forged")
    with pytest.raises(Forbidden, match="storage.objects.get"):
        bucket.blob("runs/theirs/checkpoint/model.safetensors").download_as_bytes()
    assert project.storage.data(BUCKET, "runs/theirs/checkpoint/model.safetensors") == b"theirs"
    assert project.storage.data(BUCKET, "cache/compile/m/v6e-4x4-1-slice/digest/jit_step-cache") == b"program"
    with pytest.raises(Forbidden, match="storage.objects.get"):
        bucket.blob("state/_cache/compile/m/v6e-4x4-1-slice/digest.json").download_as_bytes()
    for ctx in (mine, theirs):
        gke.teardown(ctx)
    with pytest.raises(Forbidden):
        bucket.blob("runs/mine/checkpoint/model.safetensors").upload_from_string(b"after teardown")


def test_the_runs_bucket_access_goes_to_its_service_account_by_uid_never_to_a_namesake(tmp_path, project_factory):
    """The run's bindings name its Kubernetes ServiceAccount by the UID its cluster's API server gave it
    (``principal://.../kubernetes.serviceaccount.uid/UID``): the run's pods read and write its prefix (a retried
    deploy finds the ServiceAccount it made and binds the same); pods of another cluster of the project's workload
    identity pool that run as a ServiceAccount of the same namespace and name, and pods that run as one made again
    under that name in the run's cluster, are refused by the emulated bucket's IAM, which the name form
    (``subject/ns/NS/sa/NAME``) would have let in."""
    import uuid

    from google.api_core.exceptions import Forbidden

    project = project_factory()
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "mine", NO_HF)
    _deployed(gke, project, ctx)
    cluster, account = target(ctx.spec, "mine").cluster_path, _service_account(project, "mine")
    uid = account["metadata"]["uid"]
    own = _pods_client(project, cluster, "mine", uid).bucket(BUCKET)
    own.blob("runs/mine/out.txt").upload_from_string(b"mine")
    assert own.blob("runs/mine/out.txt").download_as_bytes() == b"mine"
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1  # retried: its own ServiceAccount, the same binding
    assert project.storage.members(BUCKET, "roles/storage.objectUser") == [
        f"principal://iam.googleapis.com/projects/{PROJECT_NUMBER}/locations/global/workloadIdentityPools/"
        f"{PROJECT}.svc.id.goog/kubernetes.serviceaccount.uid/{uid}"
    ]
    kube, _, _ = gke.clients.kube(ctx)
    kube.core.delete_namespaced_service_account(names.service_account("mine"), "tpupipe")
    kube.ensure({k: account[k] for k in ("apiVersion", "kind")} | {"metadata": {"name": account["metadata"]["name"]}})
    again = _service_account(project, "mine")["metadata"]["uid"]
    assert again != uid
    elsewhere = cluster.rsplit("/", 1)[0] + "/another-cluster"
    for impostor in (
        _pods_client(project, elsewhere, "mine", str(uuid.uuid4())),
        _pods_client(project, cluster, "mine", again),
    ):
        with pytest.raises(Forbidden, match="storage.objects.create"):
            impostor.bucket(BUCKET).blob("runs/mine/out.txt").upload_from_string(b"forged")
        with pytest.raises(Forbidden, match="storage.objects.get"):
            impostor.bucket(BUCKET).blob("runs/mine/out.txt").download_as_bytes()
    assert project.storage.data(BUCKET, "runs/mine/out.txt") == b"mine"
    gke.teardown(ctx)
    assert project.storage.members(BUCKET, "roles/storage.objectUser") == []


def test_a_service_account_of_the_runs_name_made_by_someone_else_is_refused_before_any_binding(
    tmp_path, project_factory
):
    """Whoever made the ServiceAccount ``tpupipe-RUN_ID`` in the namespace before the run's deploy would get the run's
    bucket access through it: deploy refuses it (naming run_id), before any binding or pod."""
    project = project_factory()
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "early", NO_HF)
    gke.provision(ctx)
    kube, _, _ = gke.clients.kube(ctx)
    kube.ensure_namespace()
    kube.ensure({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": names.service_account("early")}})
    with pytest.raises(SpecError) as refused:
        gke.deploy_raycluster(ctx)
    assert refused.value.field == "run_id" and "this run did not create it" in str(refused.value)
    assert project.storage.members(BUCKET, "roles/storage.objectUser") == []
    assert project.rayclusters("early") == []
    gke.teardown(ctx)


def test_a_retried_deploy_whose_first_try_made_the_service_account_but_never_read_its_uid_goes_on(
    tmp_path, project_factory
):
    """A first try that created the run's ServiceAccount and then failed before it recorded the UID (its read failed,
    its task was preempted): the retry knows the account by the random mark the first try recorded before creating
    it, records the UID and binds it; one made by anyone else carries no such mark (the test above)."""
    from components.platforms import ledger as ledgers
    from components.platforms.gke.run import deploy

    project = project_factory()
    project.kube.ready_without_ray = True
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    ctx = context(tmp_path, "retried", NO_HF)
    gke.provision(ctx)
    kube, _, _ = gke.clients.kube(ctx)
    kube.ensure_namespace()
    mark = "0f" * 16  # what the first try recorded, then put on the account it created
    ledgers.update(ctx.store, lambda stored: stored.update({deploy.SERVICE_ACCOUNT_MARK_KEY: mark}))
    first = {"name": names.service_account("retried"), "annotations": {deploy.SERVICE_ACCOUNT_MARK: mark}}
    kube.ensure({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": first})
    gke.deploy_raycluster(ctx)
    uid, _ = kube.service_account_uid(names.service_account("retried"))
    assert ledgers.load(ctx.store)[deploy.SERVICE_ACCOUNT_UID_KEY] == uid
    gke.teardown(ctx)


def test_another_runs_checkpoint_is_copied_into_the_runs_prefix_before_its_pods_read_it(tmp_path, project_factory):
    """A registered checkpoint (the champion, train.init_from) lives under the run that made it, out of this run's
    reach: the stage copies it, server-side, into ``runs/<run id>/inputs/`` and the job reads it there, through the
    pods' mount; the original is left as it was. Asked again (a retried stage), nothing is copied twice."""
    project = project_factory()
    logs: list[str] = []
    gke = GkePlatform(log=logs.append, poll_s=0.05)
    reader = context(tmp_path, "reader", ONE_SLICE)
    gke.provision(reader)
    for name, data in (("model.safetensors", b"weights"), ("config.json", b"{}")):
        project.storage.put(BUCKET, f"runs/champ/checkpoint/{name}", data)
    path = gke.checkpoint_path(reader, f"gs://{BUCKET}/runs/champ/checkpoint")
    assert path == "/data/runs/reader/inputs/runs/champ/checkpoint"
    copies = project.storage.objects_of(BUCKET, "runs/reader/inputs/")
    assert copies == {
        "runs/reader/inputs/runs/champ/checkpoint/config.json": b"{}",
        "runs/reader/inputs/runs/champ/checkpoint/model.safetensors": b"weights",
    }
    assert f"copied 2 of 2 objects (0.00 GiB) of gs://{BUCKET}/runs/champ/checkpoint" in logs[-1]
    assert gke.checkpoint_path(reader, f"gs://{BUCKET}/runs/champ/checkpoint/") == path
    assert "copied 0 of 2 objects" in logs[-1]
    assert gke.checkpoint_path(reader, f"gs://{BUCKET}/runs/reader/checkpoint") == "/data/runs/reader/checkpoint"
    with pytest.raises(SpecError, match="holds no object"):
        gke.checkpoint_path(reader, f"gs://{BUCKET}/runs/nothing/checkpoint")
    gke.teardown(reader)


def test_the_pipeline_records_what_the_compile_job_wrote_and_the_next_run_stages_only_what_matches(
    tmp_path, project_factory
):
    """On gke the train stage's recording and staging go through the pipeline's identity (the emulated Cloud
    Storage's owner): the pods of ``mine`` (its compile job) write their compiled program under their own
    ``runs/mine/compiled/<nonce>/``; an object any pod of the run plants there that the job did not report is not
    recorded; the stage copies the reported one into ``cache/`` and into the training job's ``runs/mine/cache/`` with
    its hash in ``state/_cache/``; what the training job then writes in ``runs/mine/cache/`` is never copied anywhere;
    a program planted in ``cache/`` afterwards is not staged into ``theirs``'s prefix, with one warning line
    (``components.workload.cache_trust``)."""

    from components.workload import cache_trust

    project = project_factory()
    gke, mine, theirs, pod = _two_runs_and_mine_pods_client(tmp_path, project)
    key = "compile/m/v6e-4x4-1-slice/digest"
    assert gke.run_cache_root(mine) == "/data/runs/mine/cache"  # where the training job's pods see their copy
    assert gke.compile_job_root(mine) == "/data/runs/mine/compiled"  # and the compile job's pods their output
    under = f"{cache_trust.new_nonce()}/{key}"
    pod.bucket(BUCKET).blob(f"runs/mine/compiled/{under}/jit_f-cache").upload_from_string(b"program f")
    pod.bucket(BUCKET).blob(f"runs/mine/compiled/{under}/jit_p-cache").upload_from_string(b"planted")  # unreported
    reported = {"jit_f-cache": cache_trust.sha256(b"program f")}  # the compile job's result record
    lines: list[str] = []
    places = gke.cache_places(mine)
    staged = cache_trust.stage_in(places.shared, places.run, places.manifests, key, lines.append)
    recorded = cache_trust.record(places, key, "mine", "config", staged["names"], reported, under, lines.append)
    assert recorded["recorded"] == 1 and recorded["ignored"] == 1 and recorded["compiled"]
    (warning,) = [ln for ln in lines if ln.startswith("WARNING")]  # the planted object's
    assert "1 not recorded (jit_p-cache): the compile job did not report them" in warning
    lines.clear()
    assert project.storage.data(BUCKET, f"cache/{key}/jit_f-cache") == b"program f"
    assert project.storage.data(BUCKET, f"runs/mine/cache/{key}/jit_f-cache") == b"program f"
    assert [n for n in project.storage.objects_of(BUCKET, "cache/")] == [f"cache/{key}/jit_f-cache"]
    doc = json.loads(project.storage.data(BUCKET, f"state/_cache/{key}.json"))
    assert doc["entries"]["jit_f-cache"]["sha256"] == cache_trust.sha256(b"program f")
    assert doc["compiled"] == {"config": {"run": "mine", "entries": 1}}
    pod.bucket(BUCKET).blob(f"runs/mine/cache/{key}/jit_g-cache").upload_from_string(b"the training job's")

    project.storage.put(BUCKET, f"cache/{key}/jit_f-cache", b"planted")  # by someone other than the pipeline
    places = gke.cache_places(theirs)
    lines.clear()
    result = cache_trust.stage_in(places.shared, places.run, places.manifests, key, lines.append)
    (warning,) = lines
    assert result["refused"] == ["jit_f-cache"] and warning.startswith(f"WARNING: compile cache gs://{BUCKET}/cache/")
    assert project.storage.objects_of(BUCKET, f"runs/theirs/cache/{key}/") == {}
    assert project.storage.data(BUCKET, f"cache/{key}/jit_g-cache") is None  # the training job's: never promoted
    for ctx in (mine, theirs):
        gke.teardown(ctx)


def test_two_runs_recording_at_once_both_keep_their_entries_through_the_manifests_generation(tmp_path, project_factory):
    """The manifest is rewritten with ``ifGenerationMatch`` on the generation read: a record whose read another
    run's record overtook gets 412 from the emulated Cloud Storage, reads again and keeps both runs' entries."""
    from components.workload import cache_trust

    project = project_factory()
    gke, mine, theirs, _ = _two_runs_and_mine_pods_client(tmp_path, project)
    key = "compile/m/v6e-4x4-1-slice/digest"
    project.storage.put(BUCKET, f"runs/mine/compiled/n/{key}/jit_f-cache", b"program f")
    project.storage.put(BUCKET, f"runs/theirs/compiled/n/{key}/jit_g-cache", b"program g")
    f, g = ({"jit_f-cache": cache_trust.sha256(b"program f")}, {"jit_g-cache": cache_trust.sha256(b"program g")})
    places, other = gke.cache_places(mine), gke.cache_places(theirs)
    writes: list[str] = []
    update = places.manifests.update

    def overtaken(name, change):  # the other run's record lands between this one's read and its write
        def late(raw):
            writes.append("read")
            if len(writes) == 1:
                cache_trust.record(other, key, "theirs", "config-b", [], g, f"n/{key}", lambda m: None)
            return change(raw)

        return update(name, late)

    places.manifests.update = overtaken  # type: ignore[method-assign]
    cache_trust.record(places, key, "mine", "config-a", [], f, f"n/{key}", lambda m: None)
    doc = json.loads(project.storage.data(BUCKET, f"state/_cache/{key}.json"))
    assert sorted(doc["entries"]) == ["jit_f-cache", "jit_g-cache"]
    assert sorted(doc["compiled"]) == ["config-a", "config-b"]
    assert writes == ["read", "read"]  # the first write was refused (412) and the record read the manifest again
    for ctx in (mine, theirs):
        gke.teardown(ctx)


def _deployed(gke, project, ctx) -> None:
    """Provision and deploy ``ctx``'s run: its bucket bindings come with its Kubernetes ServiceAccount."""
    project.kube.ready_without_ray = True
    gke.provision(ctx)
    assert gke.deploy_raycluster(ctx)["available_workers"] == 1


def _service_account(project, run_id: str) -> dict:
    with project.kube.lock:
        return project.kube.objects[("serviceaccounts", "tpupipe", names.service_account(run_id))]


def _pods_client(project, cluster: str, run_id: str, uid: str):
    """A Cloud Storage client as the pods of ``cluster`` that run as a Kubernetes ServiceAccount named as run
    ``run_id``'s, of UID ``uid``, as Workload Identity Federation for GKE authenticates them."""
    from google.cloud import storage
    from google.oauth2.credentials import Credentials

    token = project.storage.token_for_pod(cluster, "tpupipe", names.service_account(run_id), uid)
    return storage.Client(project=PROJECT, credentials=Credentials(token=token))


def _two_runs_and_mine_pods_client(tmp_path, project):
    """Two runs provisioned and deployed on the emulated project, and a Cloud Storage client as the first run's pods
    (its Kubernetes service account in its cluster, as Workload Identity Federation for GKE knows them)."""
    gke = GkePlatform(log=lambda m: None, poll_s=0.05)
    mine, theirs = context(tmp_path, "mine", NO_HF), context(tmp_path, "theirs", NO_HF)
    for ctx in (mine, theirs):
        _deployed(gke, project, ctx)
    uid = _service_account(project, "mine")["metadata"]["uid"]
    return gke, mine, theirs, _pods_client(project, target(mine.spec, "mine").cluster_path, "mine", uid)
