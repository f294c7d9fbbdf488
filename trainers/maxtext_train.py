"""MaxText pretraining through Ray Train's JaxTrainer, and MaxText's eval for evaluate: the workload of the GKE
tutorial "Train an LLM such as Llama 3 70B on GKE with MaxText, Ray Train and multislice Trillium TPUs"
(docs/tutorials.md).

``python -m trainers.maxtext_train train|eval --spec JSON --output-dir DIR --run-name NAME --scaling-config JSON
-- KEY=VALUE ...`` is the Ray job entrypoint (``components.workload.derive.job_command`` writes it). One JaxTrainer
worker per host calls MaxText's ``train.main`` with MaxText's own ``base.yml`` and exactly the ``KEY=VALUE``
arguments of the command line. On TPU, Ray's JAX backend forms the multi-host runtime;
on emulated CPU hosts it does not, so each worker gets XLA's host device count and the workers join one
``jax.distributed`` runtime (gloo collectives) here, so MaxText's mesh spans the processes as it spans the
hosts of a slice. Rank 0 turns MaxText's per-step log lines into ``TPUPIPE metric`` records.

Elastic runs (``train.min_workers`` < ``train.max_workers``): Ray Train starts each worker group with as many workers
as the cluster holds, within the range; MaxText builds its mesh from the group's devices (an axis of -1 fills in
what is left: the spec checks in ``components.workload.maxtext`` refuse a mesh that fits no group) and Orbax
restores the newest checkpoint onto that mesh's shardings, however many devices it has. The multislice environment
follows the group, not the pod: the worker pods carry no ``MEGASCALE_*`` (``components.platforms.gke.plan.manifests``
says why), and Ray's JAX backend sets ``MEGASCALE_COORDINATOR_ADDRESS``, ``MEGASCALE_NUM_SLICES`` and
``MEGASCALE_SLICE_ID`` on every worker of a new group that spans several slices, from that group's slices, before JAX
starts, and none on a group of one slice (ray 2.60.0, ``ray/train/v2/jax/config.py``: ``_JaxBackend.on_start`` and
``_setup_jax_distributed_environment``), so a group shrunk to the intact slices waits for no lost one and a group
shrunk to one slice starts as a single slice. On emulated CPU hosts no ``MEGASCALE_*`` is set at all and
MaxText makes one slice of every device whatever the cluster's slices (maxtext 0.2.5, ``maxtext/utils/max_utils.py``,
``get_num_slices``: hardware=cpu), so a shrink there changes only the device count.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from components.spec import RunSpec, datasets, protocol
from trainers import (
    checkpoints,
    committed,
    evaluate,
    heldout,
    jax_events,
    job_args,
    maxtext_data,
    maxtext_eval,
    maxtext_generation,
    maxtext_log,
)


def base_yml() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")


class _StepRecords(logging.Handler):
    """Rank 0: MaxText's output lines -> TPUPIPE records and a readable mesh line. MaxText logs its step and
    eval lines and prints its config and mesh, so the handler sees log records and, through
    :class:`_LineTee`, stdout lines. A step's loss is sent again at full precision once MaxText's metrics file has
    it (the line before it is rounded), and each step carries its tokens at the worker group's size then (the global
    batch: ``per_device_batch_size`` x ``max_target_length`` x the group's devices), so an elastic run's tokens seen
    add up whatever the groups' sizes."""

    def __init__(
        self, num_devices: int, tokens_per_step: float, metrics_file: str, in_job: maxtext_eval.InJobEval | None = None
    ):
        super().__init__(logging.INFO)
        self.num_devices, self.tokens_per_step = num_devices, tokens_per_step
        self.in_job = in_job
        self.last: dict[str, Any] = {}
        self.axes = maxtext_log.mesh_axes(Path(base_yml()).read_text())
        self.metrics = maxtext_log.MetricsFile(metrics_file)
        self.rounded: dict[int, dict[str, Any]] = {}  # steps sent with a rounded loss, by step
        self.jax = jax_events.JaxEvents(protocol.emit).register()

    def precise(self) -> None:
        """The losses MaxText's metrics file has by now: each rounded step's again, and the newest eval loss."""
        for rec in self.metrics.read():
            if maxtext_log.EVAL_LOSS in rec:
                self.last["eval_loss"] = rec[maxtext_log.EVAL_LOSS]
                if self.in_job:
                    self.in_job.finished(int(rec.get("step", -1)), rec[maxtext_log.EVAL_LOSS], precise=True)
            step = self.rounded.pop(int(rec.get("step", -1)), None)
            if step and maxtext_log.TRAIN_LOSS in rec:
                step["loss"] = rec[maxtext_log.TRAIN_LOSS]
                protocol.emit("metric", step)  # the same step and time: it replaces the rounded one

    def emit(self, record: logging.LogRecord) -> None:
        self.line(record.getMessage())

    def line(self, message: str) -> None:
        shape = maxtext_log.MESH_SHAPE_LINE.search(message)
        if shape and self.axes:
            sizes = [int(x) for x in shape["shape"].split(",") if x.strip()]
            used = " x ".join(f"{a} {n}" for a, n in zip(self.axes, sizes, strict=False) if n > 1) or "1 device"
            print(f"MaxText mesh: {shape['devices']} devices: {used}", flush=True)
            return
        step = maxtext_log.parse_step(message)
        if step:
            step["tokens_per_s"] = step["tokens_per_s_per_device"] * self.num_devices
            step["group"] = os.getpid()  # which worker group (attempt) ran it: rank 0's process
            step["time"] = time.time()  # when MaxText logged it: how soon training resumes after a lost host
            step["tokens"] = self.tokens_per_step
            self.last["train"] = self.rounded[step["step"]] = step
            protocol.emit("metric", step)
            self.precise()
            return
        match = maxtext_log.EVAL_START_LINE.search(message)
        if match and self.in_job:
            self.in_job.started(int(match["step"]))
            return
        match = maxtext_log.EVAL_LINE.search(message)
        if match:
            self.last["eval_loss"] = float(match["loss"])
            if self.in_job:
                self.in_job.finished(int(match["step"]), float(match["loss"]), precise=False)
            return
        match = maxtext_log.CHECKPOINT_LINE.search(message)
        if match:  # its seconds: how long the save blocked training, as Orbax measured it (trainers.jax_events)
            blocked = self.jax.take_blocked()
            save = {"event": "checkpoint", "step": int(match["step"]), "time": time.time()}
            protocol.emit("event", save if blocked is None else {**save, **blocked})


