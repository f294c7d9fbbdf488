"""Every preset's jobs, as the trainers receive them: the slice check's, train's and evaluate's command lines that the
dry run prints (``components.workload.derive.job_command``, one source for the stages and the plan), parsed by the
trainer's own ``parse_args`` in the trainer's own environment (the torch one for fsdp presets, the maxtext one for
MaxText presets), and Ray Train's ``ScalingConfig`` built from what they parsed, as the trainer builds it. A preset
whose ScalingConfig Ray refuses (an elastic ``num_workers`` range passed as a list, say) fails here, not at train on
a slice."""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from components.spec import layered
from components.spec.presets import PRESETS
from components.workload.derive import job_command, scaling_config_args

# In the trainer's environment: each job's module parses its own arguments; ScalingConfig is built from them.
SCRIPT = r"""
import importlib, json, sys

from ray.train import ScalingConfig

built = []
for name, mode, argv in json.load(sys.stdin):
    module = importlib.import_module(argv[0])
    parsed = module.parse_args(argv[1:])
    args = parsed[0] if isinstance(parsed, tuple) else parsed  # maxtext_train: (its options, MaxText's arguments)
    config = ScalingConfig(**args.scaling_config)
    built.append([name, mode, config.num_workers if isinstance(config.num_workers, int) else list(config.num_workers)])
print("BUILT " + json.dumps(built))
"""
ENV_OF = {"fsdp": "torch", "maxtext": "maxtext"}  # the workload -> the image (environment) its trainer runs in


def _jobs(workload: str) -> list[tuple[str, str, list[str]]]:
    """(preset, mode, the job's ``python -m`` arguments) of every preset of the workload, each of its three jobs."""
    jobs = []
    for name in sorted(PRESETS):
        spec = layered(name)
        if spec.train.workload != workload:
            continue
        for mode in ("check", "train", "eval"):
            words = shlex.split(job_command(spec, mode, "/data/runs/r", "r", checkpoint="/data/runs/r/ckpt"))
            assert words[:2] == ["python", "-m"], words[:3]
            jobs.append((name, mode, words[2:]))
    return jobs


@pytest.mark.trainer_env  # runs in the trainer environments, which `make test` builds while the fast tiers run
@pytest.mark.parametrize("workload", sorted(ENV_OF))
def test_every_presets_jobs_parse_and_build_their_scaling_config_in_the_trainers_environment(workload):
    from components.platforms.local import envs
    from tests.helpers import REPO

    jobs = _jobs(workload)
    assert jobs, f"no preset of the {workload} workload"
    python = envs.ensure_env(ENV_OF[workload]).python
    proc = subprocess.run(
        [python, "-c", SCRIPT], input=json.dumps(jobs), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("BUILT "))[6:])
    assert [(name, mode) for name, mode, _ in built] == [(name, mode) for name, mode, _ in jobs]
    for name, mode, workers in built:  # what Ray took is what was derived: a count, or an elastic (min, max) range
        derived = scaling_config_args(layered(name))["num_workers"]
        assert workers == (list(derived) if isinstance(derived, list | tuple) else derived), (name, mode)
    if workload == "maxtext":  # the elastic MaxText preset (the tutorial's elastic Spot run) is among them
        assert any(isinstance(workers, list) for _, _, workers in built)
