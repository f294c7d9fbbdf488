"""MaxText's held-out figures: its own eval loop inside the train job (the model it trained, measured where it is,
on the state the last checkpoint saves: :class:`InJobEval`) and the evaluation job's (:func:`run_eval`), which
measures only what the evaluate stage does not have yet (the model as initialised, a champion), each figure with
its evaluation key
(``trainers.maxtext_log.eval_key``), as ``trainers.heldout`` for the FSDP trainer (docs/architecture.md,
"The gate")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.spec import RunSpec, datasets, protocol
from trainers import evaluate, maxtext_log

_arg = maxtext_log.arg


class InJobEval:
    """Rank 0's record of MaxText's eval loop inside the train job (``maxtext_log.in_job_eval_args``): each eval's
    seconds (from MaxText's "Starting eval" line to its "Completed eval" line) and loss at full precision (MaxText's
    metrics file; its line rounds it), sent as an ``eval`` event of the model it measured (``after``) with the
    evaluation key, as ``trainers.heldout.InJob`` sends the FSDP trainer's: evaluation seconds in the goodput
    ledger, and the figures the evaluate stage reads instead of measuring them again."""

    def __init__(self, argv: list[str], key: str, num_examples: int):
        self.argv, self.key, self.num_examples = argv, key, num_examples
        self.begun: dict[int, float] = {}
        self.found: dict[int, dict[str, Any]] = {}  # by train step: the eval's figure, not yet sent
        self.sent: dict[str, dict[str, Any]] = {}  # by model: the figure sent

    def started(self, step: int) -> None:
        self.begun[step] = time.time()

    def finished(self, step: int, loss: float, precise: bool) -> None:
        which = maxtext_log.eval_which(self.argv, step)
        if which is None or which in self.sent:
            return
        now = time.time()
        found = self.found.setdefault(step, {"seconds": now - self.begun.get(step, now), "time": now})
        found["eval_loss"] = loss
        if precise:
            self.send(step)

    def send(self, step: int) -> None:
        which = maxtext_log.eval_which(self.argv, step)
        found = self.found.pop(step, None)
        if which is None or found is None:
            return
        figure = {"eval_loss": found["eval_loss"], "eval_key": self.key, "num_eval_examples": self.num_examples}
        self.sent[which] = figure
        protocol.emit(
            "event", {"event": "eval", "which": which, **figure, "seconds": found["seconds"], "time": found["time"]}
        )

    def close(self) -> dict[str, Any]:
        """Sends what is left (a figure whose precise loss never came: its line's), and returns the trained model's
        figure, for the train job's final report (empty when MaxText measured none)."""
        for step in list(self.found):
            self.send(step)
        return self.sent.get("after", {})


def in_job_eval(spec: RunSpec, args: list[str]) -> list[str]:
    """MaxText's eval loop in the train job (``maxtext_log.in_job_eval_args``), on the held-out split of
    ``dataset_type=hf``; none with synthetic data (its eval batch is the training batch: ``gate.not_held_out``)."""
    if _arg(args, "dataset_type") != "hf":
        return []
    return maxtext_log.in_job_eval_args(spec.maxtext.steps, spec.maxtext.eval_steps)


def run_eval(
    fit: Callable[..., dict[str, Any]],
    spec: RunSpec,
    scaling: dict[str, Any],
    args: list[str],
    output_dir: Path,
    run_name: str,
    checkpoint: str,
    champion: str = "",
    measure: tuple[str, ...] = evaluate.MODELS,
    generate: tuple[str, ...] = (),
    decode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """MaxText's eval loop on the untrained model, the trained checkpoint and, when given, the registered champion's
    checkpoint (those ``measure`` names): the same batches for each, each model a worker group of its own (``fit``:
    the driver's, ``trainers.maxtext_train.fit``); those ``generate`` names then answer the evaluation prompts in
    their group (``trainers.maxtext_generation``, in the shape ``decode`` gives), as the FSDP evaluation job's
    (``trainers.evaluate``)."""

    models = [("before", ""), ("after", str(Path(checkpoint) / "items"))]
    if champion:
        models.append(("champion", str(Path(champion) / "items")))
    models = [(which, params) for which, params in models if which in measure]
    losses: dict[str, Any] = {}
    keys: set[str | None] = set()
    for index, (which, params) in enumerate(models):
        name = f"{run_name}-eval-{which}"
        eval_args = maxtext_log.eval_args(args, name, spec.maxtext.eval_steps, params)
        answers = ((which, params),) if which in generate and spec.eval.generate_examples else ()
        found = fit(spec, scaling, eval_args, output_dir, name, 0, mode="eval", answers=answers, decode=decode)
        if "eval_loss" not in found:  # its eval line gave no number (a NaN loss prints none the pattern reads)
            raise SystemExit(f"MaxText's eval of the {which} model logged no finite loss: see its log above")
        losses[f"eval_loss_{which}"] = found["eval_loss"]
        keys.add(found.get("eval_key"))
        losses.setdefault("num_eval_examples", found.get("num_eval_examples"))
        evaluate.eval_progress(which, index, len(models), spec.maxtext.eval_steps)
    if len(keys) == 1 and None not in keys:  # every model read the same rows (one group size): one key
        losses["eval_key"] = keys.pop()
    return evaluate.measured({k: v for k, v in losses.items() if v is not None}, eval_split(spec, args))


def eval_split(spec: RunSpec, args: list[str]) -> str:
    """What MaxText's eval loop read, in words."""
    batches = f"{spec.maxtext.eval_steps} batches"
    if _arg(args, "dataset_type") == "hf" and datasets.snapshotted(spec.train.dataset):
        return f"the run's data snapshot's held-out examples ({_arg(args, 'hf_eval_files')}): at most {batches}"
    if _arg(args, "dataset_type") == "hf":
        return (
            f"the generated dataset's held-out split ({spec.train.num_eval_examples} examples, "
            f"{_arg(args, 'hf_eval_files')}; none of its instructions is in the {spec.train.num_train_examples} "
            f"training examples): at most {batches}"
        )
    return f"{spec.maxtext.dataset_type} ({batches}): the training batch, not held out"
