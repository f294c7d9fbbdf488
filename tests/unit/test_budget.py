"""A run's budget and deadline (``run.max_cost_usd``, ``run.deadline_h``): the fields' parsing and checks (a bad
value names the field, exit 2), the limits in effect on each platform and what set them, the plan's expected cost
against the budget, and the arithmetic of a run that crosses one (``components.workload.budget``)."""

from __future__ import annotations

import json

import pytest

from components.platforms import RunContext, get_platform
from components.platforms.gke.plan import document as plan
from components.platforms.store import LocalStore
from components.spec import RunSpec, SpecError
from components.workload import budget, resolve
from pipelines.cli.main import main

SMOKE_PER_HOUR = 3.1885  # one v6e chip, the head's n2-standard-8, GKE's cluster fee (components/tpu/pricing.py)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ("run.max_cost_usd=-1", "run.max_cost_usd"),
        ("run.max_cost_usd=0", "run.max_cost_usd"),
        ("run.max_cost_usd=five", "run.max_cost_usd"),
        ("run.max_cost_usd=nan", "run.max_cost_usd"),
        ("run.max_cost_usd=inf", "run.max_cost_usd"),
        ("max_cost_usd=true", "run.max_cost_usd"),
        ("run.deadline_h=0", "run.deadline_h"),
        ("run.deadline_h=-0.5", "run.deadline_h"),
        ("deadline_h=2h", "run.deadline_h"),
    ],
)
def test_a_bad_limit_is_an_error_naming_its_field(overrides, field):
    with pytest.raises(SpecError) as err:
        resolve("local-fsdp", overrides)
    assert err.value.field == field and str(err.value).startswith(f"{field}: ")
    assert err.value.exit_code == 2


