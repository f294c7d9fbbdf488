"""A command run the way a terminal runs a foreground job, for the interrupt tests: its own session and process
group, a pty as its controlling terminal, SIGINT at its default disposition (a background job of a non-interactive
shell would have it ignored); :meth:`Terminal.ctrl_c` types Ctrl-C, and the terminal's line discipline sends SIGINT
to the whole foreground process group, the driver and its stages' processes alike."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading

from components.platforms import procs
from tests.helpers import wait_until

# Runs in the new session before the command: take the pty as the controlling terminal (its process group becomes
# the foreground one), put SIGINT back to its default, then become the command.
_AS_FOREGROUND_JOB = (
    "import fcntl, os, signal, sys, termios\n"
    "fcntl.ioctl(0, termios.TIOCSCTTY, 0)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


class Terminal:
    def __init__(self, cmd: list[str], env: dict[str, str] | None = None):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _AS_FOREGROUND_JOB, *cmd],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self._master = master
        self._out = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The command's pid (it replaced the setup in place): the driver, its process group's leader."""
        return self.proc.pid

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every holder of the pty's other end is gone
                return
            if not chunk:
                return
            with self._lock:
                self._out += chunk

    @property
    def output(self) -> str:
        with self._lock:
            return self._out.decode(errors="replace").replace("\r\n", "\n")

    def wait_for(self, text: str, timeout_s: float) -> bool:
        """Until ``text`` shows on the terminal (True), the command ends or the time is up (False)."""
        try:
            wait_until(lambda: text in self.output or self.proc.poll() is not None, timeout_s, repr(text))
        except AssertionError:
            return False
        return text in self.output

    def ctrl_c(self) -> None:
        os.write(self._master, b"\x03")

    def ctrl_c_when(self, text: str, timeout_s: float, exit_timeout_s: float) -> int:
        """Type Ctrl-C once ``text`` shows, then wait for the command to end: its exit status."""
        return self.act_when(text, self.ctrl_c, timeout_s, exit_timeout_s)

    def act_when(self, text: str, act, timeout_s: float, exit_timeout_s: float) -> int:
        """``act()`` once ``text`` shows, then wait for the command to end: its exit status. The job is gone
        afterwards, whatever happened."""
        try:
            assert self.wait_for(text, timeout_s), f"{text!r} never showed:\n{self.output[-4000:]}"
            act()
            return self.wait(exit_timeout_s)
        finally:
            self.close()

    def hang_up(self) -> None:
        """Close the terminal (its window, its ssh connection): the session's leader, the driver, gets SIGHUP."""
        os.close(self._master)
        self._master = -1

    def wait(self, timeout_s: float) -> int:
        rc = self.proc.wait(timeout=timeout_s)
        self._reader.join(timeout=5)
        return rc

    def close(self) -> None:
        """Kill what is left of the job (a failed test) and close the pty."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        if self._master >= 0:
            os.close(self._master)
            self._master = -1


def driver_processes(driver_pid: int) -> list[int]:
    """Live processes the driver started (its stages, and what they started): they carry its pid in their
    environment."""
    return procs.carrying("TPUPIPE_DRIVER_PID", str(driver_pid))
