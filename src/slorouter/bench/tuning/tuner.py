"""The tuner: each round it fits the twin to the window, checks that it reproduces what the router
observed, replays the window under every candidate, and says which candidate should route next.

A round (``Tuner.tune``):

1. **Window.** None before ``min_span_s`` of traffic (the pool's cold start). The last ``window_s`` of
   answered requests (at most ``max_requests``, the most recent), cut
   where answers have settled (``settled``); replays measure the requests after the first ``warmup_share``
   of it (the twin's caches start cold). The requests still running when the window starts are replayed too,
   unmeasured, so that the twin's pods start as loaded as the real ones were.
2. **Fit.** The twin's pods are sized from the scraped capacity and queues, then each pod's two scales are
   fitted to the requests the router sent it (``twin.fit_to_placements``): four iterations on the first
   round, two after (the twin carries over from round to round).
3. **Validate.** The window replayed under what routed it (the candidate active when it starts, switched
   when the router switched): its TTFT and TPOT p50 and p90 against the observed ones. The largest relative
   error is the twin's error; above ``max_twin_error`` the round ends there and nothing changes, unless the
   twin has been untrusted for ``untrusted_rounds`` rounds in a row while another candidate than the
   pipeline's configured one routes: then the router goes back to it.
4. **Compare.** Every other candidate (but those resting: far behind in a recent round) replayed alone on
   the same traffic with the same seed. A candidate is eligible when its TTFT p99 and TPOT p50 are no worse
   than the active one's by more than ``tolerance`` (and its SLO attainment, when requests carry SLOs, no
   lower by more than ``tolerance``); the best eligible one by TTFT p90 is the round's best.
5. **Decide.** Switch when the best one's TTFT p90 gain over the active one's (both in the twin) exceeds both
   ``min_gain`` and the twin's own error on TTFT p90. Staying needs no margin, so the rule has a dead band:
   the hysteresis that keeps two close candidates from alternating.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from slorouter.bench.cluster import ClusterSettings
from slorouter.bench.tuning import figures as figures_of
from slorouter.bench.tuning.figures import Figures
from slorouter.bench.tuning.replay import Traffic, replay
from slorouter.bench.tuning.twin import PoolTwin, fit_to_placements, initial
from slorouter.predictor.model_store import ModelMetadata
from slorouter.scheduling.plugin import Admitter, DataProducer
from slorouter.scheduling.registry import plugin_class
from slorouter.serving.traffic_window import WindowEntry

PREDICTOR_PLUGIN = "predicted-latency-producer"
SWITCH_PLUGIN = "candidate-profile-handler"


@dataclass(frozen=True, slots=True)
class TuningSettings:
    interval_s: float = 180.0  # between rounds
    window_s: float = 120.0  # the traffic each round replays
    warmup_share: float = 0.25  # replays measure after this share of the window
    candidates: tuple[str, ...] = ()  # () : every candidate of the pipeline
    max_twin_error: float = 0.25  # largest relative error of the twin's TTFT/TPOT p50/p90 it is trusted at
    min_gain: float = 0.03  # smallest TTFT p90 gain (a share) worth a switch
    tolerance: float = 0.02  # how much worse TTFT p99, TPOT p50 (share) or SLO attainment (points) may be
    min_requests: int = 100  # fewer in the window: no round
    min_span_s: float = 60.0  # no round before the router has seen this much traffic (its cold start)
    max_requests: int = 4000  # more in the window: the most recent ones (a replay's cost is per request)
    # A candidate whose TTFT p90 in the twin was above this many times the round's best sits out the next
    # ``rest_rounds`` rounds (it is far from winning, and every replay costs as much as the traffic).
    rest_ratio: float = 1.5
    rest_rounds: int = 3
    # After this many rounds in a row with an untrusted twin, the router goes back to the pipeline's
    # configured candidate (when another one routes).
    untrusted_rounds: int = 2
    first_calibrations: int = 4  # fitting iterations of the first round
    calibrations: int = 2  # of later rounds (the twin carries over)
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.interval_s > 0 and self.window_s > 0 and 0 <= self.warmup_share < 1):
            raise ValueError("interval_s and window_s must be > 0 and warmup_share in [0, 1)")
        if min(self.max_twin_error, self.min_gain, self.tolerance) < 0 or self.min_requests < 1:
            raise ValueError("max_twin_error, min_gain and tolerance must be >= 0 and min_requests >= 1")


class Outcome(StrEnum):
    """How a round ended."""

    SWITCHED = "switched"  # a candidate beat the active one by more than the threshold
    KEPT = "kept"  # the twin was trusted and the active candidate stays
    UNTRUSTED = "untrusted"  # the twin's error was above max_twin_error: nothing compared
    SKIPPED = "skipped"  # too few requests in the window


@dataclass(frozen=True, slots=True)
class TuningRound:
    """What one round found and decided."""

    at: float  # the router's clock
    active: str  # the candidate routing during the window
    requests: int
    observed: Figures | None = None
    replayed: dict[str, Figures] = field(default_factory=dict)  # by candidate
    twin_error: float = math.inf  # largest relative error of the active candidate's replay
    errors: dict[str, float] = field(default_factory=dict)  # by figure
    best: str | None = None
    predicted_gain: float = 0.0  # 1 − best TTFT p90 / active TTFT p90, in the twin
    switch_to: str | None = None
    reason: str = ""
    twin: PoolTwin | None = None

    @property
    def outcome(self) -> Outcome:
        if self.switch_to is not None:
            return Outcome.SWITCHED
        if self.observed is None:
            return Outcome.SKIPPED
        return Outcome.KEPT if self.replayed else Outcome.UNTRUSTED


def settled(entries: Sequence[WindowEntry], now: float, window_s: float) -> list[WindowEntry]:
    """The entries that arrived early enough that nearly every request of their time has been answered: the
    window holds answered requests only, so its last seconds lack the long ones still running, and both the
    observed figures and the replayed load would be biased there. Cut at ``now`` minus the window's p95
    end-to-end latency (at most a third of the window)."""
    if not entries:
        return []
    e2e_s = sorted(
        (e.ttft_ms + (e.tpot_ms or 0.0) * max(e.output_tokens - 1, 0)) / 1000.0
        for e in entries
        if e.ttft_ms is not None
    )
    lag = e2e_s[int(0.95 * (len(e2e_s) - 1))] if e2e_s else 0.0
    end = now - min(lag, window_s / 3.0)
    return [e for e in entries if e.arrival <= end]


def running_at(entries: Sequence[WindowEntry], at: float) -> list[WindowEntry]:
    """The entries that arrived before ``at`` and ended after it."""
    return [e for e in entries if e.arrival < at and _end(e) >= at]


def _end(entry: WindowEntry) -> float:
    """When an answered request ended (its arrival for one that failed before its first token)."""
    if entry.ttft_ms is None:
        return entry.arrival
    decode_ms = (entry.tpot_ms or 0.0) * max(entry.output_tokens - 1, 0)
    return entry.arrival + (entry.ttft_ms + decode_ms) / 1000.0


def _configured_active(config: Mapping[str, Any]) -> str:
    for plugin in config["plugins"]:
        if plugin.get("type") == SWITCH_PLUGIN:
            parameters = plugin["parameters"]
            return str(parameters.get("active") or parameters["candidates"][0]["name"])
    raise ValueError(f"the pipeline has no {SWITCH_PLUGIN}")


def pinned(config: Mapping[str, Any], candidate: str) -> dict[str, Any]:
    """``config`` with its candidate switch fixed on ``candidate``."""
    out = copy.deepcopy(dict(config))
    for plugin in out["plugins"]:
        if plugin.get("type") == SWITCH_PLUGIN:
            plugin.setdefault("parameters", {})["active"] = candidate
            return out
    raise ValueError(f"the pipeline has no {SWITCH_PLUGIN}")


def pruned(config: Mapping[str, Any], candidate: str, *, admission: bool = False) -> dict[str, Any]:
    """``candidate`` alone: its profiles, the plugins they reference, and the producers of the data those
    consume (transitively). A predicted candidate (one with a fallback profile) keeps every producer and
    admitter (its profile handler and filters read the predictor's data without declaring it), and so does
    any candidate with ``admission`` (the admitters shed by predictions). The replay of a candidate is the
    same with or without the rest, and cheaper: a non-predicted candidate runs without the predictor and the
    load core."""
    out = pinned(config, candidate)
    handler = next(p for p in out["plugins"] if p.get("type") == SWITCH_PLUGIN)
    chosen = next(c for c in handler["parameters"]["candidates"] if c["name"] == candidate)
    handler["parameters"]["candidates"] = [chosen]
    profile_names = {chosen["profile"], chosen.get("fallbackProfile")} - {None}
    profiles = [p for p in out["schedulingProfiles"] if p["name"] in profile_names]
    by_name = {p.get("name") or p["type"]: p for p in out["plugins"]}
    classes = {name: plugin_class(p["type"]) for name, p in by_name.items()}
    keep = {handler.get("name") or handler["type"]}
    keep |= {ref["pluginRef"] for profile in profiles for ref in profile["plugins"]}
    if admission or chosen.get("fallbackProfile") is not None:  # a predicted candidate: every producer
        keep |= {n for n, c in classes.items() if issubclass(c, Admitter | DataProducer)}
    while True:
        wanted = {key for name in keep for key in classes[name].consumes}
        more = {
            n
            for n, c in classes.items()
            if n not in keep and issubclass(c, DataProducer) and wanted & set(c.produces)
        }
        if not more:
            break
        keep |= more
    out["plugins"] = [p for name, p in by_name.items() if name in keep]
    out["schedulingProfiles"] = profiles
    return out


def candidates_of(config: Mapping[str, Any]) -> tuple[str, ...]:
    for plugin in config["plugins"]:
        if plugin.get("type") == SWITCH_PLUGIN:
            return tuple(c["name"] for c in plugin["parameters"]["candidates"])
    raise ValueError(f"the pipeline has no {SWITCH_PLUGIN}")


class Tuner:
    """Rounds of the tuner over one pipeline (``config``: a scheduler config with a candidate switch)."""

    def __init__(
        self,
        config: Mapping[str, Any],
        settings: TuningSettings | None = None,
        *,
        cluster: ClusterSettings | None = None,
    ) -> None:
        self.config = copy.deepcopy(dict(config))
        self.settings = settings or TuningSettings()
        known = candidates_of(self.config)
        wanted = self.settings.candidates or known
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise ValueError(f"unknown candidates {', '.join(unknown)} (the pipeline has {', '.join(known)})")
        self.candidates = tuple(wanted)
        self.cluster = cluster
        self.twin: PoolTwin | None = None
        self.rounds = 0
        self.history: list[tuple[float, str]] = []  # (router clock, candidate) of each switch decided
        self.resting: dict[str, int] = {}  # candidate → rounds it still sits out
        self.untrusted = 0  # rounds in a row the twin was not trusted
        self.first_seen: float | None = None  # the arrival of the first request the tuner saw
        self.default = _configured_active(self.config)  # where an untrusted twin sends the router back

    def tune(
        self,
        entries: Sequence[WindowEntry],
        *,
        now: float,
        active: str,
        addresses: Sequence[str],
        capacity: Mapping[str, tuple[int, int]] | None = None,
        models: Sequence[tuple[bytes, ModelMetadata]] = (),
        copies: int = 1,
    ) -> TuningRound:
        """One round over the window's entries (see the module docstring); ``copies``: how many pickers
        share the pool, each seeing traffic like this window's (``Traffic.of``)."""
        s = self.settings
        window = settled([e for e in entries if e.arrival >= now - s.window_s], now, s.window_s)
        if len(window) > s.max_requests:
            window = sorted(window, key=lambda e: e.arrival)[-s.max_requests :]
        if len(window) < s.min_requests:
            return TuningRound(now, active, len(window), reason=f"{len(window)} requests in the window")
        start = min(e.arrival for e in window)
        if self.first_seen is None:
            self.first_seen = min(e.arrival for e in entries)
        if now - self.first_seen < s.min_span_s:  # the pool's cold start: not what it will be
            return TuningRound(
                now, active, len(window), reason=f"{now - self.first_seen:.0f} s of traffic seen"
            )
        # The requests still running when the window starts are replayed too (not measured), so that the
        # twin's pods start as loaded as the real ones were, queues included.
        carried = running_at(entries, start)
        traffic = Traffic.of([*carried, *window], copies)
        span = max(e.arrival for e in window) - start
        measure_from = start - traffic.start + s.warmup_share * span
        measured = [e for e in traffic.entries if e.arrival - traffic.start >= measure_from]
        addresses = tuple(addresses)
        twin = self.twin
        if twin is None or twin.addresses != addresses:
            twin = initial(addresses, window)
        twin = twin.with_sizes(window, capacity or {})
        observed = figures_of.observed(measured, twin.pod_of)

        # The validation replays what ran: the candidate active when the window starts, then each switch.
        first, switches = active, []
        for at, candidate in self.history:
            if at <= traffic.start:
                first = candidate
            else:
                switches.append((at - traffic.start, candidate))

        sheds = any(e.priority < 0 and (e.slo_ttft_ms or e.slo_tpot_ms) for e in window)

        def run(candidate: str, pool: PoolTwin, switches: Sequence[tuple[float, str]] = ()) -> Figures:
            # With switches, the whole pipeline (any candidate may route); else the candidate alone.
            config = (
                pinned(self.config, candidate)
                if switches
                else pruned(self.config, candidate, admission=sheds)
            )
            return replay(
                pool,
                config,
                traffic,
                measure_from_s=measure_from,
                models=models,
                uses_predictor=any(p.get("type") == PREDICTOR_PLUGIN for p in config["plugins"]),
                seed=s.seed,
                settings=self.cluster,
                switches=switches,
            )

        iterations = s.first_calibrations if self.rounds == 0 else s.calibrations
        twin = fit_to_placements(twin, traffic, iterations=iterations, settings=self.cluster)
        self.twin = twin
        self.rounds += 1
        ran = run(first, twin, switches)
        errors = ran.errors_against(observed)
        error = max(errors.values(), default=math.inf)
        base = TuningRound(now, active, len(window), observed, {}, error, errors, twin=twin)
        if not error <= s.max_twin_error:
            self.untrusted += 1
            reason = f"twin error {error:.0%} is above {s.max_twin_error:.0%}"
            if self.untrusted >= s.untrusted_rounds and active != self.default:
                # A twin that cannot follow the pool gives no reason to keep a candidate it chose: back to
                # the pipeline's configured one.
                self.history.append((now, self.default))
                reason += f" for {self.untrusted} rounds: back to {self.default}"
                return _with(base, switch_to=self.default, reason=reason)
            return _with(base, reason=reason)
        self.untrusted = 0
        replayed = {active: ran if not switches else run(active, twin)}
        for candidate in self.candidates:
            if candidate != active and not self.resting.get(candidate):
                replayed[candidate] = run(candidate, twin)
        self._rest(replayed)
        best, gain = self._best(active, replayed)
        threshold = max(s.min_gain, errors.get("ttft_p90_ms", math.inf))
        if best == active or not gain > threshold:
            return _with(
                base,
                replayed=replayed,
                best=best,
                predicted_gain=gain,
                reason=f"best {best}: gain {gain:.1%} not above {threshold:.1%}"
                if best != active
                else "active is best",
            )
        self.history.append((now, best))  # the caller switches now
        return _with(
            base,
            replayed=replayed,
            best=best,
            predicted_gain=gain,
            switch_to=best,
            reason=f"{best}: TTFT p90 {gain:.1%} lower in the twin (threshold {threshold:.1%})",
        )

    def reverted(self, now: float, back_to: str) -> None:
        """The router went back to ``back_to`` (the switch guard saw the last switch collapse): the candidate
        it left sits out the next ``rest_rounds`` rounds."""
        if self.history:
            self.resting[self.history[-1][1]] = self.settings.rest_rounds
        self.history.append((now, back_to))

    def _rest(self, replayed: Mapping[str, Figures]) -> None:
        s = self.settings
        self.resting = {c: n - 1 for c, n in self.resting.items() if n > 1}
        best = min((f.ttft_p90_ms for f in replayed.values()), default=math.inf)
        for candidate, fig in replayed.items():
            if math.isfinite(best) and not fig.ttft_p90_ms <= s.rest_ratio * best:
                self.resting[candidate] = s.rest_rounds

    def _best(self, active: str, replayed: Mapping[str, Figures]) -> tuple[str, float]:
        tol = self.settings.tolerance
        mine = replayed[active]
        best, best_p90 = active, mine.ttft_p90_ms
        for candidate, fig in replayed.items():
            if candidate == active:
                continue
            if fig.ttft_p99_ms > mine.ttft_p99_ms * (1 + tol):
                continue
            if math.isfinite(mine.tpot_p50_ms) and fig.tpot_p50_ms > mine.tpot_p50_ms * (1 + tol):
                continue
            if (
                mine.slo_attainment is not None
                and fig.slo_attainment is not None
                and fig.slo_attainment < mine.slo_attainment - tol
            ):
                continue
            if fig.ttft_p90_ms < best_p90:
                best, best_p90 = candidate, fig.ttft_p90_ms
        if not (math.isfinite(mine.ttft_p90_ms) and mine.ttft_p90_ms > 0):
            return best, 0.0
        return best, 1.0 - best_p90 / mine.ttft_p90_ms


def _with(base: TuningRound, **changes: Any) -> TuningRound:
    return dataclasses.replace(base, **changes)
