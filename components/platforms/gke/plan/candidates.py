"""Where a gke run may get its slices, in the order provision tries them: every zone of ``gke.zones`` (else
``gke.zone`` alone) for every rung of ``cluster.capacity`` (a single capacity type, or a ladder such as
``reservation,on-demand,spot``), rung by rung. Each candidate is the run's spec *placed* (``place``): one zone, one
capacity type. The plan prices each and says why any is excluded before a call is made (flex-start where it is not
offered, an expected cost over ``run.max_cost_usd``); preflight checks each against the project (quota, the
reservation's room, the machine types offered) and provision takes the first that passes, the next on a stockout.

The plan describes the first candidate (``first``); the stages after provision run on the one provision took, which
the run's ledger records (``chosen``). A spec with one candidate is its own placement, unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from components.spec import RunSpec
from components.tpu import catalogue
from components.workload import budget

# Where flex-start TPUs can be had, by family: Cloud TPU, "Request Cloud TPUs using Flex-start", Limitations
# (https://cloud.google.com/tpu/docs/request-using-flex-start#limitations): v6e for training and serving in
# asia-northeast1-b and us-east5-a; v5e for training in us-west4-a (us-central1-a serves only). It names no other
# family: flex-start for v5p or TPU7x is refused until the page lists a zone for it. "TPU regions and zones"
# (https://cloud.google.com/tpu/docs/regions-zones) sends flex-start requests to that list: "you must use a zone that
# supports the feature". The list is Cloud TPU's; tpupipe holds GKE's flex-start TPU node pools to it too (both are
# Dynamic Workload Scheduler's flex-start), and says so where it refuses one (``flex_start_refusal``).
FLEX_START_ZONES: dict[str, tuple[str, ...]] = {
    "v6e": ("us-east5-a", "asia-northeast1-b"),
    "v5e": ("us-west4-a",),
}


@dataclass(frozen=True)
class Candidate:
    zone: str
    capacity: str
    usd_per_hour: float | None = None  # the placed plan's hourly price; None: a price the table lacks
    excluded: str = ""  # why the plan excludes it before any call; "": provision may try it

    @property
    def key(self) -> dict[str, str]:
        """What the ledger records of the candidate a run took."""
        return {"zone": self.zone, "capacity": self.capacity}

    def __str__(self) -> str:
        return f"{self.capacity} in {self.zone}"


def zones(spec: RunSpec) -> tuple[str, ...]:
    """The zones the run may take, in order: ``gke.zones``, else ``gke.zone``, else the family's first zone."""
    return spec.gke.zone_choices or (catalogue.zones(spec.cluster.accelerator)[0],)


def place(spec: RunSpec, zone: str, capacity: str) -> RunSpec:
    """``spec`` in one zone with one capacity type; a spec whose only candidate this is comes back unchanged."""
    if spec.cluster.capacities == (capacity,) and zones(spec) == (zone,):
        return spec
    return dataclasses.replace(
        spec,
        cluster=dataclasses.replace(spec.cluster, capacity=capacity),
        gke=dataclasses.replace(spec.gke, zone=zone, zones=""),
    )


def first(spec: RunSpec) -> RunSpec:
    """The first candidate's placement: what the plan and the dry run describe."""
    return place(spec, zones(spec)[0], spec.cluster.capacities[0])


def flex_start_refusal(spec: RunSpec) -> str:
    """Why flex-start cannot be had in a placed spec's zone (``FLEX_START_ZONES``); "" when it can, or is not asked."""
    family, zone = catalogue.family(spec.cluster.accelerator).name, zones(spec)[0]
    offered = FLEX_START_ZONES.get(family, ())
    if spec.cluster.capacity != "flex-start" or zone in offered:
        return ""
    return (
        f"flex-start {family} is not offered in zone {zone}; zones that offer it: {', '.join(offered) or 'none'} "
        '(Cloud TPU, "Request Cloud TPUs using Flex-start")'
    )


def order(spec: RunSpec) -> list[dict[str, str]]:
    """Every candidate's ``Candidate.key``, in the order provision tries them (``ranked``'s, unpriced)."""
    return [{"zone": zone, "capacity": capacity} for capacity in spec.cluster.capacities for zone in zones(spec)]


def several(spec: RunSpec) -> bool:
    """More than one candidate: the plan lists them."""
    return len(spec.cluster.capacities) * len(zones(spec)) > 1


def ranked(spec: RunSpec, cost_of: Callable[[RunSpec], Mapping[str, Any]]) -> list[Candidate]:
    """Every candidate in the order provision tries them, priced by ``cost_of`` (the placed plan's cost), with why
    the plan excludes it: flex-start where it is not offered, an expected cost over the budget."""
    out = []
    for capacity in spec.cluster.capacities:
        for zone in zones(spec):
            placed = place(spec, zone, capacity)
            cost = cost_of(placed)
            over, _ = budget.plan_check(budget.limits(placed, cost), cost)
            why = flex_start_refusal(placed) or (f"run.max_cost_usd: {over}" if over else "")
            out.append(Candidate(zone, capacity, cost["usd_per_hour"], why))
    return out


def chosen(spec: RunSpec, ledger: Mapping[str, Any]) -> RunSpec:
    """The placement provision took, as the ledger records it (``Candidate.key``), else the first. A recorded one
    that is not among the spec's candidates is not trusted (the ledger is the run's state, not its input)."""
    taken = ledger.get("candidate") or {}
    zone, capacity = taken.get("zone"), taken.get("capacity")
    if zone in zones(spec) and capacity in spec.cluster.capacities:
        return place(spec, zone, capacity)
    return first(spec)


def section(candidates: list[Candidate]) -> dict[str, Any]:
    """The plan's ``candidates`` (only where there are several: a single one is the plan itself)."""
    if len(candidates) < 2:
        return {}
    return {"candidates": [{**c.key, "usd_per_hour": c.usd_per_hour, "excluded": c.excluded} for c in candidates]}


def render(plan: Mapping[str, Any]) -> list[str]:
    """The plan's candidates as text, in the order provision tries them; the plan above describes the first."""
    if not plan.get("candidates"):
        return []
    out = ["", "candidates (provision takes the first that preflight passes, the next on a stockout; above: the first)"]
    for index, c in enumerate(plan["candidates"], 1):
        price = "price unknown" if c["usd_per_hour"] is None else f"${c['usd_per_hour']:,.2f}/h"
        state = f"excluded: {c['excluded']}" if c["excluded"] else "tried in turn"
        out.append(f"  {index}. {c['capacity']:<12} {c['zone']:<18} {price:<14} {state}")
    return out
