"""A benchmark figure: what was measured, its value, the target it is held to, and whether it holds. Every
``bench/bench_*.py`` defines ``figures() -> list[Figure]``; ``bench/run.py`` runs them all, prints the table and
writes ``bench/results.json``."""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


@dataclass
class Figure:
    name: str  # what was measured, e.g. "overhead: tpupipe run / the same work by hand"
    value: float
    unit: str  # "x", "s", "tokens/s", "steps", ...
    target: str | None = None  # "<= 1.15": an operator and a bound; None for a figure reported without a target
    detail: dict[str, Any] = field(default_factory=dict)  # the raw numbers behind the value

    @property
    def holds(self) -> bool | None:
        if self.target is None:
            return None
        op, bound = self.target.split()
        return bool(_OPS[op](self.value, float(bound)))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "holds": self.holds}


def table(figures: list[Figure]) -> str:
    rows = [("figure", "value", "target", "holds")]
    for f in figures:
        value = f"{f.value:,.2f} {f.unit}" if abs(f.value) < 100 else f"{f.value:,.0f} {f.unit}"
        holds = {True: "yes", False: "NO", None: "-"}[f.holds]
        rows.append((f.name, value, f.target or "-", holds))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    aligned = [
        [c.ljust(w) if i in (0, 2) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        for r in rows
    ]
    return "\n".join("  ".join(r) for r in aligned)
