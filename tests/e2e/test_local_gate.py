"""Recurring fine-tunes that only ever improve, on the local platform: two `tpupipe run`s of local-fsdp with one
output root, so one local registry (``<root>/registry``, model ``local-fsdp``):

1. the first run's model becomes the champion (there is none yet);
2. a run with ``train.init_from=champion`` starts from the champion's weights (its "before" held-out loss is the
   champion's "after"), the champion measured again in its evaluation job on the same examples, trains further, and
   is promoted;

then `tpupipe models rollback` moves the champion back and `tpupipe models show` lists every provenance field. A run
that is registered and not promoted is the Vertex AI gate test's second job (tests/vertex/test_vertex_pipeline.py,
the same gate code over the other registry), and how a local run prints that decision,
tests/component/test_components_local.py. Each run is as small as the assertions allow: one emulated host, no slice
check, 256 examples."""

import json
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from components.registry import PROVENANCE_FIELDS, open_registry
from tests.helpers import REPO, tpupipe_cmd, unique_run_id

pytestmark = pytest.mark.e2e

MODEL = "local-fsdp"  # the registered model: the preset's name (gate.model is empty)
SMALL = "cluster.num_hosts=1 cluster.slice_check=false num_train_examples=256 num_eval_examples=64 epochs=1"
RUNS = {  # run -> its overrides, in order (its run id: this test session's own, unique_run_id)
    "gate-1": SMALL,
    "gate-2": SMALL + " train.init_from=champion epochs=2",
}


def tpupipe(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([*tpupipe_cmd(), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three runs, in order, each with its process, summary and the registry as it left it."""
    root = tmp_path_factory.mktemp("runs")
    out = {"root": root}
    for name, overrides in RUNS.items():
        run_id = unique_run_id(name)
        proc = tpupipe("run", "--run-id", run_id, "--output-root", str(root), "--set", overrides)
        summary_file = root / run_id / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        registry = open_registry(root)
        champion = registry.champion(MODEL) if MODEL in registry.models() else None
        out[name] = {
            "run_id": run_id,
            "proc": proc,
            "summary": summary,
            "champion": champion.version if champion else None,
        }
    return out


def _ok(run: dict) -> dict:
    proc = run["proc"]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert run["summary"]["status"] == "succeeded"
    return run["summary"]


def test_the_first_run_becomes_the_champion(runs):
    summary = _ok(runs["gate-1"])
    gate = summary["gate"]
    assert (gate["ref"], gate["decision"], gate["promoted"]) == (f"{MODEL}@1", "promote", True)
    assert gate["champion_loss"] is None  # nothing to measure against
    assert runs["gate-1"]["champion"] == "1"
    stages = {s["name"]: s["status"] for s in summary["stages"]}
    assert stages["register"] == stages["promote"] == "succeeded"
    assert f"gate: promoted {MODEL}@1 to champion: there was no champion yet" in runs["gate-1"]["proc"].stdout
    # The slice check switched off: the summary says so.
    assert summary["slice_check"] == {"skipped": True, "reason": "cluster.slice_check=false"}
    assert "slice check          off (cluster.slice_check=false)" in runs["gate-1"]["proc"].stdout
    assert run_processes(runs["gate-1"]["run_id"]) == []


def test_a_run_from_the_champion_starts_at_its_figure_trains_better_and_is_promoted(runs):
    summary = _ok(runs["gate-2"])
    registry = open_registry(runs["root"])
    first = registry.get(MODEL, "1")
    # init_from=champion: the weights training started from are the champion's, so the held-out loss "before" is the
    # champion's "after".
    assert summary["init_from"] == f"{MODEL}@1"
    assert summary["eval_loss_before"] == pytest.approx(first.provenance["eval_loss_after"], rel=1e-5)
    gate = summary["gate"]
    assert gate["champion_loss"] == pytest.approx(summary["eval_loss_before"], rel=1e-6)
    assert (gate["ref"], gate["decision"], gate["promoted"]) == (f"{MODEL}@2", "promote", True)
    assert gate["eval_loss"] < gate["champion_loss"]
    assert runs["gate-2"]["champion"] == "2" and registry.history(MODEL)[-2:] == ["1", "2"]
    second = registry.get(MODEL, "2")
    assert second.provenance["base_model"] == f"{MODEL}@1" and second.provenance["eval_loss_before"] == pytest.approx(
        summary["eval_loss_before"]
    )
    assert second.provenance["champion_measured"] == f"{MODEL}@1"
    assert second.provenance["eval_loss_after"] == pytest.approx(gate["eval_loss"])
    out = runs["gate-2"]["proc"].stdout
    assert f"  started from         {MODEL}@1" in out and f"gate: promoted {MODEL}@2 to champion" in out
    assert run_processes(runs["gate-2"]["run_id"]) == []


def test_rollback_moves_the_champion_back_and_show_lists_the_provenance(runs):
    root = str(runs["root"])
    shown = tpupipe("models", "show", f"{MODEL}@2", "--output-root", root, timeout=120)
    assert shown.returncode == 0, shown.stderr
    lines = {
        line.split()[0]: line.split(None, 1)[1] if len(line.split()) > 1 else ""
        for line in shown.stdout.splitlines()
        if line.startswith("    ")
    }
    assert set(PROVENANCE_FIELDS) <= set(lines)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    second = open_registry(root).get(MODEL, "2").provenance
    assert (
        lines["preset"] == "local-fsdp"
        and lines["run_id"] == runs["gate-2"]["run_id"]
        and lines["base_model"] == f"{MODEL}@1"
    )
    assert lines["git_sha"] == head and lines["accelerator"] == "cpu" and lines["slices"] == "1"
    assert lines["spec_hash"].startswith("sha256:") and lines["data_snapshot"].startswith("sha256:")
    assert lines["trainer_image"].startswith("local/torch@sha256:")
    assert int(lines["tokens_seen"]) == second["tokens_seen"] > 0
    assert (lines["restarts"], lines["preemptions"], lines["topology"]) == ("0", "0", "-")
    assert lines["pipeline_job"] != "-" and float(lines["eval_loss_after"]) == pytest.approx(
        runs["gate-2"]["summary"]["eval_loss_after"]
    )
    # Same examples in every run: one data snapshot.
    snapshots = {v.provenance["data_snapshot"] for v in open_registry(root).versions(MODEL)}
    assert len(snapshots) == 1

    back = tpupipe("models", "rollback", MODEL, "--output-root", root, timeout=120)
    assert back.returncode == 0, back.stderr
    assert back.stdout == f"{MODEL}: champion moved back to version 1 (from 2)\n"
    assert open_registry(root).champion(MODEL).version == "1"
    listed = tpupipe("models", "list", MODEL, "--output-root", root, timeout=120)
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("1", "champion"), ("2", "-")]
