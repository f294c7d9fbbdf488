"""The loss is over the response alone (``trainers.data.LABELS``): each example is the prompt's ids as decoding
encodes them, the response's and the end token, with labels -100 over the prompt and the padding; a step's loss is
the mean over its labelled tokens, 0 when there are none; and the keys that say which figures and checkpoints compare
(``trainers.heldout.eval_key``, ``trainers.data.tokenized_key``, ``trainers.checkpoints.training_digest``) hold the
rule and the prompt format. Run in the torch trainer environment (seconds: one process, no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainer_env  # the torch trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import json
from trainers import data
from trainers.model import char_tokenizer

tokenizer = char_tokenizer()
examples = [{"instruction": "Reverse the word abc.", "response": "cba"},
            {"instruction": "Add 1 and 2.", "response": "3"}]
columns = data.tokenize(examples, tokenizer, 64).columns
rows = []
for ids, labels in zip(columns["input_ids"].tolist(), columns["labels"].tolist()):
    rows.append({"learned": tokenizer.decode([i for i, l in zip(ids, labels) if l != -100]),
                 "ids_where_learned": all(l in (-100, i) for i, l in zip(ids, labels)),
                 "eos": tokenizer.eos_token_id in [l for l in labels]})
print("FACTS " + json.dumps(rows))
"""


