"""What preflight finds (``preflight``, ``offers``): the problems that stop a run before anything is created, each
naming the field to change, and what was found, for the person reading."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.spec import TpupipeError


class PreflightFailed(TpupipeError):
    """Every problem preflight found, in one message; nothing was created. Exit 2, as for bad input."""

    exit_code = 2

    def __init__(self, title: str, problems: list[Problem], warnings: list[str] | None = None):
        self.problems = problems
        super().__init__(
            f"{title}: {len(problems)} problem{'s' if len(problems) != 1 else ''}; nothing was "
            "created\n" + "\n".join(f"  - {p}" for p in problems) + "".join(f"\n  warning: {w}" for w in warnings or ())
        )


@dataclass(frozen=True)
class Problem:
    field: str  # the spec field (or the project's set-up) to change
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass
class Report:
    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # what was found in order, for the person reading
    warnings: list[str] = field(default_factory=list)  # what could not be checked, said, never silent
    enable: list[str] = field(default_factory=list)  # features of the existing cluster provision will enable
    version: str = ""  # the GKE version a cluster the run creates gets (``versions.choose``), "" for an existing one
    channel: str = ""  # the release channel it is created on: the most stable one that offers ``version``
