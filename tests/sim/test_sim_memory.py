"""The memory model: each server's KV room is its share of the group's memory minus its weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backends.memory import ServerShare, kv_tokens, max_groups
from backends.resolve import COLOCATED_MEM_SHARE, memory_split
from backends.sim.layout import LayoutError, ServerSlot, plan_layout
from backends.sim.profiles import BUILTIN_PROFILES, ROLES, ProfileError, Role, load_profile
from backends.sim.settings import SimSettings


def layout(profile: str, **options: Any) -> list[ServerSlot]:
    return plan_layout(SimSettings(profile=profile, **options), load_profile(profile))


def colocated(profile: str, groups: int = 1, **options: Any) -> list[ServerSlot]:
    return layout(profile, colocated=True, eagle_port=[0] * groups, plain_port=[0] * groups, **options)


def pair(eagle: float, plain: float) -> list[ServerShare]:
    return [ServerShare("eagle", eagle, True), ServerShare("plain", plain, False)]


@pytest.mark.parametrize("name", sorted(BUILTIN_PROFILES))
@pytest.mark.parametrize("role", ROLES)
def test_a_lone_server_keeps_its_profile_kv_capacity(name: str, role: Role) -> None:
    (slot,) = layout(name, role=role, port=[0])
    assert slot.max_total_tokens == load_profile(name).role(role).max_total_tokens


def test_colocated_kv_is_the_memory_share_minus_the_weights() -> None:
    profile = load_profile("llama8b-h100")
    eagle, plain = colocated("llama8b-h100")
    # The default split: an even one (about 15 GB of KV each) would hold 113k tokens in either server, short
    # of the model's 131,072-token context, so the plain server gets room for one such request (to 0.001, up)
    # and EAGLE the rest of 0.8 of the GPU.
    assert (eagle.mem_share, plain.mem_share) == (0.376, 0.424)
    assert eagle.kv_budget_gb == pytest.approx(0.376 * 80 - 16.1 - 0.9)
    assert plain.kv_budget_gb == pytest.approx(0.424 * 80 - 16.1)
    assert plain.max_total_tokens >= profile.context_length > eagle.max_total_tokens
    for slot in (eagle, plain):
        assert slot.max_total_tokens == kv_tokens(slot.kv_budget_gb, profile.kv_bytes_per_token(slot.role))
        # The second copy of the weights costs KV room: well below the server alone on the GPU.
        assert slot.max_total_tokens < 0.5 * profile.role(slot.role).max_total_tokens
    # A lone server at the profile's fraction holds the profile's tokens, so tokens scale with the budget.
    lone_budget = 0.88 * 80 - 16.1
    expected = profile.plain.max_total_tokens * plain.kv_budget_gb / lone_budget
    assert plain.max_total_tokens == pytest.approx(expected, abs=1)


def test_the_split_keeps_a_server_that_holds_the_longest_request() -> None:
    memory = load_profile("llama8b-h100").memory
    kv = 0.8 * 80 - 17.0 - 16.1  # what the two copies leave
    assert memory_split(memory, 1) == {"eagle": 0.405, "plain": 0.394}  # no floor: even
    # Either server holding the request is enough: EAGLE's three quarters already do.
    assert memory_split(memory, 1, eagle_kv_share=0.75, plain_kv_floor_gb=20.0) == memory_split(memory, 1, eagle_kv_share=0.75)
    # Neither would: the plain server gets the floor, EAGLE the rest of the same total.
    split = memory_split(memory, 1, plain_kv_floor_gb=20.0)
    assert split is not None and split["plain"] * 80 - 16.1 >= 20.0 and sum(split.values()) <= 0.8 + 1e-9
    # A floor EAGLE could not spare a quarter of the room for: the split stays as asked.
    assert memory_split(memory, 1, plain_kv_floor_gb=0.8 * kv) == memory_split(memory, 1)


def test_memory_flags_and_gpus_per_group_move_the_budget() -> None:
    eagle, plain = colocated("llama8b-h100", eagle_mem_fraction=0.4, plain_mem_fraction=0.45, gpus_per_group=2)
    assert eagle.gpus == plain.gpus == 2
    assert eagle.kv_budget_gb == pytest.approx(0.4 * 160 - 17.0)
    assert plain.kv_budget_gb == pytest.approx(0.45 * 160 - 16.1)
    (replica,) = layout("field-8gpu", role="plain", port=[0], gpus_per_group=4)
    profile = load_profile("field-8gpu")
    assert replica.kv_budget_gb == pytest.approx(0.81 * 4 * 180 - 236)
    assert replica.max_total_tokens < profile.plain.max_total_tokens / 2


def test_k_groups_each_get_their_own_group_index_and_budget() -> None:
    slots = colocated("llama8b-h100", groups=3)
    assert [(s.role, s.group) for s in slots] == [
        ("eagle", 0), ("plain", 0), ("eagle", 1), ("plain", 1), ("eagle", 2), ("plain", 2)
    ]  # fmt: skip
    assert len({s.max_total_tokens for s in slots if s.role == "eagle"}) == 1


def test_the_default_split_follows_the_declared_memory() -> None:
    # field-8gpu's 236 GB model: 0.3 of 4 x 180 GB cannot hold its copy, the memory split can.
    field = load_profile("field-8gpu")
    split = memory_split(field.memory, 4)
    assert split is not None and sum(split.values()) <= sum(COLOCATED_MEM_SHARE.values())
    eagle, plain = colocated("field-8gpu", gpus_per_group=4)
    assert (eagle.mem_share, plain.mem_share) == (split["eagle"], split["plain"])
    assert eagle.kv_budget_gb > 0 and eagle.kv_budget_gb == pytest.approx(plain.kv_budget_gb, rel=0.02)
    # Two copies that do not fit in 0.8 of the group leave no split: the fixed shares, then the refusal.
    assert memory_split(field.memory, 2) is None


def test_a_group_whose_copies_do_not_fit_is_refused_with_what_the_node_holds() -> None:
    with pytest.raises(LayoutError) as err:
        colocated("field-8gpu", gpus_per_group=4, eagle_mem_fraction=0.3, plain_mem_fraction=0.5)
    message = str(err.value)
    assert "eagle server's weights (238 GB) do not fit in its share 0.3 of 4 x 180 GB" in message
    assert "a node of 8 GPUs can hold 1 such group of 8 GPUs" in message
    with pytest.raises(LayoutError, match="shares add up to 1.00"):
        colocated("llama8b-h100", eagle_mem_fraction=0.5, plain_mem_fraction=0.5)
    with pytest.raises(LayoutError, match="plain server of 1 GPUs does not fit"):
        layout("field-8gpu", role="plain", port=[0], gpus_per_group=1)


def test_max_groups_of_the_built_in_profiles() -> None:
    field, llama = load_profile("field-8gpu"), load_profile("llama8b-h100")
    defaults = pair(COLOCATED_MEM_SHARE["eagle"], COLOCATED_MEM_SHARE["plain"])
    assert max_groups(field.memory, field.node_gpus, defaults) == 1
    assert max_groups(field.memory, field.node_gpus, pair(0.4, 0.5)) == 2  # 288 GB holds the 238 GB copy
    assert max_groups(llama.memory, llama.node_gpus, defaults) == 8
    assert max_groups(llama.memory, 8, pair(0.1, 0.5)) == 2  # 8 or 16 GB cannot hold 17 GB; 32 GB of 4 GPUs can


def test_profile_files_override_memory_and_a_lone_server_must_fit(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text("gpu_memory_gb = 141.0\ntarget_weights_gb = 20.0\n")
    profile = load_profile("llama8b-h100", path)
    assert profile.memory.gpu_memory_gb == 141.0 and profile.memory.weights_gb(True) == pytest.approx(20.9)
    path.write_text("target_weights_gb = 140.0\n")  # a 70B model in bf16 on one 80 GB GPU
    with pytest.raises(ProfileError, match="leave no KV room"):
        load_profile("llama8b-h100", path)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"colocated": True, "eagle_port": [1, 2], "plain_port": [3]}, "got 2 --eagle-port and 1 --plain-port"),
        ({"role": "plain", "port": [5, 5]}, "port 5 is given more than once"),
        ({"colocated": True, "eagle_port": [5], "plain_port": [5]}, "port 5 is given more than once"),
        ({"role": "plain", "port": [0], "eagle_mem_fraction": 0.2}, "only apply with --colocated"),
        ({"role": "plain", "port": [], "gpus_per_group": 1}, "give --role and --port"),
    ],
)
def test_topology_argument_errors(options: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        SimSettings(**options)
