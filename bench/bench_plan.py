"""`tpupipe plan` at scale, measured in-process: time, and how the output grows.

A: v6e 16x16 slices (256 chips, 64 hosts each), 1 to 64 slices: the plan grows by one node pool per slice (linear
   in slices), and the Kubernetes manifests not at all (one worker group with replicas, not one per host).
B: 64 slices of v6e 4x4, 8x8 and 16x16 (16x more chips from the first to the last): the plan keeps its size.
Prints sizes, ratios next to the slice and chip ratios, and the time of the 64 x 16x16 plan (text and JSON).
Targets: the 64-slice plan in under a second; its size does not follow the chips.
"""

import contextlib
import io
import time
from pathlib import Path

from bench.figures import Figure, table
from components.platforms.gke.plan import document as plan
from components.workload import resolve
from pipelines.cli.main import main

REPO = Path(__file__).resolve().parents[1]

PRESET = "llama3-8b-v6e-16x2"
HOSTS = {"4x4": 4, "8x8": 16, "16x16": 64}
CHIPS = {"4x4": 16, "8x8": 64, "16x16": 256}


def sets(topology: str, slices: int) -> list[str]:
    return [
        "--set",
        f"cluster.topology={topology} cluster.num_hosts={HOSTS[topology]} "
        f"cluster.num_slices={slices} maxtext.ici_fsdp_parallelism=-1",
    ]


def run_cli(argv: list[str]) -> tuple[float, str]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"tpupipe {' '.join(argv)} exited {code}")
    return seconds, out.getvalue()


def best_of(argv: list[str], repeat: int = 5) -> tuple[float, str]:
    runs = [run_cli(argv) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[0][1]


def manifest_bytes(topology: str, slices: int) -> int:
    spec = resolve(
        PRESET,
        {
            "cluster.topology": topology,
            "cluster.num_hosts": str(HOSTS[topology]),
            "cluster.num_slices": str(slices),
            "maxtext.ici_fsdp_parallelism": "-1",
        },
    )
    return sum(len(text) for text in plan.manifest_files(plan.build(spec, "bench")).values())


def figures() -> list[Figure]:
    first_s, _ = run_cli(["plan", PRESET, "--output", "json", *sets("16x16", 64)])  # includes first imports
    print("A: v6e 16x16 slices, growing in number")
    print(f"  {'slices':>6} {'chips':>6} {'json bytes':>11} {'text bytes':>11} {'manifest bytes':>15} {'json s':>8}")
    sizes = {}
    for slices in (1, 2, 4, 8, 16, 32, 64):
        seconds, text_json = best_of(["plan", PRESET, "--output", "json", *sets("16x16", slices)])
        _, text = run_cli(["plan", PRESET, *sets("16x16", slices)])
        sizes[slices] = (len(text_json), len(text), manifest_bytes("16x16", slices))
        print(
            f"  {slices:>6} {slices * 256:>6} {len(text_json):>11} {len(text):>11} {sizes[slices][2]:>15} "
            f"{seconds:>8.4f}"
        )
    per_slice = (sizes[64][0] - sizes[2][0]) / 62
    linear = {n: sizes[2][0] + per_slice * (n - 2) for n in sizes if n >= 2}
    worst = max(abs(sizes[n][0] - linear[n]) / sizes[n][0] for n in linear)
    print(
        f"  json size(64 slices) / size(1 slice) = {sizes[64][0] / sizes[1][0]:.1f}; slices ratio 64, "
        f"chips ratio 64; {per_slice:.0f} bytes per added slice; worst deviation from a line "
        f"(2..64 slices) {worst:.2%}"
    )
    print(
        f"  manifest size(64) / size(2) = {sizes[64][2] / sizes[2][2]:.3f} (one worker group, replicas = slices; "
        f"1 slice has no DCN NICs: {sizes[1][2]} bytes)"
    )

    print("B: 64 slices, growing chips per slice")
    by_topology = {}
    for topology in ("4x4", "8x8", "16x16"):
        _, text_json = best_of(["plan", PRESET, "--output", "json", *sets(topology, 64)], repeat=1)
        by_topology[topology] = len(text_json)
        print(
            f"  {topology:>6}: {64 * CHIPS[topology]:>6} chips, {64 * HOSTS[topology]:>5} hosts, "
            f"json {len(text_json)} bytes, manifests {manifest_bytes(topology, 64)} bytes"
        )
    size_ratio = by_topology["16x16"] / by_topology["4x4"]
    print(f"  json size(16x16) / size(4x4) = {size_ratio:.3f}; chips ratio {CHIPS['16x16'] // CHIPS['4x4']}")

    text_s, _ = best_of(["plan", PRESET, *sets("16x16", 64)])
    json_s, _ = best_of(["plan", PRESET, "--output", "json", *sets("16x16", 64)])
    print(
        f"time of `tpupipe plan` for 64 x v6e 16x16 (16384 chips, 4096 hosts), in-process, best of 5: "
        f"text {text_s * 1000:.1f} ms, json {json_s * 1000:.1f} ms (first call, with imports: "
        f"{first_s * 1000:.1f} ms)"
    )
    slowest = max(text_s, json_s, first_s)
    return [
        Figure(
            "plan: 64 x v6e 16x16 (16,384 chips), slowest of text/json/first call",
            slowest * 1000,
            "ms",
            "< 1000",
            {
                "text_ms": round(text_s * 1000, 1),
                "json_ms": round(json_s * 1000, 1),
                "first_call_ms": round(first_s * 1000, 1),
            },
        ),
        Figure(
            "plan size: 64 slices of 16x16 / of 4x4 (16x the chips)",
            size_ratio,
            "x",
            "<= 1.1",
            {"json_bytes": by_topology},
        ),
        Figure(
            "plan size: 64 slices / 1 slice of 16x16 (linear in slices)",
            sizes[64][0] / sizes[1][0],
            "x",
            None,
            {"bytes_per_added_slice": round(per_slice), "worst_deviation_from_a_line": round(worst, 4)},
        ),
    ]


if __name__ == "__main__":
    print(table(figures()))
