"""FSDP over several slices is HSDP (trainers.mesh): the slice of each host by one rule for the slice check and the
trainer, the mesh's rows by slice, the spec's refusal of workers that do not split over the slices, and, in the torch
trainer environment, the trainer's own step on 4 gloo ranks over a 1x4 and a 2x2 mesh giving the same losses, and the
model sharded from the host through the meta device giving the losses of the whole model sharded where it is."""

from __future__ import annotations

import json
import os

import pytest

from components.spec import SpecError
from components.workload import resolve
from trainers import mesh, slice_check


def test_a_hosts_slice_is_its_tpu_name_else_its_local_host_number_over_the_hosts_of_a_slice():
    assert mesh.slice_name("ray-cluster-workers-1", "ray-cluster-workers-1-0", 2) == "ray-cluster-workers-1"
    # The local platform's hosts host-1..host-4 of 2 slices of 2 hosts: the first two on slice 0.
    assert [mesh.slice_name("", f"host-{n}", 2) for n in (1, 2, 3, 4)] == ["slice-0", "slice-0", "slice-1", "slice-1"]
    assert mesh.slice_name("", "a-pod-name", 2) == mesh.slice_name("", "", 2) == ""  # nothing says: one slice


def test_the_slice_check_ranks_local_hosts_slice_by_slice():
    infos = [
        {"node_id": f"n{n}", "worker_id": None, "accelerator_ids": [], "host": f"host-{n}"}
        | {"slice": mesh.slice_name("", f"host-{n}", 2)}
        for n in (3, 1, 4, 2)  # bundles in no particular order
    ]
    assert slice_check.assign_ranks(infos, 1, per_device=True) == [2, 0, 3, 1]


def test_the_mesh_rows_are_the_ranks_of_each_slice_and_every_slice_holds_as_many():
    assert mesh.layout(["s"] * 4) == [[0, 1, 2, 3]]
    assert mesh.layout(["b", "a", "b", "a"]) == [[1, 3], [0, 2]]  # by slice, whatever the ranks' order
    with pytest.raises(ValueError, match="as many workers on every slice; the workers are on a: 1, b: 2"):
        mesh.layout(["a", "b", "b"])


def test_megascale_environment_names_the_coordinator_the_slices_and_this_ones_index():
    slices = ["s1", "s0", "s0", "s1"]
    assert mesh.megascale_env(slices, 0, "10.0.0.2") == {
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert mesh.megascale_env(["s0", "s0"], 1, "10.0.0.2") == {}


def test_emulated_workers_must_split_evenly_over_the_slices():
    assert resolve("local-fsdp", "cluster.num_hosts=1 cluster.num_slices=2").num_workers == 2
    with pytest.raises(SpecError, match=r"train.num_workers: 3 workers do not split evenly over 2 slices"):
        resolve("local-fsdp", "cluster.num_slices=2 train.num_workers=3")


HSDP = r"""
import json, os, socket, sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers import fsdp, mesh
from trainers.model import build_model, load_tokenizer

SCRATCH = "scratch:gemma4-tiny"
WORLD, STEPS, BATCH, LENGTH = 4, 4, 2, 16


def worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    tokenizer = load_tokenizer(SCRATCH)
    # 4 sequences, each 8 times: every step's batches come from them, so the loss falls as the model learns them.
    ids = torch.randint(0, len(tokenizer), (4, LENGTH), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": ids[i % 4], "labels": ids[i % 4]} for i in range(WORLD * STEPS * BATCH)]
    # One slice of 4 ranks; two slices of 2, the slices' ranks interleaved (placed by slice, not by rank order).
    # The trainer's sharding from the host through the meta device, and the whole model sharded where it is (as the
    # trainer did before), on the 1-D mesh.
    layouts = (("1x4", ["s0"] * 4), ("2x2", ["s1", "s0", "s1", "s0"]), ("1x4-whole", ["s0"] * 4))
    for name, slices in layouts:
        device_mesh = mesh.device_mesh("cpu", mesh.layout(slices))
        if name.endswith("whole"):
            model = mesh.parallelize(build_model(SCRATCH, tokenizer, 0), device_mesh)
        else:
            model = mesh.shard_from_host(build_model(SCRATCH, tokenizer, 0), device_mesh, None, "cpu")
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
        loader = fsdp.data_loader(dataset, BATCH, 0, WORLD, rank)
        losses = [float(mesh.train_step(model, optimizer, batch, "cpu")) for batch in loader]
        out[(name, rank)] = {
            "mesh": mesh.describe(device_mesh),
            "dims": list(device_mesh.mesh_dim_names or []),
            "rows": device_mesh.mesh.tolist(),
            "placements": [type(p).__name__ for p in params[0].placements],
            "local_rows": params[0].to_local().shape[0],
            "rows_whole": params[0].shape[0],
            "losses": losses,
        }
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD)
    print("FACTS " + json.dumps({f"{name}/{rank}": v for (name, rank), v in out.items()}))
"""


@pytest.mark.trainer_env  # runs in the torch trainer environment, which `make test` builds while the fast tiers run
def test_hsdp_over_two_slices_trains_as_fsdp_over_one_on_the_same_ranks(tmp_path):
    """The trainer's own step (``trainers.mesh.train_step``, sharding, sampler) on 4 gloo ranks: a 2x2 mesh shards
    each parameter over the 2 ranks of a slice and replicates it across the slices, and every rank's loss at every
    step is the 1x4 mesh's (the same global batch, the gradients averaged over all 4 ranks either way)."""
    import subprocess

    from components.platforms.local import envs
    from tests.helpers import REPO

    script = tmp_path / "hsdp_facts.py"  # a file: torch.multiprocessing's spawn re-imports the main module
    script.write_text(HSDP)
    # As test_fsdp_device: no torch_tpu autoload. This checkout's trainers first, whichever checkout the torch
    # environment was installed from (its editable install maps ``trainers`` to that one).
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [envs.ensure_env("torch").python, str(script)], cwd=REPO, capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    one, two = facts["1x4/0"], facts["2x2/0"]
    assert (one["mesh"], one["dims"], one["rows"]) == ("mesh (4,)", [], [0, 1, 2, 3])
    assert (two["mesh"], two["dims"]) == ("mesh (replicate=2, shard=2)", ["replicate", "shard"])
    assert two["rows"] == [[1, 3], [0, 2]]  # a row per slice, its ranks sharding
    assert one["placements"] == ["Shard"] and two["placements"] == ["Replicate", "Shard"]
    assert two["local_rows"] == 2 * one["local_rows"] == one["rows_whole"] // 2  # a half per rank, not a quarter
    for rank in range(4):
        fsdp_losses, hsdp_losses = facts[f"1x4/{rank}"]["losses"], facts[f"2x2/{rank}"]["losses"]
        assert len(fsdp_losses) == 4 and fsdp_losses[-1] < fsdp_losses[0]  # it trains
        assert hsdp_losses == pytest.approx(fsdp_losses, rel=1e-5), (rank, fsdp_losses, hsdp_losses)
        # sharded from the host through the meta device: the same weights, so the very same losses
        assert fsdp_losses == facts[f"1x4-whole/{rank}"]["losses"], rank