class _LineTee:
    """A stdout that also hands each complete line to ``on_line``; Orbax's background thread writes too."""

    def __init__(self, stream: TextIO, on_line: Callable[[str], None]) -> None:
        self.stream, self.on_line, self.pending = stream, on_line, ""
        self.lock = threading.RLock()

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(text)
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                self.on_line(line)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_arg = maxtext_log.arg
# The TPU flag MaxText's training runs with (maxtext 0.2.5, maxtext/trainers/pre_train/train.py, ``initialize``), for
# its ``unsafe_rbg`` PRNG: random bits drawn shard by shard (jax/random.py, "Automatic partitioning").
TPU_RNG_FLAG = "xla_tpu_spmd_rng_bit_generator_unsafe"


def _evaluates(argv: list[str]) -> bool:
    """Whether MaxText's eval loop runs in this job (``eval_interval`` > 0)."""
    return int(_arg(argv, "eval_interval") or -1) > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        port: int = s.getsockname()[1]  # (host, port) for an IPv4 socket
        return port


def rank_zero_records(argv: list[str], mode: str) -> tuple[_StepRecords, list[str]]:
    """Rank 0's reading of MaxText (its log records and stdout lines, its metrics file: :class:`_StepRecords`),
    installed before MaxText starts, and MaxText's arguments with rank 0's own metrics file. A train job's eval
    loop (``maxtext_eval.in_job_eval``) is recorded as the train job's own figures."""
    import jax
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.INFO)
    per_device, length = (float(_arg(argv, k) or 0) for k in ("per_device_batch_size", "max_target_length"))
    metrics_file = tempfile.mkstemp(prefix="maxtext-metrics-", suffix=".jsonl")[1]
    argv = [*argv, f"metrics_file={metrics_file}"]  # rank 0's own: every process writes the file it is given
    keyed = maxtext_log.eval_key(argv, jax.device_count(), jax.devices()[0].platform)
    in_job = maxtext_eval.InJobEval(argv, *keyed) if keyed and mode == "train" and _evaluates(argv) else None
    handler = _StepRecords(jax.device_count(), per_device * length * jax.device_count(), metrics_file, in_job)
    if keyed:
        handler.last.update(eval_key=keyed[0], num_eval_examples=keyed[1])
    logging.getLogger().addHandler(handler)  # absl's records propagate here, and MaxText's config logger's
    sys.stdout = _LineTee(sys.stdout, handler.line)
    print(
        f"jax runtime: {jax.process_count()} processes, {jax.device_count()} devices "
        f"({jax.local_device_count()} per process, {jax.devices()[0].platform})",
        flush=True,
    )
    return handler, argv


