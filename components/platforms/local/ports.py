"""The ports of a local cluster: every Ray server of the head and of each emulated host on its own free port of
loopback, below the kernel's ephemeral range, so that two runs on one machine never share one."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from components.spec import InfraError

LOOPBACK = "127.0.0.1"
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
)
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port")
WORKER_PORT_RANGE = 40
PORTS_FROM = 10000


def port_is_free(port: int) -> bool:
    """True if a server could listen on the port now (SO_REUSEADDR, as servers bind: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """Where the cluster's ports are chosen: below the kernel's ephemeral range, whose ports any outgoing connection
    may take between the choice and the bind (a Ray server then fails to start on "Address already in use")."""
    try:
        ephemeral_low = int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    return PORTS_FROM, max(PORTS_FROM + 2000, min(ephemeral_low, 60000))


def _free_block(size: int, taken: set[int], rng: random.Random) -> int:
    """A run of ``size`` consecutive free ports, none in ``taken``; returns the first."""
    low, high = port_range()
    for _ in range(200):
        base = rng.randrange(low, high - size)
        block = range(base, base + size)
        if not taken.intersection(block) and all(port_is_free(p) for p in block):
            taken.update(block)
            return base
    raise InfraError(f"no block of {size} free ports on {LOOPBACK}")


def allocate_ports(num_workers: int, seed: int | None = None) -> list[dict[str, int]]:
    """Ports for the head (index 0) and each worker node: its own ports and its own worker-process range."""
    rng = random.Random(seed)
    taken: set[int] = set()
    nodes = []
    for index in range(num_workers + 1):
        names = (HEAD_PORTS if index == 0 else ()) + NODE_PORTS
        base = _free_block(len(names) + WORKER_PORT_RANGE, taken, rng)
        ports = {name: base + i for i, name in enumerate(names)}
        ports["min-worker-port"] = base + len(names)
        ports["max-worker-port"] = base + len(names) + WORKER_PORT_RANGE - 1
        nodes.append(ports)
    return nodes


def bound(ledger_ports: list[dict[str, int]]) -> list[int]:
    """The servers' ports of a cluster (not its worker ranges) that something still listens on."""
    ports = [p for node in ledger_ports for k, p in node.items() if not k.endswith("worker-port")]
    return [p for p in ports if not port_is_free(p)]
