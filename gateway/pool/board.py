"""What the workers of one gateway share: the `Board` protocol, one process's `LocalBoard`, and `LoadBoard`.

A pool writes its own per-backend numbers (in-flight count, load integral, expected output, relayed
chunks, served) and reads the whole gateway's; health states, model cards and engine loads are
published by whoever saw them; finished responses go through a ring every worker's policy replays
in the same order; the service tiers' lane counts decisions; tenants' limits keep their buckets
and in-flight counts (`tenant_region`, pool/tenant_limits.py); each client address's open
connections are counted against `limits.max_connections_per_client`; one routing decision is taken
at a time (`routing`). With one process all of that is its own (`LocalBoard`: nothing to publish).
With `[server] workers` > 1 it lives in one block of shared memory (`LoadBoard`): each worker writes
only its own row and readers sum the rows; the three locks (routing; the ring and the published
blobs; the client table) are flocks the kernel releases when their holder dies. Values are float64
(counts exact below 2**53), one aligned 8-byte store per cell, so a reader never sees half of one.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import functools
import hashlib
import os
import tempfile
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from multiprocessing import shared_memory
from types import TracebackType
from typing import Protocol

from gateway.pool.prefix import PrefixTable

# Per (worker, backend): in-flight, load integral, its time base, expected tokens, relayed chunks, served,
# the prompt tokens it was sent, it reported cached, and the prefix map predicted it held, the prompt
# tokens its in-flight requests were sent to prefill, and those every request routed to it was (ever; a
# stream's once its first token came).
INFLIGHT, AREA, SINCE, EXPECTED, CHUNKS, SERVED, PROMPT, CACHED, PREDICTED, HELD, SENT = range(11)
_FIELDS = 11
# Per worker: routing decisions made, and the gateway's decision count at its last priority one (0: none).
_CLOCK = 2
# Per completion record: backend index, output tokens, ttft, decode seconds, mean in-flight,
# mean group in-flight, token chunks, prompt tokens, cached tokens, output tokens given (a moved stream),
# prompt tokens its group prefilled while it decoded.
# A progress record (a stretch of a stream) has the same layout with no output tokens, ttft or prompt counts.
_RECORD = 11
PREFIX_SLOTS = 1 << 17  # prompt blocks the prefix map holds (pool/prefix.py): 3 MB, ~8M tokens of prefixes
RING = 4096  # completion records kept; a worker further behind than this skips the oldest
CARD_BYTES = 65536  # the backends' model cards (JSON), as the health checker discovered them
LOAD_BYTES = 65536  # the backends' own /v1/loads (JSON), as the health checker last polled them
# Client addresses with connections open, in a set-associative table: an address takes a free way of
# its bucket (one its key names, or one no worker counts a connection in); 16-byte keys, then a row
# of per-way counts per worker. An address whose bucket is full is let in uncounted.
CLIENT_BUCKETS, CLIENT_WAYS = 2048, 8
_CLIENT_SLOTS = CLIENT_BUCKETS * CLIENT_WAYS
_KEY_CELLS = 2  # 16 bytes
_HEADER = 5  # draining flag, completions written, model cards version, engine loads version, health version
_CARDS_VERSION, _LOADS_VERSION, _HEALTH_VERSION = 2, 3, 4
# Per tenant: its request bucket and its token bucket (each a GCRA time), then one in-flight cell per worker.
TENANT_REQUESTS, TENANT_TOKENS = 0, 1
TENANT_SHARED = 2
_LOCKS = ("routing", "records", "clients")  # the locks' files


class Board(Protocol):
    """What a pool shares with the gateway's other workers (see the module docstring)."""

    routing: AbstractContextManager[object]  # held from reading the counts to counting the slot
    draining: bool  # the gateway as a whole is shutting down
    prefix: PrefixTable  # which backends hold which prompt prefixes

    def write(self, backend: int, field: int, value: float) -> None:
        """Set this process's `field` (INFLIGHT, AREA, ...) for `backend`."""

    def total(self, backend: int, field: int) -> float:
        """`field` of `backend` for the whole gateway."""

    def load_area(self, backend: int, now: float) -> float:
        """The gateway's integral of `backend`'s in-flight count up to `now`."""

    @property
    def health_version(self) -> int:
        """Moves whenever `set_health` is called; 0 forever when nobody else publishes."""

    def set_health(self, backend: int, code: int) -> None:
        """Tell the other processes `backend`'s health state (its code)."""

    def health(self, backend: int) -> int:
        """`backend`'s health state as last published."""

    @property
    def cards_version(self) -> int: ...

    def write_cards(self, payload: bytes) -> None: ...

    def read_cards(self) -> tuple[int, bytes]: ...

    @property
    def loads_version(self) -> int: ...

    def write_loads(self, payload: bytes) -> None: ...

    def read_loads(self) -> tuple[int, bytes]: ...

    def publish(self, record: tuple[float, ...]) -> None:
        """Append one completion record (backend index, tokens, ttft, decode s, mean in-flight,
        mean group in-flight, token chunks, prompt tokens, cached tokens)."""

    def unread(self) -> list[tuple[float, ...]]:
        """Completion records published since this process last asked, oldest first."""

    def tick(self, priority: bool) -> None:
        """Count one routing decision; `priority`: it was a priority request's."""

    def since_priority(self) -> int | None:
        """Decisions since the last priority one (0: it was the last); None: never one."""

    def decisions(self) -> int:
        """Routing decisions the whole gateway has made."""

    def admit_client(self, key: bytes, cap: int) -> Callable[[], None] | None:
        """Count one more open connection of client address `key` (16 bytes) unless the gateway holds
        `cap` of its connections already; what uncounts it, or None (refused)."""

    def tenant_region(self, tenants: int) -> TenantRegion:
        """The cells of `tenants` tenants' limits (see `TenantRegion`), guarded by `routing`."""


