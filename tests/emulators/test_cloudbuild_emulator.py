"""The Cloud Build emulator through the real google-cloud-build client over gRPC (and the real google-cloud-storage
client for the build's source, through STORAGE_EMULATOR_HOST): builds created from an uploaded source, progressing
over polls, listed, cancelled, checked as Cloud Build checks them, failing, injected faults, and which calls the
client retries by itself."""

from __future__ import annotations

import re
from datetime import timedelta

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import storage
from google.cloud.devtools import cloudbuild_v1
from google.cloud.devtools.cloudbuild_v1.services.cloud_build.transports import CloudBuildGrpcTransport
from google.oauth2.credentials import Credentials

from tests.emulators.cloudbuild import CloudBuildEmulator
from tests.emulators.storage import StorageEmulator

PROJECT, NUMBER, TOKEN = "tpupipe-emulated", "123456789012", "t0ken"
BUCKET, CONTEXT = "tpupipe-staging", "runs/r1/build/context.tar.gz"
IMAGE = f"us-central1-docker.pkg.dev/{PROJECT}/tpupipe/trainer:r1"
DOCKER = "gcr.io/cloud-builders/docker"
Status = cloudbuild_v1.Build.Status


@pytest.fixture
def gcs(monkeypatch):
    emulator = StorageEmulator({PROJECT: NUMBER}, token=TOKEN)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.start())
    monkeypatch.setenv("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "1")
    client = storage.Client(project=PROJECT, credentials=Credentials(token=TOKEN))
    client.create_bucket(BUCKET, location="us-central1").blob(CONTEXT).upload_from_string(b"\x1f\x8b context")
    yield emulator
    emulator.stop()


@pytest.fixture
def cloudbuild(gcs):
    emulator = CloudBuildEmulator(storage=gcs)
    emulator.start()
    yield emulator
    emulator.stop()


def client(emulator: CloudBuildEmulator) -> cloudbuild_v1.CloudBuildClient:
    return cloudbuild_v1.CloudBuildClient(
        transport=CloudBuildGrpcTransport(channel=grpc.insecure_channel(emulator.address))
    )


def build(images=(IMAGE,), tags=("tpupipe-r1",), obj=CONTEXT, **fields) -> cloudbuild_v1.Build:
    fields.setdefault(
        "options", cloudbuild_v1.BuildOptions(machine_type=cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8)
    )
    return cloudbuild_v1.Build(
        steps=[cloudbuild_v1.BuildStep(name=DOCKER, args=["build", "-t", "${_IMAGE}", "."])],
        images=list(images),
        tags=list(tags),
        substitutions={"_IMAGE": images[0] if images else "unused"},
        source=cloudbuild_v1.Source(storage_source=cloudbuild_v1.StorageSource(bucket=BUCKET, object_=obj)),
        **fields,
    )


def test_build_progresses_to_success(cloudbuild, gcs):
    cb = client(cloudbuild)
    op = cb.create_build(project_id=PROJECT, build=build(timeout=timedelta(hours=1)))
    created = op.metadata.build  # BuildOperationMetadata, there from the create call's answer
    assert created.id and created.status == Status.QUEUED and created.create_time and created.log_url
    assert op.operation.name.startswith(f"projects/{PROJECT}/locations/global/operations/") and not op.operation.done
    assert created.name == f"projects/{PROJECT}/locations/global/builds/{created.id}"
    assert created.source_provenance.resolved_storage_source.generation == int(
        gcs.object(BUCKET, CONTEXT)["generation"]
    )
    stored = cloudbuild.state.builds[created.id]
    assert list(stored.images) == [IMAGE] and list(stored.tags) == ["tpupipe-r1"] and stored.timeout.seconds == 3600
    assert stored.substitutions == {"_IMAGE": IMAGE} and stored.source.storage_source.object_ == CONTEXT
    assert stored.options.machine_type == cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8

    working = cb.get_build(project_id=PROJECT, id=created.id)
    assert working.status == Status.WORKING and working.start_time and not working.finish_time
    assert [s.status for s in working.steps] == [Status.WORKING]
    done = cb.get_build(name=created.name)
    assert done.status == Status.SUCCESS and done.finish_time and [s.status for s in done.steps] == [Status.SUCCESS]
    assert [i.name for i in done.results.images] == [IMAGE]
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", done.results.images[0].digest)
    result = op.result(timeout=10)  # the operation, polled through google.longrunning.Operations
    assert result.id == created.id and result.status == Status.SUCCESS
    assert result.results.images[0].digest == done.results.images[0].digest
    assert cloudbuild.state.calls == ["CreateBuild", "GetBuild", "GetBuild", "GetOperation"]

    later = cb.create_build(project_id=PROJECT, build=build(tags=["tpupipe-r2"])).metadata.build
    listed = [b.id for b in cb.list_builds(project_id=PROJECT, filter="")]
    assert listed == [later.id, created.id]  # newest first
    assert [b.id for b in cb.list_builds(project_id=PROJECT, filter='tags="tpupipe-r1"')] == [created.id]
    assert [b.id for b in cb.list_builds(project_id=PROJECT, filter='tags="tpupipe-r2" AND status="QUEUED"')] == [
        later.id
    ]
    assert not list(cb.list_builds(project_id=PROJECT, filter='tags="tpupipe-r1" AND status="FAILURE"'))
    pages = cb.list_builds(request={"project_id": PROJECT, "page_size": 1}).pages
    assert [[b.id for b in page.builds] for page in pages] == [[i] for i in listed]  # paged
    with pytest.raises(exceptions.InvalidArgument, match="filter"):
        list(cb.list_builds(project_id=PROJECT, filter='create_time>"2024-01-01"'))
    with pytest.raises(exceptions.InvalidArgument, match="filter"):
        list(cb.list_builds(project_id=PROJECT, filter='status="DONE"'))

    parent = f"projects/{PROJECT}/locations/us-central1"
    regional = cb.create_build(parent=parent, build=build()).metadata.build
    assert regional.name == f"{parent}/builds/{regional.id}"
    assert [b.id for b in cb.list_builds(request={"parent": parent})] == [regional.id]
    assert regional.id not in [b.id for b in cb.list_builds(project_id=PROJECT)]  # the global builds
    assert cb.get_build(name=regional.name).status == Status.WORKING
    with pytest.raises(exceptions.NotFound):  # a regional build is named with its location
        cb.get_build(project_id=PROJECT, id=regional.id)
    with pytest.raises(exceptions.NotFound):
        cb.get_build(project_id=PROJECT, id="no-such-build")


def test_cancel_a_running_build(cloudbuild):
    cb = client(cloudbuild)
    op = cb.create_build(project_id=PROJECT, build=build())
    build_id = op.metadata.build.id
    assert cb.get_build(project_id=PROJECT, id=build_id).status == Status.WORKING
    cancelled = cb.cancel_build(project_id=PROJECT, id=build_id)
    assert cancelled.status == Status.CANCELLED and cancelled.finish_time
    assert [s.status for s in cancelled.steps] == [Status.CANCELLED]
    assert cb.get_build(project_id=PROJECT, id=build_id).status == Status.CANCELLED  # polls no longer move it
    with pytest.raises(exceptions.Cancelled, match="Build was cancelled"):
        op.result(timeout=10)
    assert op.metadata.build.status == Status.CANCELLED

    other = cb.create_build(project_id=PROJECT, build=build()).metadata.build.id
    cb.get_build(project_id=PROJECT, id=other)
    assert cb.get_build(project_id=PROJECT, id=other).status == Status.SUCCESS
    assert cb.cancel_build(project_id=PROJECT, id=other).status == Status.SUCCESS  # a finished build stays as it was
    with pytest.raises(exceptions.NotFound):
        cb.cancel_build(project_id=PROJECT, id="no-such-build")


@pytest.mark.parametrize(
    ("fields", "request_fields", "match"),
    [
        ({"obj": "runs/r1/build/missing.tar.gz"}, {}, f"No such object: {BUCKET}/runs/r1/build/missing.tar.gz"),
        ({"images": ["docker.io/library/trainer:r1"]}, {}, r"build\.images\[0\].*docker\.io/library/trainer:r1"),
        ({"images": [f"us-central1-docker.pkg.dev/{PROJECT}/tpupipe/Trainer"]}, {}, r"build\.images\[0\]"),
        ({"images": [f"us-central1-docker.pkg.dev/{PROJECT}/tpupipe"]}, {}, r"build\.images\[0\]"),  # no image name
        ({"images": [f"gcr.io/{PROJECT}/trainer:bad:tag"]}, {}, r"build\.images\[0\]"),
        ({"tags": ["has space"]}, {}, "invalid build tag 'has space'"),
        ({"tags": ["-leading-dash"]}, {}, "build.tags"),
        ({"timeout": timedelta(hours=25)}, {}, "build.timeout"),
        ({}, {"project_id": ""}, "project_id"),
        ({}, {"parent": "projects/only"}, "parent"),
    ],
)
def test_invalid_builds(cloudbuild, fields, request_fields, match):
    request = {"project_id": PROJECT, "build": build(**fields), **request_fields}
    with pytest.raises(exceptions.InvalidArgument, match=match):
        client(cloudbuild).create_build(request=request)
    assert not cloudbuild.state.builds


def test_invalid_steps_and_substitutions(cloudbuild):
    cb = client(cloudbuild)

    def invalid(match: str, **fields):
        with pytest.raises(exceptions.InvalidArgument, match=match):
            cb.create_build(project_id=PROJECT, build=cloudbuild_v1.Build(**fields))

    invalid(r"build\.steps'.*at least one step", images=[IMAGE])
    invalid(r"build\.steps\[1\]\.name", steps=[{"name": DOCKER}, {"args": ["echo"]}])
    invalid(
        r"build\.steps\[1\]\.wait_for.*'later'",
        steps=[{"name": DOCKER, "id": "first"}, {"name": DOCKER, "wait_for": ["later"]}],
    )
    invalid(r"build\.steps\[1\]\.id.*duplicate", steps=[{"name": DOCKER, "id": "a"}, {"name": DOCKER, "id": "a"}])
    invalid(
        '"_UNUSED" in the substitution data is not matched', steps=[{"name": DOCKER}], substitutions={"_UNUSED": "x"}
    )
    invalid('key in the template "_MISSING" is not matched', steps=[{"name": DOCKER, "args": ["$_MISSING"]}])
    invalid('key in the template "HOME" is not a valid built-in', steps=[{"name": DOCKER, "args": ["$HOME"]}])
    invalid("must begin with an underscore", steps=[{"name": DOCKER}], substitutions={"lower": "x"})
    assert not cloudbuild.state.builds

    loose = cloudbuild_v1.BuildOptions(substitution_option=cloudbuild_v1.BuildOptions.SubstitutionOption.ALLOW_LOOSE)
    ok = cb.create_build(
        project_id=PROJECT,
        build=cloudbuild_v1.Build(
            steps=[{"name": DOCKER, "args": ["$$HOME", "${PROJECT_ID}", "$_UNSET"], "script": "echo $HOME"}],
            images=["gcr.io/$PROJECT_ID/trainer:$BUILD_ID"],
            substitutions={"_SPARE": "x"},
            options=loose,
        ),
    )
    build_id = ok.metadata.build.id
    cb.get_build(project_id=PROJECT, id=build_id)
    done = cb.get_build(project_id=PROJECT, id=build_id)
    assert [i.name for i in done.results.images] == [f"gcr.io/{PROJECT}/trainer:{build_id}"]  # substituted
    assert not done.source.storage_source.bucket  # no source: allowed


def test_build_fails(cloudbuild):
    cb = client(cloudbuild)
    cloudbuild.build_fails(when=lambda b: "doomed" in b.tags)
    good = cb.create_build(project_id=PROJECT, build=build())
    bad = cb.create_build(project_id=PROJECT, build=build(tags=["doomed"]))
    for _ in range(2):
        cb.get_build(project_id=PROJECT, id=bad.metadata.build.id)
    failed = cb.get_build(project_id=PROJECT, id=bad.metadata.build.id)
    assert failed.status == Status.FAILURE and failed.finish_time and not failed.results.images
    assert failed.status_detail == f'Build step 0 "{DOCKER}" failed: step exited with non-zero status: 1'
    assert failed.failure_info.type_ == cloudbuild_v1.Build.FailureInfo.FailureType.USER_BUILD_STEP
    assert failed.failure_info.detail == failed.status_detail and failed.steps[0].exit_code == 1
    with pytest.raises(exceptions.Unknown, match="Build failed"):
        bad.result(timeout=10)
    assert bad.metadata.build.status == Status.FAILURE  # the failing step is there to read
    assert good.result(timeout=10).status == Status.SUCCESS  # did not match
    assert [b.id for b in cb.list_builds(project_id=PROJECT, filter='status="FAILURE"')] == [failed.id]

    cloudbuild.build_fails(step=1)
    steps = [{"name": DOCKER}, {"name": "ubuntu", "args": ["false"]}, {"name": "ubuntu"}]
    op = cb.create_build(project_id=PROJECT, build=cloudbuild_v1.Build(steps=steps))
    with pytest.raises(exceptions.Unknown):
        op.result(timeout=10)
    at_step = op.metadata.build
    assert at_step.status_detail == 'Build step 1 "ubuntu" failed: step exited with non-zero status: 1'
    assert [s.status for s in at_step.steps] == [Status.SUCCESS, Status.FAILURE, Status.CANCELLED]


def test_faults_and_retries(cloudbuild):
    cb = client(cloudbuild)
    cloudbuild.fail("CreateBuild", grpc.StatusCode.UNAVAILABLE, "backend unavailable")
    with pytest.raises(exceptions.ServiceUnavailable, match="backend unavailable"):
        cb.create_build(project_id=PROJECT, build=build())  # CreateBuild has no default retry
    assert cloudbuild.state.calls == ["CreateBuild"] and not cloudbuild.state.builds
    build_id = cb.create_build(project_id=PROJECT, build=build()).metadata.build.id

    cloudbuild.fail("GetBuild", grpc.StatusCode.UNAVAILABLE)
    assert cb.get_build(project_id=PROJECT, id=build_id).status == Status.WORKING  # retried (UNAVAILABLE)
    cloudbuild.fail("ListBuilds", grpc.StatusCode.UNAVAILABLE)
    assert [b.id for b in cb.list_builds(project_id=PROJECT)] == [build_id]  # retried
    cloudbuild.fail("CancelBuild", grpc.StatusCode.UNAVAILABLE)
    with pytest.raises(exceptions.ServiceUnavailable):
        cb.cancel_build(project_id=PROJECT, id=build_id)  # not retried
    assert cloudbuild.state.calls[2:] == ["GetBuild"] * 2 + ["ListBuilds"] * 2 + ["CancelBuild"]
    op = cb.create_build(project_id=PROJECT, build=build())
    cloudbuild.fail("GetOperation", grpc.StatusCode.UNAVAILABLE)
    assert op.result(timeout=10).status == Status.SUCCESS  # the operation's polls retry UNAVAILABLE
    assert cloudbuild.state.calls[-3:] == ["GetOperation"] * 3

    cloudbuild.fail("GetBuild", grpc.StatusCode.PERMISSION_DENIED, "denied", when=lambda r: r.id == build_id)
    with pytest.raises(exceptions.PermissionDenied, match="denied"):
        cb.get_build(project_id=PROJECT, id=build_id)
    assert cloudbuild.builds_tagged("tpupipe-r1") == [build_id, op.metadata.build.id]


@pytest.fixture
def pushing(gcs):
    """(the Cloud Build emulator, the Artifact Registry emulator it pushes to, a client of that registry)."""
    from google.cloud import artifactregistry_v1

    from tests.emulators.artifactregistry import ArtifactRegistryEmulator

    registry = ArtifactRegistryEmulator(polls_to_done=1)
    cloudbuild = CloudBuildEmulator(storage=gcs, registry=registry)
    cloudbuild.start()
    registry.start()
    ar = artifactregistry_v1.ArtifactRegistryClient(
        transport=artifactregistry_v1.services.artifact_registry.transports.ArtifactRegistryGrpcTransport(
            channel=grpc.insecure_channel(registry.address)
        )
    )
    yield cloudbuild, registry, ar
    cloudbuild.stop()
    registry.stop()


def test_a_push_needs_the_artifact_registry_repository(pushing):
    from google.cloud import artifactregistry_v1

    cloudbuild, registry, ar = pushing
    cb = client(cloudbuild)
    failed = cb.create_build(project_id=PROJECT, build=build()).metadata.build
    cb.get_build(project_id=PROJECT, id=failed.id)
    failed = cb.get_build(project_id=PROJECT, id=failed.id)
    assert failed.status == Status.FAILURE and "failed to push " + IMAGE in failed.status_detail
    ar.create_repository(
        request={
            "parent": f"projects/{PROJECT}/locations/us-central1",
            "repository_id": "tpupipe",
            "repository": {"format_": artifactregistry_v1.Repository.Format.DOCKER},
        }
    ).result(timeout=10)
    with pytest.raises(exceptions.AlreadyExists):
        ar.create_repository(
            request={
                "parent": f"projects/{PROJECT}/locations/us-central1",
                "repository_id": "tpupipe",
                "repository": {"format_": 1},
            }
        )
    pushed = cb.create_build(project_id=PROJECT, build=build()).metadata.build
    cb.get_build(project_id=PROJECT, id=pushed.id)
    assert cb.get_build(project_id=PROJECT, id=pushed.id).status == Status.SUCCESS


def test_a_repository_with_immutable_tags_refuses_to_move_a_tag_to_another_image(pushing):
    from google.cloud import artifactregistry_v1

    cloudbuild, registry, ar = pushing
    ar.create_repository(
        request={
            "parent": f"projects/{PROJECT}/locations/us-central1",
            "repository_id": "tpupipe",
            "repository": {
                "format_": artifactregistry_v1.Repository.Format.DOCKER,
                "docker_config": {"immutable_tags": True},
            },
        }
    ).result(timeout=10)
    cb = client(cloudbuild)
    outcomes = []
    for _ in range(2):  # the same tag, built twice: the second build's image is another one (another digest)
        made = cb.create_build(project_id=PROJECT, build=build()).metadata.build
        cb.get_build(project_id=PROJECT, id=made.id)
        outcomes.append(cb.get_build(project_id=PROJECT, id=made.id))
    assert outcomes[0].status == Status.SUCCESS
    assert outcomes[1].status == Status.FAILURE and "is immutable" in outcomes[1].status_detail
    assert registry.state.images[IMAGE] == outcomes[0].results.images[0].digest  # the tag did not move
    assert registry.refused_push(IMAGE, outcomes[0].results.images[0].digest) is None  # the same image: no move


BUILDER = f"projects/{PROJECT}/serviceAccounts/builder@{PROJECT}.iam.gserviceaccount.com"
Logging = cloudbuild_v1.BuildOptions.LoggingMode


@pytest.mark.parametrize(
    "account",
    [
        f"builder@{PROJECT}.iam.gserviceaccount.com",  # the email alone
        f"projects/{PROJECT}/serviceAccount/builder@{PROJECT}.iam.gserviceaccount.com",
        f"projects/{PROJECT}/serviceAccounts/",
    ],
)
def test_a_service_account_not_of_the_documented_form_is_refused(cloudbuild, account):
    """``projects/{PROJECT_ID}/serviceAccounts/{ACCOUNT}`` (Build.service_account's field docs)."""
    options = cloudbuild_v1.BuildOptions(logging=Logging.CLOUD_LOGGING_ONLY)
    with pytest.raises(exceptions.InvalidArgument, match=r"build\.service_account.*projects/\{PROJECT_ID\}"):
        client(cloudbuild).create_build(project_id=PROJECT, build=build(service_account=account, options=options))
    assert not cloudbuild.state.builds


@pytest.mark.parametrize("logging", [Logging.LOGGING_UNSPECIFIED, Logging.LEGACY, Logging.GCS_ONLY])
def test_a_build_with_a_service_account_and_the_default_logs_bucket_is_refused(cloudbuild, logging):
    """A build with a user-specified service account stores its logs in Cloud Logging or a bucket of the user's, never
    the default logs bucket (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts)."""
    options = cloudbuild_v1.BuildOptions(logging=logging)
    with pytest.raises(
        exceptions.InvalidArgument, match=r"if 'build\.service_account' is specified.*CLOUD_LOGGING_ONLY"
    ):
        client(cloudbuild).create_build(project_id=PROJECT, build=build(service_account=BUILDER, options=options))
    assert not cloudbuild.state.builds


@pytest.mark.parametrize(
    "fields",
    [
        {"options": cloudbuild_v1.BuildOptions(logging=Logging.CLOUD_LOGGING_ONLY)},
        {"options": cloudbuild_v1.BuildOptions(logging=Logging.NONE)},
        {"logs_bucket": "gs://team-build-logs"},
        {
            "options": cloudbuild_v1.BuildOptions(
                default_logs_bucket_behavior=cloudbuild_v1.BuildOptions.DefaultLogsBucketBehavior.REGIONAL_USER_OWNED_BUCKET
            )
        },
    ],
)
def test_a_build_with_a_service_account_and_its_logs_elsewhere_runs_as_that_account(cloudbuild, fields):
    cb = client(cloudbuild)
    created = cb.create_build(project_id=PROJECT, build=build(service_account=BUILDER, **fields)).metadata.build
    stored = cloudbuild.state.builds[created.id]
    assert stored.service_account == BUILDER
    assert stored.logs_bucket == fields.get("logs_bucket", "")  # never the default logs bucket
    cb.get_build(project_id=PROJECT, id=created.id)
    assert cb.get_build(project_id=PROJECT, id=created.id).status == Status.SUCCESS


def test_a_build_without_a_service_account_keeps_the_default_logs_bucket(cloudbuild):
    created = client(cloudbuild).create_build(project_id=PROJECT, build=build()).metadata.build
    assert cloudbuild.state.builds[created.id].logs_bucket == f"gs://{NUMBER}.cloudbuild-logs.googleusercontent.com"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_create_whose_reply_is_lost_has_started_its_build(cloudbuild, code):
    cb = client(cloudbuild)
    cloudbuild.lose_reply("CreateBuild", code)
    with pytest.raises(exceptions.GoogleAPICallError) as lost:
        cb.create_build(project_id=PROJECT, build=build())
    assert lost.value.grpc_status_code == code
    (build_id,) = cloudbuild.builds_tagged("tpupipe-r1")  # the build started all the same
    assert [b.id for b in cb.list_builds(project_id=PROJECT, filter='tags="tpupipe-r1"')] == [build_id]
