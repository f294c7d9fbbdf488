"""The slice check: every device of the cluster proves its collectives and its numerics before training starts.

``python -m trainers.slice_check torch|jax --spec JSON --output-dir DIR --run-name NAME --scaling-config JSON
--devices-per-host N`` is the Ray job entrypoint (``components.workload.derive.job_command`` writes it). With Ray
Core it reserves the slice (``ray.util.tpu.slice_placement_group`` on TPU; one CPU bundle per emulated host, strictly
spread, on the local platform) and places one actor per device (torch, as TorchTPU binds a process to one device) or
per host (jax, whose runtime owns every device of its host). Ranks follow the hosts: rank = worker id x devices per
host + accelerator id (slices after one another).

Two steps, so a fault is found where it is (docs/local.md, "The slice check"): first every device computes a
feed-forward block (Linear h->4h, SiLU, Linear 4h->h, residual) alone, against a CPU reference within rtol 1e-3 /
atol 1e-2, before any collective, so a device that computes wrongly is named by itself (its rank, host and device);
then the collectives, of which only the bandwidth is judged when a device failed the first step:

- torch (as the GKE tutorial "Fine-tune models on multi-host TPUs with Ray and TorchTPU" checks its slice,
  docs/tutorials.md): ``MASTER_ADDR`` is the first of ``TPU_WORKER_HOSTNAMES``, then ``init_process_group("tpu_dist")``;
  the block under ``parallelize_module`` (``ColwiseParallel`` on w1, ``RowwiseParallel`` on w2) over every rank, an
  ``all_reduce(SUM)`` of rank + 1 equal to n(n+1)/2, and an all-reduce timed on every rank against the floor
  (:func:`bandwidth_floor`; its size: ``slice_probe.transfer``); below it, timed transfers between rank 0 and each
  rank locate the slow link's host.
- jax: one runtime over every host (``jax.distributed``); the same block with w1's columns and w2's rows sharded over
  every device of every host against a NumPy reference (every addressable shard), a ``psum`` of device index + 1 over
  every device, and a timed psum against the floor.

Hosts without TPU chips (emulated slices, the local platform) run the same code on CPU devices with gloo. The job
prints one ``TPUPIPE result`` record (ranks verified, max abs difference, all-reduce value, bandwidth and floor,
seconds, and the bad ranks or hosts) and exits 1 when one failed. What each actor runs is ``trainers.slice_probe``.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

from components.spec import RunSpec, protocol
from trainers import job_args, mesh, slice_probe
from trainers.slice_probe import Probe, ProbeInfo

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.util.placement_group import PlacementGroup


def expected_sum(world: int) -> int:
    """The all-reduce (SUM) of rank + 1 over ``world`` ranks: 1 + 2 + ... + world."""
    return world * (world + 1) // 2


# ---------------------------------------------------------------- ranks


def assign_ranks(infos: list[ProbeInfo], devices_per_host: int, per_device: bool) -> list[int]:
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


def _reserve(
    spec: RunSpec, scaling: dict[str, Any], devices_per_host: int, per_device: bool, timeout_s: float
) -> tuple[PlacementGroup, int, dict[str, int]]:
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


# libtpu's multislice runtime listens on MEGASCALE_PORT in every process: where several processes share a host (torch,
# one per device) each needs its own. Ray Train's torch backend gives each base + LOCAL_RANK and names the coordinator
# with the base port; its JAX backend, one process a host, the base (ray 2.60.0, ``ray/train/torch/config.py``:
# ``_set_tpu_multislice_env_vars`` and ``_setup_tpu_multislice``; ``ray/util/tpu.py``:
# ``get_tpu_coordinator_env_vars``). The base is Ray's default, ``DEFAULT_MEGASCALE_PORT`` in
# ``ray/_private/accelerators/tpu.py``, and the KubeRay TPU webhook's (``megascalePortBase``,
# https://github.com/ai-on-gke/kuberay-tpu-webhook/blob/main/main.go).
MEGASCALE_BASE_PORT = 8081


def multislice_env(slices: list[str], index: int, master: str, local_rank: int, per_device: bool) -> dict[str, str]:
    """libtpu's multislice environment of actor ``index`` as the trainers' Ray Train workers get theirs (above), the
    slices as the trainer's ranks see them (``trainers.mesh.megascale_env``); empty on one slice."""
    coordinator = f"{master}:{MEGASCALE_BASE_PORT}" if per_device else master
    env = mesh.megascale_env(slices, index, coordinator)
    if env:
        env["MEGASCALE_PORT"] = str(MEGASCALE_BASE_PORT + (local_rank if per_device else 0))
    return env


