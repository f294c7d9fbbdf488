"""The run's first stage, ``snapshot_data``: its data resolved once, before anything is created or billed
(``components.data.snapshot``), the manifest and the examples it trains and evaluates on kept in the run's store
(``data/manifest.json``, ``data/train.jsonl``, ``data/heldout.jsonl``), which every later stage reads instead of the
source, and the keys of every training example the run's lineage has seen (``data/keys.bin``: the champion's, under
``train.data_since=champion``, and the run's own; its sha256 in the manifest's ``keys``), which the next run that
continues from it drops examples by; the train stage copies the two files where the jobs read them (``stage_files``:
the jobs' directory, in the run's bucket on gke, which provision creates). ``{date}`` in a dataset (and its other date
forms, ``{date-1}``, ``{date:%Y%m%d}``: ``components.spec.datasets.date_forms``) is the day of the pipeline job's
scheduled time; a run no schedule started takes the job's create time, and only where the runner fills neither (KFP
before 2.17, kfp.local) the task's start (:func:`run_time`).

Its output gates the rest of the pipeline: ``train`` runs it, ``skip`` (``train.data_since=champion`` and nothing new
since the champion's snapshot) ends the run here, with nothing created: the teardown that still runs finds nothing.
A generated dataset has nothing to snapshot: it says so and the run goes on. A hub dataset is snapshotted here too
(``components.data.hub``), with the token the base weights use, so that no pod of the run reads the hub for data.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from components.platforms import RunContext, get_platform
from components.platforms.store import open_store, read_json, write_json, write_text
from components.registry import Version
from components.spec import InfraError, RunSpec, SpecError, datasets
from components.stages import base_weights, gate
from components.stages.jobs import log

if TYPE_CHECKING:
    from components.data.snapshot import Keys

MANIFEST = "data/manifest.json"
KEYS = "data/keys.bin"  # the keys of every training example the run's lineage has seen (snapshot.lineage)
CARD = "data/card.md"  # the data card (Markdown): what a person reads of what the run learned from
SAMPLES, SAMPLE_CHARS, CARD_ITEMS = 3, 200, 20  # the card's sample rows, each field's characters, files listed
# Each model's runs skipped in a row (``skip_streak``), beside the runs' stores under the output root.
SKIPS = "_skips"  # no run id starts with "_" (a DNS-1035 label)
STREAK = 3  # skipped runs in a row after which another one warns: a drop that stopped coming looks like this
PROCEED, SKIP = "train", "skip"
# What a runner without schedules may put in a schedule-time placeholder; no run reads data from before it.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the stage's output, which the pipeline's dsl.If reads


def _rfc3339(key: str, text: str) -> datetime | None:
    """An RFC 3339 time as a runner's placeholder gives it, in UTC; None for what is no time: empty, the placeholder
    left as text by a runner that does not fill it, or the Unix epoch."""
    text = (text or "").strip()
    if not text or text.startswith("{{"):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(key, f"not an RFC 3339 time: {text!r}") from None
    when = when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    return None if when <= EPOCH else when


def run_time(schedule_time: str, create_time: str = "", started: datetime | None = None) -> tuple[datetime, str]:
    """The time ``{date}`` is taken from, and where it came from: the pipeline job's scheduled time, else (a run no
    schedule started) the job's create time, else the task's start. KFP's v2 driver passes the schedule-time
    placeholder as text on 2.15 and empty on 2.16, and fills it from 2.17 with the recurring run's schedule time, or
    the create time for a run no schedule started; the create-time placeholder is text on 2.15, empty on 2.16, the
    Argo Workflow's creation time on 2.17 (backend/src/v2/driver/resolve.go and backend/src/v2/cmd/driver/main.go,
    ``resolvePipelineJobTimes``, in kubeflow/pipelines at those tags; kubeflow/pipelines#13474). kfp.local fills
    neither (kfp/local/placeholder_utils.py)."""
    when = _rfc3339("schedule_time", schedule_time)
    if when is not None:
        return when, "the schedule time"
    when = _rfc3339("create_time", create_time)
    if when is not None:
        return when, "the pipeline job's create time (no schedule started it)"
    return started or datetime.now(UTC), "this task's start (the runner gave neither a schedule nor a create time)"


def scheduled(schedule_time: str, started: datetime | None = None) -> datetime:
    """The pipeline job's scheduled time (UTC), else the run's start (:func:`run_time` without a create time)."""
    return run_time(schedule_time, "", started)[0]


def read_manifest(uri: str) -> dict[str, Any] | None:
    """A manifest by its URI (``gs://...`` or a local path): a champion's, named in its provenance."""
    parent, name = posixpath.split(uri.rstrip("/"))
    grand, directory = posixpath.split(parent)
    manifest: dict[str, Any] | None = read_json(open_store(grand, directory), name)  # a JSON object, or none
    return manifest


class Taken(NamedTuple):
    """What :func:`take` read: the manifest, the train and held-out examples, and the champion's lineage keys (None:
    no champion, not ``train.data_since=champion``, or its key file could not be used)."""

    manifest: dict[str, Any]
    train: Iterable[dict[str, Any]]
    heldout: Iterable[dict[str, Any]]
    seen: Keys | None


def take(ctx: RunContext, when: datetime, log: Callable[[str], None] = log) -> Taken:
    """The run's data as of ``when``: its champion read once from the registry, for what it has seen
    (``train.data_since=champion``: its manifest and its lineage's keys) and the evaluation set it was judged on."""
    from components.data import snapshot

    champion = gate.current_champion(ctx)
    since, ref = champion_manifest(champion) if ctx.spec.train.data_since == "champion" else (None, "")
    if ctx.spec.train.data_since == "champion" and champion is None:
        log(f"snapshot_data: train.data_since=champion: {ctx.spec.model_name} has no champion yet: taking everything")
    seen = champion_keys(champion, since, log) if champion is not None and since is not None else None
    left_out: list[str] = []

    def said(line: str) -> None:  # what the snapshot left unread, kept for the card
        log(line)
        if "warning" in line or "not read" in line:
            left_out.append(line)

    token = base_weights.hub_token(ctx) if datasets.kind(ctx.spec.train.dataset) == "hub" else None
    manifest, train, heldout = snapshot.take(ctx.spec, when, since, ref, log=said, hub_token=token, seen_keys=seen)
    if left_out:
        manifest["left_out"] = left_out
    check_eval_set(ctx.spec, champion, manifest, log)
    return Taken(manifest, train, heldout, seen)


def champion_keys(champion: Version, manifest: dict[str, Any], log: Callable[[str], None] = log) -> Keys | None:
    """The champion's lineage keys (``snapshot.Keys``): its key file, checked against the sha256 the registry recorded
    when it was registered (``data_keys``, ``data_keys_digest``: :func:`gate.provenance`): a change to the file after
    registration is caught (the pipeline's identity writes both stores: it guards against damage and later edits, not
    against that identity). The file must be its own run store's ``KEYS`` (beside ``data_manifest``); another path is a
    SpecError; a file gone, unreadable or with another digest an InfraError: the run stops rather than write a lineage
    that forgot what the champion saw. A champion registered before the registry recorded keys: its manifest's entry
    (``keys``: URI and sha256), checked against that, or None with one warning line (duplicates of what it saw are then
    not dropped)."""
    ref = champion.ref
    recorded = champion.provenance.get("data_keys_digest")
    if recorded:
        uri = str(champion.provenance.get("data_keys") or "")
        own = str(champion.provenance.get("data_manifest") or "").removesuffix("/" + MANIFEST) + "/" + KEYS
        if uri != own:
            raise SpecError(
                "train.data_since",
                f"champion {ref} records its key file at {uri!r}, not in its own run store ({own}): refused",
            )
        return _checked_keys(uri, recorded, f"champion {ref}'s key file", strict=True, log=log)
    entry = manifest.get("keys") or {}
    uri = str(entry.get("uri") or "")
    if not uri:
        log(
            f"snapshot_data: warning: champion {ref}: its manifest names no key file (it was trained before key "
            "files): examples it already trained on are not dropped from this run's (no dedup against the champion)"
        )
        return None
    return _checked_keys(uri, str(entry.get("digest")), f"champion {ref}", strict=False, log=log)


def _checked_keys(uri: str, digest: str, what: str, *, strict: bool, log: Callable[[str], None]) -> Keys | None:
    """The key file at ``uri`` as ``snapshot.Keys`` when its sha256 is ``digest``; otherwise an InfraError naming
    what is wrong (``strict``) or None with one warning line."""
    from components.data import snapshot

    parent, name = posixpath.split(uri)
    problem, blob = "", None
    try:
        blob = open_store(*posixpath.split(parent)).read_bytes(name)
    except Exception as exc:  # noqa: BLE001 - unreadable: an error or a warning, by ``strict``
        problem = f"{uri} could not be read ({type(exc).__name__}: {exc})"
    else:
        if blob is None:
            problem = f"{uri} is gone"
        elif snapshot.file_digest(blob) != digest:
            problem = f"{uri} is not the file {'the registry' if strict else 'its manifest'} recorded (sha256 {digest})"
    if problem and strict:
        raise InfraError(
            f"snapshot_data: {what}: {problem}: the examples its lineage trained on cannot be told apart, and a run "
            "without them would forget them for good; restore the file, or train on everything "
            '(train.data_since="")'
        )
    if problem or blob is None:
        log(
            f"snapshot_data: warning: {what}: {problem}: examples it already trained on are not dropped from "
            "this run's (no dedup against the champion)"
        )
        return None
    return snapshot.Keys(blob)


def champion_manifest(champion: Version | None) -> tuple[dict[str, Any] | None, str]:
    """(the champion's data manifest, its reference) for ``train.data_since=champion``; (None, "") when the model has
    no champion yet (everything is new)."""
    if champion is None:
        return None, ""
    uri = champion.provenance.get("data_manifest")
    manifest = read_manifest(uri) if uri else None
    if manifest is None:
        raise SpecError(
            "train.data_since",
            f"champion {champion.ref} records no data manifest"
            + (f" ({uri} is gone)" if uri else " (it was trained before data snapshots)")
            + ": nothing tells what it has seen",
            ['train.data_since="" (train on everything)'],
        )
    return manifest, champion.ref


def check_eval_set(
    spec: RunSpec, champion: Version | None, manifest: dict[str, Any], log: Callable[[str], None] = log
) -> None:
    """A fixed evaluation set is one yardstick: a run measured on another one than its champion's is refused (the
    gate refuses to compare two bases the same way, ``gate.check_lineage``), naming what changed. The set is its
    content (``snapshot.content_digest``): the same examples read on another day, or from an object uploaded again,
    are the same set. A champion registered before content digests (manifest version 1) recorded the digest of what
    it pinned (object generations, a table's snapshot time): this run's ``pinned`` is compared with it, and where
    that differs (a table read at another time), the content digest of the champion's own copy of the examples it
    was judged on (``data/heldout.jsonl`` beside its manifest) is (:func:`_champion_content`)."""
    if champion is None:
        return
    theirs = champion.provenance.get("eval_snapshot")
    ours = manifest.get("eval") or {}
    if not theirs or not ours.get("digest") or theirs in (ours["digest"], ours.get("pinned")):
        return
    if _champion_content(champion) == ours["digest"]:
        log(
            f"snapshot_data: champion {champion.ref} recorded its evaluation set as it pinned it ({theirs}, before "
            f"content digests); its own copy of those examples has this set's content ({ours['digest']}): the same set"
        )
        return
    raise SpecError(
        "train.eval_dataset",
        f"{ours['source']} (snapshot {ours['digest']}) is not the fixed evaluation set champion {champion.ref} "
        f"was judged on (snapshot {theirs}): {_eval_change(champion, ours)}; the gate compares runs on one set",
        ["the champion's evaluation set", f"gate.model={gate.new_lineage(spec)} (a lineage of its own)"],
    )


def _champion_content(champion: Version) -> str:
    """The content digest of the evaluation examples a champion registered before content digests was judged on,
    from its run's copy of them (``data/heldout.jsonl`` beside its manifest, which the snapshot wrote); "" for a
    champion of manifest version 2 on (its ``eval_snapshot`` is already the content's), without a fixed set, or
    whose copy is gone."""
    from components.data import snapshot

    uri = str(champion.provenance.get("data_manifest") or "")
    try:
        manifest = (read_manifest(uri) if uri else None) or {}
        if not uri or manifest.get("version", 1) >= 2 or not manifest.get("eval"):
            return ""
        parent, _ = posixpath.split(uri.rstrip("/"))
        text = open_store(*posixpath.split(parent)).read_text("heldout.jsonl")
    except Exception:  # noqa: BLE001 - unreadable, the champion's recorded digest stands alone
        return ""
    return (
        snapshot.content_digest(json.loads(line) for line in (text or "").splitlines() if line.strip()) if text else ""
    )


def _eval_change(champion: Version, ours: dict[str, Any]) -> str:
    """What differs between the champion's evaluation set (from its manifest, when it can still be read) and ours."""
    uri = champion.provenance.get("data_manifest")
    try:
        theirs = ((read_manifest(uri) if uri else None) or {}).get("eval") or {}
    except Exception:  # noqa: BLE001 - the manifest only explains the refusal; unreadable, the refusal stands alone
        theirs = {}
    if not theirs:
        return "its manifest is gone, so what changed cannot be said"
    changes = []
    if theirs.get("source") != ours["source"]:
        changes.append(f"the source was {theirs.get('source')}")
    if theirs.get("num_examples") != ours["num_examples"]:
        changes.append(f"{theirs.get('num_examples')} examples then, {ours['num_examples']} now")
    return "; ".join(changes) or f"the same source and number of examples ({ours['num_examples']}), other content"


def data_dir(ctx: RunContext) -> str:
    """Where the jobs read the snapshot's examples, as everyone but the cluster reaches it (a local path or gs://)."""
    platform = get_platform(ctx.platform)
    return platform.checkpoint_uri(ctx, posixpath.join(platform.job_output_dir(ctx), "data"))


def stage_files(ctx: RunContext) -> None:
    """Copy the snapshot's examples from the run's store to where the jobs read them (``data_dir``), once."""
    if not datasets.snapshotted(ctx.spec.train.dataset):
        return
    parent, name = posixpath.split(data_dir(ctx).rstrip("/"))
    target = open_store(parent, name)
    for split in datasets.SNAPSHOT_SPLITS:
        text = ctx.store.read_text(f"data/{split}.jsonl")
        if text is None:
            raise SpecError("train.dataset", f"the run's snapshot has no {split} examples ({ctx.store.uri}/data/)")
        if target.read_text(f"{split}.jsonl") != text:
            target.write_bytes(f"{split}.jsonl", text.encode(), "application/jsonl")


def snapshot_data(
    ctx: RunContext, _upstream: str = "", schedule_time: str = "", create_time: str = ""
) -> dict[str, Any]:
    t = ctx.spec.train
    when, source = run_time(schedule_time, create_time)
    if datasets.dated(t.dataset):
        log(f"snapshot_data: {{date}} is {when:%Y-%m-%d}, from {source}: {datasets.render(t.dataset, when)}")
    if not datasets.snapshotted(t.dataset):
        log(f"snapshot_data: {t.dataset}: nothing to snapshot ({datasets.kind(t.dataset)} data)")
        return {"proceed": PROCEED, "dataset": t.dataset, "snapshot": None}
    earlier = read_json(ctx.store, MANIFEST)
    if earlier is None:  # a retried task keeps the first attempt's snapshot
        from components.data import snapshot

        manifest, train, heldout, seen = take(ctx, when)
        warning = skip_streak(ctx, bool(manifest.get("skip")))
        if warning:
            manifest["warning"] = warning
        if not manifest.get("skip"):
            manifest["copies"] = {}
            for split, rows in (("train", train), ("heldout", heldout)):
                if not isinstance(rows, snapshot.Spool):
                    spool = snapshot.Spool()
                    for row in rows:
                        spool.append(row)
                    rows = spool
                # streamed from its file, never held whole; its content's digest names the run's own copy
                ctx.store.write_file(f"data/{split}.jsonl", rows.path, "application/jsonl")
                manifest["copies"][split] = {
                    "uri": f"{ctx.store.uri}/data/{split}.jsonl",
                    "digest": _file_digest(rows.path),
                }
                if split == "train":
                    with tempfile.TemporaryDirectory(prefix="tpupipe-keys-") as scratch:
                        path = os.path.join(scratch, "keys.bin")
                        keys_digest, count = snapshot.lineage(seen, rows, path)
                        ctx.store.write_file(KEYS, path)  # streamed from its file, as the examples are
                    manifest["keys"] = {"uri": f"{ctx.store.uri}/{KEYS}", "digest": keys_digest, "count": count}
        write_text(ctx.store, CARD, card(manifest, _samples(train)), "text/markdown")  # before the manifest: a retry
        write_json(ctx.store, MANIFEST, manifest)  # that finds the manifest finds the card
        earlier = manifest
    return outcome(ctx, earlier)


def _file_digest(path: str) -> str:
    import hashlib

    sha = hashlib.sha256()
    with open(path, "rb") as data:
        while chunk := data.read(2**20):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def _samples(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ``SAMPLES`` training examples, for the card."""
    found: list[dict[str, Any]] = []
    for row in rows:
        if len(found) == SAMPLES:
            break
        found.append(row)
    return found


def card(manifest: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    """The run's data card (Markdown), from its manifest: what the run learns from, where it was read and as of
    when (each file's pinned generation, a table's snapshot time), how many examples trained and evaluated, the
    duplicates and evaluation overlap dropped, what was left unread, the fields, a token estimate and a few sample
    rows; a skipped run's, why it read nothing."""
    train = manifest.get("train") or {}
    lines = [
        f"# Data card: `{manifest['dataset']}`",
        "",
        f"Snapshot `{manifest['digest']}`, taken as of {manifest['taken']}.",
    ]
    if manifest.get("since"):
        since = manifest["since"]
        lines.append(f"Only what is new since champion `{since.get('champion') or 'none yet'}`.")
    if manifest.get("skip"):
        return "\n".join([*lines, "", f"**Nothing read**: {manifest['skip']}.", ""])
    lines += ["", "## Sources", ""]
    if train.get("kind") == "bigquery":
        table = train.get("table") or {}
        lines.append(f"- BigQuery table `{table.get('table')}` as of {table.get('snapshot_time')} (time travel)")
        if table.get("filter"):
            lines.append(f"  - filter: `{table['filter']}`")
    else:
        items = train.get("items") or []
        lines += ["| object | generation | bytes | examples |", "|---|---|---|---|"]
        lines += [
            f"| `{i['uri']}` | `{i['generation']}` | {i['size']} | {i.get('num_examples', '-')} |"
            for i in items[:CARD_ITEMS]
        ]
        if len(items) > CARD_ITEMS:
            lines.append(f"| ... and {len(items) - CARD_ITEMS} more (the manifest lists them all) | | | |")
    ev = manifest.get("eval")
    if ev:
        lines.append(f"- evaluation set `{ev['source']}`: {ev['num_examples']} examples, content `{ev['digest']}`")
    dups, overlap = manifest.get("duplicates", 0), manifest.get("eval_overlap", 0)
    again = manifest.get("champion_duplicates", 0)
    lines += [
        "",
        "## Examples",
        "",
        "| | |",
        "|---|---|",
        f"| read | {train.get('num_examples')} |",
        f"| trained on | {manifest['num_train_examples']} |",
        f"| evaluated on | {manifest['num_heldout_examples']}"
        + (" (the fixed evaluation set)" if ev else " (held out by their instruction's digest)")
        + " |",
        f"| duplicates dropped | {dups} |",
        f"| already seen by the champion's lineage, dropped | {again} |",
        f"| also in the evaluation set, dropped from training | {overlap} |",
        f"| fields | {', '.join(f'`{f}`' for f in manifest.get('fields') or [])} |",
        f"| tokens (estimate) | {manifest.get('tokens_estimate')} |",
    ]
    if manifest.get("left_out"):
        lines += ["", "## Not read", ""]
        lines += [f"- {line.removeprefix('snapshot: ')}" for line in manifest["left_out"]]
    if manifest.get("copies"):
        lines += ["", "## The run's own copy", ""]
        lines += [f"- {split}: `{c['uri']}` (`{c['digest']}`)" for split, c in manifest["copies"].items()]
    if samples:
        lines += ["", "## Samples", "", "```json"]
        lines += [json.dumps({k: _short(v) for k, v in row.items()}, ensure_ascii=False) for row in samples]
        lines.append("```")
    return "\n".join(lines) + "\n"


def _short(value: Any) -> Any:
    return value[:SAMPLE_CHARS] + "…" if isinstance(value, str) and len(value) > SAMPLE_CHARS else value


def skip_streak(ctx: RunContext, skipped: bool) -> str:
    """The warning of a skipped run that follows ``STREAK`` skipped runs of its model in a row, else "". The model's
    skipped runs in a row are kept in ``_skips/MODEL.skips.json`` beside the runs' stores: a skipped run adds
    itself, a run that reads data empties it. A schedule runs one at a time, so its runs do not race on it."""
    parent = posixpath.dirname(ctx.store.uri.rstrip("/"))
    store, key = open_store(parent, SKIPS), f"{ctx.spec.model_name}.skips.json"
    runs = list((read_json(store, key) or {}).get("runs") or [])
    if not skipped:
        if runs:
            write_json(store, key, {"runs": []})
        return ""
    if ctx.run_id not in runs:
        runs.append(ctx.run_id)
        write_json(store, key, {"runs": runs})
    before = runs[: runs.index(ctx.run_id)]
    if len(before) < STREAK:
        return ""
    return (
        f"warning: {ctx.spec.model_name}'s last {len(before)} runs were skipped too ({', '.join(before[-STREAK:])}"
        f"{', ...' if len(before) > STREAK else ''}): is {ctx.spec.train.dataset} still written?"
    )


def outcome(ctx: RunContext, manifest: dict[str, Any]) -> dict[str, Any]:
    """The stage's result from the manifest: what it read, and whether the run goes on."""
    since = (manifest.get("since") or {}).get("champion")
    found = {
        "dataset": manifest["dataset"],
        "snapshot": manifest["digest"],
        # what train.data_since=champion compared with: the champion, or nothing on a model's first run
        "data_since": (since or "none yet: took everything") if ctx.spec.train.data_since == "champion" else None,
        "manifest": f"{ctx.store.uri}/{MANIFEST}",
        "eval_snapshot": (manifest.get("eval") or {}).get("digest"),
        "card": f"{ctx.store.uri}/{CARD}",
        "keys": manifest.get("keys"),  # the lineage's key file: its URI and sha256, recorded in the registry
    }
    if manifest.get("skip"):
        log(f"snapshot_data: {manifest['skip']}: the run ends here, nothing created")
        if manifest.get("warning"):
            log(f"snapshot_data: {manifest['warning']}")
        return {"proceed": SKIP, "reason": manifest["skip"], "warning": manifest.get("warning"), **found}
    train = manifest["train"]
    log(
        f"snapshot_data: {manifest['dataset']}: {len(train['items']) or 1} "
        f"{'table' if train['kind'] == 'bigquery' else 'files'}, {manifest['num_train_examples']} examples to train "
        f"on, {manifest['num_heldout_examples']} to evaluate on, snapshot {manifest['digest'][:19]}"
    )
    if manifest.get("duplicates") or manifest.get("eval_overlap") or manifest.get("champion_duplicates"):
        log(
            f"snapshot_data: dropped {manifest.get('duplicates') or 0} duplicate example(s), "
            f"{manifest.get('champion_duplicates') or 0} the champion already saw and "
            f"{manifest.get('eval_overlap') or 0} also in the evaluation set"
        )
    return {
        "proceed": PROCEED,
        **found,
        "num_examples": manifest["num_train_examples"],
        "duplicates": manifest.get("duplicates", 0),
        "champion_duplicates": manifest.get("champion_duplicates", 0),
        "eval_overlap": manifest.get("eval_overlap", 0),
    }
