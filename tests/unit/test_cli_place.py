"""``--project`` and ``--region``: one helper adds them to every command (``pipelines.cli.common.add_place``), the
default region is one constant written once (``components.spec.names.DEFAULT_REGION``), and every command that calls
Google Cloud refuses the placeholder project (``EXAMPLE_PROJECT``) before any call: exit 2 naming --project and
$GOOGLE_CLOUD_PROJECT. The offline commands (``compile``, ``check-pipeline``) take it."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from components.spec.names import DEFAULT_REGION, EXAMPLE_PROJECT
from pipelines.cli.main import build_parser, main
from pipelines.cli.common import CALLS_GOOGLE_CLOUD, PROJECT_ENV

REPO = Path(__file__).resolve().parents[2]
JOB = "tpupipe-smoke-20261130120000-3f9a2c"
# Every command that calls Google Cloud, as a user would type it with the placeholder project.
CLOUD_COMMANDS = {
    "publish": ["publish"],
    "submit": ["submit", "smoke"],
    "schedule create": ["schedule", "create", "weekly", "smoke", "--cron", "0 3 * * 1"],
    "schedule list": ["schedule", "list"],
    "schedule pause": ["schedule", "pause", "weekly"],
    "schedule resume": ["schedule", "resume", "weekly"],
    "schedule delete": ["schedule", "delete", "weekly"],
    "runs list": ["runs", "list"],
    "runs show": ["runs", "show", JOB],
    "runs cancel": ["runs", "cancel", JOB],
    "models list": ["models", "list"],
    "models show": ["models", "show", "gemma-ft"],
    "models promote": ["models", "promote", "gemma-ft", "1"],
    "models rollback": ["models", "rollback", "gemma-ft"],
    "janitor": ["janitor", "--dry-run"],
}
# Those whose --project defaults to the placeholder (the others do something of their own without one).
DEFAULTS_TO_PLACEHOLDER = {name for name in CLOUD_COMMANDS if not name.startswith("models") and name != "janitor"}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) of every command of the tree, subcommands included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path), parser
    for action in subs:
        for name, child in action.choices.items():
            yield from commands(child, (*path, name))


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_region_defaults_to_the_one_constant_and_says_what_it_is_for():
    seen = []
    for name, parser in commands(build_parser()):
        region = option(parser, "--region")
        if region is None:
            continue
        seen.append(name)
        assert region.default == DEFAULT_REGION, name
        assert f"(default {DEFAULT_REGION}" in region.help and "region" in region.help.split("(default")[0], name
        project = option(parser, "--project")
        assert project is not None and project.help.split(" (default")[0], name
        assert parser.get_default(CALLS_GOOGLE_CLOUD) is not None, f"{name}: --project/--region not from add_place"
    assert {"compile", "check-pipeline", "janitor", "submit", "models list"} <= set(seen)


def test_the_default_region_is_written_once():
    """Outside its home, no string of the code is the region (a message may name it among others), nor is it a default
    of the Makefile's."""
    home = REPO / "components" / "spec" / "names.py"
    files = [p for pkg in ("components", "pipelines", "trainers") for p in sorted((REPO / pkg).rglob("*.py"))]

    def literals(path: Path) -> list[int]:
        tree = ast.parse(path.read_text(), str(path))
        return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == DEFAULT_REGION]

    assert [f"{p.relative_to(REPO)}:{n}" for p in files if p != home for n in literals(p)] == []
    assert len(literals(home)) == 1
    assert not re.search(re.escape(DEFAULT_REGION) + r"(?![\w-])", (REPO / "Makefile").read_text())


def test_the_table_names_every_command_that_calls_google_cloud():
    calling = {name for name, parser in commands(build_parser()) if parser.get_default(CALLS_GOOGLE_CLOUD)}
    offline = {name for name, parser in commands(build_parser()) if parser.get_default(CALLS_GOOGLE_CLOUD) is False}
    assert calling == set(CLOUD_COMMANDS)
    assert offline == {"compile", "check-pipeline"}


@pytest.mark.parametrize("name", sorted(CLOUD_COMMANDS))
def test_every_cloud_command_refuses_the_placeholder_before_any_call(name, capsys, monkeypatch, tmp_path):
    # No credentials anywhere: a call would fail otherwise, and differently.
    monkeypatch.delenv(PROJECT_ENV, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    monkeypatch.chdir(tmp_path)
    runs = [[*CLOUD_COMMANDS[name], "--project", EXAMPLE_PROJECT]]
    if name in DEFAULTS_TO_PLACEHOLDER:
        runs.append(CLOUD_COMMANDS[name])  # neither --project nor $GOOGLE_CLOUD_PROJECT: the placeholder is the default
    if name == "janitor":
        runs.append([*CLOUD_COMMANDS[name], "--project", "acme-training", "--project", EXAMPLE_PROJECT])
    for argv in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"tpupipe: error: --project: {EXAMPLE_PROJECT!r} is the examples' placeholder"), err
        assert f"${PROJECT_ENV}" in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_placeholder_from_the_environment_is_refused_too(capsys, monkeypatch):
    monkeypatch.setenv(PROJECT_ENV, EXAMPLE_PROJECT)
    assert main(["runs", "list"]) == 2
    assert capsys.readouterr().err.startswith("tpupipe: error: --project: ")


def test_without_a_project_models_use_the_local_registry_and_the_environment_names_the_default(
    capsys, monkeypatch, tmp_path
):
    monkeypatch.setenv(PROJECT_ENV, "acme-training")
    assert main(["models", "list", "--output-root", str(tmp_path)]) == 0
    assert "no models in" in capsys.readouterr().out
    submit = dict(commands(build_parser()))["submit"]
    assert option(submit, "--project").default == "acme-training"


def test_the_offline_commands_take_the_placeholder(monkeypatch):
    monkeypatch.delenv(PROJECT_ENV, raising=False)
    for name in ("compile", "check-pipeline"):
        parser = dict(commands(build_parser()))[name]
        assert option(parser, "--project").default == EXAMPLE_PROJECT
        assert "accepted" in option(parser, "--project").help


def test_the_docs_give_the_default_region_the_code_has():
    text = " ".join((REPO / "docs" / "vertex.md").read_text().split())
    assert f"`--region` defaults to `{DEFAULT_REGION}`" in text
    assert f"the placeholder `{EXAMPLE_PROJECT}`" in text
