"""Answers to the evaluation prompts by greedy decoding, from a model as a worker group holds it (sharded with FSDP2,
on the training devices), scored by the task metrics (``trainers.metrics``) and written with the run: what a reviewer
reads beside the champion's (``eval.generate_examples``, ``eval.max_new_tokens``, ``eval.metrics``).

The prompts are the evaluation split's first ``eval.generate_examples`` examples in the training prompt's format
(``trainers.data.prompt_of``). Every batch has one shape: the prompts are cut to and left-padded to one
length (the longest of them, at most ``train.max_length``) and the batches to ``train.batch_size`` (the last filled
with copies of the first prompt, whose answers are dropped), so on a TPU the prefill compiles once; the decode steps
run with a static KV cache (``cache_implementation="static"``), which transformers compiles on an accelerator
(transformers 5.24, generation/utils.py, ``_valid_auto_compile_criteria``; its "LLM inference optimization" guide,
https://huggingface.co/docs/transformers/llm_optims#static-kv-cache-and-torchcompile).

Each worker answers its share (prompts ``rank, rank + world, ...``); under FSDP every forward is a collective, so the
workers decode in step with ``synced_gpus=True``: a worker whose answers ended keeps running forward passes until every
worker's have. transformers turns that on by itself only for a model its own FSDP helper sharded
(``is_fsdp_managed_module`` reads an attribute ``fully_shard`` does not set: transformers/distributed/fsdp.py), so it
is passed. The answers' tokens meet on every worker in one all_gather of one shape.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol
from trainers import data, heldout, metrics
from trainers.devices import Worker

ANSWERS_DIR = "eval"  # under the job's output directory: answers-<which>.jsonl


def generation_key(eval_key: str, spec: RunSpec) -> str:
    """``sha256:<hex>`` of what a model's scored answers depend on besides the model: the evaluation key (examples,
    tokenizer, lengths, dtypes, device, worker group: ``trainers.heldout.eval_key``), the number of prompts, the
    answers' length, the prompt's format, the batch (one padded shape), the decoding (greedy), and what scores them:
    the task metrics and the team's scorer with the digest of its whole package (``trainers.metrics.resolve_scorer``:
    every Python file of the package its module is in, so a helper it imports changes the key too; its name alone
    would not change with its code). A champion's answers recorded with the same key, under the same image and
    accelerator (``components.stages.answers.answers_key``), are its scored answers to this run's prompts."""
    e = spec.eval
    what = {
        "eval_key": eval_key,
        "examples": e.generate_examples,
        "max_new_tokens": e.max_new_tokens,
        "prompt": data.PROMPT,
        "batch_size": spec.train.batch_size,
        "decoding": "greedy",
        "metrics": sorted(e.metric_names),  # a set: the same metrics listed in another order score alike
        "scorer": e.scorer,
        "scorer_package": metrics.resolve_scorer(e.scorer).digest if e.scorer else "",
    }
    return "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def encode(tokenizer: data.Tokenizer, prompts: list[str], max_length: int) -> tuple[Any, Any]:
    """(input ids, attention mask) of the prompts, each as training's prefix (``trainers.data.prompt_ids``: the
    tokenizer's beginning token, no end one), cut to its last ``max_length`` tokens and left-padded to the longest."""
    import torch

    rows = [ids[-max_length:] for ids in data.prompt_ids(tokenizer, prompts)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[i, width - len(row) :] = 1
    return ids, mask


def decode(tokenizer: data.Tokenizer, tokens: list[int]) -> str:
    """An answer's text: its tokens up to the first end-of-sequence (or padding), without special tokens."""
    stop = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    cut = next((i for i, t in enumerate(tokens) if t in stop), len(tokens))
    return tokenizer.decode(tokens[:cut], skip_special_tokens=True).strip()


def answer(
    model: Any, tokenizer: data.Tokenizer, prompts: list[str], spec: RunSpec, device: Any, rank: int, world: int
) -> list[str]:
    """Every prompt's answer, in order, on every worker (a collective: every worker calls it with the same prompts)."""
    import torch
    import torch.distributed as dist

    t, e = spec.train, spec.eval
    ids, mask = encode(tokenizer, prompts, t.max_length)
    mine = list(range(rank, len(prompts), world))
    num_batches = math.ceil(math.ceil(len(prompts) / world) / t.batch_size)
    rows = (mine + [0] * (num_batches * t.batch_size))[: num_batches * t.batch_size]
    out = torch.full((len(rows), e.max_new_tokens), tokenizer.pad_token_id, dtype=torch.int32, device=device)
    model.eval()
    width = ids.shape[1]
    with torch.no_grad():
        for b in range(num_batches):
            pick = rows[b * t.batch_size : (b + 1) * t.batch_size]
            made = model.generate(
                input_ids=ids[pick].to(device),
                attention_mask=mask[pick].to(device),
                max_new_tokens=e.max_new_tokens,
                do_sample=False,
                num_beams=1,
                use_cache=True,
                cache_implementation="static",
                synced_gpus=world > 1,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )[:, width:]
            out[b * t.batch_size : (b + 1) * t.batch_size, : made.shape[1]] = made.to(torch.int32)
    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out)
    answers = [""] * len(prompts)
    for r, tokens in enumerate(gathered):
        for row, index in zip(tokens.cpu().tolist(), range(r, len(prompts), world), strict=False):
            answers[index] = decode(tokenizer, row)
    return answers


