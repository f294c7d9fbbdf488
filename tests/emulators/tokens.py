"""The emulated token issuer: Google's OAuth 2.0 token endpoint, enough for google-auth to refresh the credentials of
an ``authorized_user`` Application Default Credentials file (what ``gcloud auth application-default login``
writes). The emulated project writes such a file and points ``GOOGLE_APPLICATION_CREDENTIALS`` at it, so tpupipe finds
its credentials as on a workstation; google-auth sends such credentials' refresh to Google's endpoint whatever the
file says, so ``TPUPIPE_GKE_EMULATOR_TOKEN_URI`` names this one (``components/cloud/credentials.py``).

- ``POST /token`` with ``grant_type=refresh_token`` answers ``{"access_token", "expires_in", "token_type":
  "Bearer", "scope"}`` (https://developers.google.com/identity/protocols/oauth2/web-server#offline); an unknown
  refresh token is ``400 invalid_grant``;
- every access token it mints lives ``lifetime_s`` seconds of ``clock`` (``time.time``: a test moves it with
  time-machine): Google's access tokens live an hour by default
  (https://cloud.google.com/docs/authentication/token-types#access-tokens), and one handed out by a cache (the
  metadata server's) has less left: ``aged_s`` is taken off what the next tokens have left;
- ``accepts(header)``: whether an ``Authorization`` header carries a token it minted that has not expired; every
  emulator of the project refuses any other with 401, as Google's APIs and the Kubernetes API server do with a
  token that cannot be authenticated (https://kubernetes.io/docs/reference/access-authn-authz/authentication/: "If
  the request cannot be authenticated, it is rejected with HTTP status code 401").
"""

from __future__ import annotations

import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from components.cloud.credentials import EMULATED_CLIENT_ID
from tests.emulators.http import HttpEmulator

CLIENT_ID = EMULATED_CLIENT_ID  # the one OAuth client components/cloud/credentials.py refreshes at an emulator
LIFETIME_S = 3600.0


class TokenIssuer(HttpEmulator):
    def __init__(self, lifetime_s: float = LIFETIME_S, clock: Callable[[], float] = time.time):
        super().__init__()
        self.lifetime_s = lifetime_s
        self.aged_s = 0.0
        self.clock = clock
        self.refresh_token = secrets.token_hex(16)
        self.client_secret = secrets.token_hex(8)
        self.expiry: dict[str, float] = {}  # access token -> when it expires, on ``clock``
        self.refused: list[str] = []  # why each refused request was refused (expired, unknown, none)
        self._lock = threading.Lock()

    def mint(self) -> str:
        with self._lock:
            token = f"ya29.emulated-{secrets.token_hex(12)}"
            self.expiry[token] = self.clock() + self.lifetime_s - self.aged_s
            return token

    def accepts(self, header: str | None) -> bool:
        token = (header or "").removeprefix("Bearer ")
        with self._lock:
            expires = self.expiry.get(token)
            if expires is not None and self.clock() < expires:
                return True
            self.refused.append("none" if not header else "unknown" if expires is None else "expired")
            return False

    def adc_file(self, path: Path) -> Path:
        """An ``authorized_user`` credentials file whose refresh goes to this issuer."""
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {
            "type": "authorized_user",
            "client_id": CLIENT_ID,
            "client_secret": self.client_secret,
            "refresh_token": self.refresh_token,
        }
        path.write_text(json.dumps(info))
        return path

    def _serve(self, http, body: bytes) -> tuple:
        if http.command != "POST" or urllib.parse.urlsplit(http.path).path != "/token":
            return 404, {"error": "not_found"}
        form = dict(urllib.parse.parse_qsl(body.decode()))
        if form.get("grant_type") != "refresh_token" or form.get("refresh_token") != self.refresh_token:
            return 400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}
        token = self.mint()
        with self._lock:
            left = self.expiry[token] - self.clock()
        return 200, {
            "access_token": token,
            "expires_in": int(left),
            "token_type": "Bearer",
            "scope": form.get("scope", "https://www.googleapis.com/auth/cloud-platform"),
        }


def authorized(token, header: str | None) -> bool:
    """Whether ``header`` (a request's ``Authorization``) carries ``token``: a static token string (an emulator
    started alone), or a token the :class:`TokenIssuer` ``token`` minted that has not expired."""
    if isinstance(token, TokenIssuer):
        return token.accepts(header)
    return header == f"Bearer {token}"
