"""Raise this process's open-file limit to the hard limit at start-up, as SGLang does.

Every stream through the gateway holds two descriptors (client and upstream socket) and every
request to SGLang one; a default soft limit of 1024 would cap a node at a few hundred streams
while the hard limit (what the process may raise itself to) is usually far higher. Both
`specgate serve` and the simulator call `raise_nofile_limit` once, before they open sockets.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

log = logging.getLogger("specgate.limits")


@dataclass(frozen=True)
class NofileLimit:
    """RLIMIT_NOFILE before and after the raise."""

    soft_before: int
    soft: int
    hard: int  # resource.RLIM_INFINITY (-1) when unlimited


def raise_nofile_limit() -> NofileLimit:
    """Set the soft RLIMIT_NOFILE to the hard limit (or as close as the kernel allows); never lowers it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # Linux refuses an infinite soft limit beyond fs.nr_open; 1,048,576 is its default.
        target = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    new_soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return NofileLimit(soft_before=soft, soft=new_soft, hard=hard)
