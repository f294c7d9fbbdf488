"""A run's budget and deadline on the gke platform, against the emulated project: preflight (and provision's first
step, the same check) refuses a plan whose expected cost exceeds the budget and warns where a price is unknown; a
run that crosses its budget or its deadline while a Ray job runs has the job stopped through the Jobs API (the
emulated dashboard, tests/emulators/rayjobs.py, behind the API server's service proxy) and the stage fails with the
figures. The clock is time-machine's, moved five minutes at every read of the job's log; the run's first stages are
recorded as the runner records them (``stages/<stage>.json``: when each started, how long it took)."""

from __future__ import annotations

import re
import time

import pytest
import time_machine

from components.platforms.gke import GkePlatform
from components.platforms.gke.checks.preflight import PreflightFailed
from components.spec import names
from components.stages import jobs
from components.stages.runner import record
from tests.emulators.project import ONE_SLICE
from tests.emulators.rayjobs import RayJobsEmulator
from tests.gke.test_gke_platform import context, platform
from tests.gke.test_preflight import preflight_cli
from tests.gke.test_tokens_and_retries import FAST, FIVE_MINUTES, RESULT, _played

# ONE_SLICE's plan: 4 v6e chips at $2.70, the head's n2-standard-8 and GKE's fee: $11.29 an hour, 1 h expected.
PER_HOUR = "$11.29/h"


def test_a_plan_that_costs_more_than_the_budget_is_refused_exit_2_before_anything_is_created(
    tmp_path, project_factory, capsys
):
    project = project_factory()
    code, text = preflight_cli(ONE_SLICE + " run.max_cost_usd=5", capsys)
    assert code == 2, text
    assert "1 problem; nothing was created" in text
    assert (
        f"run.max_cost_usd: the plan's expected cost $11.29 (cluster.expected_hours=1 at {PER_HOUR}, list prices) "
        "exceeds the budget $5.00 (run.max_cost_usd)"
    ) in text
    with pytest.raises(PreflightFailed) as caught:  # provision runs the same checks first
        platform().provision(context(tmp_path, "pre", ONE_SLICE + " run.max_cost_usd=5"))
    assert [p.field for p in caught.value.problems] == ["run.max_cost_usd"]
    assert project.mutations() == [] and project.leftovers("pre") == {}


def test_a_plan_within_the_budget_passes_and_the_report_says_which_limits_apply(project_factory, capsys):
    project = project_factory()
    code, text = preflight_cli(ONE_SLICE + " run.max_cost_usd=12", capsys)
    assert code == 0, text
    assert "no problem found; nothing was created" in text
    assert "budget $12.00, from provision's end (run.max_cost_usd); deadline none (run.deadline_h is unset)" in text
    code, text = preflight_cli(ONE_SLICE, capsys)
    assert code == 0, text
    assert "budget $33.87, from provision's end (the default: 3 x the plan's expected cost, $11.29 for " in text
    assert project.mutations() == []


def test_a_budget_preflight_cannot_check_for_want_of_a_price_is_a_warning_naming_it(project_factory, capsys):
    project_factory()
    code, text = preflight_cli(ONE_SLICE + " cluster.capacity=spot run.max_cost_usd=5", capsys)
    assert code == 0, text  # not a refusal
    assert (
        "warning: the budget $5.00 (run.max_cost_usd) cannot be checked: no price for tpu/v6e/spot (at on-demand "
        "prices the plan costs at most $11.29 for 1 h)"
    ) in text


@pytest.fixture
def deployed(tmp_path, project_factory, monkeypatch):
    """``make(run_id, overrides)``: (project, ctx) of a provisioned ONE_SLICE run with ``overrides``, its RayCluster
    ready, its dashboard the emulated Jobs API whose train job runs three periods of five minutes."""

    def make(run_id: str, overrides: str):
        project = project_factory()
        project.kube.ready_without_ray = True
        project.kube.jobs = RayJobsEmulator(duration_s=3 * FIVE_MINUTES, log=_played)
        project.kube.jobs.start()
        project.extras.append(project.kube.jobs)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        ctx = context(tmp_path, run_id, f"{ONE_SLICE} {overrides}")
        gke = GkePlatform(log=lambda m: None, poll_s=0.05, backoff=FAST)
        gke.provision(ctx)
        gke.deploy_raycluster(ctx)
        return project, ctx

    return make


