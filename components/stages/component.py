"""What a KFP component calls: :func:`run_component` with the component's arguments (``components.definitions``) runs
its stage (``components.stages.runner.run_stage``) and writes the stage's typed artifacts
(``components.stages.artifacts``) from the records the stage left in the run's store."""

from __future__ import annotations

import json
from typing import Any

from components.stages import artifacts
from components.stages.runner import run_stage, stage_context

# The argument of each component that carries the upstream stage's result.
UPSTREAM = {
    "deploy_raycluster": "image",
    "check_slice": "raycluster",
    "train": "raycluster",
    "evaluate": "train_result",
    "register": "eval_result",
    "promote": "decision",
}
# What a stage's runner takes beyond the spec: its keyword argument -> the component's argument that carries it.
FACTS = {"register": {"pipeline_job": "job_name", "source_version": "source_version"}}
# A component whose output is one field of its stage's result (what the pipeline's condition reads), not all of it.
OUTPUT_FIELD = {"register": "decision"}


def with_target(overrides: str, project: str, bucket: str) -> str:
    """The pipeline's ``project`` and ``bucket`` parameters (set when the pipeline was compiled) as spec overrides,
    before the user's own, which win."""
    import shlex

    target = [f"gke.project={project}"] if project else []
    target += [f"gke.bucket={bucket}"] if bucket else []
    return " ".join([*(shlex.quote(t) for t in target), overrides]).strip()


def run_component(stage: str, args: dict[str, Any]) -> str:
    """What a KFP component calls with its arguments (its ``locals()``): the stage, then the stage's typed
    artifacts (``components.stages.artifacts``), written from the records the stage left in the run's store."""

    overrides = with_target(args["overrides"], args.get("project", ""), args.get("bucket", ""))
    common = (args["preset"], args["platform"], overrides, args["run_id"], args["job_name"], args["output_root"])
    facts = {key: args[arg] for key, arg in FACTS.get(stage, {}).items()}
    result = run_stage(stage, *common, args.get(UPSTREAM.get(stage, ""), ""), **facts)
    ctx = stage_context(stage, *common)
    spec = ctx.spec.to_dict()
    if stage == "train":
        artifacts.train(ctx.store, spec, args["metrics"], args["loss_curve"])
    elif stage == "evaluate":
        artifacts.evaluate(ctx.store, spec, args["metrics"], args["summary"], args["model"], args["source_version"])
    elif stage == "register":
        artifacts.register(ctx.store, args["metrics"], args["gate"], args["registered"])
    elif stage == "teardown":
        artifacts.teardown(ctx.store, args["deleted"])
        artifacts.run_ledger(ctx.store, args["goodput"], args["timeline"])
    field = OUTPUT_FIELD.get(stage)
    return json.loads(result)[field] if field else result
