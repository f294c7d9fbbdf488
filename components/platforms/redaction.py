"""Secrets kept out of what a run writes for people to read: its jobs' logs and its post-mortem (pods' logs and
events, Ray's logs and state, lost pods), which are written to the run's store, readable by whoever may read the
run, and outlive the run's Secrets.

Two kinds of secret are replaced by ``[redacted]``:

- the secrets this process knows: the Hugging Face token (``$HF_TOKEN``, ``$HUGGING_FACE_HUB_TOKEN``, and a token read
  from Secret Manager or a Kubernetes Secret, :func:`register` ed where it is read) and the run's Ray token (its
  Secret's value, registered where it is made or read), each also in its base64 form (a Kubernetes Secret's
  ``data`` carries it so);
- anything shaped like a credential, known or not: an HTTP ``Authorization`` value (``Bearer``: RFC 6750, section
  2.1, https://www.rfc-editor.org/rfc/rfc6750#section-2.1; any other scheme too), Ray's ``X-Ray-Authorization``
  header's, a Hugging Face user access token (``hf_`` then letters and digits:
  https://huggingface.co/docs/hub/security-tokens) and a Google OAuth 2.0 access token (``ya29.``:
  https://cloud.google.com/docs/authentication/token-types#access).

A process registers what it reads; on Vertex AI each task is its own process, so each registers the secrets it
reads, and what it never read is caught by its shape.
"""

from __future__ import annotations

import base64
import os
import re

MARK = "[redacted]"
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
MIN_SECRET = 8  # shorter values are not registered: redacting them would blank ordinary words
_known: set[str] = set()
_SHAPES = (
    # a header's value, the scheme kept: "Authorization: Bearer X", '"authorization": "Bearer X"', "X-Ray-Authorization"
    re.compile(r"""(?i)((?:x-ray-)?authorization["']?\s*[:=]\s*["']?(?:(?:bearer|basic|token)\s+)?+)[^\s"',;]+"""),
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{6,}"),  # RFC 6750's b64token after "Bearer"
    re.compile(r"()\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"()\bya29\.[A-Za-z0-9._-]{10,}"),
)


def register(secret: str | bytes | None) -> None:
    """Redact ``secret`` (and its base64 form) from now on in this process; a secret of several lines each of its
    lines too (a log is redacted line by line as it comes: ``components.stages.jobs``)."""
    text = secret.decode(errors="replace") if isinstance(secret, bytes) else secret or ""
    text = text.strip()
    for value in {text, *(line.strip() for line in text.splitlines())}:
        if len(value) >= MIN_SECRET:
            _known.update({value, base64.b64encode(value.encode()).decode()})


def known() -> set[str]:
    """The secrets this process redacts by value: those registered and the token environment variables'."""
    values = set(_known)
    for name in SECRET_ENV:
        value = os.environ.get(name, "").strip()
        if len(value) >= MIN_SECRET:
            values |= {value, base64.b64encode(value.encode()).decode()}
    return values


def redact(text: str) -> str:
    """``text`` with every known secret and every credential-shaped value replaced by ``[redacted]``."""
    for secret in sorted(known(), key=len, reverse=True):  # the longest first: a value inside another goes with it
        text = text.replace(secret, MARK)
    for shape in _SHAPES:
        text = shape.sub(lambda m: m.group(1) + MARK, text)
    return text


def redact_bytes(data: bytes) -> bytes:
    """:func:`redact` of bytes read as UTF-8 (what is not UTF-8 is kept as it is, bytes that decode to nothing
    known)."""
    return redact(data.decode("utf-8", errors="surrogateescape")).encode("utf-8", errors="surrogateescape")
