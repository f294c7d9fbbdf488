"""The whole pipeline through `tpupipe run`, kfp.local + a real local multi-node Ray cluster + Ray Train, where it
fails or is given something other than the default: a bad device, a composite checkpoint, a lost worker, bad input.
The default run itself (`make run`'s) is the first run of tests/e2e/test_local_gate.py."""

import json
import re
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from tests.helpers import assert_goodput_accounts, assert_nothing_left, tpupipe_cmd, tpupipe_run, unique_run_id


@pytest.mark.e2e
def test_a_bad_device_and_a_slow_host_fail_the_run_at_the_slice_check_each_named_alone(tmp_path):
    """Rank 1's device computes with corrupted weights; rank 0's host holds its transfers below the floor. The
    device is named by itself (its own block, computed before any collective), the slow host by its link."""
    run_id = unique_run_id("e2e-badrank")
    proc = tpupipe_run(tmp_path, run_id, "testing.slice_check_corrupt_rank=1 testing.slice_check_slow_rank=0")
    assert proc.returncode == 1, proc.stdout[-4000:]
    summary = json.loads((tmp_path / run_id / "summary.json").read_text())
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["check_slice"]["status"] == "failed"
    error = stages["check_slice"]["error"]
    found = re.fullmatch(
        r"check_slice: slice check failed on rank 1 \(host (host-\d), device cpu:0\): computes the block alone "
        r"[0-9.e-]+ off the reference, before any collective; host (host-\d): the link to host (host-\d) runs at "
        r"[0-9.e-]+ GB/s, below the floor 0.02 GB/s \(tpupipe's floor for CPU gloo over loopback, not a TPU figure\)",
        error,
    )
    assert found, error
    bad_device_host, slow_host, its_peer = found.groups()
    assert slow_host != bad_device_host == its_peer  # the slow host is rank 0's, named by its link to rank 1's
    assert "rank 0" not in error and "tensor-parallel" not in error  # no rank blamed for what the bad device spread
    assert stages["train"]["status"] == stages["evaluate"]["status"] == "skipped"
    assert stages["teardown"]["status"] == "succeeded"
    assert_nothing_left(tmp_path / run_id, run_id)


def safetensors_names(path) -> list[str]:
    """The tensor names in a safetensors file's header (8 bytes of length, then JSON), read without torch."""
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    return [name for name in header if name != "__metadata__"]


