"""Ctrl-C, a killed driver: a local run never leaves a cluster behind.

`tpupipe run` is started as a terminal starts a foreground job (tests/terminal.py) and gets Ctrl-C in each stage
that starts or waits on something; and its driver is killed outright during train, after which the host keeper exits
on its own, the cluster it left answers only the run's Ray token, and `tpupipe teardown RUN_ID` cleans up, twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from components.platforms.local.ports import port_is_free
from components.platforms.local.processes import run_processes
from tests.helpers import tpupipe_cmd, unique_run_id, wait_until
from tests.terminal import Terminal, driver_processes

pytestmark = pytest.mark.e2e

# As small as the pipeline goes: one emulated host, one epoch over a few examples, no slice check, no answers (a stage
# that waits on a Ray job as train does).
SMALL = (
    "cluster.num_hosts=1 train.epochs=1 train.num_train_examples=64 train.num_eval_examples=32 "
    "cluster.slice_check=false eval.generate_examples=0"
)
# What the terminal shows once each stage is under way: the head starting, the stage waiting on the hosts (which join
# late, so that the stage cannot end before the signal lands), the training's progress bar (its first step ended; the
# train case runs enough epochs that the job cannot end before the signal lands).
UNDER_WAY = {
    "provision": "starting Ray head",
    "deploy_raycluster": "waiting for 2 nodes",
    "train": "progress train [",
}
LONG_TRAIN = "train.epochs=20"
GONE_S = 10  # the deadline: after the run ends, nothing of it is left within this


LATE_HOSTS = "testing.host_start_delay_s=120"


def _run_command(root, run_id: str, *sets: str) -> list[str]:
    return [*tpupipe_cmd(), "run", "--run-id", run_id, "--output-root", str(root), "--set", " ".join((SMALL, *sets))]


def _left(run_dir, run_id: str, driver_pid: int) -> tuple[list[int], list[int]]:
    """(processes, bound ports) of the run: its marker, the driver's tag, the ledger's ports."""
    ledger = json.loads((run_dir / "ledger.json").read_text())
    ports = [p for node in ledger["ports"] for k, p in node.items() if not k.endswith("worker-port")]
    return run_processes(run_id) + driver_processes(driver_pid), [p for p in ports if not port_is_free(p)]


def _nothing_left_within(run_dir, run_id: str, driver_pid: int, timeout_s: float = GONE_S) -> None:
    wait_until(
        lambda: _left(run_dir, run_id, driver_pid) == ([], []),
        timeout_s,
        f"run {run_id}'s processes and ports to go",
        interval_s=0.5,
        detail=lambda: _left(run_dir, run_id, driver_pid),
    )


# Every kind of stage: one that starts processes (provision), one that waits on them (deploy_raycluster), one that
# waits on a Ray job (train; evaluate stops its job with the same code, components/stages/jobs.py).
@pytest.mark.parametrize("stage", ["provision", "deploy_raycluster", "train"])
def test_ctrl_c_during_a_stage_stops_it_tears_down_and_exits_130(tmp_path, stage):
    run_id = unique_run_id(f"ctrl-c-{stage.replace('_', '-')}")
    extra = {"deploy_raycluster": [LATE_HOSTS], "train": [LONG_TRAIN]}.get(stage, [])
    term = Terminal(_run_command(tmp_path, run_id, *extra))
    rc = term.ctrl_c_when(UNDER_WAY[stage], timeout_s=600, exit_timeout_s=300)
    out = term.output
    assert rc == 130, out[-4000:]
    assert f"SIGINT during {stage}: stopping it" in out
    assert f"status: interrupted during {stage} (SIGINT)" in out, out[-3000:]
    summary = json.loads((tmp_path / run_id / "summary.json").read_text())
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert summary["status"] == "interrupted" and summary["interrupted"] == {"stage": stage, "signal": "SIGINT"}
    assert stages[stage] == "interrupted" and stages["teardown"] == "succeeded"
    cleaned = ", ".join(summary["deleted"]) or "nothing was left to delete"
    assert f"cleaned up: {cleaned}\n" in out  # what teardown deleted, printed
    if stage != "provision":  # (a Ctrl-C that lands just before the head starts leaves nothing to delete)
        assert summary["deleted"][0].startswith("head (pid")
    if stage == "train":
        assert f"{stage}: SIGINT: stopping job {run_id}-{stage}" in out
    _nothing_left_within(tmp_path / run_id, run_id, term.pid)


def test_sigterm_to_the_driver_alone_is_passed_on_and_exits_143(tmp_path):
    run_id = unique_run_id("sigterm-driver")
    term = Terminal(_run_command(tmp_path, run_id, LATE_HOSTS))
    # `kill PID`: to the driver only, not to its process group
    rc = term.act_when(UNDER_WAY["deploy_raycluster"], lambda: os.kill(term.pid, signal.SIGTERM), 600, 300)
    assert rc == 143, term.output[-4000:]
    assert "status: interrupted during deploy_raycluster (SIGTERM)" in term.output
    _nothing_left_within(tmp_path / run_id, run_id, term.pid)


def test_a_closed_terminal_stops_the_run_and_leaves_nothing(tmp_path):
    run_id = unique_run_id("hung-up")
    term = Terminal(_run_command(tmp_path, run_id, LATE_HOSTS))
    rc = term.act_when(UNDER_WAY["deploy_raycluster"], term.hang_up, timeout_s=600, exit_timeout_s=300)
    log = tmp_path / run_id / "logs" / "driver.log"
    after = log.read_text() if log.is_file() else "(no driver.log)"
    assert rc == 129, f"{term.output[-3000:]}\n--- driver.log ---\n{after[-4000:]}"
    assert "status: interrupted during deploy_raycluster (SIGHUP)" in after
    assert json.loads((tmp_path / run_id / "summary.json").read_text())["interrupted"] == {
        "stage": "deploy_raycluster",
        "signal": "SIGHUP",
    }
    _nothing_left_within(tmp_path / run_id, run_id, term.pid)


def test_a_second_ctrl_c_says_what_a_third_leaves_behind_and_a_third_abandons_teardown(tmp_path):
    run_id = unique_run_id("ctrl-c-thrice")
    term = Terminal(_run_command(tmp_path, run_id, LATE_HOSTS))
    try:
        assert term.wait_for(UNDER_WAY["deploy_raycluster"], timeout_s=600), term.output[-4000:]
        term.ctrl_c()
        assert term.wait_for("== teardown (", timeout_s=120), term.output[-4000:]
        term.ctrl_c()
        assert term.wait_for("interrupt again to abandon it, leaving behind: ", timeout_s=30), term.output[-4000:]
        term.ctrl_c()
        rc = term.wait(timeout_s=60)
    finally:
        term.close()
    out = term.output
    assert rc == 130, out[-4000:]
    assert f"SIGINT: teardown of run {run_id} is running; interrupt again to abandon it, leaving behind: " in out
    command = f"tpupipe teardown {run_id} --platform local --output-root {tmp_path}"
    assert "teardown abandoned; left behind: " in out and f"finish the cleanup with: {command}" in out
    finish = subprocess.run([*tpupipe_cmd(), *command.split()[1:]], capture_output=True, text=True, timeout=120)
    assert finish.returncode == 0, finish.stdout + finish.stderr
    _nothing_left_within(tmp_path / run_id, run_id, term.pid)


def _status(url: str, token: str | None = None) -> int:
    """The HTTP status of a GET of ``url``, with ``token`` as its bearer token when given."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_killed_driver_leaves_a_cluster_that_teardown_removes_twice_safely(tmp_path):
    run_id = unique_run_id("driver-killed")
    proc = subprocess.Popen(
        _run_command(tmp_path, run_id) + ["--set", "train.epochs=50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    run_dir = tmp_path / run_id

    def train_started() -> bool:
        assert proc.poll() is None, proc.stdout.read()[-4000:]
        return (run_dir / "logs" / "train.log").is_file()

    try:
        wait_until(train_started, 600, "train to start (its train.log)", interval_s=0.5)
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone: its stage and the cluster are left running
        proc.wait(timeout=30)
        ledger = json.loads((run_dir / "ledger.json").read_text())
        keeper = next(p for p in ledger["processes"] if p["role"] == "keeper")
        wait_until(lambda: keeper["pid"] not in run_processes(run_id), 30, "the keeper to exit after the run's driver")
        assert "the run's driver (pid" in (run_dir / "logs" / "keeper.out").read_text()
        assert run_processes(run_id), "the cluster went with the driver: nothing left to tear down"
        # The cluster is the run's alone: its dashboard (the Jobs API) answers only the run's own token, kept in a file
        # no other user can read.
        token_file = Path(ledger["auth_token_path"])
        assert token_file.stat().st_mode & 0o777 == 0o600
        jobs = ledger["dashboard_url"] + "/api/jobs/"
        assert _status(jobs) == 401 and _status(jobs, "0" * 64) == 403
        assert _status(jobs, token_file.read_text().strip()) == 200

        first = subprocess.run(
            [*tpupipe_cmd(), "teardown", run_id, "--output-root", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert first.returncode == 0, first.stdout + first.stderr
        assert f"tpupipe teardown {run_id} (local): deleted head (pid" in first.stdout
        _nothing_left_within(run_dir, run_id, proc.pid)
        assert not token_file.exists()  # with the run's temporary directory

        second = subprocess.run(
            [*tpupipe_cmd(), "teardown", run_id, "--output-root", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 0, second.stdout + second.stderr
        assert f"tpupipe teardown {run_id} (local): nothing was left to delete" in second.stdout
    finally:
        for pid in run_processes(run_id):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()
