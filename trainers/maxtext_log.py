"""What the MaxText driver reads from MaxText and the eval arguments it derives from the train job's own.

Pure standard library: the patterns of MaxText's log lines (per-step figures, the mesh, eval losses) and the
argument list of MaxText's eval loop, derived from the ``key=value`` train arguments the job command carries
(``components.workload.maxtext.train_args``), so the eval measures exactly the model that was trained.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

# A loss as MaxText formats it (``f"{loss:.3f}"``): digits, or nan/inf when training diverged.
_LOSS = r"(?P<loss>-?(?:[\d.]+|nan|inf))"
STEP_LINE = re.compile(
    r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.]+), TFLOP/s/device: (?P<tflops>[\d.]+), "
    r"Tokens/s/device: (?P<tokens>[\d.]+), total_weights: (?P<weights>\d+), loss: " + _LOSS
)
# The mesh's axis names, in order: base.yml's ``mesh_axes`` (the runs do not set it; MaxText's resolved config is not
# logged: components.workload.maxtext.QUIET_ARGS).
MESH_AXES_LINE = re.compile(r"^mesh_axes:\s*\[(?P<axes>[^\]]*)\]", re.MULTILINE)
MESH_SHAPE_LINE = re.compile(r"Num_devices: (?P<devices>\d+), shape \((?P<shape>[\d, ]+)\)")
EVAL_LINE = re.compile(r"Completed eval after train step (?P<step>\d+), loss=" + _LOSS)
EVAL_START_LINE = re.compile(r"Starting eval after train step (?P<step>\d+)")
# MaxText's metrics file (``metrics_file``, base.yml: "local file that stores scalar metrics"): one JSON object per
# written step, every scalar at full precision (``float``), train and eval alike (maxtext/common/metric_logger.py,
# ``write_metrics_locally`` and ``_prepare_metrics_for_json``); the log lines round the losses to 3 decimals.
TRAIN_LOSS, EVAL_LOSS = "learning/loss", "eval/avg_loss"
# MaxText's own words once a checkpoint is saved, or its asynchronous save started (maxtext/common/checkpointing.py,
# print_save_message).
CHECKPOINT_LINE = re.compile(
    r"(?:Saved a checkpoint at step|Started an asynchronous checkpoint save for step) (?P<step>\d+)"
)


def mesh_axes(base_yml: str) -> list[str]:
    """The mesh's axis names from the text of MaxText's ``base.yml``; empty where it has none."""
    found = MESH_AXES_LINE.search(base_yml)
    return [a.strip(" '\"") for a in found["axes"].split(",")] if found else []


# Train arguments the eval loop replaces: it runs one frozen step under its own run name.
_REPLACED_FOR_EVAL = ("steps=", "learning_rate=", "checkpoint_period=", "run_name=")


def eval_args(train_args: list[str], run_name: str, eval_steps: int, params_path: str) -> list[str]:
    """MaxText's own eval loop on its eval data (``hf_eval_files``, the held-out split, with ``dataset_type=hf``;
    with synthetic data the training batch itself), training frozen (learning rate 0, one
    step): of ``params_path`` (a checkpoint's ``items``), or of the untrained initialisation when empty."""
    args = [a for a in train_args if not a.startswith(_REPLACED_FOR_EVAL)]
    args += [
        f"run_name={run_name}",
        "steps=1",
        "learning_rate=0",
        "enable_checkpointing=false",
        "eval_interval=1",
        f"eval_steps={eval_steps}",
    ]
    if params_path:
        args.append(f"load_parameters_path={params_path}")
    return args


# MaxText's base.yml defaults of what an evaluation key names (maxtext 0.2.5, maxtext/configs/base.yml): the compute
# and weight dtypes, and the eval batch per device (0: the training one, per_device_batch_size).
_KEY_DEFAULTS = {"dtype": "bfloat16", "weight_dtype": "float32", "eval_per_device_batch_size": "0"}


def in_job_eval_args(steps: int, eval_steps: int) -> list[str]:
    """MaxText's own eval loop inside the train job, on the held-out split (``hf_eval_files``), once: after the last
    step, on the trained state the last checkpoint saves. MaxText evaluates after train step ``s`` when
    ``s >= eval_start_step`` and ``(s - eval_start_step) % eval_interval == 0`` (maxtext/trainers/pre_train/train.py,
    the step's ``ran_eval``). Once only: a second eval in one MaxText process reads other batches of its Hugging Face
    eval stream than the first (measured with maxtext 0.2.5: the eval after the last of 10 steps read 416 target
    tokens, the first eval and the evaluation job's 1650), so the model as initialised is the evaluation job's to
    measure."""
    return ["eval_interval=1", f"eval_start_step={steps - 1}", f"eval_steps={eval_steps}"]


def eval_which(argv: list[str], step: int) -> str | None:
    """Which model MaxText's eval after train ``step`` measured in a train job (:func:`in_job_eval_args`): ``after``
    (the trained model) after its last step; None for another step."""
    steps = int(arg(argv, "steps") or 0)
    return "after" if steps and step == steps - 1 else None


# The libraries whose versions a MaxText figure depends on: the model code and its numerics (maxtext), the tracer and
# compiler (jax, jaxlib) and the TPU runtime (libtpu; absent on a CPU-only environment).
FIGURE_LIBRARIES = ("jax", "jaxlib", "libtpu", "maxtext")


def library_versions() -> dict[str, str | None]:
    """The installed versions of :data:`FIGURE_LIBRARIES` (None for one not installed), from their distributions'
    metadata."""
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in FIGURE_LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def eval_key(
    argv: list[str], num_devices: int, platform: str, versions: dict[str, str | None] | None = None
) -> tuple[str, int] | None:
    """(``sha256:<hex>``, held-out examples) of what a MaxText held-out figure depends on besides the model, as
    ``trainers.heldout.eval_key`` for FSDP: the held-out file's bytes, the tokenizer's files, ``max_target_length``,
    the rows and batches MaxText's eval loop reads (its global eval batch: the per-device eval batch x the worker
    group's devices, so a figure of a group of another size is another key), the dtypes on the platform, and the
    versions of jax, jaxlib, libtpu and maxtext that compute it (``versions``, else :func:`library_versions`). None
    without held-out files (synthetic data: not held out)."""
    heldout = arg(argv, "hf_eval_files")
    if arg(argv, "dataset_type") != "hf" or not heldout or not Path(heldout).is_file():
        return None
    get = {k: arg(argv, k) or v for k, v in _KEY_DEFAULTS.items()}
    per_device = float(get["eval_per_device_batch_size"]) or float(arg(argv, "per_device_batch_size") or 0)
    tokenizer = Path(arg(argv, "tokenizer_path"))
    files = sorted(p for p in tokenizer.rglob("*") if p.is_file()) if tokenizer.is_dir() else []
    text = Path(heldout).read_bytes()
    what = {
        "examples": hashlib.sha256(text).hexdigest(),
        "tokenizer": {str(p.relative_to(tokenizer)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files},
        "max_length": int(arg(argv, "max_target_length") or 0),
        "eval_rows": per_device * num_devices,
        "eval_steps": int(arg(argv, "eval_steps") or 0),
        "dtypes": [get["weight_dtype"], get["dtype"]],
        "device": platform,
        "versions": library_versions() if versions is None else versions,
    }
    key = "sha256:" + hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    return key, sum(1 for line in text.splitlines() if line.strip())


def arg(argv: list[str], key: str) -> str:
    """The value of MaxText's ``KEY=VALUE`` argument ``key`` (the last one given), or ``""``."""
    return next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith(f"{key}=")), "")


