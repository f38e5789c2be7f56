"""Every group's servers with their launch settings and every derived default filled in.

The `[launch]` table leaves most values unset; this module decides them (the GPU groups and
their names, TP size from the GPU list, ports, the EAGLE server's limits from the routing
policy's cap, the co-located memory split), so the plan, its warnings and `specgate plan` all see
the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from backends.config import LaunchConfig
from backends.memory import ModelMemory
from backends.process import free_loopback_port
from backends.sim.profiles import Profile, ProfileError, load_profile

EAGLE = "eagle"
PLAIN = "plain"
COLOCATED = "colocated"
GROUPS = "groups"

# Colocated servers' default shares of each GPU's memory when the model's size is not declared.
# Each holds a full copy of the weights plus its KV cache, and each needs its own activation and
# CUDA-graph headroom (SGLang reserves at least 10 GB per server on large GPUs), so together they
# stay well below one server's ~0.9. EAGLE gets less: it only ever runs the policy's few requests.
# When the sizes are known, `memory_split` replaces them with the same total split by memory.
COLOCATED_MEM_SHARE = {EAGLE: 0.3, PLAIN: 0.5}
# The plain server's KV room grows to hold the longest request only while EAGLE keeps this share of it:
# beyond, no split serves both well, and `specgate plan` weighs one-mode groups instead.
MIN_EAGLE_KV_SHARE = 0.25


class PlanError(ValueError):
    """The configuration cannot produce a runnable plan."""


def eagle_running_limit(eagle_cap: int) -> int:
    """Default `--max-running-requests` (and decode CUDA-graph batch) of the EAGLE server.

    The gateway sends it at most `eagle_cap` requests at once, but SGLang can briefly hold a few
    more: a non-streaming request whose client left is aborted only on SGLang's next 4 s poll, its
    own /health probe runs a 1-token generate, and the route header or a failover can add requests
    beyond the policy. A quarter more (at least 2) keeps those from queueing behind a full batch.
    It costs little: KV memory is sized by mem_fraction_static, not by this number, and the graph
    batch sizes SGLang captures for speculation are dense below 32, so the extra graphs are few.
    Sizing it from the cap instead of SGLang's defaults (48 running, 512-wide graphs on B200)
    is what leaves the memory to the plain server.
    """
    if eagle_cap < 0:
        raise PlanError(f"eagle_cap must be >= 0, got {eagle_cap}")
    return eagle_cap + max(2, math.ceil(eagle_cap / 4))


@dataclass(frozen=True)
class ResolvedServer:
    """One backend's launch settings with every derived default filled in."""

    role: str  # EAGLE or PLAIN: which template it came from
    name: str  # the backend's name: "eagle"/"plain", or "g0-eagle", "g0-plain", ... for topology = "groups"
    group: str  # the GPU group it runs in ("g0", ...; a partitioned server is a group of its own)
    gpus: tuple[int, ...]
    tp_size: int | None
    host: str
    port: int
    mem_fraction_static: float | None  # the value SGLang gets
    mem_share: float | None  # colocated and groups: this server's share of the whole GPU
    max_running_requests: int | None
    cuda_graph_max_bs_decode: int | None
    extra_args: tuple[str, ...]
    env: dict[str, str]

    @property
    def url(self) -> str:
        """Where the gateway reaches this server."""
        return f"http://{_connect_host(self.host)}:{self.port}"


@dataclass(frozen=True)
class ResolvedGroup:
    """A set of GPUs and the servers that share them (EAGLE first)."""

    name: str
    gpus: tuple[int, ...]
    servers: tuple[ResolvedServer, ...]

    @property
    def colocated(self) -> bool:
        """Whether an EAGLE and a plain server share this group's GPUs."""
        return len(self.servers) > 1


def shares_gpus(launch: LaunchConfig) -> bool:
    """Whether the topology co-locates an EAGLE and a plain server on each group's GPUs."""
    return launch.topology in (COLOCATED, GROUPS)


def resolve_groups(
    launch: LaunchConfig, *, eagle_cap: int, free_port: Callable[[], int] = free_loopback_port
) -> tuple[ResolvedGroup, ...]:
    """Every group and its servers with derived defaults (TP size, ports, EAGLE limits, memory split)."""
    running_limit = eagle_running_limit(eagle_cap)
    shares: dict[str, float | None] = _colocated_shares(launch) if shares_gpus(launch) else {EAGLE: None, PLAIN: None}
    fractions = _sglang_fractions(launch, shares)
    sim_cap = _sim_eagle_cap(launch, eagle_cap)
    groups = []
    for index, (group, gpus, roles) in enumerate(_group_layout(launch)):
        servers = []
        alone = launch.topology == GROUPS and len(roles) == 1  # a one-mode group: the server's own default memory
        for role in roles:
            cfg = launch.eagle if role == EAGLE else launch.plain
            own_gpus = tuple(cfg.gpus) or gpus  # a colocated server may name its own (the plan warns)
            max_running = cfg.max_running_requests
            graph_bs = cfg.cuda_graph_max_bs_decode
            if role == EAGLE and launch.engine == "sglang":
                max_running = max_running or running_limit
                graph_bs = graph_bs or max_running
            elif role == EAGLE and max_running is None:
                max_running = sim_cap
            servers.append(
                ResolvedServer(
                    role=role,
                    name=f"{group}-{role}" if launch.topology == GROUPS else role,
                    group=group,
                    gpus=own_gpus,
                    tp_size=cfg.tp_size or (len(own_gpus) or None),
                    host=cfg.host,
                    port=_port(launch, role, index if launch.topology == GROUPS else 0, free_port),
                    mem_fraction_static=None if alone else fractions[role],
                    mem_share=None if alone else shares[role],
                    max_running_requests=max_running,
                    cuda_graph_max_bs_decode=graph_bs,
                    extra_args=tuple(cfg.extra_args),
                    env=dict(cfg.env),
                )
            )
        groups.append(ResolvedGroup(name=group, gpus=gpus, servers=tuple(servers)))
    return tuple(groups)


