"""``components.cloud.credentials.caller_email``, whose address the credentials are: named by the credentials
themselves (a service account's), else given by the OpenID Connect UserInfo endpoint, here the emulated token
issuer's (tests/emulators/tokens.py), asked with the token in the ``Authorization`` header, never in a URL: for a
user's login, of a token its refresh token is asked for with the e-mail scope alone (its own tokens, of the
cloud-platform scope, carry no address); for the emulators' static token, as the issuer knows it. With the emulators
and no emulated endpoint to ask, nothing is asked and no address is learned."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from google.auth import compute_engine

from components.cloud import credentials as cloud
from tests.emulators.tokens import TokenIssuer


@pytest.fixture
def issuer(monkeypatch):
    issuer = TokenIssuer(account="dev@example.com")
    issuer.start()
    monkeypatch.setenv(cloud.EMULATOR_HOST_ENV, "http://127.0.0.1:9")  # the emulators are in use
    monkeypatch.setenv(cloud.EMULATOR_TOKEN_URI_ENV, f"{issuer.endpoint}/token")
    monkeypatch.delenv(cloud.EMULATOR_TOKEN_ENV, raising=False)
    yield issuer
    issuer.stop()


def info(issuer: TokenIssuer, token: str) -> dict:
    asked = urllib.request.Request(f"{issuer.endpoint}/userinfo", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(asked) as answer:
        return json.load(answer)


def test_a_service_accounts_credentials_name_it_and_nothing_is_asked(issuer):
    creds = compute_engine.Credentials(service_account_email="pipeline@p.iam.gserviceaccount.com")
    assert cloud.caller_email(creds) == "pipeline@p.iam.gserviceaccount.com" and issuer.calls == []


def test_a_users_login_is_named_by_a_token_of_the_email_scope(issuer, tmp_path, monkeypatch):
    """The login's own tokens are of the cloud-platform scope, whose UserInfo names no one; the address comes from a
    token of the e-mail scope alone, asked for with the same refresh token and sent in the Authorization header: no
    request's target (its path and query string, which clients log) carries it."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(issuer.adc_file(tmp_path / "adc.json")))
    creds = cloud.credentials()
    assert cloud.caller_email(creds) == "dev@example.com"
    assert issuer.calls == ["/token", "/userinfo"] and issuer.targets == ["/token", "/userinfo"]
    (scoped,) = [token for token, scope in issuer.scopes.items() if scope == cloud.EMAIL_SCOPE]
    got = info(issuer, scoped)
    assert (got["email"], got["email_verified"]) == ("dev@example.com", True)
    cloud.AccessToken(creds)()  # the login's own token: cloud-platform
    assert creds.token != scoped and "email" not in info(issuer, creds.token)


def test_the_emulators_static_token_is_named_by_the_issuer_or_not_at_all(issuer, monkeypatch):
    monkeypatch.setenv(cloud.EMULATOR_TOKEN_ENV, "t0ken")
    assert cloud.caller_email(cloud.credentials()) == ""  # a token the issuer does not know: invalid_token
    with pytest.raises(urllib.error.HTTPError) as refused:
        info(issuer, "t0ken")
    assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    issuer.identify("t0ken", "owner@example.com")
    assert cloud.caller_email(cloud.credentials()) == "owner@example.com"
    assert not any("t0ken" in target for target in issuer.targets)
    monkeypatch.delenv(cloud.EMULATOR_TOKEN_URI_ENV)  # no emulated endpoint: Google's is never asked
    calls = len(issuer.calls)
    assert cloud.caller_email(cloud.credentials()) == "" and len(issuer.calls) == calls


def test_a_login_elsewhere_is_asked_of_googles_endpoint(monkeypatch):
    """A user's own login, found while emulator variables are set, is asked of Google's endpoint, never of one on
    plain HTTP (components/cloud/credentials.py, ``_userinfo_uri``)."""
    from google.oauth2.credentials import Credentials

    monkeypatch.setenv(cloud.EMULATOR_HOST_ENV, "http://127.0.0.1:9")
    monkeypatch.setenv(cloud.EMULATOR_TOKEN_URI_ENV, "http://127.0.0.1:9/token")
    monkeypatch.delenv(cloud.EMULATOR_TOKEN_ENV, raising=False)
    mine = Credentials(token="t", refresh_token="r", client_id="mine.apps.googleusercontent.com", client_secret="s")  # type: ignore[no-untyped-call]
    assert cloud._userinfo_uri(mine) == cloud.USERINFO_URI == "https://openidconnect.googleapis.com/v1/userinfo"
