"""Answers to the evaluation prompts from MaxText's inference engine (``trainers.maxtext_generation``): a tiny model
trained 10 steps in one MaxText process on 2 emulated CPU devices (no Ray), the model training starts from answering
first, then the trained checkpoint, 16 held-out prompts in groups of the training batch's 4 slots through one decode
state (never two alive at once). The files are the FSDP trainer's format (``trainers.generation.record``), which the
evaluate stage's check accepts, the answers of the trained model differ from the initial model's, the same answers
come again from a second run, also from fewer slots than the training batch (3 prompts: 3 slots) and from a short
last group beside the slots of the group before (6 prompts), prefilled at their own bucket, and they are greedy
decoding's without the KV cache (each token from a prefill of the prompt and the tokens before it). Each model's
answers are all made before a team's scorer scores one. With training frozen (learning rate 0, one step), its
checkpoint holds the parameters training started from: those of ``maxtext_generation.initial_params``, and the model
before training answers as the trained one; with a base checkpoint (``load_parameters_path``) it is that checkpoint.
The train job itself, with a scorer that fails once after training: the worker group Ray Train starts again answers
without training again. The spec's side: a maxtext run with generation is valid and may gate on a task metric,
refused without the hf data's tokenizer, its decode slots and KV cache (``components.workload.maxtext``) as worked out
by hand for Llama 3 8B and 70B on v6e, shown by the plan, refused when one slot cannot fit its budget on the smallest
group, and the plan of a slice warns that the decode is untested on a TPU."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.spec import SpecError
from components.tpu import shapes
from components.workload import maxtext, resolve
from trainers import maxtext_generation

SCRIPT = r"""
import json, logging, os, sys
from pathlib import Path

from absl import logging as absl_logging
from components.workload import maxtext as maxtext_args
from components.workload import resolve
from trainers import maxtext_eval, maxtext_generation, maxtext_train

root, phase = Path(sys.argv[1]), sys.argv[2]
steps = "maxtext.steps=1" if phase == "frozen" else "maxtext.steps=10"
sets = f"{steps} cluster.num_hosts=1 maxtext.ici_fsdp_parallelism=-1 eval.generate_examples=16 eval.max_new_tokens=8"
spec = resolve("local-maxtext", sets + " " + sys.argv[4])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={spec.maxtext.cpu_devices_per_host}"
os.environ["JAX_PLATFORMS"] = "cpu"
args = maxtext_args.train_args(spec, str(root), "run")
if phase == "frozen":  # training frozen: its one step leaves the parameters as training initialised them
    args = [a for a in args if not a.startswith("learning_rate=")] + ["learning_rate=0"]
maxtext_train.prepare_data(spec, args, root)
argv = ["train", maxtext_train.base_yml(), *args]
absl_logging.set_verbosity(absl_logging.INFO)
order = []  # the engine's checkpoint loads and the team scorer's calls, in turn


class Loads(logging.Handler):
    def emit(self, record):
        if "via from_pretrained" in record.getMessage():  # MaxEngine.load_params reading load_parameters_path
            order.append("load")


logging.getLogger("absl").addHandler(Loads())
if spec.eval.scorer:
    from trainers.scorers import team_scorer

    team_scorer.ORDER = order
import jax
from maxtext.inference.maxengine import maxengine

live = []  # after each of the engine's calls on a decode state: how many decode states are alive


def counted(call):
    def counting(self, *a, **k):
        out = call(self, *a, **k)
        state = out[0] if isinstance(out, tuple) else out
        key = max(jax.tree.leaves(state["cache"]), key=lambda x: x.size)  # a layer's K (or V) cache
        same = lambda x: (x.shape, x.dtype) == (key.shape, key.dtype)
        per_state = sum(map(same, jax.tree.leaves(state["cache"])))
        live.append(sum(map(same, jax.live_arrays())) / per_state)
        return out

    return counting


for name in ("init_decode_state", "insert", "generate"):
    setattr(maxengine.MaxEngine, name, counted(getattr(maxengine.MaxEngine, name)))
