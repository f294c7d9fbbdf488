"""A benchmark figure: what was measured, its value, the target it is held to, and whether it holds. Every
``bench/bench_*.py`` defines ``figures() -> list[Figure]``; ``bench/run.py`` runs them all, prints the table and
writes ``bench/results.json``."""

from __future__ import annotations

import operator
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

_OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}
# How many A/B pairs a side-by-side figure measures (TPUPIPE_BENCH_PAIRS): one pair cannot tell a 10% change from
# what else a shared machine runs meanwhile; the median of several can, and their spread says how far to trust it.
PAIRS = int(os.environ.get("TPUPIPE_BENCH_PAIRS", "3"))


def alternated[T](
    measure_a: Callable[[int], T], measure_b: Callable[[int], T], value: Callable[[T], float], pairs: int = PAIRS
):
    """Measure A and B ``pairs`` times, in alternating order (A B, B A, A B, ...) so that a drift in the machine's
    load favours neither side; ``measure_*`` get the pair's index (for unique run names), ``value`` makes a number of
    a measurement. Returns (median of the A/B ratios, detail: each pair's ratio, the spread, each side's values),
    and the raw measurements of each side."""
    a: list[T] = []
    b: list[T] = []
    for i in range(pairs):
        for side in "ab" if i % 2 == 0 else "ba":
            (a if side == "a" else b).append((measure_a if side == "a" else measure_b)(i))
    ratios = [value(x) / value(y) for x, y in zip(a, b, strict=True)]
    detail = {
        "pairs": pairs,
        "order": "A B, then B A, alternating",
        "ratios": [round(r, 3) for r in ratios],
        "spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "A": [round(value(x), 1) for x in a],
        "B": [round(value(y), 1) for y in b],
    }
    return statistics.median(ratios), detail, a, b


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
