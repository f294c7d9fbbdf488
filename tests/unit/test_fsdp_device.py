"""How the FSDP trainer picks its device: TPU chips are found where libtpu finds them; chips without torch_tpu
are a misbuilt image; a TPU-shaped host without chips (an emulated slice) computes on CPU with the chips hidden
from Ray Train's workers."""

from __future__ import annotations

import json
import os

import pytest

from trainers import devices, mesh

TRAINER = r"""
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from trainers import fsdp, mesh
from trainers.model import build_model, load_tokenizer

ROOT = Path(sys.argv[1])
SCRATCH = "scratch:gemma4-tiny"


def one_step(compute, weights):
    tokenizer = load_tokenizer(SCRATCH)
    model = build_model(SCRATCH, tokenizer, 0, getattr(torch, weights))
    model = mesh.parallelize(model, init_device_mesh("cpu", (1,)), compute)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().to_local().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=2e-5, weight_decay=0.0)
    ids = torch.randint(0, len(tokenizer), (2, 16))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    optimizer.step()
    after = [p.detach().to_local() for p in params]
    moved = sum(int((a != b).sum()) for a, b in zip(after, before)) / sum(b.numel() for b in before)
    return {"param": str(params[0].dtype), "logits": str(out.logits.dtype), "moved": moved}


if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    facts = {"mixed": one_step("bfloat16", "float32"), "bf16": one_step("bfloat16", "bfloat16")}
    dist.destroy_process_group()
    dataset = list(range(64))
    order = lambda seed, rank: list(fsdp.data_loader(dataset, 4, seed, 2, rank).sampler)
    facts["sampler"] = {"seed_0": order(0, 0), "seed_7": order(7, 0), "seed_0_again": order(0, 0),
                        "disjoint": not set(order(0, 0)) & set(order(0, 1))}
    loader = fsdp.data_loader(dataset, 4, 0, 2, 0)
    loader.sampler.set_epoch(1)
    whole = [b.tolist() for b in loader]
    loader.sampler.skip_batches = 3  # a resume at the epoch's 4th batch
    facts["resumed"] = {"whole": whole, "rest": [b.tolist() for b in loader], "len": len(loader)}
    print("FACTS " + json.dumps(facts))
"""


def _dev(tmp_path, *names: str) -> str:
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return str(tmp_path)


def test_chips_are_counted_from_accel_and_vfio_device_files(tmp_path):
    assert devices.tpu_chips_on_host(_dev(tmp_path)) == 0
    assert devices.tpu_chips_on_host(_dev(tmp_path, "accel0", "accel1", "vfio/0", "vfio/1", "vfio/vfio")) == 4


def test_chips_without_torch_tpu_are_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="4 TPU chips but the trainer image has no torch_tpu"):
        devices.detect_backend(_dev(tmp_path, "vfio/0", "vfio/1", "vfio/2", "vfio/3"))


