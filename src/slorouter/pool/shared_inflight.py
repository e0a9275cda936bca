"""A shared view of in-flight load across several pickers (picker replicas, or worker processes of one pod).

Each picker's ``InFlightTracker`` counts only the requests that picker dispatched. With several pickers
behind one gateway, each sees a share of the pods' in-flight load, and its plugins under-count what the
others just sent. Here every picker publishes its own counts and folds the others' latest into the
in-flight columns its plugins read: own counts (local, always fresh) plus every other live picker's last
publication (as fresh as the transport).

**Slots.** Each picker owns one slot on the board, keyed by its id. A publication carries the picker's
*absolute* per-endpoint counts (requests, prefill tokens, decode tokens, decoding requests — the
``PoolState`` in-flight columns), never deltas: it replaces the slot wholesale, so a lost, duplicated or
reordered message is healed by the next one and no error accumulates.

**Epoch and sequence.** ``epoch`` identifies one life of a picker and must grow across its lives (e.g. the
process's start time in ns, or a restart counter in the shared segment); ``seq`` numbers the publications
within a life. A board accepts a publication only if its ``(epoch, seq)`` is above the highest it has seen
from that picker: a restarted picker replaces its dead life's slot at once (no waiting for the TTL), and a
late message of a dead life, or an older one overtaken by a newer one, is ignored. The highest pair seen is
remembered for a while after its slot is dropped, so a straggler cannot resurrect a dead slot.

**TTL.** A slot is live while its last accepted publication was *received* (by the board's clock, so no
clock agreement between pickers is needed) at most ``ttl_s`` ago. Pickers publish at least every interval
even when nothing changed (the publication is the heartbeat), with ``ttl_s`` several intervals: a dead
picker's load disappears from everyone's view after the TTL instead of leaking. (The pods' own scraped
queue and running gauges still show those requests; they are no longer anyone's in-flight count.) A
picker that shuts down cleanly publishes empty counts first.

**Transports** (not here; this module is the merge logic, pure and clock-injected):

- worker processes of one pod: a shared-memory array with one row per worker (epoch, seq, heartbeat, the
  counts of each endpoint position), each row written by its worker under a seqlock (seq odd while
  writing); a reader copies the other rows with an even, unchanged seq and calls ``receive`` for each
  row whose seq moved;
- picker replicas: each publishes its slot as one small message on a pub/sub channel every interval (a few
  ms; a few hundred bytes for tens of endpoints); each subscriber feeds its board.

A picker calls ``SharedInFlightView.refresh`` whenever its board accepted something and on a timer (so
expiry applies when nothing arrives), and ``publication`` every interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from slorouter.clock import Clock
from slorouter.pool.state import PoolState

# The PoolState columns a publication carries, in the order of a ``Counts`` tuple.
COLUMNS = ("inflight_requests", "inflight_prefill_tokens", "inflight_decode_tokens", "inflight_decoding")
Counts = tuple[int, int, int, int]
ZERO: Counts = (0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class InFlightPublication:
    """One picker's absolute in-flight counts per endpoint address (endpoints with none may be left out)."""

    picker: str
    epoch: int
    seq: int
    counts: Mapping[str, Counts]
    # The picker's active routing candidate when it tunes itself ("" when it does not): how picker replicas
    # agree on one (slorouter.serving.self_tuning).
    candidate: str = ""

    def __post_init__(self) -> None:
        for address, counts in self.counts.items():
            if len(counts) != len(COLUMNS) or any(int(c) != c or c < 0 for c in counts):
                raise ValueError(
                    f"in-flight counts must be {len(COLUMNS)} integers >= 0; {self.picker!r} published "
                    f"{counts!r} for {address}"
                )


@dataclass(slots=True)
class _Slot:
    epoch: int
    seq: int
    counts: Mapping[str, Counts]
    received_at: float
    candidate: str = ""


