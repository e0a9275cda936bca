"""Reading and writing Envoy ext_proc messages (``envoy.service.ext_proc.v3``), and nothing else: what the
picker decides is in ``extproc.stream``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext_proc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from slorouter.http.errors import error_body
from slorouter.serving.scores_header import ENDPOINT_SCORES_KEY


class ProtocolError(Exception):
    """Envoy sent a message the ext_proc protocol does not allow here (out of order, unknown kind)."""


# The Endpoint Picker Protocol's names (GIE proposal 004).
DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
# The endpoint that finally served the request, as the data plane reports it (header or envoy.lb metadata).
SERVED = "x-gateway-destination-endpoint-served"
# Envoy's response flags (%RESPONSE_FLAGS%), as the generated bootstrap adds them to every response.
RESPONSE_FLAGS = "x-slorouter-response-flags"
# How many upstream attempts Envoy made (%UPSTREAM_REQUEST_ATTEMPT_COUNT%): 2 after a hedged copy was sent.
ATTEMPTS = "x-slorouter-upstream-attempts"
# Envoy's router headers the picker sets for a request's plan (ext_proc's mutation_rules must allow_envoy):
# the per-try timeout (the hedge delay, or the TTFT deadline), hedging on it or not, and the retries (one:
# the hedged copy, never a second).
PER_TRY_TIMEOUT = "x-envoy-upstream-rq-per-try-timeout-ms"
HEDGE_ON_PER_TRY_TIMEOUT = "x-envoy-hedge-on-per-try-timeout"
MAX_RETRIES = "x-envoy-max-retries"
# The observed response path: the gRPC metadata a data plane's ext_proc filters declare their role with
# (the picking filter, which skips the response, and the observing one, in observability mode), and the
# dynamic metadata the pick leaves for the observer and for the route's response headers.
RESPONSE_PATH = b"x-slorouter-response-path"
OBSERVED = b"observed"
OBSERVER = b"observer"
OBSERVED_NAMESPACE = "slorouter"
REQUEST_KEY = "request"
# The SLO a TTFT deadline keeps (the client's error message names it), for the data plane's local reply.
DEADLINE_KEY = "deadline"
# The ext_proc filter's attributes (``response_attributes``) the observer reads.
_ATTRIBUTES = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
RESPONSE_FLAG_BITS = "response.flags"
UPSTREAM_ATTEMPTS = "upstream.request_attempt_count"

ProcessingRequest = ext_proc.ProcessingRequest
ProcessingResponse = ext_proc.ProcessingResponse
BodySendMode = processing_mode_pb2.ProcessingMode.BodySendMode
BUFFERED = BodySendMode.Value("BUFFERED")
STREAMED = BodySendMode.Value("STREAMED")
FULL_DUPLEX_STREAMED = BodySendMode.Value("FULL_DUPLEX_STREAMED")
NONE = BodySendMode.Value("NONE")
# One streamed body mutation per this many bytes: well under the gRPC message limits on either side.
STREAMED_CHUNK_BYTES = 1 << 20

_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.Value("OVERWRITE_IF_EXISTS_OR_ADD")
_DATA_PLANE_HEADERS = [SERVED, RESPONSE_FLAGS, ATTEMPTS]
_STATUS_CODES = frozenset(http_status_pb2.StatusCode.values())
_CONTINUE_REQUEST_HEADERS = ProcessingResponse(request_headers=ext_proc.HeadersResponse())
_CONTINUE_REQUEST_BODY = ProcessingResponse(request_body=ext_proc.BodyResponse())
_CONTINUE_RESPONSE_BODY = ProcessingResponse(response_body=ext_proc.BodyResponse())
_CONTINUE_REQUEST_TRAILERS = ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
_CONTINUE_RESPONSE_TRAILERS = ProcessingResponse(response_trailers=ext_proc.TrailersResponse())
# The answers that never change, serialized once: most messages of a stream get one of them.
_SERIALIZED = {
    id(response): response.SerializeToString()
    for response in (
        _CONTINUE_REQUEST_HEADERS,
        _CONTINUE_REQUEST_BODY,
        _CONTINUE_RESPONSE_BODY,
        _CONTINUE_REQUEST_TRAILERS,
        _CONTINUE_RESPONSE_TRAILERS,
    )
}


def serialized(response: ext_proc.ProcessingResponse) -> bytes:
    """The wire form of an answer (the constant ones are serialized once)."""
    cached = _SERIALIZED.get(id(response))
    return cached if cached is not None else response.SerializeToString()


def header_map(headers: ext_proc.HttpHeaders) -> dict[str, str]:
    """The headers of an ``HttpHeaders`` message, lower-case names (pseudo-headers included).

    Envoy sends ``raw_value`` (bytes) unless configured otherwise; a repeated header keeps its last value.
    """
    result: dict[str, str] = {}
    for header in headers.headers.headers:
        raw = header.raw_value
        result[header.key.lower()] = raw.decode("latin-1") if raw else header.value
    return result


def subset_hint(request: ext_proc.ProcessingRequest) -> list[str] | None:
    """The ``envoy.lb.subset_hint`` endpoints ("ip:port" or "ip"), or None when the data plane sent none.

    The value is a list of strings, or one comma-separated string; anything else is a ``ValueError``.
    """
    namespaces = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in namespaces:
        return None
    fields = namespaces[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        items = value.string_value.split(",")
    elif kind == "list_value":
        items = []
        for item in value.list_value.values:
            if item.WhichOneof("kind") != "string_value":
                raise ValueError(f"{SUBSET_NAMESPACE}/{SUBSET_KEY} must list strings (ip:port or ip)")
            items.extend(item.string_value.split(","))
    else:
        raise ValueError(f"{SUBSET_NAMESPACE}/{SUBSET_KEY} must be a list of strings (ip:port or ip)")
    return [item.strip() for item in items if item.strip()]


def served_metadata(request: ext_proc.ProcessingRequest) -> str | None:
    """``envoy.lb`` / ``x-gateway-destination-endpoint-served`` of the message's metadata, if a string."""
    namespaces = request.metadata_context.filter_metadata
    if LB_NAMESPACE not in namespaces:
        return None
    value = namespaces[LB_NAMESPACE].fields.get(SERVED)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return str(value.string_value)


