"""The slice check's pure parts: ranks from where each actor runs, the expected all-reduce, the spec's switch and
testing aid, the job command, and what the summary says."""

from __future__ import annotations

import os

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


class _FirstTensor(Exception):
    pass


def test_a_torch_ranks_environment_is_complete_before_its_first_tensor(monkeypatch):
    """The probe's process knows its rank, its host's ranks and its master before torch (and with it torch_tpu) is
    imported and before the first tensor: a stand-in ``torch`` module records the environment at the probe's first
    use of it and stops the probe there."""
    import sys
    import types

    for name in slice_probe.RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    seen: list[dict[str, str]] = []

    def first_use(attr):
        seen.append({k: v for k, v in os.environ.items() if k in slice_probe.RANK_ENV or k.startswith("MEGASCALE_")})
        raise _FirstTensor(attr)

    fake = types.ModuleType("torch")
    fake.__getattr__ = first_use  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "torch", fake)
    slices = ["s0"] * 4 + ["s1"] * 4  # 2 slices of one 4-device host
    env = slice_probe.rank_env(5, 8, 1, 4, "10.0.0.2", 29500) | slice_check.multislice_env(
        slices, 5, "10.0.0.2", 1, True
    )
    with pytest.raises(_FirstTensor):
        slice_probe.Probe().local_torch(env, corrupt=False)
    assert seen == [
        {
            "MASTER_ADDR": "10.0.0.2",
            "MASTER_PORT": "29500",
            "WORLD_SIZE": "8",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8081",
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": "1",
            "MEGASCALE_PORT": "8082",
        }
    ]


def test_each_process_of_a_host_listens_on_its_own_megascale_port_as_ray_trains_workers_do():
    slices = ["s0", "s0", "s1", "s1"]  # 2 slices of one host, 2 devices each
    torch_ports = [slice_check.multislice_env(slices, i, "h0", i % 2, True)["MEGASCALE_PORT"] for i in range(4)]
    assert torch_ports == ["8081", "8082", "8081", "8082"]  # base + local rank
    assert slice_check.multislice_env(slices, 3, "h0", 1, True)["MEGASCALE_COORDINATOR_ADDRESS"] == "h0:8081"
    jax = slice_check.multislice_env(["s0", "s1"], 1, "h0", 0, False)  # one process a host: the base
    assert jax == {
        "MEGASCALE_COORDINATOR_ADDRESS": "h0",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_PORT": "8081",
    }
    assert slice_check.multislice_env(["s0", "s0"], 1, "h0", 1, True) == {}  # one slice: none at all


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


@pytest.mark.parametrize("aid", ["slice_check_corrupt_rank", "slice_check_slow_rank"])
@pytest.mark.parametrize("value", ["-2", "2"])
def test_the_testing_aids_name_none_or_one_of_the_ranks(aid, value):
    with pytest.raises(SpecError, match=f"testing.{aid}"):
        resolve("local-fsdp", f"testing.{aid}={value}")
    assert getattr(resolve("local-fsdp", f"testing.{aid}=1").testing, aid) == 1


def test_a_run_without_the_check_says_so_and_its_dry_run_lists_no_check_job(tmp_path):
    from components.platforms import RunContext
    from components.platforms.gke import GkePlatform
    from components.platforms.store import LocalStore
    from components.stages import ray_stages, report

    spec = resolve("gemma4-e2b-v6e-16", "gke.project=my-project cluster.slice_check=false")
    ctx = RunContext(spec=spec, run_id="r", store=LocalStore(tmp_path), platform="gke")
    assert "check_slice" not in "\n".join(GkePlatform().dry_run(ctx, lambda mode: mode))
    assert ray_stages.check_slice(ctx) == {"skipped": True, "reason": "cluster.slice_check=false"}
    summary = report.summarize(ctx)
    assert summary["slice_check"] == {"skipped": True, "reason": "cluster.slice_check=false"}
    assert "slice check          off (cluster.slice_check=false)" in report.format_table(summary)


# ---------------------------------------------------------------- the bandwidth floor and what locates a slow link


def test_the_floor_is_the_catalogues_on_tpu_and_cpu_gloos_locally():
    from components.tpu import catalogue

    assert slice_check.bandwidth_floor(resolve("local-fsdp"), "cpu") == (
        0.02,
        "tpupipe's floor for CPU gloo over loopback, not a TPU figure",
    )
    one = slice_check.bandwidth_floor(resolve("gemma4-e2b-v6e-16"), "tpu")
    assert one == (20.0, "5% of v6e's ICI 800 GB/s bidirectional per chip (Cloud TPU docs)")  # one direction: 400
    two = slice_check.bandwidth_floor(resolve("llama3-8b-v6e-16x2"), "tpu")  # across slices: DCN
    assert two == (0.625, "5% of v6e's DCN 100 Gbps per chip (Cloud TPU docs)")
    tpu7x = slice_check.bandwidth_floor(resolve("gemma4-e2b-tpu7x-16"), "tpu")  # a chip's ICI over its 2 devices
    assert tpu7x == (15.0, "5% of tpu7x's ICI 1200 GB/s bidirectional per chip, over 2 devices a chip (Cloud TPU docs)")
    assert catalogue.link_floor("v5p", False)[0] == 30.0 and catalogue.link_floor("v5e", True)[0] == 25 / 8 * 0.05


