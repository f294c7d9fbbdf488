"""What a training worker computes on: the TPU chips a host exposes, the device type and process-group backend they
make (``tpu_dist`` with torch_tpu, ``nccl`` on CUDA, ``gloo`` on CPU), the runtime env that hides a chipless TPU
slice's chips from Ray Train's workers, and the driver's probe of what a worker-shaped task sees (a TPU slice's
only: emulated hosts are CPU).

The FSDP2 trainer (``trainers.fsdp``) and its evaluation (``trainers.evaluate``) pick their backend here and say
where each worker stands here (:class:`Worker`: what the held-out loss, ``trainers.heldout``, and the answers,
``trainers.generation``, are measured with), the slice check's probe (``trainers.slice_probe``) counts chips here,
and ``bench/gpu_fsdp.py`` checks its device here. Imports torch only where the host has an NVIDIA device file (or a
worker asks where it stands), torch_tpu only where it has chips.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any


def tpu_chips_on_host(dev: str = "/dev") -> int:
    """TPU chips this host exposes, where libtpu finds them: ``/dev/accel<n>`` (v4, v5p) or ``/dev/vfio/<n>``
    (v5e, v6e, TPU7x)."""
    vfio = [n for n in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(n).isdigit()]
    return len(glob.glob(os.path.join(dev, "accel[0-9]*"))) + len(vfio)


def detect_backend(dev: str = "/dev") -> tuple[str, str]:
    """(device type, process-group backend) from the chips this host has, not from what imports: torch_tpu imports on
    a host without chips and then registers no ``tpu`` device and no ``tpu_dist`` backend, and the torch image has it
    on every host. Chips without torch_tpu are a misbuilt image, an error; a TPU-shaped host without chips (an
    emulated slice) computes on CPU with gloo, torch_tpu installed or not."""
    chips = tpu_chips_on_host(dev)
    if chips:
        try:
            import torch_tpu  # noqa: F401
        except ImportError:
            raise RuntimeError(
                f"this host has {chips} TPU chips but the trainer image has no torch_tpu: build the torch image from "
                "images/torch (torch-tpu and libtpu come from PyPI), or on a TorchTPU base image"
            ) from None
        return "tpu", "tpu_dist"
    if not glob.glob(os.path.join(dev, "nvidia[0-9]*")):  # no NVIDIA GPU's device file: CPU, without importing torch
        return "cpu", "gloo"
    import torch

    if torch.cuda.is_available():
        return "cuda", "nccl"
    return "cpu", "gloo"


@dataclasses.dataclass(frozen=True)
class Worker:
    """Where one worker of a job's group stands: its ``rank``, the group's size ``world``, the kind of device it
    computes on (``device_type``: part of every held-out figure's key, ``trainers.heldout.eval_key``) and the
    ``torch.device`` its model is on."""

    rank: int
    world: int
    device_type: str
    device: Any


def this_worker() -> Worker:
    """This Ray Train worker (a worker loop's: ``ray.train.get_context``). What this worker has decides the device,
    not what the cluster was provisioned as (:func:`detect_backend`): emulated TPU hosts compute on CPU."""
    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    device_type, _ = detect_backend()
    device = torch.device("cpu") if device_type == "cpu" else ray.train.torch.get_device()
    return Worker(ctx.get_world_rank(), ctx.get_world_size(), device_type, device)


def worker_runtime_env(use_tpu: bool, device_type: str) -> dict[str, Any]:
    """Ray Train's per-worker runtime env. On a TPU slice without chips (emulated hosts) the workers still hold the
    slice's TPU resources, so Ray Train schedules and gang-reserves exactly as on TPU, but see no chip ids: an
    empty ``TPU_VISIBLE_CHIPS`` makes Ray give them no accelerator ids, so its Torch backend sets them up for CPU
    instead of looking for torch_tpu."""
    if use_tpu and device_type == "cpu":
        return {"env_vars": {"TPU_VISIBLE_CHIPS": ""}}
    return {}


def probe_backend(scaling: dict[str, Any]) -> tuple[str, str]:
    """What the job's workers compute on, from its Ray ScalingConfig arguments
    (``components.workload.derive.scaling_config_args``). Workers that ask for no TPU (emulated CPU hosts, the local
    platform's only kind) are CPU: no task to ask, which would start one more worker process before training. A TPU
    slice's workers are asked by a worker-shaped task: the head may have no chips, and a slice without chips (an
    emulated one) computes on CPU."""
    if not scaling.get("use_tpu"):
        return "cpu", "gloo"
    import ray

    resources = scaling["resources_per_worker"]
    custom = {k: v for k, v in resources.items() if k != "CPU"}
    task = ray.remote(detect_backend).options(num_cpus=resources.get("CPU", 0), resources=custom or None)
    return ray.get(task.remote())
