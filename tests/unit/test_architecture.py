"""The dependency rules of docs/architecture.md, read from the source with ``ast`` (imports inside functions too):

- no import cycle between the project's modules;
- ``components.spec`` and ``components.tpu`` import nothing else of the project;
- ``trainers`` import from ``components`` only ``spec`` and ``tpu``;
- ``components.workload`` imports only ``spec`` and ``tpu``;
- no platform imports another (``components.platforms.local`` and ``components.platforms.gke``);
- ``components.registry`` and ``components.data`` import only ``spec`` and ``platforms.credentials``;
- inside ``components.platforms.gke``, imports point down its layers only: ``run`` -> ``checks`` -> ``cloud`` ->
  ``plan`` (a module of ``plan`` makes no call and imports no other layer; ``cloud`` imports ``plan`` alone).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("components", "pipelines", "trainers")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, anywhere in the file (``from a import b`` counts ``a.b`` when that is
    a module, else ``a``)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES if (root / pkg).is_dir() for p in sorted((root / pkg).rglob("*.py"))]
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, root, known) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None. A package's ``__init__`` importing its own
    submodules is not a cycle by itself: submodules that import their package's names do so through it."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if node.startswith(nxt + "."):  # a submodule importing its parent package: Python runs that first
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if state.get(nxt) is None:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


PLATFORMS = ("components.platforms.local", "components.platforms.gke")
SHARED_BY_PLATFORMS = (
    "components.platforms",
    "components.spec",
    "components.tpu",
    "components.workload",
    "components.data",
)
GKE = "components.platforms.gke"
# The gke platform's layers, each importing only those after it (and anything outside the gke platform that the
# platforms' rule allows).
GKE_LAYERS = ("run", "checks", "cloud", "plan")
RULES = [  # (who, may import from the project only these, why)
    ("components.spec", ("components.spec",), "spec imports nothing else of the project"),
    ("components.tpu", ("components.tpu",), "tpu imports nothing else of the project"),
    (
        "components.workload",
        ("components.workload", "components.spec", "components.tpu"),
        "workload builds on spec and tpu only",
    ),
    (
        "trainers",
        ("trainers", "components.spec", "components.tpu"),
        "trainers import from components only spec and tpu",
    ),
    *[(platform, (platform, *SHARED_BY_PLATFORMS), "no platform imports another") for platform in PLATFORMS],
    (
        "components.registry",
        ("components.registry", "components.spec", "components.cloud.credentials"),
        "the registry builds on spec and the Google credentials only",
    ),
    (
        "components.data",
        ("components.data", "components.spec", "components.cloud.credentials"),
        "the data builds on spec and the Google credentials only",
    ),
]


def gke_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for i, layer in enumerate(GKE_LAYERS):
        below = GKE_LAYERS[i + 1 :]
        for module, deps in sorted(graph.items()):
            if not within(module, f"{GKE}.{layer}"):
                continue
            for dep in sorted(deps):
                if within(dep, GKE) and not any(within(dep, f"{GKE}.{d}") for d in (layer, *below)):
                    out.append(
                        f"{module} imports {dep}: the gke layer {layer} imports only {', '.join(below) or 'itself'}"
                    )
    return out


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = gke_layer_violations(graph)
    for who, allowed, why in RULES:
        others = [p for p in PLATFORMS if p != who]  # inside components.platforms, but another platform
        for module, deps in sorted(graph.items()):
            if not within(module, who):
                continue
            for dep in sorted(deps):
                if not any(within(dep, a) for a in allowed) or any(within(dep, o) for o in others):
                    out.append(f"{module} imports {dep}: {why}")
    return out


def test_the_project_has_no_import_cycle():
    assert find_cycle(import_graph(REPO)) is None


def test_the_project_keeps_its_dependency_rules():
    assert violations(import_graph(REPO)) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_deliberate_cycle_is_found_even_inside_a_function(tmp_path):
    root = _tree(
        tmp_path,
        {
            "components/__init__.py": "",
            "components/spec/__init__.py": "",
            "components/a.py": "def f():\n    from components import b\n",
            "components/b.py": "from components.a import f\n",
        },
    )
    assert find_cycle(import_graph(root)) in (
        ["components.a", "components.b", "components.a"],
        ["components.b", "components.a", "components.b"],
    )


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {"components/spec/x.py": "def f():\n    from components.tpu import catalogue\n"},
            "components.spec.x imports components.tpu.catalogue: spec imports nothing else of the project",
        ),
        (
            {"trainers/t.py": "from components.workload import derive\n"},
            "trainers.t imports components.workload.derive: trainers import from components only spec and tpu",
        ),
        (
            {"components/platforms/gke/p.py": "from components.platforms.local import cluster\n"},
            "components.platforms.gke.p imports components.platforms.local.cluster: no platform imports another",
        ),
        (
            {"components/platforms/gke/cloud/c.py": "def f():\n    from components.platforms.gke.checks import p\n"},
            "components.platforms.gke.cloud.c imports components.platforms.gke.checks.p: the gke layer cloud imports "
            "only plan",
        ),
        (
            {"components/platforms/gke/plan/q.py": "from components.platforms.gke.cloud import c\n"},
            "components.platforms.gke.plan.q imports components.platforms.gke.cloud.c: the gke layer plan imports only "
            "itself",
        ),
        (
            {"components/registry/r.py": "from components.platforms import ledger\n"},
            "components.registry.r imports components.platforms.ledger: the registry builds on spec and the Google "
            "credentials only",
        ),
    ],
)
def test_a_forbidden_direction_is_reported(tmp_path, files, expected):
    base = {
        f"{d}/__init__.py": ""
        for d in (
            "components",
            "components/spec",
            "components/tpu",
            "components/workload",
            "components/platforms",
            "components/platforms/local",
            "components/platforms/gke",
            "components/platforms/gke/plan",
            "components/platforms/gke/cloud",
            "components/platforms/gke/checks",
            "components/platforms/gke/run",
            "components/registry",
            "trainers",
        )
    }
    base |= {
        "components/tpu/catalogue.py": "",
        "components/workload/derive.py": "",
        "components/platforms/local/cluster.py": "",
        "components/platforms/ledger.py": "",
        "components/platforms/gke/checks/p.py": "",
        "components/platforms/gke/cloud/c.py": "",
    }
    root = _tree(tmp_path, base | files)
    assert violations(import_graph(root)) == [expected]


MAX_LINES = 400  # a module longer than this does more than one thing: split it by responsibility


def test_no_module_is_longer_than_the_rule():
    long = {
        str(p.relative_to(REPO)): n
        for pkg in PACKAGES
        for p in sorted((REPO / pkg).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_gke_platform_shows_its_layers_at_its_top_level():
    """A reader opening components/platforms/gke/ sees its layers, not its modules."""
    top = REPO / "components" / "platforms" / "gke"
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file()) == sorted(GKE_LAYERS)