def resolve_servers(
    launch: LaunchConfig, *, eagle_cap: int, free_port: Callable[[], int] = free_loopback_port
) -> tuple[ResolvedServer, ...]:
    """Every server of every group, in start order (a group's EAGLE server before its plain one)."""
    groups = resolve_groups(launch, eagle_cap=eagle_cap, free_port=free_port)
    return tuple(s for g in groups for s in g.servers)


def load_launch_profile(launch: LaunchConfig) -> Profile:
    """The simulator profile `[launch]` names; a bad one is a PlanError."""
    try:
        return load_profile(launch.profile, launch.profile_file)
    except ProfileError as exc:
        raise PlanError(f"launch.profile: {exc}") from exc


def _sim_eagle_cap(launch: LaunchConfig, eagle_cap: int) -> int | None:
    """A simulated EAGLE server's default cap: its profile's, but at least the policy's.

    The simulator's calibrated profile holds the capacity it models, but it must still run every
    request the policy sends it: a capped server would queue them, and its TPOT (from the first
    token) would hide that wait from the policy and the load test.
    """
    if launch.engine != "sim" or launch.eagle.max_running_requests is not None:
        return None
    return max(load_launch_profile(launch).eagle.max_running_requests, eagle_cap)


def _group_layout(launch: LaunchConfig) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
    """(group name, its GPUs, the roles it runs) for each group of the topology."""
    if launch.topology == GROUPS:
        gpu_sets = launch.group_gpus()
        first_plain_only = len(gpu_sets) - launch.plain_only_groups
        first_eagle_only = first_plain_only - launch.eagle_only_groups
        roles = [(EAGLE, PLAIN)] * first_eagle_only + [(EAGLE,)] * launch.eagle_only_groups + [(PLAIN,)] * launch.plain_only_groups
        return [(f"g{i}", gpus, roles[i]) for i, gpus in enumerate(gpu_sets)]
    if launch.topology == COLOCATED:
        return [("g0", tuple(launch.eagle.gpus or launch.plain.gpus), (EAGLE, PLAIN))]
    return [(EAGLE, tuple(launch.eagle.gpus), (EAGLE,)), (PLAIN, tuple(launch.plain.gpus), (PLAIN,))]


def _port(launch: LaunchConfig, role: str, index: int, free_port: Callable[[], int]) -> int:
    """The set port plus the group's index (0 outside topology "groups"), else a free one."""
    base = (launch.eagle if role == EAGLE else launch.plain).port
    if base is None:
        return free_port()
    if base + index > 65535:
        raise PlanError(f"launch.{role}.port = {base} plus group index {index} is above 65535; lower it")
    return base + index


def _colocated_shares(launch: LaunchConfig) -> dict[str, float | None]:
    given = {EAGLE: launch.eagle.mem_fraction_static, PLAIN: launch.plain.mem_fraction_static}
    shares: dict[str, float | None] = dict(colocated_shares(given, _memory_split_default(launch)))
    total = sum(s for s in shares.values() if s is not None)
    if total >= 1.0:
        raise PlanError(
            f"colocated mem_fraction_static shares add up to {total:.2f} of the GPU memory "
            f"(eagle {shares[EAGLE]}, plain {shares[PLAIN]}); they must stay below 1 (about 0.8 leaves "
            "both servers room for activations)"
        )
    return shares


def colocated_shares(given: dict[str, float | None], split: dict[str, float] | None) -> dict[str, float]:
    """Each co-located server's memory share: as given, else `split` (see `memory_split`), else the fixed default.

    With the sizes known (`split`) and one share set by hand, the other takes the rest of the same total.
    """
    shares = {role: given[role] or (split or COLOCATED_MEM_SHARE)[role] for role in (EAGLE, PLAIN)}
    eagle, plain = given[EAGLE], given[PLAIN]
    if split is not None and (eagle is None) != (plain is None):
        role, other = (PLAIN, EAGLE) if plain is None else (EAGLE, PLAIN)
        shares[role] = round(sum(COLOCATED_MEM_SHARE.values()) - shares[other], 3)
    return shares


