"""Where each stored Responses API response lives: the backend that created it.

SGLang keeps a stored response (and the conversation a follow-up's `previous_response_id` continues)
in the memory of the server that generated it, for as long as that process lives: its store has
no expiry and no bound. So the gateway keeps no expiry either; it keeps the homes of the most
recent `capacity` responses and forgets the least recently used beyond that, which bounds its
memory (about 200 bytes an entry) whatever the traffic. The ids the gateway makes up itself also
name their backend (`response_id_for`), so such a response is found even when the map forgot it
or never saw it (another gateway worker, a gateway restart). An id found neither way is answered
with a 404, as SGLang answers an id it does not hold; a backend that restarted lost its responses
and answers its own 404.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections import OrderedDict
from collections.abc import Iterable

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
