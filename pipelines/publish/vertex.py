"""``tpupipe publish``: make the compiled pipeline startable from the Vertex AI UI.

1. The components image of this source tree (tagged with the hash of its build context, the tag the compiled
   pipeline names): built with Cloud Build and pushed to the Artifact Registry Docker repository when that tag is
   missing, else reused.
2. The compiled template, every task's image pinned to that image's digest, uploaded to an Artifact Registry KFP
   repository (``kfp.registry.RegistryClient``), tagged
   with the version, the git commit and ``latest``: the Vertex UI offers it under "Create run" from a template.
"""

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.spec.images import DOCKER_BUILDER
from pipelines.pipeline import PIPELINE_IMAGE, Target, compile_pipeline, source_version

# With the emulators: the KFP registry's base URL (http://host:port); unset, https://REGION-kfp.pkg.dev.
KFP_REGISTRY_HOST_ENV = "TPUPIPE_KFP_REGISTRY_HOST"
BUILD_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Published:
    image: str
    built: bool
    template: str  # the registry's package/version
    tags: tuple[str, ...]
    host: str


def kfp_host(target: Target, kfp_repository: str) -> str:
    base = os.environ.get(KFP_REGISTRY_HOST_ENV) or f"https://{target.region}-kfp.pkg.dev"
    return f"{base.rstrip('/')}/{target.project}/{kfp_repository}"


def build_body(target: Target, image: str, tag: str, build_account: str = "") -> dict[str, Any]:
    """The Cloud Build of the components image: ``images/pipeline/Dockerfile`` over the uploaded context, as
    ``build_account`` when given (``Build.service_account``, its logs in Cloud Logging only, as such a build must
    choose: https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts)."""
    account = {"serviceAccount": f"projects/{target.project}/serviceAccounts/{build_account}"} if build_account else {}
    return account | {
        "source": {"storageSource": {"bucket": target.run_bucket, "object": f"build/{PIPELINE_IMAGE}-{tag}.tar.gz"}},
        "steps": [
            {
                "name": DOCKER_BUILDER,  # by digest (components/spec/images.py)
                "args": ["build", "--file", f"images/{PIPELINE_IMAGE}/Dockerfile", "--tag", image, "."],
            }
        ],
        "images": [image],
        "tags": ["tpupipe", f"tpupipe-{PIPELINE_IMAGE}-{tag}"],
        "timeout": f"{BUILD_TIMEOUT_S}s",
        "options": {"machineType": "E2_HIGHCPU_8", "logging": "CLOUD_LOGGING_ONLY"},
    }


def pin_images(template: str) -> tuple[str, list[str]]:
    """A compiled pipeline file with every task's image pinned to the digest its tag names in Artifact Registry now
    (``NAME:TAG@sha256:HEX``: a tag pushed again later cannot change what the job runs), written beside it under a
    new name (the file given is left as it is), and the images that are not there (on Vertex AI each such task would
    fail at image pull). A registry URL's template is not read: ``publish`` pinned its images before uploading it."""
    import yaml

    from components.cloud import build as gke_build
    from components.cloud.credentials import credentials
    from components.spec.images import IMAGE_WITH_DIGEST

    if template.startswith("https://"):
        return template, []
    spec = yaml.safe_load(Path(template).read_text())
    executors = spec["deploymentSpec"]["executors"].values()
    registry = gke_build.Registry(gke_build.registry_client(credentials()), log=lambda m: None)
    images = sorted({e["container"]["image"] for e in executors})
    found = {i: i if IMAGE_WITH_DIGEST.match(i) else gke_build.tag_digest(registry, i) for i in images}
    missing = [image for image, digest in found.items() if digest is None]
    if missing:
        return template, missing
    for executor in executors:
        image = executor["container"]["image"]
        executor["container"]["image"] = image if found[image] == image else f"{image}@{found[image]}"
    pinned = Path(tempfile.mkdtemp(prefix="tpupipe-")) / Path(template).name
    pinned.write_text(yaml.safe_dump(spec, sort_keys=True))
    return str(pinned), []