def memory_split(
    memory: ModelMemory,
    gpus: int,
    total: float = sum(COLOCATED_MEM_SHARE.values()),
    eagle_kv_share: float = 0.5,
    plain_kv_floor_gb: float = 0.0,
) -> dict[str, float] | None:
    """Shares of a group's memory: each server its weights, the KV room left split `eagle_kv_share` to EAGLE;
    where neither server would get `plain_kv_floor_gb`, the plain one gets that (EAGLE keeping at least
    `MIN_EAGLE_KV_SHARE` of the room; beyond, the split stays as asked).

    The default (0.5, an even split) is the launcher's: the fixed 0.3/0.5 split starves whichever
    server the model's size squeezes: on 4 x 180 GB a 236 GB model does not even fit in 0.3, and
    with long contexts the EAGLE server runs out of KV room long before the policy stops sending it
    requests. Splitting what the two copies leave of the same total evenly keeps both servers'
    batches alike; `specgate plan` tries other splits for a given workload. The floor is the KV of
    the longest request the node must serve (`longest_request_tokens`): a request no server of a
    co-located group can hold is refused, where one server alone on the same GPUs would serve it
    (and the policy sends a request only to a server that holds it).
    Shares are rounded down to 0.001; None when the two copies do not fit in `total` (the memory
    check then says why).
    """
    whole = gpus * memory.gpu_memory_gb
    kv = total * whole - memory.weights_gb(True) - memory.weights_gb(False)
    if kv <= 0:
        return None
    plain_kv = kv * (1.0 - eagle_kv_share)
    if max(plain_kv, kv - plain_kv) < plain_kv_floor_gb <= kv * (1.0 - MIN_EAGLE_KV_SHARE):
        # Rounded up, so the plain server holds the whole request; EAGLE's share, rounded down, makes room.
        plain = math.ceil((memory.weights_gb(False) + plain_kv_floor_gb) / whole * 1000) / 1000
        return {EAGLE: math.floor((total - plain) * 1000 + 1e-6) / 1000, PLAIN: plain}
    kv_gb = {EAGLE: kv - plain_kv, PLAIN: plain_kv}
    return {
        role: math.floor((memory.weights_gb(role == EAGLE) + kv_gb[role]) / whole * 1000) / 1000
        for role in (EAGLE, PLAIN)
    }


def longest_request_kv_gb(launch: LaunchConfig) -> float:
    """KV room, GB, of the longest request a co-located plain server must hold (0: not known).

    The simulator knows its bytes per token and, unless `longest_request_tokens` says otherwise, takes
    its profile's context length; SGLang servers need both `kv_bytes_per_token` and `longest_request_tokens`.
    """
    if launch.engine == "sim":
        return request_kv_gb(load_launch_profile(launch), launch.longest_request_tokens)
    if launch.kv_bytes_per_token is None or launch.longest_request_tokens is None:
        return 0.0
    return launch.longest_request_tokens * launch.kv_bytes_per_token / 1e9


def request_kv_gb(profile: Profile, tokens: int | None = None) -> float:
    """KV room, GB, a simulated plain server needs for one request of `tokens` (default: the context length)."""
    return (tokens or profile.context_length) * profile.kv_bytes_per_token(PLAIN) / 1e9


def _memory_split_default(launch: LaunchConfig) -> dict[str, float] | None:
    """`memory_split` for the smallest group when the model's size and every group's GPU count are known."""
    if launch.engine == "sim":
        profile = load_launch_profile(launch)
        memory = profile.memory
        unlisted: int | None = profile.num_gpus
    elif launch.gpu_memory_gb is not None and launch.target_weights_gb is not None:
        memory = ModelMemory(launch.gpu_memory_gb, launch.target_weights_gb, launch.draft_weights_gb or 0.0)
        unlisted = None
    else:
        return None
    sizes = [len(gpus) or unlisted for _, gpus, roles in _group_layout(launch) if len(roles) > 1]
    if not sizes or None in sizes:
        return None
    return memory_split(memory, min(s for s in sizes if s is not None), plain_kv_floor_gb=longest_request_kv_gb(launch))


def _sglang_fractions(launch: LaunchConfig, shares: dict[str, float | None]) -> dict[str, float | None]:
    """What `--mem-fraction-static` each server gets.

    SGLang leaves `(1 - f) * (memory free when it starts)` unused, so `f` is a share of what is
    free at its start, not of the GPU. Colocated servers start one after the other (EAGLE first):
    the EAGLE server sees an empty GPU and gets its share as is; the plain server sees only
    `1 - eagle_share` free, so its share of the GPU becomes `plain_share / (1 - eagle_share)`
    (rounded down, so it never takes more than planned).
    """
    eagle_share, plain_share = shares[EAGLE], shares[PLAIN]
    if eagle_share is None or plain_share is None or launch.engine != "sglang":
        return {EAGLE: launch.eagle.mem_fraction_static, PLAIN: launch.plain.mem_fraction_static}
    return {EAGLE: eagle_share, PLAIN: math.floor(plain_share / (1.0 - eagle_share) * 1000) / 1000}


def _connect_host(host: str) -> str:
    # A server bound to every interface is still reached over loopback from the gateway.
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