def test_the_bus_bandwidth_of_an_all_reduce_and_the_slow_ranks_throttle():
    assert slice_probe.bus_gbytes_per_s(10**9, 2, 1.0) == 1.0  # 2 (n - 1) / n = 1
    assert slice_probe.bus_gbytes_per_s(10**9, 4, 1.0) == 1.5
    assert slice_probe.bus_gbytes_per_s(10**9, 1, 1.0) is None  # one rank moves nothing
    nbytes, _ = slice_probe.transfer("cpu")
    assert nbytes / slice_probe.throttle_s(0.02, nbytes) / 1e9 < 0.02  # held below the floor


def test_on_tpu_the_timed_all_reduce_is_large_and_queued_so_the_link_not_the_dispatch_sets_the_time():
    """At the floor's source, v6e's ICI (400 GB/s one way), one TPU sample's transfers take over 10 ms, where a
    dispatch and a host sync take milliseconds; the CPU check stays small for the local platform."""
    nbytes, repeats = slice_probe.transfer("tpu")
    assert nbytes * repeats / 400e9 > 0.01 and nbytes <= 2**30
    assert slice_probe.transfer("cpu") == (32 * 2**20, 1)


def _rank(links, gbs=0.01):
    return {"links": links, "gbytes_per_s": gbs}


def test_a_link_slow_one_way_is_its_senders_and_slow_both_ways_both_hosts():
    infos = [{"host": f"host-{i}", "node_ip": "10.0.0.1"} for i in range(3)]
    ranks = [0, 1, 2]
    one_way = [  # rank 2 sends slowly to rank 0; every other direction is fast
        _rank([{"from": 1, "to": 0, "gbytes_per_s": 5.0}, {"from": 2, "to": 0, "gbytes_per_s": 0.001}]),
        _rank([{"from": 0, "to": 1, "gbytes_per_s": 5.0}]),
        _rank([{"from": 0, "to": 2, "gbytes_per_s": 5.0}]),
    ]
    bad = slice_check.slow_links(one_way, infos, ranks, 0.02, "floor")
    assert [(b["rank"], b["host"]) for b in bad] == [(None, "host-2")]
    assert bad[0]["error"] == "the link to host host-0 runs at 0.001 GB/s, below the floor 0.02 GB/s (floor)"
    both = [_rank([{"from": 1, "to": 0, "gbytes_per_s": 0.001}]), _rank([{"from": 0, "to": 1, "gbytes_per_s": 0.001}])]
    assert {b["host"] for b in slice_check.slow_links(both, infos[:2], [0, 1], 0.02, "floor")} == {"host-0", "host-1"}
    unlocated = slice_check.slow_links([_rank([]), _rank([], 5.0)], infos[:2], [0, 1], 0.02, "floor")
    assert [(b["rank"], b["host"]) for b in unlocated] == [(0, "host-0")]
    assert "not located to one link" in unlocated[0]["error"]


def test_the_failure_names_a_bad_device_with_its_host_and_a_slow_host_by_itself():
    result = {
        "bad": [
            {"rank": 1, "host": "host-2", "device": "cpu:0", "error": "computes the block alone 0.13 off"},
            {"rank": None, "host": "host-1", "error": "the link to host host-2 runs at 0.01 GB/s"},
            {"rank": 3, "host": "host-4", "error": "no answer within 600s"},
        ]
    }
    assert slice_check.failure_message(result) == (
        "slice check failed on rank 1 (host host-2, device cpu:0): computes the block alone 0.13 off; "
        "host host-1: the link to host host-2 runs at 0.01 GB/s; rank 3 (host host-4): no answer within 600s"
    )


def test_the_summary_says_the_bandwidth_and_its_floor():
    from components.stages import report

    check = {"bandwidth_bytes": 32 * 2**20, "gbytes_per_s": 0.21, "floor_gbytes_per_s": 0.02, "floor_source": "CPU"}
    assert report.bandwidth_line(check) == "all-reduce of 32 MiB: 0.21 GB/s on the slowest rank, floor 0.02 GB/s (CPU)"
    one = {**check, "gbytes_per_s": None, "floor_gbytes_per_s": None, "floor_source": "tpu7x: no documented ICI"}
    assert report.bandwidth_line(one) == (
        "all-reduce of 32 MiB: one rank, no link to time, held to no floor (tpu7x: no documented ICI)"
    )
