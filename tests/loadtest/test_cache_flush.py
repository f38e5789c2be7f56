"""Flushing prefix caches between the targets that share servers (`envelope --compare single`, `sweep --flush-cache`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from backends.testbed import SimFactory
from loadtest.cli import main
from loadtest.cache_flush import CacheFlush
from loadtest.sweep import Level
from tests.aioserve import serving_app


def flush_answers(*statuses: int) -> tuple[web.Application, list[int]]:
    """An app whose `/flush_cache` answers `statuses` in turn (then the last forever); the answers it gave."""
    given: list[int] = []

    async def flush(_: web.Request) -> web.Response:
        status = statuses[min(len(given), len(statuses) - 1)]
        given.append(status)
        return web.Response(status=status, text="refused" if status != 200 else "flushed")

    app = web.Application()
    app.router.add_post("/flush_cache", flush)
    return app, given


async def test_a_refusal_while_requests_run_is_retried_until_the_server_flushes() -> None:
    app, given = flush_answers(400, 400, 200)
    async with serving_app(app) as url, CacheFlush([url], retry_interval=0.01) as flush:
        await flush("eagle", Level(concurrency=1))
    assert given == [400, 400, 200]


async def test_a_server_that_stays_busy_or_answers_otherwise_fails_the_run() -> None:
    busy, _ = flush_answers(400)
    broken, _ = flush_answers(500)
    async with serving_app(busy) as busy_url, serving_app(broken) as broken_url:
        async with CacheFlush([busy_url], timeout=0.1, retry_interval=0.01) as flush:
            with pytest.raises(RuntimeError, match="still ran requests 0.1 s after the level"):
                await flush("plain", Level(concurrency=1))
        async with CacheFlush([broken_url]) as flush:
            with pytest.raises(RuntimeError, match="answered 500"):
                await flush("plain", Level(concurrency=1))


async def test_the_simulator_is_flushed_once_its_request_ends_and_then_serves_the_prompt_cold(sims: SimFactory) -> None:
    url = sims.start("--role", "plain", "--time-scale", "0.5", "--enable-cache-report").url()
    body = {"model": "m", "messages": [{"role": "user", "content": "alpha " * 300}], "max_tokens": 200,
            "ignore_eos": True}
    async with aiohttp.ClientSession() as session:

        async def chat() -> int:
            async with session.post(f"{url}/v1/chat/completions", json={**body, "model": await model()}) as resp:
                details = (await resp.json())["usage"].get("prompt_tokens_details") or {}
                return int(details.get("cached_tokens", 0))

        async def model() -> str:
            async with session.get(f"{url}/v1/models") as resp:
                return str((await resp.json())["data"][0]["id"])

        await chat()
        assert await chat() > 250  # the prompt is cached
        running = asyncio.create_task(chat())
        await asyncio.sleep(0.3)
        assert not running.done()  # the flush is refused until the request ends, then done
        async with CacheFlush([url], retry_interval=0.02) as flush:
            await flush("plain", Level(concurrency=1))
        await running
        assert await chat() == 0


@pytest.mark.slow
def test_in_the_single_comparison_specgate_meets_each_level_with_the_caches_cold(tmp_path: Path) -> None:
    # At C=1 the threshold policy sends specgate's every request to the EAGLE server that `eagle`
    # ran the level on just before: without the flush, specgate would find all its prompts cached.
    result = CliRunner().invoke(main, [
        "envelope", "--compare", "single", "--profile", "field-8gpu", "--policy", "threshold", "--concurrency", "1",
        "--time-scale", "0.5", "--dataset", "shared-prefix", "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3",
        "--gsp-system-prompt-len", "200", "--gsp-question-len", "16", "--gsp-output-len", "4", "--warmup", "1",
        "--out", str(tmp_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    (level,) = json.loads((tmp_path / "results.json").read_text())["levels"]
    eagle, specgate = level["targets"]["eagle"], level["targets"]["specgate"]
    assert specgate["backend_share"] == {"eagle": 1.0}
    assert eagle["total_cached_tokens"] >= 2 * 2 * 200  # each group's later requests hit its system prompt
    assert specgate["total_cached_tokens"] == eagle["total_cached_tokens"]


def test_sweep_flush_cache_lets_each_target_meet_each_level_cold(sims: SimFactory, tmp_path: Path) -> None:
    # Two targets naming one server: without the flush the second finds every prompt the first sent.
    url = sims.start("--role", "plain", "--time-scale", "0.2", "--enable-cache-report").url()

    def cached(*flag: str) -> tuple[int, int]:
        out = tmp_path / (flag[0].strip("-") if flag else "plain")
        result = CliRunner().invoke(main, [
            "sweep", "--target", f"first={url}", "--target", f"second={url}", "--concurrency", "1", "--warmup", "0",
            "--dataset", "shared-prefix", "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3",
            "--gsp-system-prompt-len", "200", "--gsp-question-len", "16", "--gsp-output-len", "4", "--out", str(out), *flag,
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        (level,) = json.loads((out / "results.json").read_text())["levels"]
        return level["targets"]["first"]["total_cached_tokens"], level["targets"]["second"]["total_cached_tokens"]

    first, second = cached()
    assert second >= first + 2 * 200  # each group's first prompt too: the first target left it cached
    first, second = cached("--flush-cache")
    assert first == second >= 2 * 2 * 200  # each group's later prompts hit its system prompt, for both alike