def test_a_bad_limit_exits_2_before_anything_with_the_field_named(tmp_path, capsys):
    assert main(["validate", "smoke", "--set", "run.max_cost_usd=0"]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: run.max_cost_usd: must be a positive number of US")
    assert main(["plan", "smoke", "--set", "run.deadline_h=soon"]) == 2
    assert "run.deadline_h: expected float or empty (unset), got 'soon'" in capsys.readouterr().err
    assert main(["run", "local-fsdp", "--set", "run.deadline_h=-1", "--output-root", str(tmp_path)]) == 2
    assert "run.deadline_h: must be a positive number of hours, got -1.0" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_limits_parse_from_overrides_and_leaf_names_and_round_trip():
    spec = resolve("local-fsdp", "run.max_cost_usd=5 deadline_h=1.5")
    assert (spec.run.max_cost_usd, spec.run.deadline_h) == (5.0, 1.5)
    assert type(spec).from_json(spec.to_json()) == spec
    assert spec.to_dict()["run"] == {"max_cost_usd": 5.0, "deadline_h": 1.5}
    unset = resolve("local-fsdp", "run.max_cost_usd=")  # an empty override: unset
    assert (unset.run.max_cost_usd, unset.run.deadline_h) == (None, None)
    assert RunSpec.from_json(json.dumps({"run": {"max_cost_usd": None, "deadline_h": 2}})).run.deadline_h == 2.0


def _ctx(tmp_path, preset: str, overrides: str = "", platform: str = "local") -> RunContext:
    return RunContext(spec=resolve(preset, overrides), run_id="r", store=LocalStore(tmp_path / "r"), platform=platform)


def test_the_local_platform_bills_nothing_and_sets_no_default(tmp_path):
    lim = get_platform("local").limits(_ctx(tmp_path, "local-fsdp"))
    assert (lim.max_cost_usd, lim.deadline_h, lim.usd_per_hour) == (None, None, 0.0)
    assert lim.max_cost_by == "run.max_cost_usd is unset" and lim.deadline_by == "run.deadline_h is unset"
    given = get_platform("local").limits(_ctx(tmp_path, "local-fsdp", "run.max_cost_usd=2 run.deadline_h=0.5"))
    assert (given.max_cost_usd, given.max_cost_by, given.deadline_h, given.deadline_by) == (
        2.0,
        "run.max_cost_usd",
        0.5,
        "run.deadline_h",
    )
    now = 10_000.0
    watched = budget.Watch(given, billing_since=now - 7200, started=now - 60)
    assert watched.stops() == {"deadline": now - 60 + 1800}  # nothing billed: the budget is never crossed
    assert watched.lines(now) == [
        "budget $2.00 (run.max_cost_usd): not counted, the platform bills nothing",
        "deadline 0.5 h (run.deadline_h): 0.0167 h elapsed so far",
    ]


def test_on_gke_the_default_budget_is_three_times_the_plans_expected_cost(tmp_path):
    lim = get_platform("gke").limits(_ctx(tmp_path, "smoke", platform="gke"))
    cost = plan.cost(resolve("smoke"), "r")
    assert cost["usd_per_hour"] == pytest.approx(SMOKE_PER_HOUR) and cost["expected_hours"] == 0.5
    assert lim.usd_per_hour == cost["usd_per_hour"]
    assert lim.max_cost_usd == 4.79 == round(budget.DEFAULT_MULTIPLE * SMOKE_PER_HOUR * 0.5 + 0.005, 2)
    assert lim.max_cost_by == (
        "the default: 3 x the plan's expected cost, $1.59 for cluster.expected_hours=0.5 at $3.19/h"
    )
    assert lim.deadline_h is None
    mine = plan.limits(resolve("smoke", "run.max_cost_usd=2 run.deadline_h=4"), "r")
    assert (mine.max_cost_usd, mine.max_cost_by, mine.deadline_h, mine.deadline_by) == (
        2.0,
        "run.max_cost_usd",
        4.0,
        "run.deadline_h",
    )
    tiny = plan.limits(resolve("smoke", "cluster.expected_hours=0.0001"), "r")
    assert tiny.max_cost_usd == 0.01  # rounded up to a cent: never a budget of zero


def test_where_a_price_is_unknown_the_default_is_a_deadline_and_the_plan_says_so(capsys):
    lim = plan.limits(resolve("gemma4-e2b-tpu7x-16"), "r")  # TPU7x has no public list price
    assert lim.usd_per_hour is None and lim.missing_prices == ("tpu/tpu7x/on-demand",)
    assert lim.max_cost_usd is None
    assert lim.max_cost_by == "run.max_cost_usd is unset, and with no price for tpu/tpu7x/on-demand there is no default"
    assert lim.deadline_h == 3.0
    assert lim.deadline_by == "the default where a price is unknown: 3 x cluster.expected_hours=1"
    assert main(["plan", "gemma4-e2b-tpu7x-16"]) == 0
    text = capsys.readouterr().out
    assert "  budget     none (run.max_cost_usd is unset, and with no price for tpu/tpu7x/on-demand" in text
    assert (
        "  deadline   3 h, from the run's first stage (the default where a price is unknown: 3 x "
        "cluster.expected_hours=1)"
    ) in text


def test_the_plan_shows_the_limits_in_effect_and_what_set_them(capsys):
    assert main(["plan", "smoke"]) == 0
    text = capsys.readouterr().out
    assert "limits (past one, the running job is stopped, its stage fails and teardown runs)" in text
    assert "  budget     $4.79, from provision's end (the default: 3 x the plan's expected cost" in text
    assert "  deadline   none (run.deadline_h is unset)" in text
    assert main(["plan", "smoke", "--set", "run.max_cost_usd=1", "--output", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["limits"]["max_cost_usd"] == 1.0 and document["limits"]["max_cost_by"] == "run.max_cost_usd"
    assert document["spec"]["run"] == {"max_cost_usd": 1.0, "deadline_h": None}
    refused = [w for w in document["warnings"] if w.startswith("run.max_cost_usd: ")]
    assert refused == [
        "run.max_cost_usd: the plan's expected cost $1.59 (cluster.expected_hours=0.5 at $3.19/h, list prices) "
        "exceeds the budget $1.00 (run.max_cost_usd): raise the budget, or plan a shorter or smaller run; preflight "
        "refuses the run"
    ]


def test_the_plans_expected_cost_against_the_budget():
    def check(preset: str, overrides: str):
        spec = resolve(preset, overrides)
        cost = plan.cost(spec, "r")
        return budget.plan_check(budget.limits(spec, cost), cost)

    problem, warning = check("smoke", "run.max_cost_usd=1.5")
    assert warning is None and problem.startswith("the plan's expected cost $1.59 ")
    assert "exceeds the budget $1.50 (run.max_cost_usd)" in problem
    assert check("smoke", "run.max_cost_usd=1.59") == (None, None)  # equal fits
    assert check("smoke", "") == (None, None)  # the default fits by construction
    assert check("smoke", "cluster.expected_hours=0.001 run.max_cost_usd=0.01") == (None, None)
    # Spot: no price in the table; its on-demand bound ($11.29 for 1 h) fits $20, not $5.
    spot = "cluster.topology=2x2 cluster.num_hosts=1 cluster.cpus_per_host=4 train.num_workers=0 capacity=spot"
    assert check("smoke", f"{spot} cluster.expected_hours=1 run.max_cost_usd=20") == (None, None)
    problem, warning = check("smoke", f"{spot} cluster.expected_hours=1 run.max_cost_usd=5")
    assert problem is None
    assert warning == (
        "the budget $5.00 (run.max_cost_usd) cannot be checked: no price for tpu/v6e/spot (at on-demand prices the "
        "plan costs at most $11.29 for 1 h); nor can the run count what it spends: its deadline (3 h) alone bounds it"
    )
    problem, warning = check("gemma4-e2b-tpu7x-16", "run.max_cost_usd=100")
    assert problem is None and warning.startswith(
        "the budget $100.00 (run.max_cost_usd) cannot be checked: no price for tpu/tpu7x/on-demand; nor can the run "
        "count what it spends: its deadline (3 h) alone bounds it"
    )


LIMITS = budget.Limits(2.0, "run.max_cost_usd", 1.0, "run.deadline_h", usd_per_hour=4.0)


def test_spent_money_counts_from_provisions_end_and_time_from_the_first_stage():
    start, billing = 1_000_000.0, 1_000_600.0  # provision took ten minutes
    watched = budget.Watch(LIMITS, billing_since=billing, started=start)
    # $2 at $4/h: half an hour of billing; 1 h from the first stage's start.
    assert watched.stops() == {"budget": billing + 1800, "deadline": start + 3600}
    assert watched.stop_at() == billing + 1800
    assert budget.spent(4.0, billing, billing + 900) == 1.0
    assert budget.spent(4.0, billing, start) == 0.0  # before the chips bill, nothing is spent
    assert watched.crossed(billing + 1799) is None
    assert watched.crossed(billing + 1799.5, slack_s=1.0) is not None
    assert watched.lines(billing + 900) == [
        "budget $2.00 (run.max_cost_usd): $1.00 spent so far at $4.00/h",
        "deadline 1 h (run.deadline_h): 0.417 h elapsed so far",
    ]


def test_the_first_limit_crossed_is_named_with_its_figures():
    start, billing = 1_000_000.0, 1_000_600.0
    watched = budget.Watch(LIMITS, billing_since=billing, started=start)
    assert watched.crossed(billing + 2160) == (
        "stopped: budget: $2.40 spent of the $2.00 budget (run.max_cost_usd): 0.6 h since provision ended at $4.00/h "
        "(list prices)"
    )
    late = budget.Watch(LIMITS, billing_since=start + 3000, started=start)  # a slow provision: the deadline first
    assert late.crossed(start + 4320) == (
        "stopped: deadline: 1.2 h elapsed of the 1 h deadline (run.deadline_h) since the run's first stage started"
    )
    # Figures at the instant crossed when a timer woke a moment early: spent is never shown below the budget.
    assert watched.crossed(billing + 1799.5, slack_s=1.0).startswith("stopped: budget: $2.00 spent of the $2.00 ")


def test_a_limit_that_cannot_be_counted_is_said_and_never_crossed():
    unknown = budget.Limits(2.0, "run.max_cost_usd", None, "run.deadline_h is unset", None, ("tpu/v6e/spot",))
    watched = budget.Watch(unknown, billing_since=0.0, started=0.0)
    assert watched.stops() == {} and watched.stop_at() is None and watched.crossed(1e9) is None
    assert watched.lines(1e9) == ["budget $2.00 (run.max_cost_usd): not counted, no price for tpu/v6e/spot"]
    unrecorded = budget.Watch(LIMITS, billing_since=None, started=None)
    assert unrecorded.stops() == {}
    assert unrecorded.lines(1e9) == [
        "budget $2.00 (run.max_cost_usd): not counted, the run's store has no record of provision's end",
        "deadline 1 h (run.deadline_h): not counted, the run's store has no record of its first stage",
    ]


def test_sums_below_a_dollar_keep_their_cents_apart():
    assert [budget.usd(v) for v in (0.02, 0.0201, 1.234, 12345.6)] == ["$0.02", "$0.0201", "$1.23", "$12,345.60"]