# The floor on CPU devices (the local platform, emulated TPU hosts): tpupipe's own figure, not a TPU one. A gloo
# all-reduce of 32 MiB over loopback between two processes ran at 0.16 to 0.57 GB/s on a 2-core machine at load 17,
# JAX's psum over two CPU devices at 0.18 GB/s; 0.02 GB/s passes such runs and fails the testing aid's slow host.
CPU_GLOO_FLOOR_GB_S = 0.02


def bandwidth_floor(spec: RunSpec, device: str) -> tuple[float | None, str]:
    """The GB/s the all-reduce's bus bandwidth must reach on every rank, and where it comes from: on TPU the
    catalogue's (ICI within one slice, DCN across slices), on CPU devices the local one."""
    if device == "cpu":
        return CPU_GLOO_FLOOR_GB_S, "tpupipe's floor for CPU gloo over loopback, not a TPU figure"
    from components.tpu import catalogue

    return catalogue.link_floor(spec.cluster.accelerator, spec.cluster.num_slices > 1)


def _bad(index: int, info: ProbeInfo, rank: int | None, why: str, device: str = "") -> dict[str, Any]:
    found = {"rank": rank, "host": info.get("host", f"bundle {index}"), "node_ip": info.get("node_ip"), "error": why}
    return found | ({"device": device} if device else {})


