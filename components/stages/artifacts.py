"""The typed KFP artifacts the Vertex AI UI shows for a run, written from the stages' records: the same figures as
``summary.json``, from the same records.

- snapshot_data: the run's data as a ``Dataset`` (its uri the run's own copy of the training examples where the
  backend takes it, ``point``; its metadata that copy's location and content digest, the snapshot's digest, its
  manifest and counts: the lineage dataset -> model) and its data card as ``Markdown``
  (``components.stages.dataset.card``);
- train: ``Metrics`` (final loss, tokens/s, seconds, restarts) and an ``HTML`` loss curve;
- evaluate: ``Metrics`` (held-out loss and perplexity before/after, and the champion's when there is one), a
  ``Markdown`` summary, and the ``Model`` (its uri the checkpoint in Cloud Storage, its metadata the run's
  provenance);
- register: ``Metrics`` (the new version's and the champion's held-out loss, the relative improvement, the threshold,
  whether the gate promotes), a ``Markdown`` table of the decision, both figures and the version's provenance, and
  the version registered as a ``google.VertexModel`` (``components.artifact_types.VertexModel``: metadata
  ``resourceName`` the version's resource name, uri its REST URL, as google-cloud-pipeline-components' type of that
  name has them; on a registry outside Vertex AI, no ``resourceName`` and the checkpoint's uri);
- teardown: ``Markdown`` of what it deleted; the run's goodput ledger as ``Metrics`` (goodput, billed chip-seconds,
  cost, each category's chip-seconds) and its timeline as ``HTML`` (``components.stages.timeline``).

Each function takes the artifact objects KFP hands the component (``metadata`` and ``path``/``uri``) and the run's
store; nothing here imports kfp. The stage's record in ``components.stages.table`` names what its component writes
(``for_train``, ...): a function of the run's context and the component's arguments, its artifacts under the names
its definition gives them.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from components.platforms import RunContext
from components.platforms.store import RunStore, read_json
from components.stages import timeline
from components.stages.loss_curve import loss_html, loss_png


class Artifact(Protocol):
    """What this module uses of an artifact KFP hands a component (``kfp.dsl.Artifact``, kfp 2.17's
    kfp/dsl/types/artifact_types.py): its metadata, its uri ('' until set) and the local path of its content."""

    metadata: dict[str, Any]
    uri: str

    @property
    def path(self) -> str: ...


class Metrics(Artifact, Protocol):
    """A ``kfp.dsl.Metrics`` artifact: scalar metrics in its metadata."""

    def log_metric(self, metric: str, value: float) -> None: ...


def _record(store: RunStore, stage: str) -> dict[str, Any]:
    return read_json(store, f"stages/{stage}.json") or {}


def point(artifact: Artifact, uri: str) -> None:
    """Name where ``artifact``'s content is (``uri``: the run's copy of its data, a checkpoint) in its metadata
    (``location``), and point its uri there where the backend takes that: Vertex AI (a task there has
    ``VERTEX_TASK_ENV``) and kfp.local (its uris are local paths). Kubeflow Pipelines' launcher refuses an output
    artifact whose uri is outside the pipeline root ("does not have expected bucket prefix": kubeflow/pipelines
    backend/src/v2/component/launcher_v2.go, uploadOutputArtifacts, and backend/src/v2/objectstore/config.go,
    KeyFromURI, at 2.15.0 and 2.17.0), so there the uri it gave stays."""
    import os

    from components.platforms import VERTEX_TASK_ENV

    if not uri:
        return
    artifact.metadata["location"] = uri
    if VERTEX_TASK_ENV in os.environ or "://" not in (artifact.uri or ""):
        artifact.uri = uri


def snapshot_data(store: RunStore, data: Artifact, card_md: Artifact) -> None:
    from components.stages.dataset import CARD, MANIFEST

    result = _record(store, "snapshot_data").get("result") or {}
    manifest = read_json(store, MANIFEST)
    text = store.read_text(CARD) if manifest else None
    if manifest is None or text is None:
        text = f"# Data card: `{result.get('dataset')}`\n\nNothing snapshotted: neither files nor a table.\n"
    copy = ((manifest or {}).get("copies") or {}).get("train") or {}
    point(data, copy.get("uri", ""))
    data.metadata.update(
        {
            "source": result.get("dataset") or "",
            "digest": copy.get("digest", ""),  # the content of the run's own copy
            "snapshot": (manifest or {}).get("digest", ""),
            "manifest": result.get("manifest") or "",
            "num_train_examples": (manifest or {}).get("num_train_examples", 0),
            "num_heldout_examples": (manifest or {}).get("num_heldout_examples", 0),
            "duplicates": (manifest or {}).get("duplicates", 0),
            "champion_duplicates": (manifest or {}).get("champion_duplicates", 0),
            "eval_overlap": (manifest or {}).get("eval_overlap", 0),
            "skip": (manifest or {}).get("skip") or "",
        }
    )
    with open(card_md.path, "w") as out:
        out.write(text)


def train(store: RunStore, spec: dict[str, Any], metrics: Metrics, loss_curve: Artifact) -> None:
    rec = _record(store, "train")
    result = rec.get("result") or {}
    losses = result.get("losses") or []
    figures = {
        "final_loss": losses[-1] if losses else None,
        "tokens_per_s": result.get("tokens_per_s"),
        "seconds": rec.get("seconds"),
        "restarts": result.get("restarts", 0),
    }
    for key, value in figures.items():
        if value is not None:
            metrics.log_metric(key, value)
    summary = {
        "run_id": rec.get("run_id", ""),
        "preset": spec["name"],
        "history": result.get("history") or [],
        "train_losses": losses,
        "steps": result.get("steps") or [],
    }
    if losses:
        with open(loss_curve.path, "w") as out:
            out.write(loss_html(summary, loss_png(summary)))


def evaluate(
    store: RunStore,
    spec: dict[str, Any],
    metrics: Metrics,
    summary_md: Artifact,
    model: Artifact,
    source_version: str = "",
) -> None:
    ev = (_record(store, "evaluate").get("result")) or {}
    for key in (
        "eval_loss_before",
        "eval_loss_after",
        "perplexity_before",
        "perplexity_after",
        "champion_loss",
        "perplexity_champion",
    ):
        if ev.get(key) is not None:
            metrics.log_metric(key, ev[key])
    task = ev.get("task") or {}
    champion_task = task.get("metrics_other") if task.get("against") == "champion" else None
    figures = {"before": task.get("metrics_before"), "after": task.get("metrics_after"), "champion": champion_task}
    for which, means in figures.items():  # the answers' task metrics (components.stages.answers)
        for name, value in (means or {}).items():
            metrics.log_metric(f"{name}_{which}", value)
    train_result = _record(store, "train").get("result") or {}
    image = _record(store, "build_image").get("result") or {}
    cluster, t = spec["cluster"], spec["train"]
    point(model, train_result.get("checkpoint_uri") or train_result.get("checkpoint") or "")
    model.metadata.update(
        {
            "preset": spec["name"],
            "base_model": ev.get("init_from")
            or (spec["maxtext"]["model_name"] if t["workload"] == "maxtext" else t["model_id"]),
            "accelerator": cluster["accelerator"],
            "topology": cluster["topology"],
            "slices": cluster["num_slices"],
            "trainer_image": image.get("image", ""),
            "trainer_image_digest": image.get("digest", ""),
            "git_sha": source_version,
            "eval_loss_after": ev.get("eval_loss_after"),
            "eval_loss_before": ev.get("eval_loss_before"),
            "run_id": _record(store, "train").get("run_id", ""),
        }
    )
    from components.spec import RunSpec
    from components.stages.gate import not_held_out

    why = not_held_out(RunSpec.from_json(json.dumps(spec))) if spec else None
    what = "eval" if why else "held-out"
    rows = [
        (f"{what} loss", ev.get("eval_loss_before"), ev.get("eval_loss_after")),
        (f"{what} perplexity", ev.get("perplexity_before"), ev.get("perplexity_after")),
    ]
    lines = ["| | untrained | trained |", "|---|---|---|"]
    lines += [f"| {name} | {_num(before)} | {_num(after)} |" for name, before, after in rows]
    if why:
        lines += ["", f"Not held out: {why}; the gate does not promote on it."]
    if ev.get("champion"):
        lines += [
            "",
            f"Champion `{ev['champion']['ref']}`, measured in the same job: held-out loss "
            f"{_num(ev.get('champion_loss'))}, perplexity {_num(ev.get('perplexity_champion'))}.",
        ]
    lines += ["", f"Model: `{model.uri}`", "", "```json", json.dumps(model.metadata, indent=2, sort_keys=True), "```"]
    from components.stages.answers import SIDE_BY_SIDE

    page = store.read_text(SIDE_BY_SIDE) if task.get("side_by_side") else None
    if page:  # the answers side by side, as the run directory keeps them
        lines += ["", page]
    with open(summary_md.path, "w") as out:
        out.write("\n".join(lines) + "\n")


def register(store: RunStore, metrics: Metrics, table_md: Artifact, registered: Artifact | None = None) -> None:
    """The gate's decision as the run's graph shows it: both figures, and why; the version registered."""
    rec = _record(store, "register")
    result = rec.get("result") or {}
    if registered is not None and not result.get("skipped"):
        vertex_model(registered, result)
    if result.get("skipped"):
        with open(table_md.path, "w") as out:
            out.write(f"Gate off: {result['reason']}.\n")
        return
    figures = {
        "eval_loss": result.get("eval_loss"),
        "champion_loss": result.get("champion_loss"),
        "improvement": result.get("improvement"),
        "min_improvement": result.get("min_improvement"),
        "promote": 1.0 if result.get("decision") == "promote" else 0.0,
        "version": float(result["version"]) if str(result.get("version", "")).isdigit() else None,
    }
    for key, value in figures.items():
        if value is not None:
            metrics.log_metric(key, value)
    champion = result.get("champion_ref") or "none"
    lines = [
        f"**Gate: {result.get('decision')}** — {result.get('reason')}",
        "",
        "| model | held-out loss |",
        "|---|---|",
        f"| new: `{result.get('ref')}` | {_num(result.get('eval_loss'))} |",
        f"| champion: `{champion}` | {_num(result.get('champion_loss'))} |",
        "",
    ]
    improvement = result.get("improvement")
    lines.append(
        f"Improvement {'-' if improvement is None else f'{improvement:.2%}'}; needed "
        f"{result.get('min_improvement', 0):.2%} (gate.min_improvement). Registry: {result.get('registry')}."
    )
    if result.get("provenance"):
        lines += ["", "| provenance | |", "|---|---|"]
        lines += [f"| {key} | `{value}` |" for key, value in result["provenance"].items()]
    with open(table_md.path, "w") as out:
        out.write("\n".join(lines) + "\n")


def vertex_model(artifact: Artifact, result: dict[str, Any]) -> None:
    """The registered version as a google.VertexModel: ``resourceName`` ``projects/P/locations/L/models/M@V`` and
    the uri ``https://L-aiplatform.googleapis.com/v1/<resourceName>`` (the form google-cloud-pipeline-components'
    ``VertexModel.create`` documents for its uri), with the version's reference."""
    resource = result.get("resource_name") or ""
    artifact.metadata["ref"] = result.get("ref", "")
    if resource:
        location = resource.split("/")[3]
        artifact.uri = f"https://{location}-aiplatform.googleapis.com/v1/{resource}"
        artifact.metadata["resourceName"] = resource
    else:
        point(artifact, result.get("artifact_uri") or "")