@dataclass(frozen=True)
class TenantRegion:
    """The tenants' limit cells, from `cells[at]` on: per tenant `TENANT_SHARED` cells (its buckets),
    then one in-flight cell per worker, which only that worker writes. `worker`: this process's;
    `workers`: how many share them. (`cells` is the board's own view: a slice would pin its memory.)"""

    cells: memoryview
    at: int
    worker: int
    workers: int

    @property
    def stride(self) -> int:
        """Cells per tenant."""
        return TENANT_SHARED + self.workers


class DecisionClock:
    """Routing decisions counted in one process, and the last priority one (the tiers' lane clock)."""

    def __init__(self) -> None:
        self._decisions = 0
        self._priority_at = 0  # the last priority decision's number; 0: none yet

    def tick(self, priority: bool) -> None:
        self._decisions += 1
        if priority:
            self._priority_at = self._decisions

    def since_priority(self) -> int | None:
        return self._decisions - self._priority_at if self._priority_at else None

    def decisions(self) -> int:
        return self._decisions


class LocalBoard(DecisionClock):
    """The board of a gateway of one process: its numbers are its own and nobody else reads them."""

    health_version = cards_version = loads_version = 0  # nothing is published: nothing to take

    def __init__(self, prefix_slots: int = PREFIX_SLOTS) -> None:
        super().__init__()
        self.routing: AbstractContextManager[object] = contextlib.nullcontext()
        self.draining = False
        self.prefix = PrefixTable(memoryview(bytearray(PrefixTable.size(prefix_slots))), prefix_slots)
        self._cells: dict[tuple[int, int], float] = {}
        self._records: deque[tuple[float, ...]] = deque()
        self._clients: dict[bytes, int] = {}  # open connections per client address

    def write(self, backend: int, field: int, value: float) -> None:
        self._cells[backend, field] = value

    def total(self, backend: int, field: int) -> float:
        return self._cells.get((backend, field), 0.0)

    def load_area(self, backend: int, now: float) -> float:
        cell = self._cells.get
        return cell((backend, AREA), 0.0) + cell((backend, INFLIGHT), 0.0) * (now - cell((backend, SINCE), now))

    def set_health(self, backend: int, code: int) -> None:
        pass

    def health(self, backend: int) -> int:
        raise LookupError("a local board publishes no health states")

    def write_cards(self, payload: bytes) -> None:
        pass

    def read_cards(self) -> tuple[int, bytes]:
        return 0, b""

    def write_loads(self, payload: bytes) -> None:
        pass

    def read_loads(self) -> tuple[int, bytes]:
        return 0, b""

    def publish(self, record: tuple[float, ...]) -> None:
        self._records.append(record)

    def unread(self) -> list[tuple[float, ...]]:
        records = list(self._records)
        self._records.clear()
        return records

    def admit_client(self, key: bytes, cap: int) -> Callable[[], None] | None:
        held = self._clients.get(key, 0)
        if held >= cap:
            return None
        self._clients[key] = held + 1
        return functools.partial(self._release_client, key)

    def _release_client(self, key: bytes) -> None:
        held = self._clients.pop(key) - 1
        if held:
            self._clients[key] = held

    def tenant_region(self, tenants: int) -> TenantRegion:
        return TenantRegion(memoryview(array.array("d", bytes(8 * tenants * (TENANT_SHARED + 1)))), 0, 0, 1)


