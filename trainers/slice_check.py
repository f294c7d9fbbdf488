"""The slice check: every device of the cluster proves its collectives and its numerics before training starts.

``python -m trainers.slice_check torch|jax --spec JSON --output-dir DIR --run-name NAME --scaling-config JSON
--devices-per-host N`` is the Ray job entrypoint (``components.workload.derive.job_command`` writes it). With Ray
Core it reserves the slice (``ray.util.tpu.slice_placement_group`` on TPU; one CPU bundle per emulated host, strictly
spread, on the local platform) and places one actor per device (torch, as TorchTPU binds a process to one device) or
per host (jax, whose runtime owns every device of its host). Ranks follow the hosts: rank = worker id x devices per
host + accelerator id (slices after one another).

- torch (as the GKE tutorial "Fine-tune models on multi-host TPUs with Ray and TorchTPU" checks its slice,
  docs/tutorials.md): ``MASTER_ADDR`` is the first of ``TPU_WORKER_HOSTNAMES``, then ``init_process_group("tpu_dist")``;
  a feed-forward block (Linear h->4h, SiLU, Linear 4h->h, residual) under ``parallelize_module`` (``ColwiseParallel`` on
  w1, ``RowwiseParallel`` on w2) over every rank must equal the CPU reference within rtol 1e-3 / atol 1e-2, and an
  ``all_reduce(SUM)`` of rank + 1 must be n(n+1)/2 on every rank.
- jax: one runtime over every host (``jax.distributed``); the same block with w1's columns and w2's rows sharded over
  every device of every host against a NumPy reference, and a ``psum`` of device index + 1 over every device.

Hosts without TPU chips (emulated slices, the local platform) run the same code on CPU devices with gloo. The job
prints one ``TPUPIPE result`` record (ranks verified, max abs difference, all-reduce value, seconds, and the bad
ranks with their hosts) and exits 1 when a rank failed. What each actor runs is ``trainers.slice_probe``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from components.spec import RunSpec, protocol
from trainers import job_args
from trainers.slice_probe import Probe


def expected_sum(world: int) -> int:
    """The all-reduce (SUM) of rank + 1 over ``world`` ranks: 1 + 2 + ... + world."""
    return world * (world + 1) // 2


# ---------------------------------------------------------------- ranks


def assign_ranks(infos: list[dict[str, Any]], devices_per_host: int, per_device: bool) -> list[int]:
    """Each actor's rank from where it runs: the host's worker id (``TPU_WORKER_ID``; on emulated CPU hosts, the
    order of the hosts' bundles) after the slices before it, times the devices of a host, plus the accelerator id
    (``per_device``; a device without one takes its place among its host's actors). Raises ValueError naming the
    hosts when two actors get one rank."""
    slices = sorted({i["slice"] for i in infos})
    hosts: dict[tuple[str, str], int] = {}  # (slice, node) -> worker id
    for info in infos:
        key = (info["slice"], info["node_id"])
        if key not in hosts:
            worker_id = info["worker_id"]
            hosts[key] = (
                int(worker_id) if worker_id not in (None, "") else len([k for k in hosts if k[0] == info["slice"]])
            )
    hosts_per_slice = max(1, max(sum(1 for k in hosts if k[0] == s) for s in slices))
    seen_on_host: dict[tuple[str, str], int] = {}
    ranks = []
    for info in infos:
        key = (info["slice"], info["node_id"])
        local = seen_on_host.get(key, 0)
        seen_on_host[key] = local + 1
        if per_device and info["accelerator_ids"]:
            local = int(info["accelerator_ids"][0]) % devices_per_host
        host_index = slices.index(info["slice"]) * hosts_per_slice + hosts[key]
        ranks.append(host_index * (devices_per_host if per_device else 1) + (local if per_device else 0))
    if sorted(ranks) != list(range(len(infos))):
        clash = sorted(
            {
                f"rank {r} on {info['host']}"
                for r, info in zip(ranks, infos, strict=True)
                if ranks.count(r) > 1 or r >= len(infos)
            }
        )
        raise ValueError(f"the devices do not form ranks 0..{len(infos) - 1}: {', '.join(clash)}")
    return ranks


# ---------------------------------------------------------------- the driver


def _reserve(spec: RunSpec, scaling: dict[str, Any], devices_per_host: int, per_device: bool, timeout_s: float):
    """A placement group over the whole cluster: (group, number of bundles, resources of each actor)."""
    import ray
    from ray.util.placement_group import placement_group

    if scaling.get("use_tpu"):
        from ray.util.tpu import get_tpu_version_from_type, slice_placement_group

        from components.tpu import catalogue

        per_chip = catalogue.slice_shape(
            spec.cluster.accelerator, spec.cluster.topology
        ).family.logical_devices_per_chip
        bundle = {"TPU": 1} if per_device else {"TPU": devices_per_host}
        handle = slice_placement_group(
            scaling["topology"],
            get_tpu_version_from_type(scaling["accelerator_type"]),
            resources_per_bundle=bundle,
            num_slices=spec.cluster.num_slices,
            tpu_resource_per_chip=per_chip,
        )
        group, count = handle.placement_group, handle.num_bundles
    else:
        bundle = {"CPU": spec.cluster.cpus_per_host}
        count = spec.total_hosts
        group = placement_group([bundle] * count, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=timeout_s)
    return group, count, bundle


def _bad(index: int, info: dict[str, Any], rank: int | None, why: str) -> dict[str, Any]:
    return {"rank": rank, "host": info.get("host", f"bundle {index}"), "node_ip": info.get("node_ip"), "error": why}


def run(kind: str, spec: RunSpec, scaling: dict[str, Any], devices_per_host: int) -> dict[str, Any]:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    c = spec.cluster
    started = time.monotonic()
    per_device = kind == "torch"
    ray.init(log_to_driver=True)
    group, count, bundle = _reserve(spec, scaling, devices_per_host, per_device, c.slice_check_timeout_s)
    actor_cls = ray.remote(Probe)
    custom = {k: v for k, v in bundle.items() if k != "CPU"}
    actors = [
        actor_cls.options(
            num_cpus=bundle.get("CPU", 0),
            resources=custom,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, i),
        ).remote()
        for i in range(count)
    ]
    infos = ray.get([a.describe.remote() for a in actors], timeout=c.slice_check_timeout_s)
    ranks = assign_ranks(infos, devices_per_host, per_device)
    order = sorted(range(count), key=ranks.__getitem__)
    first = infos[order[0]]
    master = (first["worker_hostnames"] or [first["node_ip"]])[0]
    port = ray.get(actors[order[0]].free_port.remote())
    print(
        f"slice check ({kind}): {count} ranks on {len({i['node_id'] for i in infos})} hosts, master {master}:{port}",
        flush=True,
    )
    calls = []
    for i, actor in enumerate(actors):
        corrupt = ranks[i] == c.slice_check_corrupt_rank
        if per_device:
            local_world = sum(1 for info in infos if info["node_id"] == infos[i]["node_id"])
            calls.append(
                actor.check_torch.remote(
                    ranks[i], count, ranks[i] % devices_per_host, local_world, master, port, corrupt
                )
            )
        else:
            megascale = {}
            if c.num_slices > 1 and scaling.get("use_tpu"):
                slices = sorted({info["slice"] for info in infos})
                megascale = {
                    "MEGASCALE_COORDINATOR_ADDRESS": master,
                    "MEGASCALE_NUM_SLICES": str(c.num_slices),
                    "MEGASCALE_SLICE_ID": str(slices.index(infos[i]["slice"])),
                }
            calls.append(
                actor.check_jax.remote(ranks[i], count, f"{master}:{port}", devices_per_host, corrupt, megascale)
            )
    done, _ = ray.wait(calls, num_returns=len(calls), timeout=c.slice_check_timeout_s)
    results: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    verified = 0
    for i, call in enumerate(calls):
        if call not in done:
            bad.append(_bad(i, infos[i], ranks[i], f"no answer within {c.slice_check_timeout_s:.0f}s"))
            continue
        try:
            result = ray.get(call)
        except Exception as exc:  # noqa: BLE001 - a rank's own error, reported with its rank and host
            bad.append(_bad(i, infos[i], ranks[i], f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"))
            continue
        result |= {"rank": ranks[i], "host": infos[i]["host"]}
        results.append(result)
        problems = []
        if not result["parity"]:
            problems.append(f"tensor-parallel output differs from the reference by {result['max_abs_diff']:.3g}")
        expected = expected_sum(result["num_devices"])
        if result["all_reduce"] != expected:
            problems.append(f"all-reduce gave {result['all_reduce']:g}, expected {expected}")
        if problems:
            bad.append(_bad(i, infos[i], ranks[i], "; ".join(problems)))
        else:
            verified += 1
    bad.sort(key=lambda b: (b["rank"] is None, b["rank"]))
    num_devices = results[0]["num_devices"] if results else count * (1 if per_device else devices_per_host)
    result = {
        "ok": not bad,
        "kind": kind,
        "device": results[0]["device"] if results else None,
        "backend": results[0]["backend"] if results else None,
        "num_ranks": count,
        "num_devices": num_devices,
        "num_hosts": len({i["node_id"] for i in infos}),
        "ranks_verified": verified,
        "max_abs_diff": max((r["max_abs_diff"] for r in results), default=None),
        "all_reduce": results[0]["all_reduce"] if results else None,
        "expected_all_reduce": expected_sum(num_devices),
        "seconds": time.monotonic() - started,
        "bad": bad,
        "ranks": [
            {k: r[k] for k in ("rank", "host", "max_abs_diff", "all_reduce")}
            for r in sorted(results, key=lambda r: r["rank"])
        ],
    }
    if bad:
        result["failure"] = failure_message(result)
    return result


def failure_message(result: dict[str, Any]) -> str:
    """One line naming every bad rank and its host."""
    return "slice check failed on " + "; ".join(
        f"rank {b['rank']} (host {b['host']}): {b['error']}" for b in result["bad"]
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The job's options (``components.workload.derive.job_command`` writes them)."""
    p = job_args.parser(
        "Check every device of the cluster before training.", "the run's job output directory", "the run's name"
    )
    p.add_argument("kind", choices=("torch", "jax"))
    p.add_argument("--devices-per-host", required=True, type=int, help="devices each host checks")
    return job_args.parse(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args.kind, args.spec, args.scaling_config, args.devices_per_host)
    protocol.emit("result", result)
    if not result["ok"]:
        raise SystemExit(result["failure"])


if __name__ == "__main__":
    main()
