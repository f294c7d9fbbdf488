"""A recurring fine-tune on data that moves, whole on the local platform, as a schedule runs it: three `tpupipe run`s
of local-fsdp with the same settings each time (the README's recurring loop: ``train.dataset=DIR/
train.data_since=champion train.init_from=champion`` and a fixed evaluation set), over one directory of dated JSON
Lines drops, one output root (one local registry):

1. two drops, and no champion yet: the run starts from the preset's base and takes everything, says so for each,
   trains on both, evaluates on the fixed set and becomes the champion; its provenance records both;
2. no new drop: the run is ``skipped`` after its snapshot, exits 0, and starts nothing (no Ray process, no ledger);
3. a third drop: the run trains on that file alone, from the champion's weights, and the gate decides on the fixed
   evaluation set; the registered version's provenance names the new snapshot and the evaluation set's digest.
"""

import json
import time

import pytest

from components.platforms.ledger import CLAIM_KEYS
from components.platforms.local.processes import run_processes
from components.registry import open_registry
from tests.helpers import tpupipe_run, unique_run_id

pytestmark = pytest.mark.e2e

MODEL = "local-fsdp"
# a 50-token prompt and its answer; the gate on the held-out loss, no answers generated
SMALL = "cluster.num_hosts=1 cluster.slice_check=false epochs=1 train.max_length=80 eval.generate_examples=0"


def _drop(path, seed: int, count: int = 40) -> None:
    words = ["alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "oscar", "romeo", "tango"]
    rows = []
    for i in range(count):
        word = f"{words[(seed + i) % len(words)]}{seed}{i}"
        rows.append({"instruction": f"Reverse the word {word}.", "response": word[::-1]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    drops = tmp_path_factory.mktemp("sft")
    eval_dir = tmp_path_factory.mktemp("eval")
    _drop(drops / "2026-12-01.jsonl", 1)
    _drop(drops / "2026-12-02.jsonl", 2)
    _drop(eval_dir / "eval.jsonl", 9, count=24)
    # One setting for every run, as a schedule's: its first run has no champion by definition.
    data = (
        f"train.dataset={drops}/ train.eval_dataset={eval_dir}/eval.jsonl "
        "train.data_since=champion train.init_from=champion"
    )
    out = {"root": root}
    for name in ("first", "second", "third"):
        if name == "third":
            _drop(drops / "2026-12-03.jsonl", 3)
        run_id = unique_run_id(f"data-{name}")
        started = time.monotonic()
        proc = tpupipe_run(root, run_id, SMALL, data)
        summary_file = root / run_id / "summary.json"
        out[name] = {
            "run_id": run_id,
            "run_dir": root / run_id,
            "proc": proc,
            "seconds": time.monotonic() - started,
            "summary": json.loads(summary_file.read_text()) if summary_file.is_file() else {},
            "manifest": json.loads((root / run_id / "data" / "manifest.json").read_text()),
        }
    return out


def _ok(run: dict) -> dict:
    assert run["proc"].returncode == 0, run["proc"].stdout[-5000:] + run["proc"].stderr[-3000:]
    return run["summary"]


def test_the_first_run_starts_from_the_base_on_both_drops_and_becomes_the_champion(loop):
    summary = _ok(loop["first"])
    assert summary["status"] == "succeeded" and summary["gate"]["promoted"] is True
    said = loop["first"]["proc"].stdout + loop["first"]["proc"].stderr
    assert f"train.data_since=champion: {MODEL} has no champion yet: taking everything" in said, said[-5000:]
    assert f"train.init_from=champion: {MODEL} has no champion yet (its first run): training from" in said
    assert not summary.get("init_from")  # from the preset's base
    version = open_registry(loop["root"]).get(MODEL, summary["gate"]["ref"].split("@")[1])
    assert version.provenance["init_from_champion"].startswith(f"{MODEL} has no champion yet (its first run)")
    assert version.provenance["data_since_champion"] == "none yet: took everything"
    manifest = loop["first"]["manifest"]
    assert [item["uri"].rsplit("/", 1)[1] for item in manifest["train"]["items"]] == [
        "2026-12-01.jsonl",
        "2026-12-02.jsonl",
    ]
    assert manifest["num_train_examples"] == 80 and manifest["num_heldout_examples"] == 24
    assert summary["data"]["snapshot"] == manifest["digest"]


def test_a_day_with_nothing_new_is_skipped_and_starts_nothing(loop):
    run = loop["second"]
    summary = _ok(run)
    assert summary["status"] == "skipped"
    assert summary["skipped"].startswith(f"no examples since champion {MODEL}@1, snapshot sha256:")
    assert f"status: skipped (no examples since champion {MODEL}@1" in run["proc"].stdout
    statuses = {s["name"]: s["status"] for s in summary["stages"]}
    assert statuses["snapshot_data"] == "succeeded" and statuses["teardown"] == "succeeded"
    assert {statuses[s] for s in statuses if s not in ("snapshot_data", "teardown")} == {"skipped"}
    ledger = json.loads((run["run_dir"] / "ledger.json").read_text())  # the run id claimed, no cluster recorded
    assert set(ledger) - set(CLAIM_KEYS) <= {"created", "platform", "run_id"} and not ledger["created"], ledger
    assert run_processes(run["run_id"]) == []
    assert run["manifest"]["skip"] and not run["manifest"]["train"]["items"]


def test_a_new_drop_trains_on_it_alone_from_the_champion_judged_on_the_fixed_set(loop):
    summary = _ok(loop["third"])
    assert summary["status"] == "succeeded"
    manifest = loop["third"]["manifest"]
    assert [item["uri"].rsplit("/", 1)[1] for item in manifest["train"]["items"]] == ["2026-12-03.jsonl"]
    assert manifest["num_train_examples"] == 40
    assert manifest["since"]["champion"] == f"{MODEL}@1"
    assert manifest["eval"]["digest"] == loop["first"]["manifest"]["eval"]["digest"]
    assert summary["init_from"] == f"{MODEL}@1"  # from the champion's weights
    gate = summary["gate"]
    assert gate["champion_loss"] is not None  # the champion measured again on the same fixed set
    version = open_registry(loop["root"]).get(MODEL, gate["ref"].split("@")[1])
    assert version.provenance["data_snapshot"] == manifest["digest"] != loop["first"]["manifest"]["digest"]
    assert version.provenance["eval_snapshot"] == manifest["eval"]["digest"]
    assert version.provenance["data_manifest"].endswith(f"{loop['third']['run_id']}/data/manifest.json")
    assert version.provenance["data_since_champion"] == f"{MODEL}@1"
    assert version.provenance["init_from_champion"] is None
