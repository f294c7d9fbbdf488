"""The Platform interface every stage runs against: each platform declares all of it, and what a platform does not
have (a dry run, or a price, locally) is answered by the interface itself, so no caller asks with ``hasattr``."""

from __future__ import annotations

import inspect

import pytest

from components.platforms import PLATFORMS, Platform, RunContext, get_platform
from components.platforms.store import LocalStore
from components.spec import SpecError
from components.workload import resolve

NO_DRY_RUN = (
    "--dry-run: the local platform has no dry run; it creates only processes on this machine (try --platform gke)"
)


@pytest.mark.parametrize("name", PLATFORMS)
def test_every_platform_implements_the_interface_itself(name):
    """A platform subclasses Platform, so a method it lacks would fall back to the interface's: each defines every
    one itself, but the dry run, which only gke has, the limits, which only gke prices (the interface's: the
    spec's own, nothing billed), the release of what bills by the hour, which only gke has (nothing), and a Kueue
    eviction and the wait until the run may run again, which only gke's queued runs have (never evicted), and the hub
    token the platform keeps for its pods, which only gke keeps (a Secret Manager secret; none), and the preflight of
    the cloud before anything is created, which only gke makes (nothing to check)."""
    cls = type(get_platform(name))
    assert Platform in cls.__mro__ and cls.name == name
    members = {m for m, _ in inspect.getmembers(Platform, inspect.isfunction) if not m.startswith("_")}
    own = {m for m in members if getattr(cls, m) is not getattr(Platform, m)}
    assert own == (
        members
        if name == "gke"
        else members
        - {
            "dry_run",
            "limits",
            "release",
            "evicted",
            "wait_to_run_again",
            "hub_token",
            "claims_store",
            "no_internet",
            "preflight",
        }
    )


def test_a_platform_that_lacks_a_method_of_the_interface_cannot_be_made():
    """Platform is an abstract base class: a method every platform must have and one lacks fails at once, when the
    platform is made, not when a stage first calls it."""

    class NoTeardown(type(get_platform("local"))):
        teardown = Platform.teardown

    with pytest.raises(TypeError, match="abstract method 'teardown'"):
        NoTeardown()


def test_a_platform_without_a_dry_run_says_so_naming_itself(tmp_path):
    ctx = RunContext(spec=resolve("local-fsdp"), run_id="r", store=LocalStore(tmp_path / "r"), platform="local")
    with pytest.raises(SpecError) as exc:
        get_platform("local").dry_run(ctx, lambda mode: mode)
    assert str(exc.value) == NO_DRY_RUN and exc.value.exit_code == 2


def test_tpupipe_run_dry_run_on_the_local_platform_exits_2_with_that_message(tmp_path, capsys):
    from pipelines.cli.main import main

    assert main(["run", "local-fsdp", "--dry-run", "--output-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"tpupipe: error: {NO_DRY_RUN}\n"
    assert list(tmp_path.iterdir()) == []  # nothing was created