@pytest.mark.e2e
def test_a_composite_gemma4_from_the_hub_fine_tunes_end_to_end_from_its_cached_copy(tmp_path, monkeypatch):
    """train.model_id names a hub model with the layout of google/gemma-4-E2B-it (``Gemma4ForConditionalGeneration``:
    text, vision and audio configs, a tokenizer beside it), served by the hub emulator: the train stage copies it once
    into the cache under the output root, and no job reaches the hub (every file downloaded once, by the stage); the
    workers load it after checking every file against the trusted manifest as they read it. It
    trains on 2 CPU workers of Ray Train without the towers, the checkpoint leaves out the frozen per-layer table
    (and, with train.checkpoint_optimizer=false, the optimizer), and evaluate loads it back onto the base. The slice
    check is switched off, and the summary says so."""
    from components.platforms.local import envs
    from components.workload import weights
    from tests.emulators.hfhub import HubEmulator, directory_files
    from tests.helpers import REPO

    model_dir = tmp_path / "gemma4-composite"
    build = subprocess.run(
        [envs.ensure_env("torch").python, "-m", "tests.tiny_gemma4", str(model_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    hub = HubEmulator()
    files = directory_files(model_dir)
    commit = hub.repo("google/gemma-4-E2B-it").push(files)
    monkeypatch.setenv("HF_ENDPOINT", hub.start())
    monkeypatch.delenv("HF_TOKEN", raising=False)
    run_id = unique_run_id("e2e-composite")
    # Half the preset's examples in batches of 16 (8 steps an epoch on the 2 workers): what is shown is the hub's
    # copy, the checkpoint's layout and a model that learned, not how long it trains.
    sets = "model_id=google/gemma-4-E2B-it epochs=2 num_train_examples=256 batch_size=16 cluster.slice_check=false"
    sets += " checkpoint_optimizer=false"
    try:
        proc = tpupipe_run(tmp_path, run_id, sets)
    finally:
        hub.stop()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["spec"]["train"]["model_id"] == "google/gemma-4-E2B-it"
    # one revision lookup and one download of each file, by the train stage; the workers read the copy
    assert [p.split("?")[0] for m, p in hub.requests if "/resolve/" not in p] == [
        "/api/models/google/gemma-4-E2B-it/revision/main"
    ]
    assert sorted(p.rsplit(f"/{commit}/", 1)[1] for p in hub.downloads) == sorted(files)
    record = json.loads((run_dir / "weights.json").read_text())
    assert record["commit"] == commit and record["hit"] is False
    assert record["dir"] == weights.files_dir(str(tmp_path / "cache"), "google/gemma-4-E2B-it", commit)
    assert summary["slice_check"] == {"skipped": True, "reason": "cluster.slice_check=false"}
    assert "slice check          off (cluster.slice_check=false)" in proc.stdout
    train_log = (run_dir / "logs" / "train.log").read_text()
    assert "workers: 2 x {'CPU': 1} on cpu, backend gloo" in train_log
    assert f"base weights: {len(files)} files of {record['dir']} checked against the trusted manifest" in train_log
    assert (tmp_path / "_cache" / weights.manifest_key("google/gemma-4-E2B-it", commit)).is_file()  # the trusted one
    assert [e["epoch"] for e in summary["history"]] == [1, 2]
    # evaluate loaded the fine-tuned weights onto the base (the frozen table from the base) and measured them: the
    # loss over the responses alone falls to about 0.42x in these 16 steps
    assert summary["eval_loss_after"] < 0.8 * summary["eval_loss_before"]
    checkpoint = run_dir / "checkpoint"
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["Gemma4ForConditionalGeneration"]
    assert config["vision_config"] is None and config["audio_config"] is None  # loaded without the towers
    assert config["text_config"]["use_cache"] is False and config["text_config"]["num_hidden_layers"] == 2
    names = safetensors_names(checkpoint / "model.safetensors")
    assert len(names) > 10 and [n for n in names if "embed_tokens_per_layer" in n] == []
    assert not (checkpoint / "optimizer.pt").exists() and (checkpoint / "tokenizer.json").is_file()
    assert_nothing_left(run_dir, run_id)


@pytest.mark.e2e
def test_worker_failure_resumes_from_the_last_checkpoint_then_a_crashed_evaluation_fails_the_run(tmp_path):
    """Train loses a worker at step 10 and resumes from the last checkpoint, a sharded one of every 3 steps
    (``train.checkpoint_every_steps``): the steps trained again are at most those 3; then the evaluation job crashes
    (``testing.fail_eval``): the run fails naming evaluate, register and promote do not run, teardown leaves nothing.
    Its 2 hosts are 2 slices of one: the slice check places them on 2 slices and passes, and each worker group
    trains on a 2-D mesh (HSDP), the restarted one resuming onto it."""
    # 256 examples / (16 per worker x 2 workers) = 8 steps an epoch, 3 epochs (both set here: the steps below count
    # in them): step 10 is inside epoch 2, after the checkpoints of steps 3, 6, 8 (the epoch's end) and 9 (written
    # while training goes on: the newest may not be in yet).
    run_id = unique_run_id("e2e-resume")
    proc = tpupipe_run(
        tmp_path,
        run_id,
        "num_train_examples=256 batch_size=16 epochs=3 testing.fail_at_step=10 max_failures=1 testing.fail_eval=true "
        "cluster.num_hosts=1 cluster.num_slices=2 train.checkpoint_every_steps=3",
    )
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    check = (tmp_path / run_id / "logs" / "check_slice.log").read_text()
    assert "slice check (torch): 2 ranks on 2 hosts in 2 slices" in check
    log = (tmp_path / run_id / "logs" / "train.log").read_text()
    meshes = re.findall(r"pid=(\d+)\)\S* mesh \(replicate=2, shard=1\) over 2 workers on 2 slices", log)
    assert len(set(meshes)) == 2, log[-3000:]  # each worker group's rank 0 (a process of its own) built one
    assert "injected failure at step 10" in log
    resumed = re.search(r"resumed from checkpoint of epoch (\d+) \(step (\d+)\)", log)
    assert resumed, log[-3000:]
    r = int(resumed.group(2))  # the step the second worker group resumed after
    assert r in (6, 8, 9) and 10 - r <= 3 and int(resumed.group(1)) == (r - 1) // 8 + 1, resumed.group(0)
    summary = json.loads((tmp_path / run_id / "summary.json").read_text())
    assert [e["epoch"] for e in summary["history"]] == [1, 2, 3]
    assert summary["status"] == "failed"
    # The goodput ledger: steps r+1 to 10 ran twice (the first worker group's runs of them, and the restart up to the
    # second group's first step, are lost to failures); one record per step kept, the second group's from step r+1.
    categories = assert_goodput_accounts(summary)
    assert categories["lost to failures"]["seconds"] > 0 and categories["evaluation"]["seconds"] > 0
    ran = [s["step"] for s in summary["train_timeline"]["steps"]]
    assert ran[:r] == list(range(1, r + 1)) and ran[r - 24 :] == list(range(r + 1, 25)) and 10 in ran[r : r - 24]
    assert len(summary["train_timeline"]["groups"]) == 2
    assert [(s["step"], s["group"]) for s in summary["steps"]] == [(n, int(n > r)) for n in range(1, 25)]
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["check_slice"]["status"] == stages["train"]["status"] == "succeeded" and summary["slice_check"]["ok"]
    assert stages["evaluate"]["status"] == "failed"
    assert "(testing.fail_eval)" in stages["evaluate"]["error"]
    assert stages["register"]["status"] == stages["promote"]["status"] == "skipped"
    assert stages["teardown"]["status"] == "succeeded"
    assert "evaluate" in proc.stdout and "status: failed" in proc.stdout
    assert_nothing_left(tmp_path / run_id, run_id)


@pytest.mark.parametrize(
    "sets, field",
    [
        (["--preset", "no-such-preset"], "preset"),
        (["--set", "nonsense=1"], "nonsense"),
        (["--set", "epochs=0"], "train.epochs"),
        (["--set", "batch_size=0"], "train.batch_size"),
        (["--set", "dataset=/no/such/file.jsonl"], "train.dataset"),
        (["--set", "cluster.num_hosts=0"], "cluster.num_hosts"),
        (["--platform", "moon"], "platform"),
        (["--preset", "local-maxtext", "--set", "maxtext.ici_fsdp_parallelism=3"], "maxtext.ici_fsdp_parallelism"),
        (["--preset", "local-maxtext", "--set", "maxtext.model_name=llama9"], "maxtext.model_name"),
        (["--preset", "local-maxtext", "--set", "maxtext.steps=0"], "maxtext.steps"),
    ],
)
def test_bad_input_fails_with_one_clear_error_before_anything_starts(tmp_path, sets, field):
    run_id = unique_run_id("e2e-bad")
    proc = subprocess.run(
        [*tpupipe_cmd(), "run", "--run-id", run_id, "--output-root", str(tmp_path), *sets],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"tpupipe: error: {field}: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / run_id).exists()
    assert run_processes(run_id) == []
