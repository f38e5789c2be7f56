"""The workload's command-line options, shared by `sweep` and `envelope`, and what they choose.

`@workload_options` adds the options to a command and hands the command one `WorkloadChoice`
(keyword `workload`) instead of the options' values: the dataset, lengths, arrivals, service
tiers and SLOs, parsed and checked, with click errors that name the option at fault.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from loadtest.options import bad_parameter
from loadtest.stats import Slo
from loadtest.sweep import Level, RequestsPerLevel, parse_levels, parse_trace_levels
from loadtest.workloads.lengths import LENGTH_KINDS, LengthDist
from loadtest.workloads.level import RateStep
from loadtest.workloads.multi_turn import MultiTurn
from loadtest.workloads.random_prompts import RandomPrompts
from loadtest.workloads.shared_prefix import SharedPrefix
from loadtest.workloads.tiers import TierMix
from loadtest.workloads.trace import TraceError, TraceReplay
from loadtest.workloads.workload import DATASETS, Dataset

REQUESTS_HELP = "requests per level; 'Nx' means N per concurrency slot (N*C) [default: 4x closed loop, 64 open loop]"
RATE_HELP = (
    "open-loop levels: requests/s offered (e.g. 1,2,4,inf), arrivals Poisson or, with --burstiness, gamma; "
    "multi-turn conversations start at RATE / --turns per second, so a level offers RATE requests/s"
)
_POSITIVE = click.FloatRange(min=0.0, min_open=True)

_OPTIONS = (
    click.option("--dataset", type=click.Choice(DATASETS), default="random", show_default=True,
                 help="random: unique prompts; shared-prefix: bench_serving's generated-shared-prefix; multi-turn: "
                      "conversations re-sending their history; trace: a Mooncake JSONL trace on its own schedule"),
    click.option("--length-dist", type=click.Choice(LENGTH_KINDS), default=None,
                 help="how input and output lengths are drawn around --input-len/--output-len "
                      "[default: uniform with --range-ratio below 1, else fixed]"),
    click.option("--range-ratio", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True,
                 help="uniform lengths from [R*L, L] (as bench_serving's --random-range-ratio)"),
    click.option("--length-median-ratio", type=click.FloatRange(0.0, 1.0, min_open=True), default=0.5, show_default=True,
                 help="lognormal lengths: median / mean (mean L; clipped to [1, 32 L])"),
    click.option("--burstiness", type=_POSITIVE, default=1.0, show_default=True,
                 help="open-loop gaps: gamma with shape B, mean 1/rate (vLLM's); 1 = Poisson, lower is burstier"),
    click.option("--rate-step", default=None, metavar="LOW,HIGH,SECONDS",
                 help="one open-loop level whose rate steps from LOW up to HIGH requests/s and back, SECONDS each "
                      "(LOW x SECONDS + HIGH x SECONDS + LOW x SECONDS requests), arrivals as --burstiness says"),
    click.option("--gsp-num-groups", type=click.IntRange(min=1), default=64, show_default=True,
                 help="shared-prefix: system prompts (groups)"),
    click.option("--gsp-prompts-per-group", type=click.IntRange(min=1), default=16, show_default=True,
                 help="shared-prefix: requests per system prompt; a level sends groups x this"),
    click.option("--gsp-system-prompt-len", type=click.IntRange(min=0), default=2048, show_default=True,
                 help="shared-prefix: system prompt tokens"),
    click.option("--gsp-question-len", type=click.IntRange(min=1), default=128, show_default=True,
                 help="shared-prefix: question tokens"),
    click.option("--gsp-output-len", type=click.IntRange(min=1), default=256, show_default=True,
                 help="shared-prefix: output tokens"),
    click.option("--turns", type=click.IntRange(min=1), default=4, show_default=True,
                 help="multi-turn: turns per conversation"),
    click.option("--think-time", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
                 help="multi-turn: mean seconds between an answer and the next turn (exponential draws; 0: none)"),
    click.option("--tenants", type=click.IntRange(min=1), default=4, show_default=True,
                 help="multi-turn: tenants, each with its own system prompt shared by its conversations"),
    click.option("--system-prompt-len", type=click.IntRange(min=0), default=1024, show_default=True,
                 help="multi-turn: tokens of each tenant's system prompt"),
    click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="trace: a Mooncake JSONL file (timestamp ms, input_length, output_length, hash_ids)"),
    click.option("--trace-time-scale", default="1", show_default=True, metavar="LIST",
                 help="trace: one level per factor on the trace's clock (0.5 = twice as fast)"),
    click.option("--trace-start-ms", type=click.IntRange(min=0), default=0, show_default=True,
                 help="trace: the window starts here"),
    click.option("--trace-duration-ms", type=click.IntRange(min=1), default=None,
                 help="trace: the window's length [default: to the end]"),
    click.option("--num-requests", type=click.IntRange(min=1), default=None,
                 help="trace: at most this many requests of the window"),
    click.option("--tier-mix", default=None, metavar="TIER=SHARE,...",
                 help="send OpenAI's service_tier on these shares of the sessions (seeded), e.g. "
                      "priority=0.1,default=0.8,flex=0.1; the rest send none"),
    click.option("--slo-ttft-ms", type=_POSITIVE, default=None,
                 help="goodput counts requests with TTFT at most this (bench_serving's --goodput ttft:MS)"),
    click.option("--slo-tpot-ms", type=_POSITIVE, default=None,
                 help="goodput counts requests with TPOT at most this (streamed only)"),
)
_NAMES = (
    "dataset", "length_dist", "range_ratio", "length_median_ratio", "burstiness", "rate_step", "gsp_num_groups",
    "gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len", "gsp_output_len", "turns", "think_time",
    "tenants", "system_prompt_len", "trace_path", "trace_time_scale", "trace_start_ms", "trace_duration_ms",
    "num_requests", "tier_mix", "slo_ttft_ms", "slo_tpot_ms",
)


@dataclass(frozen=True)
class WorkloadChoice:
    """The workload the options chose; `levels`, `requests` and `settings` finish a command's SweepSettings."""

    dataset: Dataset
    lengths: LengthDist
    burstiness: float
    tier_mix: TierMix | None
    slo: Slo
    trace_time_scales: str
    rate_step: RateStep | None = None

    def levels(self, concurrency: str | None, request_rate: str | None, default_concurrency: str) -> tuple[Level, ...]:
        """The load levels: a trace's time scales, or closed-loop concurrencies, or open-loop rates, or a rate step."""
        if isinstance(self.dataset, TraceReplay):
            if concurrency is not None or request_rate is not None or self.rate_step is not None:
                raise click.UsageError("--dataset trace replays the trace on its own schedule: give --trace-time-scale, "
                                       "not --concurrency, --request-rate or --rate-step")
            try:
                return parse_trace_levels(self.trace_time_scales)
            except ValueError as exc:
                raise bad_parameter("--trace-time-scale", exc) from None
        if self.rate_step is not None:
            if concurrency is not None or request_rate is not None:
                raise click.UsageError("--rate-step is a level of its own: give it without --concurrency or --request-rate")
            return (Level(rate_step=self.rate_step),)
        if concurrency is not None and request_rate is not None:
            raise click.UsageError("give either --concurrency (closed loop) or --request-rate (open loop), not both")
        try:
            return parse_levels(concurrency or (None if request_rate else default_concurrency), request_rate)
        except ValueError as exc:
            raise bad_parameter("--request-rate" if request_rate else "--concurrency", exc) from None

    def requests(self, text: str | None, minimum: int, levels: tuple[Level, ...]) -> RequestsPerLevel:
        """`--requests-per-level` (and its minimum, closed loop only) for these levels."""
        if text is not None and isinstance(self.dataset, SharedPrefix | TraceReplay):
            sends = "every group's requests" if isinstance(self.dataset, SharedPrefix) else "the trace's window"
            raise click.UsageError(f"--requests-per-level does not apply to --dataset {self.dataset.name}: a level sends {sends}")
        if text is not None and self.rate_step is not None:
            raise click.UsageError("--requests-per-level does not apply to --rate-step: its rates and duration set the count")
        closed = levels[0].concurrency is not None
        try:
            per_level = RequestsPerLevel.parse(text or ("4x" if closed else "64"), minimum if closed else 0)
        except ValueError as exc:
            raise bad_parameter("--requests-per-level", exc) from None
        if not closed and per_level.per_slot:
            raise click.BadParameter("open-loop levels need an absolute count, not 'Nx'", param_hint="--requests-per-level")
        return per_level

    def settings(self) -> dict[str, Any]:
        """The SweepSettings fields the workload sets."""
        return {"dataset": self.dataset, "lengths": self.lengths, "range_ratio": self.lengths.range_ratio,
                "burstiness": self.burstiness, "tier_mix": self.tier_mix, "slo": self.slo}


