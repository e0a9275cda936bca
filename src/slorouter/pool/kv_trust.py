"""How far the KV-event index can be trusted, per pod: ``exact``, ``degraded`` (with why) or ``rebuilding``.

The subscriber keeps a pod's blocks right while the stream is whole, and clears them when it is not; but
between a fault and its repair, and after a clear, the index says less than the pod holds (or more). A pod
that is not ``exact`` is routed on the approximate index's estimate instead (the precise producer's
fallback for a pod that publishes nothing). The rules:

- **degraded** while any of these holds (the reason shown is the oldest one still holding):
  ``gap``, a sequence gap seen and not yet replayed; ``session``, the subscriber's session failed and its
  next one has not yet shown it is in step (an in-order batch, or a replay answer); ``lag``, the last
  batch's timestamp was more than ``lag_s`` behind the router's clock; ``silent``, no batch for
  ``silent_after_s`` while the pod's scrape shows it serving (requests running, or its prefix-cache query
  counter moving). Each ends when its cause does: the replay, an in-order batch, a timely batch, any batch.
- **rebuilding** after the pod's blocks were cleared (a restart: the sequence going back, the pod's
  process start time or counters going back, its identity changing; an unrecoverable gap; an unreadable
  batch; an overflow), until ``rebuild_events`` events were applied since the clear or ``rebuild_s`` has
  passed, whichever comes first. A clear ends a pending gap: nothing the gap missed is left in the index.
- **exact** otherwise, including before the first batch (a pod that never published is routed on the
  approximate index anyway, because it is not ``publishing``).

Every method takes ``now`` on the caller's monotonic clock; nothing here reads the time or does I/O.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from dataclasses import dataclass, field


class TrustState(enum.Enum):
    EXACT = "exact"
    DEGRADED = "degraded"
    REBUILDING = "rebuilding"


class TrustReason(enum.Enum):
    """Why a pod is not ``exact`` (``NONE`` when it is)."""

    NONE = "none"
    # degraded
    GAP = "gap"
    SESSION = "session"
    LAG = "lag"
    SILENT = "silent"
    # rebuilding: what cleared the pod's blocks
    SEQUENCE_RESTART = "sequence-restart"
    PROCESS_RESTART = "process-restart"
    IDENTITY = "identity"
    UNRECOVERED_GAP = "unrecovered-gap"
    DECODE_ERROR = "decode-error"
    OVERFLOW = "overflow"


DEGRADED_REASONS = frozenset({TrustReason.GAP, TrustReason.SESSION, TrustReason.LAG, TrustReason.SILENT})
CLEAR_REASONS = frozenset(
    {
        TrustReason.SEQUENCE_RESTART,
        TrustReason.PROCESS_RESTART,
        TrustReason.IDENTITY,
        TrustReason.UNRECOVERED_GAP,
        TrustReason.DECODE_ERROR,
        TrustReason.OVERFLOW,
    }
)


@dataclass(frozen=True, slots=True)
class TrustThresholds:
    """When a pod's events are late or silent, and when a cleared pod counts as rebuilt."""

    lag_s: float = 2.0  # a batch this far behind the router's wall clock: degraded (lag)
    silent_after_s: float = 5.0  # no batch for this long while the scrape shows the pod serving: silent
    rebuild_events: int = 100_000  # after a clear: exact again once this many events were applied,
    rebuild_s: float = 300.0  # or once this long has passed (docs/design/kv-index-trust.md)

    def __post_init__(self) -> None:
        for name in ("lag_s", "silent_after_s", "rebuild_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.rebuild_events < 1:
            raise ValueError(f"rebuild_events must be >= 1, got {self.rebuild_events!r}")


@dataclass(frozen=True, slots=True)
class TrustView:
    """A pod's trust at one moment: its state, why, and since when (the caller's clock)."""

    state: TrustState
    reason: TrustReason
    since: float

    @property
    def exact(self) -> bool:
        return self.state is TrustState.EXACT


@dataclass(slots=True)
class PodTrust:
    """One pod's trust state machine (see the module's rules)."""

    thresholds: TrustThresholds
    created: float
    state: TrustState = TrustState.EXACT
    reason: TrustReason = TrustReason.NONE
    since: float = 0.0
    # The degraded conditions that hold, with when each began (dicts keep insertion order: oldest first).
    _conditions: dict[TrustReason, float] = field(default_factory=dict)
    _cleared: TrustReason | None = None  # rebuilding after this clear
    _cleared_at: float = 0.0
    _events_since_clear: int = 0
    last_batch_at: float | None = None
    # Transitions into (state, reason), and clears by reason, counted since the pod was first seen.
    transitions: Counter[tuple[TrustState, TrustReason]] = field(default_factory=Counter)
    clears: Counter[TrustReason] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.since = self.created

    # --- what happened ---------------------------------------------------------------------------------
    def gap_opened(self, now: float) -> None:
        self._hold(TrustReason.GAP, now)

    def gap_closed(self, now: float) -> None:
        """The gap was replayed in full (a clear ends it too, through ``cleared``)."""
        self._release(TrustReason.GAP, now)

    def session_failed(self, now: float) -> None:
        self._hold(TrustReason.SESSION, now)

    def in_step(self, now: float) -> None:
        """The subscriber's session showed it is in step with the publisher (an in-order batch, a replay
        answer): a failed session is over."""
        self._release(TrustReason.SESSION, now)

    def batch(self, now: float, *, lag_s: float, events: int) -> None:
        """A batch was applied, ``lag_s`` after its timestamp, with ``events`` events."""
        self.last_batch_at = now
        self._conditions.pop(TrustReason.SILENT, None)
        if lag_s > self.thresholds.lag_s:
            self._conditions.setdefault(TrustReason.LAG, now)
        else:
            self._conditions.pop(TrustReason.LAG, None)
        if self._cleared is not None:
            self._events_since_clear += events
        self._update(now)

    def serving(self, now: float, *, busy: bool) -> None:
        """The pod's scrape: ``busy`` when it shows the pod serving (requests running, prefix-cache queries
        counted since the last scrape). Busy and no batch for ``silent_after_s``: silent."""
        last = self.created if self.last_batch_at is None else self.last_batch_at
        if busy and now - last > self.thresholds.silent_after_s:
            self._conditions.setdefault(TrustReason.SILENT, now)
            self._update(now)

    def cleared(self, now: float, reason: TrustReason) -> None:
        """The pod's blocks were cleared because of ``reason`` (one of ``CLEAR_REASONS``)."""
        if reason not in CLEAR_REASONS:
            raise ValueError(f"{reason.value!r} does not clear a pod's blocks")
        self.clears[reason] += 1
        self._conditions.pop(TrustReason.GAP, None)
        self._cleared, self._cleared_at, self._events_since_clear = reason, now, 0
        self._update(now, again=True)

    def tick(self, now: float) -> None:
        """Let time-based rules act (a rebuild that has waited ``rebuild_s``)."""
        self._update(now)

    def view(self) -> TrustView:
        return TrustView(self.state, self.reason, self.since)

    # --- rules -----------------------------------------------------------------------------------------
    def _hold(self, reason: TrustReason, now: float) -> None:
        self._conditions.setdefault(reason, now)
        self._update(now)

    def _release(self, reason: TrustReason, now: float) -> None:
        if self._conditions.pop(reason, None) is not None:
            self._update(now)

    def _update(self, now: float, *, again: bool = False) -> None:
        """Derive the state from the conditions; ``again``: a new clear while rebuilding for the same
        reason starts the rebuild over, a transition of its own."""
        if self._cleared is not None:
            rebuilt = self._events_since_clear >= self.thresholds.rebuild_events
            if rebuilt or now - self._cleared_at >= self.thresholds.rebuild_s:
                self._cleared = None
        if self._conditions:
            state, reason = TrustState.DEGRADED, next(iter(self._conditions))
        elif self._cleared is not None:
            state, reason = TrustState.REBUILDING, self._cleared
        else:
            state, reason = TrustState.EXACT, TrustReason.NONE
        if (state, reason) != (self.state, self.reason) or (again and state is TrustState.REBUILDING):
            self.state, self.reason, self.since = state, reason, now
            self.transitions[(state, reason)] += 1


class KVTrustBoard:
    """Every pod's ``PodTrust``, on one clock (created on first use, dropped with the pod)."""

    def __init__(self, thresholds: TrustThresholds | None = None) -> None:
        self.thresholds = thresholds or TrustThresholds()
        self._pods: dict[str, PodTrust] = {}

    def pod(self, address: str, now: float) -> PodTrust:
        trust = self._pods.get(address)
        if trust is None:
            trust = self._pods[address] = PodTrust(self.thresholds, created=now)
        return trust

    def get(self, address: str) -> PodTrust | None:
        return self._pods.get(address)

    def exact(self, address: str) -> bool:
        trust = self._pods.get(address)
        return trust is None or trust.state is TrustState.EXACT

    def remove(self, address: str) -> None:
        self._pods.pop(address, None)

    def tick(self, now: float) -> None:
        for trust in self._pods.values():
            trust.tick(now)

    @property
    def addresses(self) -> frozenset[str]:
        return frozenset(self._pods)

    def views(self) -> dict[str, TrustView]:
        return {address: trust.view() for address, trust in self._pods.items()}
