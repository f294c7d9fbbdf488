"""Snapshotting a dataset in Cloud Storage: ``components.data.gcs.list_objects`` of a prefix through
google-cloud-storage against the in-process storage emulator (tests/emulators/storage.py, pages of 1,000 objects).

A: 10,000 objects under a prefix; B: 1,000 (another bucket, the same names' shape). Measured side by side in one run,
as pairs in alternating order (bench/figures.py ``alternated``), each side the best of five listings: the figure is
the median A/B ratio, 10 when the listing is linear in objects (10 pages against 1, each the same work). Target:
<= 12 (within 20% of linear). The cost per object of A is reported without a target: it is this machine's and the
emulator's, not Cloud Storage's. Last, the whole snapshot a run's first stage takes of the 10,000 objects
(``components.data.snapshot.take``: list, read each pinned generation, check every example), once, in seconds: wall
time before provision, when no chip bills, so it adds nothing to the chip-seconds before the first training step.
Target: <= 10 s. Then the snapshot of a 1 GiB drop (8 objects of 128 MiB, JSON Lines) in a process of its own,
whose peak resident memory (``VmHWM``) less its resident memory before the snapshot began (its imports) is the
figure, against the largest object: the snapshot streams, so it holds about one object's read, not
the drop. Target: <= 2x the largest object.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.figures import Figure, alternated, table
from components.cloud.credentials import EMULATOR_HOST_ENV, EMULATOR_TOKEN_ENV
from components.data import gcs
from tests.emulators.storage import StorageEmulator

REPO = Path(__file__).resolve().parents[1]

PROJECT, TOKEN = "tpupipe-bench", "bench-token"
SIZES = {"tpupipe-bench-large": 10_000, "tpupipe-bench-small": 1_000}
DROP_BUCKET, DROP_OBJECTS, OBJECT_BYTES = "tpupipe-bench-drop", 8, 128 * 2**20  # a 1 GiB drop


REPEATS = 5  # a measurement is the best of this many listings: the least disturbed by what else the machine runs


def listing_seconds(bucket: str) -> float:
    """The best of REPEATS listings of the bucket's ``data/``, in seconds."""
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        found = gcs.list_objects(f"gs://{bucket}/data/", field="train.dataset")
        best = min(best, time.perf_counter() - started)
        if len(found) != SIZES[bucket]:
            raise SystemExit(f"listed {len(found)} objects of gs://{bucket}/data/, not {SIZES[bucket]}")
    return best


def snapshot_seconds(bucket: str) -> tuple[dict, float]:
    """(the manifest, seconds) of the snapshot a run of ``gs://BUCKET/data/`` takes before anything is created."""
    from datetime import UTC, datetime

    from components.data import snapshot
    from components.workload import resolve

    spec = resolve("local-fsdp", f"train.dataset=gs://{bucket}/data/")
    started = time.perf_counter()
    manifest, _train, _heldout = snapshot.take(spec, datetime.now(UTC), log=lambda line: None)
    return manifest, time.perf_counter() - started


def _drop_object(index: int) -> bytes:
    """One 128 MiB JSON Lines object of the drop: examples of about 4 KiB, each instruction its own."""
    response = json.dumps(" ".join(f"word{j % 97}" for j in range(600)))
    rows, size, n = [], 0, 0
    while size < OBJECT_BYTES:
        row = f'{{"instruction": "Summarise document {index}-{n}.", "response": {response}}}\n'
        rows.append(row)
        size, n = size + len(row), n + 1
    return "".join(rows).encode()


# The snapshot of the drop, in a process of its own: its peak resident memory is the snapshot's alone (the emulator
# that holds the drop runs in this one). VmRSS and VmHWM (the peak) of /proc/self/status, in kB (proc(5)): of this
# process's own address space, as getrusage's ru_maxrss is not (it keeps the parent's peak across fork and exec).
CHILD = """
import json, sys, time
from datetime import UTC, datetime
from components.data import snapshot
from components.workload import resolve
import google.cloud.storage, google_crc32c  # noqa: F401 - imported before the baseline, as a run's stage has them
def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024
spec = resolve("local-fsdp", sys.argv[1])
before = status("VmRSS")
started = time.perf_counter()
manifest, train, heldout = snapshot.take(spec, datetime.now(UTC), log=lambda line: None)
took = time.perf_counter() - started
print(json.dumps({"before": before, "peak": status("VmHWM"), "seconds": took, "examples": len(train) + len(heldout),
                  "objects": len(manifest["train"]["items"])}))
"""


