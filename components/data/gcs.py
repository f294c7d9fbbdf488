"""Training data in Cloud Storage: ``train.dataset=gs://BUCKET/PREFIX/`` (every .jsonl, .json, .parquet and .jsonl.gz
object under the prefix, but hidden ones: ``components.data.drops``), ``gs://BUCKET/PATH/*.jsonl`` (a glob) or
``gs://BUCKET/a.jsonl`` (one object), pinned; with ``train.dataset_ready``, only once the drop's marker is there.

A run reads the data as it was when the run began: ``list_objects`` resolves the URI to a list of objects, each with
its generation (a new one each time the object's data is replaced: https://cloud.google.com/storage/docs/metadata,
"Generation number"), and every later read names that generation (``read``), so an object replaced during the run
does not change what is trained on; without Object Versioning the replaced generation is gone
(https://cloud.google.com/storage/docs/object-versioning), and a read of it fails naming the object. The trainers'
pods reach only the run's own prefix, so ``copy_into`` copies the pinned generations server-side (objects.rewrite
with ``sourceGeneration``) into it before any TPU is provisioned. ``missing_read`` says which of the read permissions
(``storage.objects.list``, ``storage.objects.get``: ``roles/storage.objectViewer``) the caller lacks on the
dataset's bucket (buckets.testIamPermissions), for preflight.

Every call goes through google-cloud-storage, imported inside the functions; its own ``STORAGE_EMULATOR_HOST``
points it at an emulator. The one exception is the snapshot's many reads (:class:`Downloads`): the same JSON API
media downloads the client makes, over kept-alive ``http.client`` connections, a thread's own, with the same
credentials and the same ``STORAGE_EMULATOR_HOST``, each checked against the CRC32C its listing pinned. Errors
in the URI or in what it names are :class:`SpecError` naming the field.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable

from components.cloud.credentials import storage_client
from components.spec import InfraError, SpecError

DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz")
READ_PERMISSIONS = ("storage.objects.list", "storage.objects.get")
# the role that holds both, "to list objects" (https://cloud.google.com/storage/docs/listing-objects, "Before you
# begin") and to read them (https://cloud.google.com/storage/docs/access-control/iam-roles)
READ_ROLE = "roles/storage.objectViewer"
FORMS = "gs://BUCKET/PREFIX/, gs://BUCKET/PATH/*.jsonl or gs://BUCKET/OBJECT"
# a glob's wildcards, as objects.list's matchGlob reads them: * within a path segment, ** across segments, ? one
# character (https://cloud.google.com/storage/docs/json_api/v1/objects/list#list-objects-and-prefixes-using-glob)
WILDCARD = re.compile(r"[*?]")
# Bucket names (https://cloud.google.com/storage/docs/buckets#naming): lowercase letters, digits, dashes,
# underscores and dots, starting and ending with a letter or digit; 3-63 characters, or up to 222 with dots, each
# dot-separated part at most 63; not an IP address in dotted-decimal notation; not starting with "goog", not
# containing "google" or a close misspelling of it.
BUCKET_NAME = re.compile(r"[a-z0-9](?:[a-z0-9_.-]*[a-z0-9])?")
DOTTED_DECIMAL = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
GOOGLE = re.compile(r"g[o0]{2}g[l1]e")
# while copying, a progress line every this many objects, and at least this often
PROGRESS_EVERY, PROGRESS_S = 1000, 10.0


class SnapshotChanged(InfraError):
    """A pinned generation is no longer there: the object was replaced or deleted after the run's snapshot."""


def _client():
    """The Cloud Storage client, with the project's Google credentials (google-cloud-storage itself honours
    ``STORAGE_EMULATOR_HOST``). No project: reading and copying objects bills the buckets' own."""
    return storage_client(None)


