"""The command line every trainer's Ray job takes, in one place: ``--spec`` (the run spec, as JSON), ``--output-dir``,
``--run-name`` and ``--scaling-config`` (Ray Train's ``ScalingConfig`` arguments, as JSON), as
``components.workload.derive.job_command`` writes them. Each trainer adds its own options to :func:`parser`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from components.spec import RunSpec


def scaling_config(text: str) -> dict[str, Any]:
    """Ray ``ScalingConfig`` arguments from the job's ``--scaling-config`` JSON (derived with the RayCluster from the
    TPU catalogue, in ``components.workload.derive``); an elastic ``num_workers`` range comes back as a tuple."""
    args: dict[str, Any] = json.loads(text)
    if isinstance(args.get("num_workers"), list):
        args["num_workers"] = tuple(args["num_workers"])
    return args


def parser(description: str, output_dir: str, run_name: str) -> argparse.ArgumentParser:
    """A parser of the options every trainer's job takes; ``output_dir`` and ``run_name`` say what those are to it."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--spec", required=True, help="the run spec, as JSON")
    p.add_argument("--output-dir", required=True, help=output_dir)
    p.add_argument("--run-name", required=True, help=run_name)
    p.add_argument("--scaling-config", required=True, help="Ray Train's ScalingConfig arguments, as JSON")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options, with ``spec`` as a :class:`RunSpec` (a bad one is a SpecError naming its field) and
    ``scaling_config`` as :func:`scaling_config` reads it."""
    args = p.parse_args(argv)
    args.spec = RunSpec.from_json(args.spec)
    args.scaling_config = scaling_config(args.scaling_config)
    return args
