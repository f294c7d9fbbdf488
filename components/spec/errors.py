"""The one error hierarchy of tpupipe.

Every error the project raises on purpose is a :class:`TpupipeError` and says what the user does next:

- :class:`SpecError` — bad input (a spec field, a preset, a flag), found before anything is created or spent.
  It names the field; the command line exits 2.
- :class:`InfraError` — the infrastructure failed (a cloud call, a Ray job, a deadline) after the run started.
  The command line exits 1; teardown has run and the summary says what it deleted.

The TPU catalogue and the price table (``components.tpu``) are data and import nothing of the project; their
lookups raise plain ``ValueError`` subclasses that the callers turn into a SpecError naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable


class TpupipeError(Exception):
    """Base of every error tpupipe raises on purpose."""

    exit_code = 1


class SpecError(TpupipeError, ValueError):
    """Bad input, found before anything is created. ``field`` is the dotted key at fault."""

    exit_code = 2

    def __init__(self, field: str, message: str, valid: Iterable[str] | None = None):
        self.field = field
        self.valid = list(valid) if valid is not None else None
        text = f"{field}: {message}"
        if self.valid:
            text += f" (valid: {', '.join(self.valid)})"
        super().__init__(text)


class InfraError(TpupipeError, RuntimeError):
    """The infrastructure failed after the run started (cloud call, Ray job, deadline): exit 1."""
