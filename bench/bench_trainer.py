"""Trainer efficiency: the pipeline's FSDP2 train stage against the same fine-tune written by hand for torchrun,
side by side in one run.

A: `tpupipe run --preset local-fsdp` (Ray Train's TorchTrainer, one worker per emulated host, gloo on CPU); its
   tokens/s per epoch from the run's summary.json.
B: `bench/fsdp_by_hand.py` under `python -m torch.distributed.run --standalone`: as many processes as A has train
   workers, each with the threads Ray gives a worker (OMP_NUM_THREADS = its CPUs), the same model from the same
   config and seed, the same generated data, batch size, sequence length, optimizer and layout of `fully_shard`.
Both count tokens as `trainers/fsdp.py` does (every rank's padded tokens over the epoch's wall time) and are taken
at their steady state: the median over the epochs after each run's first. A and B are measured in alternated pairs
(A B, B A, ...: ``bench.figures.alternated``, TPUPIPE_BENCH_PAIRS of them), so a change in what else the machine runs
meanwhile favours neither side; the figure is the median of the pairs' ratios, with their spread. The per-epoch
losses of the two must agree, or the sides did not do the same work and the bench fails. Target: A / B >= 0.97.

C, reported beside them: B again while an idle local cluster of A's shape runs (the head and its hosts, their
raylets, agents, log monitors and keeper, started by the local platform's own provision and stopped by its
teardown), alternated with B: what the cluster's presence on this machine's cores costs the same loop, apart from
what Ray Train and the trainer add.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.figures import Figure, alternated, table
from components.platforms import RunContext
from components.platforms.local.platform import LocalPlatform
from components.platforms.store import LocalStore
from components.workload import resolve
from trainers import data

REPO = Path(__file__).resolve().parents[1]

PRESET = "local-fsdp"
# More epochs than the preset's 4, so the steady state is a median of several; fewer held-out examples and no answers
# before and after training, since the evaluation is not measured here.
OVERRIDES = "cluster.slice_check=false train.epochs=8 train.num_eval_examples=16 eval.generate_examples=0"
TARGET = ">= 0.97"
RUN_TIMEOUT_S = 1800
LOSS_RTOL = 1e-3  # the same work gives the same losses, up to the order of floating-point sums


def steady(*runs: list[dict]) -> float:
    """The median tokens/s over each run's epochs after its first (the first pays for warm-up)."""
    return statistics.median(row["tokens_per_s"] for rows in runs for row in rows[1:])


def steady_of(run: tuple) -> float:
    """A run's steady tokens/s (its per-epoch rows come first)."""
    return steady(run[0])


def through_pipeline(root: Path, pair: int = 0) -> tuple[list[dict], float]:
    """A: the pipeline's per-epoch rows and the run's wall time."""
    run_id = f"bench-trainer-{pair}"
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "tpupipe"),
            "run",
            "--preset",
            PRESET,
            "--set",
            OVERRIDES,
            "--run-id",
            run_id,
            "--output-root",
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"tpupipe run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    summary = json.loads((root / run_id / "summary.json").read_text())
    return summary["history"], seconds


def by_hand(root: Path, spec) -> tuple[list[dict], float, int, int]:
    """B: the hand-written loop's per-epoch rows, its wall time, its processes and threads per process."""
    from components.platforms.local import envs

    t, c = spec.train, spec.cluster
    data.write_generated(root / "by-hand", t.num_train_examples, t.num_eval_examples, t.seed)
    processes, threads = spec.num_workers, max(int(c.cpus_per_host), 1)
    python = envs.ensure_env("torch", log=lambda _m: None).python
    cmd = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        str(REPO / "bench" / "fsdp_by_hand.py"),
        "--data-dir",
        str(root / "by-hand"),
        "--model-id",
        t.model_id,
        "--max-length",
        str(t.max_length),
        "--batch-size",
        str(t.batch_size),
        "--epochs",
        str(t.epochs),
        "--lr",
        str(t.learning_rate),
        "--weight-decay",
        str(t.weight_decay),
        "--seed",
        str(t.seed),
        "--threads",
        str(threads),
    ]
    # The environment of the local platform's Ray workers: their threads (Ray sets OMP_NUM_THREADS to a worker's
    # CPUs) and no autoload of the torch image's torch_tpu (the hosts are CPU).
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, cwd=REPO)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"torchrun by hand failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [
        json.loads(line.removeprefix("by-hand ")) for line in proc.stdout.splitlines() if line.startswith("by-hand ")
    ]
    return rows, seconds, processes, threads


