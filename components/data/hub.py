"""A hub ``train.dataset`` snapshotted by the run's first stage, on the pipeline's side, like every other source: the
run's pods never reach the hub for data, so a cluster the run creates needs no way to the internet for it
(``components.platforms.gke.plan.network``).

What is read: the Parquet files the hub's dataset viewer keeps of every dataset it can read, on the repository's
``refs/convert/parquet`` revision, one directory per config and split (``{config}/{split}/0000.parquet``, ...), a split
converted only in part (the first 5 GB of a larger one) under ``{config}/partial-{split}/`` (the dataset viewer's
"List Parquet files": https://huggingface.co/docs/dataset-viewer/parquet). The conversion is made by the ``datasets``
library from the repository's own files, in their order, so its rows are what ``datasets.load_dataset(name,
split=...)`` reads; a split converted in part is refused rather than trained on in part. The config is ``default``
(what ``load_dataset`` takes without a config name), else the only one.

Pinned by content: each file is downloaded by the commit the revision resolves to and checked against the sha256 the hub
lists for it (its LFS object's; the same listing and download the base weights use: ``components.workload.weights``),
and the manifest names each file with that hash (its ``generation``). The hashes are the pin, not the commit: after
every conversion the dataset viewer squashes the history of ``refs/convert/parquet`` into its new commit
(``super_squash_history`` in its ``services/worker/src/worker/job_runners/config/parquet_and_info.py``,
https://github.com/huggingface/dataset-viewer/blob/f62009e0555b1274e7f6ddc7058dc796993f28b6/services/worker/src/worker/job_runners/config/parquet_and_info.py#L1203-L1212),
so the manifest's ``hf://datasets/ID@COMMIT/...`` names stop resolving at the next conversion, and a conversion between
the listing and a download answers 404: the split is then listed and downloaded once again. Which ``main`` commit the
rows came from is not recorded: the conversion's commit names none (its message is the viewer's fixed "Update parquet
files", its source the ``main`` of the time: ``PARQUET_AND_INFO_COMMIT_MESSAGE`` and
``PARQUET_AND_INFO_SOURCE_REVISION`` in its ``services/worker/src/worker/config.py``).

A split is one of ``train.train_split`` and ``train.eval_split`` as ``datasets`` reads them: a name, with a slice of
row numbers or percents (``train[:1024]``, ``train[1024:1152]``, ``train[:10%]``; the ``datasets`` docs, "Slice
splits": https://huggingface.co/docs/datasets/loading#slice-splits; a percent bound rounded to the closest row, as
``ReadInstruction``'s default ``closest`` rounding in ``datasets/arrow_reader.py`` does). Concatenations (``+``) are
refused naming the field.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.data.records import Item, Side
from components.spec import SpecError

CONVERTED = "refs/convert/parquet"  # the dataset viewer's revision of Parquet files
DEFAULT_CONFIG = "default"
_SPLIT = re.compile(r"^(?P<name>[\w.-]+)(\[(?P<start>-?\d+%?)?:(?P<stop>-?\d+%?)?\])?$")


def parse_split(text: str, field: str) -> tuple[str, str | None, str | None]:
    """(split name, start, stop) of ``name`` or ``name[start:stop]``; a SpecError naming ``field`` otherwise."""
    found = _SPLIT.match(text.replace(" ", ""))
    if not found:
        raise SpecError(field, f"{text!r} is not a split of a hub dataset", ["train", "train[:1024]", "train[:10%]"])
    return found["name"], found["start"], found["stop"]


def _bound(value: str | None, rows: int, default: int) -> int:
    if value is None:
        return default
    number = round(int(value[:-1]) * rows / 100) if value.endswith("%") else int(value)
    return max(0, min(rows, number + rows if number < 0 else number))


def _rows_known(start: str | None, stop: str | None) -> int | None:
    """The rows to read from the split's start when both bounds are plain non-negative row numbers (the files past
    them need not be downloaded); None when a bound needs the split's size."""
    if any(v is not None and (v.endswith("%") or v.startswith("-")) for v in (start, stop)):
        return None
    return int(stop) if stop is not None else None


def files(repo_id: str, split: str, field: str, listing: dict[str, Any]) -> list[dict[str, Any]]:
    """The Parquet files of ``split`` in the conversion ``listing`` (``weights.resolve``'s answer), in order."""
    configs = sorted({e["name"].split("/", 1)[0] for e in listing["files"] if "/" in e["name"]})
    if not configs:
        raise SpecError("train.dataset", f"{repo_id}: the hub keeps no Parquet conversion of it ({CONVERTED})")
    config = DEFAULT_CONFIG if DEFAULT_CONFIG in configs else configs[0]
    if len(configs) > 1 and config != DEFAULT_CONFIG:
        raise SpecError("train.dataset", f"{repo_id} has several configs ({', '.join(configs)}) and no default")
    ours = [e for e in listing["files"] if e["name"].startswith(f"{config}/") and e["name"].count("/") == 2]
    directories = {d: _split_of(d) for d in {e["name"].split("/")[1] for e in ours}}
    if any(d.startswith("partial-") and name == split for d, name in directories.items()):
        raise SpecError(
            field,
            f"{repo_id}: the hub converted only part of its split {split!r} (larger than 5 GB): snapshot it into "
            "gs:// or BigQuery and name that as train.dataset",
        )
    # part0 .. part9 sort as the shards' order, and 0000 .. 9999 within each
    found = sorted((e for e in ours if directories[e["name"].split("/")[1]] == split), key=lambda e: e["name"])
    if not found:
        splits = sorted({directories[e["name"].split("/")[1]] for e in ours})
        raise SpecError(field, f"{repo_id} has no split {split!r} (its splits: {', '.join(splits)})", splits)
    return found


