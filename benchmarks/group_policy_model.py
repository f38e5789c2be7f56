"""A fast discrete-event model of K GPU groups under a closed loop, to judge group routing rules.

Each group is one GPU timeline. Its servers' steps take turns on it as in backends/sim (timeline.py's
FIFO lock): after a step, the other server of the group steps next if it has work, else the same one
again. A step admits waiting requests (FIFO, up to the server's running cap, its KV capacity and the
prefill budget), costs `step_ms(batch)` plus the prefill of its joiners, and yields the joiners their
first token and the decoders `tokens_per_step` (drafting: a seeded 1 + Binomial draw with mean tau,
as backends/sim/steps.py). Step times come from the profile's own `RoleProfile.step_ms`.

Per level, C clients send 128-token prompts for 128 output tokens back to back, max(8C, 32)
requests in all, from idle, one arrival at a time: a request that arrives while its server's
timeline is busy waits for the next step, an arrival at an idle group starts a step at once with
that request alone. Levels run in order 1, 2, 4, ..., 128 as the envelope runs them, and the
rule's memory (each group's recent load) carries over.

Targets, each on the same K groups of GPUs: plain DP, EAGLE DP and adaptive DP (one server per
group, least-in-flight balancer), and `gateway.policies.adaptive.rules.choose` with both servers per group,
given the profile's true TPOT lines, then lines, slopes or tau 15% off, then less one of its parts,
and today's co-located rule for comparison (HEADER says which is which).

Not modelled: the gateway hop, learning (the lines are given; no probes), the memory price of
co-location (each server keeps its profile's KV capacity; 128 requests of 256 tokens need 33k
tokens, far below either profile's capacities, so a split bites only where a server's share falls
below that).

Usage: python benchmarks/group_policy_model.py [--out docs/benchmarks/group-policy-model.md]
"""

from __future__ import annotations

import heapq
import random
import statistics
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from backends.sim.profiles import Profile, RoleProfile, load_profile
from gateway.policies.adaptive.rules import BackendState, TpotLine, choose

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
PROMPT, OUTPUT = 128, 128
EAGLE_CAP = 128  # the adaptive policy's default cap; the plan runs the EAGLE server at least this many
RECENT_RATE = 0.25  # EWMA rate of a group's recent load, per finished request
SCENARIOS = (("field-8gpu", 1), ("field-8gpu", 2), ("llama8b-h100", 8))
ERRORS = ((0.85, 0.85), (0.85, 1.15), (1.15, 0.85), (1.15, 1.15))


@dataclass(eq=False)
class Req:
    arrived: float
    produced: int = 0
    first: float = 0.0
    last: float = 0.0
    group_area: float = 0.0  # the group's load integral when it arrived


@dataclass(eq=False)
class Server:
    name: str
    table: RoleProfile
    speculative: bool
    cap: int
    rng: random.Random
    waiting: deque[Req] = field(default_factory=deque)
    running: list[Req] = field(default_factory=list)

    @property
    def inflight(self) -> int:
        return len(self.waiting) + len(self.running)

    def draw(self, batch: int) -> int:
        """Tokens one decoding request gains in a step at `batch` (mirrors backends/sim/steps.py)."""
        if not (self.table.is_speculating(batch) and self.table.num_draft_tokens > 1):
            return 1
        extra = self.table.num_draft_tokens - 1
        p = (self.table.tau - 1.0) / extra
        return 1 + sum(self.rng.random() < p for _ in range(extra))


@dataclass(eq=False)
class Group:
    index: int
    servers: list[Server]
    busy: Server | None = None  # the server whose step is running
    last: Server | None = None
    area: float = 0.0  # integral of the group's in-flight count over time
    since: float = 0.0
    recent: float = 0.0

    @property
    def inflight(self) -> int:
        return sum(s.inflight for s in self.servers)

    def account(self, now: float) -> None:
        self.area += self.inflight * (now - self.since)
        self.since = now


Router = Callable[[list[Group]], Server]


@dataclass(frozen=True)
class Result:
    throughput: float  # output tok/s
    tpot_p50: float  # ms
    eagle_share: float


