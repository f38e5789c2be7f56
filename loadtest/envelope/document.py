"""results.json of an envelope run: the sweep's document with the stack, the ratios and the bound checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadtest.envelope.comparison import Bound, add_ratios
from loadtest.envelope.fair import FairEnvelope
from loadtest.envelope.harness import Envelope
from loadtest.report import build_document
from loadtest.results import LevelResult, ResultsDocument


def envelope_document(
    results: Sequence[LevelResult],
    envelope: Envelope | FairEnvelope,
    stack_info: dict[str, Any],
    command: str,
    bounds: Sequence[Bound],
    time_scale_note: str,
) -> ResultsDocument:
    """The envelope's results document, with ratios and checks (`doc.envelope.all_met`: every bound held)."""
    stack = envelope.stack
    profile = stack.profile or str(stack.profile_file)
    params = ", ".join(f"{k}={v}" for k, v in stack.policy_params.items())
    doc = build_document(
        "envelope", results, envelope.targets(), envelope.settings, command,
        title=f"Envelope: {profile}, {envelope.layout()}, policy {stack.policy}" + (f" ({params})" if params else ""),
        stack={
            "profile": stack.profile,
            "profile_file": str(stack.profile_file) if stack.profile_file else None,
            "topology": stack.topology,
            "policy": stack.policy,
            "policy_params": stack.policy_params,
            "eagle_max_running_requests": stack.eagle_max_running_requests,
            "time_scale": stack.time_scale,
            "time_scale_note": time_scale_note,
            "compare": envelope.comparison().kind,
            **stack_info,
        },
        preamble=[envelope.describe(), _scale_sentence(stack.time_scale, time_scale_note)],
    )
    return add_ratios(doc, envelope.comparison(), bounds)


def _scale_sentence(scale: float, note: str) -> str:
    return (
        f"Simulator time scale {scale:g} ({note}): every modelled duration is multiplied by it, "
        "so absolute tok/s are the model's divided by it; ratios between targets are unaffected. The workload's "
        "times (arrivals, think times, a trace's clock) and its SLOs are stretched by it too: a level offers the "
        "modelled servers the load its options name, and its offered req/s, on the wall clock, is that rate divided "
        "by the scale."
    )
