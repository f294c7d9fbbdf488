"""An in-process Cloud Storage: the part of the JSON API (``/storage/v1``) that bucket provisioning uses (buckets.get,
buckets.insert, buckets.getIamPolicy, buckets.setIamPolicy, buckets.testIamPermissions) and the objects a run stages
(objects.insert by the multipart, media and resumable upload protocols under ``/upload/storage/v1``, objects.get of
metadata or of the data with ``alt=media`` or under ``/download/storage/v1``, objects.delete, objects.list by prefix,
delimiter and matchGlob in pages, the server-side copies objects.copy and objects.rewrite, and objects.compose),
served over plain HTTP by ``http.server``, so that the real ``google.cloud.storage.Client`` talks to it.

Where objects are kept: without ``root``, in memory (``state.objects`` holds each one's metadata and data). With
``root`` (a directory), a bucket's objects are files, ``root/<bucket>/<object name>`` (``bucket_dir(bucket)``), as
the pods that mount the bucket with Cloud Storage FUSE see them: each object a file, its name the file's path in the
mount (https://cloud.google.com/storage/docs/cloud-storage-fuse/overview). An object written through
the API is written as its file (the metadata Cloud Storage gives it staying in ``state.objects``); a file that a
writer outside the API (an emulated pod, through the kube emulator's mount) wrote, changed or deleted is that object,
a new generation of it, or its deletion: its metadata is made from the file (size, MD5 and CRC32C of its bytes,
``application/octet-stream``, a new generation whenever the file's inode, size or modification time changes, as
GCS FUSE writes a changed file back "as a new object generation":
https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/docs/semantics.md). Directories are no objects (GCS FUSE's
implicit directories have none). A deliberate limit: a name that cannot be such a file (an empty segment, ``.`` or
``..``, a trailing ``/``, a name under another object's name, or one that a directory holds) is refused with 400
there, where Cloud Storage would take it; a change that keeps a file's inode, size and modification time (two writes
of one length within the file system's timestamp tick) is not seen as a new generation.

A bucket carries the ``hierarchicalNamespace`` it was created with (``{"enabled": true}``, the bucket resource's
field: https://cloud.google.com/storage/docs/json_api/v1/buckets), set only by buckets.insert ("You cannot enable
hierarchical namespace in an existing bucket": https://cloud.google.com/storage/docs/create-hns-bucket), and only
with uniform bucket-level access (the same page: "for Access control, choose Uniform"); an insert asking for it
without uniform access is 400.

Requests are checked as Cloud Storage checks them: bucket names (3-63 characters of lowercase letters, digits,
``-``, ``_`` and ``.``, starting and ending with a letter or digit, no ``goog`` prefix), unknown body fields, the
project a bucket is created in, IAM roles and members (a workload identity ``principal://`` member must name its
project by number), and the policy etag a set is conditional on. A bucket is created in a project of ``projects``
(project id -> project number), whose number the bucket resource then carries; a project not there is 400
``Unknown project id`` (what Cloud Storage answers for a project id that does not exist). A new bucket starts with
Cloud Storage's default policy (the project's owners and editors as legacyBucketOwner, its viewers as
legacyBucketReader). As in Cloud Storage, the policy is bucket metadata: each set bumps the bucket's
metageneration, and the policy's etag encodes it ("CAE=" for a new bucket). A policy is answered at version 3 when
it has conditional bindings (which need ``optionsRequestedPolicyVersion=3``), else at version 1. Errors come back
in Google's JSON error shape, so the client raises the ``google.api_core.exceptions`` it raises against Cloud
Storage (NotFound, Conflict, BadRequest, PreconditionFailed, ...).

An object is stored with the metadata Cloud Storage gives it (generation, size, md5Hash, crc32c, etag, mediaLink,
...); an upload whose metadata carries a crc32c or md5Hash that the data does not have is refused (400), as are
``ifGenerationMatch``/``ifGenerationNotMatch`` preconditions that do not hold (412), and an upload into a bucket that
does not exist (404). A download carries the ``x-goog-hash``, ``x-goog-generation`` and
``x-goog-stored-content-length`` headers the client checks the data against, and honours a ``Range`` header. An object
stored with ``contentEncoding: gzip`` is served decompressed, its Range ignored, unless the request has
``Accept-Encoding: gzip`` or the object ``Cache-Control: no-transform`` (decompressive transcoding:
https://cloud.google.com/storage/docs/transcoding). ``state.downloads`` records each download's Range and
Accept-Encoding headers; ``cut(after)`` makes the next download break off after that many bytes of its body, the
connection closed, which the client must resume itself (https://cloud.google.com/storage/docs/downloads), and
``whole()`` answers the next ranged download with the whole object, as HTTP lets a server or proxy do.
A bucket created with a ``retentionPolicy`` (``retentionPeriod`` in seconds) refuses, with 403, to delete or
replace an object younger than that period, as it refuses it for an object under a hold; a metadata patch of such an
object is allowed and, like any patch, raises its metageneration (``_not_retained``, ``_patch_object``).
A request may name the object's generation (``generation``: "selects a specific revision of this object",
https://cloud.google.com/storage/docs/json_api/v1/objects/get); only the live one is kept (the emulator has no Object
Versioning, without which an object's live version is gone once it is replaced or deleted:
https://cloud.google.com/storage/docs/object-versioning), so any other generation is 404.

objects.list answers in pages (https://cloud.google.com/storage/docs/json_api/v1/objects/list): ``maxResults`` is the
"maximum combined number of entries in items[] and prefixes[]" of a page, and "the service uses this parameter or
1,000 items, whichever is smaller"; a page that is not the last carries ``nextPageToken``, which the next request
sends as ``pageToken`` (an opaque token here: where the last page stopped).

buckets.testIamPermissions (``GET .../b/BUCKET/iam/testPermissions?permissions=P&permissions=Q``,
https://cloud.google.com/storage/docs/json_api/v1/buckets/testIamPermissions) answers the permissions of those the
caller holds on the bucket: "Permissions are not required for using this method", and ``storage.buckets.list`` or
``storage.buckets.create`` (project permissions) "returns an error" (400). A bucket that does not exist is 404, as
Google's own Cloud Storage testbench answers it (it gets the bucket first:
https://github.com/googleapis/storage-testbench/blob/main/testbench/rest_server.py, ``bucket_test_iam_permissions``).

A copy (``POST .../o/SOURCE/copyTo/b/BUCKET/o/NAME``, https://cloud.google.com/storage/docs/json_api/v1/objects/copy) or
a rewrite (``.../rewriteTo/...``, https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite, answered done in
one call) writes the source's data as a new object (a new generation) at the destination, with the source's content
metadata (contentType, custom metadata, ...) unless the request body gives the destination's, which then replaces all of
it (``COPIED_FIELDS``; a rewrite's such body must give contentType, else 400): 404 for a source or a bucket that does
not exist; the source's generation may be named (``sourceGeneration``) and its preconditions are
``ifSourceGenerationMatch`` etc., the destination's ``ifGenerationMatch`` etc. A composition
(``POST .../o/NAME/compose``) writes its sources' data, in order, as a composite object: it has a CRC32C, a component
count and no MD5 (https://cloud.google.com/storage/docs/composite-objects), and so has a copy of it; its download's
``x-goog-hash`` is its CRC32C alone.

Faults are injected per method ("buckets.get", "buckets.insert", "buckets.getIamPolicy", "buckets.setIamPolicy",
"buckets.testIamPermissions", "objects.insert", "objects.get", "objects.delete", "objects.list", "objects.copy",
"objects.rewrite", "objects.compose", "objects.patch"): an HTTP error for the next N matching calls, before the call
takes effect (``fail``), or a lost reply, after it took effect (``lose``: the connection closed before any answer, one
of the "Socket timeouts and TCP disconnects" a client retries, https://cloud.google.com/storage/docs/retry-strategy).
Every request of an upload is an "objects.insert" (a resumable upload's start and each of its chunks); a download is an
"objects.get". ``meanwhile`` runs another writer's change just before the next matching call takes effect (a test's way
to put a concurrent writer between two of a client's requests).

Identities: a request authenticated by the emulator's ``token`` (the static token, or one the ``TokenIssuer`` minted:
the workstation user's Application Default Credentials) acts as the project's owner, and no IAM permission is checked
for it (it holds every permission testIamPermissions asks about). ``token_for(member)`` mints a bearer token that acts
as ``member`` instead (a ``user:``, ``serviceAccount:`` or ``principal://`` workload identity), as Workload Identity
Federation's token exchange hands one to a pod; ``token_for_pod(cluster, namespace, name, uid)`` one as GKE's pods of
that Kubernetes ServiceAccount are, which a binding naming any of their principal identifiers grants (``iam.workload``:
the ServiceAccount by name or by UID, its namespace, its cluster). Either is accepted whatever ``token`` is, and lives
as long as the emulator. Every request of such a member is authorized as Cloud Storage
authorizes it (https://cloud.google.com/storage/docs/access-control/iam-json): the method's permission
(``PERMISSIONS``), on the bucket or the object it checks it on (a copy's: ``storage.objects.get`` on the source and
``storage.objects.create`` on the destination), must be allowed by that bucket's IAM policy (``iam.py`` beside this
module: the roles' permissions, and IAM Conditions on ``resource.name`` and ``resource.type``); refused, it is 403 with
Cloud Storage's message (``google.api_core.exceptions.Forbidden``), before any injected fault. Overwriting an object (by
an upload or a copy) also needs ``storage.objects.delete`` on it; objects.list is checked on the bucket, so a binding
conditioned on an object prefix does not by itself allow listing; creating a bucket is a project permission, which no
member holds here (the emulator has no project or organization policy). A deliberate limit: conditions are evaluated for
a subset of CEL only (``resource.name``/``resource.type``, ``startsWith``, ``==``, ``!``, ``&&``, ``||``, parentheses),
and setIamPolicy refuses any other expression with 400 rather than guess what it would grant.

Pointing the client here: set ``STORAGE_EMULATOR_HOST`` to the endpoint ``start()`` returns (scheme included); the
client then sends the credentials it is given, or none at all (anonymous) when it is given none.
"""