def beside_idle_cluster(root: Path, spec) -> tuple[float, dict]:
    """C / B: the hand-written loop beside an idle local cluster of ``spec``'s shape, alternated with it alone."""
    ctx = RunContext(spec=spec, run_id="bench-trainer-idle", store=LocalStore(root / "idle"), platform="local")
    platform = LocalPlatform(log=lambda _m: None)
    up: list[bool] = []

    def beside(_i: int) -> tuple[list[dict], float, int, int]:
        if not up:
            platform.provision(ctx)
            platform.deploy_raycluster(ctx)
            up.append(True)
        return by_hand(root, spec)

    def alone(_i: int) -> tuple[list[dict], float, int, int]:
        if up:
            platform.teardown(ctx)
            up.clear()
        return by_hand(root, spec)

    try:
        ratio, detail, _, _ = alternated(beside, alone, steady_of)
        return ratio, detail
    finally:
        platform.teardown(ctx)


def same_work(a: list[dict], b: list[dict]) -> None:
    """The two sides trained the same model on the same batches: their per-epoch losses agree."""
    la, lb = [row["loss"] for row in a], [row["loss"] for row in b]
    if len(la) != len(lb) or any(abs(x - y) > LOSS_RTOL * abs(y) for x, y in zip(la, lb, strict=True)):
        raise SystemExit(f"the two sides did not do the same work: losses {la} (pipeline) vs {lb} (by hand)")


def figures() -> list[Figure]:
    spec = resolve(PRESET, OVERRIDES)
    with tempfile.TemporaryDirectory(prefix="tpupipe-bench-") as tmp:
        root = Path(tmp)
        ratio, pairs, a_runs, b_runs = alternated(
            lambda i: through_pipeline(root, i),
            lambda i: by_hand(root, spec),
            steady_of,
        )
        beside_ratio, beside = beside_idle_cluster(root, spec)
    for a_run, b_run in zip(a_runs, b_runs, strict=True):
        same_work(a_run[0], b_run[0])
    a = statistics.median(map(steady_of, a_runs))
    b = statistics.median(map(steady_of, b_runs))
    t = spec.train
    detail = {
        **pairs,
        "pipeline_tokens_per_s": round(a),
        "by_hand_tokens_per_s": round(b),
        "pipeline_epochs_tokens_per_s": [[round(row["tokens_per_s"]) for row in run[0]] for run in a_runs],
        "by_hand_epochs_tokens_per_s": [[round(row["tokens_per_s"]) for row in run[0]] for run in b_runs],
        "losses": [round(row["loss"], 4) for row in a_runs[0][0]],
        "processes": b_runs[0][2],
        "threads_per_process": b_runs[0][3],
        "batch_size": t.batch_size,
        "max_length": t.max_length,
        "model_id": t.model_id,
        "pipeline_run_s": [round(run[1], 1) for run in a_runs],
        "by_hand_run_s": [round(run[1], 1) for run in b_runs],
        "load_average_1m": os.getloadavg()[0],  # what else ran: the machine may be shared
    }
    return [
        Figure(
            f"trainer: pipeline train stage / torchrun FSDP2 by hand (tokens/s, median of {pairs['pairs']} pairs)",
            ratio,
            "x",
            TARGET,
            detail,
        ),
        Figure(
            f"trainer: torchrun FSDP2 by hand beside an idle local cluster / alone (C / B, median of "
            f"{beside['pairs']} pairs)",
            beside_ratio,
            "x",
            None,
            beside,
        ),
        Figure(
            "trainer: pipeline train stage (A)", a, "tokens/s", None, {"epochs": detail["pipeline_epochs_tokens_per_s"]}
        ),
        Figure(
            "trainer: torchrun FSDP2 by hand (B)",
            b,
            "tokens/s",
            None,
            {"epochs": detail["by_hand_epochs_tokens_per_s"]},
        ),
    ]


if __name__ == "__main__":
    results = figures()
    print(table(results))
    print(json.dumps(results[0].detail, indent=1))