def _train(ctx):
    """The train stage's job, each read of its log five minutes after the last."""
    with time_machine.travel(time.time(), tick=True) as clock:
        return jobs.run_job(ctx, "train", "python -m trainers.train", 3600, sleep=lambda s: clock.shift(FIVE_MINUTES))


def _stopped(project, ctx) -> bool:
    """The train job was stopped through the Jobs API and is STOPPED."""
    sid = names.job_submission_id(ctx.run_id, "train")
    return (
        f"POST /api/jobs/{sid}/stop" in project.kube.jobs.calls and project.kube.jobs.jobs[sid]["status"] == "STOPPED"
    )


def test_crossing_the_budget_while_the_train_job_runs_stops_it_with_the_figures(deployed, capsys):
    """A budget preflight accepts (the plan expects 3 minutes: $0.56) that the run crosses: $1 at $11.29/h is 319 s
    of billing; provision ended 50 s before the job, whose second read of the log comes five minutes later."""
    project, ctx = deployed("budget", "cluster.expected_hours=0.05 run.max_cost_usd=1")
    now = time.time()
    record(ctx.store, "provision", status="succeeded", started=now - 100, seconds=50.0)
    with pytest.raises(jobs.LimitCrossed) as crossed:
        _train(ctx)
    assert re.fullmatch(
        r"stopped: budget: \$1\.\d\d spent of the \$1\.00 budget \(run\.max_cost_usd\): 0\.09\d* h since provision "
        r"ended at \$11\.29/h \(list prices\)",
        str(crossed.value),
    ), str(crossed.value)
    assert _stopped(project, ctx)
    sid = names.job_submission_id(ctx.run_id, "train")
    out = capsys.readouterr().out
    assert re.search(r"train: budget \$1\.00 \(run\.max_cost_usd\): \$0\.1[56]\d* spent so far at \$11\.29/h\n", out)
    assert re.search(rf"train: budget: \$1\.\d\d spent of the \$1\.00 budget .*: stopping job {sid}\n", out)
    assert f"train: job {sid} STOPPED" in out
    # A retried task (Vertex AI retries a failed one) re-attaches to the stopped job and fails for the same reason.
    with time_machine.travel(time.time() + 600, tick=True):
        with pytest.raises(jobs.LimitCrossed, match=r"^stopped: budget: \$\d\.\d\d spent of the \$1\.00 budget"):
            jobs.run_job(ctx, "train", "python -m trainers.train", 3600)
    assert list(project.kube.jobs.jobs) == [sid] and project.kube.jobs.jobs[sid]["status"] == "STOPPED"  # no new job


def test_crossing_the_deadline_while_the_train_job_runs_stops_it_with_the_figures(deployed):
    """0.05 h is three minutes from the run's first stage, the image build that started a minute before the job."""
    project, ctx = deployed("deadline", "run.deadline_h=0.05")
    now = time.time()
    record(ctx.store, "build_image", status="succeeded", started=now - 60, seconds=30.0)
    record(ctx.store, "provision", status="succeeded", started=now - 40, seconds=30.0)
    with pytest.raises(jobs.LimitCrossed) as crossed:
        _train(ctx)
    assert re.fullmatch(
        r"stopped: deadline: 0\.1\d* h elapsed of the 0\.05 h deadline \(run\.deadline_h\) since the run's first "
        r"stage started",
        str(crossed.value),
    ), str(crossed.value)
    assert _stopped(project, ctx)


def test_a_job_that_ends_within_the_limits_runs_to_its_end(deployed):
    project, ctx = deployed("within", "run.max_cost_usd=100 run.deadline_h=2")
    now = time.time()
    record(ctx.store, "provision", status="succeeded", started=now - 100, seconds=50.0)
    assert _train(ctx)["result"] == RESULT
    sid = names.job_submission_id(ctx.run_id, "train")
    assert project.kube.jobs.jobs[sid]["status"] == "SUCCEEDED"
    assert not any(call.endswith("/stop") for call in project.kube.jobs.calls)