class MetricsFile:
    """MaxText's metrics file as it grows: ``read`` returns the records written since the last read (a line not yet
    complete waits for the next). MaxText empties the file whenever it writes step 0 (``write_metrics_locally``
    truncates at step 0: the eval after train step 0 empties the train step's line), so a file whose start changed,
    or that is shorter than what was read, is read again from its start."""

    def __init__(self, path: str):
        self.path, self.offset, self.pending, self.head = path, 0, "", ""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, encoding="utf8") as f:
                head = f.read(HEAD_CHARS)
                size = f.seek(0, 2)
                if size < self.offset or head[: len(self.head)] != self.head:
                    self.offset, self.pending = 0, ""
                f.seek(self.offset)
                text = f.read()
                self.offset, self.head = f.tell(), head
        except FileNotFoundError:
            return []
        *lines, self.pending = (self.pending + text).split("\n")
        return [record for record in map(_record, lines) if record is not None]


HEAD_CHARS = 64  # the start of the file a read remembers, to see it emptied and written again


def _record(line: str) -> dict[str, Any] | None:
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:  # a line cut by the file emptied under the reader: its figures are lost, not the run
        return None


def parse_step(line: str) -> dict[str, Any] | None:
    """MaxText's per-step log line -> a metric record."""
    match = STEP_LINE.search(line)
    if not match:
        return None
    return {
        "step": int(match["step"]),
        "loss": float(match["loss"]),
        "step_s": float(match["seconds"]),
        "tflops_per_s_per_device": float(match["tflops"]),
        "tokens_per_s_per_device": float(match["tokens"]),
    }
