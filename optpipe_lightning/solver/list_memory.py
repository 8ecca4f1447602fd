"""One stage's activation memory for the list scheduler (``list_scheduler``): the settled level
plus future (time, delta) events, and the simulator's memory checks and wait on them."""

from __future__ import annotations

from bisect import insort

# times closer than this are one instant
EPS = 1e-12


class StageMemory:
    """One stage's activation memory: settled level plus future (time, delta) events."""

    __slots__ = ("base", "events", "limit")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self.base = 0.0
        self.events: list[tuple[float, float]] = []

    def add(self, t: float, d: float) -> None:
        if d:
            insort(self.events, (t, d))

    def settle(self, t: float) -> None:
        ev = self.events
        k = 0
        while k < len(ev) and ev[k][0] < t - EPS:
            self.base += ev[k][1]
            k += 1
        if k:
            del ev[:k]

    def wait_until(self, t: float, d: float) -> float | None:
        """The simulator's memory wait for ``d`` bytes that do not fit at ``t``: the first
        later freeing event after which the level fits, if the level fits from there on."""
        if self.limit is None:
            return None
        lim = self.limit * (1 + 1e-9) + 1e-6
        level = self.base + d
        ev = self.events
        i, n = 0, len(ev)
        while i < n and ev[i][0] <= t + EPS:
            level += ev[i][1]
            i += 1
        while i < n:
            t0 = ev[i][0]
            freeing = False
            while i < n and ev[i][0] <= t0 + EPS:
                freeing = freeing or ev[i][1] < 0
                level += ev[i][1]
                i += 1
            if freeing and level <= lim:
                return t0 if self.fits(t0, d) else None
        return None

    def level_at(self, t: float) -> float:
        """The level just after the events at ``t``."""
        level = self.base
        for te, d in self.events:
            if te > t + EPS:
                break
            level += d
        return level

    def remove(self, t: float, d: float) -> None:
        """Take back an event added earlier (from the settled level if it is already there)."""
        try:
            self.events.remove((t, d))
        except ValueError:
            self.base -= d

    def fits_many(
        self,
        changes: list[tuple[float, float]],
        extra: list[tuple[float, float]] = (),  # type: ignore[assignment]
    ) -> bool:
        """Whether adding every (time, delta) of ``changes`` keeps each later level within the
        limit (each instant's events net out before the check)."""
        if self.limit is None:
            return True
        lim = self.limit * (1 + 1e-9) + 1e-6
        t_min = min(t for t, _ in changes)
        merged = sorted(self.events + changes + list(extra))
        level = self.base
        i, n = 0, len(merged)
        while i < n:
            t0 = merged[i][0]
            while i < n and merged[i][0] <= t0 + EPS:
                level += merged[i][1]
                i += 1
            if t0 >= t_min - EPS and level > lim:
                return False
        return True

    def fits(self, t: float, d: float) -> bool:
        """Whether adding ``d`` at time ``t`` keeps every later level within the limit."""
        if self.limit is None:
            return True
        lim = self.limit * (1 + 1e-9) + 1e-6
        level = self.base
        ev = self.events
        i = 0
        n = len(ev)
        while i < n and ev[i][0] <= t + EPS:
            level += ev[i][1]
            i += 1
        level += d
        while i < n:
            # all events of one instant net out before the check
            t0 = ev[i][0]
            if level > lim:
                return False
            while i < n and ev[i][0] <= t0 + EPS:
                level += ev[i][1]
                i += 1
        return level <= lim
