"""A run id is claimed atomically by the first task of the run that uses it (``components.stages.claims``): of runs
racing for one id exactly one creates its ledger, the others are refused (exit 2) naming the id and the holder, on
this machine's store and on Cloud Storage (emulated, through the real client, ``ifGenerationMatch=0``); a ledger that
names no claimant is refused, not claimed; a first task refused writes nothing in the other run's store. (A run
started on Kubeflow Pipelines with an id in use: tests/kfp/test_kfp_backend.py.)"""

from __future__ import annotations

import threading

import pytest

from components.platforms import VERTEX_TASK_ENV, interrupts
from components.platforms import ledger as ledgers
from components.spec import SpecError
from components.stages.claims import claim
from tests.unit.test_run_state_writes import new_store  # noqa: F401 - the fixture: a local or a Cloud Storage store

RACERS = 4


def test_of_runs_racing_to_claim_one_run_id_one_wins_and_the_others_are_refused(new_store):  # noqa: F811
    """``RACERS`` first tasks (KFP runs, each its own workflow) claim one id at once, in rounds: each round exactly one
    holds it, the ledger names that one, and every other gets a SpecError naming ``run_id`` (exit 2), the id and the
    holder."""
    for round_ in range(3):
        run_id = f"race-{round_}"
        won, refused = _race(new_store, run_id, [f"workflow-{round_}-{i}" for i in range(RACERS)])
        (winner,) = won
        assert len(refused) == RACERS - 1
        for exc in refused.values():
            assert exc.field == "run_id" and exc.exit_code == 2
            assert f"run id {run_id!r} is held by {winner}" in str(exc)
        assert ledgers.load(_under(new_store(), run_id))["claim"]["job"] == winner


def _race(handle, run_id: str, jobs: list[str]) -> tuple[list[str], dict[str, SpecError]]:
    """Each of ``jobs`` claims ``run_id`` as a first task, all at once (a store ``handle()`` each): who won, who was
    refused and how."""
    start = threading.Barrier(len(jobs))
    won: list[str] = []
    refused: dict[str, SpecError] = {}

    def racer(job: str) -> None:
        store = _under(handle(), run_id)
        start.wait()
        try:
            claim(store, run_id, "gke", job, first=True, environ={})
            won.append(job)
        except SpecError as exc:
            refused[job] = exc

    threads = [threading.Thread(target=racer, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return won, refused


def test_a_ledger_that_names_no_claimant_is_refused_not_claimed(new_store):  # noqa: F811
    store = new_store()
    ledgers.replace(store, {"run_id": "run", "platform": "gke", "created": [], "torn_down": True})
    before = store.read_versioned(ledgers.KEY)
    for first in (True, False):
        with pytest.raises(SpecError, match="has a ledger that names no claimant") as refused:
            claim(store, "run", "gke", "workflow-b", first=first, environ={})
        assert refused.value.exit_code == 2
    assert store.read_versioned(ledgers.KEY) == before


def test_the_holders_retried_first_task_and_later_tasks_go_on_and_a_local_run_keeps_its_claim(new_store):  # noqa: F811
    """A retry of the holder's first task and its later tasks go on; the local platform's provision, which writes the
    ledger afresh, keeps the claim."""
    store = new_store()
    claim(store, "run", "local", "workflow-a", first=True, environ={})
    claim(store, "run", "local", "workflow-a", first=True, environ={})
    claim(store, "run", "local", "workflow-a", first=False, environ={})
    ledgers.replace(store, {"run_id": "run", "platform": "local", "processes": []})
    with pytest.raises(SpecError, match="is held by workflow-a"):
        claim(store, "run", "local", "workflow-b", first=False, environ={})


def test_a_first_task_whose_run_id_another_run_holds_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """The runner's first stage, a task of another run that does not hold the run id, exits 2 with the refusal on
    its log and writes nothing in the holder's directory: not even its own stage record. So too a task refused for
    where it runs (a local run's task on Vertex AI), and a Kubeflow Pipelines task (a job name, no ``tpupipe run``
    driver, ``KFP_POD_NAME`` set) whose output_root is not in Cloud Storage, where each task's disk is its own pod's."""
    import os

    from components.platforms.store import LocalStore
    from components.stages.runner import run_stage

    monkeypatch.delenv(interrupts.DRIVER_ENV, raising=False)
    claim(LocalStore(tmp_path / "held"), "held", "local", "workflow-a", first=True, environ={})
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))

    def refused(field: str, holder: str = "") -> None:
        with pytest.raises(SystemExit) as ended:
            run_stage("snapshot_data", "local-fsdp", "local", "", "held", "workflow-b", str(tmp_path))
        assert ended.value.code == 2
        out = capsys.readouterr().out
        assert f"snapshot_data: refused: {field}: " in out and holder in out
        assert sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before

    monkeypatch.setenv("KFP_POD_NAME", "workflow-b-system-container-impl-1")  # a task pod of Kubeflow Pipelines
    refused("output_root", "on Kubeflow Pipelines every task of workflow-b runs in a pod of its own")
    monkeypatch.delenv("KFP_POD_NAME")
    monkeypatch.setenv(interrupts.DRIVER_ENV, str(os.getppid()))  # another `tpupipe run` driver's task
    refused("run_id", "run id 'held' is held by workflow-a")
    monkeypatch.setenv(VERTEX_TASK_ENV, "{}")
    refused("platform", "is not a run for Vertex AI")


def _under(store, key: str):
    """The store of run ``key`` beside ``store``'s run (the same kind, the same root)."""
    from components.platforms.store import GcsStore, LocalStore

    if isinstance(store, LocalStore):
        return LocalStore(store.root.parent / key)
    return GcsStore(store.bucket_name, f"{store.prefix.rsplit('/', 1)[0]}/{key}", store._client)


def test_a_tpupipe_run_driver_and_its_tasks_claim_as_one_and_another_drivers_tasks_are_refused(tmp_path, monkeypatch):
    """``tpupipe run`` claims the id before it starts the pipeline; its tasks (kfp.local's, whatever job name it gives
    them) inherit its pid and claim as it; the tasks of another driver are refused."""
    import os

    from components.platforms.store import LocalStore
    from components.stages.claims import local_claimant

    monkeypatch.delenv(interrupts.DRIVER_ENV, raising=False)
    store = LocalStore(tmp_path / "run")
    claim(store, "run", "local", local_claimant(), first=True, environ={})  # the driver
    monkeypatch.setenv(interrupts.DRIVER_ENV, str(os.getpid()))  # what the driver gives its tasks
    claim(store, "run", "local", "tpupipe-pipeline-20261205", first=True)
    claim(store, "run", "local", "tpupipe-pipeline-20261205", first=False)
    monkeypatch.setenv(interrupts.DRIVER_ENV, str(os.getppid()))  # another live process: another driver's tasks
    with pytest.raises(SpecError, match=f"is held by tpupipe run on .* \\(pid {os.getpid()}, started"):
        claim(store, "run", "local", "tpupipe-pipeline-20261205", first=True)