def workload_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the workload options to a click command, which then takes `workload: WorkloadChoice`."""

    @functools.wraps(command)
    def with_workload(**kwargs: Any) -> None:
        kwargs["workload"] = _choice({name: kwargs.pop(name) for name in _NAMES})
        command(**kwargs)

    for option in reversed(_OPTIONS):
        with_workload = option(with_workload)
    return with_workload


def _choice(o: dict[str, Any]) -> WorkloadChoice:
    try:
        lengths = LengthDist.of(o["length_dist"], o["range_ratio"], o["length_median_ratio"])
    except ValueError as exc:
        raise bad_parameter("--length-dist", exc) from None
    try:
        tier_mix = TierMix.parse(o["tier_mix"]) if o["tier_mix"] is not None else None
    except ValueError as exc:
        raise bad_parameter("--tier-mix", exc) from None
    try:
        rate_step = RateStep.parse(o["rate_step"]) if o["rate_step"] is not None else None
    except ValueError as exc:
        raise bad_parameter("--rate-step", exc) from None
    return WorkloadChoice(_dataset(o), lengths, o["burstiness"], tier_mix, Slo(o["slo_ttft_ms"], o["slo_tpot_ms"]),
                          o["trace_time_scale"], rate_step)


def _dataset(o: dict[str, Any]) -> Dataset:
    name = o["dataset"]
    if (name == "trace") != (o["trace_path"] is not None):
        raise click.UsageError("--dataset trace needs --trace FILE" if name == "trace" else
                               f"--trace FILE is the trace dataset's; add --dataset trace (not {name})")
    if name == "trace" and o["burstiness"] != 1.0:
        raise click.UsageError("--burstiness shapes generated arrivals; a trace keeps its own")
    if name == "shared-prefix":
        return SharedPrefix(o["gsp_num_groups"], o["gsp_prompts_per_group"], o["gsp_system_prompt_len"],
                            o["gsp_question_len"], o["gsp_output_len"])
    if name == "multi-turn":
        return MultiTurn(o["turns"], o["think_time"], o["tenants"], o["system_prompt_len"])
    if name == "trace":
        try:
            return TraceReplay.load(o["trace_path"], o["trace_start_ms"], o["trace_duration_ms"], o["num_requests"])
        except TraceError as exc:
            raise bad_parameter("--trace", exc) from None
    return RandomPrompts()
