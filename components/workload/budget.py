"""A run's budget and deadline (the spec's ``run`` section) against what its resources cost: the limits in effect
(the spec's, else the platform's default), whether the plan fits the budget, and, while the run goes, what it has
spent and how long it has taken, and the limit it crossed. Plain arithmetic over the plan's cost
(``components.platforms.gke.plan.document``, priced by ``components.tpu.pricing``): no price is looked up here.

- Spent money counts from the end of ``provision`` (its node pools exist, the chips bill), as the plan's "before
  training" figure and the run's summary count it: the plan's hourly price of the run's resources x the hours since.
- Elapsed time counts from the start of the run's first stage.
- On gke an unset budget defaults to ``DEFAULT_MULTIPLE`` x the plan's expected cost (its hourly price for
  ``cluster.expected_hours``). Where a price is unknown there is no default budget (the run's spending cannot be
  counted) and the deadline defaults to ``DEFAULT_MULTIPLE`` x ``cluster.expected_hours`` instead, so a gke run always
  has a limit. Nothing is billed on the local platform, which sets no default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from components.spec import RunSpec

DEFAULT_MULTIPLE = 3.0  # a run may cost (or take) this many times what its plan expects before it is stopped


@dataclass(frozen=True)
class Limits:
    """The budget and the deadline a run is held to, each with what set it (the field, or how the default derives),
    and the hourly price its spending is counted at."""

    max_cost_usd: float | None  # None: no budget
    max_cost_by: str
    deadline_h: float | None  # None: no deadline
    deadline_by: str
    usd_per_hour: float | None  # the plan's price of the run's resources; 0.0: nothing billed; None: a price unknown
    missing_prices: tuple[str, ...] = ()  # the price keys the table lacks (``pricing.summarize``)


def usd(value: float) -> str:
    """Dollars as the limits' messages write them: cents, or four decimals for a sum of less than a dollar that cents
    would round."""
    return f"${value:,.2f}" if value >= 1 or value == round(value, 2) else f"${value:.4f}"


def limits(spec: RunSpec, cost: Mapping[str, Any] | None) -> Limits:
    """The limits ``spec`` runs under; ``cost`` is the plan's (``pricing.summarize``: the hourly price, the missing
    prices), or None where nothing is billed (the local platform: the spec's limits, no default)."""
    r, hours = spec.run, spec.cluster.expected_hours
    per_hour = 0.0 if cost is None else cost["usd_per_hour"]
    missing = () if cost is None else tuple(cost["missing_prices"])
    if r.max_cost_usd is not None:
        budget, budget_by = r.max_cost_usd, "run.max_cost_usd"
    elif cost is not None and per_hour is not None:
        # In cents, rounded up: a tiny expected cost still leaves a budget above zero.
        budget = math.ceil(DEFAULT_MULTIPLE * per_hour * hours * 100 - 1e-9) / 100
        budget_by = (
            f"the default: {DEFAULT_MULTIPLE:g} x the plan's expected cost, {usd(per_hour * hours)} for "
            f"cluster.expected_hours={hours:g} at {usd(per_hour)}/h"
        )
    else:
        budget = None
        budget_by = "run.max_cost_usd is unset" + (
            f", and with no price for {', '.join(missing)} there is no default" if missing else ""
        )
    if r.deadline_h is not None:
        deadline, deadline_by = r.deadline_h, "run.deadline_h"
    elif cost is not None and per_hour is None:
        deadline = DEFAULT_MULTIPLE * hours
        deadline_by = f"the default where a price is unknown: {DEFAULT_MULTIPLE:g} x cluster.expected_hours={hours:g}"
    else:
        deadline, deadline_by = None, "run.deadline_h is unset"
    return Limits(budget, budget_by, deadline, deadline_by, per_hour, missing)


def describe(lim: Limits | Mapping[str, Any]) -> tuple[str, str]:
    """The budget and the deadline in words, each with what set it: for the plan (its JSON form of ``Limits``) and
    preflight."""
    f = asdict(lim) if isinstance(lim, Limits) else lim
    cost = "none" if f["max_cost_usd"] is None else f"{usd(f['max_cost_usd'])}, from provision's end"
    deadline = "none" if f["deadline_h"] is None else f"{f['deadline_h']:g} h, from the run's first stage"
    return f"{cost} ({f['max_cost_by']})", f"{deadline} ({f['deadline_by']})"


def plan_check(lim: Limits, cost: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(problem, warning) of the plan's expected cost (``cost``, the plan's) against the budget: a problem when it
    exceeds the budget; a warning naming the missing price when a price is unknown and the budget cannot be checked
    (unless the on-demand upper bound fits it). (None, None) when it fits, or when there is no budget."""
    budget = lim.max_cost_usd
    if budget is None:
        return None, None
    expected, hours = cost["usd_for_expected_duration"], cost["expected_hours"]
    if expected is not None:
        if expected <= budget:
            return None, None
        return (
            f"the plan's expected cost {usd(expected)} (cluster.expected_hours={hours:g} at "
            f"{usd(cost['usd_per_hour'])}/h, list prices) exceeds the budget {usd(budget)} ({lim.max_cost_by}): raise "
            "the budget, or plan a shorter or smaller run"
        ), None
    bound = cost.get("upper_bound_usd_for_expected_duration")
    if bound is not None and bound <= budget:
        return None, None
    return None, (
        f"the budget {usd(budget)} ({lim.max_cost_by}) cannot be checked: no price for "
        f"{', '.join(lim.missing_prices)}"
        + (f" (at on-demand prices the plan costs at most {usd(bound)} for {hours:g} h)" if bound is not None else "")
        + (
            f"; nor can the run count what it spends: its deadline ({lim.deadline_h:g} h) alone bounds it"
            if lim.deadline_h is not None
            else "; nor can the run count what it spends: set run.deadline_h to bound it"
        )
    )


@dataclass(frozen=True)
class Watch:
    """What a stage that waits on the run holds it to: its limits and the instants they count from (epoch seconds;
    None: unknown, so that limit is not counted)."""

    limits: Limits
    billing_since: float | None  # provision's end: the chips bill from there
    started: float | None  # the run's first stage's start

    def stops(self) -> dict[str, float]:
        """When (epoch seconds) each limit that can be counted is crossed: ``budget``, ``deadline``."""
        lim, out = self.limits, {}
        if lim.max_cost_usd is not None and lim.usd_per_hour and self.billing_since is not None:
            out["budget"] = self.billing_since + lim.max_cost_usd / lim.usd_per_hour * 3600
        if lim.deadline_h is not None and self.started is not None:
            out["deadline"] = self.started + lim.deadline_h * 3600
        return out

    def stop_at(self) -> float | None:
        """The first instant a limit is crossed; None when no limit is counted."""
        return min(self.stops().values(), default=None)

    def crossed(self, now: float, slack_s: float = 0.0) -> str | None:
        """``stopped: budget: ...`` or ``stopped: deadline: ...`` with the figures, for the first limit crossed by
        ``now`` (within ``slack_s``: a timer that woke a moment early); None while the run is within both."""
        due = sorted((at, name) for name, at in self.stops().items() if at <= now + slack_s)
        if not due:
            return None
        at, name = due[0]
        now, lim = max(now, at), self.limits
        if name == "budget":
            # stops() counts the budget only with its price and provision's end known
            assert lim.max_cost_usd is not None and lim.usd_per_hour is not None and self.billing_since is not None
            billed_h = hours(self.billing_since, now)
            return (
                f"stopped: budget: {usd(spent(lim.usd_per_hour, self.billing_since, now))} spent of the "
                f"{usd(lim.max_cost_usd)} budget ({lim.max_cost_by}): {billed_h:.3g} h since provision ended at "
                f"{usd(lim.usd_per_hour)}/h (list prices)"
            )
        assert self.started is not None  # stops() counts the deadline only from a known start
        return (
            f"stopped: deadline: {hours(self.started, now):.3g} h elapsed of the {lim.deadline_h:g} h deadline "
            f"({lim.deadline_by}) since the run's first stage started"
        )

    def lines(self, now: float) -> list[str]:
        """What is watched and where the run stands, or why a limit set cannot be counted: for the stage's log."""
        lim, out = self.limits, []
        if lim.max_cost_usd is not None:
            head = f"budget {usd(lim.max_cost_usd)} ({lim.max_cost_by})"
            if lim.usd_per_hour is None:
                out.append(f"{head}: not counted, no price for {', '.join(lim.missing_prices)}")
            elif not lim.usd_per_hour:
                out.append(f"{head}: not counted, the platform bills nothing")
            elif self.billing_since is None:
                out.append(f"{head}: not counted, the run's store has no record of provision's end")
            else:
                so_far = spent(lim.usd_per_hour, self.billing_since, now)
                out.append(f"{head}: {usd(so_far)} spent so far at {usd(lim.usd_per_hour)}/h")
        if lim.deadline_h is not None:
            head = f"deadline {lim.deadline_h:g} h ({lim.deadline_by})"
            if self.started is None:
                out.append(f"{head}: not counted, the run's store has no record of its first stage")
            else:
                out.append(f"{head}: {hours(self.started, now):.3g} h elapsed so far")
        return out


def spent(usd_per_hour: float, billing_since: float, now: float) -> float:
    """What the run's resources cost from ``billing_since`` to ``now`` (epoch seconds) at ``usd_per_hour``."""
    return usd_per_hour * hours(billing_since, now)


def hours(since: float, now: float) -> float:
    return max(0.0, now - since) / 3600
