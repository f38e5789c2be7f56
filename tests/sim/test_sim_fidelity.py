"""The sim reproduces its profile's modelled throughput (issue 2's fidelity check).

Each role of `field-8gpu` is driven closed-loop at concurrency 1, 2, 8 and 32 with a fixed output
length at time-scale 0.1, and the measured output throughput is compared with
`Profile.closed_loop_throughput`, which counts the joining (prefill) step of every request and the
prefill of every cycle. The margin is 10%.
"""

from __future__ import annotations

import pytest

from backends.sim.profiles import load_profile
from tests.sim.closedloop import closed_loop
from tests.simproc import SimFactory

TIME_SCALE = 0.1
OUTPUT_TOKENS = 256
LEVELS = (1, 2, 8, 32)


@pytest.mark.simtiming
async def test_field_profile_throughput_matches_model(sims: SimFactory) -> None:
    profile = load_profile("field-8gpu")
    measured: dict[tuple[str, int], float] = {}
    for role in ("eagle", "plain"):
        sim = sims.start("--role", role, "--time-scale", str(TIME_SCALE), "--enable-metrics")
        for concurrency in LEVELS:
            result = await closed_loop(sim.url(), concurrency, OUTPUT_TOKENS, min_seconds=0.8)
            modelled = (
                profile.closed_loop_throughput(role, concurrency, OUTPUT_TOKENS, result.prompt_tokens) / TIME_SCALE
            )
            measured[role, concurrency] = result.output_tok_s
            assert result.output_tok_s == pytest.approx(modelled, rel=0.10), (role, concurrency, result, modelled)

    assert measured["eagle", 1] > measured["plain", 1]
    for concurrency in (2, 8, 32):
        assert measured["eagle", concurrency] < measured["plain", concurrency], concurrency
    assert measured["plain", 32] >= 1.8 * measured["eagle", 32]
