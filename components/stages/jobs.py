"""The Ray jobs of a run: submitted (or re-attached to) through the Ray Jobs API, followed to a terminal state
with their log streamed (the Jobs API's log tailing; read whole every ``POLL_S`` where a proxy passes no WebSocket)
to ours and to ``<run dir>/logs/<kind>.log``, stopped on an interrupt (SIGINT, SIGTERM), past their deadline, or
once the run crosses its budget or its deadline (``run.max_cost_usd``, ``run.deadline_h``: ``watch``). Results come
back as ``TPUPIPE`` records in the log (``components.spec.protocol``)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.platforms import Platform, RayJobs, RunContext, get_platform, ledger
from components.platforms.interrupts import on_interrupt, released, signal_name
from components.platforms.redaction import redact
from components.platforms.store import read_json, write_json, write_text
from components.spec import InfraError, names, protocol
from components.spec.protocol import Record
from components.stages import base_weights
from components.workload import budget
from components.workload.derive import JOB_RUNTIME_ENV

POLL_S = 1.0
LOG_SAVE_S = 15.0
TAIL_LINES = 25
STOP_WAIT_S = 20.0  # an interrupt stops the job, then waits this long for Ray to say it ended
# The pipeline's first tasks, side by side: the stages of components.stages.table that wait for none. Checked
# against the table by tests/unit/test_stage_table.py: the stages' functions import this module, so it cannot
# import the table.
FIRST_STAGES = ("snapshot_data",)
# What a stage does with each record of its job's log as it comes (``components.spec.protocol``): kind, payload.
OnRecord = Callable[[str, dict[str, Any]], None]


class JobFailed(InfraError):
    """A Ray job of the run ended FAILED or STOPPED; the message carries the job's own error."""


class LimitCrossed(JobFailed):
    """The run crossed its budget or its deadline while a job ran: the job was stopped. The message begins
    ``stopped: budget`` or ``stopped: deadline`` and gives the figures."""


def log(message: str) -> None:
    print(message, flush=True)


@dataclass
class _Follow:
    """What following a job has seen so far: the log length, the whole text, its lines as shown (redacted), the
    records, when the log was saved and how many of those lines."""

    nonce: str = ""  # the job's record nonce (``protocol``): only its records count
    before: str = ""  # the log of the attempts before this one (``run_job``: evicted), saved ahead of its own
    seen: int = 0
    text: str = ""
    # The complete lines of ``text``, each redacted once, as it came: a secret must be registered
    # (``redaction.register``) before the job's log is followed, as the stages that read one do.
    shown: list[str] = field(default_factory=list)
    # The last of them that was not blank and those after it, as they came: a credential's name and its value are
    # apart by whitespace alone (``redaction``'s shapes), so this is what a value in the next chunk is redacted with.
    context: list[str] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    saved_at: float = 0.0
    saved: int = 0  # of ``shown``


def _save_log(ctx: RunContext, kind: str, state: _Follow, force: bool = False) -> None:
    """The job's log in the run's store (``logs/<kind>.log``), redacted (a job may print a secret): on this machine
    the lines new since the last save appended as they come, in Cloud Storage the whole log at most every
    ``LOG_SAVE_S`` (one object write each); always at the end. Each line is redacted once, as it comes (``_take``):
    redacting and rewriting the whole log on every chunk of a long job cost the stage's process a core's third by
    4,000 FSDP steps (a 2.8 MB log), beside the training on the same machine."""
    if state.saved == len(state.shown):
        return
    root = ctx.store.local()
    if root is not None and state.saved:
        with open(root / "logs" / f"{kind}.log", "a") as f:
            f.write("".join(line + "\n" for line in state.shown[state.saved :]))
    elif force or root is not None or time.monotonic() - state.saved_at >= LOG_SAVE_S:
        write_text(ctx.store, f"logs/{kind}.log", redact(state.before) + "".join(f"{line}\n" for line in state.shown))
    else:
        return
    state.saved_at, state.saved = time.monotonic(), len(state.shown)


def runtime_env(ctx: RunContext) -> dict[str, Any]:
    """The runtime environment of the run's jobs: ``JOB_RUNTIME_ENV``, and ``RAY_ADDRESS`` naming the run's own
    cluster where the ledger records its address (the local platform), so that nothing of Ray's in the job (Ray Train's
    PlacementGroupCleaner, say) looks for "the" cluster on a machine that holds several; and the base weights' cached
    copy (``components.stages.base_weights``). A job's tasks and actors inherit its ``env_vars``, merged with their
    own (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html, "Inheritance")."""
    address = ledger.gcs_address(ctx.store)
    own = {**({"RAY_ADDRESS": address} if address else {}), **base_weights.job_env(ctx)}
    return {**JOB_RUNTIME_ENV, "env_vars": {**JOB_RUNTIME_ENV["env_vars"], **own}}


