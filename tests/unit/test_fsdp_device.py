"""How the FSDP trainer picks its device: TPU chips are found where libtpu finds them; chips without torch_tpu
are a misbuilt image; a TPU-shaped host without chips (an emulated slice) computes on CPU with the chips hidden
from Ray Train's workers."""

from __future__ import annotations

import pytest

from trainers import fsdp


def _dev(tmp_path, *names: str) -> str:
    for name in names:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return str(tmp_path)


def test_chips_are_counted_from_accel_and_vfio_device_files(tmp_path):
    assert fsdp.tpu_chips_on_host(_dev(tmp_path)) == 0
    assert fsdp.tpu_chips_on_host(_dev(tmp_path, "accel0", "accel1", "vfio/0", "vfio/1", "vfio/vfio")) == 4


def test_chips_without_torch_tpu_are_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="4 TPU chips but the trainer image has no torch_tpu"):
        fsdp.detect_backend(_dev(tmp_path, "vfio/0", "vfio/1", "vfio/2", "vfio/3"))


def test_a_tpu_slice_without_chips_hides_them_from_the_workers():
    assert fsdp.worker_runtime_env(True, "cpu") == {"env_vars": {"TPU_VISIBLE_CHIPS": ""}}
    assert fsdp.worker_runtime_env(True, "tpu") == {}
    assert fsdp.worker_runtime_env(False, "cpu") == {}


@pytest.mark.e2e  # runs in the torch trainer environment, which `make test` builds while the fast tiers run
def test_torch_tpu_importable_without_chips_takes_the_gloo_path(tmp_path):
    """The torch image carries torch-tpu on every host; on one without chips torch_tpu imports, registers nothing,
    and the trainer computes on CPU with gloo (a one-process group here, in the torch environment itself)."""
    import subprocess

    from components.platforms.local import envs
    from tests.helpers import REPO

    code = (
        "import importlib.metadata, sys, torch, torch.distributed as dist, torch_tpu\n"
        "from trainers.fsdp import detect_backend\n"
        "device, backend = detect_backend(sys.argv[1])\n"
        "dist.init_process_group(backend, init_method='tcp://127.0.0.1:0', rank=0, world_size=1)\n"
        "t = torch.ones(1, device=device); dist.all_reduce(t); dist.destroy_process_group()\n"
        "print(importlib.metadata.version('torch-tpu'), device, backend, dist.is_backend_available('tpu_dist'))\n"
    )
    python = envs.ensure_env("torch").python
    proc = subprocess.run([python, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-4:] == ["0.2.0", "cpu", "gloo", "False"]
