"""`tpupipe plan`'s text: the plan document (``document.build``) rendered for a person: its resources, the train
job, what is billed before training, the cost, and the run's limits.
"""

from __future__ import annotations

import shlex
from typing import Any

from components.platforms.gke.plan import accounts, candidates
from components.spec import names
from components.workload import budget, fsdp_plan, weights


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.2f}"


def render_text(plan: dict[str, Any]) -> str:
    s = plan["slice"]
    out = [
        f"tpupipe plan {plan['preset']} (gke): creates nothing. Run id {plan['run_id']}: every name below derives "
        "from it (a pipeline run uses its own).",
        f"slice      {s['family']} {s['topology']} x {s['num_slices']}: {s['chips_per_slice']} chips on "
        f"{s['hosts_per_slice']} x {s['machine_type']} ({s['chips_per_host']} chips each) per slice; "
        f"{s['total_chips']} chips, {s['total_hosts']} hosts in all; {s['capacity']}",
        f"where      project {plan['project']}, zone {plan['zone']}, cluster {plan['cluster']['name']} "
        f"({plan['cluster']['mode']})",
        "",
        *_render_resources(plan),
        "",
        *accounts.render(plan),
        "",
        *_render_training(plan["training"]),
        "",
        *_render_cost(plan["cost"], plan["before_training"], s["capacity"]),
        "",
        *_render_limits(plan["limits"]),
        *candidates.render(plan),
    ]
    if plan["warnings"]:
        out += ["", "warnings"] + [f"  - {w}" for w in plan["warnings"]]
    return "\n".join(out) + "\n"


def _render_resources(plan: dict[str, Any]) -> list[str]:
    label = f"{names.RUN_LABEL}={plan['run_id']}"
    costs = {(ln["kind"], ln["resource"]): ln for ln in plan["cost"]["lines"]}
    out = ["resources"]
    for res in plan["resources"]:
        tag = label if res["labels"] else "shared: no run label"
        kept = "" if res["deleted_by_teardown"] else "; kept after the run"
        price = ""
        ln = costs.get((res["kind"], res["name"]))
        if ln:
            price = f"  {_usd(ln['usd_per_hour'])}/h" if ln["usd_per_hour"] is not None else "  price unknown"
        out.append(f"  {res['action']:<13} {res['kind']:<25} {res['name']}{price}")
        out.append(f"  {'':<13} {'':<25} {res['summary']}  [{tag}{kept}]")
    return out


def _render_training(tr: dict[str, Any]) -> list[str]:
    """The train job: its submission id, its command line (the spec abbreviated), Ray Train's configs."""
    scaling = ", ".join(f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in tr["scaling_config"].items())
    words = shlex.split(tr["entrypoint"])
    words[words.index("--spec") + 1] = "<the run spec, JSON>"
    command = " ".join(w if w.startswith("<") else shlex.quote(w) for w in words)
    return [
        "training",
        f"  ray job     submission id {tr['submission_id']} (Ray Jobs API), deadline {tr['timeout_s']:g} s",
        f"  entrypoint  {command}",
        f"  scaling     ScalingConfig({scaling})",
        f"  failures    {tr['run_config']['failure_config']}" + ("  (elastic)" if tr["elastic"] else ""),
        *(
            [
                f"  checkpoints every {tr['checkpoints']['period_steps']} steps: a preemption repeats at most as many "
                f"(maxtext.max_lost_steps={tr['checkpoints']['max_lost_steps']})"
            ]
            if "checkpoints" in tr
            else []
        ),
        *(
            [
                f"  kept        the newest {tr['checkpoints']['kept']} checkpoints: "
                f"{_gb(tr['checkpoints']['bytes_kept'])} ({_gb(tr['checkpoints']['bytes_each'])} each: "
                f"{tr['checkpoints']['parameters'] or 0:,} parameters and AdamW's two moments, 4 bytes each)"
            ]
            if "checkpoints" in tr
            else []
        ),
        *_answer_lines(tr.get("answers")),
        *(
            [
                f"  compiled    {tr['compile_cache']['uri']} (kept across runs, read-only to pods; entries matching "
                f"{tr['compile_cache']['manifest']} staged to {tr['compile_cache']['path']}; what the train job "
                "compiles stays there)",
                f"  compile job {tr['compile_cache']['compile_job']['submission_id']} fills it, as "
                f"{tr['compile_cache']['compile_job']['identity']}, into {tr['compile_cache']['compile_job']['path']}: "
                f"trusted because {tr['compile_cache']['compile_job']['trusted_because']}",
            ]
            if tr.get("compile_cache")
            else []
        ),
        *fsdp_plan.plan_lines(tr),
        *weights.plan_lines(tr.get("base_weights")),
    ]


