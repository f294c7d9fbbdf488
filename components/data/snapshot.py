"""A run's data snapshot: ``train.dataset`` (and a fixed ``train.eval_dataset``) resolved once, before anything is
spent, to an immutable list of what the run reads, and the examples read from exactly that list.

- Local files: each file with the digest of its bytes (its "generation": a file changed later is another one).
- Cloud Storage: each object with its generation and size (``gcs``); every read names the generation, so an object
  replaced during the run does not change what it trains on.
- BigQuery: the table as of the snapshot time, with its filter and row count (``bigquery``), read by time travel.

The manifest (:func:`take`'s first value) lists the items the run trains on and every item its lineage has trained on
(``seen``: the champion's and its own), the fields its examples carry, their count and a token estimate, and its
``digest``: the registry's ``data_snapshot`` of the version the run registers. With ``train.data_since=champion``
the items are only those the champion's manifest did not have (rows after its newest, for BigQuery); none is a run
with nothing to learn (``skip``). What is read anew may hold examples the champion already trained on (an object
rewritten with the same lines, a table truncated and reloaded, a day's rows deleted and inserted again): each run
keeps the keys of every training example its lineage has seen (:func:`lineage`, a sorted file of 16-byte keys the
stage writes beside the examples), and an example whose key is in the champion's is dropped and counted
(``champion_duplicates``), whatever the source's kind. Every example is checked for the fields the prompt needs,
naming the item and line of the first that lacks one. The examples held out for evaluation: a fixed
``train.eval_dataset``, else those whose instruction's digest falls in ``HELDOUT_PERCENT`` percent (the same example
is held out in every run). A fixed evaluation set's ``digest`` is its content's (:func:`content_digest`), not its
generations' or snapshot time's.

Drops (``components.data.drops``): hidden paths (``_temporary/``, ``_SUCCESS``, ``.``-prefixed) are never read;
with ``train.dataset_ready`` a drop is read only once its marker is there; ``.jsonl.gz`` is read; a file with no
example is skipped with a warning; with ``train.data_since=champion`` a dated drop (``{date}``, ``{date-1}``,
``{date:%Y%m%d}``) that is not there, in a directory that is (a dated BigQuery table: in a dataset that is), is a run
with nothing new (``skip``), as a day without new data is; a drop without its marker is an error.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, cast

from components.data import drops
from components.data.records import Item, Side, TableSnapshot
from components.spec import RunSpec, SpecError, datasets

HELDOUT_PERCENT = 10
KEY_BYTES = 16  # an example's key (example_key): the first 16 bytes of a SHA-256
# 2: a fixed evaluation set's digest is its content's (content_digest); 3: ``max_time`` is the mark of the table the
# run read (``train.table.table``) alone, never one carried from another table (_champion_table)
MANIFEST_VERSION = 3
CHARS_PER_TOKEN = 4  # a rough estimate of English text with subword tokenizers, for `tpupipe data` alone
Rows = list[dict[str, Any]]


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def file_digest(data: bytes) -> str:
    """A file's bytes' digest, as the manifest records the key file's."""
    return _sha(data)


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def content_digest(examples: Iterable[dict[str, Any]]) -> str:
    """The digest of a set of examples as evaluation reads them: each example's prompt fields
    (``datasets.FIELDS``) digested, the digests sorted, so neither the order the rows came in, nor where they were
    read from, nor when (an object's generation, a table's snapshot time), nor other columns change it; the same
    example twice counts twice."""
    each = sorted(_sha(json.dumps([e[f] for f in datasets.FIELDS], ensure_ascii=False).encode()) for e in examples)
    return digest(each)


# ---------------------------------------------------------------- listing: the items a source means