from __future__ import annotations

import base64
import bisect
import copy
import gzip
import hashlib
import json
import os
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, quote, unquote, urlsplit

import google_crc32c

from tests.emulators import iam, take_fault
from tests.emulators.http import REASONS, Cut, Fault, HttpEmulator, HttpError, Lost
from tests.emulators.tokens import authorized

STORAGE_REASONS = {**REASONS, 409: "conflict"}
# the JSON API (buckets, their policies, objects' metadata), uploads, and downloads
PATH = re.compile(
    r"/storage/v1/b(?:/(?P<bucket>[^/]+)(?:(?P<iam>/iam(?P<test>/testPermissions)?)|(?P<list>/o)|/o/(?P<object>.+))?)?"
)
UPLOAD_PATH = re.compile(r"/upload/storage/v1/b/(?P<bucket>[^/]+)/o")
DOWNLOAD_PATH = re.compile(r"/download/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>.+)")
# a server-side copy: the source and the destination, each name URL-encoded ("/" as %2F)
COPY_PATH = re.compile(
    r"/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>[^/]+)/(?P<verb>copyTo|rewriteTo)"
    r"/b/(?P<destination_bucket>[^/]+)/o/(?P<destination_object>[^/]+)"
)
# a composition (https://cloud.google.com/storage/docs/json_api/v1/objects/compose): the destination, its name
# URL-encoded
COMPOSE_PATH = re.compile(r"/storage/v1/b/(?P<bucket>[^/]+)/o/(?P<object>[^/]+)/compose")
ROUTES = {
    ("POST", "buckets"): "buckets.insert",
    ("GET", "bucket"): "buckets.get",
    ("GET", "iam"): "buckets.getIamPolicy",
    ("PUT", "iam"): "buckets.setIamPolicy",
    ("GET", "testPermissions"): "buckets.testIamPermissions",
    ("GET", "object"): "objects.get",
    ("DELETE", "object"): "objects.delete",
    ("PATCH", "object"): "objects.patch",
    ("GET", "objects"): "objects.list",
    ("POST", "upload"): "objects.insert",
    ("PUT", "upload"): "objects.insert",
    ("GET", "download"): "objects.get",
    ("POST", "copyTo"): "objects.copy",
    ("POST", "rewriteTo"): "objects.rewrite",
    ("POST", "compose"): "objects.compose",
}
BUCKET_NAME = re.compile(r"[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]")
# the bucket resource's fields; output-only ones are accepted in an insert and overwritten
BUCKET_FIELDS = {
    "kind",
    "id",
    "selfLink",
    "name",
    "projectNumber",
    "metageneration",
    "etag",
    "timeCreated",
    "updated",
    "location",
    "locationType",
    "storageClass",
    "labels",
    "iamConfiguration",
    "versioning",
    "lifecycle",
    "cors",
    "logging",
    "website",
    "encryption",
    "billing",
    "retentionPolicy",
    "defaultEventBasedHold",
    "autoclass",
    "hierarchicalNamespace",
    "softDeletePolicy",
    "customPlacementConfig",
    "rpo",
    "acl",
    "defaultObjectAcl",
    "objectRetention",
    "ipFilter",
    "owner",
}
POLICY_FIELDS = {"kind", "resourceId", "version", "etag", "bindings"}
# the object resource's fields; output-only ones are accepted in an upload's metadata and overwritten
OBJECT_FIELDS = {
    "kind",
    "id",
    "selfLink",
    "mediaLink",
    "name",
    "bucket",
    "generation",
    "metageneration",
    "contentType",
    "storageClass",
    "size",
    "md5Hash",
    "crc32c",
    "etag",
    "timeCreated",
    "updated",
    "timeFinalized",
    "timeStorageClassUpdated",
    "cacheControl",
    "contentDisposition",
    "contentEncoding",
    "contentLanguage",
    "metadata",
    "customTime",
    "retention",
    "contexts",
    "acl",
    "owner",
    "eventBasedHold",
    "temporaryHold",
    "kmsKeyName",
    "customerEncryption",
    "componentCount",
}
CONTENT_RANGE = re.compile(r"bytes (?:(?P<first>\d+)-(?P<last>\d+)|\*)/(?:(?P<total>\d+)|\*)")
RANGE = re.compile(r"bytes=(?P<first>\d*)-(?P<last>\d*)")
MULTI_REGIONS = {"US", "EU", "ASIA"}
ROLE = re.compile(r"(?:roles|(?:projects|organizations)/[^/]+/roles)/[\w.]+")
MEMBER = re.compile(
    r"(?:deleted:)?(?:user|serviceAccount|group):[^@\s]+@\S+|domain:\S+"
    r"|project(?:Owner|Editor|Viewer):\S+|allUsers|allAuthenticatedUsers"
    r"|principal(?:Set)?://iam\.googleapis\.com/\S+"
)
# the members a token can act as: one principal (not a group, domain, set or convenience value)
IDENTITY = re.compile(r"(?:user|serviceAccount):[^@\s]+@\S+|principal://iam\.googleapis\.com/\S+")
# each method: the permissions Cloud Storage checks, each with the resource it checks it on: the project, the
# request's bucket, its object, or a copy's destination object
# (https://cloud.google.com/storage/docs/access-control/iam-json); every request of an upload is an objects.insert
COPY_PERMISSIONS = (("storage.objects.get", "object"), ("storage.objects.create", "destination"))
PERMISSIONS = {
    "buckets.insert": (("storage.buckets.create", "project"),),
    "buckets.get": (("storage.buckets.get", "bucket"),),
    "buckets.getIamPolicy": (("storage.buckets.getIamPolicy", "bucket"),),
    "buckets.setIamPolicy": (("storage.buckets.setIamPolicy", "bucket"),),
    "buckets.testIamPermissions": (),  # "Permissions are not required for using this method"
    "objects.insert": (("storage.objects.create", "object"),),
    "objects.get": (("storage.objects.get", "object"),),
    "objects.delete": (("storage.objects.delete", "object"),),
    # a change of an object's metadata, its holds included (https://cloud.google.com/storage/docs/holding-objects,
    # "Required roles": storage.objects.update)
    "objects.patch": (("storage.objects.update", "object"),),
    "objects.list": (("storage.objects.list", "bucket"),),
    "objects.copy": COPY_PERMISSIONS,
    "objects.rewrite": COPY_PERMISSIONS,
    # and storage.objects.get on each source (``_authorize``)
    "objects.compose": (("storage.objects.create", "object"),),
}
# overwriting an object needs its deletion too (https://cloud.google.com/storage/docs/access-control/iam-permissions)
OVERWRITE_PERMISSION = "storage.objects.delete"
# the methods that write an object: which of the request's resources they write
WRITES = {
    "objects.insert": "object",
    "objects.copy": "destination",
    "objects.rewrite": "destination",
    "objects.compose": "object",
}
# how a refusal names the kind of resource
RESOURCE_NOUNS = {
    "project": "Google Cloud project",
    "bucket": "Google Cloud Storage bucket",
    "object": "Google Cloud Storage object",
    "destination": "Google Cloud Storage object",
}
# the object metadata a copy or rewrite gives the destination: the source's, unless the request body (an object
# resource: "Optionally overrides metadata", https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite; "supply
# metadata to apply to the destination object", https://cloud.google.com/storage/docs/json_api/v1/objects/copy) gives
# any of it, which then replaces all of it: the body's fields are the destination's and the source's others are not
# carried ("supplying a StorageObject content it is going to be used for blob's metadata overriding values", content
# type included: https://github.com/googleapis/google-cloud-java/issues/306). A body of the name alone (what
# google-cloud-storage's ``Blob.rewrite`` posts for a new ``Blob``) overrides nothing. A body may name the storage class
# too. (Google's storage-testbench patches a body onto the source's metadata instead, ``objects_rewrite`` in
# testbench/rest_server.py at v0.63.0: a rewrite that relied on it would lose the source's content type on the
# service.) A rewrite's such body without a contentType is refused (``_copy_object``).
COPIED_FIELDS = (
    "contentType",
    "contentEncoding",
    "contentLanguage",
    "contentDisposition",
    "cacheControl",
    "metadata",
    "customTime",
)
# a copy's or rewrite's preconditions on its source, as the preconditions of a request for the source itself: the
# request fails with 412 Precondition Failed unless the source's live generation matches ifSourceGenerationMatch
# (the query parameters of https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite and /copy;
# https://cloud.google.com/storage/docs/request-preconditions, "Precondition criteria": 412 on a mismatch)
SOURCE_QUERY = {
    "sourceGeneration": "generation",
    "ifSourceGenerationMatch": "ifGenerationMatch",
    "ifSourceGenerationNotMatch": "ifGenerationNotMatch",
    "ifSourceMetagenerationMatch": "ifMetagenerationMatch",
    "ifSourceMetagenerationNotMatch": "ifMetagenerationNotMatch",
}
# objects.list's page size: "the service uses this parameter or 1,000 items, whichever is smaller"
# (https://cloud.google.com/storage/docs/json_api/v1/objects/list, maxResults)
LIST_PAGE = 1000
# the permissions testIamPermissions refuses to test on a bucket: they "apply to projects instead of buckets"
# (https://cloud.google.com/storage/docs/json_api/v1/buckets/testIamPermissions)
PROJECT_PERMISSIONS = ("storage.buckets.list", "storage.buckets.create")
DESTINATION_QUERY = ("ifGenerationMatch", "ifGenerationNotMatch", "ifMetagenerationMatch", "ifMetagenerationNotMatch")
POOL_MEMBER = re.compile(
    r"principal(?:Set)?://iam\.googleapis\.com/projects/(?P<project>[^/]+)/locations/global/"
    r"workloadIdentityPools/.+"
)


