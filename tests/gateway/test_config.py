"""Configuration: the precedence the config module promises (flags > environment > TOML > defaults),
backend groups, and the values derived from the `[policy]` table."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import COLOCATED_GROUP, Settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECGATE_"):
            monkeypatch.delenv(key)


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "specgate.toml"
    path.write_text(
        "[server]\nport = 9001\nlog_level = 'warning'\n\n[policy]\nname = 'threshold'\nthreshold = 3\n"
    )
    return path


def test_defaults_without_file_or_environment() -> None:
    settings = load_settings()
    assert (settings.server.port, settings.server.log_level, settings.policy.name) == (8000, "info", "adaptive")


def test_client_limits_default_to_nginx_like_timeouts_and_no_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = load_settings().limits
    assert (limits.client_header_timeout_seconds, limits.client_body_timeout_seconds, limits.max_connections_per_client) == (30, 30, 0)
    monkeypatch.setenv("SPECGATE_LIMITS__CLIENT_BODY_TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("SPECGATE_LIMITS__MAX_CONNECTIONS_PER_CLIENT", "64")
    limits = load_settings().limits
    assert (limits.client_body_timeout_seconds, limits.max_connections_per_client) == (2.5, 64)
    for bad in ({"client_header_timeout_seconds": 0}, {"client_body_timeout_seconds": -1}, {"max_connections_per_client": -1}):
        with pytest.raises(ValidationError):
            Settings.model_validate({"limits": bad})


def test_the_file_beats_the_defaults(toml: Path) -> None:
    settings = load_settings(toml)
    assert (settings.server.port, settings.policy.name, settings.policy.threshold) == (9001, "threshold", 3)
    assert settings.server.host == "127.0.0.1"  # unset in the file: the default


def test_the_environment_beats_the_file_key_by_key(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_SERVER__PORT", "9002")
    monkeypatch.setenv("SPECGATE_POLICY__THRESHOLD", "5")
    monkeypatch.setenv("SPECGATE_SECURITY__API_KEYS", '["k1", "k2"]')
    settings = load_settings(toml)
    assert (settings.server.port, settings.policy.threshold) == (9002, 5)
    # The file's other keys of the same tables survive.
    assert (settings.server.log_level, settings.policy.name) == ("warning", "threshold")
    assert [k.get_secret_value() for k in settings.security.api_keys] == ["k1", "k2"]


def test_flags_beat_the_environment_and_the_file(toml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGATE_SERVER__PORT", "9002")
    monkeypatch.setenv("SPECGATE_SERVER__LOG_LEVEL", "error")
    # What `specgate serve --port 9003 --policy spill` passes.
    settings = load_settings(toml, server={"port": 9003}, policy={"name": "spill"})
    assert (settings.server.port, settings.policy.name) == (9003, "spill")
    assert settings.server.log_level == "error"  # not given as a flag: the environment's
    assert settings.policy.threshold == 3  # not given anywhere else: the file's


def test_flags_keep_secrets_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text("[security]\napi_keys = ['secret']\n")
    settings = load_settings(path, server={"port": 1})
    assert [k.get_secret_value() for k in settings.security.api_keys] == ["secret"]


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.toml")


def backends(*specs: tuple[str, bool, str | None], **policy: Any) -> Settings:
    listed = [{"name": n, "url": f"http://{n}", "speculative": s, "group": g} for n, s, g in specs]
    return Settings.model_validate({"backends": listed, "policy": policy})


def groups_of(settings: Settings) -> dict[str, str | None]:
    return {b.name: b.group for b in settings.grouped_backends}


def test_a_backend_without_a_group_is_a_group_of_its_own() -> None:
    assert groups_of(backends(("e", True, None), ("p", False, None))) == {"e": "e", "p": "p"}
    assert groups_of(backends(("e", True, "g"), ("p", False, "g"))) == {"e": "g", "p": "g"}


def test_the_colocated_flag_makes_ungrouped_backends_one_group() -> None:
    settings = backends(("e", True, None), ("p", False, None), adaptive_colocated=True)
    assert groups_of(settings) == {"e": COLOCATED_GROUP, "p": COLOCATED_GROUP}
    # Groups named explicitly win over the flag.
    assert groups_of(backends(("e", True, "a"), ("p", False, "b"), adaptive_colocated=True)) == {"e": "a", "p": "b"}


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((("e", True, "g"), ("f", True, "g"), ("p", False, None)), "at most one speculative and one plain"),
        ((("e", True, None), ("e", False, None)), "unique"),
    ],
)
def test_invalid_backend_lists_are_refused(specs: tuple[tuple[str, bool, str | None], ...], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        backends(*specs)


def test_adaptive_serves_k_groups_and_lone_backends() -> None:
    settings = backends(("g0-e", True, "g0"), ("g0-p", False, "g0"), ("g1-e", True, "g1"), ("g1-p", False, "g1"))
    assert groups_of(settings) == {"g0-e": "g0", "g0-p": "g0", "g1-e": "g1", "g1-p": "g1"}
    assert groups_of(backends(("p", False, None), ("q", False, None))) == {"p": "p", "q": "q"}
    assert groups_of(backends(("e", True, None))) == {"e": "e"}


@pytest.mark.parametrize("policy", ["threshold", "spill"])
@pytest.mark.parametrize(
    "specs",
    [
        (("e", True, None), ("p", False, None), ("q", False, None)),
        (("e", True, None), ("f", True, None)),
        (("e", True, "g0"), ("p", False, "g0"), ("f", True, "g1"), ("q", False, "g1")),
    ],
)
def test_fixed_rules_serve_one_pair_only(policy: str, specs: tuple[tuple[str, bool, str | None], ...]) -> None:
    with pytest.raises(ValidationError, match=f"policy '{policy}' serves one pair only"):
        backends(*specs, name=policy)


def test_fixed_rules_refuse_a_launch_of_several_groups() -> None:
    launch = {"engine": "sim", "topology": "groups", "groups": [[0], [1]]}
    with pytest.raises(ValidationError, match="serves one pair only"):
        Settings.model_validate({"launch": launch, "policy": {"name": "spill"}})
    one = Settings.model_validate({"launch": {**launch, "groups": [[0]]}, "policy": {"name": "threshold"}})
    assert one.policy.name == "threshold"
    assert Settings.model_validate({"launch": launch}).resolved_policy.adaptive_colocated is True


def test_colocated_follows_the_launch_topology_unless_set() -> None:
    launched = Settings.model_validate({"launch": {"topology": "colocated"}})
    assert launched.resolved_policy.adaptive_colocated is True
    assert Settings.model_validate({}).resolved_policy.adaptive_colocated is False
    explicit = Settings.model_validate({"launch": {"topology": "colocated"}, "policy": {"adaptive_colocated": False}})
    assert explicit.resolved_policy.adaptive_colocated is False