def observation_key(request: ext_proc.ProcessingRequest) -> str | None:
    """The request key the pick left in the ``slorouter`` dynamic metadata, if the message carries it."""
    namespaces = request.metadata_context.filter_metadata
    if OBSERVED_NAMESPACE not in namespaces:
        return None
    value = namespaces[OBSERVED_NAMESPACE].fields.get(REQUEST_KEY)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return str(value.string_value)


def response_attributes(request: ext_proc.ProcessingRequest) -> tuple[str | None, int, int | None]:
    """The upstream address that served the response (None if there was none), Envoy's response flag bits
    and its upstream attempts (None when not sent), from the filter's ``response_attributes``."""
    if _ATTRIBUTES not in request.attributes:
        return None, 0, None
    fields = request.attributes[_ATTRIBUTES].fields
    address = fields.get(UPSTREAM_ADDRESS)
    served = (
        str(address.string_value)
        if address is not None and address.WhichOneof("kind") == "string_value"
        else None
    )
    flags = fields.get(RESPONSE_FLAG_BITS)
    bits = int(flags.number_value) if flags is not None and flags.WhichOneof("kind") == "number_value" else 0
    count = fields.get(UPSTREAM_ATTEMPTS)
    attempts = (
        int(count.number_value) if count is not None and count.WhichOneof("kind") == "number_value" else None
    )
    return served or None, bits, attempts


def _header_options(headers: Iterable[tuple[str, str]]) -> list[base_pb2.HeaderValueOption]:
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=name.lower(), raw_value=value.encode("latin-1")),
            append_action=_OVERWRITE,
        )
        for name, value in headers
    ]


def _destination_metadata(
    endpoints: list[str],
    observed: Iterable[tuple[str, str]] = (),
    scores: Sequence[tuple[str, float]] = (),
) -> struct_pb2.Struct:
    metadata = struct_pb2.Struct()
    lb = metadata.fields[LB_NAMESPACE].struct_value.fields
    lb[DESTINATION].string_value = ",".join(endpoints)
    if scores:
        scored = lb[ENDPOINT_SCORES_KEY].struct_value.fields
        for address, score in scores:
            scored[address].number_value = score
    fields = None
    for key, value in observed:
        if fields is None:
            fields = metadata.fields[OBSERVED_NAMESPACE].struct_value.fields
        fields[key].string_value = value
    return metadata


def routed_headers(
    endpoints: list[str],
    set_headers: Iterable[tuple[str, str]] = (),
    remove_headers: Iterable[str] = (),
    response_mode: ext_proc.ProcessingMode | None = None,
    observed: Iterable[tuple[str, str]] = (),
    scores: Sequence[tuple[str, float]] = (),
) -> ext_proc.ProcessingResponse:
    """The answer to the request headers once the pick is made: the destination header (the pick only,
    which an ``ORIGINAL_DST`` cluster can parse) and ``envoy.lb`` metadata with the ordered list (and
    ``scores``, address → total score, when the scores header is on); with an observed response path,
    ``observed`` (the request key, the routing response headers) as ``slorouter`` metadata."""
    common = ext_proc.CommonResponse(
        header_mutation=ext_proc.HeaderMutation(
            set_headers=_header_options([(DESTINATION, endpoints[0]), *set_headers]),
            remove_headers=list(remove_headers),
        ),
    )
    response = ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(response=common),
        dynamic_metadata=_destination_metadata(endpoints, observed, scores),
    )
    if response_mode is not None:
        response.mode_override.CopyFrom(response_mode)
    return response


