"""One reference for every setting: each run spec key's meaning, default and allowed values, read from where the
field is defined (its comment in ``run_spec``: the one on its line, else the block just above it), so the docs cannot
drift from the code. ``tpupipe validate --explain KEY`` prints one key; docs/config.md is :func:`markdown`, generated
(``make config-docs``) and checked current by tests/unit/test_config_reference.py.

Pure standard library, as the rest of ``components.spec``.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path

from components.spec import run_spec
from components.spec.errors import SpecError
from components.spec.run_spec import SECTIONS

# The keys whose values are one of a fixed set (the checks refuse any other: components/spec/checks.py).
CHOICES: dict[str, tuple[str, ...]] = {
    "cluster.capacity": run_spec.CAPACITY_TYPES,
    "train.workload": run_spec.WORKLOADS,
    "train.precision": run_spec.PRECISIONS,
    "train.checkpoint_staging": run_spec.CHECKPOINT_STAGINGS,
    "gke.cluster_mode": run_spec.GKE_CLUSTER_MODES,
    "gke.multislice_network": run_spec.MULTISLICE_NETWORKS,
}
# Values the type alone does not say, in words.
FORMS: dict[str, str] = {
    "cluster.accelerator": "cpu, or a TPU family of the catalogue (components/tpu/catalogue.py: v5e, v5p, v6e, tpu7x)",
    "cluster.capacity": "one of the choices, or a ladder of them in order, comma-separated",
    "train.init_from": '"", champion, or NAME@VERSION (a version id or an alias)',
    "train.data_since": '"" or champion',
    "eval.metrics": "comma-separated: exact_match, normalized_exact_match, rouge_l, json_valid, answer_length",
    "eval.scorer": '"" or trainers.scorers.MODULE:FUNCTION, (prompt, reference, answer) -> float in [0, 1]',
    "gate.metric": "eval_loss, or a task metric of eval.metrics (not answer_length), or scorer",
    "gate.guards": '"" or METRIC>=BOUND / METRIC<=BOUND, comma-separated (bounds on new - champion)',
    "train.bigquery_results_dataset": (
        '"" (tpupipe_results_LOCATION_HASH) or a BigQuery dataset name: letters, digits and _'
    ),
    "testing.slice_check_corrupt_rank": "-1 (none), or a rank of the slice check: 0 to its ranks - 1",
    "testing.slice_check_slow_rank": "-1 (none), or a rank of the slice check: 0 to its ranks - 1",
    "testing.host_start_delay_s": "seconds, 0 or more; more than 0 needs cluster.accelerator=cpu",
    "testing.host_replace_delay_s": "seconds, 0 or more; more than 0 needs cluster.accelerator=cpu",
    "testing.drain_host_at_step": "0 (never) or a global step; a step needs cluster.accelerator=cpu",
    "testing.fail_at_step": "0 (never) or a global step",
}
HEADER = """# Settings

Every key of the run spec, with its meaning, default and allowed values, generated from the fields' own comments in
`components/spec/run_spec.py` by `make config-docs` (tests/unit/test_config_reference.py fails when this page is not
current). Set a key with `--set KEY=VALUE` (or `SET="KEY=VALUE ..."` to `make run`); a preset sets some first
(`tpupipe validate PRESET` prints them all resolved), and `tpupipe validate --explain KEY` prints one key's entry.
"""
NAME_MEANING = "the run's name: the preset's, or custom; a registered model's name derives from it (gate.model)"


@dataclass(frozen=True)
class Setting:
    key: str
    meaning: str
    default: str
    allowed: str


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """The comment on each line (its text without ``#``), and the lines that hold a comment alone."""
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    return comments, {line for line in comments if line not in code_lines}


def _meanings() -> dict[str, str]:
    source = Path(run_spec.__file__).read_text()
    comments, alone = _comments(source)
    classes = {node.name: node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)}
    out = {"name": NAME_MEANING}
    for section, cls in SECTIONS.items():
        for node in classes[cls.__name__].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            line = node.lineno
            if line in comments and line not in alone:
                text = comments[line]
            else:
                block: list[str] = []
                above = line - 1
                while above in alone:
                    block.insert(0, comments[above])
                    above -= 1
                text = " ".join(block)
            out[f"{section}.{node.target.id}"] = text
    return out


def _allowed(key: str, kind: object) -> str:
    if key in CHOICES:
        choices = ", ".join(CHOICES[key])
        return f"{choices}; {FORMS[key]}" if key in FORMS else choices
    if key in FORMS:
        return FORMS[key]
    optional = type(None) in typing.get_args(kind)
    base = next((a for a in typing.get_args(kind) if a is not type(None)), kind) if optional else kind
    named: dict[object, str] = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    words = named.get(base, str(base))
    return f"{words}, or empty (none)" if optional else words


def _shown(value: object) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    return str(value)


def settings() -> list[Setting]:
    """Every key, in the spec's order (``parsing.all_keys``)."""
    meanings = _meanings()
    out = [Setting("name", meanings["name"], _shown(run_spec.RunSpec().name), "a string")]
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            out.append(Setting(key, meanings.get(key, ""), _shown(f.default), _allowed(key, hints[f.name])))
    return out


def explain(key: str) -> str:
    """What ``tpupipe validate --explain KEY`` prints: the key's meaning, default and allowed values."""
    found = {s.key: s for s in settings()}
    wanted = key if key in found else next((k for k in found if k.rpartition(".")[2] == key), "")
    if not wanted:
        raise SpecError("--explain", f"no setting {key!r}", sorted(found))
    s = found[wanted]
    return f"{s.key}\n  {s.meaning}\n  default: {s.default}\n  allowed: {s.allowed}"


def markdown() -> str:
    """docs/config.md: one table per section."""
    docs = {cls: " ".join((cls.__doc__ or "").split("\n\n")[0].split()) for cls in SECTIONS.values()}
    lines = [HEADER]
    by_section: dict[str, list[Setting]] = {}
    for s in settings():
        by_section.setdefault(s.key.partition(".")[0] if "." in s.key else "", []).append(s)
    for section, rows in by_section.items():
        lines += [f"## `{section}`" if section else "## Top level", ""]
        if section:
            lines += [docs[SECTIONS[section]], ""]
        lines += ["| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
        for s in rows:
            cells = [f"`{s.key}`", f"`{s.default}`", s.allowed, s.meaning]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(), end="")
