"""Answers to the evaluation prompts from MaxText's inference engine (``trainers.maxtext_generation``): a tiny model
trained 10 steps in one MaxText process on 2 emulated CPU devices (no Ray), then the model as initialised and the
trained checkpoint answer 16 held-out prompts in decode slots of the training batch. The files are the FSDP trainer's
format (``trainers.generation.record``), which the evaluate stage's check accepts, the answers of the trained model
differ from the initial model's, the same answers come again from a second run, and they are greedy decoding's without
the KV cache (each token from a prefill of the prompt and the tokens before it). The spec's side: a maxtext run
with generation is valid and may gate on a task metric, refused without the hf data's tokenizer, and the plan of a
slice warns that the decode is untested on a TPU."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.spec import SpecError
from components.workload import resolve
from trainers import maxtext_generation

SCRIPT = r"""
import json, os, sys
from pathlib import Path

from components.workload import maxtext as maxtext_args
from components.workload import resolve
from trainers import maxtext_eval, maxtext_generation, maxtext_train

root = Path(sys.argv[1])
sets = "maxtext.steps=10 cluster.num_hosts=1 maxtext.ici_fsdp_parallelism=-1"
sets += " eval.generate_examples=16 eval.max_new_tokens=8"
spec = resolve("local-maxtext", sets)
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec.maxtext.cpu_devices_per_host}"
os.environ["JAX_PLATFORMS"] = "cpu"
args = maxtext_args.train_args(spec, str(root), "run")
maxtext_train.prepare_data(spec, args, root)
argv = ["train", maxtext_train.base_yml(), *args]
if sys.argv[2] == "train":
    from absl import flags
    from maxtext.trainers.pre_train import train

    flags.FLAGS.mark_as_parsed()
    train.main(argv)
held = maxtext_train.examples(spec, root)["heldout"][: spec.eval.generate_examples]
models = [m for m in maxtext_train.train_answers(spec, args) if m[0] in sys.argv[3].split(",")]
found = maxtext_generation.answer_models(spec, argv, held, models, 0)
uncached = []
if sys.argv[2] == "answer":  # greedy without the KV cache: each next token from a prefill of all the tokens so far
    import jax, jax.numpy as jnp, numpy as np, transformers
    from maxtext.configs import pyconfig
    from maxtext.inference.maxengine import maxengine
    from trainers import data, generation

    tokenizer = transformers.AutoTokenizer.from_pretrained(maxtext_args.data_paths(str(root))["tokenizer"])
    params = str(root / "run" / "checkpoints" / "9" / "items")
    engine = maxengine.MaxEngine(pyconfig.initialize(maxtext_generation.decode_args(argv, params, 128, 8)))
    weights = engine.load_params(rng=jax.random.PRNGKey(0))
    for row in data.prompt_ids(tokenizer, [data.prompt_of(e) for e in held[:4]]):
        made = []
        for _ in range(spec.eval.max_new_tokens):
            padded = np.full((128,), tokenizer.pad_token_id, dtype=np.int32)  # prompt and answer
            padded[: len(row) + len(made)] = row + made
            _, token = engine.prefill(
                params=weights, padded_tokens=jnp.asarray(padded), true_length=len(row) + len(made), slot=0
            )
            made.append(int(token.data[0, 0]))
        uncached.append(generation.decode(tokenizer, made))