def _gather(
    calls: list[ObjectRef[dict[str, Any]]], infos: list[ProbeInfo], ranks: list[int], timeout_s: float
) -> tuple[list[dict[str, Any] | None], list[dict[str, Any]]]:
    """Each call's result (None where it failed), and the failures with their ranks and hosts."""
    import ray

    done, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
    results: list[dict[str, Any] | None] = []
    bad: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        results.append(None)
        if call not in done:
            bad.append(_bad(i, infos[i], ranks[i], f"no answer within {timeout_s:.0f}s"))
            continue
        try:
            results[i] = ray.get(call)
        except Exception as exc:  # noqa: BLE001 - a rank's own error, reported with its rank and host
            bad.append(_bad(i, infos[i], ranks[i], f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"))
    return results, bad


def slow_links(
    results: list[dict[str, Any] | None], infos: list[ProbeInfo], ranks: list[int], floor: float, source: str
) -> list[dict[str, Any]]:
    """The hosts whose sends ran below the floor, from the links the ranks timed (``slice_probe._links``): a link
    slow one way only is its sender's; slow both ways, both hosts'. Without timed links (the JAX check), every rank's
    all-reduce below the floor, unlocated."""
    index = {rank: i for i, rank in enumerate(ranks)}
    speed = {(link["from"], link["to"]): link["gbytes_per_s"] for r in results if r for link in r["links"]}
    bad = []
    for (sender, receiver), gbs in sorted(speed.items()):
        if gbs >= floor:
            continue
        back = speed.get((receiver, sender), 0.0)
        for culprit, other in ((sender, receiver),) if back >= floor else ((sender, receiver), (receiver, sender)):
            i = index[culprit]
            why = (
                f"the link to host {infos[index[other]]['host']} runs at {gbs:.3g} GB/s, below the floor "
                f"{floor:.3g} GB/s ({source})"
            )
            bad.append(_bad(i, infos[i], None, why))
    if speed or bad:
        return bad
    return [
        _bad(
            i,
            infos[i],
            ranks[i],
            f"all-reduce at {r['gbytes_per_s']:.3g} GB/s, below the floor {floor:.3g} GB/s "
            f"({source}); not located to one link",
        )
        for i, r in enumerate(results)
        if r and r["gbytes_per_s"] is not None and r["gbytes_per_s"] < floor
    ]


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
    infos = ray.get([a.describe.remote(c.num_hosts) for a in actors], timeout=c.slice_check_timeout_s)
    ranks = assign_ranks(infos, devices_per_host, per_device)
    order = sorted(range(count), key=ranks.__getitem__)
    first = infos[order[0]]
    master = (first["worker_hostnames"] or [first["node_ip"]])[0]
    port = ray.get(actors[order[0]].free_port.remote())
    print(
        f"slice check ({kind}): {count} ranks on {len({i['node_id'] for i in infos})} hosts in "
        f"{len({i['slice'] for i in infos})} slices, master {master}:{port}",
        flush=True,
    )
    # First every device alone, before any collective: a device that computes wrongly is named by itself.
    local_calls = []
    slices = [info["slice"] for info in infos]
    for i, actor in enumerate(actors):
        corrupt = ranks[i] == spec.testing.slice_check_corrupt_rank
        local_rank = ranks[i] % devices_per_host if per_device else 0
        megascale = multislice_env(slices, i, master, local_rank, per_device) if scaling.get("use_tpu") else {}
        if per_device:
            local_world = sum(1 for info in infos if info["node_id"] == infos[i]["node_id"])
            env = slice_probe.rank_env(ranks[i], count, local_rank, local_world, master, port)
            local_calls.append(actor.local_torch.remote(env | megascale, corrupt))
        else:
            local_calls.append(
                actor.local_jax.remote(ranks[i], count, f"{master}:{port}", devices_per_host, corrupt, megascale)
            )
    local, bad = _gather(local_calls, infos, ranks, c.slice_check_timeout_s)
    for i in sorted(range(count), key=ranks.__getitem__):
        environ = (local[i] or {}).get("environ")
        if environ:  # torch: what the rank knew of itself before its first tensor
            seen = " ".join(f"{k}={v}" for k, v in environ.items())
            print(f"rank {ranks[i]} (host {infos[i]['host']}) before its first tensor: {seen}", flush=True)
    for i, r in enumerate(local):
        for d in (r or {}).get("devices", []):
            if not d["ok"]:
                why = f"computes the block alone {d['max_abs_diff']:.3g} off the reference, before any collective"
                bad.append(_bad(i, infos[i], ranks[i], why, d["device"]))
    device = next((r["device"] for r in local if r), None)
    floor, source = bandwidth_floor(spec, device) if device else (None, "")
    if device and floor is None:
        print(f"warning: the all-reduce's bandwidth is measured but held to no floor: {source}", flush=True)
    results: list[dict[str, Any] | None] = [None] * count
    if all(local):  # every rank answered: the collectives (a bad device's figures there are not judged: see above)
        calls = []
        for i, actor in enumerate(actors):
            slow = ranks[i] == spec.testing.slice_check_slow_rank
            if per_device:
                calls.append(actor.collectives_torch.remote(slow, floor))
            else:
                calls.append(actor.collectives_jax.remote(slow, floor))
        results, failed = _gather(calls, infos, ranks, c.slice_check_timeout_s)
        bad += failed
    numerics_judged = not bad
    verified = 0
    for i, r in enumerate(results):
        if not r:
            continue
        problems = []
        if numerics_judged and not r["parity"]:
            problems.append(f"tensor-parallel output differs from the reference by {r['max_abs_diff']:.3g}")
        expected = expected_sum(r["num_devices"])
        if numerics_judged and r["all_reduce"] != expected:
            problems.append(f"all-reduce gave {r['all_reduce']:g}, expected {expected}")
        if problems:
            bad.append(_bad(i, infos[i], ranks[i], "; ".join(problems)))
        elif (mine := local[i]) and all(d["ok"] for d in mine["devices"]):
            verified += 1
    if floor is not None:
        bad += slow_links(results, infos, ranks, floor, source)
    bad.sort(key=lambda b: (b["rank"] is None, b["rank"] if b["rank"] is not None else 0, b["host"]))
    got = [r for r in results if r]
    num_devices = got[0]["num_devices"] if got else count * (1 if per_device else devices_per_host)
    result = {
        "ok": not bad,
        "kind": kind,
        "device": device,
        "backend": next((r["backend"] for r in local if r), None),
        "num_ranks": count,
        "num_devices": num_devices,
        "num_hosts": len({i["node_id"] for i in infos}),
        "num_slices": len({i["slice"] for i in infos}),
        "ranks_verified": verified,
        "devices_checked": sum(len(r["devices"]) for r in local if r),
        "max_abs_diff": max((r["max_abs_diff"] for r in got), default=None),
        "all_reduce": got[0]["all_reduce"] if got else None,
        "expected_all_reduce": expected_sum(num_devices),
        "bandwidth_bytes": got[0]["bandwidth_bytes"] if got else slice_probe.transfer(device or "cpu")[0],
        "gbytes_per_s": min((r["gbytes_per_s"] for r in got if r["gbytes_per_s"] is not None), default=None),
        "floor_gbytes_per_s": floor,
        "floor_source": source,
        "seconds": time.monotonic() - started,
        "bad": bad,
        "ranks": [
            {"rank": ranks[i], "host": infos[i]["host"]}
            | {k: r[k] for k in ("max_abs_diff", "all_reduce", "gbytes_per_s", "all_reduce_s") if r}
            | {"devices": (local[i] or {}).get("devices", [])}
            for i, r in sorted(enumerate(results), key=lambda ir: ranks[ir[0]])
        ],
    }
    if bad:
        result["failure"] = failure_message(result)
    return result


def failure_message(result: dict[str, Any]) -> str:
    """One line naming every bad rank (its host, and its device where one computed wrongly) or slow host."""

    def where(b: dict[str, Any]) -> str:
        if b["rank"] is None:
            return f"host {b['host']}"
        return f"rank {b['rank']} (host {b['host']}" + (f", device {b['device']})" if b.get("device") else ")")

    return "slice check failed on " + "; ".join(f"{where(b)}: {b['error']}" for b in result["bad"])


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
