"""Where each rank is and how the FSDP trainer shards over them: the slice a host belongs to (one rule, for the
slice check and the trainer alike), the device mesh over the ranks (1-D within one slice; 2-D, HSDP, over several),
the dtypes, and the FSDP2 layout.

A host's slice: ``TPU_NAME``, which the KubeRay TPU webhook gives every pod of a slice (one name a slice,
https://github.com/ray-project/kuberay/blob/master/ray-operator/pkg/webhooks/v1/tpu/); on the local platform's
emulated hosts, which have no such variable, the host's label ``tpupipe/host=host-<n>``: the platform starts
``num_hosts x num_slices`` hosts numbered from 1 in order (``components.platforms.local.cluster``), so host n is on
slice (n - 1) // num_hosts.

Over several slices FSDP2 shards within a slice and replicates across them (HSDP): ``fully_shard`` with a 2-D
``DeviceMesh`` of dims (replicate, shard) "does HSDP with replication on the 0th dim and sharding on the 1st"
(https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html), so the all-gathers and reduce-scatters
of every step stay on a slice's own links (ICI) and only the gradients' all-reduce crosses slices (DCN). Its
gradients are averaged over every rank, as a 1-D mesh's are: with the same global batch (the sampler follows the
global rank) an HSDP run trains as the one-slice run of the same number of workers does.

Imports torch only inside the functions: the slice check's driver and the spec checks import this module.
"""

from __future__ import annotations

import os
import re
from typing import Any, cast

HOST_LABEL = "tpupipe/host"  # the host label of emulated hosts (local platform, emulated KubeRay pods)
LOCAL_HOST = re.compile(r"host-(\d+)")  # the local platform's host names, numbered from 1
MESH_DIMS = ("replicate", "shard")  # the 2-D mesh's dims, in the order fully_shard reads them


def slice_name(tpu_name: str, host_label: str, hosts_per_slice: int) -> str:
    """The slice a host is on: its ``TPU_NAME``, else (an emulated local host) ``slice-<k>`` from its host label;
    '' when neither says (one slice)."""
    if tpu_name:
        return tpu_name
    local = LOCAL_HOST.fullmatch(host_label or "")
    return f"slice-{(int(local.group(1)) - 1) // max(1, hosts_per_slice)}" if local else ""


def host_label() -> str:
    """The ``HOST_LABEL`` of the Ray node this process runs on (a Ray worker or actor); '' where it has none. Ray
    2.60 annotates ``RuntimeContext.get_node_labels`` as ``Dict[str, List[str]]``, but what it returns is the node's
    labels as the GCS holds them, one string each (``ray/_private/node.py``, ``node_info["labels"]``; the proto's
    ``map<string, string> labels``, ``src/ray/protobuf/gcs.proto``)."""
    import ray

    rc = ray.get_runtime_context()
    labels = cast(dict[str, str], rc.get_node_labels()) if hasattr(rc, "get_node_labels") else {}
    return labels.get(HOST_LABEL, "")


def slice_here(hosts_per_slice: int) -> str:
    """:func:`slice_name` of the host this process runs on (a Ray worker or actor)."""
    return slice_name(os.environ.get("TPU_NAME", ""), host_label(), hosts_per_slice)


def layout(slices: list[str]) -> list[list[int]]:
    """The ranks of each slice, slices in name order, from each rank's slice (``slices[rank]``): the rows of the
    mesh. Raises ValueError when the slices hold different numbers of ranks (HSDP shards alike on every slice)."""
    names = sorted(set(slices))
    rows = [[rank for rank, s in enumerate(slices) if s == name] for name in names]
    if len({len(row) for row in rows}) > 1:
        counts = ", ".join(f"{name or 'unnamed'}: {len(row)}" for name, row in zip(names, rows, strict=True))
        raise ValueError(f"HSDP needs as many workers on every slice; the workers are on {counts}")
    return rows