def final_metrics(handler: _StepRecords) -> dict[str, Any]:
    """Rank 0's figures once MaxText returned: the last step's loss and, from a train job's eval loop, the trained
    model's held-out figure with its key; from an evaluation run, its eval loss and key."""
    handler.precise()
    Path(handler.metrics.path).unlink(missing_ok=True)
    protocol.emit("event", handler.jax.summary())
    last = dict(handler.last)
    metrics = {
        k: v
        for k, v in {"loss": last.get("train", {}).get("loss"), "eval_loss": last.get("eval_loss")}.items()
        if v is not None
    }
    if handler.in_job:  # the train job's: the trained model's figure, measured on the final state
        metrics.pop("eval_loss", None)
        metrics.update(handler.in_job.close())
    elif "eval_key" in last:  # the evaluation job's: what its figure was measured on
        metrics.update(eval_key=last["eval_key"], num_eval_examples=last["num_eval_examples"])
    return metrics


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    from ray.train.collective import barrier, broadcast_from_rank_zero

    launched = time.time()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    cpu_devices = config["cpu_devices_per_host"]
    if cpu_devices:  # emulated hosts: fake CPU devices, set before JAX creates its backend
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cpu_devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    elif TPU_RNG_FLAG not in os.environ.get("LIBTPU_INIT_ARGS", ""):
        # MaxText's train.main adds it (maxtext/trainers/pre_train/train.py, initialize), but libtpu reads its
        # arguments once, when JAX creates its backend: before that, here, so every rank runs with it (rank 0 makes
        # its backend before train.main, to read MaxText's lines) and the answers' initialisation is training's.
        os.environ["LIBTPU_INIT_ARGS"] = f"{os.environ.get('LIBTPU_INIT_ARGS', '')} --{TPU_RNG_FLAG}=true".strip()
    import jax

    if cpu_devices:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # JAX writes a program to its persistent cache only if it compiled for at least 1 s (jax/_src/config.py,
        # jax_persistent_cache_min_compile_time_secs); a small model's programs compile faster on CPU, so emulated
        # hosts keep every one, as a slice keeps its long compiles
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        import ray.util

        address = broadcast_from_rank_zero(
            f"{ray.util.get_node_ip_address()}:{_free_port()}"  # type: ignore[no-untyped-call]  # Ray 2.60: unannotated
            if rank == 0
            else ""
        )
        jax.distributed.initialize(coordinator_address=address, num_processes=world, process_id=rank)
        jax.devices()  # every rank forms its backend now: each waits for all the others' (rank 0's, below, too)
    handler, argv = None, list(config["argv"])
    if rank == 0:
        handler, argv = rank_zero_records(argv, config.get("mode", "train"))
    else:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.WARNING)
    from absl import flags
    from maxtext.trainers.pre_train import train

    # MaxText's own entry point runs under absl's app.run, which parses absl's flags; called as a function it does
    # not, and Grain's data loader reads its flags (grain_enable_multiprocess_worker_profiling) on the first batch.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()

    restored = None
    if rank == 0:  # MaxText restores the newest committed checkpoint by itself: which one; saves cut short pruned
        restored = newest_checkpoint(config["argv"], prune=True)
    # Every rank learns which step the group restores (a barrier too: importing MaxText takes the ranks of busy CPU
    # hosts tens of seconds, and they finish it far apart, while gloo gives a late peer 30 s at MaxText's first
    # collective, then the group fails and restarts: they start together).
    restore_step = broadcast_from_rank_zero(int(restored.name) if restored else None)
    if rank == 0:
        protocol.emit(
            "event",
            {
                "event": "worker_group_started",
                "group": os.getpid(),
                "num_workers": world,  # an elastic run's group may be smaller than the first
                "launched": launched,
                "time": time.time(),
                "restore_step": restore_step,
            },
        )
    answers = [(which, params) for which, params in config.get("answers") or []]
    first, last = split_answers(answers, restore_step)
    if first:  # every rank: the engine's calls are collectives on the group's mesh
        answer(config, first, rank)
        barrier()  # the other ranks wait in Ray Train's barrier while rank 0 scores, not at MaxText's first collective
    if trained(argv, restore_step):
        print(
            f"MaxText: the restored checkpoint is step {restore_step}, the last of steps={_arg(argv, 'steps')}: "
            "training is done, not run again",
            flush=True,
        )
    else:
        # A training job's only (a notice changes nothing in the evaluation or compile job, which save nothing), and
        # only where JAX's distributed runtime is up: its preemption sync manager is what takes the notice (without
        # it MaxText's check answers no preemption, and a SIGTERM would end the worker as a failure)
        trains = config.get("mode", "train") == "train"
        noticed = preemption_notice_to_jax() if trains and watched() and jax.distributed.is_initialized() else []
        train.main(argv)
        if noticed:
            hold_after_preemption(rank, config["argv"], noticed[0])
    if last:
        answer(config, last, rank)
    metrics = final_metrics(handler) if handler else {}
    # Rank 0's figures reach the driver as Ray Train's result: a report with a (tiny) checkpoint from rank 0.
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:
            Path(tmp, "metrics.json").write_text(json.dumps(metrics))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)