def _local_items(path: str, key: str, ready: str = "", log: Callable[[str], None] | None = None) -> list[Item]:
    """The local files ``path`` means (a file, ``DIR/`` for every data file under it, or a glob), each with the
    digest of its bytes; under ``DIR/`` or a glob, none that is hidden (``drops.hidden``). ``ready``: the marker file
    each data file's directory (or one above it, within the dataset's) must hold, written after it
    (``drops.check_ready``). ``drops.NoDrop`` when there is no data file, ``drops.NotReady`` when a marker is not
    there."""
    expanded = os.path.expanduser(path)
    top = _top(expanded)
    globbed = any(c in expanded for c in "*?[")
    if globbed:
        files = sorted(p for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
    elif os.path.isdir(expanded):
        files = sorted(str(p) for p in Path(expanded).rglob("*") if p.is_file())
    elif os.path.isfile(expanded):
        files = [expanded]
    else:
        raise drops.NoDrop(key, f"file not found: {path}")
    if globbed or os.path.isdir(expanded):
        hidden = [f for f in files if drops.hidden(f[len(top) :])]
        if hidden and log:
            log(f"snapshot: {path}: {len(hidden)} hidden file(s) not read (a path segment starting with _ or .)")
        shown = set(files) - set(hidden)
        files = [f for f in files if f in shown]
    files = [f for f in files if f.endswith(datasets.DATA_SUFFIXES)]
    if not files:
        *most, last = datasets.DATA_SUFFIXES
        raise drops.NoDrop(key, f"no {', '.join(most)} or {last} file under {path}")
    if ready:

        def marker(directory: str) -> float | None:
            found = Path(directory or ".") / ready
            return found.stat().st_mtime if found.is_file() else None

        times = {f: os.stat(f).st_mtime for f in files}
        late = drops.check_ready(times, marker, top, ready, key=key, uri=path, shown=str, log=log)
        files = [f for f in files if f not in late]
        if not files:
            raise drops.NotReady(key, f"{path}: not ready: every data file was written after its {ready}")
    items: list[Item] = []
    for name in files:
        data = Path(name).read_bytes()
        items.append({"uri": str(Path(name).resolve()), "generation": _sha(data), "size": len(data)})
    return items


def _top(expanded: str) -> str:
    """The directory a local dataset's names are below (with its ``/``): ``DIR/`` itself, a glob's literal start's,
    a file's."""
    if os.path.isdir(expanded):
        return expanded.rstrip("/") + "/"
    wild = [expanded.find(c) for c in "*?[" if c in expanded]
    return drops.marker_dir(expanded[: min(wild)] if wild else expanded)


def _read_local(item: Item) -> bytes:
    data = Path(item["uri"]).read_bytes()
    if _sha(data) != item["generation"]:
        raise SpecError("train.dataset", f"{item['uri']} changed since the run's snapshot")
    return data


def list_items(
    source: str, key: str, ready: str = "", log: Callable[[str], None] | None = None
) -> tuple[str, list[Item]]:
    """(kind, items) of a rendered dataset: local files or Cloud Storage objects, each {uri, generation, size}, read
    only once the marker ``ready`` is there when it is named."""
    kind = datasets.kind(source)
    if kind == "local":
        return kind, _local_items(source, key, ready, log)
    if kind == "gcs":
        from components.data import gcs

        return kind, gcs.list_objects(source, field=key, ready=ready, log=log)
    raise ValueError(f"{kind} has no items")


# ---------------------------------------------------------------- reading: examples of an item


def parse(name: str, data: bytes | BinaryIO, key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line or row number, example) of one file's bytes (or a buffered stream of them) by its suffix: JSON Lines
    (``.jsonl``; ``.json`` may also be one JSON array), gzip-compressed JSON Lines (``.jsonl.gz``) or Parquet; a
    malformed one a SpecError naming the item and line. JSON Lines is parsed a line at a time as the stream comes, so
    a large object is never held whole; a JSON array or Parquet file is."""
    stream = io.BufferedReader(io.BytesIO(data)) if isinstance(data, bytes | bytearray) else data
    name, stream = drops.decompress(name, stream, key)
    if name.endswith(".parquet"):
        yield from _parquet(name, stream.read(), key)
        return
    if name.endswith(".json"):
        text = stream.read().decode("utf-8", errors="replace")
        if text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as exc:
                raise SpecError(key, f"{name}: not JSON: {exc}") from None
            yield from enumerate(rows, start=1)
            return
        lines: Iterable[bytes | str] = text.split("\n")
    else:
        lines = stream
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(key, f"{name}, line {number}: not JSON Lines: {exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise SpecError(key, f"{name}, line {number}: not UTF-8: {exc.reason}") from None


def _parquet(name: str, data: bytes, key: str) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError(key, f"{name}: reading Parquet needs pyarrow, which this image lacks") from None
    try:
        batches = pq.ParquetFile(io.BytesIO(data)).iter_batches()
        number = 0
        for batch in batches:  # a batch of rows at a time, not the whole table as Python objects
            for row in batch.to_pylist():
                number += 1
                yield number, row
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors for a file that is not Parquet
        raise SpecError(key, f"{name}: not Parquet: {exc}") from None


def check_example(where: str, example: Any, key: str) -> dict[str, Any]:
    """The example, when it is an object with every field the prompt needs as non-empty text."""
    if not isinstance(example, dict):
        raise SpecError(key, f"{where}: an example is a JSON object, got {type(example).__name__}")
    missing = [f for f in datasets.FIELDS if not isinstance(example.get(f), str) or not example[f]]
    if missing:
        shown = json.dumps(example, default=str)[:200]
        raise SpecError(
            key,
            f"{where}: the example lacks {', '.join(missing)} (the prompt needs {', '.join(datasets.FIELDS)}): {shown}",
        )
    return example


READERS = 16  # Cloud Storage objects read at once: each read is a round trip, mostly waiting
# Objects read ahead of the one being parsed hold at most this many bytes between them; an object larger than
# STREAMED is not read ahead but parsed as it downloads (JSON Lines a line at a time), so the snapshot's memory is
# bounded by one object (and its parse), not by the dataset.
PREFETCH_BYTES = 64 * 2**20
STREAMED = 16 * 2**20


def read_items(kind: str, items: list[Item], key: str, log: Callable[[str], None]) -> Iterator[dict[str, Any]]:
    """Every example of the items, in order, each checked; each item's count kept in it (``num_examples``). Cloud
    Storage objects are read ``READERS`` at a time, ahead of the parse by at most ``PREFETCH_BYTES``; one larger than
    ``STREAMED`` is parsed as it downloads."""
    if kind == "gcs":
        from components.data import gcs

        downloads = gcs.Downloads(key)
        contents: Iterator[bytes | BinaryIO] = _ahead(items, downloads.read, downloads.open, READERS)
    else:
        contents = _ahead(items, _read_local, None, 1)
    yield from _examples(items, contents, key, log)


def _ahead(
    items: list[Item],
    fetch: Callable[[Item], bytes],
    opener: Callable[[Item], AbstractContextManager[BinaryIO]] | None,
    readers: int,
) -> Iterator[bytes | BinaryIO]:
    """Each item's bytes (``fetch``), or a stream of them (``opener``, a context manager) for one larger than
    ``STREAMED``, in order; up to ``readers`` fetched at once, ahead of the consumer by at most ``PREFETCH_BYTES``
    (and at least one item)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    window: deque[tuple[Item, Future[bytes] | None]] = deque()  # (item, its future, or None: streamed in its turn)
    held, index = 0, 0
    with ThreadPoolExecutor(readers) as pool:
        while index < len(items) or window:
            while index < len(items) and len(window) < 4 * readers:
                item, size = items[index], int(items[index].get("size") or 0)
                if opener is not None and size > STREAMED:
                    window.append((item, None))
                elif not held or held + size <= PREFETCH_BYTES:
                    window.append((item, pool.submit(fetch, item)))
                    held += size
                else:
                    break
                index += 1
            item, future = window.popleft()
            if future is None:
                assert opener is not None  # only an item with an opener is streamed
                with opener(item) as stream:
                    yield stream
                    while stream.read(2**20):  # the rest, checked, and the connection free for the next
                        pass
            else:
                data = future.result()
                held -= int(item.get("size") or 0)
                yield data


def _examples(
    items: list[Item], contents: Iterable[bytes | BinaryIO], key: str, log: Callable[[str], None]
) -> Iterator[dict[str, Any]]:
    for index, (item, data) in enumerate(zip(items, contents, strict=True), start=1):
        count = 0
        for number, example in parse(item["uri"], data, key):
            count += 1
            yield check_example(f"{item['uri']}, line {number}", example, key)
        if not count:  # a writer's empty shard (a task with no rows still writes its part file)
            log(f"snapshot: warning: {item['uri']}: no examples, skipped")
        item["num_examples"] = count
        if index % 500 == 0:
            log(f"snapshot: read {index}/{len(items)} files")


# ---------------------------------------------------------------- the snapshot


def _heldout(example: dict[str, Any]) -> bool:
    number = int(hashlib.sha256(example["instruction"].encode()).hexdigest()[:8], 16)
    return number % 100 < HELDOUT_PERCENT


def job_project(spec: RunSpec) -> str:
    """Where the run's BigQuery jobs run and bill: ``train.bigquery_project``, else the run's ``gke.project``; ""
    (the table's own project) when neither is set, as on a local run without a project."""
    return spec.train.bigquery_project or spec.gke.project


def _bigquery(
    spec: RunSpec, source: str, key: str, when: datetime, since: dict[str, Any] | None, log: Callable[[str], None]
) -> tuple[TableSnapshot, Iterator[dict[str, Any]]]:
    """The table's snapshot and its rows, as they are read; with ``since`` (the champion's manifest), only what it
    did not have: of the table the champion read, the rows committed since its table snapshot (APPENDS), else those
    past its ``max_time``; of another table (a dated table's new day), every row, as a new drop's."""
    from components.data import bigquery

    t = spec.train
    table = bigquery.parse_table(source, key)
    bq_filter, column = (t.dataset_filter, t.dataset_time_column) if key == "train.dataset" else ("", "")
    # As of the schedule's time, or a minute ago: BigQuery refuses a time travel into its own future, which a clock
    # a little ahead of its would ask for.
    at = min(when, datetime.now(UTC) - timedelta(minutes=1))
    champion = _champion_table(since, table)
    if since is not None and champion is None:
        log(f"snapshot: {key}: {table} is not the table the champion read ({since.get('dataset')}): read whole")
    snap = bigquery.snapshot(
        table,
        field=key,
        at=at,
        filter=bq_filter,
        time_column=column,
        after=since.get("max_time") if since is not None and champion is not None else None,
        since=champion,
        incremental=since is not None,
        project=job_project(spec),
        results_dataset=t.bigquery_results_dataset,
        log=log,
    )
    read = bigquery.rows(snap, field=key, log=log)
    rows = (check_example(f"{table} row {i}", row, key) for i, row in enumerate(read, 1))
    return snap, rows


def _champion_table(since: dict[str, Any] | None, table: str) -> TableSnapshot | None:
    """The champion's snapshot of ``table`` (its manifest's ``train.table``) when the champion read that table; None
    when it read another (a dated table's other day), another kind of source, or there is no champion. Its
    ``max_time`` is that table's high-water mark, and no other table's: a mark carried to another table would skip
    each of its rows not past it."""
    snap = ((since or {}).get("train") or {}).get("table")
    # a manifest's train.table, read back from its JSON: the TableSnapshot bigquery.snapshot made
    return cast("TableSnapshot", snap) if isinstance(snap, dict) and snap.get("table") == table else None


def _side(
    spec: RunSpec,
    key: str,
    source: str,
    when: datetime,
    since: dict[str, Any] | None,
    log: Callable[[str], None],
    hub_token: str | None = None,
) -> tuple[Side, Iterator[dict[str, Any]]]:
    """One dataset's part of the manifest (its ``num_examples`` set once the examples are read) and its examples, as
    they are read: everything, or what ``since`` (the champion's manifest) did not have. A hub dataset's side is its
    split ``train.train_split`` (``key`` ``train.dataset``) or ``train.eval_split``."""
    kind = datasets.kind(source)
    if kind == "hub":
        from components.data import hub

        field = "train.train_split" if key == "train.dataset" else "train.eval_split"
        split = spec.train.train_split if key == "train.dataset" else spec.train.eval_split
        part, hub_rows = hub.side(source, split, field, hub_token, log)
        return part, (check_example(f"{source} {split} row {i}", row, key) for i, row in enumerate(hub_rows, 1))
    if kind == "bigquery":
        snap, rows = _bigquery(spec, source, key, when, since, log)
        identity = {k: snap.get(k) for k in ("table", "snapshot_time", "filter", "time_column", "after")}
        if snap.get("appended_after"):  # the rows committed since then: another read than ``after``'s
            identity["appended_after"] = snap["appended_after"]
        part = {"kind": kind, "source": source, "table": snap, "items": [], "num_examples": 0}
        part["identity"] = identity
        return part, iter(rows)
    ready = spec.train.dataset_ready if key == "train.dataset" else ""
    kind, items = list_items(source, key, ready, log)
    seen = set((since or {}).get("seen", []))
    new = [item for item in items if f"{item['uri']}#{item['generation']}" not in seen]
    log(f"snapshot: {source}: {len(items)} files" + (f", {len(new)} new since the champion" if since else ""))
    part = {"kind": kind, "source": source, "items": new, "num_examples": 0}
    part["identity"] = [{"uri": item["uri"], "generation": item["generation"], "size": item["size"]} for item in new]
    return part, read_items(kind, new, key, log)


def example_key(example: dict[str, Any]) -> bytes:
    """What makes two examples the same one: their prompt fields (``datasets.FIELDS``), each with its whitespace
    normalised (runs of spaces, tabs and line breaks one space, none at either end); a 16-byte digest."""
    fields = [" ".join(str(example[f]).split()) for f in datasets.FIELDS]
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode()).digest()[:16]