held = maxtext_train.examples(spec, root)["heldout"][: spec.eval.generate_examples]
models = [m for m in maxtext_train.train_answers(spec, args) if m[0] in sys.argv[3].split(",")]
decode = maxtext_args.decode_shape(spec)
found = []
restore = maxtext_train.latest_checkpoint(root, "run")
first, last = maxtext_train.split_answers(models, int(restore.name) if restore else None)
if first:  # the model training starts from, answered first, as a worker group that restores nothing does
    found += maxtext_generation.answer_models(spec, argv, held, first, 0, decode)
if phase in ("train", "frozen"):
    from absl import flags
    from maxtext.trainers.pre_train import train

    flags.FLAGS.mark_as_parsed()
    train.main(argv)
found += maxtext_generation.answer_models(spec, argv, held, last, 0, decode)
facts = {"found": found, "order": order, "live_decode_states": live}
if phase in ("answer", "frozen"):
    import jax, jax.numpy as jnp, numpy as np, transformers
    from flax import nnx
    from maxtext.configs import pyconfig
    from maxtext.inference.maxengine import maxengine
    from trainers import data, generation

    tokenizer = transformers.AutoTokenizer.from_pretrained(maxtext_args.data_paths(str(root))["tokenizer"])
    params = str(maxtext_train.latest_checkpoint(root, "run") / "items")
    batch = spec.maxtext.per_device_batch_size
    engine = maxengine.MaxEngine(pyconfig.initialize(maxtext_generation.decode_args(argv, params, 128, 8, batch)))
    weights = engine.load_params()
prompts = []
if phase == "answer":
    prompts = data.prompt_ids(tokenizer, [data.prompt_of(e) for e in held])
    facts["prefill"] = maxtext_generation.prefill_of(prompts, decode)
    # three prompts: three decode slots (the training batch is 2 x 2 devices); six: a group of four, then a group of
    # two whose other two slots still decode the first group's prompts; answered alike
    for n in (3, 6):
        few = maxtext_generation.answer(spec, argv, params, prompts[:n], tokenizer.pad_token_id, decode)
        facts[f"few{n}"] = [generation.decode(tokenizer, row) for row in few]
    # the trained checkpoint as a base checkpoint training would start from: the model before training answers it
    base = [a for a in argv if not a.startswith("base_output_directory=")]
    base += [f"base_output_directory={root / 'base'}", f"load_parameters_path={params}"]
    initial = [("before", maxtext_generation.INITIAL)]
    facts["base"] = maxtext_generation.answer_models(spec, base, held, initial, 0, decode)
    facts["uncached"] = []  # greedy without the KV cache: each next token from a prefill of all the tokens so far
    for row in prompts[:4] + prompts[12:]:  # the first group's and the last's (one decode state through all four)
        made = []
        for _ in range(spec.eval.max_new_tokens):
            padded = np.full((128,), tokenizer.pad_token_id, dtype=np.int32)  # prompt and answer
            padded[: len(row) + len(made)] = row + made
            _, token = engine.prefill(
                params=weights, padded_tokens=jnp.asarray(padded), true_length=len(row) + len(made), slot=0
            )
            made.append(int(token.data[0, 0]))
        facts["uncached"].append(generation.decode(tokenizer, made))
