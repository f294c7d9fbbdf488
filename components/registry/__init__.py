"""The model registry: every fine-tuned model a run produced, as numbered versions of a named model, each with its
artifact, its labels and its provenance, and aliases that name versions (``champion``: the version in use).

One interface (:class:`Registry`) over two backends (see docs/architecture.md, "The model registry"):

- ``local``: a directory (default ``<output root>/registry``) of plain JSON files, written whole (a temporary file,
  then a rename) under a per-model lock, so two writers never corrupt it or hand out one version id twice;
- ``vertex``: Vertex AI Model Registry, through the ``google-cloud-aiplatform`` SDK (``components.registry.vertex``).

Both keep exactly the same state: versions are immutable once registered; aliases are the only thing that changes.
The history ``rollback`` needs is kept in aliases too (``champion-1``, ``champion-2``, ...: the n-th version to
hold ``champion`` in the alias's history, oldest first), so a backend needs no other mutable record, and the
``Registry`` class holds every rule once: what a name, an alias, a label and a provenance are; how promote and
rollback move aliases; which errors name which field. A backend only stores and fetches.

An alias moves only after the version it names exists, so a registration that fails never leaves ``champion``
pointing at it. Which version becomes champion, and when, is the caller's decision (``promote``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn, Protocol

from components.spec import CHAMPION, SpecError
from components.spec.images import IMAGE_WITH_DIGEST
from components.spec.names import DEFAULT_REGION, MODEL_NAME
from components.spec.run_spec import MODEL_REF

HISTORY_DEPTH = 20  # alias history kept per alias: rollback can go this many promotions back, minus one

# Vertex AI's rules, applied on both backends so that a model that fits one fits the other.
NAME = MODEL_NAME  # a Vertex model id: the model's name in every backend
# An alias ends with a letter: never a version id (digits), never a history marker (``<alias>-<n>``).
ALIAS = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z])?$")
MARKER = re.compile(r"^[a-z](?:[a-z0-9-]{0,61}[a-z])?-\d+$")  # an alias history marker: champion-3
REF = MODEL_REF  # what may follow NAME@: a version id, an alias or a history marker
VERTEX_DEFAULT_ALIAS = "default"  # Vertex AI's: the version a request without a version gets
RESERVED_ALIASES = (VERTEX_DEFAULT_ALIAS,)
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
MAX_LABELS = 64
# The Vertex backend's own labels: which models are this registry's, and the token of one registration.
REGISTRY_LABEL, TOKEN_LABEL = "tpupipe-registry", "tpupipe-registration"

# What every version records of how it was made. A value may be None where it does not apply (a local run has no
# pipeline job name); the key must be there, so that every version answers every question the same way.
PROVENANCE_FIELDS = {
    "preset": "the preset the run resolved",
    "spec_hash": "digest of the resolved run spec (components.registry.digest)",
    "base_model": "the model the fine-tune started from (a model id, or NAME@VERSION of this registry)",
    "data_snapshot": "digest of the examples trained on (a snapshotted dataset: its data manifest's)",
    "trainer_image": "the trainer image with its digest (NAME@sha256:...)",
    "git_sha": "the source commit",
    "accelerator": "cpu, v6e, tpu7x, ...",
    "topology": "the slice topology (2x2, 4x4, ...)",
    "slices": "number of slices",
    "tokens_seen": "training tokens processed",
    "restarts": "worker group restarts during training",
    "preemptions": "hosts lost during training",
    "eval_loss_before": "held-out loss of the starting model",
    "eval_loss_after": "held-out loss of this version",
    "pipeline_job": "the pipeline job's name",
    "run_id": "the run that produced it",
}
COUNTS = ("slices", "tokens_seen", "restarts", "preemptions")


@dataclass(frozen=True)
class Version:
    """One registered version of a model. ``aliases`` are the aliases it holds now (history markers left out)."""

    name: str
    version: str  # "1", "2", ...: assigned by the registry in registration order
    artifact_uri: str
    aliases: tuple[str, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=True)
    created: str = ""  # RFC 3339, UTC

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class Move:
    """One change of aliases on one version: ``add`` moves each alias there from whichever version held it."""

    version: str
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()


class Backend(Protocol):
    """What stores a registry: versions with every alias they hold (history markers included, ``default`` left
    out). It checks nothing the :class:`Registry` checks and answers None for what does not exist."""

    where: str  # said in messages: a directory, or the Vertex AI location

    def upload(self, name: str, artifact_uri: str, provenance: dict[str, Any], labels: dict[str, str]) -> Version:
        """A new version (the next id), holding no alias."""

    def fetch(self, name: str, ref: str) -> Version | None:
        """The version with id or alias ``ref``; None when the model or the reference is unknown."""

    def versions(self, name: str) -> list[Version] | None:
        """Every version, oldest first; None when there is no such model."""

    def models(self) -> list[str]:
        """The registry's model names, sorted."""

    def change(self, name: str, plan: Callable[[dict[str, str]], list[Move]]) -> list[Move]:
        """Apply ``plan(aliases)``'s moves, in order, to the aliases as they are now ({alias: version id}, markers
        included); the moves applied. The local backend plans and applies under the model's lock, in one write."""

    def resource(self, name: str, version: str) -> str:
        """The version's resource name in Vertex AI (``projects/P/locations/L/models/NAME@VERSION``), what the UI
        links a pipeline run's ``google.VertexModel`` artifact to; '' for a registry outside Vertex AI."""


