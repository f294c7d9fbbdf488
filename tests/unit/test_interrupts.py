"""What SIGINT and SIGTERM do to a stage, the driver's mark, the report of an interrupted run, the host keeper's reasons
to stop, and `tpupipe teardown` of a local run with nothing left; no cluster is started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.platforms import RunContext, interrupts, procs
from components.platforms.local.keeper import keep
from components.platforms.local.processes import RUN_MARKER
from components.platforms.store import LocalStore
from components.stages import report
from components.stages.runner import record, run_stage
from components.workload import resolve
from tests.helpers import unique_run_id


def test_the_first_signal_stops_once_and_ends_the_block_with_128_plus_its_number():
    stopped = []

    def stop(signum):
        stopped.append(signum)
        os.kill(os.getpid(), signal.SIGINT)  # another one while stopping (a terminal's and the driver's): ignored

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(interrupts.Interrupted) as caught, interrupts.on_interrupt(stop, log=lambda m: None):
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped == [signal.SIGTERM]
    assert caught.value.code == 143 and caught.value.signal_name == "SIGTERM"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_inside_deferred_takes_effect_when_it_ends():
    done = []
    with pytest.raises(interrupts.Interrupted), interrupts.on_interrupt():
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("started and recorded")
        done.append("never")
    assert done == ["started and recorded"]


def test_a_failing_stop_still_ends_the_stage():
    said = []

    def stop(_signum):
        raise RuntimeError("the job API is gone")

    with pytest.raises(interrupts.Interrupted), interrupts.on_interrupt(stop, log=said.append):
        os.kill(os.getpid(), signal.SIGINT)
    assert said == ["SIGINT: could not stop cleanly: the job API is gone"]


def _ctx(tmp_path, run_id="r1") -> RunContext:
    return RunContext(spec=resolve("local-fsdp"), run_id=run_id, store=LocalStore(tmp_path / run_id), platform="local")


def test_the_report_says_which_stage_the_interrupt_hit(tmp_path):
    ctx = _ctx(tmp_path)
    record(ctx.store, "provision", status="succeeded", seconds=1.0)
    record(ctx.store, "train", status="running")  # the signal reached it before it could record it
    record(ctx.store, "teardown", status="succeeded", seconds=2.0, result={"deleted": ["head (pid 1)"]})
    interrupts.mark(ctx.store, "train", signal.SIGINT)
    interrupts.mark(ctx.store, "evaluate", signal.SIGTERM)  # only the first mark counts
    summary = report.summarize(ctx)
    assert summary["status"] == "interrupted"
    assert summary["interrupted"] == {"stage": "train", "signal": "SIGINT"}
    assert {s["name"]: s["status"] for s in summary["stages"]}["train"] == "interrupted"
    table = report.format_table(summary)
    assert "status: interrupted during train (SIGINT)" in table and "cleaned up: head (pid 1)" in table


def test_an_interrupted_stage_record_alone_makes_an_interrupted_run(tmp_path):
    ctx = _ctx(tmp_path)
    record(ctx.store, "train", status="interrupted", signal="SIGTERM")  # Vertex cancelled the task
    summary = report.summarize(ctx)
    assert summary["interrupted"] == {"stage": "train", "signal": "SIGTERM"} and summary["status"] == "interrupted"


def test_a_stage_that_starts_after_the_mark_does_not_run(tmp_path):
    interrupts.mark(LocalStore(tmp_path / "runs" / "late"), "provision", signal.SIGINT)
    with pytest.raises(interrupts.Interrupted) as caught:
        run_stage("build_image", "local-fsdp", "local", "", "late", "", str(tmp_path / "runs"))
    assert caught.value.code == 130
    rec = json.loads((tmp_path / "runs" / "late" / "stages" / "build_image.json").read_text())
    assert rec["status"] == "skipped" and rec["reason"] == "the run was interrupted (SIGINT during provision)"


def _ledger(tmp_path, **fields):
    path = tmp_path / "runs" / "r1" / "ledger.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"run_id": "r1", "processes": [], **fields}))
    return path


def test_the_keeper_stops_when_teardown_began(tmp_path):
    assert (
        keep(_ledger(tmp_path, teardown_started=1.0, driver=interrupts.driver()), log=lambda m: None)
        == "teardown began"
    )


def test_the_keeper_stops_when_the_driver_is_gone(tmp_path):
    gone = subprocess.Popen(["true"])
    record_of_gone = {"pid": gone.pid, "started": procs.start_time(gone.pid) or 1}
    gone.wait()
    assert interrupts.alive(interrupts.driver()) and not interrupts.alive(record_of_gone)
    said = []
    reason = keep(_ledger(tmp_path, driver=record_of_gone), log=said.append)
    assert reason.startswith(f"the run's driver (pid {gone.pid}) is gone; `tpupipe teardown r1 --output-root ")
    assert said == [f"keeper: {reason}: exiting"]


def test_the_keeper_stops_when_the_run_ledger_is_gone(tmp_path):
    path = _ledger(tmp_path, driver=interrupts.driver())
    path.unlink()  # the run's directory deleted under it
    said = []
    assert keep(path, log=said.append) == f"the run's ledger {path} is gone"
    assert said == [f"keeper: the run's ledger {path} is gone: exiting"]


def test_tpupipe_teardown_of_a_local_run_with_nothing_left_exits_0(tmp_path, capsys):
    from pipelines.cli import main as cli

    assert cli.main(["teardown", "never-started", "--output-root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "tpupipe teardown never-started (local): nothing was left to delete"
    assert cli.main(["teardown", "x", "--platform", "moon", "--output-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: platform: unknown platform 'moon'")
    assert cli.main(["teardown", "--output-root", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: RUN_ID: name the run to tear down")


def test_the_command_that_finishes_an_abandoned_teardown():
    from pipelines.backends.local.driver import teardown_command

    ctx = RunContext(spec=resolve("local-fsdp"), run_id="r1", store=LocalStore(Path("unused")), platform="gke")
    assert teardown_command(ctx, "my runs") == "tpupipe teardown r1 --platform gke --output-root 'my runs'"


def _a_run_of_sleepers(root, run_id: str, driver: dict) -> subprocess.Popen:
    """A local run's ledger with one process of the run (a sleeper carrying the run's marker) and the given driver."""
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, RUN_MARKER: run_id}, start_new_session=True)
    path = root / run_id / "ledger.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "run_id": run_id,
                "platform": "local",
                "driver": driver,
                "temp_dir": str(root / "t"),
                "ports": [],
                "processes": [{"role": "head", "pid": proc.pid, "pgid": proc.pid, "log": "", "cmd": ["sleep", "300"]}],
            }
        )
    )
    return proc


def test_the_janitor_tears_down_the_local_runs_whose_driver_is_gone_and_no_other(tmp_path, capsys):
    from pipelines.cli import main as cli

    gone = subprocess.Popen(["true"])
    record_of_gone = {"pid": gone.pid, "started": procs.start_time(gone.pid) or 1}
    gone.wait()
    # Run ids of this test session's own: the janitor kills the orphan's processes by its run's marker.
    orphan_id, running_id = unique_run_id("orphan"), unique_run_id("running")
    orphan = _a_run_of_sleepers(tmp_path, orphan_id, record_of_gone)
    running = _a_run_of_sleepers(tmp_path, running_id, interrupts.driver())  # this test is its driver, alive
    try:
        assert cli.main(["teardown", "--orphans", "--output-root", str(tmp_path)]) == 0
        assert (
            capsys.readouterr()
            .out.strip()
            .endswith(f"tpupipe teardown {orphan_id} (local): deleted head (pid {orphan.pid})")
        )
        assert orphan.wait(timeout=10) == -signal.SIGTERM and running.poll() is None
        assert cli.main(["teardown", "--orphans", "--output-root", str(tmp_path)]) == 0
        assert "no local run under" in capsys.readouterr().out
    finally:
        running.kill()
        orphan.kill()
        running.wait()


# A driver printing a stage's output as fast as it comes when its terminal is closed: whether the write the closed
# terminal refuses (EIO) comes before SIGHUP's handler or after, the driver takes the hang-up as an interrupt and goes
# on, its output in the run's log.
_PRINTING_DRIVER = """
import sys
from components.platforms import RunContext
from components.platforms.store import LocalStore
from components.workload import resolve
from pipelines.backends.local.driver import Interrupts
root = sys.argv[1]
from pathlib import Path
ctx = RunContext(spec=resolve("local-fsdp"), run_id="hup", store=LocalStore(Path(root) / "hup"), platform="local")
with Interrupts(ctx, root) as interrupted:
    print("printing", flush=True)
    while not interrupted.signum:
        print("a line of the stage's output " * 40)
print("the driver went on after", interrupted.signum)
"""


def test_a_closed_terminal_while_the_driver_prints_is_taken_as_sighup_and_the_output_goes_to_the_log(tmp_path):
    from tests.terminal import Terminal

    term = Terminal(
        [sys.executable, "-c", _PRINTING_DRIVER, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    rc = term.act_when("printing", term.hang_up, timeout_s=60, exit_timeout_s=60)
    log = (tmp_path / "hup" / "logs" / "driver.log").read_text()
    assert rc == 0, log[-3000:]
    assert log.endswith(f"the driver went on after {signal.SIGHUP.value}\n")
    assert json.loads((tmp_path / "hup" / "interrupted.json").read_text())["signal"] == "SIGHUP"