print("FACTS " + json.dumps({"found": found, "uncached": uncached}), file=sys.__stdout__, flush=True)
"""


def _run(python, env, repo, *argv) -> dict:
    proc = subprocess.run([python, "-c", SCRIPT, *argv], cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))
    return json.loads(facts[6:])


@pytest.mark.e2e  # needs the maxtext trainer environment, which `make test` builds while the fast tiers run
def test_maxtext_engine_answers_before_and_after_training_in_the_fsdp_trainers_format(tmp_path):
    from components.platforms.local import envs
    from components.stages import answers
    from tests.helpers import REPO

    python = envs.ensure_env("maxtext").python
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    found = {f["which"]: f for f in _run(python, env, REPO, str(tmp_path), "train", "before,after")["found"]}
    spec = resolve("local-maxtext", "eval.generate_examples=16 eval.max_new_tokens=8")
    assert set(found) == {"before", "after"}
    rows = {}
    for which, f in found.items():
        assert f["num_examples"] == 16 and f["generation_key"].startswith("sha256:") and f["seconds"] > 0
        rows[which] = answers.checked(answers.read(f["path"]), spec, 16)  # the evaluate stage's own check
        assert set(f["means"]) == set(spec.eval.metric_names)
    assert found["before"]["generation_key"] == found["after"]["generation_key"]
    assert [r["prompt"] for r in rows["before"]] == [r["prompt"] for r in rows["after"]]
    assert any(b["answer"] != a["answer"] for b, a in zip(rows["before"], rows["after"], strict=True))
    # Greedy and the decode state's RNG fixed: the trained checkpoint answers alike in another process, and the
    # answers from the decode slots and their KV cache are greedy decoding's without a cache.
    again = _run(python, env, REPO, str(tmp_path), "answer", "after")
    assert [r["answer"] for r in answers.read(again["found"][0]["path"])] == [r["answer"] for r in rows["after"]]
    assert again["uncached"] == [r["answer"] for r in rows["after"][:4]]


def test_prefill_length_is_a_power_of_two_bucket_of_at_least_64():
    assert [maxtext_generation.prefill_length(n) for n in (1, 64, 65, 128, 129)] == [64, 64, 128, 128, 256]


def test_decode_args_replace_the_lengths_checkpoint_and_run_name_of_the_training_arguments():
    argv = ["train", "base.yml", "max_target_length=128", "run_name=r", "load_parameters_path=/old", "steps=10"]
    args = maxtext_generation.decode_args(argv, "/ckpt/9/items", 64, 16)
    assert args[:2] == ["train", "base.yml"] and "steps=10" in args
    keys = [a.split("=", 1)[0] for a in args[2:]]
    assert len(keys) == len(set(keys))  # each replaced once
    assert {"max_target_length=80", "max_prefill_predict_length=64", "run_name=r-answers"} <= set(args)
    assert "load_parameters_path=/ckpt/9/items" in args and "decode_sampling_strategy=greedy" in args
    assert not any(a.startswith("load_parameters_path") for a in maxtext_generation.decode_args(argv, "", 64, 16))


def test_the_local_maxtext_preset_answers_before_and_after_training():
    from components.workload import maxtext
    from trainers import maxtext_train

    spec = resolve("local-maxtext", "gate.guards=rouge_l>=-0.05")
    assert spec.eval.generate_examples == 64
    args = maxtext.train_args(spec, "/out", "run")
    assert maxtext_train.train_answers(spec, args) == (("before", ""), ("after", maxtext_generation.LATEST))
    assert maxtext_train.train_answers(resolve("local-maxtext", "eval.generate_examples=0"), args) == ()


def test_maxtext_generation_without_the_hf_datas_tokenizer_is_refused():
    with pytest.raises(SpecError) as err:
        resolve("local-maxtext", "maxtext.dataset_type=synthetic")
    assert err.value.field == "eval.generate_examples" and "dataset_type=hf" in str(err.value)


def test_a_slice_plan_with_generation_warns_that_the_decode_is_untested_on_a_tpu():
    from components.platforms.gke.plan import document

    for preset, workload in (("smoke", "fsdp"), ("llama3-8b-v6e-16x2", "maxtext")):
        sets = "eval.generate_examples=64" + (" maxtext.dataset_type=hf" if workload == "maxtext" else "")
        warnings = document.build(resolve(preset, sets), "run-1")["warnings"]
        said = [w for w in warnings if w.startswith("eval.generate_examples=64: ")]
        assert len(said) == 1 and f"the {workload} trainer's" in said[0] and "untested on a TPU" in said[0]
        assert not any("eval.generate_examples" in w for w in document.build(resolve(preset, ""), "run-1")["warnings"])