def parse(uri: str, field: str) -> tuple[str, str, str]:
    """(bucket, prefix, glob) of a ``gs://`` URI: ``gs://b/p/`` (or ``gs://b``) is the prefix ``p/`` (or "") and no
    glob; ``gs://b/p/*.jsonl`` the glob ``p/*.jsonl`` and its literal start ``p/`` as the prefix; ``gs://b/a.jsonl``
    one object, its name as the prefix (no trailing ``/``) and no glob. SpecError(field) for a malformed one."""
    if not uri.startswith("gs://"):
        raise SpecError(field, f"{uri!r} is not a Cloud Storage URI", [FORMS])
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    _check_bucket(bucket, uri, field)
    # object names: 1-1024 bytes of UTF-8, no carriage return or line feed
    # (https://cloud.google.com/storage/docs/objects#naming)
    if len(path.encode()) > 1024 or "\r" in path or "\n" in path:
        raise SpecError(field, f"{uri!r}: an object name is at most 1024 bytes, without line breaks")
    if not WILDCARD.search(path):
        return bucket, path, ""
    if any(c in path for c in "[]{}"):
        raise SpecError(field, f"{uri!r}: a glob's wildcards here are *, ** and ? (no [...] or {{...}})", [FORMS])
    return bucket, WILDCARD.split(path, 1)[0], path


def _check_bucket(bucket: str, uri: str, field: str) -> None:
    parts = bucket.split(".")
    problem = (
        "no bucket name"
        if not bucket
        else "letters, digits, -, _ and . only, in lower case, starting and ending with a letter or digit"
        if not BUCKET_NAME.fullmatch(bucket)
        else "3 to 63 characters (222 with dots, each dotted part at most 63)"
        if len(bucket) < 3 or len(bucket) > (222 if len(parts) > 1 else 63) or any(len(p) > 63 for p in parts)
        else "no IP address"
        if DOTTED_DECIMAL.fullmatch(bucket)
        else 'no "goog" prefix and no "google"'
        if bucket.startswith("goog") or GOOGLE.search(bucket)
        else ""
    )
    if problem:
        raise SpecError(
            field,
            f"{uri!r}: bucket name {bucket!r} is not valid: {problem} "
            "(https://cloud.google.com/storage/docs/buckets#naming)",
            [FORMS],
        )


