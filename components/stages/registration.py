"""The register and promote stages: the trained checkpoint becomes a new version of the run's model in the registry,
with its provenance and the gate's decision (``components.stages.gate``), and ``champion`` moves to it only when the
decision says so."""

from __future__ import annotations

import json
from typing import Any

from components.platforms import RunContext, get_platform
from components.platforms.store import read_json
from components.spec import CHAMPION
from components.stages import answers, gate, ray_stages, task_gate
from components.stages.jobs import JobFailed, log


def register(ctx: RunContext, upstream: str, pipeline_job: str = "", source_version: str = "") -> dict[str, Any]:
    """Register the trained checkpoint as a new version of ``spec.model_name`` with its provenance, and decide the
    gate from the evaluation's figures (``upstream``): ``promote`` or ``keep``. No alias moves here: the version
    exists before anything names it, and the promote stage moves ``champion`` only when the decision says so."""
    if not ctx.spec.gate.register:
        log("register: skipped (gate.register=false)")
        return {"skipped": True, "decision": gate.OFF, "reason": "gate.register=false: nothing registered"}
    ev = json.loads(upstream) if upstream else {}
    records = {
        stage: (read_json(ctx.store, f"stages/{stage}.json") or {}).get("result") or {}
        for stage in ("snapshot_data", "build_image", "train")
    }
    records["evaluate"] = ev
    train_result = records["train"]
    if not train_result.get("checkpoint"):
        raise JobFailed("register: the train stage reported no checkpoint")
    artifact_uri = ray_stages.trained_uri(ctx, train_result)
    measured = ev.get(ray_stages.MEASURED) or {}
    if measured.get("uri") != artifact_uri or not measured.get("versions"):
        raise JobFailed(
            f"register: the evaluate stage recorded no version of the files of checkpoint {artifact_uri} (it "
            f"measured {measured.get('uri') or 'none'}): nothing registered that was not evaluated"
        )
    platform = get_platform(ctx.platform)
    # The version names a copy out of every run's reach, not the run's own prefix, which its pods (and, were its id
    # ever reused, another run's) could write; of exactly the bytes the evaluate stage measured.
    artifact_uri = platform.keep_registered(ctx, artifact_uri, ctx.spec.model_name, measured["versions"])
    provenance = gate.provenance(ctx.spec, ctx.run_id, records, source_version, pipeline_job, platform.hosts_lost(ctx))
    reg = gate.registry(ctx)
    version = gate.register_once(reg, ctx.spec.model_name, artifact_uri, provenance)
    champion = ev.get("champion") or {}
    not_held_out = gate.not_held_out(ctx.spec)
    if not_held_out:  # a loss on the training data says nothing of the model on new data: never promoted on it
        kept = f"{CHAMPION} {champion['ref']} kept" if champion.get("ref") else f"no {CHAMPION} set"
        decision = gate.Decision(
            gate.KEEP, f"not promoted: {version.ref}'s evaluation is not held out ({not_held_out}); {kept}"
        )
    elif champion.get("not_compared"):  # a champion over another base, promoted after this run's first task checked
        decision = gate.Decision(
            gate.KEEP, f"kept {CHAMPION} {champion['ref']}: {version.ref} not compared: {champion['not_compared']}"
        )
    else:
        decision = gate.decide(
            ev["eval_loss_after"],
            ev.get("champion_loss"),
            ctx.spec.gate.min_improvement,
            version.ref,
            champion.get("ref", ""),
        )
    task = ev.get("task") or {}
    decided: dict[str, Any] = {"decided_by": None, "guards": [], "guard_failed": None}
    if not not_held_out and not champion.get("not_compared"):  # the figure and guards the team chose
        decision, decided = task_gate.decide(ctx.spec, decision, task, version.ref, champion.get("ref", ""))
    answers.rewrite_with_reason(ctx.spec, ctx.store, task, decision.reason)  # the reviewer's page says the decision
    log(f"register: {version.ref} in {reg.where}")
    log(f"gate: {decision.reason}")
    return {
        "model": version.name,
        "version": version.version,
        "ref": version.ref,
        "artifact_uri": artifact_uri,
        "registry": reg.where,
        "resource_name": reg.resource(version),
        "decision": decision.decision,
        "reason": decision.reason,
        "eval_loss": ev.get("eval_loss_after"),  # none when the evaluation was not held out and so not measured
        "champion_loss": ev.get("champion_loss"),
        "champion_ref": champion.get("ref"),
        "champion_version": champion.get("version"),
        "improvement": decision.improvement,
        "min_improvement": ctx.spec.gate.min_improvement,
        "held_out": not not_held_out,
        **decided,  # which figure decided, each guard and the first that failed (task_gate.decide)
        "provenance": version.provenance,
    }


def promote(ctx: RunContext, upstream: str) -> dict[str, Any]:
    """Move ``champion`` to the version the register stage registered (its record) when the gate's decision
    (``upstream``) is ``promote``: the pipeline runs this stage only then, after the version exists. A champion that
    moved since the evaluation measured it (another run promoted meanwhile) is not replaced: the new version was
    shown better than the old champion only."""
    registered = (read_json(ctx.store, "stages/register.json") or {}).get("result") or {}
    if upstream != gate.PROMOTE or registered.get("decision") != gate.PROMOTE:
        raise JobFailed(f"promote: the gate decided {registered.get('decision') or upstream!r}, not {gate.PROMOTE!r}")
    reg = gate.registry(ctx)
    name, version = registered["model"], registered["version"]
    current = reg.champion(name)
    measured = registered.get("champion_version")
    if current is not None and current.version == version:  # a retried task whose first attempt moved it
        log(f"promote: {CHAMPION} of {name} is {registered['ref']} already")
        return {"promoted": True, "ref": registered["ref"], "previous": measured, "reason": registered["reason"]}
    if (current.version if current else None) != measured:
        was = f"{name}@{measured}" if measured else f"no {CHAMPION}"
        reason = (
            f"not promoted: {registered['ref']} was measured against {was}, and the {CHAMPION} is "
            f"{current.ref if current else 'none'} now; the next run measures against it"
        )
        log(f"promote: {reason}")
        return {"promoted": False, "ref": registered["ref"], "reason": reason}
    reg.promote(name, version)
    log(f"promote: {CHAMPION} of {name} is now {registered['ref']} (was {measured or 'none'})")
    return {"promoted": True, "ref": registered["ref"], "previous": measured, "reason": registered["reason"]}
