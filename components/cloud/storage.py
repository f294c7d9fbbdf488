"""The checkpoint bucket and the run's access to it, through google-cloud-storage
(docs/architecture.md, "Cloud calls through the client libraries").

- the bucket (``gke.bucket``, default ``<project>-tpupipe``) is got or created (uniform bucket-level access, in the
  cluster's region) and kept after the run: it holds every run's checkpoints;
- the run's Kubernetes ServiceAccount gets ``roles/storage.objectUser`` on it through Workload Identity Federation
  (a ``principal://`` member naming the project *number*, looked up through Resource Manager); teardown removes
  that binding;
- IAM policy changes are read-modify-write with the policy's etag, retried when another writer got in between
  (HTTP 412).

The client is ``credentials.storage_client`` (the emulator is found as google-cloud-storage finds it,
``STORAGE_EMULATOR_HOST``); Resource Manager's and IAM's reads are ``iam``. Cloud SDKs are imported inside functions.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from components.cloud.credentials import storage_client
from components.cloud.errors import Adapter
from components.cloud.iam import IAM_POLICY_VERSION
from components.spec import InfraError, SpecError

if TYPE_CHECKING:
    from google.api_core.iam import Policy

    # google-cloud-storage ships no type information: its names are Any to mypy (pyproject.toml's overrides)
    from google.cloud.storage import Blob, Bucket


def member(binding: dict[str, Any], number: str, uid: str) -> str:
    """The binding's member with the project number and the Kubernetes ServiceAccount's UID filled in (the plan shows
    PROJECT_NUMBER and SERVICEACCOUNT_UID)."""
    template: str = binding["member"]
    return template.replace("PROJECT_NUMBER", number).replace("SERVICEACCOUNT_UID", uid)


def unreadable(name: str, why: str) -> SpecError:
    return SpecError(
        "gke.bucket",
        f"the bucket {name} exists but this identity cannot read it (another project's bucket, or no "
        f"storage.buckets.get): {why}",
        ["a bucket of this project", "a globally unique new name"],
    )


def without_uniform_access(bucket: Bucket) -> SpecError | None:
    """The refusal of an existing bucket without uniform bucket-level access: the run's bindings on it are conditioned
    on its prefix, and "you must enable uniform bucket-level access on a bucket" to use IAM Conditions there
    (https://cloud.google.com/storage/docs/access-control/iam#conditions)."""
    if bucket.iam_configuration.uniform_bucket_level_access_enabled:
        return None
    return SpecError(
        "gke.bucket",
        f"the bucket {bucket.name} has no uniform bucket-level access: the run grants its pods access to the run's "
        'prefix only, with an IAM condition, which such a bucket refuses: turn it on (Cloud Storage, "Use uniform '
        'bucket-level access") or name another bucket',
        ["a bucket with uniform bucket-level access", "a new name (created with it)"],
    )


def without_hierarchical_namespace(bucket: Bucket) -> SpecError | None:
    """The refusal of an existing bucket without hierarchical namespace for a run whose checkpoints are committed by a
    directory rename (``components.workload.derive.commits_by_directory_rename``: MaxText's Orbax checkpoints on the
    bucket's Cloud Storage FUSE mount). Only there is a folder's rename one atomic operation ("The rename operation is
    atomic": https://cloud.google.com/storage/docs/rename-hns-folders; Cloud Storage FUSE renames a folder of such a
    bucket in one step: https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/docs/semantics.md); in a flat
    bucket Cloud Storage FUSE copies and deletes each object, and by default refuses a directory's rename at all
    (``--rename-dir-limit``, 0 by default: https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options). The
    bucket resource says which it is (``hierarchicalNamespace.enabled``:
    https://cloud.google.com/storage/docs/json_api/v1/buckets), and it is chosen only when a bucket is created ("You
    cannot enable hierarchical namespace in an existing bucket": https://cloud.google.com/storage/docs/create-hns-bucket)."""
    if bucket.hierarchical_namespace_enabled:
        return None
    return SpecError(
        "gke.bucket",
        f"the bucket {bucket.name} has no hierarchical namespace (its hierarchicalNamespace.enabled is not true): "
        "MaxText's checkpoints are committed by renaming a step's directory on the bucket's Cloud Storage FUSE mount, "
        "which only a bucket with hierarchical namespace renames atomically (elsewhere a save cut short can leave a "
        "step half renamed, and Cloud Storage FUSE refuses the rename by default); a bucket gets it only when created: "
        "name a bucket created with it in gke.bucket, or a new name (the run creates it with hierarchical namespace)",
        ["a bucket with hierarchical namespace", "a new name (created with it)"],
    )


class SourceChanged(RuntimeError):
    """Objects a pinned copy (``Storage.copy_prefix``'s ``generations``) names that are at another generation now, or
    gone: ``changed``, their names under the source prefix."""

    def __init__(self, changed: list[str]):
        super().__init__(f"rewritten or gone since pinned: {', '.join(changed)}")
        self.changed = changed


# The object's metadata a copy carries from its source (google-cloud-storage's ``Blob`` properties of the object
# resource's contentType, contentEncoding, contentLanguage, contentDisposition, cacheControl, customTime), beside its
# custom metadata: a rewrite whose body gives metadata replaces the destination's with the body's (``Storage._copy``).
CONTENT_METADATA = (
    "content_type",
    "content_encoding",
    "content_language",
    "content_disposition",
    "cache_control",
    "custom_time",
)
# The custom metadata key (the object resource's ``metadata``: https://cloud.google.com/storage/docs/metadata#custom-
# metadata) under which ``copy_prefix`` writes its call's nonce into each object it writes.
COPY_NONCE = "tpupipe-copy"


def same_bytes(one: Blob, other: Blob) -> bool:
    """Whether two objects are known to hold the same bytes: the same size, and the same MD5 where both have one, else
    the same CRC32C where both have one; False where they share no hash (unknown is not the same). "All Cloud Storage
    objects have a CRC32C hash", and MD5 "is not supported for composite objects"
    (https://cloud.google.com/storage/docs/hashes-etags; "Composite objects do not have an MD5 hash metadata field":
    https://cloud.google.com/storage/docs/composite-objects), so CRC32C is what two objects of which one is composite
    can be compared by; MD5, a cryptographic hash where CRC32C is not, where both carry it."""
    if int(one.size or 0) != int(other.size or 0):
        return False
    if one.md5_hash and other.md5_hash:
        return bool(one.md5_hash == other.md5_hash)
    return bool(one.crc32c and other.crc32c and one.crc32c == other.crc32c)


def carry_metadata(source: Blob, copy: Blob, nonce: str) -> None:
    """Give ``copy`` (the body of a rewrite) ``source``'s content metadata (``CONTENT_METADATA``) and custom metadata,
    with ``nonce`` under ``COPY_NONCE``: a body that gives metadata replaces all of the destination's
    (https://github.com/googleapis/google-cloud-java/issues/306), so all of the source's is carried, and its content
    type, which such a body must give ("You must specify the content type of the destination object.", 400:
    https://github.com/googleapis/google-cloud-java/pull/294), is the one an object stored without a Content-Type is
    served as, ``application/octet-stream`` (the object resource's contentType:
    https://cloud.google.com/storage/docs/json_api/v1/objects#resource), where the source has none."""
    for prop in CONTENT_METADATA:
        if getattr(source, prop) is not None:
            setattr(copy, prop, getattr(source, prop))
    copy.content_type = source.content_type or "application/octet-stream"
    copy.metadata = {**(source.metadata or {}), COPY_NONCE: nonce}


def _pinned(found: list[Blob], source: str, generations: dict[str, int]) -> list[Blob]:
    """The listed objects ``generations`` names, each at its generation; :class:`SourceChanged` for those that are
    not (another generation, or none)."""
    by_name = {b.name.removeprefix(f"{source}/"): b for b in found}
    changed = sorted(n for n, g in generations.items() if n not in by_name or int(by_name[n].generation) != int(g))
    if changed:
        raise SourceChanged(changed)
    return [by_name[n] for n in sorted(generations)]


class Storage(Adapter[Any]):  # a google.cloud.storage Client (credentials.storage_client), untyped
    def ensure_bucket(self, name: str, location: str, hierarchical: bool = False) -> Bucket:
        """The bucket: reused if the project can read it (with uniform bucket-level access, and with ``hierarchical``
        hierarchical namespace: :func:`without_hierarchical_namespace`), else created in ``location`` (with
        hierarchical namespace when ``hierarchical``)."""
        from google.api_core import exceptions as gexc

        try:
            bucket = self.call(f"get bucket {name}", lambda: self.client.get_bucket(name))
            refusal = without_uniform_access(bucket) or (hierarchical and without_hierarchical_namespace(bucket))
            if refusal:
                raise refusal
            self.log(f"bucket gs://{name} exists ({bucket.location}): using it")
            return bucket
        except gexc.NotFound:
            pass
        except gexc.Forbidden as exc:
            raise unreadable(name, exc.message) from None
        bucket = self.client.bucket(name)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        if hierarchical:  # with uniform access, as it must be (https://cloud.google.com/storage/docs/create-hns-bucket)
            bucket.hierarchical_namespace_enabled = True
        try:
            bucket = self.call(f"create bucket {name}", lambda: self.client.create_bucket(bucket, location=location))
        except gexc.Conflict as exc:  # created since the get, or another project's name
            try:
                bucket = self.call(f"get bucket {name}", lambda: self.client.get_bucket(name))
            except (gexc.NotFound, gexc.Forbidden):
                raise SpecError(
                    "gke.bucket",
                    f"the bucket name {name} is taken by another project: {exc.message}",
                    ["a bucket of this project", "a globally unique new name"],
                ) from None
            refusal = hierarchical and without_hierarchical_namespace(bucket)
            if refusal:
                raise refusal from None
            return bucket
        self.log(f"created bucket gs://{name} in {location} (kept after the run)")
        return bucket

    def upload(self, name: str, path: str, data: bytes, content_type: str = "application/octet-stream") -> int:
        """Write ``data`` to ``gs://name/path``; the object's generation (what a build pins its source to)."""
        blob = self.client.bucket(name).blob(path)
        self.call(f"upload gs://{name}/{path}", lambda: blob.upload_from_string(data, content_type=content_type))
        self.log(f"uploaded gs://{name}/{path} ({len(data) / 1024:.0f} KiB)")
        return int(blob.generation)

    def generations(self, name: str, prefix: str) -> dict[str, int]:
        """The generation of every object under ``prefix/``, by its name under it: what pins an object's bytes (a
        rewrite of it is a new generation: https://cloud.google.com/storage/docs/metadata#generation-number)."""
        return {b.name.removeprefix(f"{prefix}/"): int(b.generation) for b in self._listed(name, prefix)}

    def _listed(self, name: str, prefix: str) -> list[Blob]:
        under = f"{prefix}/"
        return self.call(f"list gs://{name}/{under}", lambda: list(self.client.list_blobs(name, prefix=under)))

    def copy_prefix(
        self,
        name: str,
        source: str,
        destination: str,
        create_only: bool = False,
        generations: dict[str, int] | None = None,
    ) -> tuple[int, int, int]:
        """Copy every object under ``source/`` to the same name under ``destination/`` in the bucket, server-side
        (objects.rewrite, repeated until done: https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite);
        an object already there with the same bytes (:func:`same_bytes`) is kept (a retried copy resumes). Each object
        written carries this call's nonce in its custom metadata (``COPY_NONCE``), which tells this call's own objects
        from another writer's. ``create_only``: each object written with ``ifGenerationMatch=0``, which "succeeds only
        if there are no live objects" of its name (https://cloud.google.com/storage/docs/request-preconditions), so an
        object there with other bytes is never replaced: a SpecError naming ``run_id`` (one with this call's nonce is
        its own, whose reply was lost; one of the same bytes without it is another writer's, kept: ``_copy``).
        ``generations`` (names under ``source/`` -> generation): exactly
        those objects, each read at that generation only (the rewrite's ``ifSourceGenerationMatch``, which fails the
        request with 412 when the source's live generation is another: the rewrite page's query parameters and
        https://cloud.google.com/storage/docs/request-preconditions), so a source rewritten or gone since is copied
        in no part of it: :class:`SourceChanged` naming them. (objects copied, objects in all, bytes copied);
        (0, 0, 0) when ``source/`` holds nothing. What the copy kept rather than wrote (an earlier copy's object,
        another writer's) is listed again at the end: one gone or holding other bytes since (another writer's copy that
        failed and deleted what it wrote, say) is copied again. A ``create_only`` copy that fails deletes what it wrote:
        its destination holds none of it (what an earlier copy or another writer made is kept, claimed or not); so
        such a copy also claims each object it kept (``_claim``: a metadata patch, not a new generation), which its
        writer, whose copy may still fail, can then no longer delete. (A copy that is not ``create_only`` claims
        nothing: it has no undo, and its destination, a run's inputs, is written by no copy that has one.)"""
        bucket = self.client.bucket(name)
        found = self._listed(name, source)
        have = {b.name: b for b in self._listed(name, destination)}
        if generations is not None:
            found = _pinned(found, source, generations)
        nonce = uuid.uuid4().hex  # this call's: in each object it writes
        made: list[tuple[str, int, int]] = []  # (name, generation, metageneration) of each object this call wrote
        claimed: set[str] = set()  # the kept objects this call claimed (``_claim``)

        def target(blob: Blob) -> str:
            return f"{destination}/{blob.name.removeprefix(f'{source}/')}"

        def missing(there: dict[str, Blob], blobs: list[Blob]) -> list[Blob]:
            return [b for b in blobs if not (target(b) in there and same_bytes(there[target(b)], b))]

        try:
            pending = missing(have, found)
            for _ in range(self.retry.attempts):
                for blob in pending:
                    version = self._copy(bucket, blob, target(blob), source, create_only, generations, nonce)
                    if version is not None:
                        made.append((target(blob), *version))
                written = {path for path, _, _ in made} | claimed
                kept = [b for b in found if target(b) not in written]  # already there, or another writer's copy
                there = {b.name: b for b in self._listed(name, destination)} if kept else {}
                pending = missing(there, kept)
                if not pending and create_only:  # each kept object made this call's, or looked at again (changed)
                    claimed |= {target(b) for b in kept if self._claim(bucket, there[target(b)], nonce)}
                    pending = [b for b in kept if target(b) not in claimed]
                if not pending:
                    break
                self.log(
                    f"  {len(pending)} objects kept under gs://{name}/{destination}/ (another writer's copies, or an "
                    "earlier copy's) are gone or hold other bytes since: copying them again"
                )
            else:
                raise InfraError(
                    f"copy gs://{name}/{source}/ to gs://{name}/{destination}/: the objects another writer keeps "
                    f"deleting or changing there: {', '.join(target(b) for b in pending)}"
                )
        except BaseException:
            if create_only:  # made whole or not at all: no part of a failed copy is left where it was going
                self._undo(name, made)
            raise
        written = {path for path, _, _ in made}
        size = sum(b.size or 0 for b in found if target(b) in written)
        return len(made), len(found), size

    def _rewrite(self, what: str, copy: Blob, source: Blob, **conditions: int) -> tuple[int, int]:
        """``copy`` rewritten from ``source`` (objects.rewrite, asked again with its token until done) under
        ``conditions`` (``Blob.rewrite``'s preconditions); the generation and metageneration written."""
        token = None
        while True:
            token, _, _ = self.call(what, functools.partial(copy.rewrite, source, token, **conditions))
            if token is None:
                return int(copy.generation), int(copy.metageneration)

    def _copy(
        self,
        bucket: Bucket,
        blob: Blob,
        target: str,
        source: str,
        create_only: bool,
        generations: dict[str, int] | None,
        nonce: str,
    ) -> tuple[int, int] | None:
        """One object of ``copy_prefix``: the generation and metageneration of its copy ``target``, written with
        ``nonce`` in its custom metadata; None when a create-only rewrite finds another writer's copy of the same bytes
        there (kept: not this call's to undo). The rewrite sends the destination's resource as its body
        (``Blob.rewrite`` posts the blob's properties, google/cloud/storage/blob.py at 3.17.1; objects.rewrite
        "Optionally overrides metadata": https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite), which
        carries the source's metadata and the nonce (:func:`carry_metadata`). A create-only rewrite refused with 412 by
        a ``target`` that carries ``nonce`` is this call's own: a retry of a request that took effect but whose reply
        was lost. Such a rewrite is asked again: "Socket timeouts and TCP disconnects" are transient
        (https://cloud.google.com/storage/docs/retry-strategy, "Response"), and a write with a generation precondition
        is safe to retry (the same page, "Conditional idempotency"), so google-cloud-storage retries it itself
        (``DEFAULT_RETRY_IF_GENERATION_SPECIFIED``, google/cloud/storage/blob.py at 3.17.1), as does ``call``; the retry
        then finds its own first try's object in place, and its ``ifGenerationMatch=0`` fails (412:
        https://cloud.google.com/storage/docs/request-preconditions). A ``target`` without the nonce is another
        writer's: kept when it holds the source's bytes (:func:`same_bytes`), else refused."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        name = bucket.name
        kept: dict[str, int] = {"if_generation_match": 0} if create_only else {}
        if generations is not None:
            kept["if_source_generation_match"] = int(blob.generation)
        copy = bucket.blob(target)
        carry_metadata(blob, copy, nonce)
        try:
            return self._rewrite(f"copy gs://{name}/{blob.name}", copy, blob, **kept)
        except (PreconditionFailed, NotFound) as exc:
            now = self.call(f"get gs://{name}/{blob.name}", functools.partial(bucket.get_blob, blob.name))
            if generations is not None and (now is None or now.generation != blob.generation):
                raise SourceChanged([blob.name.removeprefix(f"{source}/")]) from None
            if isinstance(exc, NotFound):
                raise
            there = self.call(f"get gs://{name}/{target}", functools.partial(bucket.get_blob, target))
            if there is not None and (there.metadata or {}).get(COPY_NONCE) == nonce:
                self.log(f"  gs://{name}/{target}: already this copy of gs://{name}/{blob.name} (a reply lost)")
                return int(there.generation), int(there.metageneration)
            if there is not None and same_bytes(there, blob):
                self.log(f"  gs://{name}/{target}: another writer's copy of the same bytes meanwhile: kept")
                return None
            raise SpecError(
                "run_id",
                f"gs://{name}/{target} already holds other bytes than gs://{name}/{blob.name} (another run's "
                "copy under this run id): it is never replaced; start this run with another run id",
            ) from None

    def _claim(self, bucket: Bucket, there: Blob, nonce: str) -> bool:
        """Make a kept object (``there``, as listed: another writer's copy of the same bytes, or an earlier copy's)
        this call's, so that its writer's undo cannot delete it after the copy returns: its custom metadata is patched
        to carry this call's nonce (objects.patch, which needs ``storage.objects.update``:
        https://cloud.google.com/storage/docs/json_api/v1/objects/patch) at its listed generation and only while its
        listed metageneration is the live one (``ifGenerationMatch``, ``ifMetagenerationMatch``:
        https://cloud.google.com/storage/docs/request-preconditions). "The metageneration number is incremented each
        time there is a metadata update" (https://cloud.google.com/storage/docs/metadata#generation-number), so the
        writer's delete, conditioned on the metageneration it wrote (``_undo``), then fails with 412 and leaves it,
        while the object keeps its generation, bytes and storage class. A patch deletes and replaces nothing, so
        neither a hold ("the object cannot be deleted or replaced", and "you can edit the metadata" of a held object:
        https://cloud.google.com/storage/docs/object-holds) nor the bucket's retention policy ("objects in the bucket
        can only be deleted or replaced once their age is greater than the retention period":
        https://cloud.google.com/storage/docs/bucket-lock) refuses it. True when it is this call's; False when it
        changed or went since it was listed (412, 404): the copy looks at it again."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        name, path = bucket.name, there.name
        conditions = {
            "if_generation_match": int(there.generation),
            "if_metageneration_match": int(there.metageneration),
        }
        there.metadata = {**(there.metadata or {}), COPY_NONCE: nonce}  # all of it: patched whole, or merged
        try:
            self.call(f"claim gs://{name}/{path}", functools.partial(there.patch, **conditions))
            return True
        except (PreconditionFailed, NotFound):
            now = self.call(f"get gs://{name}/{path}", functools.partial(bucket.get_blob, path))
            return now is not None and (now.metadata or {}).get(COPY_NONCE) == nonce  # its reply lost, a retry refused

    def _undo(self, name: str, made: list[tuple[str, int, int]]) -> None:
        """Delete the objects a failed copy wrote, each at the generation and metageneration it wrote
        (``ifGenerationMatch``, ``ifMetagenerationMatch``: never a later writer's, nor one another copy claimed since,
        ``_claim``), whatever the first failure was; one changed since (412) or gone (404) is left; one that cannot be
        deleted is logged."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        bucket = self.client.bucket(name)
        deleted = 0
        for target, generation, metageneration in made:
            delete = bucket.blob(target).delete
            try:
                self.call(
                    f"delete gs://{name}/{target}",
                    functools.partial(delete, if_generation_match=generation, if_metageneration_match=metageneration),
                )
                deleted += 1
            except (PreconditionFailed, NotFound):
                self.log(f"  gs://{name}/{target}: another writer's since (claimed, or gone): left")
            except Exception as exc:  # noqa: BLE001 - the copy's own failure is what is raised
                self.log(f"  could not delete gs://{name}/{target} of the failed copy: {exc}")
        if deleted:
            self.log(f"  deleted the {deleted} objects the failed copy had written under gs://{name}/")

    def hold_prefix(self, name: str, prefix: str) -> int:
        """A temporary hold on every object under ``prefix/`` that has none: while it holds, "the object cannot be
        deleted or replaced" (https://cloud.google.com/storage/docs/object-holds; objects.patch with
        ``temporaryHold``, which needs ``storage.objects.update``). The objects newly held."""
        held = 0
        for blob in self._listed(name, prefix):
            if blob.temporary_hold:
                continue
            blob.temporary_hold = True
            self.call(f"hold gs://{name}/{blob.name}", blob.patch)
            held += 1
        return held

    def _update_policy(self, name: str, change: Callable[[Policy], bool]) -> bool:
        """Read the bucket's IAM policy, ``change`` it in place, write it back with its etag; again when another
        writer got in between. False when ``change`` had nothing to do."""
        from google.api_core import exceptions as gexc

        bucket = self.client.bucket(name)
        for attempt in range(1, self.retry.attempts + 1):
            policy = self.call(
                f"get IAM policy of {name}", lambda: bucket.get_iam_policy(requested_policy_version=IAM_POLICY_VERSION)
            )
            if not change(policy):
                return False
            try:
                self.call(f"set IAM policy of {name}", functools.partial(bucket.set_iam_policy, policy))
                return True
            except gexc.PreconditionFailed:
                if attempt == self.retry.attempts:
                    raise
                self.log(f"  IAM policy of gs://{name} changed meanwhile: reading it again")
        raise AssertionError("unreachable")

    def add_binding(self, name: str, role: str, who: str, condition: dict[str, str] | None = None) -> bool:
        """Grant ``who`` ``role`` on the bucket, under ``condition`` (an IAM condition: title, description,
        expression) when given; a policy with a conditional binding is written at version 3
        (https://cloud.google.com/iam/docs/policies#versions)."""

        def add(policy: Policy) -> bool:
            for binding in policy.bindings:
                if binding["role"] == role and binding.get("condition") == condition:
                    if who in binding["members"]:
                        return False
                    binding["members"] = set(binding["members"]) | {who}
                    return True
            policy.bindings.append({"role": role, "members": {who}, **({"condition": condition} if condition else {})})
            policy.version = IAM_POLICY_VERSION
            return True

        added = self._update_policy(name, add)
        self.log(f"{role} on gs://{name} for {who}: " + ("granted" if added else "already granted"))
        return added

    def remove_conditioned(self, name: str, titles: tuple[str, ...]) -> list[tuple[str, str]]:
        """Remove the bindings whose IAM condition has one of ``titles`` (a run's own: ``plan.target.binding_titles``),
        whoever they name; ``(role, member)`` of each member removed (none when the bucket is gone)."""
        from google.api_core import exceptions as gexc

        removed: list[tuple[str, str]] = []

        def remove(policy: Policy) -> bool:
            removed.clear()  # read again after a conflict: only what this write removes
            kept = []
            for binding in policy.bindings:
                if (binding.get("condition") or {}).get("title") in titles:
                    removed.extend((binding["role"], who) for who in sorted(binding["members"]))
                else:
                    kept.append(binding)
            policy.bindings[:] = kept
            return bool(removed)

        try:
            self._update_policy(name, remove)
        except gexc.NotFound:
            return []
        return removed


__all__ = ["Storage", "member", "storage_client"]
