"""How a trainer job tells the pipeline what happened: tagged JSON lines in the job's log.

The Ray Jobs API gives the pipeline the job's log on every platform (locally, and through the Kubernetes
API server's service proxy on GKE), so results travel in it and need no shared filesystem.

A record is a whole line the protocol owns: ``TPUPIPE[<nonce>] <kind> <json>``, after nothing but the prefix Ray
puts on a worker's output (``(RayTrainWorker pid=.., ip=..) ``, maybe coloured). The nonce is the job's own: chosen
when the stage submits the job, given to it in ``$TPUPIPE_RECORD_NONCE`` (the job's runtime environment, which its
tasks and actors inherit) and kept in the job's metadata, so a retried stage that re-attaches reads the same one. A
record without it, or inside other text (a printed data example, a model's output, a log line quoting one), is not
one: printed text cannot forge a result.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Iterable, Iterator
from typing import Any

TAG = "TPUPIPE"
KINDS = ("metric", "event", "result")
NONCE_ENV = "TPUPIPE_RECORD_NONCE"
NONCE_METADATA = "record_nonce"  # the key of the nonce in the Ray job's metadata
_ANSI = r"(?:\x1b\[[0-9;]*m)*"
# A record as parsed: its kind (one of KINDS) and its payload, a JSON object.
Record = tuple[str, dict[str, Any]]
RECORD = re.compile(
    rf"^{_ANSI}(?:\([^()]*\){_ANSI} )?{TAG}\[(?P<nonce>[0-9a-f]*)\] (?P<kind>[a-z]+) (?P<body>\{{.*\}})\s*$"
)


def new_nonce() -> str:
    return secrets.token_hex(8)


def line(kind: str, payload: dict[str, Any], nonce: str | None = None) -> str:
    """One record line, with ``nonce`` (default: the job's, from ``$TPUPIPE_RECORD_NONCE``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; one of {KINDS}")
    nonce = os.environ.get(NONCE_ENV, "") if nonce is None else nonce
    return f"{TAG}[{nonce}] {kind} {json.dumps(payload, sort_keys=True)}"


def emit(kind: str, payload: dict[str, Any]) -> None:
    """One record line on stdout. Written to the stream, not printed: in a Ray Train worker ``print`` is patched to
    go both to stdout and to the root logger, which would put every record in the job's log twice."""
    sys.stdout.write(line(kind, payload) + "\n")
    sys.stdout.flush()


def parse(lines: Iterable[str], nonce: str = "") -> Iterator[Record]:
    """Yield (kind, payload) for every record line of the job whose nonce is ``nonce``; other lines are ignored."""
    for text in lines:
        m = RECORD.match(text)
        if m is None or m["nonce"] != nonce or m["kind"] not in KINDS:
            continue
        try:
            payload = json.loads(m["body"])
        except json.JSONDecodeError:
            continue
        if isinstance(payload, dict):
            yield m["kind"], payload


def last_result(lines: Iterable[str], nonce: str = "") -> dict[str, Any] | None:
    result = None
    for kind, payload in parse(lines, nonce):
        if kind == "result":
            result = payload
    return result


def job_entries(directory: Any) -> dict[str, str]:
    """A compile job's report of what it wrote: every entry's name under its cache ``directory`` (a ``Path``) and the
    sha256 of its bytes, which the job puts in its result record; the pipeline's side records only these, and only
    with these bytes (``components.workload.cache_trust.record``)."""
    import hashlib

    if not directory.is_dir():
        return {}
    files = (p for p in directory.rglob("*") if p.is_file())
    return {
        str(p.relative_to(directory)): "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)
    }