def megascale_env(slices: list[str], index: int, coordinator: str) -> dict[str, str]:
    """The environment libtpu's multislice (DCN) runtime reads on the host of ``slices[index]`` (one entry per rank
    or host): the coordinator (slice 0's first host), the number of slices and this one's index, as in Cloud TPU's
    multislice setup (https://cloud.google.com/tpu/docs/multislice-introduction); empty on one slice."""
    names = sorted(set(slices))
    if len(names) < 2:
        return {}
    return {
        "MEGASCALE_COORDINATOR_ADDRESS": coordinator,
        "MEGASCALE_NUM_SLICES": str(len(names)),
        "MEGASCALE_SLICE_ID": str(names.index(slices[index])),
    }


def device_mesh(device_type: str, rows: list[list[int]]) -> Any:
    """The mesh over ``rows`` (:func:`layout`): 1-D over every rank for one slice, else 2-D (replicate over the
    slices, shard within one; dims :data:`MESH_DIMS`). Every rank calls it with the same rows."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    if len(rows) == 1:
        return DeviceMesh(device_type, torch.tensor(rows[0]))
    return DeviceMesh(device_type, torch.tensor(rows), mesh_dim_names=MESH_DIMS)


def gather_slices(name: str) -> list[str]:
    """Every rank's slice name, by rank, over the initialised process group (on a CPU group of its own where the
    default one is an accelerator's: object collectives go through the host)."""
    import torch.distributed as dist

    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, name, group=group)
    if group is not None:
        dist.destroy_process_group(group)
    return out


def describe(mesh: Any) -> str:
    """The mesh as the job log shows it: ``mesh (replicate=2, shard=2)``, or ``mesh (4,)`` for a 1-D one."""
    names = mesh.mesh_dim_names
    shape = tuple(mesh.mesh.shape)
    if names:
        return "mesh (" + ", ".join(f"{n}={s}" for n, s in zip(names, shape, strict=True)) + ")"
    return f"mesh {shape}"


# ---------------------------------------------------------------- the model, sharded


def dtypes(device_type: str, precision: str) -> tuple[str, str | None]:
    """(the dtype the weights and the optimizer's state are kept in, the dtype FSDP2 computes in; None: the weights')
    for ``train.precision``. On TPU "mixed" keeps float32 master weights and computes in bfloat16: an update of a
    small learning rate (2e-5 x a gradient) is below bfloat16's resolution for most weights (8 bits of mantissa: a
    weight near 1 moves in steps of 2^-7), so pure bfloat16 weights round most updates away; "bf16" is the tutorial's
    bfloat16 weights. On CPU float32 throughout."""
    if device_type == "cpu":
        return "float32", None
    return ("bfloat16", "bfloat16") if precision == "bf16" else ("float32", "bfloat16")


