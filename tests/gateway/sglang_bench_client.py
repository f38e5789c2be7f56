"""Run `python -m sglang.benchmark.serving` with the given arguments, in SGLang's own venv.

The benchmark takes one constant, `FAKE_BOOTSTRAP_HOST` (used for prefill/decode disaggregation
only), from `sglang.srt.disaggregation.utils`, which imports SGLang's model configs, whose
multimodal ones import `torchvision`; no CPU build of torchvision exists for this venv's torch.
When that module cannot be imported, a stand-in holding the same constant takes its place;
everything the benchmark runs is SGLang's own code.
"""

from __future__ import annotations

import runpy
import sys
import types

try:
    import sglang.srt.disaggregation.utils  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("sglang.srt.disaggregation.utils")
    stand_in.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]  # SGLang 0.5.23's value
    sys.modules[stand_in.__name__] = stand_in

sys.argv[0] = "sglang.benchmark.serving"
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
