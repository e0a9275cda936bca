"""``FaultPlan``: a server's active faults, at most one per name, and the draw of which request gets one
(with its own seeded generator, so a seeded run plays the same faults)."""

from __future__ import annotations

import random
from typing import Any

from slorouter.faults.kinds import Fault


class FaultPlan:
    """A server's active faults (one per name) and the draw of which request gets one."""

    def __init__(self, seed: int = 0) -> None:
        self._faults: dict[str, Fault] = {}
        self._rng = random.Random(seed)

    def __bool__(self) -> bool:
        return bool(self._faults)

    def add(self, fault: Fault) -> None:
        """Activate ``fault``, replacing an active fault of the same name."""
        self._faults[fault.name] = fault

    def clear(self, name: str | None = None) -> int:
        """Retire one fault (or all); returns how many were active."""
        if name is None:
            count = len(self._faults)
            self._faults.clear()
            return count
        return 1 if self._faults.pop(name, None) is not None else 0

    def describe(self) -> list[dict[str, Any]]:
        return [fault.describe() for fault in self._faults.values()]

    def draw(self, target: str) -> Fault | None:
        """The fault the next request to ``target`` gets, if any (counted as a hit)."""
        for fault in list(self._faults.values()):
            if fault.target != target:
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            fault.hits += 1
            if fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    del self._faults[fault.name]
            return fault
        return None

    def active(self, name: str) -> Fault | None:
        return self._faults.get(name)
