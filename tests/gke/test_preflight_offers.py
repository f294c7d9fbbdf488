"""Preflight against what the run's location offers, through the real clients and the emulated project: the GKE
version on the cluster's release channel (getServerConfig), the node pools' machine types in their zone
(machineTypes.get), the default network the cluster it creates uses, and the caller's acting as the nodes' service
account. Every problem is in the one report, exit 2, nothing created."""

from __future__ import annotations

from components.platforms.gke.plan.needs import needs
from components.workload import resolve
from tests.emulators.project import ONE_SLICE, PROJECT
from tests.gke.test_gke_platform import TWO_SLICES, context, platform
from tests.gke.test_preflight import preflight_cli, refused


def test_a_retired_version_pin_is_a_problem_naming_the_offered_ones(project_factory, capsys):
    project = project_factory()
    offered = ("1.35.5-gke.1100000", "1.36.1-gke.1012000")  # 1.35.2-gke.1842000 retired from every channel
    project.gke.channels.update({"RAPID": offered, "REGULAR": offered, "STABLE": offered[:1]})
    code, text = preflight_cli(ONE_SLICE + " gke.cluster_version=1.35.2-gke.1842000", capsys)
    assert code == 2, text
    assert "gke.cluster_version: GKE 1.35.2-gke.1842000 is not offered on any release channel in us-east5-b" in text
    assert "offered on REGULAR: 1.36.1-gke.1012000, 1.35.5-gke.1100000" in text
    assert project.mutations() == []


def test_a_minor_resolves_to_the_newest_offered_patch_and_the_cluster_is_created_at_it(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    offered = ("1.35.2-gke.1842000", "1.35.5-gke.1100000", "1.36.1-gke.1012000")
    project.gke.channels.update({"RAPID": offered, "REGULAR": offered, "STABLE": offered[:2]})
    code, text = preflight_cli(ONE_SLICE + " gke.cluster_version=1.35", capsys)
    assert code == 0, text
    assert "GKE 1.35.5-gke.1100000 on the STABLE channel in us-east5-b (gke.cluster_version=1.35)" in text
    platform().provision(context(tmp_path, "minor", ONE_SLICE + " gke.cluster_version=1.35"))
    (name,) = project.clusters("minor")
    assert project.gke.state.clusters[name].current_master_version == "1.35.5-gke.1100000"


def test_no_pin_is_the_channels_default(project_factory, capsys):
    project_factory()
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 0 and "GKE 1.35.2-gke.1842000 on the REGULAR channel in us-east5-b (the channel's default)" in text


def test_a_head_type_the_zone_lacks_a_retired_pin_no_default_network_and_no_act_as_are_one_report(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    project.compute.withhold_machine_type("us-east5-b", "n1-standard-16")
    project.gke.channels.update({channel: ("1.35.5-gke.1100000",) for channel in ("RAPID", "REGULAR", "STABLE")})
    project.compute.skip_default_network(PROJECT)
    project.projects.deny("iam.serviceAccounts.actAs")
    overrides = ONE_SLICE + " gke.cpu_machine_type=n1-standard-16 gke.cluster_version=1.35.2-gke.1842000"
    code, text = preflight_cli(overrides, capsys)
    assert code == 2, text
    assert "4 problems; nothing was created" in text
    needles = (
        f"gke.cpu_machine_type: machine type n1-standard-16 is not offered in zone us-east5-b of project {PROJECT}",
        "gke.cluster_version: GKE 1.35.2-gke.1842000 is not offered on any release channel",
        f"gke.cluster_name: project {PROJECT} has no VPC network 'default'",
        f"gke.node_service_account: the caller lacks iam.serviceAccounts.actAs on project {PROJECT}",
        "roles/iam.serviceAccountUser",
    )
    refused(project, tmp_path, overrides, text, needles, problems=4)


def test_a_tpu_machine_type_the_zone_does_not_offer_names_the_zones_that_do(project_factory, capsys):
    project_factory()
    code, text = preflight_cli(ONE_SLICE.replace("us-east5-b", "us-central1-a"), capsys)
    assert code == 2, text
    assert "gke.zone: machine type ct6e-standard-4t is not offered in zone us-central1-a" in text
    assert "choose a zone that offers v6e (us-east5-b, " in text


def test_the_firewall_rules_and_acting_as_the_nodes_account_are_permissions_preflight_asks_for():
    spec = resolve(
        "local-fsdp", TWO_SLICES.replace("gke.multislice_network=none", "gke.multislice_network=dcn_networks")
    )
    asked = needs(spec, "perm").permissions
    assert {"compute.firewalls.create", "compute.firewalls.delete", "iam.serviceAccounts.actAs"} <= set(asked)
    assert {"compute.machineTypes.get", "compute.networks.get"} <= set(asked)
