"""Where this machine's CPU goes while the pipeline's FSDP2 train stage trains: every process's share of one core,
sampled from /proc over a window of steady training, for a reader of `make bench BENCH=trainer`'s figure (run by hand;
it reports, it holds no target).

    .venv/bin/python -m bench.cpu_share [--after S] [--window S]

It starts `tpupipe run --preset local-fsdp` with the trainer bench's settings (``bench.bench_trainer``), waits until
both Ray Train workers exist and then ``--after`` seconds more, sums each process's user and system time
(/proc/<pid>/stat, utime and stime, in clock ticks) over ``--window`` seconds, and prints the processes by share with
the total (200% is both cores of a 2-core machine), then lets the run finish.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_trainer import OVERRIDES, PRESET

REPO = Path(__file__).resolve().parents[1]

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks() -> dict[str, tuple[int, str]]:
    """Every process's (user + system ticks, command line or name), by pid."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
        except OSError:  # gone meanwhile
            continue
        name, fields = stat.split("(", 1)[1].rsplit(")", 1)
        rest = fields.split()
        found[pid] = (int(rest[11]) + int(rest[12]), cmdline or f"({name})")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--after", type=float, default=3.0, help="seconds after the workers start (default 3)")
    parser.add_argument("--window", type=float, default=6.0, help="seconds sampled (default 6)")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="tpupipe-cpu-share-")
    tpupipe = str(Path(sys.executable).parent / "tpupipe")
    run = [tpupipe, "run", "--preset", PRESET, "--set", OVERRIDES, "--run-id", "cpu", "--output-root", root]
    proc = subprocess.Popen(run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while sum("RayTrainWorker" in cmd for _, cmd in cpu_ticks().values()) < 2:
            if proc.poll() is not None:
                raise SystemExit(f"the run ended (exit {proc.returncode}) before its workers were seen: {root}")
            time.sleep(0.2)
        time.sleep(args.after)
        before, started = cpu_ticks(), time.monotonic()
        time.sleep(args.window)
        after, seconds = cpu_ticks(), time.monotonic() - started
    finally:
        proc.wait()
    shares = sorted(
        ((after[pid][0] - before[pid][0]) / TICKS / seconds, after[pid][1]) for pid in after if pid in before
    )
    for share, cmd in shares:
        if share >= 0.002:
            print(f"{share:7.1%}  {cmd if len(cmd) <= 110 else cmd[:45] + ' ... ' + cmd[-60:]}")
    print(f"{sum(s for s, _ in shares):7.1%}  in all, over {seconds:.1f} s (run exit {proc.returncode}, in {root})")


if __name__ == "__main__":
    main()