def list_objects(uri: str, *, field: str, ready: str = "", log: Callable[[str], None] | None = None) -> list[dict]:
    """The objects ``uri`` means, pinned: ``{"uri": "gs://b/name", "generation": "G", "size": N, "crc32c": "…",
    "updated": "RFC 3339"}`` each, by name; of a prefix or a glob only the data objects (``DATA_SUFFIXES``) that are
    not hidden (``drops.hidden``: a path segment below the prefix that starts with ``_`` or ``.``, as Spark's
    ``_temporary/`` attempts). Every page of the listing is read (the client's iterator follows ``nextPageToken``).
    ``ready`` (``train.dataset_ready``): the marker object that must be there, beside the data, before anything is
    listed. SpecError(field) when the bucket does not exist or the caller may not read it; ``drops.NoDrop`` when no
    data object is there (the one object named, or any under the prefix or matching the glob); ``drops.NotReady``
    when the marker is not."""
    from google.api_core import exceptions as gexc

    from components.data import drops

    bucket, prefix, glob = parse(uri, field)
    client = _client()
    found: list[dict] = []  # each blob made an entry as its page comes: no page is held longer
    times: dict[str, object] = {}  # each data object's update time, for its marker
    markers: dict[str, object] = {}  # the directories' markers the listing met, by directory: their update times
    others: list[str] = []  # the first few objects that are not data, for the error that none is
    skipped = hidden = 0
    top = drops.marker_dir(prefix)  # what the hidden segments are counted below, and the markers looked for up to
    try:
        if not glob and prefix and not prefix.endswith("/"):
            found = [_one(client, bucket, prefix, uri, field)]
            times[prefix] = found[0].pop("_updated")
        else:
            for blob in client.list_blobs(bucket, prefix=prefix or None, match_glob=glob or None):
                marker = bool(ready) and blob.name.rsplit("/", 1)[-1] == ready  # any name: _SUCCESS, DONE, ...
                if marker:
                    markers[drops.marker_dir(blob.name)] = blob.time_created
                if drops.hidden(blob.name[len(top) :]):
                    hidden += 1
                elif marker:
                    continue
                elif blob.name.endswith(DATA_SUFFIXES):
                    found.append(_entry(bucket, blob))
                    times[blob.name] = found[-1].pop("_updated")
                else:
                    skipped += 1
                    others += [blob.name][: 3 - len(others)]
        if not found:
            raise drops.NoDrop(
                field,
                f"{uri}: no {'/'.join(DATA_SUFFIXES)} object "
                + (f"matches the glob {glob}" if glob else f"under gs://{bucket}/{prefix}")
                + (
                    f" ({skipped} other object(s): {', '.join(others)}{', ...' if skipped > 3 else ''})"
                    if skipped
                    else ""
                )
                + (f" ({hidden} hidden)" if hidden else ""),
            )
        if ready:  # a prefix's listing met every marker under it; a glob's or one object's are asked for
            listed = not glob and prefix.endswith("/") or not prefix

            def marker(directory: str):
                if directory not in markers and not listed:
                    blob = client.bucket(bucket).get_blob(directory + ready)
                    markers[directory] = blob.time_created if blob is not None else None
                return markers.get(directory)

            late = drops.check_ready(
                times, marker, top, ready, key=field, uri=uri, shown=lambda name: f"gs://{bucket}/{name}", log=log
            )
            found = [entry for entry in found if entry["uri"].removeprefix(f"gs://{bucket}/") not in late]
    except gexc.NotFound:
        raise SpecError(field, f"{uri}: the bucket {bucket} does not exist") from None
    except gexc.Forbidden as exc:
        raise _refused(client, bucket, uri, field, exc) from None
    if hidden and log:
        log(f"snapshot: {uri}: {hidden} hidden object(s) not read (a path segment starting with _ or .)")
    if not found:
        raise drops.NotReady(field, f"{uri}: not ready: every data object was updated after its {ready}")
    return sorted(found, key=lambda entry: entry["uri"])


def has_objects(uri: str, field: str) -> bool:
    """Whether anything is under the ``gs://`` prefix ``uri`` (the bucket's top: whether the bucket exists, as Cloud
    Storage has no directories); SpecError(field) when the bucket does not exist."""
    from google.api_core import exceptions as gexc

    bucket, prefix, _ = parse(uri, field)
    try:
        return bool(list(_client().list_blobs(bucket, prefix=prefix or None, max_results=1))) or not prefix
    except gexc.NotFound:
        raise SpecError(field, f"{uri}: the bucket {bucket} does not exist") from None


def _one(client, bucket: str, name: str, uri: str, field: str) -> dict:
    """The one object ``name``, pinned; ``drops.NoDrop`` when it is not there, SpecError when it is no data file."""
    from components.data import drops

    blob = client.bucket(bucket).get_blob(name)  # None for a 404: no such object, or no such bucket
    if blob is None:
        under = list(client.list_blobs(bucket, prefix=f"{name}/", max_results=1))  # NotFound: no such bucket
        hint = f"; objects are under the prefix gs://{bucket}/{name}/ (with the trailing /)" if under else ""
        raise drops.NoDrop(field, f"{uri}: no such object in the bucket {bucket}{hint}")
    if not name.endswith(DATA_SUFFIXES):
        raise SpecError(field, f"{uri}: not a {'/'.join(DATA_SUFFIXES)} object", [FORMS])
    return _entry(bucket, blob)