class Keys:
    """The keys (:func:`example_key`) of every training example a lineage has seen, as its key file holds them: one
    sorted run of ``KEY_BYTES``-byte keys, each once, nothing else. Held as that one bytes object (16 bytes a key, no
    object per key, never copied) and looked up by binary search over it, each probe a 16-byte slice."""

    def __init__(self, blob: bytes) -> None:
        if len(blob) % KEY_BYTES:
            raise ValueError(f"{len(blob)} bytes are not a whole number of {KEY_BYTES}-byte keys")
        self.blob = blob

    def __len__(self) -> int:
        return len(self.blob) // KEY_BYTES

    def __iter__(self) -> Iterator[bytes]:
        return (self.blob[i : i + KEY_BYTES] for i in range(0, len(self.blob), KEY_BYTES))

    def __contains__(self, key: object) -> bool:
        blob, low, high = self.blob, 0, len(self)
        while low < high:
            mid = (low + high) // 2
            at = blob[mid * KEY_BYTES : mid * KEY_BYTES + KEY_BYTES]
            if at == key:
                return True
            if at < key:  # type: ignore[operator]  # a key is bytes; anything else is in no key file
                low = mid + 1
            else:
                high = mid
        return False


LINEAGE_CHUNK = 65536  # keys written at a time (1 MiB): what the merge holds of its output


