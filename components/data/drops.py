"""Drops as the teams that write them lay them out: what of a listed prefix is data, when a drop is complete, and
what a drop that is not there means.

- Hidden paths are never read: a name with a path segment (below the prefix listed) that starts with ``_`` or ``.``
  is a writer's own, as Hadoop's input formats skip them (``FileInputFormat``'s ``hiddenFileFilter``:
  https://github.com/apache/hadoop/blob/rel/release-3.4.0/hadoop-mapreduce-project/hadoop-mapreduce-client/hadoop-mapreduce-client-core/src/main/java/org/apache/hadoop/mapreduce/lib/input/FileInputFormat.java):
  Spark's and Hadoop's job attempts write under ``_temporary/`` until the job commits
  (``FileOutputCommitter``, ``PENDING_DIR_NAME``), and the commit writes ``_SUCCESS`` last
  (``SUCCEEDED_FILE_NAME``, ``mapreduce.fileoutputcommitter.marksuccessfuljobs``:
  https://github.com/apache/hadoop/blob/rel/release-3.4.0/hadoop-mapreduce-project/hadoop-mapreduce-client/hadoop-mapreduce-client-core/src/main/java/org/apache/hadoop/mapreduce/lib/output/FileOutputCommitter.java).
- ``train.dataset_ready`` (say ``_SUCCESS``) names the drop's marker. Hadoop's committer writes it in the job's
  output directory when the job commits, so a prefix that holds several jobs' outputs (a stable prefix of dated
  directories, say) holds one per directory: every directory with data files under the prefix needs the marker in it
  or in a directory above it within the prefix (a partitioned output's ``day=…/lang=…/`` parts are covered by the
  job's one marker) (:func:`check_ready`). A directory below the prefix without its marker, beside others with
  theirs, is a job still writing: its files are not read, a warning names its marker, and the run reads the
  directories that are complete (the next run reads it once it is: its objects are new then). A data object updated
  after its marker was written is a later writer's, not the committed job's: it is not read, and a warning names it.
- A drop that is not there (nothing to read under its prefix, no object or file it names, no such BigQuery table) is
  :class:`NoDrop`: with ``train.data_since=champion`` and a date form in the dataset (``{date}``, ``{date-1}``,
  ``{date:%Y%m%d}``: ``components.spec.datasets.date_forms``), a day without its drop, which the run's snapshot
  makes a run with nothing new (``skip``), as long as the directory the dated part is in exists
  (:func:`dated_parent`), or for a dated table (``events_{date:%Y%m%d}``) its dataset (a missing one is a mistyped
  URI, an error). One without its marker (not one of its
  directories complete) is :class:`NotReady`, an error naming the marker: the writer is late or failed, which a
  person should see, and the next scheduled run reads the next day's drop, not this one.
- ``.jsonl.gz`` is JSON Lines compressed with gzip (:func:`decompress`), inflated as a stream and refused past
  ``MAX_INFLATED`` bytes: whoever may write the drop's bucket could otherwise send a few kilobytes that inflate to
  more than the task's memory (a gzip bomb).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Buffer, Callable, Mapping
from datetime import datetime
from typing import BinaryIO

from components.spec import SpecError, datasets

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


def dated_parent(template: str) -> str:
    """The stable prefix of a dataset (as written, before its date forms are rendered): the part up to the directory
    its first date form (``{date}``, ``{date-1}``, ``{date:%Y/%m/%d}``: ``datasets.first_date``) is in, with its
    ``/`` (``gs://b/drops/{date}/`` and ``gs://b/drops/{date:%Y/%m/%d}/`` -> ``gs://b/drops/``); "" when it has
    none."""
    at = datasets.first_date(template)
    return template[: template.rfind("/", 0, at) + 1] if at >= 0 else ""


def check_ready[T: (float, datetime)](
    names: Mapping[str, T | None],
    marker: Callable[[str], T | None],
    top: str,
    ready: str,
    *,
    key: str,
    uri: str,
    shown: Callable[[str], str],
    log: Callable[[str], None] | None,
) -> set[str]:
    """The data files of ``names`` (name -> its update time) to leave out: those updated after their marker, and
    those of a directory below ``top`` without one while other directories have theirs. Each file's marker is
    ``ready`` in its directory or the nearest one above it, up to ``top`` (the listed prefix's directory);
    ``marker(directory)`` is that marker's update time, None where there is none. Under a stable prefix of several
    jobs' directories, one without its marker is a job still writing: left out with a warning naming the marker, as
    a directory written after the listing would be, and the run reads the others. :class:`NotReady` naming the
    markers (``shown``: a name as the user writes it) when no data file has one, or a file directly in ``top`` lacks
    it (the drop itself is not ready)."""
    missing: dict[str, list[str]] = {}
    late: set[str] = set()
    for name, updated in names.items():
        here = where = marker_dir(name)
        written = marker(where)
        while written is None and where != top and where.startswith(top) and where:
            where = marker_dir(where[:-1])
            written = marker(where)
        if written is None:
            missing.setdefault(here, []).append(name)
        elif updated is not None and updated > written:
            late.add(name)
    if missing and (top in missing or sum(map(len, missing.values())) == len(names)):
        listed = sorted(missing)
        raise NotReady(
            key,
            f"{uri}: not ready: {', '.join(shown(d + ready) for d in listed[:3])}{', ...' if len(listed) > 3 else ''} "
            f"(train.dataset_ready) {'is' if len(listed) == 1 else 'are'} not there, so the drop is not read",
        )
    if missing and log:
        listed = sorted(missing)
        files = sum(map(len, missing.values()))
        log(
            f"snapshot: warning: {uri}: {', '.join(shown(d + ready) for d in listed[:3])}"
            f"{', ...' if len(listed) > 3 else ''} (train.dataset_ready) {'is' if len(listed) == 1 else 'are'} not "
            f"there yet: {files} data file(s) there not read (still being written); the other directories are"
        )
    if late and log:
        listed = sorted(late)
        log(
            f"snapshot: warning: {uri}: {len(listed)} object(s) updated after their {ready} (train.dataset_ready) "
            f"not read: {', '.join(shown(n) for n in listed[:3])}{', ...' if len(listed) > 3 else ''}"
        )
    return late | {name for names_ in missing.values() for name in names_}


def decompress(name: str, stream: BinaryIO, key: str) -> tuple[str, BinaryIO]:
    """(the name without ``.gz``, a stream of the data) of a ``.gz`` file (``stream``: buffered, with ``peek``),
    inflated as it is read (:func:`inflated`); others as they are. Data that is not gzip (an object stored with
    ``Content-Encoding: gzip`` that Cloud Storage served decompressed:
    https://cloud.google.com/storage/docs/transcoding) is taken as it is."""
    if not name.endswith(".gz"):
        return name, stream
    if stream.peek(2)[:2] != GZIP_MAGIC:  # type: ignore[attr-defined]  # a buffered stream's; BinaryIO names no peek
        return name[:-3], stream
    return name[:-3], inflated(stream, name, key)


def inflated(stream: BinaryIO, name: str, key: str) -> BinaryIO:
    """The inflated bytes of the gzip ``stream`` (of the file ``name``), as they are read: a ``CHUNK`` at a time,
    every member of a multi-member file (RFC 1952 section 2.2), and refused, naming the file and ``key``, once past
    ``MAX_INFLATED`` bytes, when the data is not gzip, or when the stream ends before its last member does."""
    return io.BufferedReader(_Inflated(gzip.GzipFile(fileobj=stream), name, key), CHUNK)


class _Inflated(io.RawIOBase):
    """A gzip stream's inflated bytes, counted: SpecError past ``MAX_INFLATED``, or for data that is not gzip."""

    def __init__(self, gz: gzip.GzipFile, name: str, key: str) -> None:
        self.gz, self.name, self.key, self.inflated = gz, name, key, 0

    def readable(self) -> bool:
        return True

    def readinto(self, into: Buffer) -> int:
        try:
            n = self.gz.readinto(into)
        except EOFError:  # the stream ended inside a member: the object was cut short when written
            raise SpecError(
                self.key,
                f"{self.name}: truncated: the gzip stream ends after {self.inflated} inflated bytes, before its "
                "end-of-stream marker (RFC 1952 section 2.2: a member ends with its CRC32 and size); the object is "
                "incomplete: write it again whole",
            ) from None
        except (OSError, zlib.error) as exc:  # gzip.BadGzipFile (an OSError) or damaged deflate data
            raise SpecError(self.key, f"{self.name}: not gzip, or damaged: {exc}") from None
        self.inflated += n
        if self.inflated > MAX_INFLATED:
            raise SpecError(
                self.key,
                f"{self.name}: inflates to more than {MAX_INFLATED} bytes, the most one gzip shard may "
                "(components.data.drops.MAX_INFLATED): not read; split it into smaller shards",
            )
        return n
