"""Which backend holds what a later request names: stored Responses API responses, native rids.

SGLang keeps a stored response (and the conversation a follow-up's `previous_response_id`
continues) in the memory of the server that made it, with no expiry and no bound. `ResponseHomes`
keeps the homes of the most recent `capacity` responses (least recently used forgotten first), and
the ids the gateway makes up name their backend (`response_id_for`), so such a response is found
even where the map never saw it (another worker, a restart); an id found neither way is asked for
on the backends (`gateway/api/responses.py`), and is a 404, as SGLang answers, where none has it. `RidTable` knows where each in-flight native `/generate` runs, for `/abort_request`.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable

DEFAULT_CAPACITY = 100_000
_TAGGED = re.compile(r"resp_([0-9a-f]{8})[0-9a-f]{32}")


def backend_tag(backend: str) -> str:
    """Eight hex digits that stand for a backend's name inside a response id."""
    return hashlib.sha256(backend.encode()).hexdigest()[:8]


def response_id_for(backend: str) -> str:
    """A new response id (SGLang wants the `resp_` prefix) that names `backend`."""
    return f"resp_{backend_tag(backend)}{uuid.uuid4().hex}"


class ResponseHomes:
    """A bounded map from response id to backend name, least recently used forgotten first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, backend: str) -> None:
        """Response `response_id` is stored on `backend`."""
        self._homes[response_id] = backend
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def home_of(self, response_id: str, backends: Iterable[str] = ()) -> str | None:
        """The backend holding `response_id`: remembered, else the one among `backends` its id names."""
        backend = self._homes.get(response_id)
        if backend is not None:
            self._homes.move_to_end(response_id)
            return backend
        tagged = _TAGGED.fullmatch(response_id)
        if tagged is None:
            return None
        return next((name for name in backends if backend_tag(name) == tagged[1]), None)


class RidTable:
    """Where each in-flight native request runs, by the request ids SGLang knows it by.

    Holds, per rid, a function telling the backend the request holds now (failover may move it
    before its first byte), so `/abort_request` can go to that backend alone.
    """

    def __init__(self) -> None:
        self._where: dict[str, Callable[[], str | None]] = {}

    def add(self, rids: tuple[str, ...], where: Callable[[], str | None]) -> None:
        """Track `rids` (an id the client reuses is tracked for its latest request)."""
        for rid in rids:
            self._where[rid] = where

    def discard(self, rids: tuple[str, ...], where: Callable[[], str | None]) -> None:
        """Stop tracking `rids` of the request that `where` belongs to."""
        for rid in rids:
            if self._where.get(rid) is where:
                del self._where[rid]

    def backend_of(self, rid: str) -> str | None:
        """The backend running `rid`, when the gateway knows it."""
        where = self._where.get(rid)
        return None if where is None else where()

    def __len__(self) -> int:
        return len(self._where)
