"""Recovery after a lost host: the bench's reading of a run's log into where the seconds went
(bench/bench_recovery.py), the restore's reads one file a thread (trainers.checkpoints.read_files_in_parallel), and
the local hosts' settings that notice a lost host sooner (components.platforms.local.cluster)."""

import dataclasses
import threading
import time

import pytest

from bench import bench_recovery
from components.platforms.local import cluster, envs
from components.spec import protocol
from trainers import checkpoints


def _log(*records: tuple[str, dict]) -> str:
    return "\n".join(f"(RayTrainWorker pid=1) {protocol.line(kind, p, nonce='ab12')}" for kind, p in records)


def test_the_recovery_is_split_at_the_new_groups_start_and_its_restore():
    log = _log(
        ("event", {"event": "worker_group_started", "time": 100.0, "world_size": 2}),
        *[("event", {"event": "step", "step": s, "time": 100.0 + s}) for s in range(1, 7)],
        ("event", {"event": "worker_group_started", "time": 115.0, "world_size": 2}),
        ("event", {"event": "restored", "step": 4, "seconds": 1.5, "time": 119.0}),
        ("event", {"event": "step", "step": 5, "time": 120.0}),
    )
    found = bench_recovery.recovery(bench_recovery.timeline(log), killed_at=106.5)
    assert found["recovery_s"] == pytest.approx(13.5)  # the kill to the new group's first step
    assert found["trainer_started_s"] == pytest.approx(8.5)
    assert found["setup_before_restore_s"] == pytest.approx(2.5)  # 115 to the restore's start, 117.5
    assert found["restore_s"] == 1.5 and found["restore_to_first_step_s"] == pytest.approx(1.0)
    assert found["steps_repeated"] == 2 and found["last_step_before_kill"] == 6  # steps 5 and 6 trained again


def test_a_recovery_without_a_timed_restore_has_no_restore_parts():
    log = _log(
        ("metric", {"step": 1, "time": 1.0}),
        ("event", {"event": "worker_group_started", "time": 5.0, "launched": 3.0, "restore_step": 0}),
        ("metric", {"step": 1, "time": 9.0}),
    )
    found = bench_recovery.recovery(bench_recovery.timeline(log), killed_at=2.0)
    assert found["train_function_launched_s"] == 1.0 and "restore_s" not in found


@dataclasses.dataclass
class _Item:
    storage_index: str


@dataclasses.dataclass
class _Plan:  # DCP's LoadPlan's shape: the items, and what replace() must carry over
    items: list
    planner_data: str = "kept"


def test_a_restore_reads_its_files_at_once_each_item_once():
    """Two files, each read by DCP's per-file loop: both on threads at once (each waits for the other to have
    started), every item read exactly once, the plan's other fields kept."""
    where = {"a0": {"relative_path": "__0_0.distcp"}, "a1": {"relative_path": "__0_0.distcp"}}
    where["b0"] = {"relative_path": "__1_0.distcp"}
    storage = {k: type("Info", (), v)() for k, v in where.items()}
    both_started, read, lock = threading.Barrier(2, timeout=10), [], threading.Lock()

    def read_data(plan, planner):
        both_started.wait()  # a second file not read until the first is done would time this out
        with lock:
            read.extend((i.storage_index, plan.planner_data, planner) for i in plan.items)
        return _done()

    plan = _Plan([_Item(k) for k in ("a0", "b0", "a1")])
    checkpoints.read_files_in_parallel(read_data, plan, "planner", storage)
    assert sorted(read) == [(k, "kept", "planner") for k in ("a0", "a1", "b0")]


def test_an_error_reading_one_file_is_raised_as_itself():
    storage = {k: type("Info", (), {"relative_path": k})() for k in ("x", "y")}

    def read_data(plan, planner):
        if plan.items[0].storage_index == "y":
            raise OSError("y: short read")
        time.sleep(0.01)
        return _done()

    with pytest.raises(OSError, match="y: short read"):
        checkpoints.read_files_in_parallel(read_data, _Plan([_Item("x"), _Item("y")]), None, storage)


def _done():
    """What DCP's read_data returns: a finished torch.futures.Future, waited on with ``wait``."""
    return type("Finished", (), {"wait": lambda self: None})()


def test_the_local_hosts_notice_a_lost_host_within_seconds():
    env = cluster.host_environment("r", "127.0.0.1:1", envs.Env("torch", "d", "/e", True), "/t")
    detect_ms = int(env["RAY_health_check_period_ms"]) * int(env["RAY_health_check_failure_threshold"])
    assert detect_ms <= 2000  # Ray's default: 3000 ms x 5
    assert "RAY_health_check_timeout_ms" not in env  # a slow, live raylet keeps Ray's own time to answer
    assert float(env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"]) < 2.0  # Ray Train's default poll: 2 s


def test_the_moments_ray_logged_are_read_from_the_nodes_session_logs(tmp_path):
    def at(epoch: float) -> str:  # Ray's log time: this machine's local time, to the millisecond
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) + f",{int(epoch * 1000) % 1000:03d}"

    killed = 1_800_000_000.0
    head, host = tmp_path / "head" / "session_1" / "logs", tmp_path / "host2" / "session_1" / "logs"
    head.mkdir(parents=True)
    host.mkdir(parents=True)
    (head / "gcs_server.out").write_text(
        f"[{at(killed - 60)} W 1 1] (gcs_server) x.cc:88: Node is dead because the health check failed. node_id=old\n"
        f"[{at(killed + 2.25)} W 1 1] (gcs_server) x.cc:88: Node is dead because the health check failed. node_id=a\n"
    )
    (host / "raylet.1.out").write_text(
        f"[{at(killed + 4.5)} I 2 2] (raylet) node_manager.cc:355: Raylet of id, b started. Raylet consists of ...\n"
    )
    found = bench_recovery.ray_moments(tmp_path, killed)
    assert found == {"lost_node_marked_dead_s": pytest.approx(2.25), "replacement_registered_s": pytest.approx(4.5)}
    assert (
        bench_recovery.ray_moments(tmp_path, killed, {"lost_node_marked_dead_s": 1.0})["lost_node_marked_dead_s"] == 1
    )
