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
  the request cannot be authenticated, it is rejected with HTTP status code 401");
- ``GET /userinfo`` with ``Authorization: Bearer T``: Google's OpenID Connect UserInfo endpoint, served here beside the
  token endpoint (Google's is a host of its own, the discovery document's ``userinfo_endpoint``,
  https://openidconnect.googleapis.com/v1/userinfo: https://developers.google.com/identity/openid-connect/reference;
  "Add your access token to the authorization header and make an HTTPS GET request to the userinfo endpoint":
  https://developers.google.com/identity/openid-connect/openid-connect, "Obtaining user profile information"): of a
  valid token, its account's ``sub``, and its ``email`` with ``email_verified`` (a JSON boolean, as OpenID Connect's
  claims are: https://openid.net/specs/openid-connect-core-1_0.html#StandardClaims) when its scopes include the e-mail
  scope (``userinfo.email`` or ``email``: "Provided only if you included the email scope in your request", the
  guide's ``email`` claim); a token that is not valid, or none, is ``401`` with ``WWW-Authenticate: Bearer
  error="invalid_token"`` (RFC 6750 section 3.1, https://www.rfc-editor.org/rfc/rfc6750#section-3.1, as the OpenID
  Connect UserInfo error response is: Core 1.0 section 5.3.3). A token it minted is a login of ``account``, scoped as
  its refresh asked (``scope``, cloud-platform when none); ``identify(token, email)`` makes another emulator's token
  (a member's, a static one) one of ``email``'s. ``targets`` keeps each request's target, its query string and all.
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
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
EMAIL_SCOPES = ("https://www.googleapis.com/auth/userinfo.email", "email")  # what puts an address in a token's info
ACCOUNT = "developer@example.com"  # whose login the ADC file's refresh token is, by default


class TokenIssuer(HttpEmulator):
    def __init__(self, lifetime_s: float = LIFETIME_S, clock: Callable[[], float] = time.time, account: str = ACCOUNT):
        super().__init__()
        self.lifetime_s = lifetime_s
        self.aged_s = 0.0
        self.clock = clock
        self.account = account
        self.refresh_token = secrets.token_hex(16)
        self.client_secret = secrets.token_hex(8)
        self.expiry: dict[str, float] = {}  # access token -> when it expires, on ``clock``
        self.scopes: dict[str, str] = {}  # access token -> its scopes, space-separated
        self.identities: dict[str, str] = {}  # another emulator's token -> its account's e-mail (``identify``)
        self.refused: list[str] = []  # why each refused request was refused (expired, unknown, none)
        self.calls: list[str] = []  # each request's path (/token, /userinfo)
        self.targets: list[str] = []  # each request's target: its path and query string
        self._lock = threading.Lock()

    def mint(self, scope: str = CLOUD_PLATFORM) -> str:
        with self._lock:
            token = f"ya29.emulated-{secrets.token_hex(12)}"
            self.expiry[token] = self.clock() + self.lifetime_s - self.aged_s
            self.scopes[token] = scope
            return token

    def identify(self, token: str, email: str, scope: str = f"{CLOUD_PLATFORM} {EMAIL_SCOPES[0]}") -> None:
        """``token`` (minted by another emulator, which accepts it) is a token of ``email``'s with ``scope``: the
        UserInfo endpoint says so (``/userinfo``), for as long as this issuer runs."""
        with self._lock:
            self.identities[token] = email
            self.scopes[token] = scope

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
        url = urllib.parse.urlsplit(http.path)
        with self._lock:
            self.calls.append(url.path)
            self.targets.append(http.path)
        if http.command == "GET" and url.path == "/userinfo":
            header = http.headers.get("Authorization") or ""
            return self._userinfo(header.removeprefix("Bearer ") if header.startswith("Bearer ") else "")
        if http.command != "POST" or url.path != "/token":
            return 404, {"error": "not_found"}
        form = dict(urllib.parse.parse_qsl(body.decode()))
        if form.get("grant_type") != "refresh_token" or form.get("refresh_token") != self.refresh_token:
            return 400, {"error": "invalid_grant", "error_description": "Token has been expired or revoked."}
        scope = form.get("scope", CLOUD_PLATFORM)
        token = self.mint(scope)
        with self._lock:
            left = self.expiry[token] - self.clock()
        return 200, {"access_token": token, "expires_in": int(left), "token_type": "Bearer", "scope": scope}

    def _userinfo(self, token: str) -> tuple:
        """What the UserInfo endpoint says of ``token`` (the module's docstring): 401 ``invalid_token`` unless it is
        valid."""
        with self._lock:
            now = self.clock()
            expires = self.expiry.get(token, now + self.lifetime_s if token in self.identities else None)
            email = self.identities.get(token, self.account if token in self.expiry else "")
            scope = self.scopes.get(token, "")
        if not token or expires is None or now >= expires:
            challenge = {"WWW-Authenticate": 'Bearer error="invalid_token"'}
            return 401, {"error": "invalid_token", "error_description": "Invalid Credentials"}, challenge
        info: dict = {"sub": str(int.from_bytes(email.encode()[:8].ljust(8, b"\0"), "big"))}
        if email and set(scope.split()) & set(EMAIL_SCOPES):
            info.update(email=email, email_verified=True)
        return 200, info


def authorized(token, header: str | None) -> bool:
    """Whether ``header`` (a request's ``Authorization``) carries ``token``: a static token string (an emulator
    started alone), or a token the :class:`TokenIssuer` ``token`` minted that has not expired."""
    if isinstance(token, TokenIssuer):
        return token.accepts(header)
    return header == f"Bearer {token}"
