"""Router-local in-flight accounting: what this router has sent to each endpoint and not yet seen finish.

Scraped metrics lag by up to a scrape interval; these counters change at dispatch and completion, so the
scheduler sees its own recent decisions at once. Per endpoint (``PoolState`` in-flight columns):

- ``inflight_requests``: requests dispatched and not finished.
- ``inflight_prefill_tokens``: prompt tokens still to prefill — the prompt minus what the prefix index
  expects the endpoint to hold in its cache — of requests that have not produced their first token yet
  (llm-d's "uncached in-flight tokens"). Cached blocks cost the engine almost nothing, so counting whole
  prompts overstated the prefill queue of cache-friendly traffic several-fold.
- ``inflight_decoding``: requests past their first token.
- ``inflight_decode_tokens``: for requests past their first token, ``prompt_tokens + max_tokens`` each,
  the most KV cache the request can hold while it decodes (its prompt plus everything it may still
  generate). An upper bound on purpose: the router cannot see how many tokens have been generated so far.

Progress (``watch_stalls``): while an endpoint has requests of this router decoding, the tracker keeps when
it last saw the endpoint produce a token (``progressed``, from the front-end: a stream's chunk, a first
token) and the longest gap between tokens it has seen there lately (a step with a long prefill chunk; the
memory halves every ``STEP_MEMORY_HALF_LIFE_S``). An endpoint is *stalled* (``stalled``) when it has
requests decoding and produced no token for ``factor`` times that longest gap, and at least ``floor_s``:
decoding requests get a token every engine step, so such a silence means the engine stopped (a GC pause, a
noisy neighbour, a hung GPU). A silence that long is not remembered as a step.

Each dispatch returns an ``InFlightHandle`` that releases exactly what it added, exactly once: ``finish()``
is idempotent, works before or after ``first_token()``, runs on ``with`` exit (errors, timeouts and task
cancellation included), and as a last resort when a forgotten handle is garbage-collected (counted by
``leaked()``). A handle only touches the pool row it was dispatched to: if the endpoint left the pool (and
maybe came back), its release is a no-op, so the counters never go negative.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import TracebackType

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from slorouter.pool.state import PoolState

_PREFILL, _DECODE, _DONE = 0, 1, 2
STEP_MEMORY_HALF_LIFE_S = 30.0
# Gaps between tokens shorter than this are streams of one step, not steps (they are not remembered).
_MIN_STEP_GAP_S = 0.005


class _Progress:
    """An endpoint's last token and the longest gap between tokens seen there lately."""

    __slots__ = ("last", "longest", "longest_at")

    def __init__(self, now: float) -> None:
        self.last = now
        self.longest = 0.0
        self.longest_at = now

    def longest_now(self, now: float) -> float:
        return self.longest * 0.5 ** ((now - self.longest_at) / STEP_MEMORY_HALF_LIFE_S)


