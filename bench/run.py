"""`make bench`: every ``bench/bench_*.py``, one after another (never side by side: each measures its two sides in
one run on a quiet machine); prints one table of every figure with its target and whether it holds, and writes
them to ``bench/results.json`` with the commit and the machine. ``python -m bench.run overhead recovery`` (or
``make bench BENCH="overhead recovery"``) runs those alone and replaces only their figures in results.json, each
figure keeping the commit and time it was measured at. Exits 1 when a figure misses its target."""

from __future__ import annotations

import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.figures import Figure, table

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "bench" / "results.json"


def machine() -> dict:
    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "memory_gib": round(int(meminfo[1]) / 2**20, 1),
        "system": platform.platform(),
        "python": platform.python_version(),
    }


def commit() -> str:
    """HEAD, marked when tracked files other than results.json (the figures, not what they measure) differ from it."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results.json"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+uncommitted changes" if dirty else "")


def previous(path: Path) -> list[dict]:
    """The figures of an earlier results.json, each with its bench's seconds (to carry them over)."""
    if not path.is_file():
        return []
    results = json.loads(path.read_text())
    return [f | {"bench_seconds": results.get("bench_seconds", {}).get(f.get("bench"))} for f in results["figures"]]


def main(names: list[str]) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench still stops what it started (finally)
    benches = sorted(p.stem.removeprefix("bench_") for p in (REPO / "bench").glob("bench_*.py"))
    unknown = [n for n in names if n not in benches]
    if unknown:
        print(f"unknown bench {', '.join(unknown)}; the benches are: {', '.join(benches)}", file=sys.stderr)
        return 2
    found, seconds, at = [], {}, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for name in names or benches:
        print(f"== bench/bench_{name}.py", flush=True)
        started = time.perf_counter()
        try:
            figures = importlib.import_module(f"bench.bench_{name}").figures()
        except (Exception, SystemExit) as e:  # one broken bench is a missed figure, not the end of the others
            if isinstance(e, SystemExit) and e.code == 143:
                raise
            print(f"bench/bench_{name}.py failed: {e}", file=sys.stderr, flush=True)
            figures = [Figure(f"bench_{name}.py ran", 0, "", ">= 1", {"error": str(e)[-2000:]})]
        seconds[name] = round(time.perf_counter() - started, 1)
        print(table(figures), flush=True)
        found += [(name, f) for f in figures]
    rows = [{"bench": name, **f.to_dict(), "commit": commit(), "at": at} for name, f in found]
    kept = [f for f in previous(RESULTS) if f.get("bench") not in seconds]  # a subset run keeps the others' figures
    RESULTS.write_text(
        json.dumps(
            {
                "machine": machine(),
                "bench_seconds": {f["bench"]: f.get("bench_seconds") for f in kept} | seconds,
                "figures": sorted(kept + rows, key=lambda f: f["bench"]),
            },
            indent=1,
        )
        + "\n"
    )
    found = [f for _, f in found]
    print(f"\n== every figure (written to {os.path.relpath(RESULTS, REPO)})\n{table(found)}")
    return 1 if any(f.holds is False for f in found) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
