"""Where a request goes: the `Router` protocol, its refusal, and the least-in-flight balancer of the baselines.

A router is told of a request when it arrives (`route`: the index of the server it goes to, or
`Refused`), of every chunk of tokens streamed back to it (`chunk`: a step that yields k tokens to
a request is one chunk, as SGLang streams it; the first chunk carries the first token), and of its
end (`finish`: its output tokens, None when the server refused it). A router may move running
requests to other servers after a routing (`take_moves`) and a while after a response ended
(`drain_look`, `drain`). It gets the whole request, so a
router may route on its prompt (a cache-aware router keys on `Request.prompt_ids`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from backends.sim.core import EngineCore
from loadtest.envelope.balancer import LeastInFlight
from vnode.requests import Request


class Refused(Exception):
    """The request gets an HTTP error instead of a stream: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Router(Protocol):
    """Routes a target's requests to its servers and observes what they stream back."""

    def route(self, request: Request, now: float) -> int:
        """The index of the server `request` goes to (raises `Refused`). Requests arriving at one instant are
        routed one after another, each knowing nothing of the others still to come: a real gateway
        routes each request as it reads it, and a burst reaches it one request at a time."""
        ...

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        """A chunk of `tokens` tokens of `request` reached the client at `now`."""
        ...

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        """`request` ended at `now` with `output_tokens` (None: its server refused it), `cached_tokens` of
        its prompt taken from the server's prefix cache."""
        ...

    def take_moves(self) -> list[tuple[str, int]]:
        """The running requests (by rid) the last routing moves, each with the index of its new server."""
        ...

    def moved(self, request: Request, to: int, produced: int, now: float) -> None:
        """`request` goes on at server `to` with `produced` output tokens given back."""
        ...

    def resent(self, request: Request, to: int, now: float) -> None:
        """`request`, moved before its first token, was sent whole to server `to` at `now`."""
        ...

    def drain_look(self, now: float) -> DrainLook | None:
        """A response ended at `now` (after `finish`): when to call `drain`, if ever."""
        ...

    def drain(self, look: DrainLook) -> list[tuple[str, int]]:
        """At `look.at`: the running requests (by rid) that move, each with the index of its new server."""
        ...


@runtime_checkable
class EngineWatcher(Protocol):
    """A router that reads its servers' engines (their load reports), given them once the node has built them."""

    def engines_attached(self, cores: Sequence[EngineCore]) -> None:
        """The servers' engine cores, in the router's index order."""
        ...


@dataclass(frozen=True)
class DrainLook:
    """When a router looks at its running requests after a response ended, and what it noted then."""

    at: float
    mark: object


class NeverMoves:
    """The `Router` methods of a router that places each request once and never moves it (a balancer, SMG, a
    fixed assignment): no moves, no drains; being told of a move is a bug."""

    def take_moves(self) -> list[tuple[str, int]]:
        return []

    def moved(self, request: Request, to: int, produced: int, now: float) -> None:
        raise AssertionError(f"{type(self).__name__} moves nothing")

    def resent(self, request: Request, to: int, now: float) -> None:
        raise AssertionError(f"{type(self).__name__} moves nothing")

    def drain_look(self, now: float) -> DrainLook | None:
        return None

    def drain(self, look: DrainLook) -> list[tuple[str, int]]:
        return []


class LeastInFlightRouter(NeverMoves):
    """The data-parallel baselines' balancer: `loadtest.envelope.balancer.LeastInFlight` itself.

    A request counts from its choice until its response ends (ties rotate), as the real balancer
    counts it. With one server it is that server called directly.
    """

    def __init__(self, servers: Sequence[str]) -> None:
        self.balancer = LeastInFlight(servers)
        self._held: dict[str, int] = {}

    def route(self, request: Request, now: float) -> int:
        index = self.balancer.acquire()
        self._held[request.rid] = index
        return index

    def chunk(self, request: Request, now: float, tokens: int) -> None:
        pass

    def finish(self, request: Request, now: float, output_tokens: int | None, cached_tokens: int = 0) -> None:
        self.balancer.release(self._held.pop(request.rid))
