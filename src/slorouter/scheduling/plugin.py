"""Plugin kinds of the scheduling framework (after the original EPP's narrow interfaces).

A plugin class subclasses ``Plugin`` and one or more kinds below; an instance is wired into every slot whose
kind it implements. Plugins get their time and randomness from the ``PluginContext`` (never from ``time`` or
``random``) so the same code runs in real and virtual time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from pydantic import ConfigDict

from slorouter.clock import Clock, MonotonicClock
from slorouter.validation import StrictModel

if TYPE_CHECKING:
    from slorouter.metrics import LatencyMetrics
    from slorouter.pool.kv_index import KVBlockIndex
    from slorouter.pool.state import Endpoint, PoolState
    from slorouter.predictor.backend import LatencyPredictorBackend
    from slorouter.predictor.ledger import PredictionLedger
    from slorouter.scheduling.types import (
        Candidates,
        CycleState,
        InferenceRequest,
        ProfileRunResult,
        SchedulingResult,
    )


class PluginParams(StrictModel):
    """Base of every plugin's parameter model: unknown parameters are errors."""

    model_config = ConfigDict(populate_by_name=True)


@dataclass
class PluginContext:
    """What the framework hands every plugin: time, randomness, the pool, the latency predictor, metrics, the
    pods' KV-event index, the prediction ledger."""

    clock: Clock = field(default_factory=MonotonicClock)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng())
    pool: PoolState | None = None
    predictor: LatencyPredictorBackend | None = None
    metrics: LatencyMetrics | None = None
    kv_index: KVBlockIndex | None = None  # the pods' KV events, where subscribed (precise prefix plugins)
    ledger: PredictionLedger | None = None  # each routed request's prediction and outcome (latency plugins)


class Plugin:
    """Base of all plugins. ``type_name`` is the registry key; ``Params`` validates the parameters."""

    type_name: ClassVar[str] = ""
    Params: ClassVar[type[PluginParams]] = PluginParams
    # Data keys (``Candidates.attrs`` names) this plugin reads. The loader auto-creates the registered default
    # producer of every key that no configured plugin produces, and orders producers before their consumers.
    consumes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, name: str, params: PluginParams, ctx: PluginContext) -> None:
        self.name = name or self.type_name
        self.params = params
        self.ctx = ctx

    def __repr__(self) -> str:
        return f"{self.name}/{self.type_name}"


