"""The health checker against scripted backends: each state it can set, and what clears it."""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from pydantic import SecretStr

from gateway.config import HealthConfig, TimeoutConfig
from gateway.pool.backends import Backend, Health, Pool
from gateway.pool.board import CARD_BYTES, LOAD_BYTES, Board, LoadBoard
from gateway.pool.health import HealthChecker
from gateway.upstream.client import UpstreamClient
from tests.gateway.fake_backend import MODEL, FakeBackend, refused_url, serving

FAST = HealthConfig(ready_interval=0.02, ready_timeout=1.0, health_interval=0.1, health_timeout=1.0)


@asynccontextmanager
async def checking(
    url: str, *, api_key: SecretStr | None = None, board: Board | None = None
) -> AsyncIterator[tuple[Backend, HealthChecker]]:
    backend = Backend("b", url, speculative=False)
    pool = Pool([backend], board)
    key = api_key.get_secret_value() if api_key else None
    upstream = UpstreamClient(url, api_key=key, timeouts=TimeoutConfig(), max_connections=4)
    await upstream.start()
    checker = HealthChecker(pool, {"b": upstream}, FAST)
    checker.start()
    try:
        yield backend, checker
    finally:
        await checker.stop()
        await upstream.close()


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_ready_backend_becomes_ready_with_its_model_discovered() -> None:
    async with serving(FakeBackend()) as fake, checking(fake.url) as (backend, _):
        await until(lambda: backend.health is Health.READY)
        assert backend.served_model_name == MODEL and backend.model_card is not None
        assert fake.gets[0] == "/health"  # a hung server is caught before the first request


async def test_probes_carry_no_key_but_the_model_listing_does() -> None:
    async with serving(FakeBackend()) as fake, checking(fake.url, api_key=SecretStr("k")) as (backend, _):
        await until(lambda: backend.health is Health.READY)
        by_path = dict(zip(fake.gets, fake.headers, strict=True))
        assert "Authorization" not in by_path["/health"]
        assert by_path["/v1/models"]["Authorization"] == "Bearer k"


async def test_a_503_ready_is_unready_and_a_refused_one_is_down() -> None:
    async with serving(FakeBackend(ready_status=503)) as fake, checking(fake.url) as (backend, _):
        await until(lambda: "/ready" in fake.gets)
        await until(lambda: backend.health is Health.UNREADY and "503" in backend.health_detail)
        fake.ready_status = 200
        await until(lambda: backend.health is Health.READY)
    async with checking(refused_url()) as (backend, _):
        await until(lambda: backend.health is Health.DOWN)


async def test_a_timed_out_backend_stays_failing_until_health_passes() -> None:
    async with serving(FakeBackend()) as fake, checking(fake.url) as (backend, checker):
        await until(lambda: backend.health is Health.READY)
        fake.health_status = 503
        checker.report_timeout("b", "stream went silent")
        assert backend.health is Health.FAILING
        probes = len(fake.gets)
        await until(lambda: fake.gets[probes:].count("/health") >= 2)  # /ready answers 200 all along
        assert backend.health is Health.FAILING
        fake.health_status = 200
        await until(lambda: backend.health is Health.READY)


async def test_an_unreachable_report_takes_effect_at_once() -> None:
    async with serving(FakeBackend()) as fake, checking(fake.url) as (backend, checker):
        await until(lambda: backend.health is Health.READY)
        checker.report_unreachable("b", "ClientConnectorError")
        assert backend.health is Health.DOWN
        await until(lambda: backend.health is Health.READY)  # woken at once, the next probe restores it


def _idle_checker(url: str, get: Callable[..., Any] | None = None) -> tuple[Backend, HealthChecker, UpstreamClient]:
    """A checker that is not polling, its one backend READY: only reports move the state."""
    backend = Backend("b", url, speculative=False)
    upstream = UpstreamClient(url, api_key=None, timeouts=TimeoutConfig(), max_connections=4)
    if get is not None:
        upstream.get = get  # type: ignore[method-assign]
    checker = HealthChecker(Pool([backend]), {"b": upstream}, FAST)
    checker.set_state(backend, Health.READY)
    backend.model_card = {"id": MODEL}
    return backend, checker, upstream


async def test_a_failed_connection_a_probe_confirms_takes_the_backend_out() -> None:
    backend, checker, upstream = _idle_checker(refused_url())
    await upstream.start()
    try:
        assert await checker.confirm_unreachable("b", "ClientConnectorError") is True
        assert backend.health is Health.DOWN
    finally:
        await upstream.close()


async def test_failures_a_probe_does_not_confirm_take_it_out_only_after_several_in_a_row() -> None:
    async with serving(FakeBackend()) as fake:
        backend, checker, upstream = _idle_checker(fake.url)
        await upstream.start()
        try:
            assert not await checker.confirm_unreachable("b", "ServerDisconnectedError")
            checker.report_success("b")  # a request got through: the run is over
            for _ in range(FAST.max_consecutive_failures - 1):
                assert not await checker.confirm_unreachable("b", "ServerDisconnectedError")
            assert backend.health is Health.READY
            assert await checker.confirm_unreachable("b", "ServerDisconnectedError")
            assert backend.health is Health.DOWN and "in a row" in backend.health_detail
            checker.start()
            await until(lambda: backend.health is Health.READY)  # one passing probe puts it back
        finally:
            await checker.stop()
            await upstream.close()


