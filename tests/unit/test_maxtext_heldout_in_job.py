"""The MaxText train job's own figure is the evaluation job's: a tiny model trained 10 steps with MaxText's eval loop
in the train job (``trainers.maxtext_eval.in_job_eval``: after the last step), then the evaluation job's run of
MaxText (one frozen step, ``trainers.maxtext_log.eval_args``) of the last checkpoint: the same held-out loss to the
tolerance of the loss, on the same evaluation key. Each run is one MaxText process on 2 emulated CPU devices, read by
rank 0's records as the driver reads them (``trainers.maxtext_train.rank_zero_records``), no Ray: two MaxText
starts, about 50 CPU-seconds in all."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.trainer_env  # the maxtext trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import json, os, sys
from pathlib import Path

from components.workload import maxtext as maxtext_args
from components.workload import resolve
from trainers import maxtext_eval, maxtext_log, maxtext_train

mode, root, params = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
spec = resolve("local-maxtext", "maxtext.steps=10 cluster.num_hosts=1 maxtext.ici_fsdp_parallelism=-1")
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec.maxtext.cpu_devices_per_host}"
os.environ["JAX_PLATFORMS"] = "cpu"
args = maxtext_args.train_args(spec, str(root), "run")
if mode == "train":
    maxtext_train.prepare_data(spec, args, root)
    args = [*args, *maxtext_eval.in_job_eval(spec, args)]
else:
    args = maxtext_log.eval_args(args, f"run-eval-{mode}", spec.maxtext.eval_steps, params)
handler, argv = maxtext_train.rank_zero_records(["train", maxtext_train.base_yml(), *args], mode)
from absl import flags
from maxtext.trainers.pre_train import train

flags.FLAGS.mark_as_parsed()
train.main(argv)
print("FACTS " + json.dumps(maxtext_train.final_metrics(handler)), file=sys.__stdout__, flush=True)
"""


def _run(python, env, repo, *argv) -> tuple[dict, str]:
    proc = subprocess.run([python, "-c", SCRIPT, *argv], cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))
    return json.loads(facts[6:]), proc.stdout


def test_the_maxtext_train_jobs_own_figures_are_the_evaluation_jobs(tmp_path):
    from components.platforms.local import envs
    from components.spec import protocol
    from tests.helpers import REPO

    python = envs.ensure_env("maxtext").python
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    trained, out = _run(python, env, REPO, "train", str(tmp_path), "")
    events = {p["which"]: p for kind, p in protocol.parse(out.splitlines()) if p.get("event") == "eval"}
    checkpoint = tmp_path / "run" / "checkpoints" / "9" / "items"
    assert checkpoint.is_dir() and set(events) == {"after"}
    after, _ = _run(python, env, REPO, "after", str(tmp_path), str(checkpoint))
    assert trained["eval_key"] == after["eval_key"] == events["after"]["eval_key"]
    assert trained["num_eval_examples"] == after["num_eval_examples"] == 128
    assert trained["eval_loss"] == events["after"]["eval_loss"] == pytest.approx(after["eval_loss"], rel=1e-6)
    assert trained["eval_loss"] < trained["loss"] * 2 and events["after"]["seconds"] > 0