def drop_memory(emulator: StorageEmulator, owner) -> dict:
    """The 1 GiB drop's snapshot in a child process: its resident memory before and at its peak, and its seconds."""
    owner.create_bucket(DROP_BUCKET)
    largest = 0
    for i in range(DROP_OBJECTS):
        data = _drop_object(i)
        largest = max(largest, len(data))
        emulator.put(DROP_BUCKET, f"drop/part-{i:05d}.jsonl", data)
        del data
    done = subprocess.run(
        [sys.executable, "-c", CHILD, f"train.dataset=gs://{DROP_BUCKET}/drop/"],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        raise SystemExit(f"the 1 GiB drop's snapshot failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"largest": largest}


def figures() -> list[Figure]:
    emulator = StorageEmulator({PROJECT: "123456789012"}, token=TOKEN)
    env = {
        "STORAGE_EMULATOR_HOST": emulator.start(),
        EMULATOR_HOST_ENV: emulator.endpoint,  # credentials(): the emulator's static token
        EMULATOR_TOKEN_ENV: TOKEN,
        "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA": "true",  # no background bucket lookups
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        from google.cloud import storage
        from google.oauth2.credentials import Credentials

        owner = storage.Client(project=PROJECT, credentials=Credentials(token=TOKEN))
        for bucket, count in SIZES.items():
            owner.create_bucket(bucket)
            for i in range(count):  # written as a writer outside the JSON API would: no request each
                row = f'{{"instruction": "Repeat w{i} twice.", "response": "w{i} w{i}"}}\n'
                emulator.put(bucket, f"data/part-{i:05d}.jsonl", row.encode())
        listing_seconds("tpupipe-bench-small")  # imports and the first connection, outside the figures
        pages = len(emulator.state.calls)
        ratio, detail, large, small = alternated(
            lambda _i: listing_seconds("tpupipe-bench-large"), lambda _i: listing_seconds("tpupipe-bench-small"), float
        )
        pages = emulator.state.calls[pages:].count("objects.list") // (len(large) * REPEATS)
        taken, took = snapshot_seconds("tpupipe-bench-large")
        drop = drop_memory(emulator, owner)
    finally:
        emulator.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    best = min(large)
    print(
        f"list_objects of 10,000 objects: {best:.3f} s best of {len(large) * REPEATS} "
        f"({best / 10_000 * 1e6:.0f} us an object); "
        f"of 1,000: {min(small):.3f} s; median ratio {ratio:.2f} (linear: 10); {pages} objects.list pages a pair"
    )
    grown = drop["peak"] - drop["before"]
    print(
        f"snapshot of 10,000 objects: {took:.2f} s; of a {DROP_OBJECTS * drop['largest'] / 2**30:.2f} GiB drop: "
        f"{drop['seconds']:.1f} s, peak RSS {drop['peak'] / 2**20:.0f} MiB ({drop['before'] / 2**20:.0f} MiB before), "
        f"{grown / 2**20:.0f} MiB for the snapshot against a largest object of {drop['largest'] / 2**20:.0f} MiB"
    )
    detail |= {"A": [round(s, 3) for s in large], "B": [round(s, 3) for s in small], "pages_per_pair": pages}
    return [
        Figure("snapshot: listing 10,000 objects / 1,000 objects (linear: 10)", ratio, "x", "<= 12", detail),
        Figure(
            "snapshot: listing cost per object, 10,000 objects through the emulator",
            best / 10_000 * 1e6,
            "us",
            None,
            {"seconds": round(best, 3), "objects": 10_000},
        ),
        Figure(
            "snapshot: a run's whole snapshot of 10,000 objects (list, read, check), before provision",
            took,
            "s",
            "<= 10",
            {"examples": taken["num_train_examples"] + taken["num_heldout_examples"], "chip_seconds_added": 0},
        ),
        Figure(
            "snapshot: a 1 GiB drop's snapshot, peak memory it adds / its largest object",
            grown / drop["largest"],
            "x",
            "<= 2",
            {
                "peak_rss_mib": round(drop["peak"] / 2**20, 1),
                "rss_before_mib": round(drop["before"] / 2**20, 1),
                "added_mib": round(grown / 2**20, 1),
                "largest_object_mib": round(drop["largest"] / 2**20, 1),
                "objects": drop["objects"],
                "examples": drop["examples"],
                "seconds": round(drop["seconds"], 1),
            },
        ),
    ]


if __name__ == "__main__":
    print(table(figures()))