def _facts(tmp_path, script: str, *args: str):
    """What ``script`` prints after ``FACTS `` (JSON), run in the torch trainer environment, offline."""
    from components.platforms.local import envs
    from tests.helpers import REPO

    env = {"PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = str(REPO)
    python = envs.ensure_env("torch").python
    proc = subprocess.run([python, "-c", script, *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])


def test_only_the_response_and_its_end_token_are_learned(tmp_path):
    rows = _facts(tmp_path, SCRIPT)
    assert [r["learned"] for r in rows] == ["cba<eos>", "3<eos>"]
    assert all(r["ids_where_learned"] and r["eos"] for r in rows)


TOO_SHORT_SCRIPT = r"""
import json, sys, warnings
from trainers import data
from trainers.model import char_tokenizer

examples = [{"instruction": "Reverse the word abc.", "response": "cba"},
            {"instruction": "Reverse the word abcdefghijklmnop.", "response": "ponmlkjihgfedcba"}]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    data.tokenize(examples, char_tokenizer(), int(sys.argv[1]))
try:
    data.tokenize(examples, char_tokenizer(), 30)
    error = ""
except ValueError as e:
    error = str(e)
print("FACTS " + json.dumps({"warned": [str(w.message) for w in caught], "error": error}))
"""


def test_a_max_length_the_prompts_fill_is_an_error_and_one_some_fill_a_warning(tmp_path):
    """An example whose prompt fills train.max_length has no labelled token: some of them are said (they are left
    out of the loss), all of them stop the run naming train.max_length (its loss and every held-out figure would be
    0)."""
    # the first prompt (46 tokens) fits with its answer, the second not
    facts = _facts(tmp_path, TOO_SHORT_SCRIPT, "50")
    assert [w for w in facts["warned"] if "train.max_length=50" in w and "1 of 2 example(s)" in w], facts
    assert facts["error"].startswith("train.max_length: 2 of 2 example(s) have no response token"), facts


BPE_SCRIPT = r"""
import json, sys
from transformers import AutoTokenizer
from trainers import data, generation

tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])  # a hub tokenizer as trainers.model.load_tokenizer loads one
examples = [{"instruction": "Reverse the word abc.", "response": "cba"},
            {"instruction": "Give a long answer.", "response": "Paris is the capital of France, " * 8}]
columns = data.tokenize(examples, tokenizer, 24).columns
rows = []
for example, ids, labels in zip(examples, columns["input_ids"].tolist(), columns["labels"].tolist()):
    asked = generation.encode(tokenizer, [data.prompt_of(example)], 24)[0][0].tolist()
    rows.append({"prefix_is_generations": ids[: len(asked)] == asked,
                 "prompt_unlearned": all(l == -100 for l in labels[: len(asked)]),
                 "learned": [i for i, l in zip(ids, labels) if l != -100],
                 "response": tokenizer(example["response"], add_special_tokens=False)["input_ids"]})
adds_eos = tokenizer("x")["input_ids"][-1:]
print("FACTS " + json.dumps({"eos": tokenizer.eos_token_id, "adds_eos": adds_eos, "rows": rows}))
"""


def test_with_a_byte_level_bpe_tokenizer_the_prefix_is_generations_and_the_end_token_is_learned(tmp_path):
    """A hub tokenizer (Qwen3's byte-level BPE, the one MaxText ships, as Llama 3's is) adds no end token of its own
    and merges the prompt's trailing space into the response's first word when the two are tokenised as one text:
    the training prefix is still exactly the ids decoding is asked with, the end token is learned after the
    response, and a response cut by ``max_length`` loses its end token with it."""
    from components.platforms.local import envs

    site = Path(envs.ensure_env("maxtext").path) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    tokenizer_dir = site / "site-packages" / "maxtext" / "assets" / "tokenizers" / "qwen3-tokenizer"
    facts = _facts(tmp_path, BPE_SCRIPT, str(tokenizer_dir))
    eos, (short, cut) = facts["eos"], facts["rows"]
    assert facts["adds_eos"] != [eos]  # the tokenizer itself would not teach the model to stop
    assert short["prefix_is_generations"] and short["prompt_unlearned"]
    assert short["learned"] == short["response"] + [eos]
    assert cut["prefix_is_generations"] and cut["prompt_unlearned"]
    assert cut["learned"] and eos not in cut["learned"]  # cut mid-answer: no end token to learn there
    assert cut["learned"] == cut["response"][: len(cut["learned"])]


STEP_SCRIPT = r"""
import json, math, os, sys
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from trainers import data, mesh
from trainers.model import build_model, char_tokenizer

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
tokenizer = char_tokenizer()
examples = [{"instruction": "Reverse the word abc.", "response": "cba"},
            {"instruction": "Add 1 and 2.", "response": "3"}]
batch = data.tokenize(examples, tokenizer, 64)[[0, 1]]
model = mesh.parallelize(build_model("scratch:gemma4-tiny", tokenizer, 0), init_device_mesh("cpu", (1,)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
with torch.no_grad():
    mean = float(model(**batch).loss)  # transformers' own mean over the labelled tokens
stepped = float(mesh.train_step(model, optimizer, batch, "cpu"))
masked = {**batch, "labels": torch.full_like(batch["labels"], -100)}  # every prompt fills max_length
empty = float(mesh.train_step(model, optimizer, masked, "cpu"))
print("FACTS " + json.dumps({"mean": mean, "stepped": stepped, "empty": empty, "finite": math.isfinite(empty)}))
"""


def test_a_step_is_the_token_mean_and_a_step_without_labelled_tokens_is_zero_not_nan(tmp_path):
    """``trainers.mesh.train_step``: the loss is the mean over the step's labelled tokens (one worker: transformers'
    own mean), and a batch with none (a prompt that fills ``train.max_length``) gives 0 with zero gradients, where
    the mean would be 0/0."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    facts = _facts(tmp_path, STEP_SCRIPT, str(port))
    assert facts["stepped"] == pytest.approx(facts["mean"], rel=1e-5)
    assert facts["finite"] and facts["empty"] == 0.0


def test_the_loss_rule_and_the_prompt_format_are_part_of_the_figures_key_the_splits_and_the_resume_digest(
    monkeypatch,
):
    from components.workload import resolve
    from trainers import checkpoints, data, heldout

    spec = resolve("local-fsdp")

    def keys():
        return (
            heldout.eval_key(spec, "sha256:aa", "cpu", 2),
            data.tokenized_key("sha256:aa", {"name": "t"}, 64),
            checkpoints.training_digest(spec),
        )

    now = keys()
    with monkeypatch.context() as m:
        m.setattr(data, "LABELS", "input ids, -100 where padded")  # the rule before: the whole text
        assert all(a != b for a, b in zip(keys(), now, strict=True))
    with monkeypatch.context() as m:
        m.setattr(data, "PROMPT", "Q: {instruction}\nA: {response}")
        assert all(a != b for a, b in zip(keys(), now, strict=True))
    assert keys() == now
