"""Where ``train.dataset`` and ``train.eval_dataset`` point, read from their text alone (no file opened, no call made):
the kind of source, its date forms (``{date}``, ``{date-1}``, ``{date:%Y%m%d}``: :func:`date_forms`), the fields that
go with a kind, and the splits the trainers read.

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
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from components.spec.errors import SpecError

GENERATED = "generated"
# The most examples, trained on and held out together, the generated task gives: its 40-odd questions repeat
# (trainers/data.py), so more would teach nothing new, and every job writes and reads them whole.
GENERATED_MAX_EXAMPLES = 20_000
DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz")  # .jsonl.gz: JSON Lines, gzip-compressed
LOCAL_PREFIXES = ("/", "./", "../", "~")
KINDS = ("generated", "hub", "local", "gcs", "bigquery")
SNAPSHOTTED = ("local", "gcs", "bigquery", "hub")
DROPS = ("local", "gcs", "bigquery")
SCHEMES = {"gs://": "gcs", "bq://": "bigquery"}
# The placeholders a dataset may hold: date forms only (:func:`date_forms`), each the day of the pipeline job's
# scheduled time (UTC), its create time for a run no schedule started (components.stages.dataset.run_time), or N days
# before it, written as the schedule's YYYY-MM-DD or in a strftime format of date directives.
DATE_FORMS = ("{date}", "{date-N}", "{date:FMT}", "{date-N:FMT}")
DATE_EXAMPLES = ["{date}", "{date-1}", "{date:%Y%m%d}", "{date-7:%Y/%m/%d}"]
DEFAULT_DATE_FORMAT = "%Y-%m-%d"
MAX_DAYS_BEFORE = 366  # a year back, leap day included
# The directives of Python's strftime (https://docs.python.org/3.12/library/datetime.html#format-codes) whose value is
# the day's alone; every other directive (%H %M %S %f %p %z %Z %I %c %X %x and those C libraries add) is refused: a
# {date} form names a day, never a time or a locale's text.
DATE_DIRECTIVES = "YmdjybBaAUWGVuw%"
# The names %a %A %b %B stand for, as the C locale writes them (strftime's "Locale's full weekday name", ..., "en_US"
# and C alike in the format codes' table above), rendered here rather than by strftime, which takes the process's
# LC_TIME: a library that calls setlocale would otherwise move a dataset's path.
DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTH_NAMES = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
    "December",
)  # fmt: skip
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_DATE_FORM = re.compile(r"date(?:-(?P<days>[0-9]+))?(?::(?P<format>.*))?", re.DOTALL)
# A BigQuery table name: at most 1,024 UTF-8 bytes of Unicode letters, marks, numbers, connectors, dashes and spaces
# (categories L, M, N, Pc, Pd, Zs: https://cloud.google.com/bigquery/docs/tables#table_naming).
TABLE_CATEGORIES = ("L", "M", "N", "Pc", "Pd", "Zs")
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
    """What is between the braces of each ``{...}`` in ``dataset``, in order."""
    return _PLACEHOLDER.findall(dataset)


@dataclass(frozen=True)
class DateForm:
    """One date form of a dataset: ``{date-DAYS:FORMAT}`` at ``start`` (the index of its ``{``)."""

    text: str  # as written, braces included
    start: int
    days: int  # how many days before the schedule's date
    format: str  # the strftime format of date directives it is written in

    def day(self, when: datetime) -> str:
        """The day this form stands for, of a run whose schedule time is ``when`` (UTC when it has a time zone); the
        names of ``%a %A %b %B`` in English, whatever the process's locale (``DAY_NAMES``, ``MONTH_NAMES``)."""
        on = (when.astimezone(UTC) if when.tzinfo else when).date() - timedelta(days=self.days)
        names = {
            "%A": DAY_NAMES[on.weekday()],
            "%a": DAY_NAMES[on.weekday()][:3],
            "%B": MONTH_NAMES[on.month - 1],
            "%b": MONTH_NAMES[on.month - 1][:3],
        }
        parts = re.split(r"(%.)", self.format)  # each directive its own part (a checked format ends in none)
        return "".join(names.get(part) or (on.strftime(part) if part else "") for part in parts)


def date_form(text: str, start: int = 0, field: str = "train.dataset") -> DateForm:
    """The date form ``text`` (``{date}``, ``{date-N}``, ``{date:FMT}``, ``{date-N:FMT}``, braces included), checked:
    N from 1 to ``MAX_DAYS_BEFORE``, FMT date directives (``DATE_DIRECTIVES``) and literal text. A SpecError naming
    ``field`` and the form otherwise."""
    match = _DATE_FORM.fullmatch(text[1:-1])
    if match is None:
        raise SpecError(field, f"unknown placeholder {text}: the placeholders are date forms", DATE_FORMS)
    days = int(match["days"] or 0)
    if match["days"] is not None and not 1 <= days <= MAX_DAYS_BEFORE:
        raise SpecError(
            field, f"{text}: N in {{date-N}} is a number of days from 1 to {MAX_DAYS_BEFORE}", DATE_EXAMPLES
        )
    format = match["format"]
    if format is None:
        return DateForm(text, start, days, DEFAULT_DATE_FORMAT)
    if not format:
        raise SpecError(field, f"{text}: no format after ':'", DATE_EXAMPLES)
    at = format.find("%")
    while at >= 0:
        directive = format[at + 1 : at + 2]
        if not directive:
            raise SpecError(field, f"{text}: a lone '%' ends the format (a literal % is %%)", DATE_EXAMPLES)
        if directive not in DATE_DIRECTIVES:
            raise SpecError(
                field,
                f"{text}: %{directive} is not a date directive (a date form names a day, never a time); the date "
                f"directives are {' '.join('%' + d for d in DATE_DIRECTIVES[:-1])}",
                DATE_EXAMPLES,
            )
        at = format.find("%", at + 2)
    return DateForm(text, start, days, format)


def date_forms(dataset: str, field: str = "train.dataset") -> list[DateForm]:
    """Every placeholder of ``dataset``, each a date form (:func:`date_form`), in order; in a ``bq://`` source only in
    the table's name (the part after the last ``.``) and only with characters a table name may hold
    (``TABLE_CATEGORIES``), so the day's table is ``events_{date:%Y%m%d}``. A SpecError naming ``field`` and the form
    otherwise."""
    forms = [date_form(m.group(), m.start(), field) for m in _PLACEHOLDER.finditer(dataset)]
    if forms and dataset.startswith("bq://"):
        if "." in _PLACEHOLDER.sub("", dataset[forms[0].start :]):
            raise SpecError(
                field,
                f"{forms[0].text} in {dataset!r}: a dated BigQuery source is a dated table, the date form in the "
                "table's name",
                ["bq://PROJECT.DATASET.events_{date:%Y%m%d}"],
            )
        for form in forms:
            literal = form.format.replace("%%", "").replace("%", "")  # what the directives leave: their letters
            bad = [ch for ch in literal if not unicodedata.category(ch).startswith(TABLE_CATEGORIES)]
            if bad or "%%" in form.format:
                raise SpecError(
                    field,
                    f"{form.text}: {(bad or ['%'])[0]!r} may not be in a BigQuery table name (letters, marks, digits, "
                    "connectors such as _, dashes and spaces: https://cloud.google.com/bigquery/docs/tables#table_naming)",
                    ["events_{date:%Y%m%d}", "events_{date-1:%Y%m%d}", "events_{date}"],
                )
    return forms


def dated(dataset: str) -> bool:
    """Whether ``dataset`` names the schedule's day (a date form: :func:`date_forms`), so a different source each
    day."""
    return any(_DATE_FORM.fullmatch(name) for name in placeholders(dataset))


def same_day_table(dataset: str) -> str:
    """A warning for a dated BigQuery table of the schedule's own UTC day (``events_{date:%Y%m%d}``: no ``-N``), which
    a daily table's writer is still filling when the schedule reads it; "" for any other dataset."""
    if kind(dataset) != "bigquery" or not any(form.days == 0 for form in date_forms(dataset)):
        return ""
    return (
        f"train.dataset {dataset} is the table of the schedule's own day (UTC), which is likely still being written "
        "when the run reads it: a table has no readiness marker, so a partial day is read partially, and under "
        "train.data_since never again; {date-1:...} reads the day before's (docs/recurring.md, Date forms)"
    )


def first_date(dataset: str) -> int:
    """Where ``dataset``'s first date form starts (the index of its ``{``), -1 when it has none."""
    return next((m.start() for m in _PLACEHOLDER.finditer(dataset) if _DATE_FORM.fullmatch(m.group(1))), -1)


def render(dataset: str, when: datetime) -> str:
    """``dataset`` with each date form replaced by the day it stands for, of a run scheduled at ``when``
    (:meth:`DateForm.day`). Checked forms only: a dataset :func:`date_forms` refuses is a SpecError."""
    out, end = [], 0
    for form in date_forms(dataset):
        out += [dataset[end : form.start], form.day(when)]
        end = form.start + len(form.text)
    return "".join(out) + dataset[end:]


def splits(dataset: str, train_split: str, eval_split: str) -> tuple[str, str]:
    """The (train, evaluation) splits the trainers read: a snapshot's two files, else the spec's own."""
    return SNAPSHOT_SPLITS if snapshotted(dataset) else (train_split, eval_split)


def row_filter(text: str, field: str = "train.dataset_filter") -> list[tuple[str, str]]:
    """``COLUMN=VALUE[,COLUMN=VALUE...]`` as its (column, value) pairs: the rows kept are those whose every column
    equals its value. No SQL: the column is a name checked here (and against the table's schema at the snapshot), the
    value reaches BigQuery as a literal of the column's type that components/data/bigquery.py quotes (a read
    session's row restriction) or as a query parameter (the APPENDS query), never as text of its own, so a filter
    cannot read another table (a subquery), call a function or end the statement. A SpecError naming ``field``
    otherwise."""
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
