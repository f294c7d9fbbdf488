"""Where ``train.dataset`` and ``train.eval_dataset`` point, read from their text alone (no file opened, no call made):
the kind of source, the ``{date}`` placeholder, the fields that go with a kind, and the splits the trainers read.

Kinds:

- ``generated``: the generated task (eight countries' capitals: ``trainers.data``), written by the trainer itself;
- a hub name (``databricks/databricks-dolly-15k``): its splits ``train.train_split`` (trained on) and
  ``train.eval_split`` (held out), read from the hub's Parquet conversion of it (``components.data.hub``);
- local files: a path that starts with ``/``, ``./``, ``../`` or ``~``, ends with a data suffix, or holds a glob
  (``DIR/`` is every data file under it, ``DIR/*.jsonl`` a glob, ``a.jsonl`` one file);
- Cloud Storage: ``gs://BUCKET/PREFIX/`` (every data object under it), ``gs://BUCKET/PATH/*.jsonl`` (a glob) or one
  object;
- BigQuery: ``bq://PROJECT.DATASET.TABLE``, with ``train.dataset_filter`` (``COLUMN=VALUE`` pairs the rows must
  match, never SQL) and ``train.dataset_time_column`` (an ingestion-time column, for ``train.data_since``).

Every kind but ``generated`` is *snapshotted*: the run's first stage, on the pipeline's side, resolves it once to an
immutable list (``components.data``), writes the examples the run trains and evaluates on under the jobs' directory,
and the trainers read those files, the split ``train`` and the split ``heldout`` (a fixed ``train.eval_dataset``, a
hub dataset's ``train.eval_split``, else the examples held out of the new data). No trainer reads a source itself, so
a run's pods never need the internet for data. Local files, Cloud Storage and BigQuery are *drops* too: what is new
in them since the champion can be told (``train.data_since``), and one can be a fixed ``train.eval_dataset``.
"""

from __future__ import annotations

import re
from datetime import datetime

from components.spec.errors import SpecError

GENERATED = "generated"
# The most examples, trained on and held out together, the generated task gives: fewer than its distinct instructions
# (trainers.data.DISTINCT, 28,800: tests/unit/test_data.py), none of which appears twice.
GENERATED_MAX_EXAMPLES = 20_000
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz")  # .jsonl.gz: JSON Lines, gzip-compressed
LOCAL_PREFIXES = ("/", "./", "../", "~")
KINDS = ("generated", "hub", "local", "gcs", "bigquery")
SNAPSHOTTED = ("local", "gcs", "bigquery", "hub")
DROPS = ("local", "gcs", "bigquery")
SCHEMES = {"gs://": "gcs", "bq://": "bigquery"}
# The placeholders a dataset may hold, each with what it becomes. ``{date}``: the pipeline job's scheduled time (UTC),
# its create time for a run no schedule started (components.stages.dataset.run_time).
PLACEHOLDERS = {"date": "the schedule's date, YYYY-MM-DD (UTC)"}
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
SINCE = ("", "champion")
# The trainers' splits of a snapshot: the files the first stage writes under the jobs' directory.
SNAPSHOT_SPLITS = ("train", "heldout")
FIELDS = ("instruction", "response")  # what the prompt format needs of every example (trainers.data.PROMPT)
# A BigQuery column name (https://cloud.google.com/bigquery/docs/schemas#column_names: letters, digits, underscores,
# not starting with a digit, at most 300 characters).
COLUMN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,299}")


def kind(dataset: str) -> str:
    """The kind of source ``dataset`` names (``KINDS``); a scheme tpupipe does not read is a ValueError."""
    if dataset == GENERATED:
        return "generated"
    for scheme, name in SCHEMES.items():
        if dataset.startswith(scheme):
            return name
    if "://" in dataset:
        raise ValueError(f"{dataset.split('://')[0]}:// is not a source tpupipe reads (gs://, bq://, a local path)")
    if dataset.startswith(LOCAL_PREFIXES) or dataset.endswith(DATA_SUFFIXES) or any(c in dataset for c in "*?["):
        return "local"
    return "hub"


def snapshotted(dataset: str) -> bool:
    """Whether the run's first stage snapshots ``dataset`` (local files, Cloud Storage, BigQuery, the hub)."""
    return bool(dataset) and kind(dataset) in SNAPSHOTTED


def is_drop(dataset: str) -> bool:
    """Whether ``dataset`` is a drop (local files, Cloud Storage, BigQuery): new data since the champion can be told
    in it, and it can be a fixed evaluation set."""
    return bool(dataset) and kind(dataset) in DROPS


def placeholders(dataset: str) -> list[str]:
    return _PLACEHOLDER.findall(dataset)


def render(dataset: str, when: datetime) -> str:
    """``dataset`` with ``{date}`` replaced by ``when``'s UTC date."""
    return dataset.replace("{date}", when.strftime("%Y-%m-%d"))


def splits(dataset: str, train_split: str, eval_split: str) -> tuple[str, str]:
    """The (train, evaluation) splits the trainers read: a snapshot's two files, else the spec's own."""
    return SNAPSHOT_SPLITS if snapshotted(dataset) else (train_split, eval_split)


def row_filter(text: str, field: str = "train.dataset_filter") -> list[tuple[str, str]]:
    """``COLUMN=VALUE[,COLUMN=VALUE...]`` as its (column, value) pairs: the rows kept are those whose every column
    equals its value. No SQL: the column is a name checked here (and against the table's schema at the snapshot), the
    value reaches BigQuery as a query parameter, never as query text, so a filter cannot read another table (a
    subquery), call a function or end the statement. A SpecError naming ``field`` otherwise."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(",") if text else []:
        column, eq, value = part.partition("=")
        column = column.strip()
        if not eq or not COLUMN.fullmatch(column):
            raise SpecError(
                field,
                f"{part!r} is not COLUMN=VALUE: a filter is the columns' values the rows must have, not SQL",
                ["category=math", "lang=en,source=docs"],
            )
        if column in dict(pairs):
            raise SpecError(field, f"column {column!r} named twice")
        pairs.append((column, value.strip()))
    return pairs
