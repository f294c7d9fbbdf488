"""The dependency rules of docs/architecture.md, read from the source with ``ast`` (imports inside functions too):

- no import cycle between the project's modules;
- ``components.spec`` and ``components.tpu`` import nothing else of the project;
- ``trainers`` import from ``components`` only ``spec`` and ``tpu``;
- ``components.workload`` imports only ``spec`` and ``tpu``;
- ``components.cloud`` (the shared Google Cloud layer) imports only ``spec`` and the process helpers
  ``platforms.waiting`` and ``platforms.interrupts``;
- no platform imports another (``components.platforms.local`` and ``components.platforms.gke``), and the stages import
  the platform interface, never a platform;
- ``components.registry`` imports only ``spec`` and ``cloud.credentials``; ``components.data`` those,
  ``cloud.iam`` (a BigQuery account's grants) and ``workload.weights`` (the hub's listing and checked downloads);
- ``components`` never imports ``pipelines``; in ``pipelines``, the command line (``cli``) is imported by nothing else,
  a backend imports no other backend but those its rule names (and the interface, ``backends.base``, which imports
  none), the pipeline's definition imports no backend, and the command line reaches a backend only through the
  interface (``pipelines.backends``: ``Backend`` and the registry), but for the two commands that are no submission
  (``tpupipe run`` and ``teardown``: kfp.local in this process) and ``tpupipe publish``'s janitor schedule;
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
    "components.cloud",
    "components.spec",
    "components.tpu",
    "components.workload",
    "components.data",
)
GKE = "components.platforms.gke"
# The gke platform's layers, each importing only those after it (and anything outside the gke platform that the
# platforms' rule allows).
GKE_LAYERS = ("run", "checks", "cloud", "plan")
# The pipeline's definition and what every backend shares of it: the compiled pipelines, their check, the run ids.
PIPELINE_DEFINITION = (
    "pipelines.pipeline",
    "pipelines.janitor",
    "pipelines.check",
    "pipelines.run_ids",
    "pipelines.exits",
)
BACKEND_INTERFACE = "pipelines.backends.base"  # Backend, its answers' shapes and the Submission every backend takes
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
        "components.cloud",
        ("components.cloud", "components.spec", "components.platforms.waiting", "components.platforms.interrupts"),
        "the Google Cloud layer builds on spec and the process helpers only",
    ),
    (
        "components.registry",
        ("components.registry", "components.spec", "components.cloud.credentials"),
        "the registry builds on spec and the Google credentials only",
    ),
    (
        "components.data",
        (
            "components.data",
            "components.spec",
            "components.cloud.credentials",
            "components.cloud.iam",
            "components.workload.weights",
        ),
        "the data builds on spec, the Google credentials, the shared IAM reads and the hub's checked downloads only",
    ),
    ("components", ("components",), "components never import pipelines"),
    *[(pkg, ("components", pkg), "the pipeline's definition imports no backend") for pkg in PIPELINE_DEFINITION],
    (
        "pipelines.backends.local",
        ("components", "pipelines.backends.local", BACKEND_INTERFACE, *PIPELINE_DEFINITION),
        "the local backend imports no other backend",
    ),
    (
        "pipelines.backends.vertex",
        (
            "components",
            "pipelines.backends.vertex",
            BACKEND_INTERFACE,
            "pipelines.backends.local",
            "pipelines.publish.vertex",
            *PIPELINE_DEFINITION,
        ),
        "the Vertex AI backend imports of the others only the local backend's teardown of a run from its ledger and "
        "the Vertex publish",
    ),
    (
        "pipelines.backends.kfp",
        ("components", "pipelines.backends.kfp", "pipelines.backends.vertex", BACKEND_INTERFACE, *PIPELINE_DEFINITION),
        "the KFP backend imports of the others only the Vertex AI backend (the same published pipeline, its runs in "
        "the same shape)",
    ),
    (BACKEND_INTERFACE, ("components", BACKEND_INTERFACE), "the backend interface imports no backend"),
    (
        "pipelines.publish",
        ("components", "pipelines.publish", "pipelines.backends", *PIPELINE_DEFINITION),
        "publish imports no command line",
    ),
]
# The command line reaches a backend through the interface alone: of ``pipelines.backends`` it imports the package
# (``Backend``, ``get_backend``, what the flags name) and ``base``, nothing inside a backend's folder, but these, each
# from ``pipelines.cli.main`` only, for commands that are no operation of the interface.
CLI = "pipelines.cli"
CLI_REACHES = ("pipelines.backends", BACKEND_INTERFACE)
CLI_MAIN_ALSO = {
    "pipelines.backends.local.run": "tpupipe run and teardown run kfp.local in this process: no submission",
    "pipelines.backends.vertex.stopping": "tpupipe publish schedules the janitor on Vertex AI",
    "pipelines.backends.vertex.service_account": "tpupipe publish refuses the default account for the janitor",
}
# Who may not import what its rule above allows by prefix: the stages run on every platform through its interface.
FORBIDDEN = [("components.stages", PLATFORMS, "the stages import the platform interface, never a platform")]


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
        # inside components.platforms, but another platform
        others = [p for p in PLATFORMS if p != who] if who in PLATFORMS else []
        for module, deps in sorted(graph.items()):
            if not within(module, who):
                continue
            for dep in sorted(deps):
                if not any(within(dep, a) for a in allowed) or any(within(dep, o) for o in others):
                    out.append(f"{module} imports {dep}: {why}")
    for module, deps in sorted(graph.items()):
        if not within(module, CLI):
            continue
        for dep in sorted(deps):
            also = CLI_MAIN_ALSO if module == f"{CLI}.main" else {}
            if within(dep, "pipelines.backends") and dep not in CLI_REACHES and dep not in also:
                out.append(f"{module} imports {dep}: the command line reaches a backend only through the interface")
    for who, forbidden, why in FORBIDDEN:
        for module, deps in sorted(graph.items()):
            out += [
                f"{module} imports {dep}: {why}"
                for dep in sorted(deps)
                if within(module, who) and any(within(dep, f) for f in forbidden)
            ]
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
        (
            {"components/cloud/s.py": "from components.platforms.gke.checks import p\n"},
            "components.cloud.s imports components.platforms.gke.checks.p: the Google Cloud layer builds on spec and "
            "the process helpers only",
        ),
        (
            {"components/stages/t.py": "def f():\n    from components.platforms.local import cluster\n"},
            "components.stages.t imports components.platforms.local.cluster: the stages import the platform "
            "interface, never a platform",
        ),
        (
            {"components/stages/t.py": "from pipelines.backends.local import run\n"},
            "components.stages.t imports pipelines.backends.local.run: components never import pipelines",
        ),
        (
            {"pipelines/backends/local/x.py": "from pipelines.cli import main\n"},
            "pipelines.backends.local.x imports pipelines.cli.main: the local backend imports no other backend",
        ),
        (
            {"pipelines/cli/x.py": "def f():\n    from pipelines.backends.local import run\n"},
            "pipelines.cli.x imports pipelines.backends.local.run: the command line reaches a backend only through "
            "the interface",
        ),
        (
            {"pipelines/backends/base.py": "from pipelines.backends.local import run\n"},
            "pipelines.backends.base imports pipelines.backends.local.run: the backend interface imports no backend",
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
            "components/cloud",
            "components/stages",
            "pipelines",
            "pipelines/cli",
            "pipelines/backends",
            "pipelines/backends/local",
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
        "pipelines/cli/main.py": "",
        "pipelines/backends/local/run.py": "",
        "pipelines/cli/y.py": "from pipelines.backends import base\n",  # through the interface: allowed
        "pipelines/backends/base.py": "",
    }
    root = _tree(tmp_path, base | files)
    assert violations(import_graph(root)) == [expected]


def test_the_gke_platform_shows_its_layers_at_its_top_level():
    """A reader opening components/platforms/gke/ sees its layers, not its modules."""
    top = REPO / "components" / "platforms" / "gke"
    assert sorted(p.name for p in top.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file()) == sorted(GKE_LAYERS)


def test_the_pipelines_package_is_grouped_by_backend():
    """``pipelines/``: the command line, one folder per backend, publish; the pipeline's definition beside them."""
    top = REPO / "pipelines"
    assert sorted(p.name for p in top.iterdir() if (p / "__init__.py").is_file()) == ["backends", "cli", "publish"]
    backends = top / "backends"
    assert sorted(p.name for p in backends.iterdir() if (p / "__init__.py").is_file()) == ["kfp", "local", "vertex"]


# What only GKE needs; every adapter another platform or backend uses is in components/cloud/ (docs/architecture.md).
GKE_ONLY_ADAPTERS = ["clients", "cluster", "compute", "control_plane", "kube", "kueue", "ray_jobs", "transient"]


def test_the_gke_platform_keeps_only_its_own_cloud_adapters():
    gke_cloud = REPO / "components" / "platforms" / "gke" / "cloud"
    assert sorted(p.stem for p in gke_cloud.glob("*.py") if p.name != "__init__.py") == GKE_ONLY_ADAPTERS
    graph = import_graph(REPO)
    outside = {
        f"{module} imports {dep}"
        for module, deps in graph.items()
        if not within(module, GKE)
        for dep in deps
        if within(dep, f"{GKE}.cloud")
    }
    assert outside == set()
