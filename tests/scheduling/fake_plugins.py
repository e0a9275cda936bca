"""Small plugins registered under ``test-*`` type names, to exercise the framework and the loader."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from slorouter.scheduling.plugin import (
    Admitter,
    DataProducer,
    Filter,
    Plugin,
    PluginParams,
    PreRequest,
    ProfileHandler,
    ResponseBodyProcessor,
    ResponseHeaderProcessor,
    Scorer,
)
from slorouter.scheduling.registry import register_plugin
from slorouter.scheduling.types import NoEndpointPickedError, Route, SchedulingResult


class FixedScoresParams(PluginParams):
    values: list[float] = Field(default_factory=list)  # one score per pool position


@register_plugin
class FixedScorer(Plugin, Scorer):
    type_name = "test-fixed-scorer"
    Params = FixedScoresParams

    def score(self, cycle, request, candidates):
        return np.asarray(self.params.values, dtype=float)[candidates.positions]


class KeepParams(PluginParams):
    positions: list[int] = Field(default_factory=list)


@register_plugin
class KeepFilter(Plugin, Filter):
    """Keeps the candidates at the given pool positions."""

    type_name = "test-keep-filter"
    Params = KeepParams

    def filter(self, cycle, request, candidates):
        cycle.setdefault("filters_run", []).append(self.name)
        return candidates.subset(np.isin(candidates.positions, self.params.positions))


PIN_HEADER = "x-test-pin"


@register_plugin
class PinFilter(Plugin, Filter):
    """Keeps the candidate a request names in its ``x-test-pin`` header (every candidate if none)."""

    type_name = "test-pin-filter"

    def filter(self, cycle, request, candidates):
        pin = request.headers.get(PIN_HEADER)
        if pin is None:
            return candidates
        return candidates.subset(np.array([e.address == pin for e in candidates.endpoints], dtype=bool))


@register_plugin
class RouteScorer(Plugin, Scorer):
    type_name = "test-route-scorer"

    def score(self, cycle, request, candidates):
        cycle.route = Route.PREDICTED
        return np.zeros(len(candidates))


class _KeyProducer(Plugin, DataProducer):
    def produce(self, request, candidates):
        request.state.setdefault("produced", []).append(self.name)


@register_plugin(default_producer=True)
class ProducerA(_KeyProducer):
    type_name = "test-producer-a"
    produces = ("test-a",)
    consumes = ("test-b",)


@register_plugin(default_producer=True)
class ProducerB(_KeyProducer):
    type_name = "test-producer-b"
    produces = ("test-b",)


@register_plugin
class ProducerX(_KeyProducer):
    type_name = "test-producer-x"
    produces = ("test-x",)
    consumes = ("test-y",)


@register_plugin
class ProducerY(_KeyProducer):
    type_name = "test-producer-y"
    produces = ("test-y",)
    consumes = ("test-x",)


@register_plugin
class ConsumerScorer(Plugin, Scorer):
    type_name = "test-consumer-scorer"
    consumes = ("test-a",)

    def score(self, cycle, request, candidates):
        return np.zeros(len(candidates))


@register_plugin
class OrphanConsumer(Plugin, Scorer):
    type_name = "test-orphan-consumer"
    consumes = ("test-nobody-produces",)

    def score(self, cycle, request, candidates):
        return np.zeros(len(candidates))


@register_plugin
class Hooks(Plugin, Admitter, PreRequest, ResponseHeaderProcessor, ResponseBodyProcessor):
    type_name = "test-hooks"

    def admit(self, request, candidates):
        pass

    def pre_request(self, request, result):
        pass

    def on_response_headers(self, request, response):
        pass

    def on_response_body(self, request, response, *, start_of_stream, end_of_stream):
        pass


@register_plugin
class PrefillDecodeHandler(Plugin, ProfileHandler):
    """Runs "prefill" then "decode" (one per round); "decode" is primary."""

    type_name = "test-prefill-decode-handler"

    def validate_profiles(self, profile_names):
        if set(profile_names) != {"prefill", "decode"}:
            raise ValueError("needs exactly the profiles 'prefill' and 'decode'")

    def pick_profiles(self, cycle, request, profiles, results):
        cycle.setdefault("rounds", []).append(sorted(results))
        for name in ("prefill", "decode"):
            if name not in results:
                return [name]
        return []

    def process_results(self, cycle, request, results):
        if results.get("decode") is None:
            raise NoEndpointPickedError("decode profile found nothing")
        return SchedulingResult(profile_results=dict(results), primary_profile="decode")