class SharedInFlightBoard:
    """The latest publication of every live picker, as one receiver has it."""

    __slots__ = ("_clock", "_highest", "_slots", "forget_after_s", "ttl_s")

    def __init__(self, ttl_s: float, clock: Clock, *, forget_after_s: float | None = None) -> None:
        """``forget_after_s`` (default 10 × TTL): how long the highest ``(epoch, seq)`` of a picker is kept
        after its last accepted publication, against stragglers."""
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 (got {ttl_s})")
        self.ttl_s = ttl_s
        self.forget_after_s = 10.0 * ttl_s if forget_after_s is None else forget_after_s
        if self.forget_after_s < ttl_s:
            raise ValueError("forget_after_s must be >= ttl_s")
        self._clock = clock
        self._slots: dict[str, _Slot] = {}
        self._highest: dict[str, tuple[int, int, float]] = {}  # picker → (epoch, seq, received at)

    def receive(self, publication: InFlightPublication) -> bool:
        """Take a publication if it is the newest of its picker; whether it was taken."""
        now = self._clock.now()
        picker = publication.picker
        key = (publication.epoch, publication.seq)
        highest = self._highest.get(picker)
        if highest is not None and key <= highest[:2]:
            return False
        self._highest[picker] = (*key, now)
        self._slots[picker] = _Slot(
            publication.epoch, publication.seq, publication.counts, now, publication.candidate
        )
        return True

    def expire(self) -> list[str]:
        """Drop the slots not refreshed within the TTL; the pickers dropped."""
        now = self._clock.now()
        dropped = [p for p, slot in self._slots.items() if now - slot.received_at > self.ttl_s]
        for picker in dropped:
            del self._slots[picker]
        forgotten = [p for p, h in self._highest.items() if now - h[2] > self.forget_after_s]
        for picker in forgotten:
            del self._highest[picker]
        return dropped

    def candidates(self) -> dict[str, str]:
        """Per live picker that tunes itself, its active candidate (as of the last ``expire``)."""
        return {picker: slot.candidate for picker, slot in self._slots.items() if slot.candidate}

    def live(self) -> list[str]:
        """The pickers with a live slot (as of the last ``expire``)."""
        return list(self._slots)

    def totals(self, exclude: str | None = None) -> dict[str, Counts]:
        """Per endpoint address, the sum of every live slot's counts but ``exclude``'s (expires first)."""
        self.expire()
        sums: dict[str, list[int]] = {}
        for picker, slot in self._slots.items():
            if picker == exclude:
                continue
            for address, counts in slot.counts.items():
                total = sums.setdefault(address, [0, 0, 0, 0])
                for j, c in enumerate(counts):
                    total[j] += c
        return {a: (t[0], t[1], t[2], t[3]) for a, t in sums.items() if any(t)}


class SharedInFlightView:
    """One picker's side: publishes what its own tracker counted in ``pool``, and keeps the others' latest
    totals added into ``pool``'s in-flight columns (so plugins read own + others unchanged).

    The view remembers what it added per endpoint (and the endpoint's incarnation): own counts are the
    columns minus that, and an endpoint that left and rejoined the pool starts from zero on both sides.
    """

    __slots__ = ("_applied", "_seq", "candidate_of", "epoch", "picker", "pool")

    def __init__(self, pool: PoolState, picker: str, epoch: int) -> None:
        self.pool = pool
        self.picker = picker
        self.epoch = epoch
        self._seq = 0
        # The picker's active candidate, published with its counts, when it tunes itself.
        self.candidate_of: Callable[[], str] | None = None
        self._applied: dict[str, tuple[int | None, Counts]] = {}

    def _applied_now(self, address: str) -> Counts:
        incarnation, counts = self._applied.get(address, (None, ZERO))
        return counts if incarnation is not None and incarnation == self.pool.incarnation(address) else ZERO

    def own(self) -> dict[str, Counts]:
        """This picker's own counts per endpoint of the pool (endpoints with none left out)."""
        columns = [self.pool.columns[name] for name in COLUMNS]
        own: dict[str, Counts] = {}
        for pos, endpoint in enumerate(self.pool.endpoints):
            applied = self._applied_now(endpoint.address)
            counts = (
                int(columns[0][pos]) - applied[0],
                int(columns[1][pos]) - applied[1],
                int(columns[2][pos]) - applied[2],
                int(columns[3][pos]) - applied[3],
            )
            if counts != ZERO:
                own[endpoint.address] = counts
        return own

    def others(self) -> dict[str, Counts]:
        """What the view currently adds per endpoint: the other pickers' totals at the last refresh."""
        current = {address: self._applied_now(address) for address in self._applied}
        return {address: counts for address, counts in current.items() if counts != ZERO}

    def publication(self) -> InFlightPublication:
        """The next publication of this picker's own counts."""
        self._seq += 1
        candidate = "" if self.candidate_of is None else self.candidate_of()
        return InFlightPublication(self.picker, self.epoch, self._seq, self.own(), candidate)

    def refresh(self, board: SharedInFlightBoard) -> None:
        """Fold the board's current totals of the other pickers into the pool."""
        self._apply(board.totals(exclude=self.picker))

    def detach(self) -> None:
        """Take the others' counts out of the pool again (leaving own counts only)."""
        self._apply({})

    def _apply(self, totals: Mapping[str, Counts]) -> None:
        pool = self.pool
        applied: dict[str, tuple[int | None, Counts]] = {}
        for endpoint in pool.endpoints:
            address = endpoint.address
            target = totals.get(address, ZERO)
            previous = self._applied_now(address)
            if target != previous:
                pool.add_inflight(
                    address,
                    target[0] - previous[0],
                    target[1] - previous[1],
                    target[2] - previous[2],
                    target[3] - previous[3],
                )
            if target != ZERO:
                applied[address] = (pool.incarnation(address), target)
        self._applied = applied