def run_level(groups: list[Group], route: Router, clients: int, seed: int, max_prefill: int) -> Result:
    """One closed-loop level from idle; the groups' servers are empty when it starts and when it ends."""
    total = max(8 * clients, 32)
    heap: list[tuple[float, int, int]] = []
    seq = 0
    issued = 0
    tpots: list[float] = []
    on_eagle = 0
    now = 0.0

    def start_step(group: Group, server: Server, at: float) -> None:
        nonlocal seq
        prefill = 0
        joined = 0
        kv = len(server.running) * (PROMPT + OUTPUT)
        while server.waiting and len(server.running) < server.cap:
            if kv + PROMPT + OUTPUT > server.table.max_total_tokens or (joined and prefill + PROMPT > max_prefill):
                break
            server.running.append(server.waiting.popleft())
            kv += PROMPT + OUTPUT
            prefill += PROMPT
            joined += 1
        duration = server.table.step_ms(len(server.running)) + server.table.prefill_ms_per_token * prefill
        group.busy = server
        seq += 1
        heapq.heappush(heap, (at + duration, seq, group.index))

    def next_step(group: Group, at: float) -> None:
        order = group.servers if group.last is None else [s for s in group.servers if s is not group.last] + [group.last]
        for server in order:
            if server.inflight:
                start_step(group, server, at)
                return
        group.busy = None

    def arrive(at: float) -> None:
        nonlocal issued, on_eagle
        issued += 1
        server = route(groups)
        group = next(g for g in groups if server in g.servers)
        group.account(at)
        server.waiting.append(Req(arrived=at, group_area=group.area))
        on_eagle += server.speculative
        if group.busy is None:
            start_step(group, server, at)

    for _ in range(min(clients, total)):
        arrive(now)
    while heap:
        now, _, index = heapq.heappop(heap)
        group = groups[index]
        server = group.busy
        assert server is not None
        batch = len(server.running)
        done: list[Req] = []
        for req in server.running:
            if req.produced == 0:
                req.produced, req.first = 1, now
            else:
                req.produced = min(OUTPUT, req.produced + server.draw(batch))
            req.last = now
            if req.produced >= OUTPUT:
                done.append(req)
        group.account(now)
        for req in done:
            server.running.remove(req)
            tpots.append((req.last - req.first) / (OUTPUT - 1))
            mean_load = (group.area - req.group_area) / max(now - req.arrived, 1e-9)
            group.recent += RECENT_RATE * (mean_load - group.recent) if group.recent else mean_load
        group.last = server
        next_step(group, now)
        for _ in done:
            if issued < total:
                arrive(now)
    return Result(total * OUTPUT * 1000.0 / now, statistics.median(tpots), on_eagle / total)


def true_line(table: RoleProfile, scale: float = 1.0, slope: float = 1.0) -> TpotLine:
    """TPOT (ms) as a function of the server's own batch, step_ms / tokens_per_step (calibration.md),
    scaled as a whole by `scale` and in its slope alone by `slope`."""
    tau = table.tokens_per_step(1)
    return TpotLine(scale * table.step_ms(0) / tau, scale * slope * (table.step_ms(1) - table.step_ms(0)) / tau)


def least_inflight(groups: list[Group]) -> Server:
    return min((s for g in groups for s in g.servers), key=lambda s: s.inflight)


def rule_router(
    lines: dict[bool, TpotLine], taus: dict[bool, float], *, recent: bool = True, stay: bool = True, progress: bool = True
) -> Router:
    """`choose` over the groups' state; the ablations: `recent=False` hides the recent load,
    `stay=False` reports every in-flight request as done (a switch never looks costly), and
    `progress=False` every one as just started (what the rule sees if nobody measures progress)."""

    def route(groups: list[Group]) -> Server:
        states = []
        by_name: dict[str, Server] = {}
        for g in groups:
            for s in g.servers:
                by_name[s.name] = s
                remaining = (
                    sum(OUTPUT - r.produced for r in (*s.waiting, *s.running)) / (OUTPUT * s.inflight) if s.inflight else 1.0
                ) if stay and progress else (0.0 if not stay else 1.0)
                states.append(
                    BackendState(
                        s.name, f"g{g.index}", s.speculative, True, s.inflight,
                        EAGLE_CAP if s.speculative else None, lines[s.speculative], taus[s.speculative], remaining,
                    )
                )
        name, _ = choose(states, {f"g{g.index}": g.recent for g in groups if g.recent and recent})
        return by_name[name]

    return route