@dataclasses.dataclass(frozen=True)
class Answered:
    """A model's answers, not yet scored: ``which`` model, the answers in the prompts' order, the seconds answering
    took."""

    which: str
    answers: list[str]
    seconds: float


class Answering:
    """A job's answers to the evaluation prompts, model after model: each model's answers scored and, on rank 0,
    written to ``<output dir>/eval/answers-<which>.jsonl`` (index, prompt, reference, answer, each metric's score) with
    an ``answers`` event (the file, each metric's mean, the generation key, the seconds, where the scorer resolved).
    Off when ``eval.generate_examples`` is 0.

    A model's answers may be kept to be scored later (:meth:`kept`, then :meth:`score_kept`): the FSDP trainer has the
    model as built answer before training, the only time it can, and scores those answers after training with the
    trained model's, so a team's slow scorer holds no rank in a collective while rank 0 scores (every rank is past
    training's last collective by then). The answers wait in ``<output dir>/eval/answered-<which>.json``, which a
    worker group restarted during training reads back."""

    def __init__(self, spec: RunSpec, config: dict[str, Any], tokenizer: data.Tokenizer, worker: Worker) -> None:
        self.spec, self.tokenizer, self.worker = spec, tokenizer, worker
        self.on = bool(spec.eval.generate_examples) and bool(config.get("output_dir"))
        self.directory = Path(config.get("output_dir") or ".") / ANSWERS_DIR
        self.examples: list[dict[str, Any]] = []
        self.key = ""
        self.scorer: dict[str, str] | None = None
        if self.on:
            raw = list(heldout.examples(spec, config))
            self.examples = [dict(e) for e in raw[: spec.eval.generate_examples]]
            # on every worker, before any answer: a scorer that is not the image's own or cannot load fails the job
            # at once, naming eval.scorer (trainers.metrics.resolve_scorer)
            examples_key = heldout.eval_key(spec, data.snapshot(raw), worker.device_type, worker.world)
            self.key = generation_key(examples_key, spec)
            if spec.eval.scorer:
                metrics.load_scorer(spec.eval.scorer)
                self.scorer = dataclasses.asdict(metrics.resolve_scorer(spec.eval.scorer))

    def answer(self, model: Any, which: str) -> Answered | None:
        """``which``'s answers, on rank 0 (a collective: every worker calls it); None on the others and when off."""
        if not self.on:
            return None
        started = time.perf_counter()
        prompts = [data.prompt_of(e) for e in self.examples]
        w = self.worker
        answers = answer(model, self.tokenizer, prompts, self.spec, w.device, w.rank, w.world)
        return Answered(which, answers, time.perf_counter() - started) if w.rank == 0 else None

    def __call__(self, model: Any, which: str) -> dict[str, Any]:
        """``which``'s answers, scored; rank 0 writes them and emits the event. Nothing when off."""
        started = time.perf_counter()
        made = self.answer(model, which)
        return self.score(made, started) if made else {}

    def score(self, made: Answered, started: float) -> dict[str, Any]:
        """``made`` scored, written and its ``answers`` event emitted (its seconds: since ``started``)."""
        spec, examples, directory = self.spec, self.examples, self.directory
        return record(spec, examples, made.answers, made.which, directory, self.key, started, self.scorer)

    def kept(self, model: Any, which: str) -> None:
        """``which``'s answers made now and kept to be scored later (:meth:`score_kept`); rank 0 writes them with an
        ``answered`` event (their seconds: the job's evaluation in the goodput ledger)."""
        made = self.answer(model, which)
        if made is None:
            return
        path = self.directory / f"answered-{which}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(dataclasses.asdict(made)), encoding="utf-8")
        partial.replace(path)
        protocol.emit("event", {"event": "answered", "which": which, "seconds": made.seconds, "time": time.time()})

    def score_kept(self, which: str) -> dict[str, Any]:
        """The answers :meth:`kept` made, scored and recorded now (rank 0; nothing elsewhere or when none were kept):
        the ``answers`` event's seconds are the scoring's, the answering's were the ``answered`` event's."""
        path = self.directory / f"answered-{which}.json"
        if not self.on or self.worker.rank != 0 or not path.is_file():
            return {}
        started = time.perf_counter()
        found = self.score(Answered(**json.loads(path.read_text(encoding="utf-8"))), started)
        path.unlink()
        return found


