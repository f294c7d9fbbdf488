import socket

import pytest

from components.platforms.local import cluster, envs
from components.platforms.local.platform import LocalPlatform
from components.platforms.local.ports import allocate_ports, port_is_free, port_range
from components.platforms.waiting import DeadlineExceeded, wait_for


def test_allocated_ports_are_distinct_and_free():
    nodes = allocate_ports(3, seed=7)
    assert len(nodes) == 4 and "dashboard-port" in nodes[0] and "dashboard-port" not in nodes[1]
    ports = []
    for node in nodes:
        ports += [p for k, p in node.items() if not k.endswith("worker-port")]
        ports += range(node["min-worker-port"], node["max-worker-port"] + 1)
    assert len(ports) == len(set(ports))
    assert all(port_is_free(p) for p in ports[:10])
    low, high = port_range()
    assert all(low <= p < high for p in ports)


def test_ports_are_chosen_below_the_ephemeral_range_any_connection_may_take(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert port_range(str(tmp_path / "range")) == (10000, 32768)
    (tmp_path / "range").write_text("15000 65000\n")  # a narrow gap below: still a usable range
    assert port_range(str(tmp_path / "range")) == (10000, 15000)


def test_port_is_free_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not port_is_free(s.getsockname()[1])


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_wait_for_returns_when_ready_and_steps_the_clock():
    clock, answers = FakeClock(), iter([None, None, 3])
    assert wait_for(lambda: next(answers), timeout_s=10, what="x", clock=clock, sleep=clock.sleep) == 3
    assert clock.now == 2.0


def test_wait_for_deadline_names_what_it_waited_for():
    clock = FakeClock()
    with pytest.raises(DeadlineExceeded, match="3 nodes"):
        wait_for(lambda: None, timeout_s=5, what="3 nodes", clock=clock, sleep=clock.sleep)
    assert clock.now == 5.0


def test_image_digest_is_per_image_and_stable():
    assert envs.image_digest("torch") == envs.image_digest("torch")
    assert envs.image_digest("torch") != envs.image_digest("pipeline")
    with pytest.raises(ValueError, match="image: unknown image"):
        envs.image_digest("nope")


def test_a_disk_with_less_free_space_than_a_run_needs_is_a_clear_error(tmp_path):
    cluster.check_disk(tmp_path, min_free=1)  # a byte is free: passes, however full the disk is in percent
    with pytest.raises(RuntimeError, match=r"has .* GiB free; a local run needs at least .* GiB there"):
        cluster.check_disk(tmp_path, min_free=1 << 60)


def test_the_hosts_turn_off_rays_disk_fraction_rule():
    # A shared disk 99% used can still hold many GiB; the free-space check above is the rule instead.
    env = cluster.host_environment("r", "127.0.0.1:1", envs.Env("torch", "d", "/e", True), "/t")
    assert env["RAY_local_fs_capacity_threshold"] == "1"


def test_a_model_directory_that_is_not_there_is_refused_before_anything_starts(tmp_path):
    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.spec import SpecError
    from components.workload import resolve

    def ctx(model_id):
        return RunContext(
            spec=resolve("local-fsdp", {"model_id": model_id}), run_id="r", store=LocalStore(tmp_path), platform="local"
        )

    with pytest.raises(SpecError, match="train.model_id: directory not found: /no/such/model"):
        LocalPlatform().check(ctx("/no/such/model"))
    LocalPlatform().check(ctx(str(tmp_path)))
    LocalPlatform().check(ctx("google/gemma-4-E2B-it"))


def test_every_process_of_a_local_run_names_its_own_cluster(tmp_path):
    """Two runs on one machine: each host's environment (and so every process Ray starts there, Ray Train's
    PlacementGroupCleaner among them) and each job's runtime environment carry the run's own GCS address, so nothing
    of Ray's looks for "the" cluster and finds both."""
    from components.platforms import RunContext, ledger
    from components.platforms.local.processes import RUN_MARKER
    from components.platforms.store import LocalStore
    from components.stages.jobs import runtime_env
    from components.workload import resolve

    image = envs.Env(image="torch", digest="0", path=str(tmp_path / "env"), reused=True)
    host = cluster.host_environment("run-a", "127.0.0.1:12345", image, "/tmp/tp-x/auth_token")
    assert host["RAY_ADDRESS"] == "127.0.0.1:12345" and host[RUN_MARKER] == "run-a"
    assert host["RAY_AUTH_MODE"] == "token" and host["RAY_AUTH_TOKEN_PATH"] == "/tmp/tp-x/auth_token"
    ctx = RunContext(spec=resolve("local-fsdp"), run_id="run-a", store=LocalStore(tmp_path / "run-a"), platform="local")
    assert "RAY_ADDRESS" not in runtime_env(ctx)["env_vars"]  # no cluster recorded (gke: KubeRay's pods name theirs)
    ledger.replace(ctx.store, {"run_id": "run-a", "gcs_address": "127.0.0.1:12345", "processes": []})
    assert runtime_env(ctx)["env_vars"] == {
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "1",  # the preemption watcher's poll, where a worker group has one
        "RAY_ADDRESS": "127.0.0.1:12345",
    }


def test_the_ray_temp_dir_is_private_and_unpredictable(tmp_path):
    """Ray keeps its sockets, session files and logs under the temp dir: made now with mode 0700 under a random
    name, so no other local user can pre-create it or read it, and no run id predicts it."""
    import os
    import shutil
    import stat

    from components.platforms import RunContext
    from components.platforms.store import LocalStore
    from components.workload import resolve

    ctx = RunContext(spec=resolve("smoke"), run_id="same", store=LocalStore(tmp_path / "same"), platform="local")
    env = envs.env_for("torch")
    first, second = (cluster.new_ledger(ctx, env)["temp_dir"] for _ in range(2))
    try:
        assert first != second and "same" not in first
        for made in (first, second):
            assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    finally:
        shutil.rmtree(first, ignore_errors=True)
        shutil.rmtree(second, ignore_errors=True)
