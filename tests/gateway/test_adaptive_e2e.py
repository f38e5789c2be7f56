"""End to end: `specgate serve` with its default policy (adaptive) in front of its simulated
field-8gpu backends.

Driven with the real `openai` client in closed loops at concurrency 1 and 8. The policy must
learn from the streamed responses that speculation pays only for a lone request (the profile's
crossover is ~1.7), route accordingly, and show what it believes on /admin/status and /metrics.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from backends.testbed import GatewayProcess, start_gateway
from tests.gateway.chat_load import closed_loop

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    gw = start_gateway(env={"SPECGATE_LAUNCH__TIME_SCALE": "0.5", "SPECGATE_SERVER__WORKERS": "1"})  # no --policy: the default
    try:
        yield gw
    finally:
        gw.stop()


async def test_learns_the_crossover_and_routes_by_it(gateway: GatewayProcess) -> None:
    await closed_loop(gateway, 2, 12)  # both backends measured
    lone = await closed_loop(gateway, 1, 30)
    assert lone["eagle"] >= 26, lone  # a lone request speculates (probes aside)
    busy = await closed_loop(gateway, 8, 64)
    # At 8 in flight the two servers' TPOT are equal near 3 on EAGLE, 5 on plain (field-8gpu);
    # either way both serve, and plain most.
    assert busy["plain"] > busy["eagle"] > 0, busy

    async with httpx.AsyncClient(base_url=gateway.url) as http:
        status = (await http.get("/admin/status")).json()["policy"]
        metrics = (await http.get("/metrics")).text
    assert status["name"] == "adaptive"
    beliefs = status["beliefs"]
    assert 0.7 <= beliefs["crossover_concurrency"] <= 4.0, beliefs
    fits = beliefs["backends"]
    assert fits["eagle"]["speculative"] is True and fits["plain"]["speculative"] is False
    # The steeper curve is EAGLE's: verify-heavy steps cost more per request (calibration.md: 2.8 vs 1.3 ms).
    assert _rise(fits["eagle"]["points"]) > _rise(fits["plain"]["points"]) > 0, fits
    assert set(beliefs["predicted_tpot_seconds"]) == {"eagle", "plain"}

    for backend in ("eagle", "plain"):
        assert re.search(rf'specgate_policy_predicted_tpot_seconds{{backend="{backend}"}} [0-9.e-]+', metrics)
    assert re.search(r"^specgate_policy_crossover_concurrency [0-9.e+-]+$", metrics, re.MULTILINE)
    reasons = set(re.findall(r'specgate_route_decisions_total{backend="\w+",reason="(\w+)"}', metrics))
    assert "adaptive_predicted_faster" in reasons
    known = {"adaptive_predicted_faster", "adaptive_explore", "adaptive_prior", "adaptive_cap", "adaptive_group_switch", "adaptive_group_stay"}
    assert reasons <= known, reasons


def _rise(points: list[list[float]]) -> float:
    """Seconds per token added per request in flight, from the first measured point to the last."""
    (n0, y0), (n1, y1) = points[0], points[-1]
    return (y1 - y0) / (n1 - n0)
