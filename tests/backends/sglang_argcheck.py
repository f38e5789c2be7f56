"""Runs inside the separate SGLang venv (SPECGATE_SGLANG_PYTHON), not under pytest.

Reads {"argvs": [[flag, ...], ...]} (server arguments, without `python -m sglang.launch_server`)
as JSON on stdin, passes each through SGLang's own `prepare_server_args`, and prints JSON:
the parser's exact option strings and, per argv, whether SGLang accepted it (with the error it
printed if not, and a few parsed values if so).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

from sglang.srt.server_args import ServerArgs, prepare_server_args

READ_BACK = (
    "model_path",
    "served_model_name",
    "host",
    "port",
    "tp_size",
    "mem_fraction_static",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "enable_metrics",
    "enable_cache_report",
    "extra_metric_labels",
    "api_key",
)


def option_strings() -> list[str]:
    """Every option string SGLang's parser defines, built the way prepare_server_args builds it."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return sorted(parser._option_string_actions)


def check(argv: list[str]) -> dict[str, Any]:
    """Parse one argv with SGLang; report acceptance and the values it resolved."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit as exc:
        return {"ok": False, "exit": exc.code, "error": err.getvalue().strip().splitlines()[-1:]}
    except Exception as exc:  # SGLang's own validation (asserts, ValueError) after parsing
        return {"ok": False, "exit": None, "error": [f"{type(exc).__name__}: {exc}"]}
    return {"ok": True, "values": {name: _plain(getattr(args, name, None)) for name in READ_BACK}}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, dict, list, type(None))) else repr(value)


def main() -> None:
    request = json.load(sys.stdin)
    result = {"option_strings": option_strings(), "results": [check(a) for a in request["argvs"]]}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
