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
media downloads the client makes, made on its own HTTP session's connection pool (its endpoint, proxies, CA bundle,
client certificate and credentials), each of the object as stored, resumed with a ``Range`` where it breaks off,
and checked whole against the CRC32C its listing pinned. Errors in the URI or in what it names are
:class:`SpecError` naming the field.
"""

from __future__ import annotations

import io
import itertools
import re
import time
from collections.abc import Buffer, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, BinaryIO

from components.cloud.credentials import storage_client
from components.data.records import Item
from components.spec import InfraError, SpecError

if TYPE_CHECKING:
    import urllib3
    from google.auth.credentials import Credentials

    # google-cloud-storage ships no type information: its names are Any to mypy (pyproject.toml's overrides)
    from google.cloud.storage import Blob, Client

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


def _client() -> Client:
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


def list_objects(uri: str, *, field: str, ready: str = "", log: Callable[[str], None] | None = None) -> list[Item]:
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
    found: list[Item] = []  # each blob made an entry as its page comes: no page is held longer
    times: dict[str, datetime | None] = {}  # each data object's update time, for its marker
    markers: dict[str, datetime | None] = {}  # the directories' markers the listing met, by directory: their times
    others: list[str] = []  # the first few objects that are not data, for the error that none is
    skipped = hidden = 0
    top = drops.marker_dir(prefix)  # what the hidden segments are counted below, and the markers looked for up to
    try:
        if not glob and prefix and not prefix.endswith("/"):
            entry, times[prefix] = _one(client, bucket, prefix, uri, field)
            found = [entry]
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
                    entry, times[blob.name] = _entry(bucket, blob)
                    found.append(entry)
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

            def marker(directory: str) -> datetime | None:
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


def _one(client: Client, bucket: str, name: str, uri: str, field: str) -> tuple[Item, datetime | None]:
    """The one object ``name``, pinned (:func:`_entry`); ``drops.NoDrop`` when it is not there, SpecError when it is
    no data file."""
    from components.data import drops

    blob = client.bucket(bucket).get_blob(name)  # None for a 404: no such object, or no such bucket
    if blob is None:
        under = list(client.list_blobs(bucket, prefix=f"{name}/", max_results=1))  # NotFound: no such bucket
        hint = f"; objects are under the prefix gs://{bucket}/{name}/ (with the trailing /)" if under else ""
        raise drops.NoDrop(field, f"{uri}: no such object in the bucket {bucket}{hint}")
    if not name.endswith(DATA_SUFFIXES):
        raise SpecError(field, f"{uri}: not a {'/'.join(DATA_SUFFIXES)} object", [FORMS])
    return _entry(bucket, blob)


def _entry(bucket: str, blob: Blob) -> tuple[Item, datetime | None]:
    """The object's entry, and when this generation was written, for its marker: ``timeCreated``, new with each
    generation, not ``updated``, which a metadata change alone moves
    (https://cloud.google.com/storage/docs/json_api/v1/objects#resource)."""
    # RFC 3339 in UTC, to the millisecond, as the API writes it
    updated = blob.updated.isoformat(timespec="milliseconds").replace("+00:00", "Z") if blob.updated else ""
    entry: Item = {
        "uri": f"gs://{bucket}/{blob.name}",
        "generation": str(blob.generation),
        "size": int(blob.size or 0),
        "crc32c": blob.crc32c or "",
        "updated": updated,
    }
    return entry, blob.time_created


def _refused(client: Client, bucket: str, uri: str, field: str, exc: Exception) -> SpecError:
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


def caller(creds: object) -> str:
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


def _changed(obj: Item) -> SnapshotChanged:
    return SnapshotChanged(
        f"{obj['uri']} changed since the run's snapshot: its generation {obj['generation']} was replaced or "
        "deleted, and the bucket keeps no older generation (https://cloud.google.com/storage/docs/object-versioning); "
        "the run trains on the data as it was when it began: run again to train on the current data"
    )


# The JSON API's media download of one generation (https://cloud.google.com/storage/docs/json_api/v1/objects/get:
# ``alt=media``, ``generation``), at the path google-cloud-storage's own downloads take under the client's endpoint
# (``_DOWNLOAD_URL_TEMPLATE``, ``{hostname}/download/storage/{api_version}{path}?alt=media``, the hostname being the
# client's ``_connection.API_BASE_URL``:
# https://github.com/googleapis/python-storage/blob/v3.4.0/google/cloud/storage/blob.py); the status codes Cloud
# Storage's retry strategy retries (https://cloud.google.com/storage/docs/retry-strategy: 408, 429 and 5xx), within
# the retry budget (``Retry``).
DOWNLOAD = "/download/storage/v1/"
MEDIA = "b/{bucket}/o/{name}?alt=media&generation={generation}"
RETRIED = frozenset({408, 429, 500, 502, 503, 504})
CONNECT_S, READ_S = 60.0, 300.0  # a connection's and a read's timeout
ERROR_BYTES = 4096  # the most of an error answer's body read, to show a part of it


@dataclass(frozen=True)
class Retry:
    """The retry budget of a read, google-cloud-storage's ``DEFAULT_RETRY``'s (google/cloud/storage/retry.py at
    v3.4.0: an api_core ``Retry`` with its defaults, google/api_core/retry/retry_base.py: ``_DEFAULT_INITIAL_DELAY``
    1 s, ``_DEFAULT_DELAY_MULTIPLIER`` 2, ``_DEFAULT_MAXIMUM_DELAY`` 60 s, ``_DEFAULT_DEADLINE`` 120 s), which Cloud
    Storage's retry strategy describes (https://cloud.google.com/storage/docs/retry-strategy#exponential-backoff): each
    wait a random part of a bound that starts at ``initial_s`` and grows by ``multiplier`` to ``maximum_s`` (full
    jitter, ``exponential_sleep_generator``), or the ``Retry-After`` an answer gives; no more tries once the next wait
    would end past ``deadline_s`` from the first failure (api_core's ``_retry_error_helper``)."""

    initial_s: float = 1.0
    multiplier: float = 2.0
    maximum_s: float = 60.0
    deadline_s: float = 120.0

    def start(self, clock: Callable[[], float] = time.monotonic) -> Backoff:
        return Backoff(self, clock() + self.deadline_s, self.initial_s, clock)


RETRY = Retry()  # the budget a Downloads takes unless given one


@dataclass
class Backoff:
    """One read's retries under a ``Retry``: ``wait`` sleeps before the next try, or says there is none."""

    retry: Retry
    deadline: float
    bound: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def next_wait(self, after: str | None = None) -> float | None:
        """The wait before the next try (``after``: the answer's ``Retry-After`` seconds), None past the deadline."""
        import random

        wait = float(after) if after and after.isdigit() else random.uniform(0.0, self.bound)
        self.bound = min(self.bound * self.retry.multiplier, self.retry.maximum_s)
        return None if self.clock() + wait > self.deadline else wait

    def wait(self, after: str | None = None) -> bool:
        """Sleep before the next try and say True; False where it would end past the deadline."""
        wait = self.next_wait(after)
        if wait is None:
            return False
        self.sleep(wait)
        return True


class Downloads:
    """Reads of pinned generations, many at once: a media download each, through the connection pool of the Cloud
    Storage client's own HTTP session (``client._http``, google-auth's ``AuthorizedSession``), so the reads go where
    the client goes and as it goes: its endpoint (``api_endpoint``: a ``client_options`` endpoint, the universe
    domain, ``STORAGE_EMULATOR_HOST``), its session's proxies, CA bundle and client certificate (the mutual TLS
    channel ``configure_mtls_channel`` mounts), the environment's settings as requests merges them
    (``Session.merge_environment_settings``), and its credentials (``Credentials.before_request``: refreshed when no
    longer valid, and once after a 401). The pool is taken from the session's adapter as requests' own ``send``
    takes it (``HTTPAdapter.get_connection_with_tls_context``, ``cert_verify``, ``request_url``:
    https://github.com/psf/requests/blob/v2.33.0/src/requests/adapters.py) and the download is made on it directly:
    a whole ``Session.request`` costs about three times as much per object, which a dataset of many small files
    pays thousands of times.

    Each read asks for the object as stored (``Accept-Encoding: gzip``: "the object is served as-is", never
    decompressed on the way, https://cloud.google.com/storage/docs/transcoding), so its bytes are the ones the
    CRC32C its listing pinned is of, and a ``Range`` of them is honoured; a gzip-encoded object is inflated here
    (:func:`drops.inflated`), as Cloud Storage would have served it. A download that breaks off (a reset, a body
    that ends early) is resumed from the byte it reached: a ``Range`` request for the rest of the same pinned
    generation, as Cloud Storage's downloads are resumed ("Using this basic download behavior, you can resume
    interrupted downloads": https://cloud.google.com/storage/docs/downloads) and as google-cloud-storage's own
    download resumes (``Download.consume``: a range from the bytes downloaded, with the object's generation:
    https://github.com/googleapis/python-storage/blob/v3.4.0/google/cloud/storage/_media/requests/download.py).
    The CRC32C is of the whole object, checked when the last byte is in (:class:`Checked`)."""

    def __init__(
        self,
        field: str = "train.dataset",
        client: Client | None = None,
        connections: int = 16,
        retry: Retry | None = None,
    ) -> None:
        import threading

        import requests
        from google.auth.transport.requests import Request

        self.field = field  # the setting a refused read names
        self.retry = retry or RETRY
        client = client if client is not None else _client()
        session = client._http
        self._base = client.api_endpoint.rstrip("/")  # the client's _connection.API_BASE_URL
        probe = requests.Request("GET", self._base + DOWNLOAD).prepare()
        settings = session.merge_environment_settings(probe.url, {}, None, None, None)
        verify, proxies, cert = settings["verify"], settings["proxies"], settings["cert"]
        adapter = session.get_adapter(probe.url)
        if hasattr(adapter, "poolmanager"):  # as many kept connections as readers (requests' default is 10)
            adapter.poolmanager.connection_pool_kw["maxsize"] = connections
        self._pool: urllib3.HTTPConnectionPool = adapter.get_connection_with_tls_context(probe, verify, proxies, cert)
        adapter.cert_verify(self._pool, probe.url, verify, cert)
        self._prefix: str = adapter.request_url(probe, proxies)  # the path, or the whole URL through an HTTP proxy
        self.creds: Credentials = session.credentials
        self._auth, self._lock = Request(), threading.Lock()

    def _headers(self, offset: int, refresh: bool) -> dict[str, str]:
        headers = {"Accept-Encoding": "gzip"}
        if offset:
            headers["Range"] = f"bytes={offset}-"
        with self._lock:
            # google-auth's refresh and before_request are unannotated
            if refresh:
                self.creds.refresh(self._auth)  # type: ignore[no-untyped-call]
            self.creds.before_request(self._auth, "GET", self._base + DOWNLOAD, headers)  # type: ignore[no-untyped-call]
        return headers

    def request(self, obj: Item, offset: int = 0) -> urllib3.BaseHTTPResponse:
        """The response (urllib3's, its body not yet read) to ``obj``'s download (an entry of ``list_objects``) from
        byte ``offset``: 200 for the whole object, 206 from ``offset``. SnapshotChanged when the pinned generation
        is gone; SpecError naming the field when the caller may not read it; InfraError for another refusal or a
        service that stays unreachable."""
        import urllib.parse

        import urllib3

        bucket, name = _split(obj["uri"])
        path = self._prefix + MEDIA.format(
            bucket=bucket, name=urllib.parse.quote(name, safe=""), generation=int(obj["generation"])
        )
        where = f"reading {obj['uri']} (generation {obj['generation']})"
        refresh, backoff = False, self.retry.start()
        for attempt in itertools.count():
            try:
                response = self._pool.urlopen(
                    "GET",
                    path,
                    headers=self._headers(offset, refresh),
                    retries=False,
                    redirect=False,
                    assert_same_host=False,  # the whole URL, through an HTTP proxy (as requests' send passes it)
                    preload_content=False,
                    decode_content=False,
                    timeout=urllib3.Timeout(connect=CONNECT_S, read=READ_S),
                )
            except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset before the answer, timed out
                if not backoff.wait():
                    raise InfraError(f"{where}: {exc} (retried for {self.retry.deadline_s:.0f}s)") from None
                continue
            refresh = False
            if response.status == (206 if offset else 200):
                ranged = response.headers.get("Content-Range", "")
                if offset and not ranged.startswith(f"bytes {offset}-"):
                    response.close()
                    raise InfraError(f"{where}: asked for the bytes from {offset}, got {ranged or 'no Content-Range'}")
                return response
            if response.status == 200:  # a resume answered with the whole object: the bytes before it dropped
                # Cloud Storage ignores the Range of an object it serves decompressed ("GCS serves back the whole
                # file regardless of the range request": ``Download.consume`` in python-storage's
                # google/cloud/storage/_media/requests/download.py), and a proxy may drop it; google-cloud-cpp reads
                # up to the offset and discards it (``ReadDiscard`` in google/cloud/storage/internal/
                # retry_object_read_source.cc). Decompressed bytes are not the stored ones the offset counts: refused.
                if _transcoded(response.headers):
                    response.close()
                    raise InfraError(
                        f"{where}: asked for the bytes from {offset}, Cloud Storage served the whole object "
                        "decompressed, which cannot be resumed: run again"
                    )
                if _skip(response, offset):
                    return response
                if not backoff.wait():
                    raise InfraError(
                        f"{where}: whole-object answers to a resume broke off before byte {offset} for "
                        f"{self.retry.deadline_s:.0f}s"
                    )
                continue
            said = response.read(ERROR_BYTES).decode(errors="replace")[:300]
            response.close()
            if response.status == 404:
                raise _changed(obj)
            if response.status == 403:
                who = caller(self.creds)
                refused = f"{who or 'this identity'} may not read it ({said.strip()})"
                raise SpecError(self.field, f"{obj['uri']}: {refused}; {read_hint(bucket, who)}")
            if response.status == 401 and attempt == 0:
                refresh = True
                continue
            if response.status not in RETRIED:
                raise InfraError(f"{where}: {response.status} {said}")
            if not backoff.wait(response.headers.get("Retry-After")):
                raise InfraError(f"{where}: {response.status} {said} (retried for {self.retry.deadline_s:.0f}s)")
        raise AssertionError("unreachable")

    def open(self, obj: Item) -> Checked:
        """``obj``'s download, to read as a stream (``with downloads.open(obj) as body``): its content, checked and
        resumed as it is read (:class:`Checked`). Errors as :meth:`request`."""
        return Checked(self, obj)

    def read(self, obj: Item) -> bytes:
        """The content of ``obj`` at its pinned generation, checked."""
        with self.open(obj) as body:
            return body.read()


def _transcoded(headers: Mapping[str, str]) -> bool:
    """Whether an answer is an object stored gzip-encoded served decompressed (python-storage's
    ``_is_decompressive_transcoding``: a stored encoding of gzip, the answer's not gzip)."""
    return headers.get("x-goog-stored-content-encoding") == "gzip" and headers.get("Content-Encoding") != "gzip"


def _skip(response: urllib3.BaseHTTPResponse, offset: int) -> bool:
    """Read and drop the first ``offset`` bytes of ``response``'s body, a MiB at a time; False (the response closed)
    where it breaks off first."""
    import urllib3

    left = offset
    try:
        while left:
            n = len(response.read(min(left, 2**20)))
            if not n:
                break
            left -= n
    except (OSError, urllib3.exceptions.HTTPError):
        pass
    if left:
        response.close()
    return not left


class Checked:
    """A download's content as a binary stream (``io.BufferedReader``: ``read``, ``readline``, iteration). The stored
    bytes' CRC32C is computed as they come and compared with the listing's, and their count with its size, when the
    last byte is in: InfraError when either differs. A body that breaks off is resumed from the byte it reached
    (``Downloads.request`` with the offset): at once while each try brings bytes, after a backoff when one brings
    none, and an InfraError naming the object and the byte once tries without progress have used the retry budget
    (``Retry``)."""

    def __init__(self, downloads: Downloads, obj: Item) -> None:
        import google_crc32c

        from components.data import drops

        self.downloads, self.obj = downloads, obj
        self.response = downloads.request(obj)
        headers = self.response.headers
        # served decompressed even so (its Cache-Control or a proxy's doing): neither its checksum nor a range of it
        # is the stored object's
        self.transcoded = _transcoded(headers)
        self.expected = "" if self.transcoded else obj.get("crc32c", "")
        stored = obj.get("size", headers.get("x-goog-stored-content-length"))
        self.size = None if self.transcoded or stored is None else int(stored)
        self.crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]  # google-crc32c's: unannotated
        self.got, self.since = 0, 0
        self.stalled: Backoff | None = None  # the retries since the last try that brought bytes
        raw = io.BufferedReader(_Raw(self), buffer_size=2**20)
        gzipped = headers.get("Content-Encoding") == "gzip"  # served as stored: inflated as it would be served
        self.stream: BinaryIO = drops.inflated(raw, obj["uri"], downloads.field) if gzipped else raw

    def __enter__(self) -> BinaryIO:
        return self.stream

    def __exit__(self, *exc: object) -> None:
        self.stream.close()
        if self.expected or self.size is not None and self.got < self.size:  # left unread: its connection is not reused
            self.response.close()
        self.response.release_conn()

    def chunk(self, into: memoryview) -> int:
        import urllib3

        while True:
            broken: BaseException | None = None
            try:
                n = self.response.readinto(into)
            except (OSError, urllib3.exceptions.HTTPError) as exc:  # a reset, a body shorter than it said
                n, broken = 0, exc
            if n:
                self.crc.update(bytes(into[:n]))  # type: ignore[no-untyped-call]  # google-crc32c's: unannotated
                self.got += n
                return n
            if broken is None and (self.size is None or self.got >= self.size):
                self._check()
                return 0
            self._resume(broken)

    def _resume(self, broken: BaseException | None) -> None:
        where = f"{self.obj['uri']} (generation {self.obj['generation']})"
        why = f"{type(broken).__name__}: {broken}" if broken else "the body ended early"
        self.response.close()
        self.response.release_conn()
        if self.transcoded:
            raise InfraError(
                f"{where}: the download broke off at byte {self.got} ({why}), and Cloud Storage served it "
                "decompressed, which cannot be resumed: run again"
            )
        if self.got > self.since or self.stalled is None:  # progress since the last try: resumed at once
            self.stalled = self.downloads.retry.start()
        elif not self.stalled.wait():
            raise InfraError(
                f"{where}: the download broke off at byte {self.got} of {self.size} and tries to resume it for "
                f"{self.downloads.retry.deadline_s:.0f}s brought nothing ({why})"
            )
        self.since = self.got
        self.response = self.downloads.request(self.obj, self.got)

    def _check(self) -> None:
        import base64

        where = f"{self.obj['uri']} (generation {self.obj['generation']})"
        if self.size is not None and self.got != self.size:
            raise InfraError(f"{where}: read {self.got} bytes, its listing gave {self.size}: run again")
        digest: bytes = self.crc.digest()  # type: ignore[no-untyped-call]  # google-crc32c's: unannotated
        if self.expected and base64.b64encode(digest).decode() != self.expected:
            raise InfraError(
                f"{where}: the bytes read do not match the CRC32C its listing gave (damaged on the way): run again"
            )
        self.expected = ""  # checked once


class _Raw(io.RawIOBase):
    def __init__(self, checked: Checked) -> None:
        self.checked = checked

    def readable(self) -> bool:
        return True

    def readinto(self, into: Buffer) -> int:
        return self.checked.chunk(memoryview(into).cast("B"))


def read(obj: Item) -> bytes:
    """The data of ``obj`` (an entry of ``list_objects``) at its pinned generation exactly, through
    google-cloud-storage; SnapshotChanged when that generation is gone. (Many reads: :class:`Downloads`.)"""
    from google.api_core import exceptions as gexc

    bucket, name = _split(obj["uri"])
    blob = _client().bucket(bucket).blob(name, generation=int(obj["generation"]))
    try:
        data: bytes = blob.download_as_bytes()
    except gexc.NotFound:
        raise _changed(obj) from None
    return data


def copy_into(objects: list[Item], dest_prefix: str, *, log: Callable[[str], None]) -> list[str]:
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
