"""The price table of `tpupipe plan`, as data: every price with its unit, its source and the date it is from.

Keys are ``<item>/<name>/<capacity>``: ``tpu/v6e/on-demand`` is the price of one v6e chip for one hour,
``machine/n2-standard-8/on-demand`` of one VM for one hour, ``gke/cluster/any`` of one cluster's management
fee for one hour. List prices in USD, before discounts, free tiers and taxes; regions differ a little and are
not modelled. A price the table lacks (Spot and flex-start prices move daily; TPU7x has no public list price) is
reported as missing, never guessed: give it with ``tpupipe plan --prices FILE``, a JSON object of entries of the
same shape (or bare numbers) that replaces or adds to this table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PRICES: dict[str, dict[str, Any]] = {
    "tpu/v6e/on-demand": {
        "usd": 2.70,
        "unit": "chip-hour",
        "source": "https://cloud.google.com/blog/products/compute/trillium-tpu-is-ga",
        "date": "2024-12-11",
    },
    "tpu/v5e/on-demand": {
        "usd": 1.20,
        "unit": "chip-hour",
        "source": "https://cloud.google.com/blog/products/compute/announcing-cloud-tpu-v5e-and-a3-gpus-in-ga",
        "date": "2023-08-29",
    },
    "tpu/v5p/on-demand": {
        "usd": 4.20,
        "unit": "chip-hour",
        "source": "https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer",
        "date": "2023-12-06",
    },
    "machine/n2-standard-8/on-demand": {
        "usd": 0.388472,
        "unit": "machine-hour",
        "source": "https://cloud.google.com/compute/vm-instance-pricing (us-central1)",
        "date": "2026-11-29",
    },
    "machine/n2-standard-16/on-demand": {
        "usd": 0.776944,
        "unit": "machine-hour",
        "source": "https://cloud.google.com/compute/vm-instance-pricing (us-central1)",
        "date": "2026-12-04",
    },
    "machine/n1-standard-16/on-demand": {
        "usd": 0.759968,
        "unit": "machine-hour",
        "source": "https://cloud.google.com/compute/vm-instance-pricing (us-central1)",
        "date": "2026-11-29",
    },
    "gke/cluster/any": {
        "usd": 0.10,
        "unit": "cluster-hour",
        "source": "https://cloud.google.com/kubernetes-engine/pricing (cluster management fee)",
        "date": "2026-11-29",
    },
}


class PriceError(ValueError):
    """A price file that cannot be read or has a bad entry."""


def key(item: str, name: str, capacity: str) -> str:
    return f"{item}/{name}/{capacity}"


def load(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The table, with the entries of the JSON file at ``path`` (if given) replacing or added to it."""
    table = {k: dict(v) for k, v in PRICES.items()}
    if not path:
        return table
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PriceError(f"--prices: cannot read {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise PriceError(f"--prices: {path} must hold a JSON object of price entries")
    for name, entry in data.items():
        if name.count("/") != 2:
            raise PriceError(f"--prices: {name!r} is not a key like tpu/v6e/spot (item/name/capacity)")
        if isinstance(entry, (int, float)) and not isinstance(entry, bool):
            entry = {"usd": entry}
        if not isinstance(entry, Mapping) or not isinstance(entry.get("usd"), (int, float)):
            raise PriceError(f"--prices: {name!r} needs a number or an object with a number 'usd'")
        if not math.isfinite(entry["usd"]) or entry["usd"] < 0:
            raise PriceError(f"--prices: {name!r} has a negative or non-finite price")
        base = table.get(name, {})
        table[name] = {
            "usd": float(entry["usd"]),
            "unit": entry.get("unit", base.get("unit", "hour")),
            "source": entry.get("source", f"--prices {path}"),
            "date": entry.get("date", ""),
        }
    return table


def line(
    table: Mapping[str, Mapping[str, Any]],
    kind: str,
    resource: str,
    item: str,
    name: str,
    capacity: str,
    quantity: float,
) -> dict[str, Any]:
    """The cost of resource ``kind``/``resource``: ``quantity`` units of ``item/name/capacity`` an hour;
    ``usd_per_hour`` is None when the table has no price for it."""
    price_key = key(item, name, capacity)
    entry = table.get(price_key)
    if entry is None and item == "gke":
        entry = table.get(key(item, name, "any"))
        price_key = key(item, name, "any") if entry else price_key
    out: dict[str, Any] = {"kind": kind, "resource": resource, "price_key": price_key, "quantity": quantity}
    if entry is None:
        out.update(unit_usd=None, usd_per_hour=None)
        on_demand = table.get(key(item, name, "on-demand"))
        if on_demand is not None and capacity in ("spot", "flex-start", "queued"):
            # Spot and flex-start (queued provisioning is flex-start's) cost less than on-demand: its price bounds them.
            out["upper_bound_usd_per_hour"] = round(on_demand["usd"] * quantity, 6)
        return out
    out.update(unit_usd=entry["usd"], usd_per_hour=round(entry["usd"] * quantity, 6))
    return out


def summarize(
    lines: list[dict[str, Any]], expected_hours: float, table: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Totals per hour and for the expected duration; None when any line is unpriced."""
    missing = sorted({ln["price_key"] for ln in lines if ln["usd_per_hour"] is None})
    priced = [ln["usd_per_hour"] for ln in lines if ln["usd_per_hour"] is not None]
    per_hour = None if missing else round(sum(priced), 4)
    out: dict[str, Any] = {
        "currency": "USD",
        "expected_hours": expected_hours,
        "usd_per_hour": per_hour,
        "usd_for_expected_duration": None if per_hour is None else round(per_hour * expected_hours, 2),
        "missing_prices": missing,
        "lines": lines,
    }
    if missing and all(ln["usd_per_hour"] is not None or "upper_bound_usd_per_hour" in ln for ln in lines):
        bound = sum(
            ln["usd_per_hour"] if ln["usd_per_hour"] is not None else ln["upper_bound_usd_per_hour"] for ln in lines
        )
        out["upper_bound_usd_per_hour"] = round(bound, 4)
        out["upper_bound_usd_for_expected_duration"] = round(bound * expected_hours, 2)
    used = sorted({ln["price_key"] for ln in lines if ln["usd_per_hour"] is not None})
    out["sources"] = {k: {"source": table[k]["source"], "date": table[k]["date"]} for k in used}
    return out