def lineage(seen: Keys | None, examples: Iterable[dict[str, Any]], path: str) -> tuple[str, int]:
    """Write the key file of a run's lineage to ``path``: the keys of ``examples`` (the examples the run trains on)
    and ``seen`` (the champion's, when it was read), sorted, each once, as a streamed merge of the two sorted runs, a
    chunk of ``LINEAGE_CHUNK`` keys at a time (the champion's file is held once, as :class:`Keys`; the output never
    whole). Returns its digest (:func:`file_digest` of its bytes) and its number of keys. The file grows by
    ``KEY_BYTES`` (16) bytes for each distinct example the lineage ever trained on (docs/recurring.md)."""
    import heapq

    mine = sorted({example_key(e) for e in examples})
    theirs = iter(seen) if seen is not None else iter(())
    sha, count, last, chunk = hashlib.sha256(), 0, b"", []
    with open(path, "wb") as out:
        for key in heapq.merge(theirs, mine):
            if key != last:
                chunk.append(key)
                last = key
                if len(chunk) == LINEAGE_CHUNK:
                    data = b"".join(chunk)
                    out.write(data)
                    sha.update(data)
                    count, chunk = count + len(chunk), []
        data = b"".join(chunk)
        out.write(data)
        sha.update(data)
    return "sha256:" + sha.hexdigest(), count + len(chunk)


