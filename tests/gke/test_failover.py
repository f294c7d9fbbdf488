"""Capacity-aware acquisition against the emulated project: the candidates (zone x capacity type) the plan lists, the
ones preflight refuses (a reservation with no room, flex-start where it is not offered), provision's failover from a
stocked-out zone to the next after rolling the first back, and the stages after provision finding the candidate the
ledger records (a later task, a fresh context, as on Vertex AI)."""

from __future__ import annotations

import pytest

from components.platforms import ledger as ledgers
from components.platforms.gke.checks.preflight import PreflightFailed
from components.platforms.gke.cloud import cluster as gke_cluster
from components.platforms.gke.plan import document as plan
from components.spec import InfraError, SpecError
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.gke.test_gke_platform import context, platform
from tests.gke.test_preflight import preflight_cli

TWO_ZONES = ONE_SLICE + " gke.zones=us-east5-b,us-east5-a"
LADDER = ONE_SLICE + " cluster.capacity=reservation,on-demand cluster.reservation=team-v6e"


def _cluster(zone: str, run_id: str) -> str:
    return f"projects/{PROJECT}/locations/{zone}/clusters/tpupipe-{run_id}"


def test_a_stocked_out_zone_is_rolled_back_and_the_next_zone_runs_and_later_stages_find_it(tmp_path, project_factory):
    project = project_factory()
    project.gke.zone_stocked_out("us-east5-b")
    result = platform().provision(context(tmp_path, "failover", TWO_ZONES))
    assert (result["zone"], result["capacity"]) == ("us-east5-a", "on-demand")
    # The first zone's cluster was made, then deleted with its pools: only the second zone's is left.
    assert project.gke.state.calls.count("CreateCluster") == 2
    assert project.clusters("failover") == [_cluster("us-east5-a", "failover")]
    assert all("/us-east5-a/" in pool for pool in project.pools("failover"))
    ledger = ledgers.load(context(tmp_path, "failover", TWO_ZONES).store)
    assert ledger["candidate"] == {"zone": "us-east5-a", "capacity": "on-demand"}
    assert [(t["zone"], t["capacity"]) for t in ledger["tried"]] == [("us-east5-b", "on-demand")]
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in ledger["tried"][0]["error"]
    assert ledger["spec"]["gke"]["zone"] == "us-east5-a"  # the janitor's spec: the zone the run took
    # A later stage is a new task with the spec as given (both zones): it reaches the Kubernetes API of the cluster in
    # the zone taken (no RayCluster deployed yet: no Ray token), and its teardown deletes it.
    later = context(tmp_path, "failover", TWO_ZONES)
    with pytest.raises(InfraError, match="no Ray token for RayCluster failover in namespace tpupipe"):
        platform().job_client(later)
    assert platform().teardown(later)["deleted"]
    assert project.leftovers("failover") == {} and project.gke.state.clusters == {}


def test_every_zone_stocked_out_is_one_error_and_leaves_nothing(tmp_path, project_factory):
    project = project_factory()
    for zone in ("us-east5-b", "us-east5-a"):
        project.gke.zone_stocked_out(zone)
    ctx = context(tmp_path, "allout", TWO_ZONES)
    with pytest.raises(gke_cluster.CapacityError, match="in zone us-east5-a: .*ZONE_RESOURCE_POOL_EXHAUSTED"):
        platform().provision(ctx)
    assert project.gke.state.calls.count("CreateCluster") == 2
    assert project.gke.state.clusters == {}
    assert platform().teardown(ctx)["deleted"] == []


def test_past_the_deadline_no_next_candidate_is_tried(tmp_path, project_factory):
    project = project_factory()
    project.gke.zone_stocked_out("us-east5-b")
    with pytest.raises(gke_cluster.CapacityError, match="in zone us-east5-b"):
        platform().provision(context(tmp_path, "late", TWO_ZONES + " run.deadline_h=0.0000001"))
    assert project.gke.state.calls.count("CreateCluster") == 1 and project.gke.state.clusters == {}


def test_a_reservation_with_no_room_falls_down_the_ladder_to_on_demand(tmp_path, project_factory, capsys):
    project = project_factory()
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct6e-standard-4t", count=2, in_use=2)
    code, text = preflight_cli(LADDER, capsys)
    assert code == 0, text
    assert "candidate reservation in us-east5-b excluded: cluster.reservation: reservation team-v6e" in text
    result = platform().provision(context(tmp_path, "ladder", LADDER))
    assert result["capacity"] == "on-demand"
    (cluster,) = project.clusters("ladder")
    tpu = [p for p in project.gke.state.clusters[cluster].node_pools if p.name.endswith("-s0")][0]
    assert not tpu.config.reservation_affinity.values  # on-demand: no reservation consumed
    assert ledgers.load(context(tmp_path, "ladder", LADDER).store)["candidate"]["capacity"] == "on-demand"
    # A later stage (a new task, the ladder as given) counts spending at the rung taken: on-demand's list price, where
    # the first rung's (a reservation's) is not in the table.
    later = platform().limits(context(tmp_path, "ladder", LADDER))
    assert later.usd_per_hour is not None and later.missing_prices == ()


