"""The planner's predictions against the real-time envelope of the planned layout, per level (docs/benchmarks/plan.md).

    python benchmarks/plan_agreement.py docs/benchmarks/plan-llama8b-h100-ctx8k

reads `plan.json` (`specgate plan --json`) and `results.json` (`python -m loadtest envelope --plan`) in that
directory and prints a markdown table: specgate's output throughput, TPOT p50 and E2E p50 predicted (model
time) and measured (wall time times the envelope's time scale, so both are model time), measured / predicted,
and the throughput ratio to the best same-hardware baseline, predicted and measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from loadtest.envelope.planned import PlannedLayout


def rows(plan: PlannedLayout, results: dict[str, Any]) -> list[str]:
    """The table's lines, header first."""
    scale = float(results["stack"]["time_scale"])
    lines = [
        "| level | tok/s predicted | tok/s measured | measured / predicted | TPOT p50 predicted | TPOT p50 measured | "
        "measured / predicted | E2E p50 predicted | E2E p50 measured | measured / predicted | throughput ratio "
        "predicted | throughput ratio measured | measured best baseline |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for predicted, level in zip(plan.predicted, results["levels"], strict=True):
        mine = level["targets"]["specgate"]
        tok_s = mine["output_tok_s"] * scale
        tpot = mine["tpot_p50_ms"] / scale
        e2e = mine["e2e_p50_ms"] / scale
        assert predicted.tpot_p50_ms is not None and predicted.e2e_p50_ms is not None
        lines.append(
            f"| {predicted.level} | {predicted.output_tok_s:.0f} | {tok_s:.0f} | {tok_s / predicted.output_tok_s:.3f} | "
            f"{predicted.tpot_p50_ms:.2f} | {tpot:.2f} | {tpot / predicted.tpot_p50_ms:.3f} | "
            f"{predicted.e2e_p50_ms:.0f} | {e2e:.0f} | {e2e / predicted.e2e_p50_ms:.3f} | "
            f"{predicted.throughput_ratio or 0:.3f} | {level['throughput_ratio']:.3f} | {level['best']['throughput']} |"
        )
    return lines


def main() -> None:
    directory = Path(sys.argv[1])
    plan = PlannedLayout.read(directory / "plan.json")
    results = json.loads((directory / "results.json").read_text())
    print("\n".join(rows(plan, results)))


if __name__ == "__main__":
    main()