def todays_router(lines: dict[bool, TpotLine]) -> Router:
    """Today's co-located rule, per group: the least-loaded group, then the mode with the lower TPOT at its total load + 1."""

    def route(groups: list[Group]) -> Server:
        group = min(groups, key=lambda g: g.inflight)
        n = group.inflight + 1
        return min(group.servers, key=lambda s: (lines[s.speculative].at(n), not s.speculative))

    return route


def make_groups(profile: Profile, k: int, roles: tuple[str, ...], seed: int) -> list[Group]:
    groups = []
    for i in range(k):
        servers = []
        for role in roles:
            table = profile.role(role)  # type: ignore[arg-type]
            cap = max(table.max_running_requests, EAGLE_CAP) if role == "eagle" else table.max_running_requests
            servers.append(Server(f"{role}{i}", table, role == "eagle", cap, random.Random(seed * 1000 + i * 10 + len(servers))))
        groups.append(Group(i, servers))
    return groups


def run_target(
    profile: Profile, k: int, roles: tuple[str, ...], route: Router, seed: int, *, cold: bool = False
) -> dict[int, Result]:
    """Every level in order on the same groups; `cold`: each level on fresh groups (no recent load),
    i.e. a burst of C arrivals after a long idle spell."""
    groups = make_groups(profile, k, roles, seed)
    results = {}
    for c in LEVELS:
        if cold:
            groups = make_groups(profile, k, roles, seed)
        results[c] = run_level(groups, route, c, seed + c, profile.max_prefill_tokens)
    return results


HEADER = f"""\
Discrete-event model (step times from backends/sim/profiles.py, turn-taking as backends/sim/timeline.py),
{PROMPT} prompt / {OUTPUT} output tokens, max(8C, 32) requests per level, levels in order from idle, arrivals
one at a time; EAGLE servers run up to {EAGLE_CAP} requests, the rule's EAGLE cap is {EAGLE_CAP}. Ratios:
throughput / the best of plain DP, EAGLE DP and adaptive DP (K servers behind a least-in-flight
balancer); TPOT p50 / the lowest of those carrying the load (within 10% of the best throughput).
Absolute tok/s are modelled at time scale 1.

Targets: `rule` is gateway/policies/adaptive/rules.py given the profile's true TPOT lines. `slopes +-15%` and
`lines +-15%` give it lines whose slopes, or whole lines, are off by 15% (worst of the four EAGLE/plain
combinations at each level); `tau +-15%` an acceptance length 15% off. `without recent load` and
`without stay` are the rule less one of its parts; `without progress` is the rule told that every
in-flight request has just started (the gateway not measuring progress). `today's co-located rule`
is the least-loaded group, then the mode with the lower TPOT at the group's total load + 1. `cold bursts` runs every level on fresh groups with no history: C requests
arriving at once after a long idle spell."""

Ratios = tuple[list[float], list[float]]  # throughput and TPOT p50 ratios, one per level


def ratios(base: dict[str, dict[int, Result]], runs: list[dict[int, Result]]) -> Ratios:
    """Worst over `runs` at each level of throughput / best baseline and TPOT p50 / best carrying one."""
    thr, tpot = [], []
    for c in LEVELS:
        top = max(r[c].throughput for r in base.values())
        fast = min(r[c].tpot_p50 for r in base.values() if r[c].throughput >= 0.9 * top)
        thr.append(min(run[c].throughput for run in runs) / top)
        tpot.append(max(run[c].tpot_p50 for run in runs) / fast)
    return thr, tpot


