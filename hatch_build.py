"""Hatch build hook: compile gateway/relay/_sse.c, the relay's per-read check, into the wheel.

setuptools' `build_ext` does the compiling, with the compiler and flags the running Python was
built with. The extension is optional, as setuptools' `optional=True` makes it: without a C
compiler the wheel is pure Python and the relay applies the same rule in Python (`specgate serve`
says so). An editable install builds it next to its source, where the checkout's imports find it.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EXTENSION = "gateway.relay._sse"
SOURCE = "gateway/relay/_sse.c"


class CExtensionHook(BuildHookInterface):  # type: ignore[type-arg]
    """Builds `gateway.relay._sse` for the wheel (or in place, for an editable install)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        from setuptools import Distribution, Extension
        from setuptools.command.build_ext import build_ext

        self._build_dir = tempfile.mkdtemp(prefix="specgate-build-ext-")  # removed in finalize
        with contextlib.chdir(self.root):
            command = build_ext(Distribution({"ext_modules": [Extension(EXTENSION, [SOURCE], optional=True)]}))
            command.inplace = version == "editable"
            command.build_lib = str(Path(self._build_dir, "lib"))
            command.build_temp = str(Path(self._build_dir, "temp"))
            command.ensure_finalized()
            command.run()
            built = Path(self.root, command.get_ext_fullpath(EXTENSION))
        if not built.exists():  # optional: setuptools has said why
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["force_include"][str(built)] = f"gateway/relay/{built.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        shutil.rmtree(self._build_dir, ignore_errors=True)
