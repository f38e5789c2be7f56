"""Service tiers mixed into a workload: OpenAI's `service_tier` on a seeded share of the sessions."""

from __future__ import annotations

import random
from dataclasses import dataclass

# The values OpenAI's API accepts for `service_tier`.
OPENAI_TIERS = ("auto", "default", "flex", "priority", "scale")


@dataclass(frozen=True)
class TierMix:
    """Each tier and the share of sessions that ask for it; the rest (1 - the sum) send no tier."""

    shares: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.shares]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a tier mix names each tier once, got {names}")
        for name, share in self.shares:
            if name not in OPENAI_TIERS:
                raise ValueError(f"service tier must be one of {', '.join(OPENAI_TIERS)}, got {name!r}")
            if not 0.0 < share <= 1.0:
                raise ValueError(f"tier {name}'s share must be within (0, 1], got {share:g}")
        if sum(share for _, share in self.shares) > 1.0 + 1e-9:
            raise ValueError(f"tier shares add up to more than 1: {self}")

    @classmethod
    def parse(cls, text: str) -> TierMix:
        """Parse `priority=0.1,default=0.8,flex=0.1`."""
        shares = []
        for item in (x.strip() for x in text.split(",") if x.strip()):
            name, sep, raw = item.partition("=")
            try:
                shares.append((name.strip(), float(raw)))
            except ValueError:
                raise ValueError(f"a tier mix is TIER=SHARE,..., got {item!r}") from None
            if not sep:
                raise ValueError(f"a tier mix is TIER=SHARE,..., got {item!r}")
        return cls(tuple(shares))

    def draw(self, rng: random.Random) -> str | None:
        """One session's tier (None: it sends no `service_tier`)."""
        u = rng.random()
        for name, share in self.shares:
            if u < share:
                return name
            u -= share
        return None

    def __str__(self) -> str:
        return ",".join(f"{name}={share:g}" for name, share in self.shares)