class Filter(ABC):
    @abstractmethod
    def filter(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> Candidates:
        """Return the candidates that survive (possibly all, possibly none)."""


class Scorer(ABC):
    @abstractmethod
    def score(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> np.ndarray:
        """One float per candidate; the framework clamps to [0, 1] and applies the profile weight."""


class ListScorer(Scorer):
    """A scorer with a plain-Python twin of ``score`` for small candidate sets.

    On a handful of candidates each numpy call costs more (≈1 µs) than the arithmetic, so a profile whose
    scorers and picker all have list twins runs them instead when there are few candidates. ``score_list``
    must return exactly (bit for bit) what ``score`` returns, as Python floats.
    """

    @abstractmethod
    def score_list(self, cycle: CycleState, request: InferenceRequest, candidates: Candidates) -> list[float]:
        """``score(...)`` as a list of floats."""


class Picker(ABC):
    @abstractmethod
    def pick(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: np.ndarray
    ) -> np.ndarray:
        """Indices into ``candidates`` of the chosen endpoints, best first (at least one when non-empty)."""


class ListPicker(Picker):
    """A picker with a plain-Python twin of ``pick`` for small candidate sets (see ``ListScorer``).

    ``pick_list`` must choose exactly what ``pick`` chooses and draw the same random numbers, so that the
    two paths leave the random generator in the same state.
    """

    @abstractmethod
    def pick_list(
        self, cycle: CycleState, request: InferenceRequest, candidates: Candidates, scores: list[float]
    ) -> list[int]:
        """``pick(...)`` as a list of indices."""


class ProfileHandler(ABC):
    @abstractmethod
    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: list[str],
        results: dict[str, ProfileRunResult | None],
    ) -> list[str]:
        """Names of the profiles to run next; empty ends the cycle."""

    @abstractmethod
    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: dict[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        """Turn the profile results into the scheduling result (raises SchedulingError on failure)."""

    def validate_profiles(self, profile_names: list[str]) -> None:  # noqa: B027 (optional hook)
        """Called by the config loader: raise ``ValueError`` if this handler cannot run these profiles."""


class CandidateSwitch(ABC):
    """A profile handler that routes by one of several named candidate pipelines at a time, and lets the
    router's tuner change which (``SchedulerSetup.candidate_switch``)."""

    @property
    @abstractmethod
    def candidates(self) -> tuple[str, ...]:
        """The candidates' names, in configuration order."""

    @property
    @abstractmethod
    def active(self) -> str:
        """The candidate that routes the next request."""

    @abstractmethod
    def activate(self, name: str) -> None:
        """Route from the next request on by ``name``; ``ValueError`` for a name not in ``candidates``."""


class DataProducer(ABC):
    """Runs before admission and scheduling; attaches per-candidate arrays to ``candidates.attrs``.

    ``produce`` either does its work at once and returns None, or, when its data needs I/O (a remote
    latency predictor), returns an awaitable that attaches the data when it completes. The Director awaits
    it within the producers' shared time budget; past the budget it is cancelled and scheduling goes on
    without its data. Front-ends without an event loop (the discrete-event benchmark) accept only producers
    that return None.
    """

    produces: ClassVar[tuple[str, ...]] = ()
    consumes: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def produce(self, request: InferenceRequest, candidates: Candidates) -> Awaitable[None] | None: ...


class Admitter(ABC):
    @abstractmethod
    def admit(self, request: InferenceRequest, candidates: Candidates) -> None:
        """Raise ``AdmissionDeniedError`` to reject the request."""


@dataclass(frozen=True, slots=True)
class TargetPrediction:
    """The latency predicted for the chosen endpoint (served to clients as response headers)."""

    ttft_ms: float  # E2E latency when the predictor models it instead of TTFT (streamingMode false)
    tpot_ms: float | None = None  # None when TPOT is not modelled
    # The live-coverage factors included in ttft_ms and tpot_ms (1: none), so a caller can take them out.
    ttft_coverage_factor: float = 1.0
    tpot_coverage_factor: float = 1.0

    @property
    def model_ttft_ms(self) -> float:
        """The model's own TTFT quantile: ``ttft_ms`` without the live-coverage factor."""
        return self.ttft_ms / self.ttft_coverage_factor

    @property
    def model_tpot_ms(self) -> float | None:
        """The model's own TPOT quantile: ``tpot_ms`` without the live-coverage factor; None when TPOT is not
        modelled (or not yet: 0)."""
        return self.tpot_ms / self.tpot_coverage_factor if self.tpot_ms else None


@dataclass(frozen=True, slots=True)
class PreRequestResult:
    """What a pre-request hook tells the framework about the dispatch; None fields: nothing to say.

    ``cached_prompt_tokens``: how much of the prompt the chosen endpoint is expected to hold in its prefix
    cache; the in-flight prefill accounting leaves it out. ``prediction``: the chosen endpoint's predicted
    latency.
    """

    cached_prompt_tokens: int | None = None
    prediction: TargetPrediction | None = None


class PreRequest(ABC):
    @abstractmethod
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> PreRequestResult | None:
        """Runs after the pick, before the request is forwarded."""


class LatencyPredicting(ABC):
    """A plugin whose predictions some front-end output depends on declares what it predicts."""

    @property
    @abstractmethod
    def predicts_end_to_end(self) -> bool:
        """True when its "TTFT" is the end-to-end latency (non-streaming mode), as the original does."""


class Termination(StrEnum):
    """How a dispatched request ended (``ResponseInfo.cause``)."""

    COMPLETE = "complete"  # the whole response arrived (with the server's status, an error status too)
    CLIENT_GONE = "client-gone"  # the client left (or its stream was reset) before the response ended
    UPSTREAM_ERROR = "upstream-error"  # no connection, a broken stream, or an answer that is not the API's
    UPSTREAM_TIMEOUT = "upstream-timeout"  # the model server did not answer, or stopped, within a timeout
    CANCELLED = "cancelled"  # the router ended it: its deadline passed, a hedged twin answered, the run ended
    EVICTED = "evicted"  # the router took it back to make room for more urgent work


@dataclass(slots=True)
class ResponseInfo:
    """What the front-end has seen of the upstream response so far.

    ``tokens`` counts output tokens seen so far (SSE events carrying text, or ``usage`` at the end);
    ``first_token_at`` is the clock time of the first one; ``usage`` is the upstream's ``usage`` when known.
    ``cause`` is how the request ended (None while it runs), ``detail`` what the front-end saw, for logs and
    spans (``"connect: UpstreamConnectError"``); ``succeeded`` is a whole response with a status below 400.
    ``reply_text`` is the start of the generated reply (choice 0), collected by the front-end only when a
    response body processor asked for it (``ResponseBodyProcessor.reply_chars_wanted``).
    ``history_text``, set by the framework at a successful end when a reply was collected and the request's
    ``history_form`` allows it, is what the next turn of the conversation is expected to send as its prompt
    text: this prompt text followed by the reply, in the same form.
    """

    endpoint: Endpoint
    status: int = 0
    streaming: bool = False
    dispatched_at: float = 0.0
    first_token_at: float | None = None
    completed_at: float | None = None
    tokens: int = 0
    usage: dict[str, Any] | None = None
    cause: Termination | None = None
    detail: str = ""
    reply_text: str | None = None
    history_text: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.cause is Termination.COMPLETE and self.status < 400

    @property
    def failed(self) -> bool:
        """It ended without its whole response (False while it runs)."""
        return self.cause is not None and self.cause is not Termination.COMPLETE


class ResponseHeaderProcessor(ABC):
    @abstractmethod
    def on_response_headers(self, request: InferenceRequest, response: ResponseInfo) -> None: ...


class ResponseBodyProcessor(ABC):
    """Called on the first token (``start_of_stream``), on later chunks, and once at the end."""

    @abstractmethod
    def on_response_body(
        self, request: InferenceRequest, response: ResponseInfo, *, start_of_stream: bool, end_of_stream: bool
    ) -> None: ...

    def reply_chars_wanted(self, request: InferenceRequest) -> int:
        """How many characters of the reply this plugin needs (``ResponseInfo.reply_text``); 0: none.

        Asked once per request, after the pre-request hooks; every front-end collects the largest amount
        asked for, so a plugin never depends on how a front-end reads responses.
        """
        return 0


KIND_CLASSES: dict[str, type] = {
    "ProfileHandler": ProfileHandler,
    "Filter": Filter,
    "Scorer": Scorer,
    "Picker": Picker,
    "DataProducer": DataProducer,
    "Admitter": Admitter,
    "PreRequest": PreRequest,
    "ResponseHeaderProcessor": ResponseHeaderProcessor,
    "ResponseBodyProcessor": ResponseBodyProcessor,
}
