"""The layout holds the architecture: no import circle, and no module imports a layer above it.

Every import counts, including those inside functions and under TYPE_CHECKING: a circle hidden
from the interpreter is still a circle for the reader. The layers, lowest first, are LAYERS;
a unit is a package of `pipeline/` (or a module at its root, or `streams`). A unit may import
its own modules and any unit of a lower layer, never one of its own layer or above.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. Units on one line are peers: they must not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("redact", "ids", "retry", "docs_markers", "catalog"),
    ("model",),
    ("schemas_tool",),
    ("config",),
    ("selfmetrics",),
    ("wire",),  # codec, topics, Kafka clients, headers, ACLs, the edge
    ("detect", "decide", "capacity"),  # the pure core: judgements, decisions, capacity
    ("stages",),  # what each stage does with a record, and the table of stages
    ("runtime",),  # the embedded driver of the stage table, and replays through it
    ("sources",),  # ingest adapters
    ("sim",),  # the simulator (it speaks the sources' protocols)
    ("streams",),  # the faust driver of the stage table (its test harness runs the simulator)
    ("actuate",),  # what every actuator shares (defences, the action → echo step, Kafka lanes)
    ("sinks", "lake", "kube", "slurm"),  # what consumes the topics
    ("backtest", "report"),
    ("demo",),
    ("cli_parser",),
    ("commands",),
    ("cli",),
)
LAYER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}

# Known exceptions, each with the issue that removes it. Empty is the goal.
ALLOWED: set[tuple[str, str]] = set()

# Import circles known and being removed (#36 item 4), each by its modules. Empty is the goal.
KNOWN_CIRCLES: list[set[str]] = []


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "streams":
        return "streams"
    if parts[0] != "pipeline" or len(parts) < 2:
        return None
    return parts[1]


def sources() -> list[Path]:
    files = [*(ROOT / "pipeline").rglob("*.py"), *(ROOT / "streams").rglob("*.py")]
    return sorted(f for f in files if "proto" not in f.parts and "__pycache__" not in f.parts)


def known_modules() -> set[str]:
    return {module_name(f) for f in sources()}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pipeline.wire import codec` imports the module codec; `from pipeline.model
            # import Finding` imports pipeline.model
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = known_modules()
    return {module_name(f): imports_of(f, known) - {module_name(f)} for f in sources()}


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in known_modules()} - {None}
    assert units <= set(LAYER), f"units without a layer in LAYERS: {sorted(units - set(LAYER))}"


def test_no_module_imports_a_layer_above_it() -> None:
    wrong: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, imported in import_graph().items():
        unit = unit_of(module)
        for other in imported:
            target = unit_of(other)
            if unit is None or target is None or target == unit:
                continue
            if LAYER[target] >= LAYER[unit] and (unit, target) not in ALLOWED:
                wrong[(unit, target)].append(f"{module} imports {other}")
    assert not wrong, "imports against the layer order:\n" + "\n".join(
        line for lines in wrong.values() for line in lines
    )


def test_allowed_exceptions_are_still_needed() -> None:
    used = set()
    for module, imported in import_graph().items():
        for other in imported:
            used.add((unit_of(module), unit_of(other)))
    stale = ALLOWED - used
    assert not stale, f"ALLOWED lists exceptions no import needs any more: {sorted(stale)}"


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(group)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle() -> None:
    unknown = [sorted(c) for c in circles(import_graph()) if c not in KNOWN_CIRCLES]
    assert not unknown, "import circles: " + "; ".join(" <-> ".join(c) for c in unknown)


def test_circles_finds_them() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [{"a", "b", "c"}]
    assert circles({"a": {"b"}, "b": set()}) == []
