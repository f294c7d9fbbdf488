"""The loss is over the response alone (``trainers.data.LABELS``): the tokenised split's labels are -100 over the
prompt and the padding and the input ids over the response and its end token, and the keys that say which figures
compare (the held-out figure's ``trainers.heldout.eval_key``, the tokenised split's ``trainers.data.tokenized_key``)
hold the rule. Run in the torch trainer environment (seconds: one process, no Ray)."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.e2e  # needs the torch trainer environment, which `make test` builds while the fast tiers run

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


def test_only_the_response_and_its_end_token_are_learned(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    env = {"PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path)}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run(
        [envs.ensure_env("torch").python, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    assert [r["learned"] for r in rows] == ["cba<eos>", "3<eos>"]
    assert all(r["ids_where_learned"] and r["eos"] for r in rows)


def test_the_loss_rule_is_part_of_the_held_out_figures_key_and_the_tokenised_splits(monkeypatch):
    from components.workload import resolve
    from trainers import data, heldout

    spec = resolve("local-fsdp")
    figure = heldout.eval_key(spec, "sha256:aa", "cpu", 2)
    split = data.tokenized_key("sha256:aa", {"name": "t"}, 64)
    monkeypatch.setattr(data, "LABELS", "input ids, -100 where padded")  # the rule before: the whole text
    assert heldout.eval_key(spec, "sha256:aa", "cpu", 2) != figure
    assert data.tokenized_key("sha256:aa", {"name": "t"}, 64) != split