class FileLock:
    """An exclusive flock on `path`, taken through this object's own open file (flock is per open file,
    so two views of the board in one process exclude each other too); waited for in the kernel."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR)

    def __enter__(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class BoardSpec:
    """What a worker needs to attach to the board (picklable)."""

    name: str
    workers: int
    backends: int
    locks: str  # the directory of the locks' files
    salt: bytes  # keys the client table's bucket hash, so no client can aim at a bucket
    tenants: int = 0  # `[[security.tenants]]`, each with its limit cells
    prefix_slots: int = PREFIX_SLOTS


class LoadBoard:
    """A view of the shared block; `worker` is this process's row (-1: the parent, which owns no row)."""

    def __init__(self, spec: BoardSpec, worker: int, *, create: bool = False) -> None:
        self.spec = spec
        self.worker = worker
        self.routing = FileLock(os.path.join(spec.locks, "routing"))  # one routing decision at a time
        self._records = FileLock(os.path.join(spec.locks, "records"))  # the completions ring and the blobs
        self._clients = FileLock(os.path.join(spec.locks, "clients"))  # the client table
        size = 8 * self.cells(spec.workers, spec.backends, spec.tenants)
        self._shm = shared_memory.SharedMemory(name=spec.name, create=create, size=size)
        self._cells = self._shm.buf.cast("d")
        self._prefix_shm = shared_memory.SharedMemory(
            name=spec.name + "-prefix", create=create, size=PrefixTable.size(spec.prefix_slots)
        )
        if create:
            for i in range(len(self._cells)):
                self._cells[i] = 0.0
            self._prefix_shm.buf[:] = bytes(len(self._prefix_shm.buf))
        self.prefix = PrefixTable(self._prefix_shm.buf, spec.prefix_slots)
        b = spec.backends
        self._health_at = _HEADER
        self._rows_at = _HEADER + b
        self._clock_at = self._rows_at + spec.workers * b * _FIELDS
        self._ring_at = self._clock_at + spec.workers * _CLOCK
        self._tenants_at = self._ring_at + RING * _RECORD
        self._cards_at = 8 * (self._tenants_at + spec.tenants * (TENANT_SHARED + spec.workers))  # a byte offset
        self._loads_at = self._cards_at + CARD_BYTES
        self._client_keys_at = self._loads_at + LOAD_BYTES  # a byte offset
        self._client_rows_at = self._client_keys_at // 8 + _CLIENT_SLOTS * _KEY_CELLS
        self.applied = 0  # completion records this process has replayed

    @staticmethod
    def cells(workers: int, backends: int, tenants: int = 0) -> int:
        blobs = (CARD_BYTES + LOAD_BYTES) // 8
        clients = _CLIENT_SLOTS * (_KEY_CELLS + workers)
        return (
            _HEADER + backends + workers * (backends * _FIELDS + _CLOCK) + RING * _RECORD
            + tenants * (TENANT_SHARED + workers) + blobs + clients
        )

    @classmethod
    def create(cls, workers: int, backends: int, tenants: int = 0) -> LoadBoard:
        """A new zeroed board, owned by the calling (parent) process."""
        locks = tempfile.mkdtemp(prefix="specgate-board-")
        for name in _LOCKS:
            open(os.path.join(locks, name), "x").close()
        spec = BoardSpec(f"specgate-{os.getpid()}-{os.urandom(4).hex()}", workers, backends, locks, os.urandom(16), tenants)
        return cls(spec, -1, create=True)

    def close(self, *, unlink: bool = False) -> None:
        self._cells.release()
        self.prefix.release()
        self._shm.close()
        self._prefix_shm.close()
        self.routing.close()
        self._records.close()
        self._clients.close()
        if unlink:
            self._shm.unlink()
            self._prefix_shm.unlink()
            for name in _LOCKS:
                os.unlink(os.path.join(self.spec.locks, name))
            os.rmdir(self.spec.locks)

    # Rows: each worker writes its own, readers sum.
    def _cell(self, worker: int, backend: int, field: int) -> int:
        return self._rows_at + (worker * self.spec.backends + backend) * _FIELDS + field

    def write(self, backend: int, field: int, value: float) -> None:
        """Set this worker's `field` for `backend` (`_cell` inline: this is on the per-chunk path)."""
        self._cells[self._rows_at + (self.worker * self.spec.backends + backend) * _FIELDS + field] = value

    def total(self, backend: int, field: int) -> float:
        """`field` of `backend` summed over every worker."""
        cells, step = self._cells, self.spec.backends * _FIELDS
        at = self._cell(0, backend, field)
        return sum(cells[at + w * step] for w in range(self.spec.workers))

    def load_area(self, backend: int, now: float) -> float:
        """The gateway's integral of `backend`'s in-flight count up to `now`, over all workers."""
        cells, step = self._cells, self.spec.backends * _FIELDS
        at = self._cell(0, backend, 0)
        area = 0.0
        for w in range(self.spec.workers):
            row = at + w * step
            area += cells[row + AREA] + cells[row + INFLIGHT] * (now - cells[row + SINCE])
        return area

    def clear_worker(self, worker: int, now: float) -> None:
        """Fold a dead worker's row into the past: its load integral kept up to `now`, nothing in flight."""
        for backend in range(self.spec.backends):
            row = self._cell(worker, backend, 0)
            c = self._cells
            c[row + AREA] = c[row + AREA] + c[row + INFLIGHT] * (now - c[row + SINCE])
            c[row + SINCE] = now
            for field in (INFLIGHT, EXPECTED, CHUNKS, HELD):
                c[row + field] = 0.0
        with self._clients:  # its connections died with it
            row = self._client_rows_at + worker * _CLIENT_SLOTS
            self._cells[row : row + _CLIENT_SLOTS] = memoryview(array.array("d", bytes(8 * _CLIENT_SLOTS)))
        stride = TENANT_SHARED + self.spec.workers
        for tenant in range(self.spec.tenants):  # its requests' in-flight cells (their rate charges stay)
            self._cells[self._tenants_at + tenant * stride + TENANT_SHARED + worker] = 0.0

    # Health: one cell per backend; the version moves after the cell, under the records lock, so no
    # two writers' bumps collapse into one that a reader has already seen.
    @property
    def health_version(self) -> int:
        return int(self._cells[_HEALTH_VERSION])

    def health(self, backend: int) -> int:
        return int(self._cells[self._health_at + backend])

    def set_health(self, backend: int, code: int) -> None:
        with self._records:
            self._cells[self._health_at + backend] = float(code)
            self._cells[_HEALTH_VERSION] = self._cells[_HEALTH_VERSION] + 1.0

    # The draining flag, set by the parent on SIGTERM.
    @property
    def draining(self) -> bool:
        return self._cells[0] != 0.0

    @draining.setter
    def draining(self, value: bool) -> None:
        self._cells[0] = 1.0 if value else 0.0

    # The service tiers' decision clock: rows per worker, summed.
    def tick(self, priority: bool) -> None:
        """Count one routing decision of this worker; `priority`: stamp it as the last priority one."""
        at = self._clock_at + _CLOCK * self.worker
        self._cells[at] += 1.0
        if priority:
            self._cells[at + 1] = self._decisions()

    def since_priority(self) -> int | None:
        """Decisions the whole gateway made since its last priority one; None: never one."""
        last = max(self._cells[self._clock_at + _CLOCK * w + 1] for w in range(self.spec.workers))
        return int(self._decisions() - last) if last else None

    def decisions(self) -> int:
        return int(self._decisions())

    def _decisions(self) -> float:
        return sum(self._cells[self._clock_at + _CLOCK * w] for w in range(self.spec.workers))

    # Tenants' limits: written under the routing lock, but each worker's in-flight cells (its own).
    def tenant_region(self, tenants: int) -> TenantRegion:
        if tenants != self.spec.tenants:
            raise ValueError(f"the board holds {self.spec.tenants} tenants' cells, not {tenants}")
        return TenantRegion(self._cells, self._tenants_at, self.worker, self.spec.workers)

    # Completions: a ring every worker replays in the same order.
    def publish(self, record: tuple[float, ...]) -> None:
        """Append one completion record (see `_RECORD`)."""
        with self._records:
            index = int(self._cells[1])
            at = self._ring_at + (index % RING) * _RECORD
            self._cells[at : at + _RECORD] = memoryview(array.array("d", record))
            self._cells[1] = float(index + 1)  # after the record: a reader never sees it half written

    def unread(self) -> list[tuple[float, ...]]:
        """Completion records published since this process last asked, oldest first."""
        written = int(self._cells[1])
        start = max(self.applied, written - RING + 1)  # the slot being overwritten next is not trusted
        out = []
        for index in range(start, written):
            at = self._ring_at + (index % RING) * _RECORD
            out.append(tuple(self._cells[at : at + _RECORD]))
        self.applied = written
        return out

    # Model cards: written by the health checker before it marks a backend ready.
    @property
    def cards_version(self) -> int:
        return int(self._cells[_CARDS_VERSION])

    def write_cards(self, payload: bytes) -> None:
        """Publish the cards (JSON)."""
        self._write_blob(self._cards_at, CARD_BYTES, _CARDS_VERSION, payload, "model cards")

    def read_cards(self) -> tuple[int, bytes]:
        """(version, JSON) of the cards as last published."""
        return self._read_blob(self._cards_at, _CARDS_VERSION)

    # Engine loads: each backend's own /v1/loads, written by the health checker at each poll.
    @property
    def loads_version(self) -> int:
        return int(self._cells[_LOADS_VERSION])

    def write_loads(self, payload: bytes) -> None:
        """Publish the engine loads (JSON)."""
        self._write_blob(self._loads_at, LOAD_BYTES, _LOADS_VERSION, payload, "engine loads")

    def read_loads(self) -> tuple[int, bytes]:
        """(version, JSON) of the engine loads as last published."""
        return self._read_blob(self._loads_at, _LOADS_VERSION)

    def _write_blob(self, at: int, limit: int, version: int, payload: bytes, what: str) -> None:
        # The version moves after the bytes, under the lock readers take, so no reader sees half.
        if len(payload) + 4 > limit:
            raise ValueError(f"{what} of {len(payload)} bytes do not fit the board's {limit}")
        with self._records:
            buf = self._shm.buf
            buf[at : at + 4] = len(payload).to_bytes(4, "little")
            buf[at + 4 : at + 4 + len(payload)] = payload
            self._cells[version] = self._cells[version] + 1.0

    def _read_blob(self, at: int, version: int) -> tuple[int, bytes]:
        with self._records:
            buf = self._shm.buf
            size = int.from_bytes(buf[at : at + 4], "little")
            return int(self._cells[version]), bytes(buf[at + 4 : at + 4 + size])

    # Client addresses: each worker counts its own connections in its row; the cap holds for the sum.
    def admit_client(self, key: bytes, cap: int) -> Callable[[], None] | None:
        """Count one more connection of client `key` unless the gateway holds `cap` of them (see `Board`)."""
        bucket = client_bucket(key, self.spec.salt)
        buf, cells, slots = self._shm.buf, self._cells, _CLIENT_SLOTS
        with self._clients:
            free = None
            for slot in range(bucket * CLIENT_WAYS, (bucket + 1) * CLIENT_WAYS):
                held = sum(cells[self._client_rows_at + w * slots + slot] for w in range(self.spec.workers))
                at = self._client_keys_at + 16 * slot
                if held and buf[at : at + 16] == key:
                    if held >= cap:
                        return None
                    free = slot
                    break
                if not held and free is None:
                    free = slot
            if free is None:  # every way holds another address's connections: let it in uncounted
                return _uncounted
            at = self._client_keys_at + 16 * free
            buf[at : at + 16] = key
            mine = self._client_rows_at + self.worker * slots + free
            cells[mine] += 1.0
        return functools.partial(self._release_client, mine)

    def _release_client(self, cell: int) -> None:
        with self._clients:
            self._cells[cell] -= 1.0


def client_bucket(key: bytes, salt: bytes) -> int:
    """The client table's bucket of address `key`, under the board's `salt`."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=4, key=salt).digest(), "little") % CLIENT_BUCKETS


def _uncounted() -> None:
    pass
