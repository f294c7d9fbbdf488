"""components/platforms/procs.py: processes as /proc shows them, on this machine's own processes."""

import os
import subprocess
import sys

from components.platforms import procs
from tests.helpers import unique_run_id, wait_until


def test_descendants_cmdline_and_the_mark_a_process_carries():
    mark = unique_run_id("procs")
    env = {**os.environ, "TPUPIPE_TEST_MARK": mark}
    shell = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' & wait"], env=env, start_new_session=True
    )
    try:
        # The shell's child is a copy of the shell until it has exec'd Python: wait for that, not for the fork alone
        def started() -> bool:
            found = procs.descendants(shell.pid)
            return len(found) == 1 and procs.cmdline(found[0])[:1] == [sys.executable]

        wait_until(started, 30, "the shell's child to start Python")
        (child,) = procs.descendants(shell.pid)
        assert procs.cmdline(child)[:2] == [sys.executable, "-c"]
        assert sorted(procs.carrying("TPUPIPE_TEST_MARK", mark)) == sorted([shell.pid, child])
        assert procs.alive(child) and procs.start_time(child) is not None
        procs.signal_group(procs.group_of(shell.pid), 9)
        shell.wait(timeout=30)
        wait_until(lambda: procs.carrying("TPUPIPE_TEST_MARK", mark) == [], 30, "the marked processes to end")
    finally:
        procs.signal_group(shell.pid, 9)
    assert procs.cmdline(child) == [] or not procs.alive(child)
    procs.signal_process(child, 9)  # gone already: no error