def submit_or_attach(
    client: RayJobs, ctx: RunContext, kind: str, entrypoint: str, state: _Follow | None = None, submission_id: str = ""
) -> str:
    """Submit the run's ``kind`` job under its derived submission id (``submission_id``: an attempt's,
    ``attempt_id``) with a record nonce of its own, or re-attach to it when it exists (a retried task), its nonce read
    back from the job's metadata; the nonce goes to ``state``. Returns the submission id."""
    submission_id = submission_id or names.job_submission_id(ctx.run_id, kind)
    state = state if state is not None else _Follow()
    try:
        info = client.get_job_info(submission_id)
        state.nonce = (info.metadata or {}).get(protocol.NONCE_METADATA, "")
        log(f"{kind}: re-attaching to job {submission_id} ({info.status})")
    except Exception:  # noqa: BLE001 - the Jobs API raises a plain error for an unknown job
        state.nonce = protocol.new_nonce()
        env = runtime_env(ctx)
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env={**env, "env_vars": {**env["env_vars"], protocol.NONCE_ENV: state.nonce}},
            metadata={names.RUN_LABEL: ctx.run_id, "kind": kind, protocol.NONCE_METADATA: state.nonce},
        )
        log(f"{kind}: submitted Ray job {submission_id}")
    return submission_id


def _take(
    new: str,
    kind: str,
    state: _Follow,
    ctx: RunContext,
    on_record: OnRecord | None,
    final: bool = False,
) -> None:
    """Log text new since the last: print its complete lines (a line cut between two chunks waits for its end, unless
    ``final``), keep the file copy, parse their records."""
    state.text += new
    end = len(state.text) if final else state.text.rfind("\n") + 1
    if end <= state.seen:
        return
    lines = state.text[state.seen : end].splitlines()
    state.seen = end
    # Redacted after the last line before them that was not blank: a credential's value may follow its name there
    block = [*state.context, *lines]
    shown = redact("\n".join(block)).split("\n")[len(state.context) :]
    state.shown += shown
    state.context = block[max((i for i, line in enumerate(block) if line.strip()), default=0) :]
    _save_log(ctx, kind, state)
    for line in shown:
        print(f"  [{kind}] {line}", flush=True)
    for rec in protocol.parse(lines, state.nonce):
        state.records.append(rec)
        if on_record:
            on_record(*rec)


def _stream(
    client: RayJobs,
    submission_id: str,
    kind: str,
    state: _Follow,
    ctx: RunContext,
    on_record: OnRecord | None,
    timeout_s: float,
) -> None:
    """Follow the job's log as Ray writes it (the Jobs API's log tailing, a WebSocket) until the job ends. Raises
    TimeoutError past ``timeout_s``, _NoStream when the stream cannot be opened or breaks."""

    import aiohttp

    async def follow() -> None:
        try:
            async for chunk in client.tail_job_logs(submission_id):
                _take(chunk, kind, state, ctx, on_record)
        except (aiohttp.ClientError, RuntimeError, OSError) as exc:
            raise _NoStream(str(exc) or type(exc).__name__) from exc

    asyncio.run(asyncio.wait_for(follow(), timeout=max(timeout_s, 0.001)))
    if not client.get_job_status(submission_id).is_terminal():
        raise _NoStream("the stream ended before the job")


class _NoStream(Exception):
    """The job's log cannot be streamed (a proxy that does not pass WebSockets): it is polled instead."""


def _poll(
    client: RayJobs,
    submission_id: str,
    kind: str,
    state: _Follow,
    ctx: RunContext,
    on_record: OnRecord | None,
    deadline: float,
    sleep: Callable[[float], None] = time.sleep,
    watched: budget.Watch | None = None,
) -> None:
    """Follow the job by reading its whole log every ``POLL_S`` until it ends. Raises TimeoutError past ``deadline``,
    or once the run crossed one of the limits ``watched``."""
    while True:
        status = client.get_job_status(submission_id)
        text = client.get_job_logs(submission_id)
        _take(text[len(state.text) :], kind, state, ctx, on_record)
        if status.is_terminal():
            return
        if time.monotonic() > deadline or (watched is not None and watched.crossed(time.time())):
            raise TimeoutError
        sleep(POLL_S)


def watch(ctx: RunContext) -> budget.Watch:
    """The run's budget and deadline as its platform holds it to them (``Platform.limits``), and the instants they
    count from, read from the stages' records: provision's end (the chips bill from there; the convention of
    ``report.before_training``) and the start of the run's first stage."""
    # The run's clock starts with its first stage; provision and build_image follow it side by side (whichever a
    # runner starts first counts when the first stage left no record).
    starting = (*FIRST_STAGES, "provision", "build_image")
    records = {stage: read_json(ctx.store, f"stages/{stage}.json") or {} for stage in starting}
    provision = records["provision"]
    billing = provision["started"] + provision["seconds"] if provision.get("status") == "succeeded" else None
    started = min((r["started"] for r in records.values() if r.get("started") is not None), default=None)
    return budget.Watch(get_platform(ctx.platform).limits(ctx), billing, started)


