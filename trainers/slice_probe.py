"""What each actor of the slice check runs (``trainers.slice_check``): :class:`Probe`, on a device (torch) or a host
(jax), says where it runs and checks its collectives and a tensor-parallel feed-forward block against a reference
computed on the host."""

from __future__ import annotations

import math
import os
import socket
from typing import Any

HIDDEN = 64  # the block's width: Linear 64 -> 256 -> 64
BATCH = 8
RTOL, ATOL = 1e-3, 1e-2
HOST_LABEL = "tpupipe/host"  # the host label of emulated hosts (local platform, emulated KubeRay pods)


def _block(seed: int = 0):
    """The feed-forward block's weights and input, the same on every rank (NumPy, float32)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((HIDDEN, 4 * HIDDEN), dtype=np.float32) / math.sqrt(HIDDEN)
    w2 = rng.standard_normal((4 * HIDDEN, HIDDEN), dtype=np.float32) / math.sqrt(4 * HIDDEN)
    x = rng.standard_normal((BATCH, HIDDEN), dtype=np.float32)
    return x, w1, w2


def reference(x, w1, w2):
    """x + SiLU(x w1) w2 on the host, in float32."""
    import numpy as np

    h = x @ w1
    return x + (h / (1.0 + np.exp(-h))) @ w2


class Probe:
    """One actor of the check: a device (torch) or a host (jax)."""

    def describe(self) -> dict[str, Any]:
        import ray

        rc = ray.get_runtime_context()
        labels = rc.get_node_labels() if hasattr(rc, "get_node_labels") else {}
        hostnames = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
        worker_id = os.environ.get("TPU_WORKER_ID")
        host = (
            labels.get(HOST_LABEL)
            or (hostnames[int(worker_id)] if hostnames and worker_id else "")
            or socket.gethostname()
        )
        return {
            "node_id": rc.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "host": host,
            "slice": os.environ.get("TPU_NAME", ""),
            "worker_id": worker_id,
            "worker_hostnames": hostnames,
            "accelerator_ids": [str(a) for a in rc.get_accelerator_ids().get("TPU", [])],
        }

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def check_torch(
        self, rank: int, world: int, local_rank: int, local_world: int, master: str, port: int, corrupt: bool
    ) -> dict[str, Any]:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        from trainers.fsdp import detect_backend

        os.environ.update(
            {
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
                "WORLD_SIZE": str(world),
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_world),
            }
        )
        device_type, backend = detect_backend()
        dist.init_process_group(backend)
        try:
            x, w1, w2 = _block()
            block = _FeedForward(torch.from_numpy(w1), torch.from_numpy(w2))
            mesh = init_device_mesh(device_type, (world,))
            block = parallelize_module(block.to(device_type), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
            with torch.no_grad():
                out = block(torch.from_numpy(x).to(device_type))
                out = out.full_tensor() if hasattr(out, "full_tensor") else out
                out = out.float().cpu()
            total = torch.tensor([float(rank + 1)], device=device_type)
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            all_reduce = float(total.cpu()[0])
        finally:
            dist.destroy_process_group()
        ref = torch.from_numpy(reference(x, w1, w2))
        if corrupt:  # testing aid (cluster.slice_check_corrupt_rank): this rank's results go wrong
            out, all_reduce = out + 1.0, all_reduce + 1.0
        return {
            "device": device_type,
            "backend": backend,
            "max_abs_diff": float((out - ref).abs().max()),
            "parity": bool(torch.allclose(out, ref, rtol=RTOL, atol=ATOL)),
            "all_reduce": all_reduce,
            "num_devices": world,
        }

    def check_jax(
        self, rank: int, world: int, coordinator: str, cpu_devices: int, corrupt: bool, megascale: dict[str, str]
    ) -> dict[str, Any]:
        from trainers.fsdp import tpu_chips_on_host

        chips = tpu_chips_on_host()
        if not chips:  # emulated host: CPU devices, set before JAX creates its backend
            os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
            os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ.update(megascale)
        import jax
        import numpy as np
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        if not chips:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=world, process_id=rank)
        try:
            devices = jax.devices()
            n = len(devices)
            mesh = Mesh(np.array(devices), ("d",))
            x, w1, w2 = _block()
            put = {
                name: jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx, a=a: a[idx])
                for name, a, spec in (("x", x, P()), ("w1", w1, P(None, "d")), ("w2", w2, P("d", None)))
            }
            ffn = jax.jit(lambda x, w1, w2: x + jax.nn.silu(x @ w1) @ w2, out_shardings=NamedSharding(mesh, P()))
            out = np.asarray(ffn(put["x"], put["w1"], put["w2"]).addressable_data(0), dtype=np.float32)
            ids = jax.make_array_from_callback(
                (n,), NamedSharding(mesh, P("d")), lambda idx: np.arange(1, n + 1, dtype=np.int32)[idx]
            )
            psum = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))
            all_reduce = float(np.asarray(psum(ids).addressable_data(0))[0])
            platform = devices[0].platform
        finally:
            jax.distributed.shutdown()
        ref = reference(x, w1, w2)
        if corrupt:
            out, all_reduce = out + 1.0, all_reduce + 1.0
        return {
            "device": platform,
            "backend": "jax",
            "max_abs_diff": float(np.abs(out - ref).max()),
            "parity": bool(np.allclose(out, ref, rtol=RTOL, atol=ATOL)),
            "all_reduce": all_reduce,
            "num_devices": n,
        }


def _FeedForward(w1, w2):  # a module class, built where torch is imported
    import torch

    class FeedForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = torch.nn.Linear(w1.shape[0], w1.shape[1], bias=False)
            self.w2 = torch.nn.Linear(w2.shape[0], w2.shape[1], bias=False)
            with torch.no_grad():
                self.w1.weight.copy_(w1.T)
                self.w2.weight.copy_(w2.T)

        def forward(self, x):
            return x + self.w2(torch.nn.functional.silu(self.w1(x)))

    return FeedForward()
