"""The local platform's preemption notice (``testing.drain_host_at_step``): the keeper, once the workers' own logs show
the step, gives the last emulated host its notice (``keeper.preempt``: Ray's DrainNode with reason PREEMPTION, which
tests/e2e/test_local_drain.py sends to a real cluster; here a notice that sends the host a SIGTERM stands in), and
kills it just after the notice's deadline; and the hosts' environment turns Ray Train's preemption watcher on only
where a drain is scheduled. Real processes stand in for the hosts."""

import signal
import subprocess
import sys
import time

from components.platforms import procs
from components.platforms.local import cluster, keeper
from components.spec import protocol
from components.workload import resolve

# A host that, as `ray start --block` does, outlives a SIGTERM (it writes that it got it) until it is killed.
HOST = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], 'w').write('SIGTERM'), None))\n"
    "print('up', flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def _host(tmp_path, role):
    marker = tmp_path / f"{role}.sigterm"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST, str(marker)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdout.readline().strip() == "up"  # its handler is in place
    return proc, marker, {"role": role, "pid": proc.pid, "pgid": proc.pid}


def _worker_log(temp_dir, *steps):
    logs = temp_dir / "host1" / "session_1" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    lines = [protocol.line("event", {"event": "step", "step": s, "time": 0.0}, "0a1b") for s in steps]
    with open(logs / "worker-abc.out", "a") as f:
        f.write("".join(line + "\n" for line in lines))


def test_the_keeper_gives_the_last_host_its_notice_at_the_step_and_kills_it_at_the_notice_s_end(tmp_path):
    temp_dir = tmp_path / "tp"
    (h1, m1, host1), (h2, m2, host2) = _host(tmp_path, "host-1"), _host(tmp_path, "host-2")
    ledger = {
        "temp_dir": str(temp_dir),
        "processes": [host1, host2, {"role": "keeper", "pid": 1, "pgid": 1}],
        "spec": {"testing": {"drain_host_at_step": 5}, "cluster": {"preemption_notice_s": 1.0}},
    }
    said: list[str] = []
    notices: list[tuple[str, float]] = []

    def notify(ledger, host, notice_s):
        notices.append((host["role"], notice_s))
        procs.signal_process(host["pid"], signal.SIGTERM)
        return time.time()

    drain = keeper.Drain(notify)
    try:
        _worker_log(temp_dir, 3, 4)
        drain.tick(ledger, said.append)
        assert drain.host is None and not m2.exists()  # step 5 not logged yet
        _worker_log(temp_dir, 5)
        drain.tick(ledger, said.append)
        deadline = time.monotonic() + 10
        while not m2.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m2.read_text() == "SIGTERM" and not m1.exists() and notices == [("host-2", 1.0)]  # the last host
        assert procs.alive(h2.pid)  # a notice, not a kill
        assert said and said[0].startswith(f"host-2 (pid {h2.pid}) preempted at step 5") and "1s notice" in said[0]
        drain.tick(ledger, said.append)
        assert procs.alive(h2.pid)  # the notice is not over
        time.sleep(1.0 + keeper.KILL_AFTER_DEADLINE_S + 0.1)  # after the deadline: Ray records a preemption
        drain.tick(ledger, said.append)
        assert h2.wait(timeout=10) == -signal.SIGKILL
        assert procs.alive(h1.pid) and drain.done
        assert said[-1].startswith(f"host-2 (pid {h2.pid}) killed at the notice's end")
        _worker_log(temp_dir, 6, 7)
        drain.tick(ledger, said.append)  # once a run
        assert len(said) == 2
    finally:
        for proc in (h1, h2):
            proc.kill()
            proc.wait()


def test_no_drain_without_the_aid(tmp_path):
    _worker_log(tmp_path, 50)
    ledger = {"temp_dir": str(tmp_path), "processes": [], "spec": {"cluster": {}}}
    drain = keeper.Drain()
    drain.tick(ledger, print)
    assert drain.host is None and drain.offsets == {}  # the logs not even read


def test_the_watcher_is_on_where_a_drain_is_scheduled():
    scheduled = cluster.preemption_environment(resolve("local-fsdp", "testing.drain_host_at_step=20"))
    assert scheduled == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}
    assert cluster.preemption_environment(resolve("local-fsdp")) == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
