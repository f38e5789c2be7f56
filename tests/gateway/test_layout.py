"""The gateway package's import rules, checked on the source: no cycle among its modules (imports
inside functions count), and nothing from the simulator, the load tester or the tests."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"
FORBIDDEN = ("backends.sim", "loadtest", "tests", "benchmarks")
ENTRY_POINT = "gateway.__main__"  # `python -m gateway` runs the `specgate` command; nothing imports it


def module_name(path: Path) -> str:
    parts = path.relative_to(GATEWAY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module an import statement anywhere in `path` names (a `from m import x` names m and m.x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in GATEWAY.rglob("*.py")}
    return {name: imports_of(path) for name, path in modules.items() if name != ENTRY_POINT}


def test_gateway_imports_no_simulator_load_tester_or_tests() -> None:
    bad = {
        (module, target)
        for module, targets in graph().items()
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in FORBIDDEN)
    }
    assert not bad


def test_no_import_cycle_among_gateway_modules() -> None:
    imports = graph()
    edges = {m: {t for t in targets if t in imports and t != m} for m, targets in imports.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles
