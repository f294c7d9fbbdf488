"""Drops as the teams that write them lay them out: what of a listed prefix is data, when a drop is complete, and
what a drop that is not there means.

- Hidden paths are never read: a name with a path segment (below the prefix listed) that starts with ``_`` or ``.``
  is a writer's own, as Hadoop's input formats skip them (``FileInputFormat``'s ``hiddenFileFilter``:
  https://github.com/apache/hadoop/blob/rel/release-3.4.0/hadoop-mapreduce-project/hadoop-mapreduce-client/hadoop-mapreduce-client-core/src/main/java/org/apache/hadoop/mapreduce/lib/input/FileInputFormat.java):
  Spark's and Hadoop's job attempts write under ``_temporary/`` until the job commits
  (``FileOutputCommitter``, ``PENDING_DIR_NAME``), and the commit writes ``_SUCCESS`` last
  (``SUCCEEDED_FILE_NAME``, ``mapreduce.fileoutputcommitter.marksuccessfuljobs``:
  https://github.com/apache/hadoop/blob/rel/release-3.4.0/hadoop-mapreduce-project/hadoop-mapreduce-client/hadoop-mapreduce-client-core/src/main/java/org/apache/hadoop/mapreduce/lib/output/FileOutputCommitter.java).
- ``train.dataset_ready`` (say ``_SUCCESS``) names the drop's marker: the drop is read only once its marker exists,
  checked before the drop is listed, so what is listed was complete when the marker was written.
- A drop that is not there (nothing to read under its prefix, no object or file it names) is :class:`NoDrop`; one
  without its marker :class:`NotReady`. Both are SpecErrors naming the field; with ``train.data_since=champion`` the
  run's snapshot makes either a run with nothing new (``skip``), as a schedule's day without data is.
- ``.jsonl.gz`` is JSON Lines compressed with gzip (:func:`decompress`), inflated as a stream and refused past
  ``MAX_INFLATED`` bytes: whoever may write the drop's bucket could otherwise send a few kilobytes that inflate to
  more than the task's memory (a gzip bomb).
"""

from __future__ import annotations

import gzip

from components.spec import SpecError

GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952, section 2.3.1: ID1 ID2
# The most one .gz shard may inflate to. The snapshot holds a shard's inflated bytes while it parses it, beside the
# examples read so far; a Spark or Beam part file is a fraction of this (Spark's default partition is 128 MiB:
# spark.sql.files.maxPartitionBytes), and a larger shard is better split by its writer than read in one piece.
MAX_INFLATED = 2 * 2**30
CHUNK = 2**20  # inflated a MiB at a time, so the cap is checked before more is held


class NoDrop(SpecError):
    """Nothing to read where the dataset points: no data object or file under its prefix, or no object it names."""


class NotReady(SpecError):
    """The drop's marker (``train.dataset_ready``) is not there yet: the writer has not finished."""


def hidden(relative: str) -> bool:
    """Whether a name below the listed prefix (``relative``: the part of the name after it) is a writer's own: a
    path segment that starts with ``_`` or ``.`` (``_temporary/0/part-0``, ``_SUCCESS``, ``.part-0.crc``)."""
    return any(part.startswith(("_", ".")) for part in relative.split("/") if part)


def marker_dir(path: str) -> str:
    """Where a drop's marker is, for a prefix (``p/``, itself), a glob or one object (the directory of its literal
    start): the part of ``path`` up to its last ``/``, with it ("" at the top)."""
    return path[: path.rfind("/") + 1]


def decompress(name: str, data: bytes, key: str) -> tuple[str, bytes]:
    """(the name without ``.gz``, the data) of a ``.gz`` file, decompressed; others as they are. Data that is not
    gzip (an object stored with ``Content-Encoding: gzip`` that Cloud Storage served decompressed:
    https://cloud.google.com/storage/docs/transcoding) is taken as it is. Inflated as a stream, a ``CHUNK`` at a
    time (every member of a multi-member file, RFC 1952 section 2.2), and refused, naming the object, once it passes
    ``MAX_INFLATED`` bytes."""
    import io

    if not name.endswith(".gz"):
        return name, data
    if data[:2] != GZIP_MAGIC:
        return name[:-3], data
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            while chunk := stream.read(CHUNK):
                out += chunk
                if len(out) > MAX_INFLATED:
                    raise SpecError(
                        key,
                        f"{name}: inflates to more than {MAX_INFLATED} bytes ({len(data)} compressed), the most one "
                        "gzip shard may (components.data.drops.MAX_INFLATED): not read; split it into smaller shards",
                    )
    except (OSError, EOFError) as exc:
        raise SpecError(key, f"{name}: not gzip: {exc}") from None
    return name[:-3], bytes(out)
