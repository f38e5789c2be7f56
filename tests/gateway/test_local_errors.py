"""Which failures are the gateway's own (and leave the backends alone), and the descriptor budget."""

from __future__ import annotations

import errno
import resource
import shutil
import subprocess
import sys

import pytest

from backends.fdlimit import NofileLimit
from gateway.edge.descriptors import DESCRIPTORS_PER_REQUEST, hard_limit_warning, inflight_cap_warning, plan_budget
from gateway.upstream.errors import ConnectFailed, LocalResourceError, local_kind

def _connector_error(code: int) -> ConnectFailed:
    """The upstream client's connect failure, caused by an OSError of `code` (as the pool raises it)."""
    failed = ConnectFailed("cannot connect")
    failed.__cause__ = OSError(code, "x")
    return failed


@pytest.mark.parametrize(
    ("code", "kind"),
    [(errno.EMFILE, "emfile"), (errno.ENFILE, "enfile"), (errno.ENOBUFS, "enobufs"), (errno.EADDRNOTAVAIL, "eaddrnotavail")],
)
def test_out_of_local_resources_is_the_gateways_own_failure(code: int, kind: str) -> None:
    assert local_kind(OSError(code, "x")) == kind
    assert local_kind(_connector_error(code)) == kind
    try:
        try:
            raise OSError(code, "x")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert local_kind(outer) == kind


@pytest.mark.parametrize("code", [errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH, errno.ETIMEDOUT])
def test_refused_reset_or_unreachable_is_the_backends(code: int) -> None:
    assert local_kind(_connector_error(code)) is None
    assert local_kind(ConnectFailed("the connection closed before any response byte")) is None
    assert local_kind(TimeoutError()) is None


def test_a_full_pool_is_local() -> None:
    assert local_kind(LocalResourceError("pool_full", "no connection came free")) == "pool_full"


def test_the_budget_keeps_a_reserve_and_two_descriptors_per_request() -> None:
    budget = plan_budget(NofileLimit(soft_before=1024, soft=1024, hard=1024), reserve=64)
    assert DESCRIPTORS_PER_REQUEST == 2 and budget.capacity == (1024 - 64) // 2
    assert budget.admits(1024 - 64 - 1) and not budget.admits(1024 - 64)
    assert budget.describe(4096)["effective_max_inflight"] == budget.capacity


def test_a_limit_that_caps_max_inflight_is_warned_about() -> None:
    warning = inflight_cap_warning(1024, 64, 4096)
    assert warning is not None and "480" in warning and "4096" in warning and str(4096 * 2 + 64) in warning
    assert inflight_cap_warning(20000, 64, 4096) is None


def test_start_up_raises_the_soft_limit_to_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if (hard != resource.RLIM_INFINITY and hard < 2048) or shutil.which("prlimit") is None:
        pytest.skip("needs prlimit and a hard open-file limit >= 2048")
    code = "from backends.fdlimit import raise_nofile_limit as r; l = r(); print(l.soft_before, l.soft)"
    out = subprocess.run(["prlimit", "--nofile=256:2048", "--", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["256", "2048"]


def test_the_plan_warning_reads_the_hard_limit() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        assert hard_limit_warning(10**9) is None
    else:
        assert hard_limit_warning(hard) is not None and hard_limit_warning(1) is None
