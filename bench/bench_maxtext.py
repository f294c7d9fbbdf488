"""MaxText throughput through tpupipe vs MaxText's own entry point, measured side by side in one run.

A: `tpupipe run --preset local-maxtext` (the pipeline: JaxTrainer workers on 2 emulated hosts, one JAX runtime
   of 2 processes x 2 CPU devices). B: MaxText's `train.main` with the same arguments, launched directly as the
   same 2 processes (jax.distributed on loopback), no Ray, no pipeline. Both: median tokens/s over the steps
   after the first three (compilation). The figure is the median A / B over several pairs run in alternating order
   (bench/figures.py ``alternated``), with each pair's ratio and the spread. Target: A / B >= 0.95.
"""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.figures import Figure, alternated, table
from components.workload import maxtext as maxtext_args
from components.workload import resolve

REPO = Path(__file__).resolve().parents[1]

SKIP_STEPS = 3


def steady(*runs: list[float]) -> float:
    return statistics.median([x for tokens_per_s in runs for x in tokens_per_s[SKIP_STEPS:]])


def through_tpupipe(root: Path, name: str = "bench-maxtext") -> list[float]:
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tpupipe"),
            "run",
            "--preset",
            "local-maxtext",
            "--run-id",
            name,
            "--output-root",
            str(root),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"tpupipe run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((root / name / "summary.json").read_text())
    return [row["tokens_per_s"] for row in summary["history"]]


def worker(rank: int, world: int, port: int, output_dir: str) -> None:
    """One MaxText process of the direct run (runs in the maxtext environment)."""
    spec = resolve("local-maxtext")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec.maxtext.cpu_devices_per_host}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from absl import logging as absl_logging

    from trainers.maxtext_train import base_yml, prepare_data

    args = maxtext_args.train_args(spec, output_dir, "bench-direct")
    if rank == 0:  # the data the arguments name (hf), written before rank 1 gets past initialize below
        prepare_data(spec, args, Path(output_dir))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=world, process_id=rank)
    absl_logging.set_verbosity(absl_logging.INFO if rank == 0 else absl_logging.WARNING)
    from absl import flags
    from maxtext.trainers.pre_train import train

    flags.FLAGS.mark_as_parsed()  # as MaxText's own entry point (absl's app.run) leaves them
    train.main(["train", base_yml(), *args])


def directly(root: Path, name: str) -> list[float]:
    from components.platforms.local import envs

    python = envs.ensure_env("maxtext", log=lambda _m: None).python
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [python, __file__, "--worker", str(rank), "2", str(port), str(root / name)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("direct MaxText run failed:\n" + outputs[0][-3000:] + outputs[1][-3000:])
    devices = resolve("local-maxtext").maxtext.cpu_devices_per_host * 2
    from trainers.maxtext_log import parse_step

    rows = [parse_step(line) for line in outputs[0].splitlines()]
    return [row["tokens_per_s_per_device"] * devices for row in rows if row]


def figures() -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        ratio, detail, pipeline, direct = alternated(
            lambda i: through_tpupipe(Path(tmp), f"bench-maxtext-{i}"),
            lambda i: directly(Path(tmp), f"direct-{i}"),
            steady,
        )
    detail |= {
        "A_tpupipe_tokens_per_s": round(steady(*pipeline)),
        "B_direct_tokens_per_s": round(steady(*direct)),
        "load_average_1m": os.getloadavg()[0],
    }
    return [Figure("MaxText tokens/s: through tpupipe / MaxText's own entry point", ratio, "x", ">= 0.95", detail)]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        rank, world, port, output_dir = sys.argv[2:6]
        worker(int(rank), int(world), int(port), output_dir)
    else:
        print(table(figures()))
