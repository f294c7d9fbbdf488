"""Base weights cached once per model revision: a run's base-weights preparation with the copy already in the cache
(a verified hit: the revision resolved, each cached file checked against its manifest, nothing downloaded) against the
first run's (a cold copy from the hub: each file downloaded, checked against the hub's hash and written), side by side
in one run.

Both sides are the train stage's own step, ``components.stages.base_weights.prepare``, of a local-fsdp run whose
``train.model_id`` is a hub model served by the hub emulator (``tests/emulators/hfhub.py``, over loopback HTTP, as
``HF_ENDPOINT`` names it): a config, a tokenizer and two LFS safetensors shards of ``TPUPIPE_BENCH_WEIGHTS_MIB`` MiB
in all (default 256). Each measurement has an output root of its own (its own cache); the hit side makes its copy
first, untimed. Pairs alternate their order (``bench.figures.alternated``); the figure is the median ratio, target
<= 0.5: a run that finds the copy spends at most half of what the first run's download spent. The detail carries each
side's hub downloads (a hit makes none).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.figures import Figure, alternated

REPO = Path(__file__).resolve().parents[1]

TARGET = "<= 0.5"
MODEL = "bench/tiny-weights"
MIB = int(os.environ.get("TPUPIPE_BENCH_WEIGHTS_MIB", "256"))


def files() -> dict[str, bytes]:
    """The model's files: two shards of pseudo-random bytes (nothing a hash could shortcut), a config, a tokenizer."""
    shard = MIB // 2 << 20
    return {
        "config.json": b'{"model_type": "gemma4"}',
        "tokenizer.json": b'{"version": "1.0"}',
        "model-00001-of-00002.safetensors": os.urandom(shard),
        "model-00002-of-00002.safetensors": os.urandom(shard),
    }


def prepare(root: Path, run_id: str) -> tuple[float, dict]:
    """The train stage's base-weights step of one run under ``root``: its seconds and its record."""
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.stages import base_weights
    from components.workload import resolve

    spec = resolve("local-fsdp", {"model_id": MODEL})
    ctx = RunContext(spec=spec, run_id=run_id, store=LocalStore(root / run_id), platform="local")
    started = time.perf_counter()
    record = base_weights.prepare(ctx, lambda _: None)
    seconds = time.perf_counter() - started
    if record is None:
        raise SystemExit(f"bench_weights: {run_id} made no copy of {MODEL}")
    return seconds, record


def figures() -> list[Figure]:
    from tests.emulators.hfhub import HubEmulator

    hub = HubEmulator()
    hub.repo(MODEL).push(files())
    hub.start()
    before = os.environ.get("HF_ENDPOINT")
    os.environ["HF_ENDPOINT"] = hub.url
    try:
        with tempfile.TemporaryDirectory(prefix="tpupipe-bench-weights-") as tmp:

            def measured(side: str, i: int, warm: bool) -> dict:
                root = Path(tmp, f"{side}-{i}")
                if warm:
                    prepare(root, "first")  # the copy a first run made
                downloads = len(hub.downloads)
                seconds, record = prepare(root, "timed")
                return {"seconds": seconds, "hit": record["hit"], "downloads": len(hub.downloads) - downloads}

            ratio, detail, hits, copies = alternated(
                lambda i: measured("hit", i, True), lambda i: measured("cold", i, False), lambda m: m["seconds"]
            )
    finally:
        hub.stop()
        if before is None:
            os.environ.pop("HF_ENDPOINT", None)
        else:
            os.environ["HF_ENDPOINT"] = before
    if not all(m["hit"] and m["downloads"] == 0 for m in hits) or any(m["hit"] for m in copies):
        raise SystemExit(f"bench_weights: the sides were not a hit and a copy: {hits} {copies}")
    detail.update(
        model_mib=MIB,
        A_is="a verified hit (the second run)",
        B_is="a cold copy from the emulated hub (the first run)",
        downloads={"hit": [m["downloads"] for m in hits], "copy": [m["downloads"] for m in copies]},
        seconds={"hit": [round(m["seconds"], 3) for m in hits], "copy": [round(m["seconds"], 3) for m in copies]},
    )
    print(
        f"base weights ({MIB} MiB): a verified hit {detail['seconds']['hit']} s, a cold copy "
        f"{detail['seconds']['copy']} s; median ratio {ratio:.3f}"
    )
    return [
        Figure(
            "weights: the second run's base-weights preparation / the first's (hit / cold copy)",
            ratio,
            "x",
            TARGET,
            detail,
        )
    ]


if __name__ == "__main__":
    from bench.figures import table

    print(table(figures()))