if phase == "frozen":  # the checkpoint's parameters against those initial_params makes, leaf by leaf
    saved = nnx.to_pure_dict(weights)
    initial = nnx.to_pure_dict(maxtext_generation.initial_params(argv))
    flat = lambda tree: {"/".join(map(str, k)): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    saved, initial = flat(saved), flat(initial)
    facts["leaves"] = len(saved)
    facts["differing"] = sorted(k for k in saved.keys() | initial.keys() if k not in saved or k not in initial
                                or not np.array_equal(saved[k], initial[k]))
print("FACTS " + json.dumps(facts), file=sys.__stdout__, flush=True)
"""

TEAM_SCORER = """
ORDER = []


def noting(prompt, reference, answer):
    ORDER.append("score")
    return float(reference in answer)
"""
SCORED = "eval.scorer=trainers.scorers.team_scorer:noting"  # a team's module in the scorers package


def _run(python, env, repo, *argv) -> dict:
    proc = subprocess.run([python, "-c", SCRIPT, *argv], cwd=repo, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))
    return json.loads(facts[6:])


def _maxtext(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO, scorers_tree

    tree = scorers_tree(tmp_path, {"team_scorer": TEAM_SCORER})  # this checkout's trainers, with the team's scorer
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": f"{tree}:{REPO}"}
    return envs.ensure_env("maxtext").python, env, tree  # run there: `python -c` puts its directory first


@pytest.mark.trainer_env  # needs the maxtext trainer environment, which `make test` builds while the fast tiers run
def test_maxtext_engine_answers_before_and_after_training_in_the_fsdp_trainers_format(tmp_path):
    from components.stages import answers

    python, env, repo = _maxtext(tmp_path)
    facts = _run(python, env, repo, str(tmp_path), "train", "before,after", SCORED)
    found = {f["which"]: f for f in facts["found"]}
    spec = resolve("local-maxtext", f"eval.generate_examples=16 eval.max_new_tokens=8 {SCORED}")
    assert set(found) == {"before", "after"}
    rows = {}
    for which, f in found.items():
        assert f["num_examples"] == 16 and f["generation_key"].startswith("sha256:") and f["seconds"] > 0
        rows[which] = answers.checked(answers.read(f["path"]), spec, 16)  # the evaluate stage's own check
        assert set(f["means"]) == set(spec.eval.metric_names)
    assert found["before"]["generation_key"] == found["after"]["generation_key"]
    assert [r["prompt"] for r in rows["before"]] == [r["prompt"] for r in rows["after"]]
    assert any(b["answer"] != a["answer"] for b, a in zip(rows["before"], rows["after"], strict=True))
    # The model training starts from answered and was scored before training; the trained one after: every answer
    # made before the scorer scored any of its model's, the trained checkpoint's load before its first score.
    assert facts["order"] == ["score"] * 16 + ["load"] + ["score"] * 16, facts["order"]
    # 16 prompts in 4 groups of 4 slots: never two decode states alive, at any of the engine's calls
    assert len(facts["live_decode_states"]) > 4 * 8 and max(facts["live_decode_states"]) == 1
    # Greedy and the decode state's RNG fixed: the trained checkpoint answers alike in another process, from 3 slots
    # as from the training batch's 4, from a decode state whose last group leaves two slots to the group before's
    # prompts, and the answers from the decode slots and their KV cache (the first group's and the fourth's, after
    # three groups through one decode state) are greedy decoding's without a cache.
    again = _run(python, env, repo, str(tmp_path), "answer", "after", SCORED)
    after = [r["answer"] for r in rows["after"]]
    assert [r["answer"] for r in answers.read(again["found"][0]["path"])] == after
    assert again["few3"] == after[:3] and again["few6"] == after[:6]
    assert again["uncached"] == after[:4] + after[12:]
    assert max(again["live_decode_states"]) == 1
    # The prompts (under 64 tokens) prefilled at their bucket, 64, not the plan's largest, 128 (max_target_length)
    assert again["prefill"] == 64 and maxtext.decode_shape(spec)["prefill"] == 128
    # With a base checkpoint in the training arguments (load_parameters_path), the model before training is it:
    # the trained checkpoint given as one answers as the trained model
    (base,) = again["base"]
    assert base["which"] == "before" and [r["answer"] for r in answers.read(base["path"])] == after


@pytest.mark.trainer_env  # needs the maxtext trainer environment
def test_the_model_before_training_answers_with_the_parameters_training_started_from(tmp_path):
    """Training frozen (learning rate 0, one step): its checkpoint holds what training initialised, leaf for leaf
    ``initial_params``', and the ``before`` answers (what training started from) are the checkpoint's answers. The
    engine's own initialisation (autoregressive mode, another RNG) answered otherwise."""
    from components.stages import answers

    python, env, repo = _maxtext(tmp_path)
    facts = _run(python, env, repo, str(tmp_path), "frozen", "before,after", "")
    assert facts["leaves"] > 0 and facts["differing"] == []
    found = {f["which"]: [r["answer"] for r in answers.read(f["path"])] for f in facts["found"]}
    assert set(found) == {"before", "after"} and len(found["before"]) == 16
    assert found["before"] == found["after"]


FLAKY_SCORER = """
from pathlib import Path

SCORED = Path(__file__).with_name("scored")


def flaky(prompt, reference, answer):  # fails once: at the first score of the second model's answers (call 17)
    calls = int(SCORED.read_text()) + 1 if SCORED.exists() else 1
    SCORED.write_text(str(calls))
    if calls == 17:
        raise RuntimeError("a scorer's failure while the trained model's answers are scored")
    return float(reference in answer)
"""


@pytest.mark.trainer_env  # needs the maxtext trainer environment; starts a Ray instance of its own
def test_a_failure_while_answering_after_training_is_retried_without_training_again(tmp_path):
    """The train job itself (``python -m trainers.maxtext_train train``, Ray Train on a Ray instance of its own, one
    worker of 2 CPU devices) with a team scorer that fails once, scoring the trained model's answers after the last
    step: Ray Train starts a second worker group (``train.max_failures``), which restores the last step's
    checkpoint, trains no more (MaxText would refuse: "Requested training up to step ..."), answers again and ends
    the job; the model before training was answered once, by the first group, before it trained."""
    import shlex

    from components.spec import protocol
    from components.workload import derive

    python, env, repo = _maxtext(tmp_path)
    (repo / "trainers" / "scorers" / "flaky_scorer.py").write_text(FLAKY_SCORER)  # a team's module, in the image's code
    sets = "maxtext.steps=10 cluster.num_hosts=1 maxtext.ici_fsdp_parallelism=-1 eval.generate_examples=16"
    spec = resolve("local-maxtext", f"{sets} eval.max_new_tokens=8 eval.scorer=trainers.scorers.flaky_scorer:flaky")
    assert spec.train.max_failures >= 1
    words = shlex.split(derive.job_command(spec, "train", str(tmp_path / "out"), "run"))
    assert words[:3] == ["python", "-m", "trainers.maxtext_train"]
    proc = subprocess.run(
        [python, *words[1:]],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1500,
        env=env | {"RAY_USAGE_STATS_ENABLED": "0"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    records = list(protocol.parse(out.splitlines()))
    groups = [p for kind, p in records if kind == "event" and p["event"] == "worker_group_started"]
    assert [g["restore_step"] for g in groups] == [None, 9], groups
    assert "a scorer's failure while the trained model's answers are scored" in out
    assert "Requested training up to step" not in out
    assert "MaxText: the restored checkpoint is step 9, the last of steps=10: training is done" in out
    trained_by = {p["group"] for kind, p in records if kind == "metric" and "step" in p}
    assert trained_by == {groups[0]["group"]}  # every training step the first group's
    answered = [p["which"] for kind, p in records if kind == "event" and p["event"] == "answers"]
    assert answered == ["before", "after"]  # the first group's before; the second group's after
    (result,) = [p for kind, p in records if kind == "result"]
    assert result["checkpoint"].endswith("/checkpoints/9") and result["heldout"] == {}  # evaluate measures it


def test_prefill_length_is_a_power_of_two_bucket_of_at_least_64():
    assert [shapes.prefill_length(n) for n in (1, 64, 65, 128, 129)] == [64, 64, 128, 128, 256]


def test_decode_args_replace_the_lengths_slots_checkpoint_and_run_name_of_the_training_arguments():
    argv = ["train", "base.yml", "max_target_length=128", "run_name=r", "load_parameters_path=/old", "steps=10"]
    argv.append("per_device_batch_size=4")
    args = maxtext_generation.decode_args(argv, "/ckpt/9/items", 64, 16, 0.75)
    assert args[:2] == ["train", "base.yml"] and "steps=10" in args
    keys = [a.split("=", 1)[0] for a in args[2:]]
    assert len(keys) == len(set(keys))  # each replaced once
    assert {"max_target_length=80", "max_prefill_predict_length=64", "run_name=r-answers"} <= set(args)
    assert "per_device_batch_size=0.75" in args
    assert "load_parameters_path=/ckpt/9/items" in args and "decode_sampling_strategy=greedy" in args
    assert not any(a.startswith("load_parameters_path") for a in maxtext_generation.decode_args(argv, "", 64, 16, 1))


@pytest.mark.parametrize(("slots", "devices"), [(3, 4), (37, 32), (1, 6), (5, 6), (7, 12), (64, 64), (10, 3)])
def test_the_per_device_batch_gives_maxtexts_decode_batch_the_slots(slots, devices):
    size = maxtext_generation.per_device_batch(slots, devices)
    assert int(devices * size) == slots  # maxtext/configs/types.py: micro_batch_size_to_train_on
    assert int(devices * (size - 1e-9)) < slots or size == slots / devices


def test_a_cut_prompt_keeps_its_beginning_token():
    assert maxtext_generation.cut([1, 5, 6, 7, 8], 3, bos=1) == [1, 7, 8]
    assert maxtext_generation.cut([1, 5, 6], 3, bos=1) == [1, 5, 6]
    assert maxtext_generation.cut([5, 6, 7, 8], 3, bos=1) == [6, 7, 8]  # no beginning token: the last tokens
    assert maxtext_generation.cut([5, 6, 7, 8], 2, bos=None) == [7, 8]


def test_the_local_maxtext_preset_answers_before_and_after_training():
    from trainers import maxtext_train

    spec = resolve("local-maxtext", "gate.guards=rouge_l>=-0.05")
    assert spec.eval.generate_examples == 64
    args = maxtext.train_args(spec, "/out", "run")
    expected = (("before", maxtext_generation.INITIAL), ("after", maxtext_generation.LATEST))
    assert maxtext_train.train_answers(spec, args) == expected
    assert maxtext_train.train_answers(resolve("local-maxtext", "eval.generate_examples=0"), args) == ()


GEN = "eval.generate_examples=64 eval.max_new_tokens=16 maxtext.dataset_type=hf"


def test_the_jobs_get_the_decode_shape_on_their_command_line():
    """The prefill holds a prompt of max_target_length tokens (128: a bucket of 128); the slots are the training
    batch (2 a device x 4 devices), at most the 64 prompts, on the one group; the FSDP jobs and a run without
    answers get none."""
    import shlex

    from components.workload import derive
    from trainers import maxtext_train

    spec = resolve("local-maxtext", "")
    assert maxtext.decode_shape(spec) == {"prefill": 128, "slots": {"4": 8}}
    for mode in ("train", "eval"):
        words = shlex.split(derive.job_command(spec, mode, "/out", "run", checkpoint="/ck"))
        args, _ = maxtext_train.parse_args(words[3:])
        assert args.decode == {"prefill": 128, "slots": {"4": 8}}
    assert "--decode" not in derive.job_command(
        resolve("local-maxtext", "eval.generate_examples=0"), "train", "/o", "r"
    )
    assert "--decode" not in derive.job_command(resolve("local-fsdp", ""), "train", "/o", "r")
    # an elastic run: each group's slots, 16 to 32 devices; 8B's budget leaves the 64 prompts whole on either
    elastic = resolve("llama3-8b-v6e-elastic-spot", GEN)
    assert maxtext.decode_shape(elastic) == {"prefill": 4096, "slots": {"16": 64, "32": 64}}


def test_the_kv_cache_and_decode_slots_of_llama3_8b_and_70b_on_v6e_by_hand():
    """Worked by hand from the models' configs (MODEL_DIMS) and the presets' meshes, on v6e (32 GiB = 34,359,738,368
    bytes a chip, one device each). Prompts up to max_target_length 4,096 tokens: a prefill of 4,096, and 16 new
    tokens: 4,112 cached a slot. Both shard the 8 KV heads over tensor 4: 2 a chip, in bfloat16; a cached token is
    2 (K, V) x 2 heads x 128 x 2 bytes + a 4-byte segment id = 1,028 bytes a layer."""
    m8 = maxtext.decode_memory(resolve("llama3-8b-v6e-16x2", GEN), 32, 4112)
    assert m8.kv_cache_per_slot == 32 * 4112 * 1028 == 135_268_352  # 32 layers
    # 8,030,261,248 parameters, float32, over fsdp 4 x tensor 4 (data 2 across the slices holds two copies)
    assert m8.parameters == 8_030_261_248 * 4 // 16 == 2_007_565_312
    assert m8.hbm == 32 * 2**30
    # budget: half of (34,359,738,368 - 2,007,565,312) = 16,176,086,528: 119 slots; the batch is 4 x 32 = 128
    assert m8.slots_fitting() == 119
    assert maxtext.decode_slots(resolve("llama3-8b-v6e-16x2", GEN), 32, 64, 4112) == 64  # the prompts
    m70 = maxtext.decode_memory(resolve("llama3-70b-v6e-16x2", GEN), 32, 4112)
    assert m70.kv_cache_per_slot == 80 * 4112 * 1028 == 338_170_880  # 80 layers
    # 70,553,706,496 parameters over fsdp 4 x tensor 4 x dcn fsdp 2: 32 shards, 8,819,213,312 bytes
    assert m70.parameters == 70_553_706_496 * 4 // 32 == 8_819_213_312
    # budget: half of (34,359,738,368 - 8,819,213,312) = 12,770,262,528: 37 slots (of the batch 2 x 32 = 64)
    assert maxtext.decode_slots(resolve("llama3-70b-v6e-16x2", GEN), 32, 64, 4112) == 37
    # With tensor 1 every chip holds all 8 KV heads: 4,100 bytes a token a layer, 1.35 GB a slot; 9 fit
    whole = resolve("llama3-70b-v6e-16x2", f"{GEN} maxtext.ici_fsdp_parallelism=16 maxtext.ici_tensor_parallelism=1")
    assert maxtext.decode_memory(whole, 32, 4112).kv_cache_per_slot == 80 * 4112 * 4100 == 1_348_736_000
    assert maxtext.decode_slots(whole, 32, 64, 4112) == 9


def test_the_plan_shows_the_answers_decode_slots_and_kv_cache_beside_the_checkpoints():
    from components.platforms.gke.plan import document, text

    plan = document.build(resolve("llama3-70b-v6e-16x2", GEN), "run-1")
    assert plan["training"]["answers"] == {
        "prompts": 64,
        "slots": 37,
        "training_batch": 64,
        "cache_tokens": 4112,
        "kv_cache_bytes_per_chip": 37 * 338_170_880,
        "parameter_bytes_per_chip": 8_819_213_312,
        "hbm_bytes_per_chip": 32 * 2**30,
    }
    lines = text.render_text(plan).splitlines()
    said = [ln for ln in lines if ln.startswith("  answers ")]
    assert len(said) == 1 and "64 prompts in 37 decode slots" in said[0], said
    assert "a KV cache of 12.5 GB a chip beside the parameters' 8.8 GB, of 34.4 GB HBM" in said[0]
    assert "answers" not in document.build(resolve("llama3-70b-v6e-16x2", ""), "run-1")["training"]


def test_answers_whose_one_slot_cannot_fit_a_chip_are_refused_naming_the_new_tokens():
    sets = f"{GEN} maxtext.ici_fsdp_parallelism=16 maxtext.ici_tensor_parallelism=1"
    resolve("llama3-70b-v6e-16x2", f"{sets} eval.max_new_tokens=4000")  # 8,096 tokens: 2.7 GB a slot, fits
    with pytest.raises(SpecError) as err:  # 104,096 tokens: 34.1 GB a slot beside 8.8 GB of parameters
        resolve("llama3-70b-v6e-16x2", f"{sets} eval.max_new_tokens=100000")
    assert err.value.field == "eval.max_new_tokens"
    assert "34.1 GB a device for 104,096 tokens" in str(err.value) and "eval.generate_examples=0" in str(err.value)


def test_one_slot_over_its_kv_cache_budget_on_the_smallest_group_is_refused():
    """The budget is half of what the parameters leave a device (KV_CACHE_SHARE), on the hardest group: an elastic
    Llama 3 70B over 16 to 32 v6e chips, its parameters over fsdp across the slices (dcn_fsdp): 17.6 GB a chip on the
    group of one slice (budget 8.4 GB), 8.8 GB on both (12.8 GB). A slot of 124,096 tokens (10.2 GB) fits the large
    group's and is refused for the small one's; on one group, a slot of 54,096 tokens with every KV head a chip
    (17.7 GB) fits beside the parameters (25.5 GB left) but not in its budget (12.8 GB)."""
    elastic = f"{GEN} maxtext.model_name=llama3-70b maxtext.dcn_fsdp_parallelism=-1 maxtext.dcn_data_parallelism=1"
    spec = resolve("llama3-8b-v6e-elastic-spot", elastic)
    assert maxtext.decode_shape(spec) == {"prefill": 4096, "slots": {"16": 24, "32": 37}}
    assert maxtext.decode_memory(spec, 32, 124_096).slots_fitting() == 1
    with pytest.raises(SpecError) as err:
        resolve("llama3-8b-v6e-elastic-spot", f"{elastic} eval.max_new_tokens=120000")
    assert err.value.field == "eval.max_new_tokens"
    assert "10.2 GB a device for 124,096 tokens" in str(err.value) and "budget of 8.4 GB" in str(err.value)
    assert "a worker group of 16 devices, the smallest" in str(err.value)
    whole = f"{GEN} maxtext.ici_fsdp_parallelism=16 maxtext.ici_tensor_parallelism=1"
    resolve("llama3-70b-v6e-16x2", f"{whole} eval.max_new_tokens=30000")  # 34,096 tokens: 11.2 GB, in its budget
    with pytest.raises(SpecError) as err:
        resolve("llama3-70b-v6e-16x2", f"{whole} eval.max_new_tokens=50000")
    assert "17.7 GB a device for 54,096 tokens" in str(err.value) and "budget of 12.8 GB" in str(err.value)


def test_the_job_prefills_at_the_bucket_of_its_longest_prompt_at_most_the_plans():
    decode = {"prefill": 4096, "slots": {"32": 37}}
    assert maxtext_generation.prefill_of([[1] * 10, [1] * 70], decode) == 128
    assert maxtext_generation.prefill_of([[1] * 3], decode) == 64
    assert maxtext_generation.prefill_of([[1] * 4096], decode) == 4096
    with pytest.raises(SystemExit, match="a prompt of 4097 tokens exceeds the job's largest prefill, 4096"):
        maxtext_generation.prefill_of([[1] * 4097], decode)


def test_a_group_answers_the_model_before_training_first_only_when_it_restores_nothing():
    from trainers import maxtext_train

    models = [("before", maxtext_generation.INITIAL), ("after", maxtext_generation.LATEST)]
    assert maxtext_train.split_answers(models, None) == (models[:1], models[1:])
    assert maxtext_train.split_answers(models, 3) == ([], models[1:])  # answered by the group that initialised
    champion = [("champion", "/ck/9/items")]
    assert maxtext_train.split_answers(champion, None) == ([], champion)


def test_a_group_that_restores_the_last_step_trains_no_more():
    from trainers import maxtext_train

    argv = ["train", "base.yml", "steps=10"]
    assert not maxtext_train.trained(argv, None) and not maxtext_train.trained(argv, 8)
    assert maxtext_train.trained(argv, 9)  # MaxText saves step 9 after 10 steps: validate_completed_steps refuses
    assert not maxtext_train.trained(["train", "base.yml"], 9)  # no steps given: MaxText's to decide


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
