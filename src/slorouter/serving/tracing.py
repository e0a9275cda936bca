"""The span attributes every front-end records (``slorouter.tracing``): the request, its upstream and its
outcome; the pick's are ``RoutingFacts.span_attributes``."""

from __future__ import annotations

from slorouter.director import RequestLifecycle
from slorouter.scheduling.regret import Regret
from slorouter.scheduling.types import InferenceRequest
from slorouter.serving.headers import AttributeDict


def request_attributes(front_end: str, method: str, path: str) -> AttributeDict:
    """What is known when the request's span starts (before the body is read)."""
    return {"slorouter.front_end": front_end, "http.request.method": method, "url.path": path}


def parsed_attributes(request: InferenceRequest) -> AttributeDict:
    """What the parsed body and routing headers add."""
    attributes: AttributeDict = {
        "slorouter.request_id": request.request_id,
        "gen_ai.request.model": request.model,
        "slorouter.prompt_tokens": request.prompt_tokens,
        "slorouter.streaming": request.stream,
        "slorouter.priority": request.priority,
    }
    if request.target_model != request.model:
        attributes["slorouter.target_model"] = request.target_model
    if request.slo_ttft_ms is not None:
        attributes["slorouter.slo_ttft_ms"] = request.slo_ttft_ms
    if request.slo_tpot_ms is not None:
        attributes["slorouter.slo_tpot_ms"] = request.slo_tpot_ms
    return attributes


def upstream_attributes(address: str) -> AttributeDict:
    host, _, port = address.rpartition(":")
    attributes: AttributeDict = {"server.address": host.strip("[]") or address}
    if port.isdigit():
        attributes["server.port"] = int(port)
    return attributes


def outcome_attributes(lifecycle: RequestLifecycle) -> AttributeDict:
    """What the response told (after its end)."""
    response = lifecycle.response
    attributes: AttributeDict = {"slorouter.output_tokens": response.tokens}
    if response.first_token_at is not None:
        attributes["slorouter.ttft_ms"] = (response.first_token_at - response.dispatched_at) * 1000
    return attributes


def regret_attributes(regret: Regret) -> AttributeDict:
    """The pick's routing regret (``audit.regret``)."""
    attributes: AttributeDict = {
        "slorouter.regret.achieved_prefix_tokens": regret.achieved_prefix_tokens,
        "slorouter.regret.reachable_prefix_tokens": regret.reachable_prefix_tokens,
    }
    if regret.ttft_regret_ms is not None:
        attributes["slorouter.regret.ttft_ms"] = regret.ttft_regret_ms
    return attributes
