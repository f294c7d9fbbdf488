"""Time to a ready local cluster of 2, 4 and 8 emulated hosts: provision (the head, one raylet per host, the
keeper) and deploy_raycluster (every node alive) as the pipeline's stages run them, then teardown. Reported without
a target: on a 2-core machine the raylets start one after another's CPU, so the figure shows how start-up grows
with hosts here, not what a slice would see."""

import tempfile
import time
from pathlib import Path

from bench.figures import Figure, table
from components.platforms.local.platform import LocalPlatform
from components.stages import runner as stages

REPO = Path(__file__).resolve().parents[1]

HOSTS = (2, 4, 8)


def ready_seconds(root: Path, hosts: int) -> tuple[float, float]:
    """(seconds to a ready cluster, seconds to tear it down)."""
    ctx = stages.context("local-fsdp", "local", f"cluster.num_hosts={hosts}", f"bench-scale-{hosts}", "", str(root))
    platform = LocalPlatform(log=lambda _m: None)
    started = time.perf_counter()
    try:
        platform.provision(ctx)
        platform.deploy_raycluster(ctx)
        ready = time.perf_counter() - started
    finally:
        stopping = time.perf_counter()
        platform.teardown(ctx)
    return ready, time.perf_counter() - stopping


def figures() -> list[Figure]:
    found = []
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        for hosts in HOSTS:
            ready, down = ready_seconds(Path(tmp), hosts)
            found.append(
                Figure(
                    f"scale: a ready local cluster of {hosts} emulated hosts",
                    ready,
                    "s",
                    None,
                    {"hosts": hosts, "ready_s": round(ready, 1), "teardown_s": round(down, 1)},
                )
            )
    return found


if __name__ == "__main__":
    print(table(figures()))
