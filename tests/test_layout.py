"""The import rules of docs/architecture.md, read from its table and checked on the source.

Imports anywhere in a file count (inside functions and `TYPE_CHECKING` blocks too).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("specgate", "gateway", "backends", "loadtest", "tokencount", "vnode", "benchmarks", "tests")
_ROW = re.compile(r"^\|\s*`([\w.]+)`\s*\|.*\|\s*(.+?)\s*\|$")


@cache
def rules() -> dict[str, frozenset[str]]:
    """unit -> the units it may import, from the table between the layer markers."""
    text = DOC.read_text()
    table = text[text.index("<!-- layers:begin -->") : text.index("<!-- layers:end -->")]
    out: dict[str, frozenset[str]] = {}
    for line in table.splitlines():
        match = _ROW.match(line)
        if match:
            out[match[1]] = frozenset(re.findall(r"`([\w.*]+)`", match[2]))
    return out


def unit_of(module: str) -> str | None:
    """The unit a module belongs to: the longest unit name that prefixes it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in rules():
            return ".".join(parts[:n])
    return None


def may_import(unit: str, target: str) -> bool:
    allowed = rules()[unit]
    return target in allowed or "*" in allowed or (target.startswith("gateway.") and "gateway.*" in allowed)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every first-party module an import statement anywhere in `path` names (`from m import x`: m, and m.x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {n for n in names if n.split(".")[0] in PACKAGES}


def sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if ".venv" not in p.parts)


def test_every_module_belongs_to_a_unit_of_the_table() -> None:
    assert [str(p.relative_to(ROOT)) for p in sources() if unit_of(module_name(p)) is None] == []


def test_every_import_points_where_the_table_allows() -> None:
    bad = []
    for path in sources():
        unit = unit_of(module_name(path))
        assert unit is not None
        for name in sorted(imports_of(path)):
            target = unit_of(name)
            if target is not None and target != unit and not may_import(unit, target):
                bad.append(f"{path.relative_to(ROOT)} ({unit}) imports {name} ({target})")
    assert bad == []


def test_the_gateways_units_form_no_cycle() -> None:
    units = {u: {t for t in allowed if t in rules() and t.startswith("gateway")} for u, allowed in rules().items() if u.startswith("gateway")}
    assert _cycles(units) == []


def test_no_import_cycle_among_gateway_modules() -> None:
    modules = {module_name(p): p for p in (ROOT / "gateway").rglob("*.py") if p.name != "__main__.py"}
    edges = {m: {t for t in imports_of(path) if t in modules and t != m} for m, path in modules.items()}
    assert _cycles(edges) == []


def test_every_gateway_package_says_what_it_holds_and_may_import() -> None:
    missing = []
    for init in sorted((ROOT / "gateway").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent != ROOT / "gateway" and not doc:
            missing.append(str(init.relative_to(ROOT)))
    assert missing == []


def test_gateway_module_docstrings_state_contracts_briefly() -> None:
    long = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if len(doc.splitlines()) > 15:
            long[str(path.relative_to(ROOT))] = len(doc.splitlines())
    assert long == {}


def test_the_gateway_top_level_stays_small() -> None:
    """About a dozen modules beside the subpackages: the process top and the shared vocabulary."""
    assert len([p for p in (ROOT / "gateway").iterdir() if p.suffix == ".py"]) <= 12


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found