# ---------------------------------------------------------------- the rules


def digest(value: Any) -> str:
    """``sha256:<hex>`` of bytes, text, or anything JSON-serializable (keys sorted): a spec hash, a data snapshot."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode()
    else:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise SpecError(
            "name",
            f"{name!r} is not a model name: a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'",
        )


def check_alias(alias: str) -> None:
    if alias in RESERVED_ALIASES:
        raise SpecError("alias", f"{alias!r} is reserved by Vertex AI (the version a request without a version gets)")
    if not isinstance(alias, str) or not ALIAS.match(alias):
        raise SpecError(
            "alias",
            f"{alias!r} is not an alias: lowercase letters, digits and '-', starting and ending "
            "with a letter (an alias is never a version id, nor an alias history marker like "
            f"{CHAMPION}-3)",
        )


def check_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.match(key):
            raise SpecError(
                "labels", f"key {key!r}: a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'"
            )
        if not isinstance(value, str) or not LABEL_VALUE.match(value):
            raise SpecError("labels", f"{key}={value!r}: a value is up to 63 lowercase letters, digits, '_' or '-'")
        if key in PROVENANCE_FIELDS:
            raise SpecError("labels", f"{key!r} is a provenance field: it is labelled from the provenance")
        if key in (REGISTRY_LABEL, TOKEN_LABEL):
            raise SpecError("labels", f"{key!r} is the registry's own label")


def check_provenance(provenance: dict[str, Any]) -> None:
    """Every field of PROVENANCE_FIELDS present; counts are whole numbers; the trainer image carries its digest;
    the whole is JSON (it is stored as JSON)."""
    if not isinstance(provenance, dict):
        raise SpecError("provenance", f"a dict of {', '.join(PROVENANCE_FIELDS)}, got {type(provenance).__name__}")
    missing = [key for key in PROVENANCE_FIELDS if key not in provenance]
    if missing:
        raise SpecError(
            f"provenance.{missing[0]}",
            f"missing ({PROVENANCE_FIELDS[missing[0]]}); every version "
            f"records {', '.join(PROVENANCE_FIELDS)} (None where one does not apply)",
        )
    for key in COUNTS:
        value = provenance[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SpecError(f"provenance.{key}", f"a whole number >= 0 or None, got {value!r}")
    image = provenance["trainer_image"]
    if image and not IMAGE_WITH_DIGEST.match(str(image)):
        raise SpecError("provenance.trainer_image", f"{image!r} has no digest: NAME@sha256:HEX (a tag can move)")
    try:
        json.dumps(provenance, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SpecError("provenance", f"not JSON: {exc}") from None


def provenance_labels(provenance: dict[str, Any]) -> dict[str, str]:
    """The provenance fields whose value is a valid label value as it is (``preset``, ``accelerator``, ``git_sha``,
    counts, ...); the rest (digests, URIs, floats) lives in the provenance alone."""
    out = {}
    for key in PROVENANCE_FIELDS:
        value = provenance.get(key)
        text = str(value).lower() if isinstance(value, bool) else "" if value is None else str(value)
        if text and LABEL_VALUE.match(text):
            out[key] = text
    return out


# ---------------------------------------------------------------- alias history


def markers(aliases: dict[str, str], alias: str) -> list[tuple[int, str]]:
    """The alias's history as (n, version), oldest first, from its markers ``<alias>-<n>``."""
    pattern = re.compile(rf"^{re.escape(alias)}-(\d+)$")
    return sorted((int(m.group(1)), version) for a, version in aliases.items() if (m := pattern.match(a)))


def promote_moves(aliases: dict[str, str], version: str, alias: str) -> list[Move]:
    """What moves ``alias`` to ``version`` and records it in the history: one move on that version (the alias and its
    new marker together), then the oldest marker dropped beyond HISTORY_DEPTH. Nothing when it is there already."""
    history = markers(aliases, alias)
    top = history[-1] if history else (0, None)
    if aliases.get(alias) == version and top[1] == version:
        return []
    if top[1] == version:  # the history already ends here (a rollback cut short): only the alias moves
        return [Move(version, add=(alias,))]
    moves = [Move(version, add=(alias, f"{alias}-{top[0] + 1}"))]
    if len(history) + 1 > HISTORY_DEPTH:
        n, oldest = history[0]
        moves.append(Move(oldest, remove=(f"{alias}-{n}",)))
    return moves


def rollback_moves(aliases: dict[str, str], alias: str) -> list[Move]:
    """What moves ``alias`` back to the version that held it before. The history's last marker names the current
    holder; it is removed first, then the alias moves to the new last one's version. If only the first step was
    done (a failure between the two), the history's end and the alias disagree, and rolling back again finishes
    that rollback: it moves the alias to where the history ends. Empty: nothing to roll back to."""
    history = markers(aliases, alias)
    holder = aliases.get(alias)
    if history and holder != history[-1][1]:
        return [Move(history[-1][1], add=(alias,))]
    if len(history) < 2:
        return []
    (n, current), (_, previous) = history[-1], history[-2]
    return [Move(current, remove=(f"{alias}-{n}",)), Move(previous, add=(alias,))]


def _all_aliases(versions: list[Version]) -> dict[str, str]:
    return {alias: v.version for v in versions for alias in v.aliases}


def _shown(version: Version) -> Version:
    """The version as callers see it: its aliases without the history markers."""
    named = tuple(sorted(a for a in version.aliases if not MARKER.match(a)))
    return replace(version, aliases=named)


# ---------------------------------------------------------------- the interface