@dataclass
class Cutting:
    """A download fault (``StorageEmulator.cut``): the next ``times`` media downloads matching ``when`` send ``after``
    bytes of their body, then close the connection."""

    method: str
    after: int
    times: int
    when: Callable[[dict], bool]


@dataclass
class Meanwhile:
    """Another writer's ``change``, run just before the next ``times`` calls of ``method`` matching ``when`` take effect
    (``StorageEmulator.meanwhile``)."""

    method: str
    change: Callable[[], None]
    times: int
    when: Callable[[dict], bool]


@dataclass
class State:
    buckets: dict[str, dict] = field(default_factory=dict)  # bucket name -> bucket resource JSON
    policies: dict[str, dict] = field(default_factory=dict)  # bucket name -> {"version": V, "bindings": [...]}
    owners: dict[str, str] = field(default_factory=dict)  # bucket name -> project id it was created in
    # (bucket, object name) -> {"metadata": the object resource JSON, and "data": bytes (in memory) or "file": the
    # stat signature its file had when the metadata was made (with ``root``)}
    objects: dict[tuple[str, str], dict] = field(default_factory=dict)
    # resumable upload id -> {"bucket", "metadata", "query" (the start's), "content_type", "total" (None: not yet
    # known), "data" (received so far), and once finished "object" (the resource it created)}
    uploads: dict[str, dict] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)  # method names ("buckets.get", ...), in order
    # each media download: (bucket, object name, its Range header or "", its Accept-Encoding header or ""), in order
    downloads: list[tuple[str, str, str, str]] = field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _etag(*numbers: int) -> str:
    """Cloud Storage's etag: the numbers as protobuf varint fields 1, 2, ..., in base64 (a bucket's is its
    metageneration; an object's its generation and metageneration)."""
    data = bytearray()
    for number, n in enumerate(numbers, 1):
        data.append(number << 3)
        while n > 0x7F:
            data.append(n & 0x7F | 0x80)
            n >>= 7
        data.append(n)
    return base64.b64encode(bytes(data)).decode()


def _hashes(data: bytes) -> tuple[str, str]:
    """The data's MD5 and CRC32C (big-endian), in base64, as Cloud Storage gives them."""
    crc32c = google_crc32c.value(data).to_bytes(4, "big")
    return base64.b64encode(hashlib.md5(data).digest()).decode(), base64.b64encode(crc32c).decode()


class _InMemory:
    """Objects kept in memory: ``objects`` (``State.objects``) holds each one's metadata and data."""

    def __init__(self, objects: dict[tuple[str, str], dict]):
        self.objects = objects

    def add_bucket(self, bucket: str) -> None:
        pass

    def check(self, bucket: str, name: str) -> None:
        pass  # every valid object name can be stored

    def get(self, bucket: str, name: str) -> dict | None:
        return self.objects.get((bucket, name))

    def read(self, bucket: str, name: str, stored: dict) -> bytes:
        return stored["data"]

    def write(self, bucket: str, name: str, resource: dict, data: bytes) -> None:
        self.objects[(bucket, name)] = {"metadata": resource, "data": bytes(data)}

    def delete(self, bucket: str, name: str) -> None:
        del self.objects[(bucket, name)]

    def names(self, bucket: str, prefix: str) -> list[str]:
        return sorted(n for b, n in self.objects if b == bucket and n.startswith(prefix))


