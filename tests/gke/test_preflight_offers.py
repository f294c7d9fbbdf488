"""Preflight against what the run's location offers, through the real clients and the emulated project: the GKE
version on the cluster's release channel (getServerConfig). Every problem is in the one report, exit 2, nothing
created."""

from __future__ import annotations

from pipelines import cli
from tests.gke.conftest import ONE_SLICE
from tests.gke.test_gke_platform import context, platform


def _preflight(overrides: str, capsys) -> tuple[int, str]:
    code = cli.main(["preflight", "local-fsdp", "--set", overrides, "--run-id", "pre"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_retired_version_pin_is_a_problem_naming_the_offered_ones(project_factory, capsys):
    project = project_factory()
    project.gke.channels["REGULAR"] = ("1.35.5-gke.1100000", "1.36.1-gke.1012000")  # 1.35.2-gke.1842000 retired
    code, text = _preflight(ONE_SLICE + " gke.cluster_version=1.35.2-gke.1842000", capsys)
    assert code == 2, text
    assert (
        "gke.cluster_version: GKE 1.35.2-gke.1842000 is not offered on the REGULAR release channel in us-east5-b"
    ) in text
    assert "offered: 1.36.1-gke.1012000, 1.35.5-gke.1100000" in text
    assert project.mutations() == []


def test_a_minor_resolves_to_the_newest_offered_patch_and_the_cluster_is_created_at_it(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    project.gke.channels["REGULAR"] = ("1.35.2-gke.1842000", "1.35.5-gke.1100000", "1.36.1-gke.1012000")
    code, text = _preflight(ONE_SLICE + " gke.cluster_version=1.35", capsys)
    assert code == 0, text
    assert "GKE 1.35.5-gke.1100000 on the REGULAR channel in us-east5-b (gke.cluster_version=1.35)" in text
    platform().provision(context(tmp_path, "minor", ONE_SLICE + " gke.cluster_version=1.35"))
    (name,) = project.clusters("minor")
    assert project.gke.state.clusters[name].current_master_version == "1.35.5-gke.1100000"


def test_no_pin_is_the_channels_default(project_factory, capsys):
    project_factory()
    code, text = _preflight(ONE_SLICE, capsys)
    assert code == 0 and "GKE 1.35.2-gke.1842000 on the REGULAR channel in us-east5-b (the channel's default)" in text