def test_a_host_without_chips_or_a_gpu_device_file_is_cpu_gloo_found_without_importing_torch(tmp_path):
    """The driver asks a worker host for its backend in a task of its own: on a host with neither TPU chips nor an
    NVIDIA device file that task does not pay for importing torch."""
    import subprocess
    import sys

    from tests.helpers import REPO

    code = "import sys; from trainers.devices import detect_backend as d; print(d(sys.argv[1]), 'torch' in sys.modules)"
    dev = _dev(tmp_path, "null")
    proc = subprocess.run([sys.executable, "-c", code, dev], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "('cpu', 'gloo') False"


def test_emulated_hosts_are_cpu_gloo_by_the_spec_without_a_probe_task():
    """Workers that ask for no TPU (cluster.accelerator=cpu, the local platform's hosts) answer without asking Ray for
    a task: no worker process is started for it, and ray is not even imported."""
    import subprocess
    import sys

    from tests.helpers import REPO

    code = (
        "import sys; from components.workload import derive, resolve; from trainers.devices import probe_backend as p; "
        "print(p(derive.scaling_config_args(resolve('local-fsdp'))), 'ray' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "('cpu', 'gloo') False"


def test_tpu_keeps_float32_master_weights_and_computes_in_bfloat16_unless_train_precision_says_bf16():
    from components.spec import SpecError
    from components.workload import resolve

    assert resolve("local-fsdp").train.precision == "mixed"
    assert mesh.dtypes("tpu", "mixed") == ("float32", "bfloat16")
    assert mesh.dtypes("tpu", "bf16") == ("bfloat16", "bfloat16")  # the TorchTPU tutorial's
    assert mesh.dtypes("cpu", "mixed") == mesh.dtypes("cpu", "bf16") == ("float32", None)
    with pytest.raises(SpecError, match=r"train.precision: unknown precision 'fp16' \(valid: mixed, bf16\)"):
        resolve("local-fsdp", "train.precision=fp16")


def test_a_tpu_slice_without_chips_hides_them_from_the_workers():
    assert devices.worker_runtime_env(True, "cpu") == {"env_vars": {"TPU_VISIBLE_CHIPS": ""}}
    assert devices.worker_runtime_env(True, "tpu") == {}
    assert devices.worker_runtime_env(False, "cpu") == {}


@pytest.mark.trainer_env  # runs in the torch trainer environment, which `make test` builds while the fast tiers run
def test_torch_tpu_importable_without_chips_takes_the_gloo_path(tmp_path):
    """The torch image carries torch-tpu on every host; on one without chips torch_tpu imports, registers nothing,
    and the trainer computes on CPU with gloo (a one-process group here, in the torch environment itself)."""
    import subprocess

    from components.platforms.local import envs
    from tests.helpers import REPO

    code = (
        "import importlib.metadata, sys, torch, torch.distributed as dist, torch_tpu\n"
        "from trainers.devices import detect_backend\n"
        "device, backend = detect_backend(sys.argv[1])\n"
        "dist.init_process_group(backend, init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "t = torch.ones(1, device=device); dist.all_reduce(t); dist.destroy_process_group()\n"
        "print(importlib.metadata.version('torch-tpu'), device, backend, dist.is_backend_available('tpu_dist'))\n"
    )
    python = envs.ensure_env("torch").python
    proc = subprocess.run([python, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-4:] == ["0.2.0", "cpu", "gloo", "False"]
    # In the same environment, what the trainer does on those ranks (TRAINER, below): precision, sampler, a resume.
    # torch's autoload of device backends off: imported here, outside Ray's workers, torch_tpu would wait on the GCE
    # metadata server of a machine that has none, which is not what this measures.
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    script = tmp_path / "trainer_facts.py"  # a file: torch.multiprocessing's spawn re-imports the main module
    script.write_text(TRAINER)
    proc = subprocess.run(
        [python, str(script), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    # "mixed": float32 master weights, the forward in bfloat16; one AdamW step of lr 2e-5 moves nearly every weight,
    # where bfloat16 weights (the tutorial's "bf16") round most of the same updates away.
    assert facts["mixed"]["param"] == "torch.float32" and facts["mixed"]["logits"] == "torch.bfloat16"
    assert facts["bf16"]["param"] == "torch.bfloat16"
    assert facts["mixed"]["moved"] > 0.9 and facts["bf16"]["moved"] < 0.5, facts
    # train.seed reaches the sampler with two workers: each seed its own order, the two ranks' shards disjoint.
    assert facts["sampler"]["seed_0"] != facts["sampler"]["seed_7"]
    assert facts["sampler"]["seed_0"] == facts["sampler"]["seed_0_again"] and facts["sampler"]["disjoint"]
    # A resume mid-epoch starts at the batch it had reached, in the epoch's own order.
    resumed = facts["resumed"]
    assert len(resumed["whole"]) == 8 and resumed["rest"] == resumed["whole"][3:] and resumed["len"] == 5