class _InFiles:
    """Objects kept as files, ``root/<bucket>/<name>``: ``objects`` (``State.objects``) holds the metadata of each
    one and the stat signature its file had then; a file with no metadata, or whose signature changed, gets new
    metadata from ``made(bucket, name, data)`` (a new generation); an entry whose file is gone is dropped."""

    def __init__(self, root: Path, objects: dict[tuple[str, str], dict], made: Callable[[str, str, bytes], dict]):
        self.root = Path(root)
        self.objects = objects
        self.made = made

    def directory(self, bucket: str) -> Path:
        return self.root / bucket

    def add_bucket(self, bucket: str) -> None:
        self.directory(bucket).mkdir(parents=True, exist_ok=True)

    def _path(self, bucket: str, name: str) -> Path | None:
        """The object's file, or None when no file can hold an object of that name."""
        parts = name.split("/")
        if any(part in ("", ".", "..") for part in parts) or "\0" in name:
            return None
        return self.directory(bucket).joinpath(*parts)

    def check(self, bucket: str, name: str) -> None:
        path = self._path(bucket, name)
        top = self.directory(bucket)
        if path is None or path.is_dir() or any(p.is_file() for p in path.parents if p.is_relative_to(top)):
            raise HttpError(
                400,
                f"The emulator keeps the bucket's objects as files (as a Cloud Storage FUSE mount shows them), and "
                f"no file can hold an object named {name!r}.",
            )

    @staticmethod
    def _signature(path: Path) -> tuple[int, int, int] | None:
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns) if path.is_file() else None

    def get(self, bucket: str, name: str) -> dict | None:
        path = self._path(bucket, name)
        signature = self._signature(path) if path else None
        if signature is None:
            self.objects.pop((bucket, name), None)  # never stored, or its file was deleted
            return None
        stored = self.objects.get((bucket, name))
        if stored is None or stored["file"] != signature:  # written, or rewritten, outside the API
            try:
                data = path.read_bytes()  # read after the stat: a change while reading is seen next time
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self.objects.pop((bucket, name), None)
                return None
            stored = self.objects[(bucket, name)] = {"metadata": self.made(bucket, name, data), "file": signature}
        return stored

    def read(self, bucket: str, name: str, stored: dict) -> bytes:
        try:
            return self._path(bucket, name).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise HttpError(404, f"No such object: {bucket}/{name}") from None

    def write(self, bucket: str, name: str, resource: dict, data: bytes) -> None:
        path = self._path(bucket, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.objects[(bucket, name)] = {"metadata": resource, "file": self._signature(path)}

    def delete(self, bucket: str, name: str) -> None:
        self._path(bucket, name).unlink(missing_ok=True)
        self.objects.pop((bucket, name), None)

    def names(self, bucket: str, prefix: str) -> list[str]:
        """The names of the bucket's files that start with ``prefix`` (directories are no objects), sorted; entries
        whose file is gone are dropped."""
        top, directories = self.directory(bucket), prefix.split("/")[:-1]
        if any(part in ("", ".", "..") for part in directories):
            return []  # no file's name starts so
        start = top.joinpath(*directories)  # the deepest directory every such name is under
        found = set()
        for directory, _, files in os.walk(start):
            for file in files:
                name = (Path(directory) / file).relative_to(top).as_posix()
                if name.startswith(prefix) and (Path(directory) / file).is_file():
                    found.add(name)
        for b, name in list(self.objects):
            if b == bucket and name.startswith(prefix) and name not in found:
                del self.objects[(b, name)]
        return sorted(found)


class StorageEmulator(HttpEmulator):
    """The service; ``start()`` serves it on 127.0.0.1 over plain HTTP and returns the endpoint. With ``root``, each
    bucket's objects are the files under ``bucket_dir(bucket)`` (``root/<bucket>``); without it, they are kept in
    memory."""

    def __init__(self, projects: dict[str, str], token: str = "", root: Path | str | None = None):
        super().__init__()
        self.projects = projects  # project id -> project number (a string of digits)
        self.token = token  # when set, requests must carry "Authorization: Bearer <token>"
        self.authorizations: list[str | None] = []  # each request's Authorization header (None: none)
        self.state = State()
        self.faults: list[Fault] = []
        self.cuts: list[Cutting] = []  # downloads that break off (``cut``)
        self.changes: list[Meanwhile] = []  # other writers' changes, made before a call (``meanwhile``)
        self._lock = threading.RLock()
        self._generation = 0
        self.root = Path(root) if root else None
        self._objects = (
            _InFiles(self.root, self.state.objects, self._made_from_file)
            if self.root
            else _InMemory(self.state.objects)
        )
        self._identities: dict[str, str] = {}  # access token -> the member it acts as (token_for)
        # Buckets of another project -> the member the project's own credentials are there (``foreign``).
        self._foreign: dict[str, str] = {}

    # ------------------------------------------------------------------ faults and inspection
    def fail(
        self,
        method: str,
        status: int,
        reason: str = "",
        message: str = "",
        times: int = 1,
        when: Callable[[dict], bool] = lambda request: True,
    ) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` answer HTTP ``status``. ``when`` gets
        ``{"bucket": name, "query": {...}, "body": {...}}`` (an insert's bucket name is the body's); for an objects
        method also ``"object"``: the object's name (an upload's body is the object metadata it carries); for a copy
        or a rewrite, the source's, and ``"destination"``: ``{"bucket", "object"}``."""
        self.faults.append(
            Fault(
                method,
                status,
                reason or STORAGE_REASONS.get(status, "error"),
                message or f"Injected HTTP {status} for {method}.",
                times,
                when,
            )
        )

    def lose(self, method: str, times: int = 1, when: Callable[[dict], bool] = lambda request: True) -> None:
        """The next ``times`` calls of ``method`` matching ``when`` (as ``fail`` gives it) take effect, and their
        reply is lost: the connection is closed before any answer (``http.Lost``), so the client sees a dropped
        connection and cannot tell whether the request took effect."""
        self.faults.append(Fault(method, None, "", "", times, when, lost=True))

    def meanwhile(
        self, method: str, change: Callable[[], None], times: int = 1, when: Callable[[dict], bool] = lambda r: True
    ) -> None:
        """``change()`` (another writer's: ``put``, say) runs just before the next ``times`` calls of ``method``
        matching ``when`` (as ``fail`` gives it) take effect."""
        self.changes.append(Meanwhile(method, change, times, when))

    def cut(self, after: int, times: int = 1, when: Callable[[dict], bool] = lambda request: True) -> None:
        """The next ``times`` media downloads matching ``when`` (``{"bucket", "object", "query"}``) break off: their
        headers and ``after`` bytes of their body are sent, then the connection is closed. A client must resume such
        a download itself, asking for the rest with a ``Range`` header ("Using this basic download behavior, you can
        resume interrupted downloads": https://cloud.google.com/storage/docs/downloads)."""
        self.cuts.append(Cutting("objects.get", after, times, when))

    def whole(self, times: int = 1, when: Callable[[dict], bool] = lambda request: True) -> None:
        """The next ``times`` media downloads with a ``Range`` that match ``when`` are answered 200 with the whole
        object, the Range ignored, as any server or proxy on the way may answer ("A server MAY ignore the Range
        header field": RFC 9110, section 14.2, https://www.rfc-editor.org/rfc/rfc9110#section-14.2), and as Cloud
        Storage itself answers for an object it serves decompressed (https://cloud.google.com/storage/docs/
        transcoding#range)."""
        self.cuts.append(Cutting("objects.get whole", 0, times, when))

    def foreign(self, bucket: str, caller: str) -> None:
        """Make ``bucket`` (created already) another project's: the project's own credentials, which own its buckets,
        are there only ``caller`` (``user:...``, ``serviceAccount:...``), holding what the bucket's policy grants that
        member. A project's owners hold roles on its own buckets through the default policy's convenience values
        (projectOwner, projectEditor, projectViewer), and none on another project's
        (https://cloud.google.com/storage/docs/access-control/iam#convenience-values)."""
        if not IDENTITY.fullmatch(caller):
            raise ValueError(f"{caller!r} is not a principal")
        with self._lock:
            self._foreign[bucket] = caller

    def token_for(self, member: str) -> str:
        """A bearer token that acts as ``member`` (``principal://iam.googleapis.com/projects/NUMBER/locations/global/
        workloadIdentityPools/PROJECT.svc.id.goog/subject/ns/NAMESPACE/sa/KSA`` for a pod's Kubernetes
        ServiceAccount, ``serviceAccount:...`` or ``user:...``): its requests are authorized by the buckets' IAM
        policies."""
        pool = POOL_MEMBER.fullmatch(member)
        if not IDENTITY.fullmatch(member) or (pool and not pool["project"].isdigit()):
            raise ValueError(f"{member!r} is not a principal a token can act as")
        token = f"ya29.emulated-member-{secrets.token_hex(12)}"
        with self._lock:
            self._identities[token] = member
        return token

    def token_for_pod(self, cluster: str, namespace: str, name: str, uid: str) -> str:
        """A bearer token as Workload Identity Federation for GKE hands the pods of cluster ``cluster``
        (``projects/P/locations/L/clusters/C``, P a project of the emulator) that run as the Kubernetes ServiceAccount
        ``namespace/name`` whose UID is ``uid``: a binding grants it when it names any identifier IAM knows those pods
        by (``iam.workload``), the ServiceAccount by name (in any cluster of the project's pool) or by UID, its
        namespace or its cluster."""
        project = cluster.split("/")[1]
        identity = iam.workload(self.projects[project], project, cluster, namespace, name, uid)
        token = f"ya29.emulated-pod-{secrets.token_hex(12)}"
        with self._lock:
            self._identities[token] = identity
        return token

    def members(self, bucket: str, role: str) -> list[str]:
        """The members ``bucket``'s policy grants ``role`` (in any binding), sorted."""
        with self._lock:
            bindings = self.state.policies.get(bucket, {}).get("bindings", [])
            return sorted({m for b in bindings if b["role"] == role for m in b["members"]})

    def object(self, bucket: str, name: str) -> dict | None:
        """A copy of the stored object's resource JSON (its metadata), or None when there is no such object."""
        with self._lock:
            stored = self._objects.get(bucket, name)
            return copy.deepcopy(stored["metadata"]) if stored else None

    def put(
        self,
        bucket: str,
        name: str,
        data: bytes,
        content_type: str | None = "application/octet-stream",
        **metadata: str,
    ) -> None:
        """Store an object as a writer outside the JSON API would (Vertex's Cloud Storage FUSE mount); ``metadata``:
        more of its resource's fields (``contentEncoding="gzip"``, say). ``content_type`` None: stored without one
        ("If an object is stored without a Content-Type, it is served as application/octet-stream": the object
        resource's contentType, https://cloud.google.com/storage/docs/json_api/v1/objects#resource)."""
        with self._lock:
            if bucket not in self.state.buckets:
                raise KeyError(f"no bucket {bucket}")
            self._store(bucket, {"name": name, **metadata}, data, content_type, {})

    def remove(self, bucket: str, name: str) -> None:
        """Delete an object as another writer would (its own copy undone, say)."""
        with self._lock:
            self._objects.delete(bucket, name)

    def data(self, bucket: str, name: str) -> bytes | None:
        """The object's data (with ``root``: its file's bytes), or None when there is no such object."""
        with self._lock:
            stored = self._objects.get(bucket, name)
            return bytes(self._objects.read(bucket, name, stored)) if stored else None

    def objects_of(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """The data of the bucket's objects whose names start with ``prefix``, by name (sorted)."""
        with self._lock:
            return {name: self.data(bucket, name) for name in self._objects.names(bucket, prefix)}

    def bucket_dir(self, bucket: str) -> Path:
        """The directory whose files are ``bucket``'s objects (``root/<bucket>``; it need not exist yet). What the
        pods that mount the bucket reach through the mount (tests/emulators/kube/kubelet.py)."""
        if self.root is None:
            raise ValueError("this storage emulator keeps objects in memory: it was started without a root")
        return self._objects.directory(bucket)

    # ------------------------------------------------------------------ serving
    def _route(self, command: str, path: str) -> tuple[str, str, str, dict]:
        """The method a request calls, the names (unquoted) of the bucket and object it is for ("" where none), and a
        copy's destination (``{"bucket", "object"}``; empty for any other method)."""
        m = COPY_PATH.fullmatch(path)
        method = ROUTES.get((command, m["verb"])) if m else None
        if method:
            destination = {"bucket": unquote(m["destination_bucket"]), "object": unquote(m["destination_object"])}
            return method, unquote(m["bucket"]), unquote(m["object"]), destination
        m = COMPOSE_PATH.fullmatch(path)
        if m and command == "POST":
            return ROUTES[(command, "compose")], unquote(m["bucket"]), unquote(m["object"]), {}
        for kind, pattern in (("upload", UPLOAD_PATH), ("download", DOWNLOAD_PATH), ("", PATH)):
            m = pattern.fullmatch(path)
            if not m:
                continue
            groups = m.groupdict()
            kind = kind or (
                "object"
                if groups["object"]
                else "testPermissions"
                if groups.get("test")
                else "iam"
                if groups["iam"]
                else "objects"
                if groups.get("list")
                else "bucket"
                if groups["bucket"]
                else "buckets"
            )
            method = ROUTES.get((command, kind))
            if method:
                return method, unquote(groups["bucket"] or ""), unquote(groups.get("object") or ""), {}
        raise HttpError(404, f"The emulator does not serve {command} {path}.")

    def _serve(self, http: BaseHTTPRequestHandler, raw: bytes) -> tuple[int, dict | bytes | Cut | None, dict]:
        url = urlsplit(http.path)
        method, bucket, name, destination = self._route(http.command, url.path)
        auth = http.headers.get("Authorization")
        with self._lock:
            self.state.calls.append(method)
            self.authorizations.append(auth)
            member = self._identities.get((auth or "").removeprefix("Bearer "))  # None: the owner, or no one
        if member is None and self.token and not authorized(self.token, auth):
            permission = "storage." + method.replace("insert", "create")
            kind = method.split(".")[0][:-1]
            raise HttpError(
                401,
                "Invalid Credentials"
                if auth
                else f"Anonymous caller does not have {permission} access to the Google Cloud Storage {kind}.",
                "authError" if auth else "required",
            )
        query = dict(parse_qsl(url.query))
        upload = None
        if method.startswith("buckets."):
            body = _json(raw) if http.command in ("POST", "PUT") else {}
            request = {"bucket": bucket or str(body.get("name", "")), "query": query, "body": body}
        elif method == "objects.insert":
            upload = self._upload(http, query, raw)
            name = upload["metadata"].get("name") or upload["query"].get("name", "")
            request = {"bucket": bucket, "object": name, "query": query, "body": upload["metadata"]}
        elif destination:
            request = {"bucket": bucket, "object": name, "destination": destination, "query": query, "body": _json(raw)}
        else:
            body = _json(raw) if method in ("objects.patch", "objects.compose") else {}
            request = {"bucket": bucket, "object": name, "query": query, "body": body}
        if member is None and request.get("bucket") in self._foreign:
            member = self._foreign[request["bucket"]]
        if member is not None:
            self._authorize(member, method, request)
        change = take_fault(self.changes, self._lock, method, request)
        if change is not None:
            change.change()
        fault = take_fault(self.faults, self._lock, method, request)
        if fault and not fault.lost:
            raise HttpError(fault.status, fault.message, fault.reason)
        with self._lock:  # serialised under the lock: the answer may be a stored resource
            answer = self._answer(http, method, request, upload, member)
        return (0, Lost(), {}) if fault else answer  # a lost reply (``lose``): the request took effect

    def _answer(
        self, http: BaseHTTPRequestHandler, method: str, request: dict, upload: dict | None, member: str | None
    ) -> tuple[int, dict | bytes | Cut | None, dict]:
        """What the request does, and its answer (under the lock)."""
        bucket, name, query = request["bucket"], request.get("object", ""), request["query"]
        url = urlsplit(http.path)
        if upload is not None:
            return self._insert_object(http, bucket, upload)
        if method == "objects.get":
            media = url.path.startswith("/download/") or query.get("alt") == "media"
            return self._get_object(http, bucket, name, query, media)
        if method == "objects.delete":
            return self._delete_object(bucket, name, query)
        if method == "objects.patch":
            return 200, self._patch_object(bucket, name, query, request["body"]), {}
        if method == "objects.list":
            return 200, self._list_objects(bucket, query), {}
        if method == "objects.compose":
            return 200, self._compose_object(bucket, name, query, request["body"]), {}
        if "destination" in request:
            return 200, self._copy_object(method, bucket, name, request["destination"], query, request["body"]), {}
        if method == "buckets.testIamPermissions":
            return 200, self._test_permissions(bucket, parse_qs(url.query).get("permissions", []), member), {}
        return 200, copy.deepcopy(getattr(self, "_" + method.split(".")[1])(**request)), {}

    def _authorize(self, member: str, method: str, request: dict) -> None:
        """403 unless the buckets' policies allow ``member`` what ``method`` needs, on each resource it is checked
        on: its ``resource.name`` and ``resource.type`` as Cloud Storage gives them to conditions
        (https://cloud.google.com/iam/docs/conditions-resource-attributes)."""
        destination = request.get("destination") or {}
        # each kind of resource: (its bucket, its object name) (None for the project: the emulator holds no project
        # policy, so nothing is granted there; "" for the bucket itself)
        where = {
            "project": None,
            "bucket": (request["bucket"], ""),
            "object": (request["bucket"], request.get("object", "")),
            "destination": (destination.get("bucket", ""), destination.get("object", "")),
        }
        with self._lock:
            checks = list(PERMISSIONS[method])
            written = WRITES.get(method)
            if written and self._objects.get(*where[written]) is not None:
                checks.append((OVERWRITE_PERMISSION, written))
            targets = [(needed, kind, where[kind]) for needed, kind in checks]
            if method == "objects.compose":  # each source is read
                sources = request["body"].get("sourceObjects")
                targets += [
                    ("storage.objects.get", "object", (request["bucket"], str(source.get("name", ""))))
                    for source in (sources if isinstance(sources, list) else [])
                    if isinstance(source, dict)
                ]
            for needed, kind, target in targets:
                allowed = target is not None and iam.allows(
                    self.state.policies.get(target[0], {}).get("bindings", []), member, needed, _attributes(*target)
                )
                if not allowed:
                    raise HttpError(
                        403,
                        f"{member} does not have {needed} access to the {RESOURCE_NOUNS[kind]}. "
                        f"Permission '{needed}' denied on resource (or it may not exist).",
                    )

    # ------------------------------------------------------------------ buckets
    def _bucket(self, bucket: str) -> dict:
        if bucket not in self.state.buckets:
            raise HttpError(404, "The specified bucket does not exist.")
        return self.state.buckets[bucket]

    def _get(self, bucket: str, query: dict, body: dict) -> dict:
        return self._bucket(bucket)

    def _insert(self, bucket: str, query: dict, body: dict) -> dict:
        project = query.get("project")
        if not project:
            raise HttpError(400, "Required parameter: project", "required")
        unknown = sorted(set(body) - BUCKET_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        if not BUCKET_NAME.fullmatch(bucket) or bucket.startswith("goog") or ".." in bucket:
            raise HttpError(400, f"Invalid bucket name: '{bucket}'")
        if project not in self.projects:
            raise HttpError(400, f"Unknown project id: {project}")
        if bucket in self.state.buckets:
            raise HttpError(
                409,
                "Your previous request to create the named bucket succeeded and you already own it."
                if self.state.owners[bucket] == project
                else "The requested bucket name is not available. "
                "The bucket namespace is shared by all users of the system. Please select a different "
                "name and try again.",
                "conflict",
            )
        now, number = _now(), self.projects[project]
        location = str(body.get("location", "US")).upper()
        iam = body.get("iamConfiguration", {})
        ubla = bool(iam.get("uniformBucketLevelAccess", iam.get("bucketPolicyOnly", {})).get("enabled"))
        hns = body.get("hierarchicalNamespace", {})
        if hns.get("enabled") and not ubla:
            # A bucket with hierarchical namespace takes uniform bucket-level access only ("Access control, choose
            # Uniform": https://cloud.google.com/storage/docs/create-hns-bucket)
            raise HttpError(
                400, "Hierarchical namespace requires uniform bucket-level access to be enabled.", "invalid"
            )
        access = {"enabled": ubla}
        if ubla:
            locked = datetime.now(UTC) + timedelta(days=90)
            access["lockedTime"] = locked.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.state.buckets[bucket] = {
            **body,
            "kind": "storage#bucket",
            "selfLink": f"https://www.googleapis.com/storage/v1/b/{bucket}",
            "id": bucket,
            "name": bucket,
            "projectNumber": number,
            "metageneration": "1",
            "location": location,
            "locationType": "multi-region" if location in MULTI_REGIONS else "region",
            "storageClass": body.get("storageClass", "STANDARD"),
            "timeCreated": now,
            "updated": now,
            "iamConfiguration": {
                "bucketPolicyOnly": access,
                "uniformBucketLevelAccess": access,
                "publicAccessPrevention": iam.get("publicAccessPrevention", "inherited"),
            },
            "rpo": body.get("rpo", "DEFAULT"),
            "etag": _etag(1),
        }
        if "retentionPolicy" in body:  # in force from now, unlocked (``buckets.lockRetentionPolicy`` locks it)
            period = str(body["retentionPolicy"].get("retentionPeriod", "0"))
            self.state.buckets[bucket]["retentionPolicy"] = {"retentionPeriod": period, "effectiveTime": now}
        self.state.owners[bucket] = project
        self._objects.add_bucket(bucket)
        self.state.policies[bucket] = {
            "version": 1,
            "bindings": [
                {
                    "role": "roles/storage.legacyBucketOwner",
                    "members": [f"projectEditor:{project}", f"projectOwner:{project}"],
                },
                {"role": "roles/storage.legacyBucketReader", "members": [f"projectViewer:{project}"]},
            ],
        }
        return self.state.buckets[bucket]

    # ------------------------------------------------------------------ IAM
    def _policy(self, bucket: str) -> dict:
        policy = self.state.policies[bucket]
        return {
            "kind": "storage#policy",
            "resourceId": f"projects/_/buckets/{bucket}",
            "version": policy["version"],
            "etag": self._bucket(bucket)["etag"],
            "bindings": copy.deepcopy(policy["bindings"]),
        }

    def _getIamPolicy(self, bucket: str, query: dict, body: dict) -> dict:
        self._bucket(bucket)
        requested = query.get("optionsRequestedPolicyVersion", "1")
        if requested not in ("1", "2", "3"):
            raise HttpError(400, f"Invalid argument: optionsRequestedPolicyVersion '{requested}'.")
        if self.state.policies[bucket]["version"] > int(requested):
            raise HttpError(
                400, "The policy has conditional role bindings: request it with optionsRequestedPolicyVersion=3."
            )
        return self._policy(bucket)

    def _setIamPolicy(self, bucket: str, query: dict, body: dict) -> dict:
        resource = self._bucket(bucket)
        unknown = sorted(set(body) - POLICY_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        if "etag" in body and body["etag"] != resource["etag"]:
            raise HttpError(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")
        bindings = body.get("bindings") or []
        if not isinstance(bindings, list) or not all(isinstance(b, dict) for b in bindings):
            raise HttpError(400, "Invalid JSON payload received. Invalid value at 'bindings'.")
        conditional = any(b.get("condition") for b in bindings)
        if conditional and body.get("version") != 3:
            raise HttpError(400, "Conditional role bindings need a policy of version 3.")
        # "You must enable uniform bucket-level access on a bucket" to add IAM Conditions to it
        # (https://cloud.google.com/storage/docs/access-control/iam#conditions).
        if conditional and not resource["iamConfiguration"]["uniformBucketLevelAccess"]["enabled"]:
            raise HttpError(400, "IAM Conditions require uniform bucket-level access on the bucket.")
        for binding in bindings:
            role, members = binding.get("role", ""), binding.get("members")
            if not isinstance(role, str) or not ROLE.fullmatch(role):
                raise HttpError(400, f"Role ({role}) does not exist in the resource's hierarchy.")
            if not isinstance(members, list) or not members:
                raise HttpError(400, f"Invalid argument: the binding of role {role} has no members.")
            condition = binding.get("condition")
            if condition:
                try:
                    iam.condition(condition.get("expression") if isinstance(condition, dict) else None)
                except iam.UnsupportedCondition as e:
                    raise HttpError(
                        400,
                        f"The emulator cannot evaluate the condition of the binding of role {role} ({e}): it "
                        f"evaluates {iam.SUBSET}.",
                    ) from None
            for member in members:
                pool = POOL_MEMBER.fullmatch(str(member))
                if not MEMBER.fullmatch(str(member)) or (pool and not pool["project"].isdigit()):
                    raise HttpError(
                        400,
                        f"Invalid argument: invalid member '{member}' in the binding of role {role}"
                        + (": the project must be given by its number." if pool else "."),
                    )
        metageneration = int(resource["metageneration"]) + 1
        resource.update(metageneration=str(metageneration), etag=_etag(metageneration), updated=_now())
        self.state.policies[bucket] = {
            "version": 3 if conditional else 1,
            "bindings": [
                {k: copy.deepcopy(v) for k, v in b.items() if k in ("role", "members", "condition")} for b in bindings
            ],
        }
        return self._policy(bucket)

    def _test_permissions(self, bucket: str, permissions: list[str], member: str | None) -> dict:
        """buckets.testIamPermissions: those of ``permissions`` the caller holds on the bucket (the owner's token:
        all of them; a member: those the bucket's policy allows it on the bucket itself)."""
        self._bucket(bucket)
        if not permissions:
            raise HttpError(400, "Required parameter: permissions", "required")
        for permission in permissions:
            if permission in PROJECT_PERMISSIONS:
                raise HttpError(
                    400, f"Permission '{permission}' applies to projects, not buckets: it cannot be tested on one."
                )
        bindings = self.state.policies.get(bucket, {}).get("bindings", [])
        held = [p for p in permissions if member is None or iam.allows(bindings, member, p, _attributes(bucket, ""))]
        return {"kind": "storage#testIamPermissionsResponse", **({"permissions": held} if held else {})}

    # ------------------------------------------------------------------ objects
    def _list_objects(self, bucket: str, query: dict) -> dict:
        """objects.list: the objects whose names start with ``prefix`` and match ``matchGlob`` (``*`` and ``?`` within
        one path segment, ``**`` across them), by name ("ordered in the list lexicographically by name", in a flat
        namespace where a name's ``/`` is no directory: https://cloud.google.com/storage/docs/json_api/v1/objects/list;
        Python orders ``str`` by code point, as UTF-8 bytes order); a prefix nothing is under is an empty listing,
        not an error (only a missing bucket is 404); with a ``delimiter``, the names it cuts short become
        ``prefixes``. One page of at most ``maxResults`` (at most 1,000) entries, items and prefixes together, from
        where ``pageToken`` says the previous page stopped; ``nextPageToken`` when more follow."""
        self._bucket(bucket)
        prefix, delimiter, glob = query.get("prefix", ""), query.get("delimiter", ""), query.get("matchGlob")
        size = query.get("maxResults", str(LIST_PAGE))
        if not size.isdigit() or int(size) < 1:
            raise HttpError(400, f"Invalid value for maxResults: {size!r}.")
        size = min(int(size), LIST_PAGE)
        parts = re.split(r"(\*\*|\*|\?)", glob or "")
        pattern = (
            re.compile("".join({"**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part)) for part in parts))
            if glob
            else None
        )
        names = self._objects.names(bucket, prefix)
        after, skipped = _page_start(query.get("pageToken"))  # the last entry listed; a prefix: all names under it
        if after is not None:
            names = names[bisect.bisect_right(names, after) :]
        items, prefixes, last, more = [], [], None, False
        for name in names:
            if skipped and name.startswith(skipped):
                continue
            stored = self._objects.get(bucket, name)
            if stored is None or (pattern and not pattern.fullmatch(name)):
                continue
            rest = name[len(prefix) :]
            cut = prefix + rest.split(delimiter, 1)[0] + delimiter if delimiter and delimiter in rest else None
            if cut is not None and prefixes and prefixes[-1] == cut:  # names under one prefix are adjacent
                continue
            if len(items) + len(prefixes) == size:
                more = True
                break
            if cut is not None:
                prefixes.append(cut)
                last = (cut, True)
            else:
                items.append(copy.deepcopy(stored["metadata"]))
                last = (name, False)
        return {
            "kind": "storage#objects",
            "items": items,
            **({"prefixes": prefixes} if prefixes else {}),
            **({"nextPageToken": _page_token(*last)} if more and last else {}),
        }

    def _object(self, bucket: str, name: str, query: dict) -> dict:
        """The stored object (its live generation, or the one ``query`` names: 404 unless that is the live one, as no
        older generation is kept without Object Versioning, https://cloud.google.com/storage/docs/object-versioning),
        its preconditions checked."""
        self._bucket(bucket)
        stored = self._objects.get(bucket, name)
        if (
            stored is None
            or query.get("generation", stored["metadata"]["generation"]) != stored["metadata"]["generation"]
        ):
            raise HttpError(404, f"No such object: {bucket}/{name}")
        _preconditions(query, stored)
        return stored

    def _upload(self, http: BaseHTTPRequestHandler, query: dict, raw: bytes) -> dict:
        """An upload request, parsed: ``{"metadata", "query", "data", "content_type"}`` (no data: a resumable
        upload starts), or ``{"session", "metadata", "query", "data"}`` for a chunk of a resumable upload."""
        kind = query.get("uploadType")
        if http.command == "PUT" or "upload_id" in query:
            if kind != "resumable" or "upload_id" not in query:
                raise HttpError(
                    400, "A PUT to the upload URL must name a resumable upload: uploadType=resumable and upload_id."
                )
            with self._lock:
                session = self.state.uploads.get(query["upload_id"])
            if session is None:
                raise HttpError(404, f"No such upload: {query['upload_id']}.")
            return {
                "session": query["upload_id"],
                "metadata": session["metadata"],
                "query": session["query"],
                "data": raw,
            }
        if kind == "multipart":
            metadata, data, content_type = _multipart(http.headers.get("Content-Type", ""), raw)
        elif kind == "media":
            metadata, data, content_type = {}, raw, http.headers.get("Content-Type", "")
        elif kind == "resumable":
            metadata, data, content_type = _json(raw) if raw else {}, None, http.headers.get("X-Upload-Content-Type")
        else:
            raise HttpError(400, f"Invalid uploadType: {kind!r} (multipart, media or resumable).")
        return {"metadata": metadata, "query": query, "data": data, "content_type": content_type or ""}

    def _checked(self, bucket: str, metadata: dict, query: dict) -> str:
        """The name of the object an upload creates, once the bucket, the metadata and the preconditions pass."""
        self._bucket(bucket)
        name = metadata.get("name") or query.get("name")
        if not name:
            raise HttpError(400, "Required parameter: name", "required")
        if (
            not isinstance(name, str)
            or len(name.encode()) > 1024
            or name in (".", "..")
            or "\r" in name
            or "\n" in name
            or name.startswith(".well-known/acme-challenge/")
        ):
            raise HttpError(400, f"Invalid object name: {name!r}")
        unknown = sorted(set(metadata) - OBJECT_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        self._objects.check(bucket, name)
        _preconditions(query, self._objects.get(bucket, name))
        return name

    def _store(
        self,
        bucket: str,
        metadata: dict,
        data: bytes,
        content_type: str | None,
        query: dict,
        claimed: dict | None = None,
        components: int = 0,
    ) -> dict:
        """Stores an uploaded object (a new generation of it) and answers its resource. ``claimed``: the hashes the
        upload says the data has (the metadata's crc32c and md5Hash, an ``x-goog-hash`` header's). ``components``: a
        composite object's component count (``_resource``)."""
        name = self._checked(bucket, metadata, query)
        self._not_retained(bucket, name, self._objects.get(bucket, name))
        md5, crc32c = _hashes(data)
        claimed = {"crc32c": metadata.get("crc32c"), "md5": metadata.get("md5Hash"), **(claimed or {})}
        for kind, label, actual in (("crc32c", "CRC32C", crc32c), ("md5", "MD5 hash", md5)):
            if claimed.get(kind) not in (None, actual):
                raise HttpError(
                    400, f'Provided {label} "{claimed[kind]}" doesn\'t match calculated {label} "{actual}".'
                )
        resource = self._resource(bucket, name, metadata, data, content_type, components)
        self._objects.write(bucket, name, resource, data)
        return resource

    def _made_from_file(self, bucket: str, name: str, data: bytes) -> dict:
        """The metadata of an object whose file a writer outside the API wrote: a new generation, the data's size and
        hashes, and the content type Cloud Storage gives data that comes with none."""
        return self._resource(bucket, name, {}, data, "")

    def _resource(
        self, bucket: str, name: str, metadata: dict, data: bytes, content_type: str | None, components: int = 0
    ) -> dict:
        """The resource of a new generation of an object: ``metadata`` (what the writer gave), and what Cloud Storage
        adds (generation, size, hashes, times, links). A composite object (``components``, its component count) has
        its CRC32C and no MD5: "Composite objects do not have an MD5 hash metadata field", and "Each composite object
        has a component count metadata field" (https://cloud.google.com/storage/docs/composite-objects).
        ``content_type`` None, and none in ``metadata``: an object without one (``put``); "": the one Cloud Storage
        gives data that comes with none."""
        md5, crc32c = _hashes(data)
        typed = metadata.get("contentType") or content_type
        if typed is not None:
            typed = typed or "application/octet-stream"
        self._generation = max(self._generation + 1, time.time_ns() // 1000)
        generation, now = self._generation, _now()
        path = f"b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        return {
            **copy.deepcopy(metadata),
            "kind": "storage#object",
            "id": f"{bucket}/{name}/{generation}",
            "selfLink": f"https://www.googleapis.com/storage/v1/{path}",
            # where this emulator serves the data (Cloud Storage's is https://storage.googleapis.com/download/...)
            "mediaLink": f"{self.endpoint}/download/storage/v1/{path}?generation={generation}&alt=media",
            "name": name,
            "bucket": bucket,
            "generation": str(generation),
            "metageneration": "1",
            **({"contentType": typed} if typed is not None else {}),
            "storageClass": metadata.get("storageClass")
            or self.state.buckets.get(bucket, {}).get("storageClass", "STANDARD"),
            "size": str(len(data)),
            "crc32c": crc32c,
            "etag": _etag(generation, 1),
            "timeCreated": now,
            "updated": now,
            "timeStorageClassUpdated": now,
            "timeFinalized": now,
            **({"componentCount": components} if components else {"md5Hash": md5}),
        }

    def _insert_object(self, http: BaseHTTPRequestHandler, bucket: str, upload: dict) -> tuple[int, dict | None, dict]:
        if "session" in upload:
            return self._resumable_chunk(http, upload["session"], upload["data"])
        if upload["data"] is not None:
            return (
                200,
                copy.deepcopy(
                    self._store(bucket, upload["metadata"], upload["data"], upload["content_type"], upload["query"])
                ),
                {},
            )
        self._checked(bucket, upload["metadata"], upload["query"])  # a resumable upload starts: checked up front
        total = http.headers.get("X-Upload-Content-Length")
        upload_id = uuid.uuid4().hex
        self.state.uploads[upload_id] = {
            "bucket": bucket,
            "metadata": upload["metadata"],
            "query": upload["query"],
            "content_type": upload["content_type"],
            "data": b"",
            "total": int(total) if total and total.isdigit() else None,
        }
        location = f"{self.endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o?uploadType=resumable"
        return 200, None, {"Location": f"{location}&upload_id={upload_id}"}

    def _resumable_chunk(
        self, http: BaseHTTPRequestHandler, upload_id: str, data: bytes
    ) -> tuple[int, dict | None, dict]:
        """A chunk of a resumable upload (``Content-Range: bytes FIRST-LAST/TOTAL`` or ``.../*``; ``bytes */TOTAL``
        with no data ends it or asks how far it got): 308 with the ``Range`` received so far until the last byte,
        then the object."""
        session = self.state.uploads[upload_id]
        if "object" in session:  # finished already: the object, as Cloud Storage answers
            return 200, copy.deepcopy(session["object"]), {}
        m = CONTENT_RANGE.fullmatch(http.headers.get("Content-Range", "").strip())
        if not m:
            raise HttpError(400, f"Invalid Content-Range header: {http.headers.get('Content-Range')!r}.")
        received = session["data"]
        if m["total"] is not None:
            session["total"] = int(m["total"])
        if m["first"] is not None:
            first, last = int(m["first"]), int(m["last"])
            if last - first + 1 != len(data):
                raise HttpError(
                    400, f"The Content-Range header says {last - first + 1} byte(s), the body has {len(data)}."
                )
            if first > len(received):
                raise HttpError(
                    400,
                    f"Invalid request. According to the Content-Range header, the upload offset is "
                    f"{first} byte(s), which exceeds already uploaded size of {len(received)} "
                    f"byte(s).",
                )
            received = session["data"] = received[:first] + data
        elif data:
            raise HttpError(400, "A chunk with data must say its byte range in Content-Range.")
        total = session["total"]
        if total is not None and len(received) > total:
            raise HttpError(400, f"The upload has {len(received)} bytes, more than the {total} it said it has.")
        if total is None or len(received) < total:
            return 308, None, {"Range": f"bytes=0-{len(received) - 1}"} if received else {}
        claimed = dict(part.split("=", 1) for part in http.headers.get("x-goog-hash", "").split(",") if "=" in part)
        resource = self._store(
            session["bucket"], session["metadata"], received, session["content_type"], session["query"], claimed
        )
        session.update(object=resource, data=b"")
        return 200, copy.deepcopy(resource), {}

    def _get_object(
        self, http: BaseHTTPRequestHandler, bucket: str, name: str, query: dict, media: bool
    ) -> tuple[int, dict | bytes | Cut, dict]:
        stored = self._object(bucket, name, query)
        resource = stored["metadata"]
        if not media:
            return 200, _fields(copy.deepcopy(resource), query.get("fields")), {}
        data = self._objects.read(bucket, name, stored)
        accepted = http.headers.get("Accept-Encoding", "")
        self.state.downloads.append((bucket, name, http.headers.get("Range", ""), accepted))
        headers = {
            "Content-Type": resource.get("contentType", "application/octet-stream"),  # served so without one (``put``)
            "ETag": resource["etag"],
            "Accept-Ranges": "bytes",
            "x-goog-generation": resource["generation"],
            "x-goog-metageneration": resource["metageneration"],
            # a composite object's hash is its CRC32C alone (it has no MD5)
            "x-goog-hash": ",".join(
                f"{kind}={resource[key]}" for kind, key in (("crc32c", "crc32c"), ("md5", "md5Hash")) if key in resource
            ),
            "x-goog-stored-content-length": resource["size"],
            "x-goog-stored-content-encoding": resource.get("contentEncoding") or "identity",
        }
        cut = take_fault(self.cuts, self._lock, "objects.get", {"bucket": bucket, "object": name, "query": query})

        def answer(status: int, body: bytes, headers: dict) -> tuple[int, bytes | Cut, dict]:
            return status, Cut(body, cut.after) if cut else body, headers

        # Decompressive transcoding (https://cloud.google.com/storage/docs/transcoding): an object stored with
        # Content-Encoding: gzip is served decompressed, without its Content-Encoding and with any Range ignored
        # (the page's "Range header" section), unless the request accepts gzip ("the object is served as-is in that
        # specific request, along with a Content-Encoding: gzip response header") or its Cache-Control has
        # no-transform.
        if resource.get("contentEncoding") == "gzip":
            if "gzip" in accepted or "no-transform" in resource.get("cacheControl", ""):
                headers["Content-Encoding"] = "gzip"
            else:
                return answer(200, gzip.decompress(data), headers)
        m = RANGE.fullmatch(http.headers.get("Range", "").strip())
        if not m or not (m["first"] or m["last"]):
            return answer(200, data, headers)
        if take_fault(self.cuts, self._lock, "objects.get whole", {"bucket": bucket, "object": name, "query": query}):
            return answer(200, data, headers)  # the Range ignored (``whole``)
        if m["first"]:
            first, last = int(m["first"]), min(int(m["last"] or len(data) - 1), len(data) - 1)
        else:  # the last N bytes
            first, last = max(len(data) - int(m["last"]), 0), len(data) - 1
        if first >= len(data) or first > last:
            raise HttpError(416, "The requested range cannot be satisfied.", "requestedRangeNotSatisfiable")
        return answer(206, data[first : last + 1], {**headers, "Content-Range": f"bytes {first}-{last}/{len(data)}"})

    def _delete_object(self, bucket: str, name: str, query: dict) -> tuple[int, None, dict]:
        self._not_retained(bucket, name, self._object(bucket, name, query))
        self._objects.delete(bucket, name)
        return 204, None, {}

    def _not_retained(self, bucket: str, name: str, stored: dict | None) -> None:
        """403 when the live object may be neither deleted nor replaced: under a hold (``_not_held``), or younger than
        its bucket's retention period: "objects in the bucket can only be deleted or replaced once their age is
        greater than the retention period", which "retroactively applies to existing objects"
        (https://cloud.google.com/storage/docs/bucket-lock); "Any attempt to overwrite or delete objects younger than
        the retention period will result in a PERMISSION_DENIED error" (the bucket resource's retentionPolicy:
        https://cloud.google.com/storage/docs/json_api/v1/buckets#resource). Its message and reason are the service's
        as a client reported them (https://github.com/treeverse/lakeFS/issues/1339). A metadata patch is neither, so
        ``_patch_object`` does not ask."""
        _not_held(bucket, name, stored)
        policy = self.state.buckets.get(bucket, {}).get("retentionPolicy")
        if stored is None or not policy:
            return
        created = datetime.fromisoformat(stored["metadata"]["timeCreated"].replace("Z", "+00:00"))
        until = created + timedelta(seconds=int(policy["retentionPeriod"]))
        if datetime.now(UTC) < until:
            raise HttpError(
                403,
                f"Object '{bucket}/{name}' is subject to bucket's retention policy and cannot be deleted, overwritten "
                f"or archived until {until.isoformat()}",
                "forbidden",
            )

    def _patch_object(self, bucket: str, name: str, query: dict, body: dict) -> dict:
        """objects.patch of the metadata a writer may change (its holds, custom metadata, content headers): the same
        generation, its metageneration one more (https://cloud.google.com/storage/docs/json_api/v1/objects/patch;
        "you can edit the metadata" of a held object: https://cloud.google.com/storage/docs/object-holds; nor is a
        patch the deletion or replacement that a bucket's retention policy refuses, ``_not_retained``), under the
        request's generation and metageneration preconditions (``_object``)."""
        unknown = sorted(set(body) - OBJECT_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        stored = self._object(bucket, name, query)
        resource = stored["metadata"]
        for key in PATCHED_FIELDS:
            if key in body:
                resource[key] = body[key]
        metageneration = int(resource["metageneration"]) + 1
        resource.update(
            metageneration=str(metageneration),
            etag=_etag(int(resource["generation"]), metageneration),
            updated=_now(),
        )
        self._objects.write(bucket, name, resource, self._objects.read(bucket, name, stored))
        return copy.deepcopy(resource)

    def _copy_object(self, method: str, bucket: str, name: str, destination: dict, query: dict, body: dict) -> dict:
        """objects.copy and objects.rewrite: the source (its generation and preconditions the ``source*`` parameters)
        written as a new generation of the destination (its preconditions the others), with the source's content
        metadata unless the body gives some, which then replaces it (``COPIED_FIELDS``). A rewrite is done in one
        call: its response carries the resource."""
        unknown = sorted(set(body) - OBJECT_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        source_query = {SOURCE_QUERY[key]: value for key, value in query.items() if key in SOURCE_QUERY}
        stored = self._object(bucket, name, source_query)
        data = self._objects.read(bucket, name, stored)
        source = stored["metadata"]
        given = any(key in body for key in COPIED_FIELDS)  # a body that overrides the metadata replaces all of it
        if method == "objects.rewrite" and given and not body.get("contentType"):
            # all of it, so a rewrite's content type must be given too: 400, reason "required" (the service's answer
            # quoted in https://github.com/googleapis/google-cloud-java/pull/294, "rewrite (in contrast with copy)
            # fails if no content type is specified for the destination object" given a body; "content-type is
            # required (and operation will fail if one is not provided)":
            # https://github.com/googleapis/google-cloud-java/issues/306)
            raise HttpError(400, "You must specify the content type of the destination object.", "required")
        metadata = {
            **{key: copy.deepcopy(source[key]) for key in COPIED_FIELDS if key in source and not given},
            **{key: body[key] for key in (*COPIED_FIELDS, "storageClass") if key in body},
            "name": destination["object"],
        }
        # A copy of a composite object is one: "If you rewrite a composite object to a different location or storage
        # class, the result is a composite object with a component count of 1"
        # (https://cloud.google.com/storage/docs/composite-objects); in the same one it keeps its components.
        components = int(source.get("componentCount") or 0)
        if components and body.get("storageClass") not in (None, source["storageClass"]):
            components = 1
        resource = self._store(
            destination["bucket"],
            metadata,
            data,
            "" if given else source.get("contentType"),
            {key: value for key, value in query.items() if key in DESTINATION_QUERY},
            components=components,
        )
        if method == "objects.copy":
            return copy.deepcopy(resource)
        return {
            "kind": "storage#rewriteResponse",
            "totalBytesRewritten": resource["size"],
            "objectSize": resource["size"],
            "done": True,
            "resource": copy.deepcopy(resource),
        }

    def _compose_object(self, bucket: str, name: str, query: dict, body: dict) -> dict:
        """objects.compose: the sources' data, in order, as a new generation of the composite object ``name`` in the
        same bucket ("The source objects all must ... Be stored in the same Cloud Storage bucket", 1 to 32 of them,
        themselves composite or not: https://cloud.google.com/storage/docs/composite-objects), each source at the
        generation it names and under its ``objectPreconditions.ifGenerationMatch`` (412 otherwise), the destination's
        preconditions the query's. Its metadata is the body's ``destination`` ("Any MD5 value you provide as part of a
        compose request is ignored": the same page), its component count the sum of the sources'. A deliberate limit:
        ``deleteSourceObjects`` is refused (400) rather than half done."""
        unknown = sorted(set(body) - COMPOSE_FIELDS)
        if unknown:
            raise HttpError(400, f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
        if body.get("deleteSourceObjects"):
            raise HttpError(400, "The emulator does not delete a composition's source objects (deleteSourceObjects).")
        sources = body.get("sourceObjects")
        if not isinstance(sources, list) or not 1 <= len(sources) <= MAX_SOURCES:
            count = len(sources) if isinstance(sources, list) else 0
            raise HttpError(400, f"The number of source components provided ({count}) is not between 1 and 32.")
        data, components = b"", 0
        for source in sources:
            if not isinstance(source, dict) or not source.get("name"):
                raise HttpError(400, "Required: the name of every source object.", "required")
            wanted = {
                key: str(value)
                for key, value in (
                    ("generation", source.get("generation")),
                    ("ifGenerationMatch", (source.get("objectPreconditions") or {}).get("ifGenerationMatch")),
                )
                if value is not None
            }
            stored = self._object(bucket, source["name"], wanted)
            data += self._objects.read(bucket, source["name"], stored)
            components += int(stored["metadata"].get("componentCount") or 1)
        destination = {key: value for key, value in (body.get("destination") or {}).items() if key != "md5Hash"}
        resource = self._store(
            bucket,
            {**destination, "name": name},
            data,
            "",
            {key: value for key, value in query.items() if key in DESTINATION_QUERY},
            components=components,
        )
        return copy.deepcopy(resource)


# objects.compose's request body (https://cloud.google.com/storage/docs/json_api/v1/objects/compose#request-body)
COMPOSE_FIELDS = {"kind", "destination", "sourceObjects", "deleteSourceObjects"}
# "You can use between 1 and 32 source objects" (https://cloud.google.com/storage/docs/composite-objects)
MAX_SOURCES = 32


def _json(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode()) if raw else {}
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise HttpError(400, "Invalid JSON payload received.", "parseError")
    return body


def _multipart(content_type: str, raw: bytes) -> tuple[dict, bytes, str]:
    """A ``multipart/related`` upload's two parts: the object metadata (JSON), and the data with its content type."""
    boundary = re.fullmatch(r'\s*multipart/related\s*;\s*boundary="?([^";]+)"?\s*', content_type, re.IGNORECASE)
    if not boundary:
        raise HttpError(
            400, f"A multipart upload's Content-Type must be multipart/related with a boundary, not {content_type!r}."
        )
    chunks = raw.split(b"--" + boundary[1].encode())
    if len(chunks) != 4 or chunks[0].strip() or not chunks[3].startswith(b"--"):
        raise HttpError(400, "A multipart upload has two parts: the metadata and the data.")
    parts = []
    for chunk in chunks[1:3]:
        head, _, content = chunk.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        headers = dict(line.split(":", 1) for line in head.decode().split("\r\n") if ":" in line)
        parts.append(({k.strip().lower(): v.strip() for k, v in headers.items()}, content.removesuffix(b"\r\n")))
    (_, metadata), (data_headers, data) = parts
    return _json(metadata), data, data_headers.get("content-type", "")


def _attributes(bucket: str, name: str) -> dict:
    """The attributes of a bucket (``name`` "") or an object that IAM Conditions read."""
    if not name:
        return {"resource.name": f"projects/_/buckets/{bucket}", "resource.type": iam.BUCKET_TYPE}
    return {"resource.name": f"projects/_/buckets/{bucket}/objects/{name}", "resource.type": iam.OBJECT_TYPE}


# What objects.patch changes (the object resource's writable metadata: https://cloud.google.com/storage/docs/json_api/
# v1/objects#resource, the fields not marked output-only or set at creation only).
PATCHED_FIELDS = (
    "temporaryHold",
    "eventBasedHold",
    "metadata",
    "contentType",
    "contentDisposition",
    "contentEncoding",
    "contentLanguage",
    "cacheControl",
    "customTime",
)


def _not_held(bucket: str, name: str, stored: dict | None) -> None:
    """403 when the live object is under a hold: "While an object has a hold placed on it, the object cannot be
    deleted or replaced" (https://cloud.google.com/storage/docs/object-holds); the message is Cloud Storage's
    ``retentionPolicyNotMet`` refusal of such a request."""
    resource = (stored or {}).get("metadata") or {}
    for key, kind in (("temporaryHold", "Temporary"), ("eventBasedHold", "Event-Based")):
        if resource.get(key):
            raise HttpError(
                403,
                f"Object '{bucket}/{name}' is under active {kind} hold and cannot be deleted, overwritten or "
                "archived until hold is removed.",
                "retentionPolicyNotMet",
            )


def _preconditions(query: dict, stored: dict | None) -> None:
    """412 unless the object (None: there is none) meets the request's generation and metageneration conditions."""
    generation = stored["metadata"]["generation"] if stored else "0"
    metageneration = stored["metadata"]["metageneration"] if stored else None
    for key, value, equal in (
        ("ifGenerationMatch", generation, True),
        ("ifGenerationNotMatch", generation, False),
        ("ifMetagenerationMatch", metageneration, True),
        ("ifMetagenerationNotMatch", metageneration, False),
    ):
        if key in query and (query[key] == value) != equal:
            raise HttpError(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")


def _page_token(entry: str, is_prefix: bool) -> str:
    """objects.list's ``nextPageToken``: opaque to the client; here, the last entry of the page (and whether it was a
    prefix, whose names the next page skips)."""
    return base64.urlsafe_b64encode(json.dumps([entry, is_prefix]).encode()).decode()


def _page_start(token: str | None) -> tuple[str | None, str]:
    """Where a ``pageToken`` says to go on: (the name the previous page ended at, None for the first page; the
    prefix whose names to skip, or "")."""
    if not token:
        return None, ""
    try:
        entry, is_prefix = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError):
        raise HttpError(400, f"Invalid page token: {token!r}.") from None
    if not isinstance(entry, str):
        raise HttpError(400, f"Invalid page token: {token!r}.")
    return entry, entry if is_prefix else ""


def _fields(resource: dict, fields: str | None) -> dict:
    """The top-level fields a ``fields`` parameter (``name,size,metadata(k)``) asks for, or all of them."""
    if not fields:
        return resource
    keep = {part.split("(")[0].split("/")[0].strip() for part in re.split(r",(?![^(]*\))", fields)}
    return {key: value for key, value in resource.items() if key in keep}
