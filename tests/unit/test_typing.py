"""mypy checks the whole product: the list of modules whose errors are not reported (pyproject.toml's overrides with
``ignore_errors``) names modules one by one, each one that exists and with the reason beside it, and only shrinks
(it is empty now); no module is exempted wholesale, and an error silenced in the code names its error code."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("components", "pipelines", "trainers")  # what mypy checks (pyproject.toml's [tool.mypy] files)
# The length of the list when this test was last tightened: lower it when a module comes off, never raise it.
MOST_UNCHECKED = 0
# The packages of the product not checked strictly: none now (components.data, the last, joined the strict list);
# never add one.
NOT_STRICT: tuple[str, ...] = ()
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[a-z0-9-]+(?:,\s*[a-z0-9-]+)*\])?")


def mypy_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]


def modules(override: dict) -> list[str]:
    """An override's modules: ``module`` is one name or a list of them."""
    return [override["module"]] if isinstance(override["module"], str) else list(override["module"])


def strict() -> list[str]:
    """The modules the first override checks strictly (the flags ``mypy --strict`` turns on)."""
    first = mypy_config()["overrides"][0]
    assert first.get("disallow_untyped_defs") and first.get("warn_return_any"), "the first override is the strict one"
    return modules(first)


def unchecked() -> list[str]:
    return [m for o in mypy_config().get("overrides", []) if o.get("ignore_errors") for m in modules(o)]


def test_the_unchecked_list_names_existing_modules_one_by_one():
    for module in unchecked():
        assert "*" not in module, f"{module}: one entry per module, no glob"
        path = REPO / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), f"{module}: no such module"


def test_the_unchecked_list_does_not_grow():
    assert len(unchecked()) <= MOST_UNCHECKED, unchecked()


def test_every_unchecked_module_says_why_on_its_own_line():
    """A module that must stay unchecked has its one-line reason beside it: ``"a.b",  # why``."""
    lines = (REPO / "pyproject.toml").read_text().splitlines()
    for module in unchecked():
        beside = [line for line in lines if re.match(rf'\s*"{re.escape(module)}",?\s*#\s*\S', line)]
        assert beside, f'{module}: on a line of its own with its reason beside it ("{module}",  # why)'


def test_no_module_is_exempted_wholesale():
    """Errors are not silenced for everything at once: no global ``ignore_errors``, and no package of the product
    skipped by ``follow_imports``."""
    config = mypy_config()
    assert not config.get("ignore_errors")
    assert config.get("follow_imports", "normal") == "normal"
    for override in config.get("overrides", []):
        ours = [m for m in modules(override) if m.split(".")[0] in PRODUCT]
        assert not ours or override.get("follow_imports", "normal") == "normal", ours


def test_an_error_silenced_in_the_code_names_its_code():
    """``# type: ignore`` alone silences every error of its line; one that must stay names the one it expects."""
    bare = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                found = IGNORE.search(line)
                if found and not found["codes"]:
                    bare.append(f"{path.relative_to(REPO)}:{number}")
    assert not bare, f"# type: ignore without an error code: {bare}"


def covers(pattern: str, module: str) -> bool:
    """Whether an override's module pattern names ``module``, as mypy reads one: ``a.*`` is ``a`` and everything under
    it, ``a`` is ``a`` alone."""
    if pattern.endswith(".*"):
        return module == pattern[:-2] or module.startswith(pattern[:-1])
    return module == pattern


def loose(patterns: list[str]) -> list[str]:
    """The modules of the product that no pattern of ``patterns`` names, but those of :data:`NOT_STRICT`."""
    found = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if not any(covers(p, module) for p in patterns):
                found.append(module)
    return [m for m in found if not any(covers(f"{n}.*", m) for n in NOT_STRICT)]


def test_every_module_is_strict():
    """Every module of the product is on the strict list (but those of :data:`NOT_STRICT`, none); a new module or
    package joins it as it is written."""
    assert loose(strict()) == []


def test_a_module_left_off_the_strict_list_is_found():
    """The check above can fail: with any one entry of the strict list left out, the modules only it names are
    found loose (and an entry that names no module of its own is found too)."""
    patterns = strict()
    for left_out in patterns:
        assert loose([p for p in patterns if p != left_out]), f"{left_out}: no module is strict by it alone"
