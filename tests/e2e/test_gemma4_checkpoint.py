"""The FSDP trainer on a checkpoint with the layout of ``google/gemma-4-E2B-it`` (``Gemma4ForConditionalGeneration``:
text, vision and audio configs), saved locally with its tokenizer: loading without the towers, the FSDP2 layout,
and training steps on 2 CPU workers of Ray Train, in the torch environment."""

import json
import os
import subprocess

import pytest

from components.platforms.local import envs
from tests.helpers import REPO

pytestmark = pytest.mark.e2e

SCRIPT = r"""
import json, sys
from pathlib import Path

from safetensors import safe_open

from components.spec import layered
from tests.tiny_gemma4 import build
from trainers import fsdp
from trainers.model import decoder_layers, frozen_names, load_pretrained, load_tokenizer, load_trained

root = Path(sys.argv[1])
checkpoint = build(str(root / "gemma4-tiny-composite"))
model = load_pretrained(checkpoint)
facts = {
    "class": type(model).__name__,
    "towers": [model.model.vision_tower is None, model.model.audio_tower is None],
    "use_cache": model.config.get_text_config().use_cache,
    "layers": len(decoder_layers(model)),
    "frozen": sorted(frozen_names(model)),
    "tokenizer": len(load_tokenizer(checkpoint)),
}
spec = layered("local-fsdp", {"model_id": checkpoint, "epochs": "1", "num_train_examples": "48", "batch_size": "8",
                              "checkpoint_optimizer": "false"})
scaling = {"num_workers": 2, "resources_per_worker": {"CPU": 1}, "placement_strategy": "SPREAD"}
result = fsdp.run(spec, scaling, root / "out", "tiny-composite")
trained = Path(result["checkpoint"])
with safe_open(str(trained / "model.safetensors"), "pt") as f:
    keys = list(f.keys())
reloaded = load_trained(checkpoint, str(trained), load_tokenizer(checkpoint), 0)
facts |= {"result": result, "saved": sorted(p.name for p in trained.iterdir()),
          "frozen_saved": [k for k in keys if "embed_tokens_per_layer" in k], "num_keys": len(keys),
          "reloaded": type(reloaded).__name__}
print("FACTS " + json.dumps(facts, default=str))
"""


def test_composite_checkpoint_loads_shards_and_trains_on_two_cpu_workers(tmp_path):
    python = envs.ensure_env("torch").python
    # A Ray instance of its own. A new local ray.init() turns token authentication on and writes a token to
    # ~/.ray/auth_token, which every later `ray start` on the machine would pick up: keep that home in tmp_path.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "HOME": str(tmp_path),
        "RAY_AUTH_MODE": "disabled",
    }
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    assert facts["class"] == "Gemma4ForConditionalGeneration"
    assert facts["towers"] == [True, True] and facts["use_cache"] is False
    assert facts["layers"] == 2 and facts["frozen"] == ["model.language_model.embed_tokens_per_layer.weight"]
    assert facts["tokenizer"] > 90
    result = facts["result"]
    assert (result["device"], result["backend"], result["num_workers"]) == ("cpu", "gloo", 2)
    # 48 examples / (8 per worker x 2 workers) = 3 steps, each on both workers
    assert result["final_metrics"]["global_step"] == 3
    assert 0 < result["final_metrics"]["loss"] < 10
    assert "model.safetensors" in facts["saved"] and "optimizer.pt" not in facts["saved"]
    assert facts["frozen_saved"] == [] and facts["num_keys"] > 10
    assert facts["reloaded"] == "Gemma4ForConditionalGeneration"
    assert "workers: 2 x {'CPU': 1} on cpu, backend gloo" in proc.stdout
