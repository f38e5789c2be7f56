"""`python -m tests.layout_report`: each package's modules by length (a report; sizes are not a rule)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    for package in ("gateway", "backends", "loadtest", "specgate", "tokencount", "benchmarks"):
        files = sorted((ROOT / package).rglob("*.py"), key=lambda p: -len(p.read_text().splitlines()))
        total = sum(len(p.read_text().splitlines()) for p in files)
        print(f"{package}: {len(files)} modules, {total} lines")
        for path in files[:8]:
            print(f"  {len(path.read_text().splitlines()):5d}  {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