# How often a worker reads whether Ray Train has marked it preempted: a read of its own actor's state, no collective.
PREEMPTION_READ_S = 0.5


def watched() -> bool:
    """Whether Ray Train runs its preemption watcher for this worker group (``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER``,
    on by default: ray/train/v2/_internal/constants.py in Ray 2.60; the local platform turns it on only where the spec
    schedules a drain, ``components.platforms.local.cluster.preemption_environment``)."""
    return os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1").lower() not in ("0", "false")


def preemption_notice_to_jax() -> list[Any]:
    """Hand Ray Train's preemption notice to JAX's, so MaxText saves on it (its ``enable_autocheckpoint``,
    ``train_args``). Ray Train's watcher marks every worker of a group whose node drains (``mark_preempt`` on each
    worker actor, which sets the worker's ``PreemptionContext``: ray/train/v2/_internal/execution/preemption.py, Ray
    2.60); ``ray.train.get_preemption_info`` reads it as a collective over the group, which MaxText's loop never
    calls, so a thread reads the worker's own mark instead. On it, the thread sends its process a SIGTERM: the
    notice JAX's preemption sync manager listens for (created by ``jax.distributed.initialize``; "By default, we use
    SIGTERM as the signal for preemption notice": ``reached_preemption_sync_point`` in
    jax/experimental/multihost_utils.py). JAX agrees a step past every process's current one through its
    coordination service; MaxText saves at that step, waits for the save, and stops training
    (maxtext/common/checkpointing.py in maxtext 0.2.5: ``reached_preemption``, ``_handle_post_checkpoint_preemption``
    raising ``StopTraining``, which ``train.main`` takes as a graceful end). The list returned holds Ray's
    ``PreemptionInfo`` once the notice is handed on."""
    import signal

    from ray.train.v2._internal.execution.context import get_train_context

    context = get_train_context()
    noticed: list[Any] = []

    def read() -> None:
        while context.preemption_context.preemption_info is None:
            time.sleep(PREEMPTION_READ_S)
        noticed.append(context.preemption_context.preemption_info)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=read, name="preemption-notice", daemon=True).start()
    return noticed