_PART = re.compile(r"-part\d+$")


def _split_of(directory: str) -> str:
    """The split a directory of the conversion holds: ``SPLIT``, ``partial-SPLIT`` (read as SPLIT, and refused), or,
    for a split of more than 10,000 files, ``SPLIT-partN`` with N the shard index // 10,000
    (``ParquetFile.path_in_repo`` and ``parse_repo_filename`` in the dataset viewer's
    ``services/worker/src/worker/job_runners/config/parquet_and_info.py``; "-" is not allowed in a split's name)."""
    return _PART.sub("", directory.removeprefix("partial-"))


def side(
    repo_id: str,
    split_text: str,
    field: str,
    token: str | None,
    log: Callable[[str], None],
    hub: str = "",
) -> tuple[Side, Iterator[dict[str, Any]]]:
    """One split of a hub dataset as the snapshot keeps a side (``components.data.snapshot``): its part of the
    manifest (the commit, the split, each file with its sha256) and its rows, read now from files checked against
    the hub's hashes."""
    from components.workload import weights

    hub = hub or weights.endpoint()
    name, start, stop = parse_split(split_text, field)
    limit = _rows_known(start, stop)
    tmp = tempfile.TemporaryDirectory(prefix="tpupipe-hub-")
    try:
        try:
            commit, paths, items, total = _fetch(hub, repo_id, name, field, token, limit, Path(tmp.name))
        except weights.NotOnHub as exc:  # converted again since it was listed: its history squashed, the commit gone
            log(f"snapshot: {exc}: the hub converted {repo_id} again since listing it; listing it again")
            commit, paths, items, total = _fetch(hub, repo_id, name, field, token, limit, Path(tmp.name))
    except BaseException:
        tmp.cleanup()
        raise
    first, last = _bound(start, total, 0), _bound(stop, total, total)
    log(f"snapshot: {repo_id} split {split_text}: rows {first} to {last} of {len(items)} Parquet file(s) at {commit}")
    part: Side = {
        "kind": "hub",
        "source": repo_id,
        "split": split_text,
        "commit": commit,
        "items": items,
        "num_examples": 0,
        "identity": {"split": split_text, "files": [dict(i) for i in items]},
    }
    return part, _rows(paths, first, last, tmp)


def _fetch(
    hub: str, repo_id: str, split: str, field: str, token: str | None, limit: int | None, into: Path
) -> tuple[str, list[Path], list[Item], int]:
    """The conversion's commit as the hub lists it now, the split's files downloaded under ``into`` and checked (up to
    the file where ``limit`` rows are reached), their manifest items and their rows' count."""
    import pyarrow.parquet as pq

    from components.workload import weights

    try:
        listing = weights.resolve(hub, repo_id, CONVERTED, token, repo_type="dataset", keep=lambda n: True)
    except weights.HubUnavailable as exc:
        raise SpecError("train.dataset", f"{repo_id}: the hub did not answer its Parquet files: {exc}") from None
    commit, wanted = listing["commit"], files(repo_id, split, field, listing)
    paths: list[Path] = []
    items: list[Item] = []
    total = 0
    for entry in wanted:
        if limit is not None and total >= limit:
            break  # the slice ends before this file: it is neither downloaded nor pinned
        try:
            path = weights.download(hub, repo_id, commit, entry, token, into, repo_type="dataset")
        except weights.HubRefused as exc:  # a gated dataset: listed to anyone, its files only to an account with access
            raise SpecError("train.dataset", str(exc)) from None
        total += pq.ParquetFile(path).metadata.num_rows
        paths.append(path)
        items.append(
            {
                "uri": f"hf://datasets/{repo_id}@{commit}/{entry['name']}",
                "generation": entry.get("sha256") or entry["git_sha1"],
                "size": entry["size"],
            }
        )
    return commit, paths, items, total


def _rows(paths: list[Path], first: int, last: int, tmp: tempfile.TemporaryDirectory[str]) -> Iterator[dict[str, Any]]:
    """Rows ``first`` to ``last`` of the files, a batch at a time; the files go when the rows are read."""
    import pyarrow.parquet as pq

    number = 0
    try:
        for path in paths:
            for batch in pq.ParquetFile(path).iter_batches():
                if number + batch.num_rows > first and number < last:
                    lo, hi = max(0, first - number), min(batch.num_rows, last - number)
                    yield from batch.slice(lo, hi - lo).to_pylist()
                number += batch.num_rows
    finally:
        tmp.cleanup()
