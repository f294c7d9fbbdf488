"""Run state written by several writers at once loses nothing: a write under a generation precondition that no longer
holds is refused and writes nothing (Cloud Storage's ``ifGenerationMatch``, and its stand-in on this machine), and the
ledger's read-modify-writes, racing, keep every writer's change. Cloud Storage is the emulated one, through the real
client."""

from __future__ import annotations

import threading

import pytest

from components.platforms import ledger as ledgers
from components.platforms.store import GcsStore, LocalStore, StoreConflict
from tests.emulators.project import PROJECT

BUCKET = f"{PROJECT}-tpupipe"


@pytest.fixture(params=["local", "gcs"])
def new_store(request, tmp_path, project_factory):
    """``new_store()``: a fresh handle (its own client) on one run's store, on this machine or in Cloud Storage."""
    if request.param == "local":
        return lambda: LocalStore(tmp_path / "run")
    from google.cloud import storage

    from components.cloud.credentials import credentials

    project_factory()
    storage.Client(project=PROJECT, credentials=credentials()).create_bucket(BUCKET)  # as provision leaves it
    return lambda: GcsStore(BUCKET, "runs/run")


def test_a_write_whose_generation_changed_since_it_was_read_is_refused_and_writes_nothing(new_store):
    first, second = new_store(), new_store()
    assert first.read_versioned("ledger.json") == (None, 0)
    first.write_bytes("ledger.json", b'{"by": "first"}', if_generation=0)  # 0: only if there is none yet
    with pytest.raises(StoreConflict):
        second.write_bytes("ledger.json", b'{"by": "second"}', if_generation=0)
    text, generation = second.read_versioned("ledger.json")
    assert text == '{"by": "first"}' and generation > 0
    first.write_bytes("ledger.json", b'{"by": "first, again"}', if_generation=generation)
    with pytest.raises(StoreConflict):  # read before first's second write
        second.write_bytes("ledger.json", b'{"by": "second"}', if_generation=generation)
    assert new_store().read_text("ledger.json") == '{"by": "first, again"}'


def test_ledger_changes_racing_from_two_writers_are_all_kept(new_store):
    """Two writers (a stage's task and the host keeper, or two tasks) each record resources at the same time: every
    one of them is in the ledger, none written over by the other's copy."""
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        record = ledgers.recorder(new_store(), {"run_id": "run", "platform": "gke", "created": []})
        start.wait()
        try:
            for i in range(12):
                record("node_pool", f"{name}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    created = [e["name"] for e in ledgers.load(new_store())["created"]]
    assert sorted(created) == sorted(f"{n}-{i}" for n in "ab" for i in range(12))


def test_an_update_with_nothing_to_change_writes_nothing(new_store):
    store = new_store()
    ledgers.replace(store, {"run_id": "run", "created": []})
    _, before = store.read_versioned(ledgers.KEY)
    assert ledgers.update(store, lambda ledger: False) == {"run_id": "run", "created": []}
    assert store.read_versioned(ledgers.KEY)[1] == before