def record(
    spec: RunSpec,
    examples: list[dict[str, Any]],
    answers: list[str],
    which: str,
    directory: Path,
    key: str,
    started: float,
    scorer: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``which``'s answers to ``examples``' prompts, scored by the task metrics, written to
    ``directory/answers-<which>.jsonl`` (:func:`write`) with an ``answers`` event (the file, each metric's mean, the
    generation ``key``, the seconds since ``started``, where the team's scorer resolved: ``scorer``, its module, file
    and package digest, ``trainers.metrics.Scorer``): one writer and one format for both trainers (the FSDP
    trainer's :class:`Answering`, MaxText's ``trainers.maxtext_generation``), which the evaluate stage reads alike
    (``components.stages.answers``). Rank 0's, once every worker's answers met."""
    prompts = [data.prompt_of(e) for e in examples]
    references = [str(e["response"]) for e in examples]
    scored_examples = [metrics.Example(*row) for row in zip(prompts, references, answers, strict=True)]
    scored = metrics.scores(spec.eval.metric_names, scored_examples, spec.eval.scorer)
    path = write(directory / f"answers-{which}.jsonl", scored_examples, scored)
    found = {
        "which": which,
        "path": str(path),
        "means": metrics.means(scored),
        "generation_key": key,
        "num_examples": len(scored_examples),
        "seconds": time.perf_counter() - started,  # answering and scoring: the ledger's evaluation
    }
    if spec.eval.scorer:
        found["scorer"] = scorer or dataclasses.asdict(metrics.resolve_scorer(spec.eval.scorer))
    protocol.emit("event", {"event": "answers", **found, "time": time.time()})
    return found


def write(path: Path, examples: list[metrics.Example], scored: dict[str, list[float]]) -> Path:
    """The answers as JSON lines, written whole under another name and renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, e in enumerate(examples):
        row = {"index": i, "prompt": e.prompt, "reference": e.reference, "answer": e.answer}
        rows.append({**row, "scores": {name: values[i] for name, values in scored.items()}})
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    partial.replace(path)
    return path