def _entry(bucket: str, blob) -> dict:
    # RFC 3339 in UTC, to the millisecond, as the API writes it
    updated = blob.updated.isoformat(timespec="milliseconds").replace("+00:00", "Z") if blob.updated else ""
    return {
        "uri": f"gs://{bucket}/{blob.name}",
        "generation": str(blob.generation),
        "size": int(blob.size or 0),
        "crc32c": blob.crc32c or "",
        "updated": updated,
        # When this generation was written, for its marker (list_objects takes it out): ``timeCreated``, new with each
        # generation, not ``updated``, which a metadata change alone moves
        # (https://cloud.google.com/storage/docs/json_api/v1/objects#resource).
        "_updated": blob.time_created,
    }


def _refused(client, bucket: str, uri: str, field: str, exc) -> SpecError:
    who = caller(getattr(client, "_credentials", None))
    said = (getattr(exc, "message", "") or str(exc)).strip().splitlines()[0]
    return SpecError(
        field, f"{uri}: {who or 'this identity'} may not read the bucket ({said}); {read_hint(bucket, who)}"
    )


def read_hint(bucket: str, member: str = "") -> str:
    """What grants ``member`` (``serviceAccount:…``/``user:…``; "" unknown) read access to ``bucket``."""
    return (
        f"grant {READ_ROLE} on gs://{bucket}: `gcloud storage buckets add-iam-policy-binding gs://{bucket} "
        f"--member={member or 'MEMBER'} --role={READ_ROLE}`"
    )


def caller(creds) -> str:
    """The IAM member the credentials act as, where they say it (a service account's email, the account gcloud
    logged in); "" where they do not (a bare token, a metadata server's account before its first refresh)."""
    email = getattr(creds, "service_account_email", None)
    if email and email != "default":
        return f"serviceAccount:{email}"
    account = getattr(creds, "account", None)
    return f"user:{account}" if account else ""


def _split(uri: str) -> tuple[str, str]:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    if not uri.startswith("gs://") or not bucket or not name:
        raise ValueError(f"not a Cloud Storage object URI: {uri!r}")
    return bucket, name


def _changed(obj: dict) -> SnapshotChanged:
    return SnapshotChanged(
        f"{obj['uri']} changed since the run's snapshot: its generation {obj['generation']} was replaced or "
        "deleted, and the bucket keeps no older generation (https://cloud.google.com/storage/docs/object-versioning); "
        "the run trains on the data as it was when it began: run again to train on the current data"
    )


# The JSON API's media download of one generation (https://cloud.google.com/storage/docs/json_api/v1/objects/get:
# ``alt=media``, ``generation``), as google-cloud-storage's own downloads call it; the status codes Cloud Storage's
# retry strategy retries (https://cloud.google.com/storage/docs/retry-strategy: 408, 429 and 5xx), RETRIES times.
DOWNLOAD = "/download/storage/v1/b/{bucket}/o/{name}?alt=media&generation={generation}"
GOOGLE_STORAGE = "https://storage.googleapis.com"
RETRIED, RETRIES = frozenset({408, 429, 500, 502, 503, 504}), 5


class Downloads:
    """Reads of pinned generations, many at once: a media download each over a kept-alive HTTP connection of the
    reading thread's own (``http.client``), with the credentials' access token (refreshed when they are no longer
    valid, and once after a 401). A read through google-cloud-storage (:func:`read`) spends most of a small object's
    read in the client's own layers (a session, retries, a resumable-media download): a dataset of many small files
    is read several times faster this way. Every read's bytes are checked as they come against the CRC32C its listing
    pinned (the ``x-goog-hash`` Cloud Storage sends, which is the stored bytes': not checked when Cloud Storage
    decompresses a gzip-encoded object as it serves it, https://cloud.google.com/storage/docs/transcoding)."""

    def __init__(self, field: str = "train.dataset") -> None:
        import os
        import threading
        import urllib.parse

        self.field = field  # the setting a refused read names
        from components.cloud.credentials import STORAGE_EMULATOR_HOST_ENV, AccessToken, credentials

        endpoint = os.environ.get(STORAGE_EMULATOR_HOST_ENV) or GOOGLE_STORAGE
        url = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        self._https, self._host = url.scheme == "https", url.netloc
        self._token = AccessToken(credentials())
        self._local = threading.local()

    def _connection(self, fresh: bool = False):
        import http.client

        if fresh or getattr(self._local, "connection", None) is None:
            if getattr(self._local, "connection", None) is not None:
                self._local.connection.close()
            kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._local.connection = kind(self._host, timeout=300)
        return self._local.connection

    def open(self, obj: dict):
        """The response to ``obj``'s download (an entry of ``list_objects``), its body not yet read: read it to its
        end (:class:`Checked` checks it) before this thread's next ``open``. SnapshotChanged when the pinned
        generation is gone; SpecError naming the field when the caller may not read it; InfraError for another
        refusal."""
        import http.client
        import urllib.parse

        bucket, name = _split(obj["uri"])
        path = DOWNLOAD.format(bucket=bucket, name=urllib.parse.quote(name, safe=""), generation=int(obj["generation"]))
        fresh = refresh = False
        for attempt in range(RETRIES + 1):
            connection = self._connection(fresh)
            try:
                connection.request("GET", path, headers={"Authorization": f"Bearer {self._token(refresh)}"})
                response = connection.getresponse()
            except (OSError, http.client.HTTPException):  # a kept connection the server closed; a reset
                if attempt == RETRIES:
                    raise
                fresh = True
                continue
            fresh = refresh = False
            if response.status == 200:
                return Checked(response, obj)
            said = response.read().decode(errors="replace")[:300]
            if response.status == 404:
                raise _changed(obj)
            if response.status == 403:
                who = caller(self._token.creds)
                refused = f"{who or 'this identity'} may not read it ({said.strip()})"
                raise SpecError(self.field, f"{obj['uri']}: {refused}; {read_hint(bucket, who)}")
            if response.status == 401 and attempt == 0:
                refresh = True
                continue
            if response.status not in RETRIED or attempt == RETRIES:
                raise InfraError(f"reading {obj['uri']} (generation {obj['generation']}): {response.status} {said}")
            time.sleep(min(2**attempt * 0.5, 8))
        raise AssertionError("unreachable")

    def read(self, obj: dict) -> bytes:
        """The data of ``obj`` at its pinned generation, checked."""
        with self.open(obj) as body:
            return body.read()


class Checked:
    """A download's body as a binary stream (``io.BufferedReader`` over it: ``read``, ``readline``, iteration), its
    CRC32C computed as it is read and compared with the listing's when the body ends: InfraError when they differ."""

    def __init__(self, response, obj: dict) -> None:
        import io

        import google_crc32c

        encoding = response.getheader("x-goog-stored-content-encoding", "identity")
        self.expected = obj.get("crc32c") if encoding in ("", "identity") else ""
        self.crc, self.obj, self.response = google_crc32c.Checksum(), obj, response
        self.stream = io.BufferedReader(_Raw(self), buffer_size=2**20)

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc) -> None:
        self.stream.close()

    def chunk(self, into) -> int:
        n = self.response.readinto(into)
        if n:
            self.crc.update(bytes(into[:n]))
        elif self.expected:
            import base64

            if base64.b64encode(self.crc.digest()).decode() != self.expected:
                raise InfraError(
                    f"{self.obj['uri']} (generation {self.obj['generation']}): the bytes read do not match the CRC32C "
                    "its listing gave (damaged on the way): run again"
                )
            self.expected = ""  # checked once
        return n


class _Raw(io.RawIOBase):
    def __init__(self, checked: Checked) -> None:
        self.checked = checked

    def readable(self) -> bool:
        return True

    def readinto(self, into) -> int:  # type: ignore[override]
        return self.checked.chunk(memoryview(into).cast("B"))