def hold_after_preemption(rank: int, argv: list[str], info: Any) -> None:
    """After MaxText's save on a preemption notice: say which checkpoint holds the group's state (rank 0), with how
    long before the drain's deadline it was committed, and train no further. Ray Train keeps a preempted group running
    until every rank has exited or the drain's deadline has passed, then starts a new one, which restores that
    checkpoint and trains on from the step after it; returning instead would end the training as a success at this
    step (``trainers.ray_checkpoints.Checkpointer._hold`` says the same of the FSDP trainer's). A group whose newest
    checkpoint is the last step's (JAX's agreed step fell past the end) trained to the end: it returns."""
    saved = newest_checkpoint(argv)
    step = int(saved.name) if saved else None
    if trained(argv, step):
        return
    if rank == 0:
        now = time.time()
        event = {
            "event": "preemption_checkpoint",
            "step": step,
            "preempted_ranks": list(info.preempted_ranks),
            "deadline_ms": info.deadline_ms,
            "before_deadline_s": round(info.deadline_ms / 1000 - now, 3) if info.deadline_ms else None,
            "time": now,
        }
        protocol.emit("event", event)
    while True:  # until Ray Train stops this worker group
        time.sleep(1.0)


def split_answers(
    answers: list[tuple[str, str]], restore_step: int | None
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The answers a worker group gives before training and after it: the model training starts from
    (``maxtext_generation.INITIAL``) before, on a group that restores no checkpoint of the run (one that does
    restore one went on from a group that answered it already), so training's own initialisation on training's own
    mesh makes its parameters (``maxtext_generation.initial_params``); every other after."""
    first = [a for a in answers if a[1] == maxtext_generation.INITIAL]
    return (first if restore_step is None else []), [a for a in answers if a[1] != maxtext_generation.INITIAL]


def trained(argv: list[str], restore_step: int | None) -> bool:
    """Whether the checkpoint the group restores is the run's last step (MaxText saves step ``s`` after ``s + 1``
    steps): MaxText's ``train.main`` would refuse to start ("Requested training up to step N...":
    ``maxtext/utils/train_utils.py``, ``validate_completed_steps``, which ``setup_train_loop`` calls on the step it
    restores), so a group that restarts after training (a failure while it answers) goes straight to the answers."""
    steps = _arg(argv, "steps")
    return restore_step is not None and bool(steps) and restore_step + 1 >= int(steps)


def answer(config: dict[str, Any], models: list[tuple[str, str]], rank: int) -> None:
    """``models``' answers to the job's evaluation prompts (``trainers.maxtext_generation.answer_models``) on this
    worker group, in the shape of the job's ``--decode``; every rank."""
    import gc

    spec = RunSpec.from_json(config["spec"])
    argv = config["argv"]
    held = examples(spec, Path(_arg(argv, "base_output_directory")))["heldout"][: spec.eval.generate_examples]
    gc.collect()  # what training left behind, before a model's parameters load
    maxtext_generation.answer_models(spec, argv, held, models, rank, config["decode"])
    gc.collect()  # the engine's and the parameters' arrays, before training or the next job's work


def fit(
    spec: RunSpec,
    scaling: dict[str, Any],
    args: list[str],
    output_dir: Path,
    run_name: str,
    max_failures: int,
    mode: str = "train",
    answers: tuple[tuple[str, str], ...] = (),
    decode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """MaxText's ``train.main`` with ``args`` on a Ray Train worker group, with ``answers`` to the evaluation prompts
    (which model, its parameters: ``trainers.maxtext_generation.answer_models``) on the same group, in the shape
    ``decode`` gives (the job's ``--decode``): the model training starts from before ``train.main``, on a group that
    restores no checkpoint (:func:`split_answers`), the others after it; a group that restores the last step trains
    no more (:func:`trained`)."""
    # Ray Train V2's classes, which ray.train exports at run time (Ray 2.60), imported from where they are defined:
    # ray.train's own names are V1's to a type checker, which does not run its choice of version
    from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    argv = ["train", base_yml(), *args]
    cpu = spec.maxtext.cpu_devices_per_host if spec.cluster.accelerator == "cpu" else 0
    trainer = JaxTrainer(
        train_loop_per_worker,
        train_loop_config={
            "argv": argv,
            "cpu_devices_per_host": cpu,
            "mode": mode,
            "spec": spec.to_json(),
            "answers": [list(a) for a in answers],
            "decode": decode,
        },
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(output_dir / "ray_results"),
            failure_config=FailureConfig(max_failures=max_failures),
        ),
    )
    print(f"JaxTrainer: {scaling}", flush=True)
    print("MaxText argv: " + " ".join(args), flush=True)
    return trainer.fit().metrics or {}


