"""Where each stored Responses API response lives: the backend that created it.

SGLang keeps a stored response (and the conversation a follow-up's `previous_response_id` continues)
in the memory of the server that generated it, for as long as that process lives: its store has
no expiry and no bound. So the gateway keeps no expiry either; it keeps the homes of the most
recent `capacity` responses and forgets the least recently used beyond that, which bounds its
memory (about 200 bytes an entry) whatever the traffic. A forgotten or never-seen id is answered
with a 404, as SGLang answers an id it does not hold; a backend that restarted lost its responses
and answers its own 404.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_CAPACITY = 100_000


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

    def home_of(self, response_id: str) -> str | None:
        """The backend holding `response_id`, or None when the gateway does not know it."""
        backend = self._homes.get(response_id)
        if backend is not None:
            self._homes.move_to_end(response_id)
        return backend
