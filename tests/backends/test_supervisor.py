"""The supervisor, with the simulator as the supervised command (the SGLang code path, another argv).

Each test asserts on what happened (log stages, restart counts, the process table), never on how
long it took; the only waits are bounded polls for a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
import psutil
import pytest

from backends.config import LaunchConfig
from backends.plan import LaunchPlan, ProcessSpec, build_plan
from backends.process import Child
from backends.supervisor import Supervisor, SupervisorError

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAST = {"time_scale": 0.05}

Factory = Callable[..., Supervisor]


def sim_plan(**values: object) -> LaunchPlan:
    return build_plan(LaunchConfig.model_validate({**FAST, **values}), eagle_cap=2)


def chained(plan: LaunchPlan, prefix: str = "") -> LaunchPlan:
    """`plan`'s two processes as one co-located group: the second starts once the first is ready.

    With a `prefix`, process and backend names get it (as the groups topology names them).
    """
    first, second = plan.processes

    def named(p: ProcessSpec, after: str | None) -> ProcessSpec:
        endpoints = tuple(replace(e, backend=prefix + e.backend) for e in p.endpoints)
        return replace(p, name=prefix + p.name, endpoints=endpoints, start_after=after)

    return replace(plan, processes=(named(first, None), named(second, prefix + first.name)))


def wrapped(plan: LaunchPlan, name: str, shell: str) -> LaunchPlan:
    """`plan` with process `name` started through `sh -c shell` (which ends in `exec "$@"`)."""
    processes = tuple(
        replace(p, argv=("sh", "-c", shell, "sh", *p.argv)) if p.name == name else p for p in plan.processes
    )
    return replace(plan, processes=processes)


def own_descendants() -> list[psutil.Process]:
    """Live (non-zombie) processes below this test process."""
    alive = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll `check` until true; fail after `timeout` (a bound for a broken feature, not a measurement)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def ready_status(url: str) -> int | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/ready") as resp:
            return resp.status
    except aiohttp.ClientConnectorError:
        return None


@pytest.fixture
async def supervisors() -> AsyncIterator[Factory]:
    """Builds supervisors and always stops them; then nothing may be left in the process table."""
    made: list[Supervisor] = []

    def make(plan: LaunchPlan, **kwargs: object) -> Supervisor:
        options: dict[str, object] = {
            "startup_timeout": 60.0,
            "backoff_initial": 0.1,
            "backoff_max": 0.4,
            "stop_timeout": 10.0,
            "progress": False,
        }
        sup = Supervisor(plan, **{**options, **kwargs})  # type: ignore[arg-type]
        made.append(sup)
        return sup

    try:
        yield make
    finally:
        for sup in made:
            await sup.stop()
    assert own_descendants() == []


def stages(caplog: pytest.LogCaptureFixture, backend: str) -> list[str]:
    prefix = f"[{backend}] "
    return [
        r.getMessage()[len(prefix) :]
        for r in caplog.records
        if r.name == "specgate.supervisor" and r.getMessage().startswith(prefix)
    ]


async def test_start_waits_through_the_warm_up_503s(supervisors: Factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    plan = sim_plan(startup_delay=1.0)
    sup = supervisors(plan)
    await sup.start()
    for endpoint in plan.endpoints:
        seen = stages(caplog, endpoint.backend)
        assert "warming up (503)" in seen, seen
        assert seen[-1].startswith("ready at ")
        assert await ready_status(endpoint.url) == 200


async def test_start_waits_through_connection_refused(supervisors: Factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    # SGLang binds its port only after loading weights; a sleeping wrapper behaves the same.
    plan = wrapped(sim_plan(), "eagle", 'sleep 1; exec "$@"')
    sup = supervisors(plan)
    await sup.start()
    seen = stages(caplog, "eagle")
    assert seen[0] == "loading (connection refused)" and seen[-1].startswith("ready at "), seen
    assert await ready_status(plan.endpoints[0].url) == 200


async def test_a_killed_backend_is_restarted_and_ready_again(
    supervisors: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    restarted: list[str] = []
    plan = sim_plan()
    sup = supervisors(plan, on_restart=restarted.append)
    await sup.start()
    old = sup.pids["plain"]
    os.kill(old, signal.SIGKILL)
    await eventually(lambda: sup.restarts["plain"] == 1)
    assert restarted == ["plain"] and sup.restarts == {"eagle": 0, "plain": 1}
    plain_url = plan.endpoints[1].url
    await eventually(lambda: _is_200(plain_url))
    assert sup.pids["plain"] != old
    assert any("exited with status -9 (SIGKILL)" in m for m in stages(caplog, "plain"))
    assert await ready_status(plan.endpoints[0].url) == 200  # the other one was never touched


async def _is_200(url: str) -> bool:
    return await ready_status(url) == 200


async def test_restart_backoff_doubles_up_to_the_cap(supervisors: Factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    sup = supervisors(sim_plan(), backoff_initial=0.1, backoff_max=0.2, stable_after=3600.0)
    await sup.start()
    for n in (1, 2, 3):
        pid = sup.pids["eagle"]
        os.kill(pid, signal.SIGKILL)
        await eventually(
            lambda n=n, pid=pid: sup.restarts["eagle"] == n and "eagle" in sup.pids and sup.pids["eagle"] != pid
        )
    delays = [m.rsplit("restarting in ", 1)[1] for m in stages(caplog, "eagle") if "restarting in" in m]
    assert delays == ["0.1 s", "0.2 s", "0.2 s"]


async def test_backoff_resets_after_a_stable_run(supervisors: Factory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    sup = supervisors(sim_plan(), backoff_initial=0.1, backoff_max=5.0, stable_after=0.0)
    await sup.start()
    for n in (1, 2):
        pid = sup.pids["eagle"]
        os.kill(pid, signal.SIGKILL)
        await eventually(
            lambda n=n, pid=pid: sup.restarts["eagle"] == n and "eagle" in sup.pids and sup.pids["eagle"] != pid
        )
    delays = [m.rsplit("restarting in ", 1)[1] for m in stages(caplog, "eagle") if "restarting in" in m]
    assert delays == ["0.1 s", "0.1 s"]


async def test_colocated_process_restart_counts_for_both_backends(supervisors: Factory) -> None:
    restarted: list[str] = []
    plan = sim_plan(topology="colocated")
    sup = supervisors(plan, on_restart=restarted.append)
    await sup.start()
    os.kill(sup.pids["colocated"], signal.SIGKILL)
    await eventually(lambda: sup.restarts == {"eagle": 1, "plain": 1})
    assert sorted(restarted) == ["eagle", "plain"]
    for endpoint in plan.endpoints:
        await eventually(lambda url=endpoint.url: _is_200(url))


async def test_sequential_plan_starts_the_next_only_when_the_previous_is_ready(
    supervisors: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plan = chained(sim_plan(startup_delay=0.5))
    assert plan.sequential
    sup = supervisors(plan)
    await sup.start()
    messages = [r.getMessage() for r in caplog.records]
    eagle_ready = next(i for i, m in enumerate(messages) if m.startswith("[eagle] ready at "))
    plain_started = next(i for i, m in enumerate(messages) if m.startswith("[plain] starting: "))
    assert eagle_ready < plain_started


async def test_groups_start_in_parallel_and_in_turn_within_each(
    supervisors: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    g0, g1 = chained(sim_plan(startup_delay=0.5), "g0-"), chained(sim_plan(startup_delay=0.5), "g1-")
    sup = supervisors(replace(g0, processes=(*g0.processes, *g1.processes)))
    await sup.start()
    messages = [r.getMessage() for r in caplog.records]

    def first(prefix: str) -> int:
        return next(i for i, m in enumerate(messages) if m.startswith(prefix))

    for group in ("g0", "g1"):
        assert first(f"[{group}-eagle] ready at ") < first(f"[{group}-plain] starting: ")
    # The second group's EAGLE server did not wait for the first group.
    assert first("[g1-eagle] starting: ") < first("[g0-eagle] ready at ")


async def test_stop_leaves_no_process_behind_even_a_grandchild_ignoring_sigterm(supervisors: Factory) -> None:
    # The wrapper leaves a grandchild in the backend's process group that ignores SIGTERM, the
    # way a stuck SGLang scheduler would; only the group SIGKILL after the leader exits gets it.
    plan = wrapped(sim_plan(), "plain", '(trap "" TERM; exec sleep 600) & exec "$@"')
    sup = supervisors(plan, stop_timeout=5.0)
    await sup.start()
    below = own_descendants()
    commands = [" ".join(p.cmdline()) for p in below]
    assert any(c.startswith("sleep 600") for c in commands), commands
    assert sum("backends.sim" in c for c in commands) == 2
    await sup.stop()
    assert own_descendants() == []
    # Reparented processes are no longer our descendants: check each one we saw by pid.
    assert_gone(below)


def assert_gone(procs: list[psutil.Process]) -> None:
    """Every process in `procs` has exited (a SIGKILL is delivered asynchronously: bounded wait)."""
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []


async def test_a_crashed_leader_is_detected_even_while_its_group_lingers(supervisors: Factory) -> None:
    # SGLang's launcher can die while its schedulers live on, holding its output pipe and GPU
    # memory: the crash must still be seen, the leftovers killed, the server restarted.
    plan = wrapped(sim_plan(), "plain", '(exec sleep 600) & exec "$@"')
    sup = supervisors(plan)
    await sup.start()
    leftovers = [p for p in own_descendants() if p.cmdline()[:2] == ["sleep", "600"]]
    assert len(leftovers) == 1
    os.kill(sup.pids["plain"], signal.SIGKILL)
    await eventually(lambda: sup.restarts["plain"] == 1)
    assert_gone(leftovers)
    await eventually(lambda: _is_200(plan.endpoints[1].url))


async def test_sigkill_after_stop_timeout_when_sigterm_is_ignored() -> None:
    script = 'trap "" TERM; echo trapped; sleep 600 & wait'
    child = Child("stubborn", ["sh", "-c", script])
    child.start()
    try:
        await eventually(lambda: "trapped" in child.tail)
        assert await child.stop(grace=0.5) == -signal.SIGKILL
    finally:
        child.signal_group(signal.SIGKILL)
    assert own_descendants() == []


async def test_early_exit_fails_start_with_the_last_output(supervisors: Factory) -> None:
    sup = supervisors(sim_plan(eagle={"extra_args": ["--served-model-name", "bad:name"]}))
    with pytest.raises(SupervisorError) as err:
        await sup.start()
    message = str(err.value)
    assert "exited with status" in message and "before it was ready" in message
    assert "may not contain ':'" in message  # the simulator's own complaint, from its output
    assert own_descendants() == []


async def test_startup_timeout_fails_start_and_stops_everything(supervisors: Factory) -> None:
    sup = supervisors(sim_plan(startup_delay=600.0), startup_timeout=1.0)
    with pytest.raises(SupervisorError, match=r"not ready after 1 s \(launch.startup_timeout\)"):
        await sup.start()
    assert own_descendants() == []


@pytest.mark.parametrize("sequential", [False, True], ids=["parallel", "sequential"])
async def test_a_cancelled_start_stops_what_it_started(supervisors: Factory, sequential: bool) -> None:
    # `specgate serve` cancels start() when SIGTERM arrives during a long model load.
    plan = chained(sim_plan(startup_delay=600.0)) if sequential else sim_plan(startup_delay=600.0)
    sup = supervisors(plan)
    starting = asyncio.create_task(sup.start())
    await eventually(lambda: len(sup.pids) == (1 if sequential else 2))
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert own_descendants() == []


async def test_missing_executable_fails_start_clearly(supervisors: Factory) -> None:
    plan = build_plan(LaunchConfig(engine="sglang", python="/nonexistent/python", model_path="/m"), eagle_cap=2)
    sup = supervisors(plan)
    with pytest.raises(SupervisorError, match="cannot start eagle \\(/nonexistent/python\\)"):
        await sup.start()


async def test_output_is_forwarded_with_the_process_name(
    supervisors: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plan = wrapped(sim_plan(), "eagle", 'echo "hello from the wrapper"; exec "$@"')
    sup = supervisors(plan)
    await sup.start()
    forwarded = [r.getMessage() for r in caplog.records if r.name == "specgate.backend"]
    assert "[eagle] hello from the wrapper" in forwarded


async def test_progress_display_runs_off_a_terminal(supervisors: Factory, capsys: pytest.CaptureFixture[str]) -> None:
    sup = supervisors(sim_plan(), progress=True)
    await sup.start()
    err = capsys.readouterr().err
    assert "eagle" in err and "plain" in err and "ready" in err


PDEATHSIG_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from backends.config import LaunchConfig
    from backends.plan import build_plan
    from backends.supervisor import Supervisor

    async def main():
        plan = build_plan(LaunchConfig(time_scale=0.05), eagle_cap=2)
        sup = Supervisor(plan, startup_timeout=60, backoff_initial=1, backoff_max=1, stop_timeout=5, progress=False)
        await sup.start()
        print(json.dumps(sup.pids), flush=True)
        await asyncio.sleep(600)

    """
)


@pytest.mark.parametrize(
    "runner", ["asyncio.run(main())", "import uvloop; uvloop.run(main())"], ids=["asyncio", "uvloop"]
)
def test_backends_die_with_specgate(runner: str) -> None:
    """If specgate itself is SIGKILLed (no cleanup runs), the kernel kills its backends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PDEATHSIG_SCRIPT + runner],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids: dict[str, int] = {}
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        assert set(pids) == {"eagle", "plain"}
        backends = [psutil.Process(p) for p in pids.values()]  # before the kill: they may die at once
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(backends, timeout=30)
        assert alive == []
    finally:
        proc.kill()
        proc.wait()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