def latest_checkpoint(output_dir: Path, run_name: str, prune: bool = False) -> Path | None:
    """MaxText's newest committed (Orbax) checkpoint of the run, <output>/<run>/checkpoints/<step>: the one it
    restores (``trainers.committed.newest_orbax``); with ``prune`` (rank 0 at a worker group's start, before MaxText
    starts), each save cut short is reported and removed."""
    return committed.newest_orbax(output_dir / run_name / "checkpoints", prune)


def newest_checkpoint(argv: list[str], prune: bool = False) -> Path | None:
    """:func:`latest_checkpoint` of the run MaxText's arguments name (``base_output_directory``, ``run_name``); None
    when they name none."""
    output_dir, run_name = (_arg(argv, k) for k in ("base_output_directory", "run_name"))
    return latest_checkpoint(Path(output_dir), run_name, prune) if output_dir and run_name else None


def run_train(
    spec: RunSpec,
    scaling: dict[str, Any],
    args: list[str],
    output_dir: Path,
    run_name: str,
    decode: dict[str, Any] | None = None,
) -> dict[str, Any]:
    # MaxText resumes by itself from its newest checkpoint under <output>/<run name>/: one of another spec is refused
    checkpoints.mark_checkpoints(output_dir / run_name, checkpoints.training_digest(spec))
    metrics = fit(
        spec,
        scaling,
        [*args, *maxtext_eval.in_job_eval(spec, args)],
        output_dir,
        run_name,
        spec.train.max_failures,
        answers=train_answers(spec, args),
        decode=decode,
    )
    checkpoint = latest_checkpoint(output_dir, run_name)
    return {
        "checkpoint": str(checkpoint) if checkpoint else None,
        "final_metrics": metrics,
        "heldout": heldout.of_checkpoint(metrics),  # the trained model's figure, measured on its final state
        "device": "cpu" if spec.cluster.accelerator == "cpu" else "tpu",
        "backend": "jax",
        "num_workers": spec.total_hosts,
        "argv": args,
    }


def train_answers(spec: RunSpec, args: list[str]) -> tuple[tuple[str, str], ...]:
    """The train job's answers to the evaluation prompts (``eval.generate_examples`` > 0, on the ``hf`` data whose
    tokenizer reads them): the model training started from (its ``load_parameters_path``, else the parameters as
    MaxText's training initialises them: ``maxtext_generation.INITIAL``) and the trained model (the checkpoint the
    job ends with), as the FSDP trainer's ``before`` and ``after``."""
    if not spec.eval.generate_examples or _arg(args, "dataset_type") != "hf":
        return ()
    return (("before", maxtext_generation.INITIAL), ("after", maxtext_generation.LATEST))


