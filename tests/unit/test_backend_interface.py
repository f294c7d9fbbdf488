"""The Backend interface the pipeline commands reach every backend through (``pipelines.backends``): each backend
declares what it has itself, and what it lacks is answered by the interface (exit 2, naming the backend and what to
use instead), so the command line never asks which backend it holds."""

from __future__ import annotations

import inspect

import pytest

from components.spec import SpecError
from pipelines.backends import BACKENDS, Backend, KfpPlace, Submission, Submitted, get_backend
from pipelines.backends import backend_class as of

MEMBERS = {m for m, _ in inspect.getmembers(Backend, inspect.isfunction) if not m.startswith("_")}
# What each backend answers itself: Vertex AI takes the run's project as --project gives it (the interface's own
# run_project); a local run is no submission (``tpupipe run`` runs it here, to its end), so the interface answers all.
OWN = {"vertex": MEMBERS - {"run_project"}, "kfp": MEMBERS, "local": set()}


def test_the_interface_has_the_operations_the_commands_need():
    assert MEMBERS == {
        "run_project",
        "submit",
        "follow",
        "schedule_create",
        "schedules",
        "schedule_action",
        "runs",
        "show",
        "cancel",
    }


@pytest.mark.parametrize("name", BACKENDS)
def test_every_backend_implements_the_interface_itself(name):
    cls = of(name)
    assert Backend in cls.__mro__ and cls.name == name
    own = {m for m in MEMBERS if getattr(cls, m) is not getattr(Backend, m)}
    assert own == OWN[name]
    for member in own:  # the same signature as the interface's, so the command line calls every backend alike
        assert inspect.signature(getattr(cls, member)) == inspect.signature(getattr(Backend, member)), member


SUB = Submission("local-fsdp", "", "p", "us-east5", "gs://p-tpupipe/pipeline-root")
CALLS = {
    "submit": (SUB,),
    "follow": (Submitted("h", "u", "h"),),
    "schedule_create": (SUB, "weekly", "0 3 * * 1", 1, "", "", 0),
    "schedules": (),
    "schedule_action": ("weekly", "pause"),
    "runs": (),
    "show": ("r",),
    "cancel": ("r", 1.0),
}


@pytest.mark.parametrize("member", sorted(CALLS))
def test_what_a_backend_lacks_is_refused_naming_it_and_what_to_use(member):
    with pytest.raises(SpecError) as exc:
        getattr(get_backend("local"), member)(*CALLS[member])
    assert exc.value.field == "local" and exc.value.exit_code == 2
    assert str(exc.value).startswith("local: the local backend has no ")
    assert "`tpupipe run`" in str(exc.value) and "--kfp-host" in str(exc.value)


def test_an_unknown_backend_is_refused_naming_the_known():
    with pytest.raises(SpecError) as exc:
        get_backend("argo")
    assert exc.value.valid == list(BACKENDS) == ["local", "vertex", "kfp"]


def test_the_kfp_backend_checks_its_place_when_made_before_any_call():
    with pytest.raises(SpecError, match="--kfp-host: 'localhost:8888' is not a URL"):
        get_backend("kfp", place=KfpPlace("localhost:8888"))
    made = get_backend("kfp", place=KfpPlace("http://localhost:8888"))
    assert (
        made.schedule_noun == "recurring run"
        and get_backend("vertex", project="p", region="r").run_project("p", "local-fsdp", "") == "p"
    )


def test_the_kfp_backend_takes_the_project_from_the_spec_when_not_given():
    made = get_backend("kfp", place=KfpPlace("http://localhost:8888"))
    assert made.run_project("", "local-fsdp", "gke.project=from-spec") == "from-spec"
    with pytest.raises(SpecError, match="--project: required with --kfp-host"):
        made.run_project("", "local-fsdp", "")