def run_ledger(store: RunStore, metrics: Metrics, timeline_html: Artifact) -> None:
    """The whole run's account, from its summary (written as teardown ends): goodput, billed chip-seconds and cost
    with each category's chip-seconds as ``Metrics``, and the timeline page as ``HTML``."""
    summary = read_json(store, "summary.json") or {}
    g = summary.get("goodput") or {}
    figures = {"goodput": g.get("goodput"), "billed_chip_s": g.get("billed_chip_s"), "usd": g.get("usd")}
    figures |= {f"chip_s: {c['name']}": c["chip_s"] for c in g.get("categories") or []}
    for key, value in figures.items():
        if value is not None:
            metrics.log_metric(key, value)
    if summary:
        with open(timeline_html.path, "w") as out:
            out.write(timeline.page(summary))


def teardown(store: RunStore, deleted_md: Artifact) -> None:
    rec = _record(store, "teardown")
    deleted = (rec.get("result") or {}).get("deleted") or []
    lines = [f"Teardown {rec.get('status', 'unknown')}: {len(deleted)} resources deleted.", ""]
    lines += [f"- `{name}`" for name in deleted] or ["Nothing was left to delete."]
    if rec.get("error"):
        lines += ["", f"Error: {rec['error']}"]
    with open(deleted_md.path, "w") as out:
        out.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- what each stage's component writes


def for_snapshot_data(ctx: RunContext, args: dict[str, Any]) -> None:
    snapshot_data(ctx.store, args["data"], args["card"])


def for_train(ctx: RunContext, args: dict[str, Any]) -> None:
    train(ctx.store, ctx.spec.to_dict(), args["metrics"], args["loss_curve"])


def for_evaluate(ctx: RunContext, args: dict[str, Any]) -> None:
    evaluate(ctx.store, ctx.spec.to_dict(), args["metrics"], args["summary"], args["model"], args["source_version"])


def for_register(ctx: RunContext, args: dict[str, Any]) -> None:
    register(ctx.store, args["metrics"], args["gate"], args["registered"])


def for_teardown(ctx: RunContext, args: dict[str, Any]) -> None:
    teardown(ctx.store, args["deleted"])
    run_ledger(ctx.store, args["goodput"], args["timeline"])


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
