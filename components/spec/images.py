"""Image references: pinned (``NAME[:TAG]@ALGORITHM:HEX``, what a registry cannot move) or by tag alone. The trainer
image a run deploys and records is pinned to the digest its build returned, so what ran is what provenance names."""

from __future__ import annotations

import re
from typing import Any

from components.spec.errors import SpecError

IMAGE_WITH_DIGEST = re.compile(r"^\S+@[a-z0-9]+:[0-9a-f]{8,}$")


def pinned_image(build: dict[str, Any]) -> str | None:
    """The trainer image with its digest (``NAME[:TAG]@sha256:HEX``) from build_image's result, or None when the
    run used an image by tag alone (``gke.image`` without a digest): a tag can move, so it pins nothing."""
    image = build.get("image") or ""
    if IMAGE_WITH_DIGEST.match(image):
        return image
    found = build.get("digest") or ""
    if not (image and found):
        return None
    found = found if ":" in found else f"sha256:{found}"  # a local environment's content hash
    return f"{image.split('@')[0]}@{found}"


# An image digest as a registry gives it: the OCI image spec's ``algorithm:encoded``, sha256 with 64 lowercase hex
# digits (https://github.com/opencontainers/image-spec/blob/main/descriptor.md#digests).
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def check_digest(field: str, digest: str) -> str:
    """``digest`` when it is a sha256 image digest; else a SpecError naming ``field``."""
    if not DIGEST.match(digest):
        raise SpecError(field, f"{digest!r} is not an image digest", ["sha256:<64 hex digits>"])
    return digest


# The Cloud Build step that runs ``docker build``: Google's docker builder image (its source:
# https://github.com/GoogleCloudPlatform/cloud-builders/tree/master/docker, published as gcr.io/cloud-builders/docker),
# pulled by digest, not by the tag ``latest`` that Google moves with each release: a build step runs with the build
# service account's credentials and the run's sources, so what it is must not change between two builds of one run.
# The digest is the docker builder (Docker 20.10.24) as Cloud Build logs showed it in 2026; to move to a newer one,
# read the digest ``latest`` names now (``gcloud container images describe gcr.io/cloud-builders/docker:latest``).
DOCKER_BUILDER = "gcr.io/cloud-builders/docker@sha256:efdbd755476e7e5eb1077ed6e4bf691f87b38fbded575e9b825f9480374f8f4b"
