"""Components under kfp.local (SubprocessRunner), one at a time, with the pipeline environment."""

import json
import warnings

import pytest
from kfp import local

from components import definitions as c
from components.platforms.local import envs
from components.platforms.local.cluster import run_processes


@pytest.fixture(autouse=True)
def kfp_local(tmp_path):
    warnings.filterwarnings("ignore", message=".*non-Python base image.*")
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"),
               raise_on_error=True)


def args(tmp_path, run_id, **kw):
    base = dict(preset="local-fsdp", platform="local", overrides="", run_id=run_id, job_name="ignored",
                output_root=str(tmp_path / "runs"), project="", bucket="")
    return {**base, **kw}


def test_provision_rejects_bad_input_before_starting_anything(tmp_path):
    with pytest.raises(RuntimeError):
        c.provision(**args(tmp_path, "bad-input", overrides="epochs=0"))
    record = json.loads((tmp_path / "runs" / "bad-input" / "stages" / "provision.json").read_text())
    assert record["status"] == "failed"
    assert record["error"].startswith("train.epochs: must be at least 1")
    assert not (tmp_path / "runs" / "bad-input" / "ledger.json").exists()
    assert run_processes("bad-input") == []


def test_provision_rejects_a_tpu_preset_on_the_local_platform(tmp_path):
    with pytest.raises(RuntimeError):
        c.provision(**args(tmp_path, "tpu-local", preset="gemma4-e2b-v6e-16"))
    record = json.loads((tmp_path / "runs" / "tpu-local" / "stages" / "provision.json").read_text())
    assert record["error"].startswith("cluster.accelerator: the local platform emulates CPU hosts")


def test_build_image_reuses_the_torch_environment_by_content_hash(tmp_path):
    if not envs.env_for("torch").reused:
        pytest.skip("the torch environment is not built (make envs)")
    task = c.build_image(**args(tmp_path, "build"), cluster="{}")
    out = json.loads(task.output)
    assert out["reused"] is True
    assert out["image"] == f"local/torch@{envs.image_digest('torch')}"


def test_teardown_without_a_cluster_succeeds_and_writes_a_summary(tmp_path):
    task = c.teardown(**args(tmp_path, "nothing-here"))
    assert json.loads(task.outputs["Output"])["stopped_groups"] == 0
    assert "Nothing was left to delete" in open(task.outputs["deleted"].path).read()  # the Markdown artifact
    summary = json.loads((tmp_path / "runs" / "nothing-here" / "summary.json").read_text())
    assert summary["status"] == "failed"  # nothing else ran
    assert [s["name"] for s in summary["stages"]][-1] == "teardown"
    assert summary["stages"][-1]["status"] == "succeeded"


def test_run_id_defaults_to_the_pipeline_job_name(tmp_path):
    task = c.teardown(**args(tmp_path, "", job_name="Tpupipe-2026-11-29-10-04-42"))
    assert task.outputs["Output"]
    assert (tmp_path / "runs" / "tpupipe-2026-11-29-10-04-42" / "summary.json").is_file()
