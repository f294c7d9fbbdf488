"""How a trainer job tells the pipeline what happened: tagged JSON lines in the job's log.

The Ray Jobs API gives the pipeline the job's log on every platform (locally, and through the Kubernetes
API server's service proxy on GKE), so results travel in it and need no shared filesystem.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

TAG = "TPUPIPE"
KINDS = ("metric", "event", "result")


def line(kind: str, payload: dict[str, Any]) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown record kind {kind!r}; one of {KINDS}")
    return f"{TAG} {kind} {json.dumps(payload, sort_keys=True)}"


def emit(kind: str, payload: dict[str, Any]) -> None:
    """One record line on stdout. Written to the stream, not printed: in a Ray Train worker ``print`` is patched to
    go both to stdout and to the root logger, which would put every record in the job's log twice."""
    sys.stdout.write(line(kind, payload) + "\n")
    sys.stdout.flush()


def parse(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (kind, payload) for every record line; other lines are ignored."""
    for text in lines:
        # Ray prefixes worker output with "(RayTrainWorker pid=..) "; the record starts at the tag.
        at = text.find(TAG + " ")
        if at < 0:
            continue
        kind, _, body = text[at + len(TAG) + 1 :].partition(" ")
        if kind not in KINDS:
            continue
        try:
            yield kind, json.loads(body)
        except json.JSONDecodeError:
            continue


def last_result(lines: Iterable[str]) -> dict[str, Any] | None:
    result = None
    for kind, payload in parse(lines):
        if kind == "result":
            result = payload
    return result
