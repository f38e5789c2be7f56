"""The package boundaries of docs/architecture.md, checked on the source (imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("specgate", "gateway", "backends", "loadtest", "tokencount", "benchmarks")
MAX_LINES = 400


def imports_of(path: Path) -> set[str]:
    """Every module an import statement anywhere in `path` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def offenders(paths: list[Path], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    def hits(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == f or name.startswith(f + ".") for f in prefixes)

    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in paths
        for name in sorted(imports_of(path))
        if hits(name, forbidden) and not hits(name, allowed)
    ]


def test_backends_know_nothing_of_the_gateway_or_the_load_tester() -> None:
    assert offenders(sources("backends"), ("gateway", "loadtest", "specgate", "tests", "benchmarks")) == []


def test_the_generic_load_tester_does_not_import_the_simulator() -> None:
    generic = [p for p in sources("loadtest") if "envelope" not in p.relative_to(ROOT / "loadtest").parts]
    assert offenders(generic, ("backends", "gateway", "specgate")) == []


def test_nothing_outside_tests_imports_tests() -> None:
    assert offenders(sources(*PRODUCT), ("tests",)) == []


@pytest.mark.parametrize("package", ["gateway", "backends", "loadtest", "specgate", "tokencount"])
def test_no_source_file_over_the_limit(package: str) -> None:
    long = {str(p.relative_to(ROOT)): n for p in sources(package) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