def read(obj: dict) -> bytes:
    """The data of ``obj`` (an entry of ``list_objects``) at its pinned generation exactly, through
    google-cloud-storage; SnapshotChanged when that generation is gone. (Many reads: :class:`Downloads`.)"""
    from google.api_core import exceptions as gexc

    bucket, name = _split(obj["uri"])
    blob = _client().bucket(bucket).blob(name, generation=int(obj["generation"]))
    try:
        return blob.download_as_bytes()
    except gexc.NotFound:
        raise _changed(obj) from None


def copy_into(objects: list[dict], dest_prefix: str, *, log: Callable[[str], None]) -> list[str]:
    """Copy each pinned generation of ``objects`` (entries of ``list_objects``) server-side (objects.rewrite with
    ``sourceGeneration``, repeated until done: https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite)
    to ``<dest_prefix>/<index>-<file name>`` (``dest_prefix``: ``gs://RUN_BUCKET/runs/<id>/data/<split>``); the
    destinations' URIs, in the order of ``objects``. A destination that already holds the same data (CRC32C and
    size) is kept, so a retried stage goes on where the first try stopped. SnapshotChanged when a pinned generation
    is gone."""
    from google.api_core import exceptions as gexc

    dest_bucket, dest_path = _split(dest_prefix.rstrip("/"))
    client = _client()
    have = {
        b.name: (b.crc32c, int(b.size or 0), b.generation)
        for b in client.list_blobs(dest_bucket, prefix=f"{dest_path}/")
    }
    width = max(5, len(str(len(objects))))
    uris, copied, size, last = [], 0, 0, time.monotonic()
    for i, obj in enumerate(objects):
        bucket, name = _split(obj["uri"])
        target = f"{dest_path}/{i:0{width}d}-{name.rsplit('/', 1)[-1]}"
        uris.append(f"gs://{dest_bucket}/{target}")
        there = have.get(target)
        if there and there[:2] == (obj["crc32c"], obj["size"]):
            continue
        source = client.bucket(bucket).blob(name, generation=int(obj["generation"]))
        destination = client.bucket(dest_bucket).blob(target)
        token = None
        try:
            while True:  # replaces only what was there when listed (412 if someone else wrote it since)
                token, _, _ = destination.rewrite(source, token=token, if_generation_match=there[2] if there else 0)
                if token is None:
                    break
        except gexc.NotFound:
            if not source.exists():
                raise _changed(obj) from None
            raise
        if destination.crc32c != obj["crc32c"]:
            raise _changed(obj)
        copied, size = copied + 1, size + obj["size"]
        if (i + 1) % PROGRESS_EVERY == 0 or time.monotonic() - last >= PROGRESS_S:
            log(f"copying the dataset: {i + 1} of {len(objects)} objects into {dest_prefix}")
            last = time.monotonic()
    kept = len(objects) - copied
    log(
        f"copied {copied} object(s) ({size / 2**20:.1f} MiB) into {dest_prefix}"
        + (f"; {kept} already there" if kept else "")
    )
    return uris


def missing_read(bucket: str, *, field: str = "train.dataset") -> list[str]:
    """Of ``storage.objects.list`` and ``storage.objects.get``, those the caller lacks on ``bucket`` (empty: it may
    read the dataset), through buckets.testIamPermissions
    (https://cloud.google.com/storage/docs/json_api/v1/buckets/testIamPermissions: it needs no permission itself).
    Both are in ``roles/storage.objectViewer`` (``READ_ROLE``). SpecError(field) when the bucket does not exist."""
    from google.api_core import exceptions as gexc

    try:
        held = set(_client().bucket(bucket).test_iam_permissions(list(READ_PERMISSIONS)))
    except gexc.NotFound:
        raise SpecError(field, f"the bucket {bucket} does not exist") from None
    return [p for p in READ_PERMISSIONS if p not in held]
