"""Processes on this machine as Linux's procfs shows them (``/proc/PID/stat``, ``environ``, ``cmdline``): whether one
still runs, when it started, and which processes carry a ``NAME=VALUE`` in their environment (the mark a run, or a
driver, leaves on every process it starts). The local platform finds its run's processes by it, the interrupts their
driver, ``tpupipe run`` its stages' processes; signals to a process or a group that may be gone already."""

from __future__ import annotations

import os
from pathlib import Path

GONE = ("Z", "X")  # a zombie, or dead: it runs no more


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command's name (the state first), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (not a zombie)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in GONE


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks after boot): with the pid, it names one process, never a reused pid.
    None when it is gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] in GONE else int(fields[19])


def environ(pid: int) -> list[bytes]:
    """The process's environment as ``NAME=VALUE`` entries ([] when it is gone or not ours to read)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def cmdline(pid: int) -> list[str]:
    """The process's arguments ([] when it is gone, or exiting: a zombie's cmdline is empty)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return argv.decode(errors="replace").split("\0") if argv else []


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (its children, theirs, ...), as their parent pids in ``/proc/PID/stat`` say."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def carries(pid: int, name: str, value: str) -> bool:
    """Whether ``pid`` still runs with ``name=value`` in its environment."""
    return f"{name}={value}".encode() in environ(pid) and alive(pid)


def carrying(name: str, value: str) -> list[int]:
    """The processes that still run with ``name=value`` in their environment (zombies excluded)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and carries(int(entry), name, value)]


def group_of(pid: int) -> int | None:
    """The process group of ``pid``, or None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def signal_process(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; one that is gone already is no error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid``; one that is gone (or was never ours) is no error."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
