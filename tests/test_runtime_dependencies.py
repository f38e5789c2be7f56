"""The gateway, launcher and simulator run on `[project].dependencies` alone: the loadtest extra stays optional."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Import every gateway and backends module with the loadtest extra's packages made unimportable.
PROBE = """
import importlib, pkgutil, sys
EXTRA = {"matplotlib", "numpy", "psutil", "tomli_w"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in EXTRA:
            raise ImportError("not a runtime dependency: " + name)
sys.meta_path.insert(0, Block())
import backends, gateway
failed = []
for pkg in (gateway, backends):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed.append(f"{info.name}: {exc}")
print("\\n".join(failed))
"""


def test_gateway_and_backends_import_without_the_loadtest_extra() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""
