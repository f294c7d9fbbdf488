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
