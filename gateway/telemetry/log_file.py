"""Where access-log lines go: a file descriptor (stdout) or a file rotated by size, shared by the workers.

To a pipe, lines are written in pieces of at most `PIPE_BUF` bytes that end with a line, so lines of
several worker processes never interleave mid-line; to a regular file opened for appending, a batch
is one write, which Linux keeps whole (each write releases the GIL and costs a syscall). Rotation
is RotatingFileHandler's scheme (`<path>.1` newest .. `<path>.<backups>`, the oldest dropped), made
safe for several processes: whoever finds the file over its size renames under an flock, if nobody
did so first, and the others follow the path to the new file by its inode.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
from typing import Protocol

PIPE_BUF = select.PIPE_BUF


class Sink(Protocol):
    """Takes whole lines."""

    def write(self, data: bytes) -> None:
        """Write `data`, one or more whole lines."""

    def close(self) -> None:
        """Give up its descriptor (one it was given stays open)."""


def write_lines(fd: int, data: bytes) -> None:
    """Write `data` to `fd` in pieces of whole lines of at most PIPE_BUF bytes (a longer line alone)."""
    start = 0
    while start < len(data):
        end = data.rfind(b"\n", start, start + PIPE_BUF) + 1
        if end <= start:  # one line longer than PIPE_BUF
            end = data.find(b"\n", start) + 1 or len(data)
        write_all(fd, data[start:end])
        start = end


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd`: one write, unless the kernel takes less."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Descriptor:
    """An open file descriptor it does not own (stdout)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._write = write_all if stat.S_ISREG(os.fstat(fd).st_mode) else write_lines

    def write(self, data: bytes) -> None:
        self._write(self._fd, data)

    def close(self) -> None:
        pass


class RotatingFile:
    """`path`, appended to, rotated once it holds `max_bytes` (see the module docstring)."""

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self._path = path
        self._max = max_bytes
        self._backups = backups
        self._lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _reopen(self) -> None:
        os.close(self._fd)
        self._fd = self._open()

    def write(self, data: bytes) -> None:
        try:
            moved = os.stat(self._path).st_ino != os.fstat(self._fd).st_ino
        except FileNotFoundError:
            moved = True
        if moved:  # another process rotated it
            self._reopen()
        write_all(self._fd, data)
        if os.fstat(self._fd).st_size >= self._max:
            self._rotate()

    def _rotate(self) -> None:
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            current = os.stat(self._path)
            if current.st_ino == os.fstat(self._fd).st_ino and current.st_size >= self._max:
                for n in range(self._backups - 1, 0, -1):
                    if os.path.exists(f"{self._path}.{n}"):
                        os.replace(f"{self._path}.{n}", f"{self._path}.{n + 1}")
                os.replace(self._path, f"{self._path}.1")
        except FileNotFoundError:
            pass  # moved away meanwhile: the reopen below starts a new one
        finally:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
        self._reopen()

    def close(self) -> None:
        os.close(self._fd)
        os.close(self._lock)