class InFlightTracker:
    """Creates in-flight handles for one pool and counts the handles still open."""

    __slots__ = (
        "_decoding",
        "_leaked",
        "_outstanding",
        "_progress",
        "_stall_factor",
        "_stall_floor_s",
        "on_change",
        "pool",
    )

    def __init__(self, pool: PoolState) -> None:
        self.pool = pool
        self._outstanding = 0
        self._leaked = 0
        self._decoding: dict[str, int] = {}  # address -> this router's requests decoding there
        self._progress: dict[str, _Progress] = {}  # address -> its tokens (while decoding, when watched)
        self._stall_floor_s: float | None = None  # None: stalls are not watched
        self._stall_factor = 0.0
        # Called after every change a handle makes to the counters (the shared in-flight view publishes).
        self.on_change: Callable[[], None] | None = None

    def dispatch(
        self, address: str, prompt_tokens: int, max_tokens: int, cached_tokens: int = 0
    ) -> InFlightHandle:
        """Count a request sent to ``address``: one request and ``prompt_tokens − cached_tokens`` of prefill
        (``cached_tokens``: the part of the prompt the endpoint is expected to hold already)."""
        prompt_tokens, max_tokens, cached_tokens = int(prompt_tokens), int(max_tokens), int(cached_tokens)
        if prompt_tokens < 0 or max_tokens < 0 or not 0 <= cached_tokens <= prompt_tokens:
            raise ValueError(
                "token counts must be >= 0 and cached_tokens <= prompt_tokens "
                f"(prompt_tokens={prompt_tokens}, max_tokens={max_tokens}, cached_tokens={cached_tokens})"
            )
        handle = InFlightHandle(self, address, prompt_tokens, max_tokens, cached_tokens)
        self._outstanding += 1
        return handle

    def watch_stalls(self, floor_s: float, factor: float) -> None:
        """Keep each endpoint's progress: stalled after ``factor`` × its longest recent step, at least
        ``floor_s``, without a token. Called before requests are dispatched (unwatched, nothing is kept)."""
        self._stall_floor_s = floor_s
        self._stall_factor = factor

    @property
    def watches_stalls(self) -> bool:
        return self._stall_floor_s is not None

    def progressed(self, address: str, now: float) -> None:
        """``address`` produced a token at ``now`` (ignored unless stalls are watched and requests of this
        router decode there)."""
        progress = self._progress.get(address)
        if progress is None:
            if address in self._decoding:
                self._progress[address] = _Progress(now)
            return
        gap = now - progress.last
        progress.last = now
        if gap > _MIN_STEP_GAP_S:
            longest = progress.longest_now(now)
            if longest < gap < self._threshold(longest):
                progress.longest = gap
                progress.longest_at = now

    def stalled(self, address: str, now: float) -> bool:
        """Whether ``address`` has requests of this router decoding and produced no token for longer than
        its stall threshold."""
        progress = self._progress.get(address)
        return progress is not None and now - progress.last >= self._threshold(progress.longest_now(now))

    def stalled_endpoints(self, now: float) -> list[str]:
        return [address for address in self._progress if self.stalled(address, now)]

    def _threshold(self, longest_step_s: float) -> float:
        floor = self._stall_floor_s
        assert floor is not None
        return max(floor, self._stall_factor * longest_step_s)

    def _decode_started(self, address: str) -> None:
        if self._stall_floor_s is not None:
            self._decoding[address] = self._decoding.get(address, 0) + 1

    def _decode_ended(self, address: str) -> None:
        left = self._decoding.get(address, 0) - 1
        if left > 0:
            self._decoding[address] = left
        else:
            self._decoding.pop(address, None)
            self._progress.pop(address, None)

    def outstanding(self) -> int:
        """Handles dispatched and not finished yet."""
        return self._outstanding

    def leaked(self) -> int:
        """Handles that were garbage-collected without ``finish()`` (released then; each one is a bug)."""
        return self._leaked

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export ``slorouter_inflight_handles`` and ``slorouter_inflight_handles_leaked_total``."""
        registry.register(_TrackerCollector(self))


class InFlightHandle:
    """One dispatched request's share of its endpoint's in-flight counters."""

    __slots__ = (
        "_incarnation",
        "_phase",
        "_tracker",
        "address",
        "max_tokens",
        "prefill_ahead",
        "prefill_tokens",
        "prompt_tokens",
    )

    def __init__(
        self,
        tracker: InFlightTracker,
        address: str,
        prompt_tokens: int,
        max_tokens: int,
        cached_tokens: int = 0,
    ) -> None:
        self._tracker = tracker
        self.address = address
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.prefill_tokens = prompt_tokens - cached_tokens
        self._incarnation = tracker.pool.incarnation(address)
        self._phase = _PREFILL
        self._apply(1, self.prefill_tokens, 0)
        # Uncached tokens in flight on the endpoint with this request's own: the prefill it waits behind.
        pool = tracker.pool
        self.prefill_ahead = (
            int(pool.value(address, "inflight_prefill_tokens")) if pool.get(address) is not None else 0
        )

    @property
    def decoding(self) -> bool:
        return self._phase == _DECODE

    @property
    def finished(self) -> bool:
        return self._phase == _DONE

    def first_token(self) -> None:
        """Move the request from prefill to decode; a no-op after the first call or after ``finish()``."""
        if self._phase != _PREFILL:
            return
        self._phase = _DECODE
        self._apply(0, -self.prefill_tokens, self.prompt_tokens + self.max_tokens, 1)
        self._tracker._decode_started(self.address)

    def finish(self) -> None:
        """Remove whatever the request still holds; a no-op after the first call."""
        phase = self._phase
        if phase == _DONE:
            return
        self._phase = _DONE
        self._tracker._outstanding -= 1
        if phase == _PREFILL:
            self._apply(-1, -self.prefill_tokens, 0)
        else:
            self._apply(-1, 0, -(self.prompt_tokens + self.max_tokens), -1)
            self._tracker._decode_ended(self.address)

    def _apply(self, requests: int, prefill_tokens: int, decode_tokens: int, decoding: int = 0) -> None:
        tracker = self._tracker
        pool = tracker.pool
        if self._incarnation is not None and pool.incarnation(self.address) == self._incarnation:
            pool.add_inflight(self.address, requests, prefill_tokens, decode_tokens, decoding)
            if tracker.on_change is not None:
                tracker.on_change()

    def __enter__(self) -> InFlightHandle:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.finish()

    def __del__(self) -> None:
        if self._phase != _DONE:
            self._tracker._leaked += 1
            self.finish()

    def __repr__(self) -> str:
        phase = ("prefill", "decode", "done")[self._phase]
        return (
            f"InFlightHandle({self.address}, prompt={self.prompt_tokens}, prefill={self.prefill_tokens}, "
            f"max={self.max_tokens}, {phase})"
        )


class _TrackerCollector(Collector):
    def __init__(self, tracker: InFlightTracker) -> None:
        self._tracker = tracker

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "slorouter_inflight_handles",
            "Requests dispatched by this router whose in-flight accounting is not yet released.",
            value=self._tracker.outstanding(),
        )
        yield CounterMetricFamily(
            "slorouter_inflight_handles_leaked",
            "In-flight handles released only when garbage-collected (never finished by their request).",
            value=self._tracker.leaked(),
        )
