"""Where a run's compiled programs are kept across runs: one directory per (trainer image, accelerator, topology,
model), so the second run of a schedule loads what the first compiled instead of compiling it again.

Pure: the key is a path of readable parts, each of which changes the programs a trainer compiles, so a program is
only ever looked up beside programs built by the same image for the same slice and model. Inside that directory JAX
keys every entry again by the program itself, the compile options, the devices, jax/jaxlib and the backend's
version (``jax/_src/cache_key.py``: ``get``), so an entry of another shape or runtime is never a hit; a damaged entry
is read as a miss with a warning and compiled again (``jax/_src/compiler.py``, ``_cache_read``: the error is raised
only under ``jax_raise_persistent_cache_errors``, off by default). The trainers get the directory on their command
line (``components.workload.maxtext.train_args``: MaxText's ``jax_cache_dir``). Beside them, under ``weights/``,
the hub's base weights, one copy per model revision (``components.workload.weights``).
"""

from __future__ import annotations

import re

from components.spec import RunSpec

CACHE_PREFIX = "cache"  # under the output root (local) or the run's bucket (gke): what outlives a run
UNKNOWN_IMAGE = "IMAGE-DIGEST"  # the plan's stand-in: the trainer image's digest is known once build_image ran


def _part(text: str) -> str:
    """A path component of ``text``: letters, digits, dots, dashes and underscores, the rest as dashes."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "-"


def model_name(spec: RunSpec) -> str:
    """The model whose programs are compiled: MaxText's model name, or the FSDP trainer's ``train.model_id``."""
    return spec.maxtext.model_name if spec.train.workload == "maxtext" else spec.train.model_id


def image_digest(image: str) -> str:
    """The digest part of a pinned image reference (``NAME@sha256:HEX`` -> ``HEX``) or of a bare digest; the
    reference itself (made a path component) when it is pinned by tag alone."""
    if "@" in image:
        return _part(image.rsplit("@", 1)[1].split(":", 1)[-1])
    return _part(image.removeprefix("sha256:"))


def key(spec: RunSpec, image: str) -> str:
    """``compile/<model>/<accelerator>-<topology>-<slices>-slice/<image digest>``: the compile cache's directory
    under the cache prefix, for the trainer ``image`` (a pinned reference or a digest; ``UNKNOWN_IMAGE`` in the
    plan)."""
    c = spec.cluster
    where = f"{c.accelerator}-{c.topology or f'{c.num_hosts}hosts'}-{c.num_slices}-slice"
    return f"compile/{_part(model_name(spec))}/{_part(where)}/{image_digest(image) if image else UNKNOWN_IMAGE}"


def directory(root: str, spec: RunSpec, image: str) -> str:
    """The compile cache of ``spec`` under ``root`` (the cache prefix as the cluster's jobs see it); empty when the
    platform keeps none (``root`` empty)."""
    return f"{root.rstrip('/')}/{key(spec, image)}" if root else ""