def publish(
    target: Target,
    kfp_repository: str,
    version: str,
    log: Callable[[str], None] = print,
    build_account: str = "",
    allow_default: bool = False,
) -> Published:
    """Build the components image if missing and upload the pinned template. Cloud Build's account is refused, before
    any call, when it is the project's default build account (none named) or the Compute Engine default one, unless
    ``allow_default`` (``--allow-default-identities``)."""
    from components.cloud import build as gke_build
    from components.cloud import storage as gke_storage
    from components.cloud.credentials import credentials
    from components.platforms.gke.plan import identities
    from components.spec import SpecError
    from components.spec.gke_checks import SERVICE_ACCOUNT

    if build_account and not SERVICE_ACCOUNT.match(build_account):
        raise SpecError("--build-service-account", f"{build_account!r} is not a service account email")
    if not allow_default and (not build_account or identities.is_default(build_account)):
        refusal = identities.build_refusal(build_account).replace(
            "gke.build_service_account", "--build-service-account"
        )
        raise SpecError(
            "--build-service-account", refusal, ["NAME@PROJECT.iam.gserviceaccount.com", "--allow-default-identities"]
        )

    creds = credentials()
    tag = gke_build.image_tag(PIPELINE_IMAGE)
    image = target.image(tag)
    registry = gke_build.Registry(gke_build.registry_client(creds), log=log)
    registry.ensure(target.project, target.region, target.repository, field="--repository")
    digest = gke_build.tag_digest(registry, image)
    built = digest is None
    if built:
        log(f"publish: {image} is not in Artifact Registry: building it")
        if not build_account:  # --allow-default-identities
            log(
                "publish: warning: --build-service-account not given: Cloud Build builds it as the project's default "
                f"build account, often with broad roles on the project ({identities.BUILD_ACCOUNT_DOC})"
            )
        storage = gke_storage.Storage(gke_storage.storage_client(target.project, creds), log=log)
        storage.ensure_bucket(target.run_bucket, target.region)
        body = build_body(target, image, tag, build_account)
        generation = storage.upload(
            target.run_bucket,
            body["source"]["storageSource"]["object"],
            gke_build.build_context(PIPELINE_IMAGE),
            content_type="application/gzip",
        )
        builder = gke_build.CloudBuild(gke_build.client(creds), target.project, target.region, log=log)
        body = gke_build.pinned_source(body, generation)
        builder.ensure(body, body["tags"][1], lambda kind, name: None, timeout_s=BUILD_TIMEOUT_S + 600)
        digest = gke_build.tag_digest(registry, image)  # what the build pushed
    else:
        log(f"publish: {image} is in Artifact Registry already: reusing it")
    registry.ensure(target.project, target.region, kfp_repository, fmt="KFP", field="--kfp-repository")
    tags = tuple(t for t in (version, source_version()[:12], "latest") if t)
    host = kfp_host(target, kfp_repository)
    with tempfile.TemporaryDirectory() as tmp:
        path = compile_pipeline(str(Path(tmp) / "tpupipe.yaml"), target, digest=digest)
        import google.auth.transport.requests
        from kfp.registry import RegistryClient

        if not creds.valid:  # kfp refreshes them only for a *-kfp.pkg.dev host (its RegistryClient._refresh_creds)
            request = google.auth.transport.requests.Request()
            creds.refresh(request)  # type: ignore[no-untyped-call]  # google-auth's refresh is unannotated
        package, package_version = RegistryClient(host=host, auth=creds).upload_pipeline(path, tags=list(tags))
    log(f"publish: template {package}/{package_version} in {host}, tags {', '.join(tags)}")
    return Published(f"{image}@{digest}", built, f"{package}/{package_version}", tags, host)
