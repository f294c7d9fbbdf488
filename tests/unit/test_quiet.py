"""What `tpupipe run` shows without --verbose (pipelines/backends/local/quiet.py): the stages' progress from kfp.local's stream, and
everything in the run's log, whoever wrote it (the driver, a task it started)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from components.stages import progress
from pipelines.backends.local.quiet import Render, Shown

# kfp.local's stream of one task, as it prints it (colours included), the stage's own lines among kfp's.
TASK = [
    "14:09:02.443 - INFO - Executing task \x1b[96m'provision'\x1b[0m",
    "14:09:02.443 - INFO - Streamed logs:",
    "",
    "    [KFP Executor 2026-12-01 14:09:02,521 INFO]: Got executor_input:",
    "    {",
    '        "inputs": {',
    "        }",
    "    }",
    "    == provision (local, run r1)",
    "    image torch: reusing environment /e (content hash 1)",
    "    starting Ray head on 127.0.0.1:1 (dashboard http://127.0.0.1:2), 2 emulated hosts and their keeper",
    "      waiting for 3 nodes ... 10s",
    "      [train] (RayTrainWorker pid=1) Reporting training result 1",
    "    2026-12-01 14:09:32,853\tINFO sdk.py:520 -- WebSocket closed for job r1-train with close code 1000",
    "    train: submitted Ray job r1-train",
    "    train: epoch 1/3  loss 3.4515  6662 tokens/s  (4.92s)",
    "    progress train [######..................] 1/4 steps  loss 3.4515",
    "    evaluate: held-out loss 4.6511 -> 1.0090  perplexity 104.70 -> 2.74",
    "    gate: promoted local-fsdp@1 to champion",
    "    image torch: reusing environment /e (content hash 1)",
    '    Output: \'{"gcs_address": "127.0.0.1:1"}\'',
    "    metrics: Metrics( name='metrics',",
    "                      uri='/runs/r1/kfp/metrics',",
    "                      metadata={'loss': 1.0} )",
    "                ]",
    "14:09:04.243 - INFO - Task \x1b[96m'provision'\x1b[0m finished with status \x1b[92mSUCCESS\x1b[0m",
    "--------------------------------------------------------------------------------",
    "14:09:05.000 - WARNING - a warning of kfp's",
    "tpupipe: SIGINT during train: stopping it, then tearing down run r1",
]


def _shown(timed: list[tuple[float, str]]) -> list[str]:
    """What :class:`Shown` shows of ``(the clock's time, line)`` pairs, fed in order."""
    now = [0.0]
    shown = Shown(clock=lambda: now[0])
    out = []
    for now[0], line in timed:
        out.append(shown(line))
    return [line for line in out if line is not None]


def test_the_stream_shows_each_stage_starting_and_ending_and_what_it_says_once_but_no_plumbing():
    timed = [(101.8 if "finished with status" in line else 100.0, line) for line in TASK]
    assert _shown(timed) == [
        "    == provision (local, run r1)",
        "    image torch: reusing environment /e (content hash 1)",
        "    starting Ray head on 127.0.0.1:1 (dashboard http://127.0.0.1:2), 2 emulated hosts and their keeper",
        "      waiting for 3 nodes ... 10s",
        "    progress train [######..................] 1/4 steps  loss 3.4515",
        "    provision: succeeded (1.8s)",
        "14:09:05.000 - WARNING - a warning of kfp's",
        "tpupipe: SIGINT during train: stopping it, then tearing down run r1",
    ]


def test_a_wait_says_it_is_waiting_once_a_minute_not_every_ten_seconds():
    waits = [(float(second), f"      waiting for 3 nodes ... {second}s") for second in range(10, 130, 10)]
    assert _shown(waits) == ["      waiting for 3 nodes ... 10s", "      waiting for 3 nodes ... 70s"]
    # A progress bar's lines differ only in their figures too; every one goes on, for the terminal to draw (Render).
    steps = [(130.0, "    " + progress.bar("train", i, 3, "steps", f"loss {4 - i}.5")) for i in (1, 2, 3)]
    assert len(_shown(steps)) == 3


def _rendered(render: Render, timed: list[tuple[float, str]]) -> str:
    now = [0.0]
    render.clock = lambda: now[0]
    out = ""
    for now[0], line in timed:
        out += render(line)
    return out + render.close()


BARS = [(float(i), "    " + progress.bar("train", i, 100, "steps", eta_s=100 - i)) for i in range(1, 101)]


def test_a_terminal_draws_a_progress_bar_in_place_and_a_pipe_gets_its_first_last_and_one_a_minute():
    timed = [(0.0, "    == train (local, run r1)"), *BARS, (101.0, "    train: succeeded (101.0s)")]
    drawn = _rendered(Render(tty=True), timed)
    assert drawn.count("\n") == 3 and drawn.count("\r\x1b[2K") == 99  # the stage's two lines, the bar's one
    assert drawn.endswith("100/100 steps\n    train: succeeded (101.0s)\n")
    piped = _rendered(Render(tty=False), timed).splitlines()
    assert [line.split("] ")[-1] for line in piped[1:-1]] == [
        "1/100 steps  ETA 1m39s",
        "61/100 steps  ETA 39s",
        "100/100 steps",
    ]
    # A restarted worker group runs steps again: the bar moves back, and a pipe is told.
    again = _rendered(Render(tty=False), [*BARS[:50], (51.0, BARS[39][1]), *[(t + 11, b) for t, b in BARS[40:]]])
    assert [line.split("] ")[-1].split()[0] for line in again.splitlines()] == ["1/100", "40/100", "100/100"]


def test_a_task_that_ends_unseen_ends_without_seconds():
    shown = Shown()
    assert shown("14:09:04.243 - ERROR - Task 'train' finished with status FAILURE") == "    train: failure"


PROGRAM = textwrap.dedent(
    """
    import subprocess, sys
    from pathlib import Path
    from pipelines.backends.local.quiet import Quiet

    print("before", flush=True)
    with Quiet(Path(sys.argv[1])):
        print("    == train (local, run r1)")
        print("    Output: plumbing of the driver")
        subprocess.run([sys.executable, "-c", "print('    train: 1/1'); print('      [train] a job line')"])
        print("tpupipe: said by the driver", file=sys.stderr)
    print("after")
    """
)


def test_the_driver_and_its_tasks_write_to_the_log_and_the_terminal_gets_what_is_shown(tmp_path):
    log = tmp_path / "logs" / "pipeline.log"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(log)], capture_output=True, text=True, timeout=60, cwd=tmp_path.parent
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "before",
        "    == train (local, run r1)",
        "    train: 1/1",
        "tpupipe: said by the driver",
        "after",
    ]
    assert proc.stderr == ""
    text = log.read_text()
    assert "    Output: plumbing of the driver" in text and "      [train] a job line" in text
    assert "    train: 1/1" in text and "before" not in text and "after" not in text