def parallelize(model: Any, mesh: Any, compute: str | None = None) -> Any:
    """FSDP2 in the layout of the GKE tutorial "Fine-tune models on multi-host TPUs with Ray and TorchTPU"
    (docs/tutorials.md) on TorchTPU: ``fully_shard`` on each decoder layer's MLP, then on the root (attention, norms and
    embeddings shard with it), the frozen per-layer embedding table in ``ignored_params`` (every rank keeps it whole and
    it never enters an all-gather or a reduce-scatter: in E2B it is ~2.3B of the ~5B parameters, and it gets no
    gradient). Kept rather than a group per whole decoder layer: on TorchTPU each FSDP group is a traced collective, and
    the MLP groups are the ones that tutorial runs to its reported losses and throughput; no measurement on TPU says
    another grouping is better. ``mesh``: 1-D (FSDP) or 2-D (HSDP, :func:`device_mesh`). Returns the sharded model;
    its frozen parameters no longer require a gradient (the optimizer takes the parameters that do)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainers.model import decoder_layers, frozen_params

    frozen = frozen_params(model)
    for param in frozen:
        param.requires_grad_(False)
        if compute:  # outside FSDP2, so not cast by its policy: kept in the compute dtype (it gets no update)
            param.data = param.data.to(getattr(torch, compute))
    mp = MixedPrecisionPolicy()
    if compute:  # the forward and backward in ``compute`` (see dtypes), gradients reduced in float32
        mp = MixedPrecisionPolicy(param_dtype=getattr(torch, compute), reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer.mlp, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp, ignored_params=frozen or None)
    return model


def shard_from_host(model: Any, mesh: Any, compute: str | None, device: Any) -> Any:
    """:func:`parallelize` of ``model``, built on the host, without it ever being whole on a device: its weights are
    kept on the host, the module goes to the meta device and is sharded there, each rank allocates its shards alone
    (``to_empty``), then copies its part of each weight in, moved in the narrower of its host and device dtypes (the
    frozen table narrowed to the compute dtype on the host; a weight held narrower on the host than its shard, widened
    on the device after sharding). As the FSDP2 docs' meta-device
    initialization (https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html: "the module can be on the
    meta device ... then ``to_empty``"), the weights from the host rather than an ``init_weights``; no collective,
    as each rank has the whole model on its host. Before, each rank moved the whole model to its device and sharded
    it there: Gemma 4 E2B in float32 is ~20 GB, 62% of a v6e chip's 32 GiB HBM. The frozen table
    (:func:`parallelize`) stays whole on every device, in the compute dtype, as before."""
    import torch

    weights = {name: p.detach() for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())  # non-persistent ones too (rotary frequencies): no state dict has them
    first: dict[int, str] = {}  # a tied weight (lm_head's, the embedding's) under each of its names: its first
    ties = {name: first.setdefault(id(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
    model.to("meta")  # a new parameter for each name: tied names are tied again below
    moved = dict(model.named_parameters(remove_duplicate=False))
    for name, tied_to in ties.items():
        if name != tied_to:
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, moved[tied_to])
    model = parallelize(model, mesh, compute)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            _fill(param, weights[name], name)
        for name, buf in model.named_buffers():
            _fill(buf, buffers[name], name)
    return model


def _fill(target: Any, source: Any, name: str) -> None:
    """Copy this rank's part of ``source`` (the whole tensor, on the host) into ``target``: a sharded parameter's
    local shard (FSDP2 shards dim 0 in ``torch.chunk``'s pieces, the last ones possibly empty) or a whole tensor."""
    from torch.distributed.tensor import DTensor

    local, part = target, source
    if isinstance(target, DTensor):
        local = target.to_local()
        for dim, placement in enumerate(target.placements):
            if placement.is_shard():
                pieces = part.chunk(target.device_mesh.size(dim), dim=placement.dim)
                index = target.device_mesh.get_local_rank(dim)
                part = pieces[index] if index < len(pieces) else part.narrow(placement.dim, 0, 0)
    if part.shape != local.shape:
        raise ValueError(f"{name}: this rank's part {tuple(part.shape)} does not fit its shard {tuple(local.shape)}")
    if part.element_size() > local.element_size():
        part = part.to(local.dtype)  # narrowed on the host, moved small
    local.copy_(part.to(local.device))  # widened, where it is, on the device


def train_step(model: Any, optimizer: Any, batch: dict[str, Any], device: Any) -> Any:
    """One optimizer step on this rank's batch; the loss, detached, on the device (nothing waits for the host).

    The loss is a mean over every rank's labelled tokens, as the held-out figure is (``trainers.heldout.loss``), not
    a mean of each rank's own means: this rank's summed token loss over the step's labelled tokens on all ranks
    (one all_reduce of the count, passed as ``num_items_in_batch``, as transformers' Trainer and TRL's SFTTrainer
    do: transformers loss/loss_utils.py ``ForCausalLMLoss``), times the world size, because FSDP averages the
    gradients over the ranks. A step whose batches hold no labelled token (every prompt fills ``train.max_length``)
    counts at least one: its loss and gradients are 0, not 0/0 = NaN."""
    import torch.distributed as dist

    batch = {k: v.to(device) for k, v in batch.items()}
    labelled = (batch["labels"][:, 1:] != -100).sum()  # the targets after the shift the loss makes
    world = 1
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(labelled, op=dist.ReduceOp.SUM)
        world = dist.get_world_size()
    loss = model(**batch, num_items_in_batch=labelled.clamp(min=1)).loss * world
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach().float()