class Spool:
    """Examples kept in a temporary local file as they come, one JSON line each (``jsonl``'s form, as the run's
    store keeps them), so a snapshot of any size holds none of them in memory: iterated again from the file, counted
    (``len``), its ``path`` uploaded as it is; equal to a list of the same examples. The file goes with the spool."""

    def __init__(self) -> None:
        import tempfile

        self._file = tempfile.NamedTemporaryFile("w+b", prefix="tpupipe-snapshot-", suffix=".jsonl")
        self._count = 0

    @property
    def path(self) -> str:
        """The file, with everything appended so far in it."""
        self._file.flush()
        return self._file.name

    def append(self, example: dict[str, Any]) -> None:
        self._file.write(json.dumps(example, sort_keys=True, default=str).encode() + b"\n")
        self._count += 1

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with open(self.path, "rb") as lines:
            for line in lines:
                yield json.loads(line)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Spool | list) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def close(self) -> None:
        self._file.close()


def _check_dated(spec: RunSpec, when: datetime, exc: drops.NoDrop) -> None:
    """A missing drop is a day without one only when the dataset is dated (a date form: ``{date}``, ``{date-1}``,
    ``{date:%Y%m%d}``) and the directory its dated part is in exists, or for a dated BigQuery table its dataset: else
    ``exc`` (no drop can ever be there: a URI without a date form), or a SpecError naming the missing directory or
    dataset (a mistyped URI)."""
    template = spec.train.dataset
    if not datasets.dated(template):
        raise exc
    if datasets.kind(template) == "bigquery":
        from components.data import bigquery

        table = bigquery.parse_table(datasets.render(template, when), "train.dataset")
        dataset = table.rsplit(".", 1)[0]
        if not bigquery.dataset_exists(dataset, job_project(spec) or table.rsplit(".", 2)[0]):
            raise SpecError(
                "train.dataset",
                f"{datasets.render(template, when)}: no drop, and the dataset {dataset}, where the dated tables are, "
                "does not exist: is the URI right?",
            )
        return
    parent = datasets.render(drops.dated_parent(template), when)
    if datasets.kind(parent) == "gcs":
        from components.data import gcs

        there = gcs.has_objects(parent, "train.dataset")
    else:
        there = os.path.isdir(os.path.expanduser(parent or "."))
    if not there:
        raise SpecError(
            "train.dataset",
            f"{datasets.render(template, when)}: no drop, and nothing is under {parent}, where the dated drops are: "
            "is the URI right?",
        )


