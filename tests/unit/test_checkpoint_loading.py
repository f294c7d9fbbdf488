"""What a resume reads from a checkpoint directory: weights from safetensors, the optimizer state with
``torch.load(weights_only=True)``. A pickle planted there (anything that would run code when unpickled) is refused
with a clear error, before it runs; a real checkpoint of the trainer's layout still loads. Run in the torch trainer
environment (seconds: one process, no Ray)."""

from __future__ import annotations

import subprocess

import pytest

pytestmark = pytest.mark.e2e  # needs the torch trainer environment, which `make test` builds while the fast tiers run

SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

from trainers import checkpoints

root = Path(sys.argv[1])
model = torch.nn.Linear(3, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.ones(1, 3)).sum().backward()
optimizer.step()
options = StateDictOptions(full_state_dict=True, cpu_offload=True)
good = root / "good"
good.mkdir()
save_file(get_model_state_dict(model, options=options), str(good / "model.safetensors"))
torch.save(get_optimizer_state_dict(model, optimizer, options=options), good / "optimizer.pt")
(good / checkpoints.CHECKPOINT_META).write_text(json.dumps({"epoch": 0, "global_step": 1}))

fresh = torch.nn.Linear(3, 2)
fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
meta = checkpoints.load_checkpoint(fresh, fresh_optimizer, good)
steps = [float(s["step"]) for s in fresh_optimizer.state_dict()["state"].values()]
same = bool(torch.equal(fresh.weight, model.weight))


class Planted:
    def __reduce__(self):
        return (os.mkdir, (str(root / "code-ran"),))


bad = root / "bad"
bad.mkdir()
for name in ("model.safetensors", checkpoints.CHECKPOINT_META):
    (bad / name).write_bytes((good / name).read_bytes())
torch.save({"state": {}, "param_groups": [], "planted": Planted()}, bad / "optimizer.pt")
try:
    checkpoints.load_checkpoint(fresh, fresh_optimizer, bad)
    refused = None
except checkpoints.UnsafeCheckpoint as e:
    refused = str(e)
print("FACTS " + json.dumps({"meta": meta, "steps": steps, "same": same, "refused": refused,
                             "ran": (root / "code-ran").exists()}))
"""


def test_a_resume_refuses_a_pickled_optimizer_state_and_loads_a_real_one(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("torch").python
    env = {"PATH": "/usr/bin:/bin", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    assert facts["meta"] == {"epoch": 0, "global_step": 1}
    assert facts["steps"] == [1.0, 1.0] and facts["same"] is True
    assert facts["ran"] is False
    assert facts["refused"] and facts["refused"].startswith(f"refusing to load {tmp_path / 'bad' / 'optimizer.pt'}")
    assert "weights_only=True" in facts["refused"], facts["refused"]