def routed_body(
    endpoints: list[str],
    set_headers: Iterable[tuple[str, str]] = (),
    remove_headers: Iterable[str] = (),
    observed: Iterable[tuple[str, str]] = (),
    scores: Sequence[tuple[str, float]] = (),
    *,
    body: bytes | None = None,
) -> ext_proc.ProcessingResponse:
    """The answer to a buffered request body: the same destination, as a header mutation of the body
    response (Envoy still holds the headers in buffered mode); ``body``: the body that replaces the
    client's (its ``content-length`` among ``set_headers``)."""
    common = ext_proc.CommonResponse(
        header_mutation=ext_proc.HeaderMutation(
            set_headers=_header_options([(DESTINATION, endpoints[0]), *set_headers]),
            remove_headers=list(remove_headers),
        ),
    )
    if body is not None:
        common.body_mutation.body = body
    return ProcessingResponse(
        request_body=ext_proc.BodyResponse(response=common),
        dynamic_metadata=_destination_metadata(endpoints, observed, scores),
    )


def streamed_body(body: bytes, *, request: bool) -> list[ext_proc.ProcessingResponse]:
    """A body handed back to Envoy in FULL_DUPLEX_STREAMED mode, in chunks, the last one ending the stream."""
    chunks = [body[i : i + STREAMED_CHUNK_BYTES] for i in range(0, len(body), STREAMED_CHUNK_BYTES)] or [b""]
    return [streamed_chunk(chunk, i == len(chunks) - 1, request=request) for i, chunk in enumerate(chunks)]


def streamed_chunk(
    chunk: bytes, end_of_stream: bool, *, request: bool = False
) -> ext_proc.ProcessingResponse:
    """One body chunk passed on in FULL_DUPLEX_STREAMED mode (the response's, unless ``request``)."""
    mutation = ext_proc.BodyMutation(
        streamed_response=ext_proc.StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
    )
    body_response = ext_proc.BodyResponse(response=ext_proc.CommonResponse(body_mutation=mutation))
    if request:
        return ProcessingResponse(request_body=body_response)
    return ProcessingResponse(response_body=body_response)


def continue_request_headers(mode: ext_proc.ProcessingMode | None = None) -> ext_proc.ProcessingResponse:
    if mode is None:
        return _CONTINUE_REQUEST_HEADERS
    return ProcessingResponse(request_headers=ext_proc.HeadersResponse(), mode_override=mode)


def continue_request_body() -> ext_proc.ProcessingResponse:
    return _CONTINUE_REQUEST_BODY


def continue_response_body() -> ext_proc.ProcessingResponse:
    return _CONTINUE_RESPONSE_BODY


def continue_trailers(*, request: bool) -> ext_proc.ProcessingResponse:
    return _CONTINUE_REQUEST_TRAILERS if request else _CONTINUE_RESPONSE_TRAILERS


def response_headers(
    set_headers: Iterable[tuple[str, str]],
    mode: ext_proc.ProcessingMode | None = None,
    *,
    remove: Iterable[str] = (),
) -> ext_proc.ProcessingResponse:
    """The answer to the upstream's response headers: the picker's own headers added, ``remove`` removed
    (and a mode override)."""
    common = ext_proc.CommonResponse(
        header_mutation=ext_proc.HeaderMutation(
            set_headers=_header_options(set_headers), remove_headers=list(remove)
        )
    )
    response = ProcessingResponse(response_headers=ext_proc.HeadersResponse(response=common))
    if mode is not None:
        response.mode_override.CopyFrom(mode)
    return response


def response_mode(request_body_mode: int, response_body_mode: int) -> ext_proc.ProcessingMode:
    """A mode override (``allow_mode_override`` in Envoy) that keeps the request's body mode and asks for
    the response headers and body."""
    send = processing_mode_pb2.ProcessingMode.HeaderSendMode.Value("SEND")
    return processing_mode_pb2.ProcessingMode(
        request_header_mode=send,
        response_header_mode=send,
        request_body_mode=request_body_mode,
        response_body_mode=response_body_mode,
    )


def immediate(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> ext_proc.ProcessingResponse:
    """An OpenAI-style JSON error that Envoy answers for the picker (the gateway's body and headers), without
    the data plane's headers for the picker that a route adds to every response, a local reply's too."""
    http_status = status if status in _STATUS_CODES else 500
    all_headers = [("content-type", "application/json"), *(headers or {}).items()]
    return ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=http_status),
            headers=ext_proc.HeaderMutation(
                set_headers=_header_options(all_headers), remove_headers=_DATA_PLANE_HEADERS
            ),
            body=error_body(status, message, param=param, code=code),
            details=f"slorouter_epp_{status}",
        )
    )