def _answer_lines(answers: dict[str, Any] | None) -> list[str]:
    """The MaxText train job's answers to the evaluation prompts: its decode slots and what a chip holds for them."""
    if not answers:
        return []
    return [
        f"  answers     {answers['prompts']} prompts in {answers['slots']} decode slots (the training batch "
        f"{answers['training_batch']}, bounded by the prompts and the KV cache's budget), each caching at most "
        f"{answers['cache_tokens']:,} tokens: a KV cache of {_gb(answers['kv_cache_bytes_per_chip'])} a chip beside "
        f"the parameters' {_gb(answers['parameter_bytes_per_chip'])}, of {_gb(answers['hbm_bytes_per_chip'])} HBM"
    ]


def _gb(n: int | None) -> str:
    return "unknown size" if n is None else f"{n / 1e9:,.1f} GB"


# capacity=queued: no node of a slice exists, and nothing of it is billed, until its pool's ProvisioningRequest is
# Provisioned, all at once (GKE docs, https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest:
# "GKE allocates all requested resources at the same time"); the chips are billed from then.
BILLED_FROM = {
    "queued": "their nodes' arrival, each slice's all at once when its pool's ProvisioningRequest is Provisioned "
    "(nothing is billed while it is queued),"
}


def _render_before_training(b: dict[str, Any], capacity: str) -> list[str]:
    check = f" + the slice check (at most {b['slice_check_s']:g} s)" if b["slice_check_s"] else ""
    since = BILLED_FROM.get(capacity, "their node pools' creation")
    return [
        f"  before training               at most {b['chip_minutes_at_most']:g} chip-minutes "
        f"({_usd(b['usd_at_most'])}): {b['chips']} chips from {since} through readiness "
        f"(at most {b['readiness_s']:g} s){check}; the image builds beside provision",
    ]


def _render_cost(cost: dict[str, Any], before: dict[str, Any], capacity: str = "") -> list[str]:
    out = [
        f"cost ({cost['currency']}, list prices)",
        f"  per hour                      {_usd(cost['usd_per_hour'])}",
        f"  {'for ' + format(cost['expected_hours'], 'g') + ' h expected':<29} "
        f"{_usd(cost['usd_for_expected_duration'])}",
    ]
    if "upper_bound_usd_per_hour" in cost:
        out.append(
            f"  at most (on-demand prices)    {_usd(cost['upper_bound_usd_per_hour'])}/h, "
            f"{_usd(cost['upper_bound_usd_for_expected_duration'])} for {cost['expected_hours']:g} h"
        )
    out += _render_before_training(before, capacity)
    for key, src in cost["sources"].items():
        out.append(f"  price {key}: {src['source']} ({src['date']})")
    return out


def _render_limits(lim: dict[str, Any]) -> list[str]:
    """The budget and deadline the run is held to, and what set each (``components.workload.budget``)."""
    cost, deadline = budget.describe(lim)
    return [
        "limits (past one, the running job is stopped, its stage fails and teardown runs)",
        f"  budget     {cost}",
        f"  deadline   {deadline}",
    ]