def _stop(client: RayJobs, submission_id: str, kind: str, why: str, wait_s: float = STOP_WAIT_S) -> None:
    """Stop the run's ``kind`` job and wait (briefly) until Ray says it ended: what an interrupt and a crossed limit
    do."""
    log(f"{kind}: {why}: stopping job {submission_id}")
    try:
        client.stop_job(submission_id)
    except Exception:  # noqa: BLE001 - not submitted yet, or already gone: nothing runs
        return
    if wait_s <= 0:  # asked to stop; whether it did is not waited for
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not client.get_job_status(submission_id).is_terminal():
        time.sleep(0.5)
    status = client.get_job_status(submission_id)
    log(f"{kind}: job {submission_id} {getattr(status, 'value', status)}")


def _stopper(client: RayJobs, submission_id: str, kind: str, wait_s: float = STOP_WAIT_S) -> Callable[[int], None]:
    """What an interrupt does to the run's ``kind`` job: stop it and wait (briefly) until Ray says it ended; not
    wait at all when the stop already started deleting the cluster it runs on (``interrupts.released``: a cancelled
    Vertex AI task, whose grace period is better spent on its deletes)."""

    def stop(signum: int) -> None:
        _stop(client, submission_id, kind, signal_name(signum), 0.0 if released() else wait_s)

    return stop


def attempt_id(run_id: str, kind: str, attempt: int) -> str:
    """The submission id of the run's ``kind`` job's ``attempt`` (1, then 2 after an eviction...): derived from the run
    and the attempt, so a retried task re-attaches to the attempt that runs."""
    first = names.job_submission_id(run_id, kind)
    return first if attempt == 1 else f"{first}-{attempt}"


def _attempts(ctx: RunContext, kind: str) -> tuple[list[dict[str, Any]], str, list[Record]]:
    """The evictions the run's ``kind`` job has had (a retried task's, from the store), the log of the attempts they
    ended and those attempts' records."""
    evictions = (read_json(ctx.store, f"jobs/{kind}.json") or {}).get("evictions", [])
    text, records = "", list[Record]()
    for number, eviction in enumerate(evictions, 1):
        own = ctx.store.read_text(f"logs/{kind}.{number}.log") or ""
        text += own + _evicted_line(kind, eviction)
        records += protocol.parse(own.splitlines(), eviction["nonce"])
    return evictions, text, records


def _evicted_line(kind: str, eviction: dict[str, Any]) -> str:
    return f"--- {kind}: job {eviction['submission_id']} lost: {eviction['reason']} ---\n"


