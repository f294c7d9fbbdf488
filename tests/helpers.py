"""What the tests share: the repository, the `tpupipe` command (and a local run of it), run ids of this test
session's own, what a finished local run must leave behind, and waiting on a condition with a deadline."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from components.platforms.local.ports import port_is_free
from components.platforms.local.processes import run_processes
from components.platforms.waiting import DeadlineExceeded, wait_for
from components.spec import names

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Made once per test session: two sessions on one machine never share a run id, so neither tears down (kills by the
# run's marker) what the other started.
SESSION = secrets.token_hex(3)


def tpupipe_cmd() -> list[str]:
    return [str(BIN / "tpupipe")]


def unique_run_id(name: str) -> str:
    """``name`` made this test session's own (``e2e-good`` -> ``e2e-good-3fa9c1``), a valid run id."""
    return names.run_id_from(f"{name}-{SESSION}", "")


def tpupipe_run(
    root: Path, run_id: str, *sets: str, tty: bool = False, preset: str | None = None
) -> subprocess.CompletedProcess:
    """`tpupipe run` of ``preset`` (the default one if None) under ``root``, each of ``sets`` one ``--set``; with
    ``tty``, its standard output and error a terminal (a pseudo-terminal: ``stdout`` is what the terminal got, both
    streams, as written)."""
    cmd = [*tpupipe_cmd(), "run", "--run-id", run_id, "--output-root", str(root)]
    cmd += ["--preset", preset] if preset else []
    for s in sets:
        cmd += ["--set", s]
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    import os
    import pty

    main, terminal = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal)
    os.close(terminal)
    out = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not data:
            break
        out += data
    os.close(main)
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(errors="replace"), "")


def assert_nothing_left(run_dir: Path, run_id: str) -> None:
    """No process of the local run alive, and none of the ports its ledger recorded still bound."""
    assert run_processes(run_id) == [], "processes of the run are still alive"
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["processes"], "the run recorded no process"
    ports = [p for node in ledger["ports"] for k, p in node.items() if not k.endswith("worker-port")]
    assert [p for p in ports if not port_is_free(p)] == []


def wait_until[T](
    condition: Callable[[], T],
    timeout_s: float,
    what: str,
    interval_s: float = 0.2,
    detail: Callable[[], object] | None = None,
) -> T:
    """Call ``condition`` until it returns something true (returned); after ``timeout_s``, fail saying what was
    waited for and what was seen: ``detail()``, else the condition's last answer."""
    last: list = [None]

    def poll():
        last[0] = condition()
        return last[0] or None

    try:
        return wait_for(poll, timeout_s=timeout_s, what=what, interval_s=interval_s)
    except DeadlineExceeded:
        seen = detail() if detail else last[0]
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (seen: {seen!r})") from None


def assert_goodput_accounts(summary: dict) -> dict:
    """The run's goodput ledger accounts for its whole wall time and every billed chip-second, each within 2%, the
    wall time and the billed window taken from the stages' own records (first start to last end; provision's end to
    teardown's end, less the time the RayCluster's pods waited for nodes); the ledger's categories by name."""
    g = summary["goodput"]
    spans = [(s["started"], s["started"] + s["seconds"]) for s in summary["stages"] if s.get("started") is not None]
    wall = max(b for _, b in spans) - min(a for a, _ in spans)
    stages = {s["name"]: s for s in summary["stages"]}
    billed = stages["teardown"]["started"] + stages["teardown"]["seconds"]
    billed -= stages["provision"]["started"] + stages["provision"]["seconds"]
    waited = stages["deploy_raycluster"].get("capacity_wait")
    billed -= waited[1] - waited[0] if waited else 0.0
    categories = {c["name"]: c for c in g["categories"]}
    assert abs(sum(c["seconds"] for c in categories.values()) - wall) <= 0.02 * wall, g
    assert abs(g["billed_chip_s"] - billed * g["chips"]) <= 0.02 * billed * g["chips"], g
    assert abs(sum(c["chip_s"] for c in categories.values()) - g["billed_chip_s"]) <= 0.02 * g["billed_chip_s"], g
    assert 0 < g["goodput"] < 1 and categories["productive steps"]["chip_s"] > 0, g
    assert (
        g["goodput"] == round(categories["productive steps"]["chip_s"] / g["billed_chip_s"], 4)
        or abs(g["goodput"] - categories["productive steps"]["chip_s"] / g["billed_chip_s"]) < 1e-3
    )
    return categories


def trainer_steps(log: str) -> list[int]:
    """The steps a trainer's log says it ended, in order (its ``step`` events and per-step metrics), each once."""
    from components.spec import protocol

    seen, steps = set(), []
    for line in log.splitlines():
        match = protocol.RECORD.match(line)
        if not match or match["kind"] not in ("event", "metric"):
            continue
        payload = json.loads(match["body"])
        is_step = payload.get("event") == "step" or (match["kind"] == "metric" and "step" in payload)
        if is_step and "epoch" not in payload and (payload["step"], payload.get("time")) not in seen:
            seen.add((payload["step"], payload.get("time")))
            steps.append(payload["step"])
    return steps


def job_records(text: str) -> list[tuple[str, dict]]:
    """The trainer's records in a job's log (``logs/<job>.log``), each once (Ray may forward a worker's line twice;
    each record carries its time)."""
    from components.spec import protocol

    out, seen = [], set()
    for line in text.splitlines():
        m = protocol.RECORD.match(line)
        if m is None:
            continue
        for kind, payload in protocol.parse([line], m["nonce"]):
            key = json.dumps([kind, payload], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append((kind, payload))
    return out


def assert_no_secret(secrets: list[str], **where: str) -> None:
    """None of ``secrets``, nor its base64 form (as a Kubernetes Secret's data carries it), in any of ``where``'s
    texts (each named by its keyword: the command's output, the run's files, ...)."""
    import base64

    forms = [s for secret in secrets if secret for s in (secret, base64.b64encode(secret.encode()).decode())]
    for name, text in where.items():
        for form in forms:
            assert form not in text, f"a secret in {name}"


def ray_tokens(kube, run_id: str) -> list[str]:
    """The Ray token of run ``run_id``, as the Kubernetes emulator ``kube`` saw it created in the run's Secret (none
    when the run made none)."""
    import base64

    secret = f'"{names.ray_token_secret(run_id)}"'
    bodies = [body for method, _, body in kube.bodies if method == "POST" and secret in body]
    return [base64.b64decode(v).decode() for body in bodies for v in json.loads(body)["data"].values()]


def scorers_tree(root: Path, modules: dict[str, str]) -> Path:
    """A directory to put first on a process's import path: a ``trainers`` package whose files are this checkout's
    (links to them) and whose ``trainers/scorers/`` also holds ``modules`` (module name -> source), as a team adds a
    scorer to the trainer image's code (docs/registry.md, "Where a scorer lives"). ``eval.scorer`` names a module of
    that package only, so a test's own scorer goes there, not on a bare import path."""
    top = root / "scorers-tree"
    trainers, scorers = top / "trainers", top / "trainers" / "scorers"
    scorers.mkdir(parents=True, exist_ok=True)
    for source, target in ((REPO / "trainers", trainers), (REPO / "trainers" / "scorers", scorers)):
        for entry in source.iterdir():
            link = target / entry.name
            if entry.name not in ("scorers", "__pycache__") and not link.exists():
                link.symlink_to(entry)
    for name, text in modules.items():
        (scorers / f"{name}.py").write_text(text)
    return top