def run_compile(
    spec: RunSpec, scaling: dict[str, Any], args: list[str], output_dir: Path, run_name: str
) -> dict[str, Any]:
    """The compile job: MaxText's train step on synthetic inputs of the run's shapes
    (``components.workload.maxtext.compile_args``), in fresh worker processes, writing JAX's persistent cache to
    ``jax_cache_dir``; what JAX compiled and loaded is its ``compile_cache`` event (``trainers.jax_events``). A train
    job that runs MaxText's eval loop (``maxtext_eval.in_job_eval``: ``dataset_type=hf``) compiles its eval step
    too, so the compile job runs the loop after its step, on synthetic eval batches (MaxText makes them when
    ``eval_interval`` > 0: maxtext/input_pipeline/input_pipeline_interface.py, ``create_data_iterator``). No retry: a
    failed compile job leaves the run to compile in its training job. Its result reports every entry it wrote to
    ``jax_cache_dir`` (name and sha256): the pipeline's side records only those (``cache_trust.record``)."""
    from components.spec.protocol import job_entries

    steps = int(_arg(args, "steps") or 1)
    evaluates = spec.maxtext.dataset_type == "hf"
    eval_args = maxtext_log.in_job_eval_args(steps, 1) if evaluates else []  # one batch: the same eval step
    fit(spec, scaling, [*args, *eval_args], output_dir, run_name, 0, mode="compile")
    entries = job_entries(Path(_arg(args, "jax_cache_dir"))) if _arg(args, "jax_cache_dir") else {}
    device = "cpu" if spec.cluster.accelerator == "cpu" else "tpu"
    return {"device": device, "backend": "jax", "argv": args, "entries": entries}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The driver's own options, and MaxText's ``KEY=VALUE`` arguments after ``--``."""
    cut = argv.index("--") if "--" in argv else len(argv)
    p = job_args.parser(
        "MaxText pretraining or evaluation through Ray Train's JaxTrainer. "
        "After --: the KEY=VALUE arguments MaxText's train.main gets after its base.yml.",
        "MaxText's base_output_directory",
        "MaxText's run_name (checkpoints go under it)",
    )
    p.add_argument("mode", choices=("train", "eval", "compile"))
    p.add_argument("--checkpoint", default="", help="eval: the checkpoint to evaluate")
    p.add_argument("--champion", default="", help="eval: the registered champion's checkpoint, measured too")
    evaluate.add_measure(p)
    evaluate.add_generate(p)
    p.add_argument(
        "--decode",
        type=json.loads,
        default=None,
        help="train, eval: the shape MaxText's engine answers in, as JSON (components.workload.maxtext.decode_shape)",
    )
    args = job_args.parse(p, argv[:cut])
    maxtext_args = argv[cut + 1 :]
    bad = [a for a in maxtext_args if "=" not in a]
    if bad:
        p.error(f"MaxText arguments are KEY=VALUE, got {bad[0]!r}")
    return args, maxtext_args


def examples(spec: RunSpec, output_dir: Path) -> dict[str, list[dict[str, str]]]:
    """The ``train`` and ``heldout`` examples: the run's data snapshot's (the train stage put them under
    ``output_dir/data``), else the generated dataset's."""
    t = spec.train
    if datasets.snapshotted(t.dataset):
        return maxtext_data.read_snapshot(output_dir / "data")
    from trainers import data

    return data.generate(t.num_train_examples, t.num_eval_examples, t.seed)


def prepare_data(spec: RunSpec, args: list[str], output_dir: Path) -> dict[str, Any] | None:
    """With ``dataset_type=hf``: the run's examples (its data snapshot's, under ``output_dir/data``, else the
    generated dataset's splits) and the tokenizer, written where MaxText's arguments point (``hf_train_files``,
    ``hf_eval_files``, ``tokenizer_path``), before any worker reads them."""
    if _arg(args, "dataset_type") != "hf":
        return None
    files = {"train": _arg(args, "hf_train_files"), "eval": _arg(args, "hf_eval_files")}
    counts = maxtext_data.write_splits(files["train"], files["eval"], examples(spec, output_dir))
    vocab = maxtext_data.write_tokenizer(_arg(args, "tokenizer_path"))
    print(
        f"MaxText data: {counts['train']} training examples in {files['train']}, {counts['heldout']} held-out "
        f"examples in {files['eval']}, a {vocab}-token character tokenizer",
        flush=True,
    )
    return {"files": files, "counts": counts}


def main(argv: list[str] | None = None) -> None:
    import ray

    args, maxtext_args = parse_args(sys.argv[1:] if argv is None else argv)
    spec, scaling = args.spec, args.scaling_config
    prepare_data(spec, maxtext_args, Path(args.output_dir))
    ray.init()
    out = Path(args.output_dir)
    try:
        if args.mode == "train":
            result = run_train(spec, scaling, maxtext_args, out, args.run_name, args.decode)
        elif args.mode == "compile":
            result = run_compile(spec, scaling, maxtext_args, out, args.run_name)
        else:
            result = maxtext_eval.run_eval(
                fit,
                spec,
                scaling,
                maxtext_args,
                out,
                args.run_name,
                args.checkpoint,
                args.champion,
                args.measure,
                args.generate,
                args.decode,
            )
    finally:
        ray.shutdown()
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