async def test_a_probe_the_gateway_could_not_send_changes_nothing() -> None:
    async def out_of_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EMFILE, "Too many open files")

    backend, checker, _ = _idle_checker(refused_url(), get=out_of_descriptors)
    assert not await checker.confirm_unreachable("b", "ClientConnectorError")
    assert backend.health is Health.READY


async def test_each_poll_of_a_ready_backend_keeps_its_own_loads_and_drops_them_when_it_is_not() -> None:
    report = {"version": "0.5.23", "num_accelerators": 1, "loads": [{"dp_rank": 0, "num_waiting_reqs": 2}]}
    async with serving(FakeBackend(loads=report)) as fake, checking(fake.url) as (backend, _):
        await until(lambda: backend.engine_load is not None)
        assert backend.engine_load is not None and backend.engine_load.ranks[0]["num_waiting_reqs"] == 2
        report["loads"] = [{"dp_rank": 0, "num_waiting_reqs": 7}]
        await until(lambda: backend.engine_load is not None and backend.engine_load.ranks[0]["num_waiting_reqs"] == 7)
        fake.ready_status = 503
        await until(lambda: backend.engine_load is None)  # an unready backend's figures are stale


async def test_a_backend_turns_ready_with_its_loads_already_known(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy fits long requests by a backend's KV capacity: the first request routed to it must see it."""
    seen: list[tuple[Health, bool]] = []
    set_state = HealthChecker.set_state

    def recording(self: HealthChecker, backend: Backend, health: Health, detail: str = "") -> None:
        if health is not backend.health:
            seen.append((health, backend.engine_load is not None))
        set_state(self, backend, health, detail)

    monkeypatch.setattr(HealthChecker, "set_state", recording)
    report = {"version": "0.5.23", "num_accelerators": 1, "loads": [{"dp_rank": 0, "max_total_num_tokens": 94303}]}
    async with serving(FakeBackend(loads=report)) as fake, checking(fake.url) as (backend, _):
        await until(lambda: backend.health is Health.READY)
        assert seen == [(Health.READY, True)]
        assert backend.engine_load is not None and backend.engine_load.kv_tokens == 94303
        fake.ready_status = 503
        await until(lambda: backend.health is not Health.READY)
        fake.ready_status = 200
        await until(lambda: backend.health is Health.READY)
        assert seen[-1] == (Health.READY, True)  # and again when it comes back


async def test_a_backend_without_v1_loads_is_ready_with_no_figures() -> None:
    async with serving(FakeBackend()) as fake, checking(fake.url) as (backend, _):
        await until(lambda: backend.health is Health.READY and "/v1/loads" in fake.gets)
        assert backend.engine_load is None


@pytest.fixture
def shared() -> Iterator[tuple[LoadBoard, Pool]]:
    """The parent's view of a two-process board, and a worker's pool on it."""
    owner = LoadBoard.create(1, 1)
    view = LoadBoard(owner.spec, 0)
    yield owner, Pool([Backend("b", "http://b", speculative=False)], view)
    view.close()
    owner.close(unlink=True)


def _worker_sees(pool: Pool, check: Callable[[Backend], bool]) -> bool:
    pool.sync()
    return check(pool["b"])


async def test_engine_loads_too_large_for_the_board_are_skipped_and_polling_goes_on(
    shared: tuple[LoadBoard, Pool], caplog: pytest.LogCaptureFixture
) -> None:
    owner, worker = shared
    caplog.set_level(logging.INFO, "specgate.pool")
    report: dict[str, Any] = {"loads": [{"dp_rank": 0, "num_waiting_reqs": 1}]}
    async with serving(FakeBackend(loads=report)) as fake, checking(fake.url, board=owner) as (backend, _):
        await until(lambda: _worker_sees(worker, lambda b: b.engine_load is not None))
        report["loads"] = [{"dp_rank": rank, "detail": "x" * 1000} for rank in range(LOAD_BYTES // 1000)]
        await until(lambda: "not shared with the other workers: engine loads" in caplog.text)
        assert len(backend.engine_load.ranks) > 1  # type: ignore[union-attr]  # this process keeps what it polled
        assert _worker_sees(worker, lambda b: b.engine_load is not None and len(b.engine_load.ranks) == 1)  # the last that fitted
        report["loads"] = [{"dp_rank": 0, "num_waiting_reqs": 7}]
        await until(lambda: _worker_sees(worker, lambda b: b.engine_load is not None and b.engine_load.ranks[0].get("num_waiting_reqs") == 7))
        assert "engine loads shared with the other workers again" in caplog.text


async def test_a_model_card_too_large_for_the_board_still_lets_its_backend_become_ready(
    shared: tuple[LoadBoard, Pool], caplog: pytest.LogCaptureFixture
) -> None:
    owner, _ = shared
    card = {"id": MODEL, "object": "model", "detail": "x" * CARD_BYTES}
    async with serving(FakeBackend(card=card)) as fake, checking(fake.url, board=owner) as (backend, _):
        await until(lambda: backend.health is Health.READY)
    assert "not shared with the other workers: model cards" in caplog.text