class Registry:
    """The registry's operations, the same over every backend. Bad input and unknown names or versions raise a
    SpecError naming the field (``name``, ``version``, ``alias``, ``labels``, ``provenance.<key>``); a backend that
    fails raises an InfraError."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.where = backend.where

    def register(
        self, name: str, artifact_uri: str, provenance: dict[str, Any], labels: dict[str, str] | None = None
    ) -> Version:
        """A new version of ``name`` (the model is created with its first version). It holds no alias: moving one to
        it (``promote``) is the caller's next, separate decision."""
        check_name(name)
        if not isinstance(artifact_uri, str) or not artifact_uri.strip():
            raise SpecError("artifact_uri", "the checkpoint's location is required")
        check_provenance(provenance)
        labels = dict(labels or {})
        check_labels(labels)
        labels = {**provenance_labels(provenance), **labels}
        if len(labels) > MAX_LABELS - 2:  # two are the registry's own
            raise SpecError("labels", f"{len(labels)} labels with the provenance's; at most {MAX_LABELS - 2}")
        return _shown(self.backend.upload(name, artifact_uri, dict(provenance), labels))

    def get(self, name: str, ref: str) -> Version:
        """The version of ``name`` with id or alias ``ref`` (``3``, ``champion``)."""
        check_name(name)
        ref = str(ref)
        found = self.backend.fetch(name, ref) if REF.match(ref) else None
        if found is None:
            self._unknown_version(name, self._versions(name), str(ref))
        return _shown(found)

    def versions(self, name: str) -> list[Version]:
        """Every version of ``name``, oldest first."""
        check_name(name)
        return [_shown(v) for v in self._versions(name)]

    def models(self) -> list[str]:
        return self.backend.models()

    def resource(self, version: Version) -> str:
        return self.backend.resource(version.name, version.version)

    def champion(self, name: str) -> Version | None:
        """The version in use, or None before any promotion."""
        check_name(name)
        found = self.backend.fetch(name, CHAMPION)
        if found is None:
            self._versions(name)  # an unknown model is an error, a model without a champion is not
        return None if found is None else _shown(found)

    def history(self, name: str, alias: str = CHAMPION) -> list[str]:
        """The versions that held ``alias``, in order: the last is the holder, rollback goes to the one before."""
        check_name(name)
        check_alias(alias)
        return [version for _, version in markers(_all_aliases(self._versions(name)), alias)]

    def set_alias(self, name: str, version: str, alias: str) -> Version:
        """Move ``alias`` to ``version`` (it leaves the version that held it), recording the move in its history."""
        check_name(name)
        check_alias(alias)
        versions = self._versions(name)
        version = str(version)
        if version not in {v.version for v in versions}:
            self._unknown_version(name, versions, version, ids_only=True)
        self.backend.change(name, lambda aliases: promote_moves(aliases, version, alias))
        return self.get(name, version)

    def promote(self, name: str, version: str) -> Version:
        """Make ``version`` the champion."""
        return self.set_alias(name, version, CHAMPION)

    def rollback(self, name: str, alias: str = CHAMPION) -> Version:
        """Move ``alias`` back to the version that held it before the current holder; the version it names now."""
        check_name(name)
        check_alias(alias)
        self._versions(name)
        seen: dict[str, str] = {}

        def plan(aliases: dict[str, str]) -> list[Move]:
            seen.update(aliases)
            return rollback_moves(aliases, alias)

        if not self.backend.change(name, plan):
            holder = seen.get(alias)
            raise SpecError(
                "name",
                f"{name!r}: no earlier {alias} to roll back to "
                + (f"(version {holder} is the first to hold it)" if holder else f"(no version is {alias})"),
            )
        return self.get(name, alias)

    def _versions(self, name: str) -> list[Version]:
        versions = self.backend.versions(name)
        if versions is None:
            known = self.backend.models()
            raise SpecError("name", f"no model {name!r} in {self.where}", known or ["(the registry is empty)"])
        return versions

    def _unknown_version(self, name: str, versions: list[Version], ref: str, ids_only: bool = False) -> NoReturn:
        ids = [v.version for v in versions]
        aliases = [] if ids_only else sorted({a for v in versions for a in _shown(v).aliases})
        what = "version" if ids_only else "version or alias"
        raise SpecError("version", f"model {name!r} has no {what} {ref!r}", ids + aliases)


def open_registry(
    output_root: str | Path = "runs", project: str = "", region: str = DEFAULT_REGION, **vertex_options: Any
) -> Registry:
    """The local registry under ``<output_root>/registry``, or, with a project, Vertex AI Model Registry in
    ``project`` and ``region`` (its options: ``serving_image``, ``retry_delays_s``; see ``vertex.VertexBackend``)."""
    if project:
        from components.registry.vertex import VertexBackend

        return Registry(VertexBackend(project, region, **vertex_options))
    from components.registry.local import LocalBackend

    return Registry(LocalBackend(Path(output_root) / "registry"))
