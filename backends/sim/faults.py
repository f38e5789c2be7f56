"""Test-only fault injection: what can be switched on, and the set of faults active on one server.

Faults come from `POST /_test/fault` (only with `--enable-test-endpoints`) or `--test-fault` at start.
Durations in fault parameters are wall-clock seconds, not scaled by `--time-scale`. Stream faults are
read when a request starts, so switching one on does not change streams already running.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CrashFault(_Fault):
    """The process kills itself with SIGKILL at once (after answering this request)."""

    kind: Literal["crash"]


class HangFault(_Fault):
    """Every request (but `/_test/*`) is accepted and never answered; the engine stops stepping."""

    kind: Literal["hang"]
    freeze_engine: bool = Field(default=True, description="also stall requests already running")


class SlowFirstTokenFault(_Fault):
    """Each new request waits this long before it may join a batch."""

    kind: Literal["slow_first_token"]
    seconds: float = Field(gt=0)


class DropMidStreamFault(_Fault):
    """Each stream's TCP connection is closed, without ending the body, after this many chunks; a
    non-streamed response's after its headers and half its body."""

    kind: Literal["drop_mid_stream"]
    after_chunks: int = Field(default=1, ge=0)


class DrainingFault(_Fault):
    """`/ready` and `/health` answer 503 while requests are still served (SGLang after SIGTERM)."""

    kind: Literal["draining"]


class GarbageSseFault(_Fault):
    """Each stream emits a non-JSON `data:` event after this many chunks, then carries on; a
    non-streamed response's body is not JSON."""

    kind: Literal["garbage_sse"]
    after_chunks: int = Field(default=1, ge=0)


class TruncatedSseFault(_Fault):
    """Each stream ends after this many chunks with half an event and no `data: [DONE]`."""

    kind: Literal["truncated_sse"]
    after_chunks: int = Field(default=1, ge=0)


class StallBodyFault(_Fault):
    """A non-streamed response sends its headers and half its body, then nothing until the client leaves."""

    kind: Literal["stall_body"]


class ClearFault(_Fault):
    """Switch every fault off."""

    kind: Literal["clear"]


FaultSpec = Annotated[
    CrashFault
    | HangFault
    | SlowFirstTokenFault
    | DropMidStreamFault
    | DrainingFault
    | GarbageSseFault
    | TruncatedSseFault
    | StallBodyFault
    | ClearFault,
    Field(discriminator="kind"),
]
FAULT_ADAPTER: TypeAdapter[FaultSpec] = TypeAdapter(FaultSpec)
FAULT_KINDS = (
    "crash",
    "hang",
    "slow_first_token",
    "drop_mid_stream",
    "draining",
    "garbage_sse",
    "truncated_sse",
    "stall_body",
    "clear",
)


def parse_fault(text: str) -> FaultSpec:
    """A fault from a kind name (`hang`) or a JSON object (`{"kind": "slow_first_token", "seconds": 2}`)."""
    raw = text.strip()
    data = orjson.loads(raw) if raw.startswith("{") else {"kind": raw}
    return FAULT_ADAPTER.validate_python(data)


def describe_error(exc: ValidationError | orjson.JSONDecodeError) -> str:
    """A one-line reason a fault spec was refused."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
    return f"not valid JSON: {exc}"


@dataclass(frozen=True, slots=True)
class StreamFaults:
    """The faults a response applies to its body (streamed or not), fixed when it starts."""

    drop_after: int | None = None
    garbage_after: int | None = None
    truncate_after: int | None = None
    stall_body: bool = False


class FaultState:
    """Faults active on one server, by kind (setting a kind again replaces its parameters)."""

    def __init__(self) -> None:
        self.active: dict[str, _Fault] = {}

    def apply(self, fault: FaultSpec) -> None:
        """Switch `fault` on (`clear` switches all off). Crash is not kept: the caller acts on it."""
        if isinstance(fault, ClearFault):
            self.active.clear()
        elif not isinstance(fault, CrashFault):
            self.active[fault.kind] = fault

    def listing(self) -> list[dict[str, object]]:
        """The active faults as JSON objects."""
        return [fault.model_dump() for fault in self.active.values()]

    @property
    def hang(self) -> HangFault | None:
        """The active hang, if any."""
        fault = self.active.get("hang")
        return fault if isinstance(fault, HangFault) else None

    @property
    def draining(self) -> bool:
        """Whether health checks must fail."""
        return "draining" in self.active

    @property
    def first_token_delay(self) -> float:
        """Seconds each new request is held back."""
        fault = self.active.get("slow_first_token")
        return fault.seconds if isinstance(fault, SlowFirstTokenFault) else 0.0

    def stream_faults(self) -> StreamFaults:
        """Stream faults for a response starting now."""
        if not self.active:
            return _NO_STREAM_FAULTS
        drop = self.active.get("drop_mid_stream")
        garbage = self.active.get("garbage_sse")
        truncated = self.active.get("truncated_sse")
        return StreamFaults(
            drop_after=drop.after_chunks if isinstance(drop, DropMidStreamFault) else None,
            garbage_after=garbage.after_chunks if isinstance(garbage, GarbageSseFault) else None,
            truncate_after=truncated.after_chunks if isinstance(truncated, TruncatedSseFault) else None,
            stall_body="stall_body" in self.active,
        )


_NO_STREAM_FAULTS = StreamFaults()