def scenario(profile_name: str, k: int, seed: int) -> tuple[list[str], list[str]]:
    """The level table of one profile and K, and its rows of the summary table."""
    profile = load_profile(profile_name)
    base = {
        "plain DP": run_target(profile, k, ("plain",), least_inflight, seed),
        "EAGLE DP": run_target(profile, k, ("eagle",), least_inflight, seed),
        "adaptive DP": run_target(profile, k, ("adaptive",), least_inflight, seed),
    }
    e, p = profile.eagle, profile.plain
    taus = {True: e.tau, False: 1.0}
    truth = {True: true_line(e), False: true_line(p)}
    pair = ("eagle", "plain")

    def rule(**kwargs: bool) -> Router:
        return rule_router(truth, taus, **kwargs)

    def erred(scale: bool) -> list[dict[int, Result]]:
        return [
            run_target(profile, k, pair, rule_router({
                True: true_line(e, se, 1.0) if scale else true_line(e, 1.0, se),
                False: true_line(p, sp, 1.0) if scale else true_line(p, 1.0, sp),
            }, taus), seed)
            for se, sp in ERRORS
        ]

    exact = run_target(profile, k, pair, rule(), seed)
    variants: dict[str, list[dict[int, Result]]] = {
        "rule": [exact],
        "rule, slopes +-15%": erred(scale=False),
        "rule, lines +-15%": erred(scale=True),
        "rule, tau +-15%": [
            run_target(profile, k, pair, rule_router(truth, {True: e.tau * f, False: 1.0}), seed) for f in (0.85, 1.15)
        ],
        "rule without recent load": [run_target(profile, k, pair, rule(recent=False), seed)],
        "rule without stay": [run_target(profile, k, pair, rule(stay=False), seed)],
        "rule without progress": [run_target(profile, k, pair, rule(progress=False), seed)],
        "today's co-located rule": [run_target(profile, k, pair, todays_router(truth), seed)],
        "rule, cold bursts": [run_target(profile, k, pair, rule(), seed, cold=True)],
        "today's rule, cold bursts": [run_target(profile, k, pair, todays_router(truth), seed, cold=True)],
    }
    table = {name: ratios(base, runs) for name, runs in variants.items()}
    lines = [
        f"### {profile_name}, K={k}",
        "",
        "| C | best throughput, tok/s | best TPOT p50 ms, carrying the load | rule on EAGLE | "
        + " | ".join(f"{name}: tok/s, TPOT" for name in table) + " |",
        "|---|---|---|---|" + "---|" * len(table),
    ]
    for i, c in enumerate(LEVELS):
        top_name, top = max(((n, r[c]) for n, r in base.items()), key=lambda x: x[1].throughput)
        carrying = [(n, r[c]) for n, r in base.items() if r[c].throughput >= 0.9 * top.throughput]
        fast_name, fast = min(carrying, key=lambda x: x[1].tpot_p50)
        cells = " | ".join(f"{thr[i]:.3f}, {tpot[i]:.3f}" for thr, tpot in table.values())
        lines.append(
            f"| {c} | {top_name} {top.throughput:.0f} | {fast_name} {fast.tpot_p50:.2f} | {exact[c].eagle_share:.0%} | {cells} |"
        )
    summary = []
    for name, (thr, tpot) in table.items():
        i, j = thr.index(min(thr)), tpot.index(max(tpot))
        summary.append(f"| {profile_name} K={k} | {name} | {thr[i]:.3f} (C={LEVELS[i]}) | {tpot[j]:.3f} (C={LEVELS[j]}) |")
    return lines + [""], summary


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=None, help="also write the report here")
@click.option("--seed", type=int, default=0, show_default=True)
def main(out: Path | None, seed: int) -> None:
    """Print the rule's throughput and TPOT p50 ratios against the best same-hardware baseline."""
    tables, summary = [], []
    for name, k in SCENARIOS:
        levels, rows = scenario(name, k, seed)
        tables += levels
        summary += rows
    head = [
        "# Group routing rule: closed-loop model against the same GPUs run one way",
        "",
        f"Command: `python benchmarks/group_policy_model.py --seed {seed} --out docs/benchmarks/group-policy-model.md`",
        "",
        HEADER,
        "",
        "## Worst level per target",
        "",
        "| profile | target | worst throughput ratio | worst TPOT p50 ratio |",
        "|---|---|---|---|",
    ]
    text = "\n".join(head + summary + ["", "## Every level (throughput ratio, TPOT p50 ratio)", ""] + tables)
    sys.stdout.write(text + "\n")
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
