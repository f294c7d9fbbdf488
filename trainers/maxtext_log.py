"""What the MaxText driver reads from MaxText and the eval arguments it derives from the train job's own.

Pure standard library: the patterns of MaxText's log lines (per-step figures, the mesh, eval losses) and the
argument list of MaxText's eval loop, derived from the ``key=value`` train arguments the job command carries
(``components.workload.maxtext.train_args``), so the eval measures exactly the model that was trained.
"""

from __future__ import annotations

import json
import re

# A loss as MaxText formats it (``f"{loss:.3f}"``): digits, or nan/inf when training diverged.
_LOSS = r"(?P<loss>-?(?:[\d.]+|nan|inf))"
STEP_LINE = re.compile(
    r"completed step: (?P<step>\d+), seconds: (?P<seconds>[\d.]+), TFLOP/s/device: (?P<tflops>[\d.]+), "
    r"Tokens/s/device: (?P<tokens>[\d.]+), total_weights: (?P<weights>\d+), loss: " + _LOSS
)
MESH_AXES_LINE = re.compile(r"Config param mesh_axes: \[(?P<axes>[^\]]*)\]")
MESH_SHAPE_LINE = re.compile(r"Num_devices: (?P<devices>\d+), shape \((?P<shape>[\d, ]+)\)")
EVAL_LINE = re.compile(r"Completed eval after train step (?P<step>\d+), loss=" + _LOSS)
# MaxText's metrics file (``metrics_file``, base.yml: "local file that stores scalar metrics"): one JSON object per
# written step, every scalar at full precision (``float``), train and eval alike (maxtext/common/metric_logger.py,
# ``write_metrics_locally`` and ``_prepare_metrics_for_json``); the log lines round the losses to 3 decimals.
TRAIN_LOSS, EVAL_LOSS = "learning/loss", "eval/avg_loss"
# MaxText's own words once a checkpoint is saved, or its asynchronous save started (maxtext/common/checkpointing.py,
# print_save_message).
CHECKPOINT_LINE = re.compile(
    r"(?:Saved a checkpoint at step|Started an asynchronous checkpoint save for step) (?P<step>\d+)"
)

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


class MetricsFile:
    """MaxText's metrics file as it grows: ``read`` returns the records written since the last read (a line not yet
    complete waits for the next). MaxText empties the file whenever it writes step 0 (``write_metrics_locally``
    truncates at step 0: the eval after train step 0 empties the train step's line), so a file whose start changed,
    or that is shorter than what was read, is read again from its start."""

    def __init__(self, path: str):
        self.path, self.offset, self.pending, self.head = path, 0, "", ""

    def read(self) -> list[dict]:
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


def _record(line: str) -> dict | None:
    try:
        return json.loads(line) if line.strip() else None
    except json.JSONDecodeError:  # a line cut by the file emptied under the reader: its figures are lost, not the run
        return None


def parse_step(line: str) -> dict | None:
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
