"""The base weights of a hub-named ``train.model_id``, made ready in the cache prefix at the start of the train stage
(``components.workload.weights``: copied once per revision, checked on every run) before the train job is
submitted, so that no TPU host downloads from the hub. The run records where the copy is and its trusted manifest
(``weights.json``); every job of the run gets its directory as ``TPUPIPE_WEIGHTS_DIR`` and the manifest's files as
``TPUPIPE_WEIGHTS_MANIFEST``, and reads only bytes that hash to it (``trainers.weights_check``).

Here, on the components' side, and not in the first worker: one download per revision for the whole slice, made
where the run's Hugging Face token already is (``$HF_TOKEN``, the file ``$HF_TOKEN_PATH`` names, or on gke the
Secret Manager secret ``gke.hf_token_secret``), and finished and checked before any chip is waiting on it. Only
where this process holds no trusted manifest of the revision and cannot download it (the hub out of reach, or a gated
model, whose files the hub refuses with 401 or 403 to a process without a token of an account granted access, while
it lists them to anyone: the token only the pods hold, ``gke.hf_secret``) does the run go on without the cache, the
workers downloading from the hub themselves, unchecked, with one warning line; where the workers have no route to
the internet either (``Platform.no_internet``: a gke cluster the run creates without a Cloud NAT) that is an error
naming the fix. Anything else stops the run naming the file: a fresh download that does not hash to the hub's
listing, a cached copy that is damaged while the hub is out of reach or refuses it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.platforms import RunContext, get_platform
from components.platforms.store import read_json, write_json
from components.spec import InfraError
from components.spec.checks import DEFAULT_REVISION
from components.workload import weights
from components.workload.cache import CACHE_PREFIX

if TYPE_CHECKING:
    from components.workload.cache_trust import Place

RECORD = "weights.json"
COMMIT = re.compile(r"[0-9a-f]{40}")  # a git commit id, as the hub's API names it (``sha``)


def wanted(ctx: RunContext) -> bool:
    """Whether the run reads a hub model's weights through the cache: the FSDP trainer's hub-named model, on a
    platform that keeps a cache prefix."""
    spec = ctx.spec
    return (
        spec.train.workload != "maxtext"
        and weights.is_hub_name(spec.train.model_id)
        and bool(get_platform(ctx.platform).compile_cache_root(ctx))
    )


def open_cache(ctx: RunContext) -> weights.Cache:
    """The cache prefix as this process reaches it: the directory the local platform's jobs read, or the bucket's
    ``cache/`` (what the gke worker pods mount) through the Cloud Storage client."""
    if ctx.store.local() is not None:
        return weights.LocalCache(Path(get_platform(ctx.platform).compile_cache_root(ctx)))
    from components.platforms.store import gcs_client

    return weights.GcsCache(ctx.store.uri.removeprefix("gs://").split("/", 1)[0], CACHE_PREFIX, gcs_client())


def trusted_place(ctx: RunContext) -> Place:
    """Where the trusted manifests live (``cache_trust``'s ``manifests``: the bucket's ``state/``, which no pod's
    identity reaches; beside the runs locally): each copy's files with the hub's hashes, and each revision's
    commit."""
    places = get_platform(ctx.platform).cache_places(ctx)
    assert places is not None  # wanted(ctx): the platform keeps a cache
    return places.manifests


def hub_token(ctx: RunContext) -> str | None:
    """The Hugging Face token of this process (``$HF_TOKEN``, or the file ``$HF_TOKEN_PATH`` names), else the one the
    platform keeps for the run (``Platform.hub_token``). Never logged, never written."""
    token = os.environ.get("HF_TOKEN")
    path = os.environ.get("HF_TOKEN_PATH")
    if not token and path and Path(path).is_file():
        token = Path(path).read_text().strip()
    return token or get_platform(ctx.platform).hub_token(ctx)


def prepare(ctx: RunContext, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The copy of the run's base weights, made or checked now (``log``: its lines), recorded in the run; None when
    the run reads none."""
    t = ctx.spec.train
    model_id, revision = t.model_id, t.model_revision
    if not wanted(ctx):
        _no_copy_of(revision, f"{ctx.platform} keeps no cache prefix")
        return None
    try:
        out = weights.ensure(open_cache(ctx), trusted_place(ctx), model_id, revision, hub_token(ctx), log)
    except weights.NoTrustedCopy as exc:  # no manifest, and the hub out of reach or refusing this side the files
        _no_copy_of(revision, str(exc))
        blocked = get_platform(ctx.platform).no_internet(ctx)
        if blocked:  # the workers could not reach the hub either: stop now, not at their first download
            raise InfraError(
                f"base weights of {model_id} not cached ({exc}), and the workers cannot download them: {blocked}; "
                "let this side reach the hub with the token (gke.hf_token_secret, or $HF_TOKEN where the pipeline "
                "runs), or keep the token in the pods alone (gke.hf_secret without gke.hf_token_secret), which "
                "gives the run a Cloud NAT"
            ) from exc
        log(f"WARNING: base weights not cached ({exc}); the workers download {model_id} from the hub, unchecked")
        return None
    root = get_platform(ctx.platform).compile_cache_root(ctx)
    record = {
        **out,
        "model_id": model_id,
        "revision": revision,
        "dir": weights.files_dir(root, model_id, out["commit"]),
    }
    write_json(ctx.store, RECORD, record)  # the run's state: no pod writes it
    return {k: v for k, v in record.items() if k != "entries"}


def _no_copy_of(revision: str, why: str) -> None:
    """Without a copy the workers read the hub's default branch (``trainers.model.weights_source``); a run that
    names another revision stops here rather than train on other weights than it asked for."""
    if revision != DEFAULT_REVISION:
        raise InfraError(
            f"train.model_revision={revision}: the weights of that revision cannot be copied for the workers ({why}); "
            f"without a copy they read {DEFAULT_REVISION}"
        )


def job_env(ctx: RunContext) -> dict[str, str]:
    """``TPUPIPE_WEIGHTS_DIR`` and the trusted manifest's files (``TPUPIPE_WEIGHTS_MANIFEST``, which every worker
    checks the bytes it loads against: ``trainers.weights_check``) for the run's jobs, once :func:`prepare` made the
    copy; nothing otherwise. The manifest travels in the job's own definition, which this side writes, not in a
    file a pod could reach. Of the run's record only the commit is taken, and only as a commit id: the model is the
    spec's, the directory is derived, and the manifest is read again from the trusted place (a record is in the
    run's directory; what vouches for the bytes is only ever the trusted manifest)."""
    record = read_json(ctx.store, RECORD) if wanted(ctx) else None
    if not record:
        return {}
    model_id, commit = ctx.spec.train.model_id, str(record.get("commit", ""))
    if not COMMIT.fullmatch(commit):
        raise InfraError(f"base weights: the run's {RECORD} names no commit ({commit!r}); refusing to pass it on")
    env = {
        weights.WEIGHTS_DIR_ENV: weights.files_dir(get_platform(ctx.platform).compile_cache_root(ctx), model_id, commit)
    }
    found = trusted_place(ctx).read(weights.manifest_key(model_id, commit))
    if found is not None:  # without its trusted manifest the workers refuse the directory (trainers.weights_check)
        env[weights.WEIGHTS_MANIFEST_ENV] = weights.manifest_env(json.loads(found)["files"])
    return env