def take(
    spec: RunSpec,
    when: datetime,
    champion: dict[str, Any] | None = None,
    champion_ref: str = "",
    log: Callable[[str], None] = print,
    hub_token: str | None = None,
    seen_keys: Keys | None = None,
) -> tuple[dict[str, Any], Spool, Spool | Rows]:
    """(manifest, train examples, held-out examples) of the run's snapshotted data as of ``when`` (the schedule's
    time), against ``champion`` (the champion's manifest) when ``train.data_since=champion``. A manifest with
    ``skip`` set is a run with nothing new: its examples are empty.

    The examples are read as they come into local spools (:class:`Spool`), never all in memory. An example whose
    prompt fields (whitespace normalised: :func:`example_key`) repeat an earlier one's is a duplicate, dropped
    (``duplicates`` in the manifest); a training example that is also in the evaluation set (a fixed
    ``train.eval_dataset``, a hub dataset's ``train.eval_split``, or the held-out share) is evaluation data the model
    would otherwise learn: dropped from training with a warning line giving the count (``eval_overlap``). With
    ``train.data_since=champion``, an example whose key is in ``seen_keys`` (the champion's lineage's key file,
    :class:`Keys`) was trained on before: dropped and counted (``champion_duplicates``), whichever item or rows it
    came in again (a rewritten object, a table truncated and reloaded: each read anew as new). ``hub_token``: the
    pipeline side's Hugging Face token, for a gated hub dataset."""
    t = spec.train
    source = datasets.render(t.dataset, when)
    since = champion if t.data_since == "champion" else None
    read, duplicates = Spool(), 0
    keys: set[bytes] = set()  # every example's key (example_key) read so far
    fields: set[str] = set()
    seen = seen_keys if since is not None else None
    again = 0  # examples the champion's lineage already saw
    try:  # the listing (a table's lookup) alone: a drop not there is told before any example is read
        part, examples = _side(spec, "train.dataset", source, when, since, log, hub_token)
    except drops.NoDrop as exc:
        if t.data_since != "champion":
            raise
        _check_dated(spec, when, exc)
        # A schedule's day without its drop is a day with nothing new.
        part = {"kind": datasets.kind(source), "source": source, "items": [], "num_examples": 0, "identity": []}
        absent, examples = str(exc).removeprefix(f"{exc.field}: "), iter(())
    else:
        absent = ""
    for example in examples:
        key = example_key(example)
        if key in keys:
            duplicates += 1
            continue
        keys.add(key)
        if seen is not None and key in seen:
            again += 1
            continue
        fields.update(example)
        read.append(example)
    part["num_examples"] = len(read) + duplicates + again
    if again:
        log(f"snapshot: {source}: {again} example(s) the champion's lineage already saw dropped (champion_duplicates)")
    manifest: dict[str, Any] = {
        "version": MANIFEST_VERSION,
        "dataset": source,
        "taken": when.isoformat(),
        "since": {"champion": champion_ref, "digest": (champion or {}).get("digest")} if since else None,
        "train": {k: v for k, v in part.items() if k != "identity"},
    }
    if not read:
        if since is None and not absent:
            raise SpecError("train.dataset", f"{source}: no examples")
        manifest["skip"] = (
            f"nothing to read: {absent}"
            if absent
            else f"no examples since champion {champion_ref}, snapshot {(champion or {}).get('digest')}"
            + (f" ({again} read again, every one already seen)" if again else "")
        )
        manifest["champion_duplicates"] = again
        manifest["digest"] = digest(part["identity"])
        return manifest, read, []
    if duplicates:
        log(f"snapshot: {source}: {duplicates} duplicate example(s) dropped (the same prompt fields as an earlier one)")
    train = Spool()
    heldout: Spool | Rows
    fixed = t.eval_dataset or (f"{source} {t.eval_split}" if part["kind"] == "hub" else "")
    if fixed:
        eval_key = "train.eval_dataset" if t.eval_dataset else "train.eval_split"
        eval_source = t.eval_dataset or source  # a fixed set names no day (components.spec.checks)
        eval_part, eval_rows = _side(spec, eval_key, eval_source, when, None, log, hub_token)
        heldout = list(eval_rows)  # an evaluation set is read whole: the evaluate stage scores all of it at once
        eval_part["num_examples"] = len(heldout)
        if not heldout:
            raise SpecError(eval_key, f"{fixed}: no examples")
        # Its identity is its content: the same examples on another day (a table read at another snapshot time, an
        # object uploaded again byte for byte) are the same set; "pinned" is what this run read them as.
        eval_part["pinned"] = digest(eval_part.pop("identity"))
        eval_part["digest"] = content_digest(heldout)
        manifest["eval"] = eval_part
        held = {example_key(e) for e in heldout}
        candidates: Iterable[dict[str, Any]] = read
    else:
        heldout = Spool()
        for example in read:
            if _heldout(example):
                heldout.append(example)
        held = {example_key(e) for e in heldout}
        candidates = (e for e in read if not _heldout(e))
        manifest["eval"] = None
    overlap, tokens = 0, 0
    for example in candidates:
        if example_key(example) in held:
            overlap += 1
            continue
        train.append(example)
        tokens += len(example["instruction"]) + len(example["response"])
    read.close()
    if overlap:
        log(
            f"snapshot: warning: {source}: {overlap} training example(s) also in the evaluation set "
            f"({fixed or f'the {HELDOUT_PERCENT}% held out'}) dropped from training"
        )
    if not fixed and (not heldout or not train):
        raise SpecError(
            "train.eval_dataset",
            f"{len(heldout) + len(train)} examples of {source} hold out {len(heldout)} ({HELDOUT_PERCENT}% by their "
            f"instruction's digest) and leave {len(train)} to train on: name a fixed evaluation set",
            ["train.eval_dataset=gs://BUCKET/eval/", "train.eval_dataset=DIR/"],
        )
    if not train:
        raise SpecError(
            "train.dataset",
            f"{source}: every one of its examples is also in the evaluation set {fixed}: nothing to train on",
        )
    keys_seen = [f"{item['uri']}#{item['generation']}" for item in part["items"]]
    manifest["seen"] = sorted(set((since or {}).get("seen", [])) | set(keys_seen))
    if part["kind"] == "bigquery":
        from components.data import bigquery

        # the newest either saw of this table: rows read by commit time may all be older than the champion's newest
        mark = (since or {}).get("max_time") if _champion_table(since, part["table"]["table"]) else None
        manifest["max_time"] = bigquery.latest(part["table"], mark)
    manifest["num_train_examples"], manifest["num_heldout_examples"] = len(train), len(heldout)
    manifest["duplicates"], manifest["eval_overlap"] = duplicates, overlap
    manifest["champion_duplicates"] = again
    manifest["fields"] = sorted(fields)
    manifest["tokens_estimate"] = tokens // CHARS_PER_TOKEN
    manifest["digest"] = digest(part["identity"])
    return manifest, train, heldout


def jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows).encode()
