"""Token authentication of a local run's Ray cluster: every run has its own token, so no other process on the machine
(another user's, another run's) can submit jobs to it or read its state.

Ray's token authentication (Ray 2.52 or later; "Ray token authentication",
https://docs.ray.io/en/latest/ray-security/token-auth.html): with ``RAY_AUTH_MODE=token`` on every node, the dashboard
(the Jobs API and the state API) and the GCS accept only requests that carry the token; a node reads it from the file
``RAY_AUTH_TOKEN_PATH`` names ("Token Authentication", https://docs.ray.io/en/master/ray-core/internals/token-
authentication.html: an unreadable or empty file is fatal there, not a silent fallback). The file lives in the run's
private temporary directory (mode 0700), is the user's alone (0600), and is gone with teardown.

The stages run outside the cluster, and one process may drive several runs (the tests do): they send the token
explicitly (``headers``) rather than through the environment Ray's clients read it from."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE = "auth_token"


def new_token(temp_dir: str) -> str:
    """Write a fresh token into the run's private ``temp_dir``, readable by this user alone; its path."""
    path = Path(temp_dir) / FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return str(path)


def environment(token_path: str) -> dict[str, str]:
    """What every process of the cluster carries: token authentication on, the run's token by its file."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path}


def headers(token_path: str) -> dict[str, str]:
    """The header a request to the run's dashboard carries (its Jobs API, its state API)."""
    return {"Authorization": "Bearer " + Path(token_path).read_text().strip()}


def alive_nodes(dashboard_url: str, token_path: str) -> int:
    """How many of the cluster's nodes are alive, from its state API (ray.util.state.list_nodes, with the token)."""
    from ray.util.state.api import StateApiClient
    from ray.util.state.common import ListApiOptions, NodeState, StateResource

    nodes = StateApiClient(address=dashboard_url, headers=headers(token_path)).list(
        StateResource.NODES, options=ListApiOptions(), raise_on_missing_output=False
    )
    return sum(1 for n in nodes if isinstance(n, NodeState) and n.state == "ALIVE")  # NODES lists NodeStates
