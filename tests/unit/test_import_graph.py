"""The architecture as a test: no import cycles among our modules, and no import that
climbs a layer of `LAYERS` (docs/architecture.md). Every import counts, also those
inside functions and under TYPE_CHECKING (a lazy import that only hides a cycle is a
cycle, and one that climbs a layer still ties the lower layer to the upper)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("workers", "producer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Our modules that `path` imports (`from a import b` means `a.b` if a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [
                f"{node.module}.{alias.name}"
                if f"{node.module}.{alias.name}" in modules
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) - {_module_name(p)} for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# The layers, bottom-up. A row holds one or more units; a unit is a folder or a few
# modules (space-separated prefixes). A module may import its own unit and any unit
# of a lower row, never a unit of its own row or of a row above. Every module must
# belong to a unit: a new folder or flat module gets its place here first.
LAYERS: tuple[tuple[str, ...], ...] = (
    # shared value types, errors and policy (stdlib only)
    ("workers workers.models workers.errors workers.sizing workers.jsontext",),
    # the graders (pure) and what crosses Redis; neither knows the other
    ("workers.verifier", "workers.code", "workers.wire"),
    # which grader grades a rollout's kind
    ("workers.kinds",),
    # killable grading children; the verdict caches
    ("workers.sandbox", "workers.cache"),
    # one machine's grading engine: batch grader, embedded pool, inline grading
    ("workers.embedded",),
    # the line format both sides write and read
    ("workers.lines",),
    # the Celery fleet
    ("workers.fleet",),
    # `python -m workers`
    ("workers.__main__",),
    # the caller's side: errors and settings
    ("producer.errors producer.settings producer.extras",),
    ("producer.files", "producer.client"),
    ("producer.reports", "producer.adapters"),
    ("producer.serve",),
    ("producer.commands",),
    # the `gradefleet` console script and the package's lazy names
    ("producer producer.cli",),
)
ROOTS = {"workers", "producer"}  # a package root names itself only, not its tree


def _units(layers: tuple[tuple[str, ...], ...]) -> dict[str, tuple[int, str]]:
    """Each prefix -> (its row, its unit)."""
    return {
        prefix: (row, unit)
        for row, units in enumerate(layers)
        for unit in units
        for prefix in unit.split()
    }


def place(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> tuple[int, str]:
    """The row and unit of `module`: its longest prefix in `layers`."""
    units = _units(layers)
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in units and (end == len(parts) or prefix not in ROOTS):
            return units[prefix]
    raise LookupError(f"{module} is in no layer: add it to LAYERS")


def climbing_imports(
    graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS
) -> list[str]:
    """Every import that goes to its own row's other unit or to a higher row."""
    found = []
    for module in sorted(graph):
        row, unit = place(module, layers)
        for target in sorted(graph[module]):
            target_row, target_unit = place(target, layers)
            if target_unit != unit and target_row >= row:
                found.append(
                    f"{module} (row {row}) imports {target} (row {target_row})"
                )
    return found


def test_layers_catch_a_planted_reversed_import() -> None:
    layers = (("low",), ("mid_a", "mid_b"), ("top",))
    graph = {
        "low.x": {"low.y"},  # within a unit: free
        "low.y": set(),
        "mid_a.m": {"low.x"},  # down: fine
        "mid_b.n": {"mid_a.m"},  # sideways, to another unit of its row
        "top.t": {"mid_b.n", "low.y"},
        "low.z": {"top.t"},  # up: the reversed import
    }
    assert climbing_imports(graph, layers) == [
        "low.z (row 0) imports top.t (row 2)",
        "mid_b.n (row 1) imports mid_a.m (row 1)",
    ]


def test_layers_see_a_lazy_reversed_import(tmp_path: Path) -> None:
    source = tmp_path / "lazy.py"
    source.write_text("def f():\n    from producer.cli import main\n    return main\n")
    graph = {"workers.models": _imports(source, {"producer.cli", "workers.models"})}
    assert climbing_imports(graph) == [
        f"workers.models (row 0) imports producer.cli (row {len(LAYERS) - 1})"
    ]


def test_layers_place_every_module() -> None:
    for module in import_graph():
        place(module)  # raises for a module in no layer
    assert place("workers.wire.protocol") == place("workers.wire")
    assert place("workers")[0] == 0
    assert place("producer")[0] == len(LAYERS) - 1


def test_no_import_climbs_a_layer() -> None:
    assert climbing_imports(import_graph()) == []


def test_worker_side_imports_no_producer() -> None:
    graph = import_graph()
    assert [
        (module, target)
        for module, targets in graph.items()
        if module.startswith("workers")
        for target in targets
        if target.split(".")[0] == "producer"
    ] == []


def test_import_graph_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_import_graph_sees_our_modules() -> None:
    graph = import_graph()
    assert "workers.fleet.runtime" in graph["workers.fleet.tasks"]
    assert "workers.fleet.tasks" in graph["workers.fleet.app"]


def test_import_graph_has_no_cycles_in_workers_or_producer() -> None:
    assert cycles(import_graph()) == []