def test_no_candidate_passing_preflight_is_one_report_naming_each(tmp_path, project_factory, capsys):
    project = project_factory()
    project.compute.add_reservation(PROJECT, "us-east5-b", "team-v6e", "ct6e-standard-4t", count=2, in_use=2)
    overrides = LADDER.replace("reservation,on-demand", "reservation,flex-start")
    code, text = preflight_cli(overrides, capsys)
    assert code == 2, text
    assert "no candidate passed" in text
    assert "[reservation in us-east5-b] reservation team-v6e in us-east5-b has room for 0 of the 1" in text
    assert "[flex-start in us-east5-b] flex-start v6e is not offered in zone us-east5-b" in text
    with pytest.raises(PreflightFailed):
        platform().provision(context(tmp_path, "none", overrides))
    assert project.mutations() == []


def test_flex_start_where_cloud_tpu_does_not_offer_it_is_refused_naming_the_zones_that_do(project_factory, capsys):
    project = project_factory()
    code, text = preflight_cli(ONE_SLICE + " cluster.capacity=flex-start", capsys)
    assert code == 2, text
    assert (
        "cluster.capacity: flex-start v6e is not offered in zone us-east5-b; zones that offer it: us-east5-a, "
        "asia-northeast1-b" in text
    )
    assert project.mutations() == []
    code, text = preflight_cli(ONE_SLICE.replace("us-east5-b", "us-east5-a") + " cluster.capacity=flex-start", capsys)
    assert code == 0, text


def test_the_plan_lists_each_candidate_priced_and_why_any_is_excluded():
    spec = resolve(
        "gemma4-e2b-v6e-16",
        "gke.project=my-project gke.zones=us-east5-b,us-east5-a cluster.capacity=on-demand,flex-start",
    )
    document = plan.build(spec, "r")
    assert document["zone"] == "us-east5-b" and document["slice"]["capacity"] == "on-demand"  # the first
    listed = [(c["capacity"], c["zone"], c["excluded"][:39]) for c in document["candidates"]]
    assert listed == [
        ("on-demand", "us-east5-b", ""),
        ("on-demand", "us-east5-a", ""),
        ("flex-start", "us-east5-b", "flex-start v6e is not offered in zone u"),
        ("flex-start", "us-east5-a", ""),
    ]
    assert document["candidates"][0]["usd_per_hour"] == document["cost"]["usd_per_hour"]
    text = plan.render_text(document)
    assert "candidates (provision takes the first that preflight passes" in text
    over = plan.build(resolve("gemma4-e2b-v6e-16", "gke.zones=us-east5-b,us-east5-a run.max_cost_usd=10"), "r")
    assert all(c["excluded"].startswith("run.max_cost_usd: the plan's expected cost") for c in over["candidates"])
    # One candidate: no list, the plan as it always was.
    assert "candidates" not in plan.build(resolve("gemma4-e2b-v6e-16"), "r")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ("gke.zones=us-east5-b,us-east1-d", "gke.zones: zones of 2 regions"),
        ("gke.zone=us-east5-a gke.zones=us-east5-b,us-east5-a", "gke.zones: starts with us-east5-b"),
        ("gke.zones=us-east5-b,us-east5-a gke.cluster_name=shared", "gke.zones: gke.cluster_name=shared is in one"),
        ("cluster.capacity=on-demand,bogus", "cluster.capacity: unknown capacity type 'bogus'"),
        ("cluster.capacity=spot,spot", "cluster.capacity: names a capacity type twice"),
        ("cluster.capacity=on-demand,reservation", "cluster.reservation: required"),
    ],
)
def test_bad_zones_and_ladders_name_the_field(overrides, message):
    with pytest.raises(SpecError, match=message):
        resolve("gemma4-e2b-v6e-16", overrides)


def test_a_recorded_candidate_outside_the_spec_is_not_trusted():
    """The ledger is the run's state: a candidate it names that the spec does not offer places the run nowhere new."""
    from components.platforms.gke.plan import candidates

    spec = resolve("gemma4-e2b-v6e-16", "gke.zones=us-east5-b,us-east5-a cluster.capacity=on-demand,spot")
    taken = candidates.chosen(spec, {"candidate": {"zone": "us-east5-a", "capacity": "spot"}})
    assert (taken.gke.zone, taken.gke.zones, taken.cluster.capacity) == ("us-east5-a", "", "spot")
    for forged in ({"zone": "europe-west4-a", "capacity": "spot"}, {"zone": "us-east5-a", "capacity": "flex-start"}):
        first = candidates.chosen(spec, {"candidate": forged})
        assert (first.gke.zone, first.cluster.capacity) == ("us-east5-b", "on-demand")
    single = resolve("gemma4-e2b-v6e-16")
    assert candidates.chosen(single, {"candidate": {"zone": "us-east5-b", "capacity": "on-demand"}}) is single


def test_the_janitor_collects_a_failed_over_run_in_the_zone_it_took(tmp_path, project_factory, capsys):
    """A run left behind after failing over: the janitor reads the ledger's placed spec and deletes the cluster in
    the zone the run took."""
    from pipelines.cli import main as cli

    project = project_factory(polls_to_done=1)
    project.gke.zone_stocked_out("us-east5-b")
    platform().provision(context(tmp_path, "moved", TWO_ZONES))
    code = cli.main(["janitor", "--output-root", str(tmp_path), "--older-than", "0s"])
    text = "".join(capsys.readouterr())
    assert code == 0, text
    assert f"deleted {_cluster('us-east5-a', 'moved')}" in text
    assert project.leftovers("moved") == {} and project.gke.state.clusters == {}
