"""The records a run's data snapshot keeps in its manifest (``components.data.snapshot``), one shape each, shared by
the modules that write them: what a file or an object read is (:class:`Item`), what a dataset's part of the manifest
is (:class:`Side`), and what a BigQuery table's read is (:class:`TableSnapshot`). They are JSON objects: the manifest
is written to the run's store and read back as the champion's, so each field is JSON-able.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Item(TypedDict):
    """A file or an object the run reads, pinned: a local file (``snapshot``), a Cloud Storage object
    (``gcs.list_objects``), a Parquet file of a hub dataset's conversion (``hub``)."""

    uri: str  # the absolute path of a local file, gs://BUCKET/NAME, hf://datasets/ID@COMMIT/PATH
    generation: str  # a file's sha256 digest, an object's generation, a hub file's sha256 (or git sha1)
    size: int  # bytes
    crc32c: NotRequired[str]  # a Cloud Storage object's, base64, as its listing gives it ("" when it gives none)
    updated: NotRequired[str]  # a Cloud Storage object's ``updated``, RFC 3339 ("" when it gives none)
    num_examples: NotRequired[int]  # its examples, once they are read


class TableSnapshot(TypedDict):
    """A BigQuery table's read as of a time (``bigquery.snapshot``; its docstring says what each field is)."""

    table: str  # PROJECT.DATASET.TABLE
    project: str  # where the session and the queries are billed
    snapshot_time: str  # ISO 8601, UTC, with Z
    num_rows: int
    fields: list[str]
    filter: str
    filter_types: dict[str, str]  # a filtered column -> its schema type
    time_column: str
    time_type: str
    after: str | None
    max_time: str | None
    incremental: bool
    session: NotRequired[str]  # the read session's name, and its streams' names and Arrow schema (base64)
    streams: NotRequired[list[str]]
    arrow_schema: NotRequired[str]
    appended_after: NotRequired[str]  # APPENDS: the champion's snapshot time, the results dataset, the table and job
    results_dataset: NotRequired[str]
    appends_table: NotRequired[str]
    appends_job: NotRequired[str]


class Side(TypedDict):
    """A dataset's part of the manifest (``snapshot._side``, ``hub.side``): its ``train`` or ``eval``."""

    kind: str  # components.spec.datasets.kind
    source: str  # the dataset as rendered
    items: list[Item]  # the files or objects read (none for a table)
    num_examples: int  # set once its examples are read
    # What the snapshot's digest is of (left out of the manifest): the items' (uri, generation, size), a table's
    # read, a split's files; JSON values of more than one shape
    identity: NotRequired[list[Item] | dict[str, Any]]
    split: NotRequired[str]  # a hub dataset's split, and the commit of its conversion
    commit: NotRequired[str]
    table: NotRequired[TableSnapshot]  # a BigQuery table's read
    pinned: NotRequired[str]  # a fixed evaluation set's digest of its identity, and of its content
    digest: NotRequired[str]