def run_job(
    ctx: RunContext,
    kind: str,
    entrypoint: str,
    timeout_s: float,
    on_record: OnRecord | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Submit (or re-attach to) the run's ``kind`` job, stream its log, wait for a terminal state, and return its
    ``TPUPIPE result`` record. An interrupt (SIGINT, SIGTERM) stops the job; so does its deadline, which also bounds
    the platform's retries of transient errors, and so does the run's crossing its budget or its deadline (``watch``:
    :class:`LimitCrossed`). ``sleep``: the wait between two reads of the log (injected in tests).

    A job lost because the platform took the run's cluster back (``Platform.evicted``: Kueue evicted it) is submitted
    again once the cluster is given back and ready (``Platform.wait_to_run_again``, within the run's deadline; the wait
    does not count against the job's own), as a new attempt (``attempt_id``); the trainers resume from the newest
    checkpoint of the run. At most ``EVICTIONS`` times, apart from the trainer's own failures (``train.max_failures``);
    each is in the result's ``evictions``, with its waits, and the records are every attempt's, in order."""
    deadline = time.monotonic() + timeout_s
    platform = get_platform(ctx.platform)
    watched = watch(ctx)
    for line in watched.lines(time.time()):
        log(f"{kind}: {line}")
    evictions, before, records = _attempts(ctx, kind)
    while True:
        if evictions and "ready_at" not in evictions[-1]:  # a retried task, lost while it waited: it waits again
            deadline += _wait_again(ctx, platform, kind, evictions)
        submission_id = attempt_id(ctx.run_id, kind, len(evictions) + 1)
        state = _Follow(before=before, records=list(records))
        client = platform.job_client(ctx, deadline)
        try:
            _follow(client, ctx, kind, submission_id, entrypoint, state, on_record, deadline, timeout_s, sleep, watched)
            break
        except LimitCrossed:
            raise
        except InfraError as exc:  # JobFailed among them: lost with its cluster, or failed of itself
            reason = platform.evicted(ctx)
            if reason is None:
                raise
            evictions.append({"submission_id": submission_id, "nonce": state.nonce, "reason": reason})
            evictions[-1]["evicted_at"] = time.time()
            write_text(ctx.store, f"logs/{kind}.{len(evictions)}.log", redact(state.text))
            write_json(ctx.store, f"jobs/{kind}.json", {"evictions": evictions})  # a retried task goes on from here
            if len(evictions) > EVICTIONS:
                raise JobFailed(
                    f"{kind}: job {submission_id} lost to an eviction again ({reason}): {len(evictions)} evictions, "
                    f"past the {EVICTIONS} after which a job is submitted again; the run stops here. Run it again when "
                    "the capacity is less contended, or with a higher gke.priority_class"
                ) from exc
            log(f"{kind}: job {submission_id} lost: {reason}")
            before, records = before + state.text + _evicted_line(kind, evictions[-1]), state.records
            deadline += _wait_again(ctx, platform, kind, evictions)
    result = next((p for k, p in reversed(state.records) if k == "result"), None)
    if result is None:
        raise JobFailed(f"{kind}: job {submission_id} succeeded but printed no result record")
    return {"submission_id": submission_id, "records": state.records, "result": result, "evictions": evictions}


def _follow(
    client: RayJobs,
    ctx: RunContext,
    kind: str,
    submission_id: str,
    entrypoint: str,
    state: _Follow,
    on_record: OnRecord | None,
    deadline: float,
    timeout_s: float,
    sleep: Callable[[float], None],
    watched: budget.Watch,
) -> None:
    """One attempt of the job: submitted or re-attached to, followed to its end; JobFailed unless it SUCCEEDED."""
    from ray.job_submission import JobStatus

    try:
        with on_interrupt(_stopper(client, submission_id, kind), log=log):
            submit_or_attach(client, ctx, kind, entrypoint, state, submission_id)
            try:
                try:
                    # The stream is followed until the job ends, its deadline, or the instant the run crosses a limit.
                    stop_at = watched.stop_at()
                    until = min(deadline - time.monotonic(), math.inf if stop_at is None else stop_at - time.time())
                    _stream(client, submission_id, kind, state, ctx, on_record, until)
                except _NoStream as exc:
                    log(f"{kind}: cannot stream the job's log ({exc}); reading it every {POLL_S:.0f}s")
                    _poll(client, submission_id, kind, state, ctx, on_record, deadline, sleep, watched)
            except TimeoutError:
                crossed = watched.crossed(time.time(), slack_s=1.0)  # a timer may wake a moment early
                if crossed:
                    _stop(client, submission_id, kind, crossed.removeprefix("stopped: "))
                    raise LimitCrossed(crossed) from None
                client.stop_job(submission_id)
                raise JobFailed(
                    f"{kind}: job {submission_id} ran past its deadline of {timeout_s:.0f}s; stopped"
                ) from None
    finally:
        _take("", kind, state, ctx, on_record, final=True)
        _save_log(ctx, kind, state, force=True)
    info = client.get_job_info(submission_id)
    crossed = watched.crossed(time.time()) if info.status == JobStatus.STOPPED else None
    if crossed:  # stopped as the run crossed a limit, by an attempt before this one (a retried task re-attached)
        raise LimitCrossed(crossed)
    if info.status != JobStatus.SUCCEEDED:
        tail = redact("\n".join(state.text.splitlines()[-TAIL_LINES:]))  # the error goes to the stage's record
        raise JobFailed(  # Ray's message of a failed entrypoint carries the job's log too (job_manager.py)
            f"{kind}: Ray job {submission_id} {info.status}: {redact(info.message or '')}\n"
            f"--- last lines of {ctx.store.uri}/logs/{kind}.log ---\n{tail}"
        )


# How many times a job lost to an eviction is submitted again; the next eviction fails the stage.
EVICTIONS = 3


def _wait_again(ctx: RunContext, platform: Platform, kind: str, evictions: list[dict[str, Any]]) -> float:
    """Wait until the run's cluster is back (``Platform.wait_to_run_again``), the waits recorded with the eviction;
    its seconds."""
    started = time.monotonic()
    log(f"{kind}: waiting for the cluster to be given back; then the job is submitted again")
    evictions[-1].update(platform.wait_to_run_again(ctx))
    write_json(ctx.store, f"jobs/{kind}.json", {"evictions": evictions})
    again = attempt_id(ctx.run_id, kind, len(evictions) + 1)
    log(f"{kind}: submitting the job again as {again}: the trainer resumes from the run's newest checkpoint")
    return time.monotonic() - started
