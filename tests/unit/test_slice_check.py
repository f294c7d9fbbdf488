"""The slice check's pure parts: ranks from where each actor runs, the expected all-reduce, the spec's switch and
testing aid, the job command, and what the summary says."""

from __future__ import annotations

import pytest

from components.spec import SpecError
from components.workload import derive, resolve
from trainers import slice_check, slice_probe


def _actor(node: str, worker_id=None, ids=(), slice_name="", host=""):
    return {
        "node_id": node,
        "worker_id": worker_id,
        "accelerator_ids": list(ids),
        "slice": slice_name,
        "host": host or node,
    }


def test_rank_is_worker_id_times_devices_per_host_plus_accelerator_id():
    # A v6e 2x4-like slice: 2 hosts x 4 chips, the bundles placed in no particular order.
    infos = [
        _actor("b", "1", ["2"]),
        _actor("a", "0", ["0"]),
        _actor("b", "1", ["0"]),
        _actor("a", "0", ["3"]),
        _actor("a", "0", ["1"]),
        _actor("b", "1", ["3"]),
        _actor("a", "0", ["2"]),
        _actor("b", "1", ["1"]),
    ]
    assert slice_check.assign_ranks(infos, 4, per_device=True) == [6, 0, 4, 3, 1, 7, 2, 5]


def test_emulated_hosts_without_worker_ids_rank_by_bundle_order_and_slices_follow_one_another():
    assert slice_check.assign_ranks([_actor("x"), _actor("y")], 1, per_device=True) == [0, 1]
    infos = [
        _actor("s1h0", "0", slice_name="s1"),
        _actor("s0h1", "1", slice_name="s0"),
        _actor("s0h0", "0", slice_name="s0"),
        _actor("s1h1", "1", slice_name="s1"),
    ]
    assert slice_check.assign_ranks(infos, 4, per_device=False) == [2, 1, 0, 3]


def test_two_actors_on_one_rank_are_named():
    with pytest.raises(ValueError, match="rank 0 on host-a"):
        slice_check.assign_ranks(
            [_actor("a", "0", ["0"], host="host-a"), _actor("a", "0", ["0"], host="host-a")], 2, per_device=True
        )


def test_the_all_reduce_of_rank_plus_one_is_n_n_plus_one_over_two():
    assert [slice_check.expected_sum(n) for n in (1, 2, 4, 16)] == [1, 3, 10, 136]


def test_the_reference_block_is_x_plus_silu_of_x_w1_times_w2():
    import numpy as np

    x, w1, w2 = slice_probe._block()
    assert x.dtype == w1.dtype == w2.dtype == np.float32 and w1.shape == (64, 256)
    h = x.astype(np.float64) @ w1
    expected = x + (h * (1 / (1 + np.exp(-h)))) @ w2
    assert np.allclose(slice_probe.reference(x, w1, w2), expected, atol=1e-5)


def test_the_check_job_carries_the_devices_each_host_checks():
    command = derive.job_command(resolve("gemma4-e2b-tpu7x-16"), "check", "/data/runs/r", "r")
    assert command.startswith("python -m trainers.slice_check torch ") and command.endswith("--devices-per-host 8")
    command = derive.job_command(resolve("local-maxtext"), "check", "/out", "r")
    assert command.startswith("python -m trainers.slice_check jax ") and command.endswith("--devices-per-host 2")
    assert " -- " not in command  # MaxText's own arguments are for train and eval only
    assert derive.check_ranks(resolve("gemma4-e2b-v6e-16")) == 16
    assert derive.check_ranks(resolve("llama3-8b-v6e-16x2")) == 8
    assert derive.check_ranks(resolve("local-fsdp")) == 2


@pytest.mark.parametrize("value", ["-2", "2"])
def test_the_corrupt_rank_must_be_none_or_one_of_the_ranks(value):
    with pytest.raises(SpecError, match="cluster.slice_check_corrupt_rank"):
        resolve("local-fsdp", f"cluster.slice_check_corrupt_rank={value}")
    assert resolve("local-fsdp", "cluster.slice_check_corrupt_rank=1").cluster.slice_check_corrupt_rank == 1


def test_a_run_without_the_check_says_so_and_its_dry_run_lists_no_check_job(tmp_path):
    from components.platforms import RunContext
    from components.platforms.gke.platform import GkePlatform
    from components.platforms.store import LocalStore
    from components.stages import report, runner

    spec = resolve("gemma4-e2b-v6e-16", "gke.project=my-project cluster.slice_check=false")
    ctx = RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path), platform="gke")
    assert "check_slice" not in "\n".join(GkePlatform().dry_run(ctx, lambda mode: mode))
    assert runner.check_slice(ctx) == {"skipped": True, "reason": "cluster.slice_check=false"}
    summary = report.summarize(ctx)
    assert summary["slice_check"] == {"skipped": True, "reason": "cluster.slice_check=false"}
    assert "slice check          off (cluster.slice_check=false)" in report.format_table(summary)
