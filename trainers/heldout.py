"""Held-out loss of a model as a worker group holds it (sharded with FSDP2, on the training devices), and the key
that says which figures compare: one measurement, shared by the evaluation job (``trainers.evaluate``) and the end of
the train job (``trainers.fsdp``), which measures the model it has just trained, in the same worker group, sharded
and compiled as it is, with no reload (docs/architecture.md, "The gate").

A held-out loss is a mean over the target tokens of the held-out examples, tokenised for ``train.model_id`` and cut
to ``train.max_length``, computed in the weights' dtype on a kind of device: :func:`eval_key` is the digest of exactly
those, so two figures with one key were measured on the same token sequences the same way, and a figure once
measured for a model (a registered version) stands for every later run with the same key.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

from components.spec import RunSpec, protocol
from trainers import data
from trainers.devices import Worker


def eval_key(spec: RunSpec, examples: str, device_type: str, world: int) -> str:
    """``sha256:<hex>`` of what a held-out figure depends on besides the model: the examples (their digest,
    ``trainers.data.snapshot``), the tokenizer (``train.model_id``'s), ``train.max_length``, the prompt format the
    examples are written in (``trainers.data.PROMPT``), which tokens the loss is over (``trainers.data.LABELS``: a
    figure over the response alone never compares with one over the whole text),
    the dtypes the weights are kept and computed in on ``device_type`` (``trainers.mesh.dtypes``), and the worker
    group's size ``world``, which decides which examples share a batch and the order the sums are added in
    (:func:`shard_batches`, :func:`loss`), as MaxText's key holds its global eval batch
    (``trainers.maxtext_log.eval_key``)."""
    from trainers.mesh import dtypes

    t = spec.train
    what = {
        "examples": examples,
        "tokenizer": t.model_id,
        "max_length": t.max_length,
        "prompt": data.PROMPT,
        "labels": data.LABELS,
        "dtypes": list(dtypes(device_type, t.precision)),
        "device": device_type,
        "world": world,
    }
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def shard_batches(ds: data.Tokenized, rank: int, world: int, batch_size: int) -> list[dict[str, Any]]:
    """This worker's share of the split (examples ``rank, rank + world, ...``) in batches of one shape. Every worker
    runs the same number of forward passes (each one is a collective under FSDP): a worker with fewer examples
    pads with copies of the first example whose labels are masked, so they add neither loss nor tokens."""
    indices = list(range(rank, len(ds), world))
    num_batches = math.ceil(math.ceil(len(ds) / world) / batch_size)
    batches = []
    for b in range(num_batches):
        chunk = indices[b * batch_size : (b + 1) * batch_size]
        rows = ds[chunk + [0] * (batch_size - len(chunk))]
        rows["labels"][len(chunk) :] = -100
        batches.append(rows)
    return batches


def heldout_sums(model: Any, batches: list[dict[str, Any]], device: Any) -> Any:
    """(summed next-token loss, target tokens) over the batches, as one fp32 tensor on the device: nothing waits
    for the host until the caller's all_reduce."""
    import torch

    model.eval()
    sums = torch.zeros(2, dtype=torch.float32, device=device)
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.size(-1)),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            sums += torch.stack([loss, (targets != -100).sum().float()])
    return sums


def loss(model: Any, batches: list[dict[str, Any]], device: Any) -> float:
    """The held-out loss over every worker's batches: each worker's sums, then one all_reduce (a collective: every
    worker of the group calls it)."""
    import torch.distributed as dist

    sums = heldout_sums(model, batches, device)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    total: float
    count: float
    total, count = sums.tolist()
    return total / max(count, 1.0)


def examples(spec: RunSpec, config: dict[str, Any]) -> Any:
    """The held-out split's examples, from the files the job's ``config`` names (``data_files``, ``cache_dir``): the
    ones its loss is measured on (:class:`Split`) and its prompts are asked from (``trainers.generation``)."""
    return data.load_split(spec.train.dataset, data.splits(spec)[1], config.get("data_files"), config.get("cache_dir"))


class Split:
    """The held-out split as a worker reads it: the examples (``raw``), this worker's batches, and the key of every
    figure measured on them."""

    def __init__(self, spec: RunSpec, config: dict[str, Any], tokenizer: data.Tokenizer, worker: Worker) -> None:
        t = spec.train
        self.raw = examples(spec, config)
        tokenized = data.tokenize(self.raw, tokenizer, t.max_length)
        self.batches = shard_batches(tokenized, worker.rank, worker.world, t.batch_size)
        self.key = eval_key(spec, data.snapshot(self.raw), worker.device_type, worker.world)


class InJob:
    """The train job's own evaluation: the model it starts from (when that is ``train.model_id`` as built: a
    registered version's figure is the registry's, ``components.stages.gate.known_figure``) and the model it
    trained, each measured where it is. Rank 0 prints an ``eval`` event per figure (its seconds are evaluation in
    the goodput ledger); the trained model's figure also goes into the last epoch's metrics, which Ray Train keeps
    with that epoch's checkpoint, so the figure reaches the driver bound to the checkpoint it was measured on.
    ``testing.fail_eval`` leaves the measuring to the evaluation job, whose failure path it tests."""

    def __init__(self, spec: RunSpec, config: dict[str, Any], tokenizer: data.Tokenizer, worker: Worker) -> None:
        self.on = not spec.testing.fail_eval
        self.starts_from_model_id = not config.get("init_from")
        self.worker = worker
        self.split = Split(spec, config, tokenizer, worker) if self.on else None

    def measure(self, model: Any, which: str) -> dict[str, Any]:
        split = self.split
        assert split is not None
        started = time.perf_counter()
        figure = loss(model, split.batches, self.worker.device)
        seconds = time.perf_counter() - started
        found = {"eval_loss": figure, "eval_key": split.key, "num_eval_examples": len(split.raw)}
        if self.worker.rank == 0:
            event = {"event": "eval", "which": which, **found, "seconds": seconds, "time": time.time()}
            protocol.emit("event", event)
        return found

    def before(self, model: Any, resumed: bool) -> None:
        """The model as built, before the first step (a resumed group has trained it already: its first group
        measured it)."""
        if self.on and self.starts_from_model_id and not resumed:
            self.measure(model, "before")

    def after(self, model: Any) -> dict[str, Any]:
        """The trained model's figure, for the last epoch's metrics; nothing when the evaluation job measures it."""
        return self.measure(model, "after") if self.on else {}


def of_checkpoint(metrics: dict[str, Any] | None) -> dict[str, Any]:
    """The trained model's figure as the driver returns it: from the metrics Ray Train kept with the checkpoint the
    job returns, so only a figure measured on that checkpoint (the last epoch's; an earlier epoch's best checkpoint
    has none). Empty when there is none: the evaluation job measures it."""
    found = metrics or {}
    if "eval_loss" not in found:
        return {}
    return {
        "eval_loss_after": found["eval_loss"],
        "eval_key": found["eval_key"],
        "num_eval_examples": found["num_eval_examples"],
    }
